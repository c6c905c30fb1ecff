"""One request inside the simulated engine: its lengths, its KV blocks and its token times."""

from __future__ import annotations

API_EPOCH = -1  # the epoch of requests sent to the engine's API (kvdoctor stress): no scenario's clients


class Request:
    __slots__ = (
        "arrival",
        "computed",
        "counted",
        "epoch",
        "first_scheduled",
        "first_token",
        "generated",
        "holds_shared",
        "host",
        "id",
        "last_token",
        "output",
        "preemptions",
        "private_blocks",
        "prompt",
        "shared",
        "target",
    )

    def __init__(self, rid: int, epoch: int, arrival: float, prompt: int, output: int, shared: int, host: int):
        self.id = rid
        self.epoch = epoch
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.shared = shared  # tokens of the shared (device-cached) prefix
        self.host = host  # tokens whose KV comes from the CPU tier
        self.computed = 0  # tokens with KV on the GPU
        self.target = prompt  # tokens the current prefill brings the KV up to
        self.generated = 0
        self.private_blocks = 0
        self.holds_shared = False
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.preemptions = 0
        self.counted = False  # prompt statistics are counted once, at the first admission

    @property
    def done(self) -> bool:
        """It has generated all its tokens (and left the engine)."""
        return self.generated >= self.output
