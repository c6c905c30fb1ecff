"""The simulated engine's OpenAI-compatible API: ``/v1/completions`` and ``/v1/chat/completions``.

Enough of vLLM's OpenAI server for a load generator (``kvdoctor stress``): the request joins the
simulation beside the scenario's clients, and its tokens come back as the simulated engine makes
them — streamed (server-sent events, with ``stream_options.include_usage`` and vLLM's
``continuous_usage_stats``) or in one answer. Prompts are counted one token per word plus one
(a BOS token); the generated text is a placeholder word per token. A prompt plus ``max_tokens``
over the model's context is refused with HTTP 400 and vLLM's message, as the real server does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .physics import Simulation
from .requests import Request

POLL_SECONDS = 0.002  # how often a streaming answer looks for new tokens (a step is ~5-100 ms)
CHAT_TOKENS_PER_MESSAGE = 4  # the chat template's role markers around each message
DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions


class ApiError(Exception):
    """An OpenAI-style error answer: HTTP ``status`` with ``message``."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.kind = kind

    def payload(self) -> dict[str, Any]:
        return {"object": "error", "message": str(self), "type": self.kind, "param": None, "code": self.status}


@dataclass(frozen=True)
class Completion:
    """One parsed request: which API, how many tokens in and out, how to answer."""

    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool


def count_tokens(text: str) -> int:
    """The simulated tokenizer: one token per word, plus the BOS token."""
    return len(text.split()) + 1


def parse_request(body: Any, chat: bool, served_model: str, max_model_len: int) -> Completion:
    """A completions request body as the simulation needs it; ``ApiError`` where vLLM refuses it."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model") or served_model
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list")
        prompt = sum(
            count_tokens(str(m.get("content", ""))) + CHAT_TOKENS_PER_MESSAGE for m in messages if isinstance(m, dict)
        )
        prompt += 1  # the assistant turn's opening marker
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise ApiError(400, "prompt must be a string")
        prompt = count_tokens(text)
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = max_model_len - prompt if chat else DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens!r}")
    if prompt + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    options = body.get("stream_options") or {}
    stream = bool(body.get("stream"))
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.")
    return Completion(
        chat=chat,
        model=model,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
    )


class CompletionRun:
    """A request running in the simulation and the answer it makes, chunk by chunk."""

    def __init__(self, sim: Simulation, completion: Completion, sleep: Callable[[float], None] = time.sleep):
        self.sim = sim
        self.completion = completion
        self.id = f"{'chatcmpl' if completion.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._sleep = sleep
        self.request: Request = sim.submit(completion.prompt_tokens, completion.max_tokens)

    def cancel(self) -> None:
        self.sim.cancel(self.request)

    def tokens(self) -> Iterator[int]:
        """How many tokens each wait brought, as the simulation reaches wall-clock time."""
        sent = 0
        while sent < self.completion.max_tokens:
            self._sleep(POLL_SECONDS)
            self.sim.sync()
            made = min(self.request.generated, self.completion.max_tokens)
            if made > sent:
                yield made - sent
                sent = made

    def usage(self, completion_tokens: int) -> dict[str, int]:
        prompt = self.completion.prompt_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
        }

    def _choice(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.completion.chat:
            return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.completion.chat else "text_completion",
            "created": self.created,
            "model": self.completion.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n".encode()

    def events(self) -> Iterator[bytes]:
        """The streamed answer: a chunk per token, the finish reason, the usage, ``[DONE]``."""
        done = 0
        continuous = self.completion.include_usage and self.completion.continuous_usage
        for count in self.tokens():
            for _ in range(count):
                done += 1
                yield self._chunk([self._choice(" token", None)], self.usage(done) if continuous else None)
        yield self._chunk([self._choice("", "length")], self.usage(done) if continuous else None)
        if self.completion.include_usage:
            yield self._chunk([], self.usage(done))
        yield b"data: [DONE]\n\n"

    def answer(self) -> dict[str, Any]:
        """The whole answer at once, when every token is made."""
        made = sum(self.tokens())
        text = " token" * made
        if self.completion.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return {
            "id": self.id,
            "object": "chat.completion" if self.completion.chat else "text_completion",
            "created": self.created,
            "model": self.completion.model,
            "choices": [choice],
            "usage": self.usage(made),
        }
