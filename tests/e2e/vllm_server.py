"""A real vLLM (CPU build) serving a tiny local model, and a load generator for it.

Used by the session fixture ``vllm_server`` in tests/e2e/conftest.py; usable on its own too:

    server = VLLMServer(python=tools.vllm_python(), model_dir=ensure_tiny_model(py), workdir=tmp)
    server.start()
    with BackgroundLoad(server.url, server.model, concurrency=16, duration_s=30, max_tokens=1024):
        ... scrape server.metrics_text() while the KV cache fills ...
    server.stop()

The defaults are what a real vLLM needs on a CPU-only machine: eager mode, float32,
2,048-token context, prefix caching on, and a tiny KV cache: 16 MiB, which for this model in
float32 (2 x 4 layers x 2 KV heads x 64 x 4 bytes = 4 KiB per token) holds ~4,000 tokens in
128-token blocks, so 16 concurrent 1,024-token generations fill it and force preemptions.
(8 MiB holds only 1,920 tokens here, below --max-model-len 2048, and vLLM refuses to start.)
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support import tools
from tests.support.processes import EngineServer, Process, run, start_on_free_port
from tests.support.tools import ROOT

MAKE_TINY_MODEL = ROOT / "scripts" / "make_tiny_model.py"


class VLLMError(RuntimeError):
    """The tiny model could not be built."""


def ensure_tiny_model(python: str, dest: Path | None = None, timeout: float = 300) -> Path:
    """The tiny model folder, built with ``python`` (the vLLM venv's) by scripts/make_tiny_model.py
    if it is not there yet. Concurrent builders are safe: the script renames a finished folder into place."""
    dest = Path(dest or tools.tiny_model_dir())
    if not (dest / "config.json").is_file():
        made = run([python, MAKE_TINY_MODEL, "--out", dest], timeout=timeout)
        if made.rc != 0 or not (dest / "config.json").is_file():
            raise VLLMError(f"make_tiny_model.py failed ({made.rc}):\n{made.stdout}\n{made.stderr[-3000:]}")
    return dest


@dataclass
class VLLMServer(EngineServer):
    """One ``vllm.entrypoints.openai.api_server`` process on 127.0.0.1."""

    python: str
    model_dir: Path
    workdir: Path
    model: str = "tiny"  # --served-model-name
    kv_cache_bytes: int = 16 * 1024 * 1024
    max_model_len: int = 2048
    start_seconds: float = 0.0

    @property
    def log_path(self) -> Path:
        return Path(self.workdir) / "vllm.log"

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--kv-cache-memory-bytes",
            str(self.kv_cache_bytes),
            "--max-model-len",
            str(self.max_model_len),
            "--enable-prefix-caching",
            *self.extra_args,
        ]

    def _environment(self) -> dict[str, str]:
        cache = Path(self.workdir) / "cache"
        return {
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "XDG_CACHE_HOME": str(cache),
            "HF_HOME": str(cache / "hf"),
            # Everything is local: never reach for a hub.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **self.env,
        }

    def start(self, ready_timeout: float = 360, attempts: int = 2, port: int | None = None) -> VLLMServer:
        """Starts the server (on ``port``, else a free one) and waits (at most ``ready_timeout`` s)
        until /metrics answers."""
        Path(self.workdir).mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        start_on_free_port(lambda free: self._launch(free, ready_timeout), attempts, port=port)
        self.start_seconds = time.monotonic() - started
        return self

    def _launch(self, port: int, ready_timeout: float) -> VLLMServer:
        self.port = port
        self.process = Process(self.command(), env=self._environment(), log=self.log_path, name="vLLM").start()
        self.process.wait_for(self._ready, timeout=ready_timeout, interval=1.0, what="serving /metrics")
        return self

    def _ready(self) -> bool:
        resp = httpx.get(self.metrics_url, timeout=5)
        return resp.status_code == 200 and "vllm:" in resp.text

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (vLLM stops its engine process itself, ~4 s), then SIGKILL whatever is left
        of the server's own process group."""
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout=timeout)

    def metrics_text(self) -> str:
        resp = httpx.get(self.metrics_url, timeout=10)
        resp.raise_for_status()
        return resp.text


