"""One way to run a command in another process: started, waited on until ready, output captured,
always stopped.

``Process`` starts a command in its own session (process group), reads its output line by line
on threads (kept in memory, and in ``log`` when given), waits until it is ready (a line matching
a pattern, or a probe such as an HTTP GET answering), and stops it with SIGTERM (or the signal
given), then SIGKILL for whatever is left of its group. A failed wait stops it too and raises
``ProcessError`` with the output's tail.

    with kvdoctor("exporter", "--port", "0", "--no-collector.nvml") as exporter:
        url = exporter.wait_for_line(r"serving (http://\\S+)/metrics").group(1)
        exporter.wait_for(http_ok(f"{url}/readyz"), what="the exporter's /readyz")
        ...
    # stopped here, whatever happened

``start_on_free_port`` retries a server on another port when the free one it was given was taken
meanwhile; ``run`` / ``run_kvdoctor`` run a command to its end (``subprocess.run`` with the
environment handled the same way).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple, TypeVar

import httpx

from tests.support.tools import ROOT, free_port

T = TypeVar("T")
STOP_TIMEOUT = 15.0


class ProcessError(RuntimeError):
    """A process exited, or did not become ready, when the caller needed it running."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(f"{message}\n--- its output (last lines) ---\n{output}" if output else message)
        self.output = output

    @property
    def port_taken(self) -> bool:
        return "address already in use" in self.output.lower()


def environment(env: Mapping[str, str] | None = None, clean: bool = False) -> dict[str, str]:
    """This process's environment plus ``env``; ``clean``: without any KVDOCTOR_* variable, so a
    command sees no configuration but what the test gives it."""
    base = {k: v for k, v in os.environ.items() if not (clean and k.startswith("KVDOCTOR_"))}
    return {**base, "PYTHONUNBUFFERED": "1", **(env or {})}


class Process:
    """A command in its own process group, its output captured line by line (see the module)."""

    def __init__(
        self,
        argv: Sequence[object],
        *,
        env: Mapping[str, str] | None = None,
        clean_env: bool = False,
        cwd: str | os.PathLike[str] = ROOT,
        log: str | os.PathLike[str] | None = None,
        merge_stderr: bool = True,
        echo: bool = False,
        name: str | None = None,
    ):
        self.argv = [str(a) for a in argv]
        self.env = environment(env, clean_env)
        self.cwd = cwd
        self.log = Path(log) if log is not None else None
        self.merge_stderr = merge_stderr
        self.echo = echo
        self.name = name or Path(self.argv[0]).name
        self.proc: subprocess.Popen[str] | None = None
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.line_times: dict[str, list[float]] = {"stdout": [], "stderr": []}  # time.monotonic() of each
        self._changed = threading.Condition()
        self._pumps: list[threading.Thread] = []

    # -- lifecycle
    def start(self) -> Process:
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log, "a") as log:
                log.write(f"\n$ {' '.join(self.argv)}\n")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if self.merge_stderr else subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            cwd=self.cwd,
            env=self.env,
            start_new_session=True,
        )
        streams = {"stdout": self.proc.stdout}
        if not self.merge_stderr:
            streams["stderr"] = self.proc.stderr
        for stream, pipe in streams.items():
            pump = threading.Thread(target=self._pump, args=(stream, pipe), name=f"{self.name}-{stream}", daemon=True)
            pump.start()
            self._pumps.append(pump)
        return self

    def _pump(self, stream: str, pipe: IO[str] | None) -> None:
        assert pipe is not None
        with open(self.log, "a") if self.log is not None else contextlib.nullcontext() as log:
            for line in pipe:
                if log is not None:
                    log.write(line)
                    log.flush()
                if self.echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                with self._changed:
                    self.lines[stream].append(line.rstrip("\n"))
                    self.line_times[stream].append(time.monotonic())
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
        """``signum`` to the process, up to ``timeout`` s for it to exit, then SIGKILL to its whole
        group (children it left behind included); returns its exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signum)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only it and its children are in it
        proc.wait(timeout=10)
        self._join_pumps()
        return proc.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the process to end by itself; returns its exit status (stops it on a timeout)."""
        assert self.proc is not None, "not started"
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(signal.SIGKILL, 0)
            raise ProcessError(f"{self.name} did not end within {timeout:.0f} s", self.tail()) from None
        self._join_pumps()
        return rc

    def _join_pumps(self) -> None:
        for pump in self._pumps:
            pump.join(5)

    def __enter__(self) -> Process:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state
    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def output(self) -> str:
        """Everything it wrote to stdout (and stderr, when merged) so far."""
        return "\n".join(self.lines["stdout"])

    @property
    def errors(self) -> str:
        """Everything it wrote to stderr so far (nothing when merged into the output)."""
        return "\n".join(self.lines["stderr"])

    def stamped(self, stream: str = "stdout") -> list[tuple[float, str]]:
        """(time.monotonic() when it arrived, line) of every line of ``stream`` so far."""
        with self._changed:
            return list(zip(self.line_times[stream], self.lines[stream], strict=True))

    def tail(self, lines: int = 40) -> str:
        return "\n".join((self.lines["stdout"] + self.lines["stderr"])[-lines:])

    # -- waiting
    def wait_for_line(
        self, pattern: str | re.Pattern[str], timeout: float = 60.0, stream: str = "stdout", start: int = 0
    ) -> re.Match[str]:
        """The first line (from index ``start`` of ``stream``) that ``pattern`` matches (re.search),
        waiting for it; the process is stopped and ProcessError raised if it exits or ``timeout``
        passes first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = start
        with self._changed:
            while True:
                lines = self.lines[stream]
                for i in range(seen, len(lines)):
                    found = regex.search(lines[i])
                    if found:
                        return found
                seen = len(lines)
                ended = self.proc is None or self.proc.poll() is not None
                if ended and not any(p.is_alive() for p in self._pumps):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.2))
        self._fail(f"no line matching {regex.pattern!r} within {timeout:.0f} s")

    def wait_for(self, probe: Callable[[], T], timeout: float = 60.0, interval: float = 0.2, what: str = "ready") -> T:
        """Polls ``probe`` until it returns something truthy (its exceptions count as not yet) and
        returns that; stops the process and raises ProcessError if it exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            if self.proc is None or self.proc.poll() is not None:
                self._fail(f"exited before {what}")
            try:
                result = probe()
                if result:
                    return result
            except Exception as exc:  # not ready yet
                last_error = exc
            if time.monotonic() >= deadline:
                detail = f" (last error: {last_error!r})" if last_error else ""
                self._fail(f"not {what} within {timeout:.0f} s{detail}")
            time.sleep(interval)

    def _fail(self, why: str) -> Any:
        rc = self.returncode
        self.stop()
        exited = f" (exit status {rc})" if rc is not None else ""
        raise ProcessError(f"{self.name}: {why}{exited}", self.tail())


