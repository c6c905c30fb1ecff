"""kvdoctor record: poll an exporter (or an engine's /metrics) and write a replayable trace."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from pathlib import Path

NAME = "record"
HELP = "record an exporter's window (or an engine's /metrics) into a replayable trace file"
DESCRIPTION = """\
Poll a kvdoctor exporter's /api/v1/window every --interval seconds for --seconds seconds and
write what it collected as a trace: OpenMetrics text with a timestamp on every sample, the format
`kvdoctor diagnose --replay FILE` replays and `promtool tsdb create-blocks-from openmetrics`
backfills into Prometheus. An exporter without the window API is read through its /metrics.

With --engine-url instead, the engine's own /metrics page (vLLM, SGLang, ...) is recorded raw;
replay normalises it through the same engine adapters as the exporter.

Ctrl-C (or SIGTERM) stops early and writes what was collected; the file is also rewritten every
minute while recording, so a crash loses at most a minute.

examples:
  kvdoctor record --exporter http://127.0.0.1:9745 --seconds 300 -o incident.om
  kvdoctor record --engine-url http://127.0.0.1:8000/metrics --seconds 60 --interval 1 -o vllm.om
"""

DEFAULT_INTERVAL = 1.0
CHECKPOINT_SECONDS = 60.0
HTTP_TIMEOUT_SECONDS = 5.0
MAX_WINDOW_REQUEST = 900  # the exporter's default --max-window


class ExporterError(Exception):
    """The exporter could not be read; the message is one line."""


class ExporterClient:
    """The parts of a kvdoctor exporter's HTTP API that ``record`` and ``diagnose`` use."""

    def __init__(self, url: str, timeout: float = HTTP_TIMEOUT_SECONDS):
        import httpx

        self.url = exporter_base_url(url)
        self.timeout = timeout
        self._client = httpx.Client(timeout=timeout, follow_redirects=True)

    def _get(self, path: str, **params):
        import httpx

        try:
            return self._client.get(f"{self.url}{path}", params=params or None)
        except httpx.TimeoutException:
            raise ExporterError(f"the exporter at {self.url} did not answer within {self.timeout:g} s") from None
        except httpx.ConnectError as exc:
            why = "connection refused" if "refused" in str(exc).lower() else (str(exc) or type(exc).__name__)
            raise ExporterError(f"cannot reach the exporter at {self.url}: {why}") from None
        except httpx.HTTPError as exc:
            raise ExporterError(f"the exporter at {self.url}: {type(exc).__name__}: {exc}") from None

    def interval(self) -> float | None:
        """The exporter's collection interval from /api/v1/status (None if it does not say)."""
        response = self._get("/api/v1/status")
        if response.status_code != 200:
            return None
        try:
            value = float(response.json().get("interval_seconds"))
        except (ValueError, TypeError, AttributeError):
            return None
        return value if value > 0 else None

    def window(self, seconds: float):
        """``GET /api/v1/window?seconds=N`` as a Window; ``LookupError`` if the API is not there."""
        from kvdoctor.rules.window import Window

        n = max(1, int(math.ceil(seconds)))
        response = self._get("/api/v1/window", seconds=n)
        if response.status_code == 404:
            raise LookupError("no /api/v1/window")
        if response.status_code == 422:
            raise ExporterError(
                f"the exporter at {self.url} refused a {n} s window (it keeps less: see its --max-window)"
            )
        if response.status_code != 200:
            raise ExporterError(f"the exporter at {self.url} answered HTTP {response.status_code} to /api/v1/window")
        try:
            return Window.from_json(response.json())
        except ValueError as exc:  # also JSONDecodeError
            raise ExporterError(
                f"{self.url}/api/v1/window did not return a kvdoctor window: {str(exc).splitlines()[0][:120]}"
            ) from None

    def metrics_snapshot(self):
        """One Snapshot of the canonical ``kvdoctor_*`` samples on /metrics, stamped now."""
        from kvdoctor.rules.textparse import ExpositionError, iter_samples
        from kvdoctor.rules.window import Snapshot, series_key

        taken = time.time()
        response = self._get("/metrics")
        if response.status_code != 200:
            raise ExporterError(f"the exporter at {self.url} answered HTTP {response.status_code} to /metrics")
        snap = Snapshot(taken)
        try:
            for name, labels, value, _ts in iter_samples(response.text):
                if name.startswith("kvdoctor_"):
                    snap.samples[series_key(name, labels)] = value
        except ExpositionError as exc:
            raise ExporterError(f"{self.url}/metrics is not a Prometheus exposition: {exc}") from None
        if not snap.samples:
            raise ExporterError(f"{self.url}/metrics has no kvdoctor_* samples: is it a kvdoctor exporter?")
        return snap

    def close(self) -> None:
        self._client.close()