# ----------------------------------------------------------------------------- reading /metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample named exactly ``name`` whose labels include ``labels``.
    A deliberately small reader for the harness; the product parses with kvdoctor.signals.textparse."""
    found = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        got = dict(_LABEL.findall(m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            found.append((got, float(m.group(3))))
    return found


def metric_sum(text: str, name: str, **labels: str) -> float | None:
    """Sum of the matching samples, or None when there is none."""
    matched = samples(text, name, **labels)
    return sum(v for _, v in matched) if matched else None


# ------------------------------------------------------------------------------------------ load


@dataclass
class LoadResult:
    started: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0  # still running at the end of the duration
    completion_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def default_prompt(i: int) -> str:
    """A distinct prompt per request (so prefix caching does not short-cut prefill)."""
    return f"Request {i}: " + " ".join(f"w{(i * 7 + k) % 97}" for k in range(40))


async def _load(
    base_url: str,
    model: str,
    concurrency: int,
    duration_s: float,
    max_tokens: int,
    prompt: Callable[[int], str],
    stop: threading.Event | None,
    result: LoadResult,
) -> LoadResult:
    deadline = time.monotonic() + duration_s
    counter = iter(range(1 << 30))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=httpx.Timeout(duration_s + 30)) as client:

        async def worker() -> None:
            while time.monotonic() < deadline and not (stop and stop.is_set()):
                i = next(counter)
                result.started += 1
                try:
                    resp = await client.post(
                        "/v1/completions",
                        json={
                            "model": model,
                            "prompt": prompt(i),
                            "max_tokens": max_tokens,
                            "ignore_eos": True,
                            "temperature": 1.0,
                        },
                    )
                except asyncio.CancelledError:
                    result.cancelled += 1
                    raise
                except httpx.HTTPError as exc:
                    result.failed += 1
                    result.errors.append(repr(exc))
                    continue
                if resp.status_code == 200:
                    result.completed += 1
                    result.completion_tokens += resp.json().get("usage", {}).get("completion_tokens", 0)
                else:
                    result.failed += 1
                    result.errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        # Requests still running at the deadline are cancelled: closing the connection makes vLLM abort them.
        while time.monotonic() < deadline and not (stop and stop.is_set()) and not all(t.done() for t in tasks):
            await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


def run_load(base_url: str, model: str = "tiny", **options) -> LoadResult:
    """Keeps ``concurrency`` long completions in flight for ``duration_s`` seconds, then returns
    (the options of BackgroundLoad)."""
    return BackgroundLoad(base_url, model, **options).start().wait()


class BackgroundLoad:
    """run_load in a thread, so a test can scrape while the load runs:

    with BackgroundLoad(server.url, "tiny", concurrency=16, duration_s=30) as load:
        ...poll metrics...
    load.result  # LoadResult, after the block (leaving the block stops the load early)
    """

    def __init__(
        self,
        base_url: str,
        model: str = "tiny",
        concurrency: int = 16,
        duration_s: float = 20,
        max_tokens: int = 1024,
        prompt: Callable[[int], str] = default_prompt,
    ):
        self.result = LoadResult()
        self._stop = threading.Event()
        self._args = (base_url, model, concurrency, duration_s, max_tokens, prompt, self._stop, self.result)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-load", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(_load(*self._args))
        except BaseException as exc:  # surfaced by stop()
            self._error = exc

    def start(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30) -> LoadResult:
        self._stop.set()
        self._thread.join(timeout)
        if self._error:
            raise self._error
        return self.result

    def wait(self, timeout: float | None = None) -> LoadResult:
        """Waits for the load to run its full duration."""
        self._thread.join(timeout)
        if self._error:
            raise self._error
        return self.result

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
