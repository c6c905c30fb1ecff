"""A real llama.cpp ``llama-server`` serving a random GGUF model, for the end-to-end tests.

    model = make_gguf(tmp / "tiny.gguf")                      # scripts/make_tiny_gguf.py, < 1 s
    server = LlamaServer(tools.require("llama-server"), model, tmp).start()
    ... load it (tests/e2e/vllm_server.py's BackgroundLoad speaks /v1/completions to any server) ...
    server.eval_timings()        # the per-request "eval time" lines of its own log
    server.restart()             # same port, counters back at zero
    server.stop()

The binary is built once by scripts/build-llama-server.sh (``needs_tools("llama-server")``). The
server runs with one thread, ``--metrics`` and its default ``/slots``; ``--parallel`` slots share
``-c`` tokens of context (each slot gets context / parallel). It is warmed up with one request
before it counts as started: llama.cpp's first batch of a fresh server takes seconds, during which
even /metrics waits.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.processes import EngineServer, Process, run, start_on_free_port
from tests.support.tools import ROOT

MAKE_TINY_GGUF = ROOT / "scripts" / "make_tiny_gguf.py"
# ~15-50 ms a token on one CPU thread (the tiny default: ~0.5 ms): a request can outlast a window.
SLOW_SHAPE = {"width": 768, "layers": 6, "ff": 3072, "heads": 8, "kv_heads": 8, "dtype": "f16"}

# "slot print_timing: id  3 | task 0 |        eval time =      19.41 ms /    40 tokens (    0.50 ms per token, ..."
_EVAL = re.compile(r"\|\s+eval time =\s*([\d.]+) ms /\s*(\d+) tokens \(\s*([\d.]+) ms per token")


def make_gguf(path: Path, **shape: object) -> Path:
    """A random GGUF model at ``path`` (``shape``: make_tiny_gguf.py's options, e.g. ``width=768``)."""
    flags = [item for key, value in shape.items() for item in (f"--{key.replace('_', '-')}", value)]
    made = run([sys.executable, MAKE_TINY_GGUF, "--out", path, *flags], timeout=120)
    if made.rc != 0 or not Path(path).is_file():
        raise RuntimeError(f"make_tiny_gguf.py failed ({made.rc}): {made.stderr[-2000:]}")
    return Path(path)


@dataclass
class LlamaServer(EngineServer):
    """One llama-server process on 127.0.0.1."""

    binary: str
    model: Path
    workdir: Path
    parallel: int = 4
    context: int = 2048  # all slots together
    threads: int = 1
    # HTTP threads: more than the tests' clients, so /slots and /metrics are answered while every
    # client holds a thread (the default, per core, left a probe waiting 30 s on 2 cores)
    http_threads: int = 32
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return Path(self.workdir) / f"llama-server-{self.port}.log"

    def command(self) -> list[object]:
        return [
            self.binary,
            "--model",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            self.port,
            "--threads",
            self.threads,
            "--threads-http",
            self.http_threads,
            "--parallel",
            self.parallel,
            "--ctx-size",
            self.context,
            "--metrics",
            *self.extra_args,
        ]

    def start(self, ready_timeout: float = 120, port: int | None = None) -> LlamaServer:
        """Starts the server (on ``port``, else a free one), waits for /health, warms it up."""
        Path(self.workdir).mkdir(parents=True, exist_ok=True)
        start_on_free_port(lambda free: self._launch(free, ready_timeout), attempts=3, port=port)
        self.starts += 1
        return self

    def _launch(self, port: int, ready_timeout: float) -> LlamaServer:
        self.port = port
        self.process = Process(self.command(), env=self.env, log=self.log_path, name="llama-server").start()
        self.process.wait_for(self._ready, timeout=ready_timeout, interval=0.2, what="serving /health")
        self.complete("warm up", 8)
        return self

    def _ready(self) -> bool:
        return httpx.get(f"{self.url}/health", timeout=5).status_code == 200

    def stop(self, timeout: float = 15) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout=timeout)

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stops it and starts it again on the same port (a restarted engine container)."""
        port = self.port
        self.stop()
        time.sleep(down_seconds)
        self.start(port=port)

    def complete(self, prompt: str, max_tokens: int) -> dict:
        resp = httpx.post(
            f"{self.url}/v1/completions",
            json={"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
            timeout=120,
        )
        resp.raise_for_status()
        return resp.json()

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=30)  # a busy 2-core machine can be slow

    def metrics(self) -> dict[str, float]:
        """The unlabelled ``llamacpp:`` samples of /metrics (llama.cpp labels none but one family)."""
        out = {}
        for line in self.get("/metrics").text.splitlines():
            name, _, value = line.partition(" ")
            if name.startswith("llamacpp:") and "{" not in name:
                out[name] = float(value)
        return out

    def eval_timings(self) -> list[tuple[float, int, float]]:
        """(eval ms, tokens, ms per token) of every request its log reports, oldest first (the log
        of the current run only: a restart writes a new file)."""
        text = self.process.output if self.process is not None else self.log_path.read_text()
        return [(float(ms), int(n), float(per)) for ms, n, per in _EVAL.findall(text)]