def exporter_base_url(url: str) -> str:
    """The exporter's base URL, whether given as the base, its /metrics or one of its API paths."""
    from urllib.parse import urlsplit

    from kvdoctor.errors import UsageError

    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--exporter needs an http(s) URL such as http://127.0.0.1:9745, got {url!r}")
    path = parts.path.rstrip("/")
    for tail in ("/metrics", "/api/v1/window", "/api/v1/diagnosis", "/api/v1/status"):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    return f"{parts.scheme}://{parts.netloc}{path}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--exporter", metavar="URL", help="a kvdoctor exporter, e.g. http://127.0.0.1:9745")
    source.add_argument("--engine-url", metavar="URL", help="an engine's /metrics (vLLM, SGLang, ...), recorded raw")
    parser.add_argument("--seconds", type=float, required=True, metavar="N", help="how long to record")
    parser.add_argument(
        "--interval", type=float, metavar="S", help="seconds between polls (default: the exporter's interval, else 1)"
    )
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the trace file to write")


def _check_output(path: str) -> Path:
    from kvdoctor.errors import UsageError

    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"-o {path}: is a directory")
    if not parent.is_dir():
        raise UsageError(f"-o {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"-o {path}: folder {parent} is not writable")
    return target


class _Stop(Exception):
    """SIGTERM: stop recording like Ctrl-C does."""


def _raise_stop(signum, frame):
    raise _Stop()


def run(args) -> int:
    from kvdoctor.errors import UsageError

    if not (args.seconds > 0 and math.isfinite(args.seconds)):
        raise UsageError(f"--seconds must be a positive number, got {args.seconds:g}")
    if args.interval is not None and not (args.interval > 0 and math.isfinite(args.interval)):
        raise UsageError(f"--interval must be a positive number, got {args.interval:g}")
    output = _check_output(args.output)
    # Ctrl-C and SIGTERM stop the recording and keep what it has, like the servers' own handlers:
    # set explicitly, as a job started in the background inherits SIGINT ignored.
    stop_signals = (signal.SIGINT, signal.SIGTERM) if _main_thread() else ()  # main thread only
    previous = {signum: signal.signal(signum, _raise_stop) for signum in stop_signals}
    try:
        if args.exporter:
            return _record_exporter(args, output)
        return _record_engine(args, output)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _say(message: str) -> None:
    print(f"kvdoctor record: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ exporter


class _Recording:
    """Snapshots merged by timestamp from overlapping windows; the trace is written from here."""

    def __init__(self, output: Path):
        self.output = output
        self.since: float | None = None  # on the exporter's clock, which may differ from ours
        self.snapshots: dict[float, object] = {}
        self.last_checkpoint = time.monotonic()

    def add_window(self, window) -> int:
        if not len(window):
            return 0
        if self.since is None:  # the first poll: the recording starts with the exporter's newest snapshot
            self.since = window.end
        added = 0
        for snap in window.snapshots():
            if snap.ts >= self.since and snap.ts not in self.snapshots:
                self.snapshots[snap.ts] = snap
                added += 1
        return added

    def add_snapshot(self, snap) -> None:
        self.snapshots[snap.ts] = snap

    def newest(self) -> float | None:
        return max(self.snapshots) if self.snapshots else None

    def timestamps(self) -> list[float]:
        return sorted(self.snapshots)

    def write(self) -> int:
        from kvdoctor.rules.window import Window
        from kvdoctor.sources.traces import write_window

        self.last_checkpoint = time.monotonic()
        return write_window(Window.from_snapshots(self.snapshots.values()), self.output)

    def checkpoint(self) -> None:
        if self.snapshots and time.monotonic() - self.last_checkpoint >= CHECKPOINT_SECONDS:
            self.write()


def _record_exporter(args, output: Path) -> int:
    from kvdoctor.errors import UsageError

    client = ExporterClient(args.exporter)
    try:
        try:
            exporter_interval = client.interval()
        except ExporterError as exc:
            raise UsageError(str(exc)) from None
        interval = args.interval or exporter_interval or DEFAULT_INTERVAL
        recording = _Recording(output)
        try:
            use_window_api = _poll_exporter(client, recording, interval, True, first=True)
        except ExporterError as exc:
            raise UsageError(str(exc)) from None
        mode = "/api/v1/window" if use_window_api else "/metrics"
        _say(f"recording {args.seconds:g} s from {client.url} ({mode}) every {interval:g} s into {output}")
        stopped = _loop(
            args.seconds, interval, recording, lambda: _poll_exporter(client, recording, interval, use_window_api)
        )
        if use_window_api and not stopped:
            try:  # the last cycle may have landed after the last poll
                _poll_exporter(client, recording, interval, True)
            except (ExporterError, LookupError, KeyboardInterrupt, _Stop):
                pass
    finally:
        client.close()
    return _finish(recording, stopped, client.url)


def _poll_exporter(
    client: ExporterClient, recording: _Recording, interval: float, use_window_api: bool, first: bool = False
) -> bool:
    """One poll; returns whether the window API is in use (the first poll finds out)."""
    if use_window_api:
        newest = recording.newest()
        behind = (time.time() - newest) if newest is not None else interval
        seconds = min(MAX_WINDOW_REQUEST, max(2 * interval, behind + 2 * interval))
        try:
            recording.add_window(client.window(seconds))
            return True
        except LookupError:
            if not first:
                raise ExporterError(f"{client.url}/api/v1/window disappeared") from None
    recording.add_snapshot(client.metrics_snapshot())
    return False


def _loop(seconds: float, interval: float, recording: _Recording, poll) -> bool:
    """Poll every ``interval`` until ``seconds`` have passed; True if stopped early (Ctrl-C)."""
    deadline = time.monotonic() + seconds
    next_poll = time.monotonic() + interval
    failing = False
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                return False
            time.sleep(max(0.0, min(next_poll, deadline) - now))
            if time.monotonic() >= deadline:
                return False
            next_poll += interval
            try:
                poll()
                if failing:
                    _say("source answers again")
                failing = False
            except ExporterError as exc:
                if not failing:
                    _say(f"{exc}; retrying every {interval:g} s")
                failing = True
            try:
                recording.checkpoint()
            except OSError as exc:  # keep recording; the final write reports it if it persists
                _say(f"cannot write {recording.output} yet: {exc.strerror or exc}")
    except (KeyboardInterrupt, _Stop):
        return True


def _finish(recording, stopped: bool, url: str) -> int:
    from kvdoctor.errors import UsageError

    times = recording.timestamps()
    if not times:
        raise UsageError(f"nothing was collected from {url}; no trace written")
    try:
        count = recording.write()
    except OSError as exc:
        raise UsageError(f"cannot write {recording.output}: {exc.strerror or exc}") from None
    span = times[-1] - times[0]
    how = "stopped early; " if stopped else ""
    _say(f"{how}wrote {count} snapshots covering {span:.0f} s to {recording.output}")
    return 0


# -------------------------------------------------------------------------------------- engine


class _RawRecording:
    """Raw pages of an engine's /metrics with the time each was taken."""

    def __init__(self, output: Path):
        self.output = output
        self.captures: list[tuple[float, str]] = []
        self.last_checkpoint = time.monotonic()

    def timestamps(self) -> list[float]:
        return [ts for ts, _ in self.captures]

    def write(self) -> int:
        from kvdoctor.sources.traces import write_raw_captures

        self.last_checkpoint = time.monotonic()
        write_raw_captures(self.captures, self.output)
        return len(self.captures)

    def checkpoint(self) -> None:
        if self.captures and time.monotonic() - self.last_checkpoint >= CHECKPOINT_SECONDS:
            self.write()


def _record_engine(args, output: Path) -> int:
    from urllib.parse import urlsplit

    from kvdoctor.errors import UsageError
    from kvdoctor.exporter.adapters import ADAPTERS, detect
    from kvdoctor.exporter.collectors.http import HttpExposition
    from kvdoctor.rules.collection import SourceError
    from kvdoctor.rules.textparse import ExpositionError, family_names

    parts = urlsplit(args.engine_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(
            f"--engine-url needs an http(s) URL such as http://127.0.0.1:8000/metrics, got {args.engine_url!r}"
        )
    url = args.engine_url if parts.path not in ("", "/") else args.engine_url.rstrip("/") + "/metrics"
    interval = args.interval or DEFAULT_INTERVAL
    page = HttpExposition(url, timeout=min(HTTP_TIMEOUT_SECONDS, max(interval, 0.5)))
    recording = _RawRecording(output)

    def capture() -> str:
        taken = time.time()
        try:
            text = page.fetch()
        except SourceError as exc:
            raise ExporterError(str(exc)) from None
        recording.captures.append((taken, text))
        return text

    try:
        try:
            first = capture()
            names = family_names(first)
        except ExporterError as exc:
            raise UsageError(str(exc)) from None
        except ExpositionError as exc:
            raise UsageError(f"{url} is not a Prometheus exposition: {exc}") from None
        adapter = detect(names)
        if adapter is None:
            raise UsageError(f"{url}: no engine adapter ({', '.join(ADAPTERS)}) recognises this page")
        _say(f"recording {args.seconds:g} s of {adapter.name} metrics from {url} every {interval:g} s into {output}")
        stopped = _loop(args.seconds, interval, recording, capture)
    finally:
        page.close()
    return _finish(recording, stopped, url)