def http_ok(url: str, timeout: float = 2.0) -> Callable[[], bool]:
    """A probe: GET ``url`` answers 200."""
    return lambda: httpx.get(url, timeout=timeout).status_code == 200


def kvdoctor(*args: object, **options: Any) -> Process:
    """``python -m kvdoctor ARGS`` as a Process (not started yet; ``with`` or ``.start()``)."""
    options.setdefault("name", f"kvdoctor {args[0] if args else ''}".rstrip())
    return Process([sys.executable, "-m", "kvdoctor", *args], **options)


def start_on_free_port(launch: Callable[[int], T], attempts: int = 3, port: int | None = None) -> T:
    """``launch(port)`` (start a server there and wait until it is ready) on a free port, and again
    on another one when that port was taken meanwhile; with ``port``: that one, after a pause."""
    error: ProcessError | None = None
    for _ in range(attempts):
        try:
            return launch(port or free_port())
        except ProcessError as exc:
            if not exc.port_taken:
                raise
            error = exc
            if port:
                time.sleep(1.0)
    raise ProcessError(f"could not bind a port in {attempts} attempts", error.output if error else "")


class OnLoopback:
    """The address of a server on 127.0.0.1 at ``port`` (a mixin for the classes that start one)."""

    port: int

    @property
    def target(self) -> str:
        """``127.0.0.1:port``, as a Prometheus scrape target names it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"


@dataclass(kw_only=True)
class EngineServer(OnLoopback):
    """What the end-to-end tests' engine servers (llama-server, vLLM) share, keyword-only: the
    server's extra arguments and environment, its port and its process once started."""

    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: Process | None = None

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"


class RunsProcess:
    """Stopping, and reading the log of, the server a class runs as one ``Process`` (a mixin)."""

    process: Process | None

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.stop()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.tail(lines) if self.process is not None else ""


class Completed(NamedTuple):
    rc: int
    stdout: str
    stderr: str


def run(
    argv: Sequence[object],
    *,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    clean_env: bool = False,
    input: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Completed:
    """Runs a command to its end: (exit status, stdout, stderr)."""
    proc = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(env, clean_env),
        input=input,
        cwd=cwd,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    return Completed(proc.returncode, proc.stdout, proc.stderr)


def run_kvdoctor(*args: object, **options: Any) -> Completed:
    """``python -m kvdoctor ARGS`` run to its end: (exit status, stdout, stderr)."""
    return run([sys.executable, "-m", "kvdoctor", *args], **options)
