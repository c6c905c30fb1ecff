"""``kvdoctor stress``, the measuring half: an OpenAI-compatible load generator.

- ``discover(...)``: finds the API (``/v1/completions``, else ``/v1/chat/completions``), the model,
  which extensions the server accepts (``ignore_eos`` for a fixed generation length, streamed
  usage), and calibrates a prompt of the asked length from the token counts the server reports.
  Every way the endpoint can be unusable is an ``EndpointError`` with one line.
- ``LoadRunner``: keeps N streaming requests in flight (N raised step by step) and records when
  each streamed token arrived, at the client: the per-token latency a user sees.

The signals recorded meanwhile (the exporter's window) come from ``kvdoctor.stress.signals``.

Every request's prompt starts with its own tag (the run's random id and the request's number),
then the same fixed text: prefix caching cannot share KV blocks between requests, nor with an
earlier run, so each request holds its own KV (the point of the test). With ``share_prefix`` the
tag goes at the end instead: every request of the run shares the fixed text as a cached prefix.

Tokens are counted once, however the server reports them: one per chunk with text, and where the
server gives its running count of completion tokens (per chunk, or only in the last chunk) just
the tokens the chunks so far did not show.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlunsplit

import httpx

from kvdoctor.signals.records import attributes
from kvdoctor.sources.paths import METRICS_PATH
from kvdoctor.sources.urls import UrlError, split_http_url
from kvdoctor.stress.timeline import RequestRecord

__all__ = [
    "Endpoint",
    "EndpointError",
    "LoadRunner",
    "api_root",
    "discover",
    "make_prompt",
    "server_root",
]

CONNECT_TIMEOUT = 10.0
PROBE_TIMEOUT = 120.0  # a probe's prefill may queue behind other traffic on a busy engine
READ_TIMEOUT = 600.0  # a preempted request can stall for a long time between two tokens
FAILURE_BACKOFF = 0.5  # seconds a worker waits after a failed request (a dead endpoint must not spin)
CALIBRATION_WORDS = 200
MIN_CALIBRATION_WORDS = 8  # the calibration probe halves down to this on HTTP 400 (a small context)
RECENT_GAPS = 4096

# The fixed text: plain words, cycled with a stride so byte-pair merges stay near one token a word.
_TEXT = (
    "memory bandwidth decode cache block token prefix layer head value key batch queue engine model "
    "latency throughput request server worker tensor kernel page pool tier host device scheduler stream "
    "prompt window signal sample metric counter gauge ratio budget limit river mountain forest window "
    "garden market harbor bridge castle planet ocean desert valley meadow island canyon glacier"
)
_WORDS = _TEXT.split()


class EndpointError(Exception):
    """The endpoint cannot be used for the test; the message is one line saying why."""


def api_root(url: str) -> str:
    """The OpenAI-compatible API base (``.../v1``) for an endpoint given as the server, its ``/v1``,
    one of its endpoints or its ``/metrics`` (the URL the exporter takes). ``EndpointError`` if it is
    not an http(s) URL."""
    try:
        parts = split_http_url(url)
    except UrlError as exc:
        raise EndpointError(exc.about("--engine-url")) from None
    path = parts.path.rstrip("/")
    for tail in ("/chat/completions", "/completions", "/models", METRICS_PATH):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def server_root(api_base: str) -> str:
    """``http://host:port`` (plus any prefix) of an API base: where the engine's /metrics usually is."""
    return api_base[: -len("/v1")] if api_base.endswith("/v1") else api_base


def make_prompt(words: int, tag: str = "", tag_last: bool = False) -> str:
    """``tag`` then ``words`` words of the fixed text (the same text for every request); with
    ``tag_last`` the tag follows the text, which then is a prefix every such prompt shares."""
    body = " ".join(_WORDS[(k * 7) % len(_WORDS)] for k in range(max(1, words)))
    if not tag:
        return body
    return f"{body} {tag}" if tag_last else f"{tag} {body}"


def new_run_id() -> str:
    """A random id for one run's request tags: no two runs share a prompt prefix."""
    return secrets.token_hex(4)


