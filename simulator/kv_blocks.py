"""The simulated engine's KV cache counted as vLLM counts it: in blocks of ``block_size`` tokens.

A request holds its private blocks; the scenario's shared prompt prefix takes its blocks once,
when the first running request that uses it is given blocks, and frees them when the last lets go.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .deployment import EngineConfig
from .requests import Request


@dataclass
class KvBlocks:
    block_size: int
    usable: int  # vLLM reserves one null block; usage is reported against the rest (see the fixtures)
    watermark: int  # blocks admission leaves free for decode growth
    free: int = field(init=False)
    shared_refs: int = 0  # running requests that reference the shared prefix's blocks
    shared_blocks: int = 0

    def __post_init__(self) -> None:
        self.free = self.usable

    @classmethod
    def for_config(cls, config: EngineConfig) -> KvBlocks:
        usable = config.num_gpu_blocks - 1
        return cls(config.block_size, usable, int(config.admission_watermark * usable))

    @property
    def used(self) -> int:
        return self.usable - self.free

    def needed(self, req: Request, computed: int) -> int:
        """Blocks ``req`` must newly take to hold ``computed`` tokens: its private blocks, plus the
        shared prefix's blocks when it is the first running request to reference them."""
        bs = self.block_size
        private = -(-max(0, computed - req.shared) // bs) - req.private_blocks
        shared = req.shared // bs if req.shared and not req.holds_shared and self.shared_refs == 0 else 0
        return max(0, private) + shared

    def admits(self, req: Request) -> bool:
        """Its whole prompt fits with the watermark left free (admission, as vLLM V0's block manager)."""
        return self.free - self.needed(req, req.target) >= self.watermark

    def allocate(self, req: Request, computed: int) -> bool:
        """Give ``req`` blocks for ``computed`` tokens; False (nothing taken) if they do not fit."""
        need = self.needed(req, computed)
        if need > self.free:
            return False
        if req.shared and not req.holds_shared:
            if self.shared_refs == 0:
                self.shared_blocks = req.shared // self.block_size
            self.shared_refs += 1
            req.holds_shared = True
        self.free -= need
        req.private_blocks = max(req.private_blocks, -(-max(0, computed - req.shared) // self.block_size))
        return True

    def release(self, req: Request) -> None:
        """Free what ``req`` holds; its computed tokens are gone with them."""
        self.free += req.private_blocks
        req.private_blocks = 0
        if req.holds_shared:
            req.holds_shared = False
            self.shared_refs -= 1
            if self.shared_refs == 0:
                self.free += self.shared_blocks
                self.shared_blocks = 0
        req.computed = 0