def _refused(exc: BaseException) -> str:
    """'connection refused' when that is what happened under httpx's wrapping, else the message."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    return str(exc) or type(exc).__name__


def _context_size(response: httpx.Response) -> int | None:
    """The context size an HTTP 400 names (llama.cpp's ``exceed_context_size_error`` carries n_ctx)."""
    try:
        err = response.json().get("error")
        value = err.get("n_ctx") if isinstance(err, dict) else None
        return int(value) if isinstance(value, (int, float)) and value > 0 else None
    except (ValueError, AttributeError, TypeError):
        return None


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip().replace("\n", " ")
        return text[:200] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = (err.get("message") or err.get("detail") or err.get("msg")) if isinstance(err, dict) else err
        msg = msg or body.get("detail") or body.get("message")
        if msg:
            return " ".join(str(msg).split())[:300]
    return json.dumps(body)[:200]


@dataclass
class Endpoint:
    """An API that answered the probes, and how to ask it."""

    api_base: str  # .../v1
    kind: str  # "completions" or "chat"
    model: str
    extras: dict = field(default_factory=dict)  # accepted extensions, e.g. {"ignore_eos": True}
    stream_options: dict | None = None
    prompt_words: int = 0
    prompt_tokens: int | None = None  # as the server counted the calibrated prompt (None: not reported)
    notes: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.api_base}/{'completions' if self.kind == 'completions' else 'chat/completions'}"

    def payload(self, prompt: str, max_tokens: int, stream: bool) -> dict:
        body: dict = {"model": self.model, "max_tokens": max_tokens, "temperature": 0.0, **self.extras}
        if self.kind == "completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        if stream:
            body["stream"] = True
            if self.stream_options:
                body["stream_options"] = dict(self.stream_options)
        return body

    def describe(self) -> dict:
        return {
            "api_base": self.api_base,
            "api": self.url,
            "kind": self.kind,
            "model": self.model,
            "extensions": sorted(self.extras) + (["stream_options"] if self.stream_options else []),
            **attributes(self, "prompt_words prompt_tokens"),
            "notes": list(self.notes),
        }


async def _post(client: httpx.AsyncClient, url: str, body: dict) -> httpx.Response:
    try:
        return await client.post(url, json=body, timeout=httpx.Timeout(PROBE_TIMEOUT, connect=CONNECT_TIMEOUT))
    except httpx.TimeoutException:
        raise EndpointError(f"{url} did not answer within {PROBE_TIMEOUT:g} s") from None
    except httpx.ConnectError as exc:
        raise EndpointError(f"cannot reach {url}: {_refused(exc)}") from None
    except httpx.HTTPError as exc:
        raise EndpointError(f"{url}: {type(exc).__name__}: {exc}") from None


async def _models(client: httpx.AsyncClient, api_base: str) -> list[str]:
    try:
        response = await client.get(f"{api_base}/models", timeout=httpx.Timeout(30, connect=CONNECT_TIMEOUT))
    except httpx.ConnectError as exc:
        raise EndpointError(f"cannot reach {api_base}: {_refused(exc)}") from None
    except httpx.HTTPError as exc:
        raise EndpointError(f"{api_base}/models: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        return []
    try:
        return [str(m["id"]) for m in response.json().get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError, TypeError):
        return []


def _usage_prompt_tokens(response: httpx.Response) -> int | None:
    try:
        value = response.json().get("usage", {}).get("prompt_tokens")
        return int(value) if value is not None else None
    except (ValueError, AttributeError, TypeError):
        return None


async def _probe(client: httpx.AsyncClient, ep: Endpoint, words: int) -> httpx.Response:
    """A one-token completion of a ``words``-word prompt; drops extensions the server refuses."""
    while True:
        response = await _post(client, ep.url, ep.payload(make_prompt(words, "[probe]"), 1, stream=False))
        if response.status_code == 400 and ep.extras:
            message = _error_message(response).lower()
            refused = [k for k in ep.extras if k in message]
            if refused:
                for k in refused:
                    del ep.extras[k]
                ep.notes.append(f"the server refused {', '.join(refused)}: generation length may vary")
                continue
        return response


async def discover(
    api_base: str, model: str | None, prompt_tokens: int, max_tokens: int, client: httpx.AsyncClient
) -> Endpoint:
    """The usable endpoint with a calibrated prompt; ``EndpointError`` (one line) otherwise."""
    names = await _models(client, api_base)
    if model is None:
        if not names:
            raise EndpointError(f"{api_base}/models lists no model: pass --served-model-name NAME")
        model = names[0]
    elif names and model not in names:
        raise EndpointError(f"model {model!r} is not served at {api_base} (it serves: {', '.join(names[:5])})")

    ep = Endpoint(api_base, "completions", model, extras={"ignore_eos": True})
    words = CALIBRATION_WORDS
    response = await _probe(client, ep, words)
    if response.status_code in (404, 405, 501):
        ep.kind = "chat"
        ep.notes.append("no /v1/completions here: using /v1/chat/completions (the prompt includes the chat template)")
        response = await _probe(client, ep, words)
    # A small context refuses the probe itself: halve it until it fits (llama.cpp's slots can be tiny).
    while response.status_code == 400 and words > MIN_CALIBRATION_WORDS:
        words = max(MIN_CALIBRATION_WORDS, words // 2)
        response = await _probe(client, ep, words)
    if response.status_code != 200:
        raise EndpointError(
            f"{ep.url} answered HTTP {response.status_code} to a test request: {_error_message(response)}"
        )

    # Calibrate: scale the word count by the tokens the server counted, until within 2 % (3 tries).
    counted = _usage_prompt_tokens(response)
    if counted is None:
        ep.notes.append("the server reports no usage: the prompt length is estimated at one token per word")
        words = prompt_tokens
    else:
        for _ in range(3):
            words = max(1, round(words * prompt_tokens / max(counted, 1)))
            response = await _probe(client, ep, words)
            if response.status_code != 200:
                n_ctx = _context_size(response)
                context = f" (its context holds {n_ctx} tokens a request: lower --prompt-tokens)" if n_ctx else ""
                raise EndpointError(
                    f"{ep.url} refused a ~{prompt_tokens}-token prompt: {_error_message(response)}{context}"
                )
            counted = _usage_prompt_tokens(response) or counted
            if abs(counted - prompt_tokens) <= max(2, 0.02 * prompt_tokens):
                break
    ep.prompt_words = words
    ep.prompt_tokens = counted

    # A streamed request of the real size: the server accepts the whole shape (length, stream options).
    ep.stream_options = {"include_usage": True, "continuous_usage_stats": True}
    for _ in range(3):
        status, message = await _first_streamed_token(client, ep, make_prompt(words, "[probe]"), max_tokens)
        if status == 200:
            return ep
        lowered = message.lower()
        if status == 400 and ep.stream_options and ("continuous_usage_stats" in lowered or "stream_options" in lowered):
            ep.stream_options = {"include_usage": True} if "continuous_usage_stats" in lowered else None
            continue
        break
    raise EndpointError(
        f"{ep.url} refused a streamed request of {prompt_tokens} prompt + {max_tokens} generated tokens "
        f"(HTTP {status}): {message}"
    )


async def _first_streamed_token(
    client: httpx.AsyncClient, ep: Endpoint, prompt: str, max_tokens: int
) -> tuple[int, str]:
    """(status, error message) of a streamed request, closed after its first token."""
    try:
        async with client.stream(
            "POST",
            ep.url,
            json=ep.payload(prompt, max_tokens, stream=True),
            timeout=httpx.Timeout(PROBE_TIMEOUT, connect=CONNECT_TIMEOUT),
        ) as response:
            if response.status_code != 200:
                await response.aread()
                return response.status_code, _error_message(response)
            async for line in response.aiter_lines():
                if line.startswith("data:") and _chunk_tokens(line[5:].strip(), ep.kind)[0] is not None:
                    break
            return 200, ""
    except httpx.TimeoutException:
        raise EndpointError(f"{ep.url} streamed nothing within {PROBE_TIMEOUT:g} s") from None
    except httpx.HTTPError as exc:
        raise EndpointError(f"{ep.url}: {type(exc).__name__}: {exc}") from None


def _chunk_tokens(data: str, kind: str) -> tuple[int | None, int | None]:
    """(tokens this SSE chunk carries (None: not a token chunk; 0: a chunk without text), the
    server's running completion-token count if it sent one)."""
    if not data or data == "[DONE]":
        return None, None
    try:
        obj = json.loads(data)
    except ValueError:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    completion = usage.get("completion_tokens") if usage else None
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return None, completion  # e.g. the final usage-only chunk
    choice = choices[0]
    text = choice.get("text") if kind == "completions" else (choice.get("delta") or {}).get("content")
    if text or choice.get("finish_reason") is None or completion is not None:
        return 1, completion
    return 0, completion


class LoadRunner:
    """Keeps ``concurrency`` streamed requests in flight; records every token's arrival time."""

    def __init__(
        self,
        endpoint: Endpoint,
        max_tokens: int,
        client: httpx.AsyncClient,
        clock: Callable[[], float] = time.time,
        share_prefix: bool = False,
        run_id: str | None = None,
    ):
        self.endpoint = endpoint
        self.max_tokens = max_tokens
        self.client = client
        self.clock = clock
        self.share_prefix = share_prefix
        self.run_id = run_id or new_run_id()
        self.requests: list[RequestRecord] = []
        self.recent_gaps: collections.deque[tuple[float, float]] = collections.deque(maxlen=RECENT_GAPS)
        self.last_error = ""
        self.step = 0
        self._workers: list[asyncio.Task] = []
        self._counter = 0

    @property
    def concurrency(self) -> int:
        return sum(1 for w in self._workers if not w.done())

    def set_concurrency(self, n: int, step: int) -> None:
        """Raise the number of requests in flight to ``n`` (the load only ever grows)."""
        self.step = step
        while len(self._workers) < n:
            self._workers.append(asyncio.create_task(self._worker(), name=f"stress-worker-{len(self._workers)}"))

    async def stop(self) -> None:
        """Cancel every request in flight (closing the connection makes the engine abort it)."""
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        now = self.clock()
        for r in self.requests:
            if r.status == "running":
                r.status, r.ended = "cancelled", now

    def counts(self) -> dict[str, int]:
        out = collections.Counter(r.status for r in self.requests)
        return {k: out.get(k, 0) for k in ("running", "ok", "failed", "cancelled")}

    def recent_itl(self, seconds: float = 3.0) -> tuple[float, float]:
        """(p50, p95) per-token latency of the tokens of the last ``seconds`` (NaN if none)."""
        cutoff = self.clock() - seconds
        gaps = [g for t, g in self.recent_gaps if t >= cutoff]
        if not gaps:
            return math.nan, math.nan
        gaps.sort()
        return gaps[len(gaps) // 2], gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))]

    def prompt(self, number: int) -> str:
        """The prompt of the run's request ``number``: tagged with the run's id and the number,
        first (no shared prefix) or, with ``share_prefix``, last."""
        return make_prompt(self.endpoint.prompt_words, f"[{self.run_id}-{number}]", tag_last=self.share_prefix)

    async def _worker(self) -> None:
        while True:
            self._counter += 1
            record = RequestRecord(step=self.step, started=self.clock())
            self.requests.append(record)
            try:
                await self._one(record, self.prompt(self._counter))
            except asyncio.CancelledError:
                raise
            except httpx.HTTPError as exc:
                record.status, record.ended = "failed", self.clock()
                record.error = self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if record.status == "failed":
                await asyncio.sleep(FAILURE_BACKOFF)

    async def _one(self, record: RequestRecord, prompt: str) -> None:
        ep = self.endpoint
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        async with self.client.stream(
            "POST", ep.url, json=ep.payload(prompt, self.max_tokens, stream=True), timeout=timeout
        ) as response:
            if response.status_code != 200:
                await response.aread()
                record.status, record.ended = "failed", self.clock()
                record.error = self.last_error = f"HTTP {response.status_code}: {_error_message(response)}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                tokens, completion = _chunk_tokens(data, ep.kind)
                now = self.clock()
                if completion is not None:
                    # The server's running count (per chunk, or once at the end): only the tokens
                    # the chunks so far did not show, so a final usage never counts them again.
                    record.completion_tokens = completion
                    tokens = max(0, completion - len(record.token_times))
                if not tokens:
                    continue
                previous = record.token_times[-1] if record.token_times else None
                if previous is None:
                    record.token_times.append(now)
                    tokens -= 1
                    previous = now
                # k tokens in one chunk: spread them evenly since the previous chunk
                for k in range(1, tokens + 1):
                    t = previous + (now - previous) * k / tokens
                    record.token_times.append(t)
                    self.recent_gaps.append((t, (now - previous) / tokens))
        record.status, record.ended = "ok", self.clock()
