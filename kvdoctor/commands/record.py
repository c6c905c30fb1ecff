"""kvdoctor record: write a replayable trace of what an exporter or a Prometheus already holds
(``--since``), or poll an exporter (or an engine's /metrics) from now on (``--seconds``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

from kvdoctor import arguments, flags, probe
from kvdoctor.errors import SourceUnreadable, UsageError
from kvdoctor.exporter.adapters import ADAPTERS, detect
from kvdoctor.exporter.collectors.http import HttpExposition
from kvdoctor.output import check_writable_file
from kvdoctor.signals import collection
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.textparse import ExpositionError, family_names
from kvdoctor.sources.exporter_api import WINDOW_PATH, ExporterClient, NoWindowApi
from kvdoctor.sources.paths import METRICS_PATH
from kvdoctor.sources.prometheus import BadSelector, PrometheusSource
from kvdoctor.sources.recording import ExporterRecorder, RawRecording, Recording, SnapshotRecording

NAME = "record"
HELP = "write a replayable trace: what an exporter or Prometheus holds (--since), or from now on (--seconds)"
DESCRIPTION = """Write a trace of kvdoctor's signals: OpenMetrics text with a timestamp on every sample, the format
`kvdoctor diagnose --replay FILE` replays and `promtool tsdb create-blocks-from openmetrics`
backfills into Prometheus.

--since DURATION (as `kubectl logs --since` takes it: 90s, 15m, 1h, 1h30m) writes at once what the
source already holds of the last DURATION, so the minutes before a page are saved without
recording for as long again:
  --exporter URL     its ring store, through /api/v1/window: at most its --retention (default
                     15 minutes) and its --max-window (an exporter serving less gives its longest)
  --prometheus URL   the kvdoctor_* series matching --selector (one pod: its engine and GPUs),
                     raw samples up to an hour, a range query beyond

--seconds S polls a kvdoctor exporter's /api/v1/window every --interval seconds for S seconds (with
--since too: after what it already held). An exporter without the window API is read through its
/metrics. With --engine-url instead, the engine's own /metrics page (vLLM, SGLang, ...) is
recorded raw; replay normalises it through the same engine adapters as the exporter.

Ctrl-C (or SIGTERM) stops early and writes what was collected; the file is also rewritten every
minute while recording, so a crash loses at most a minute. Progress and the summary go to stderr;
--json also prints the summary (the file, snapshots, seconds covered) as one JSON object on stdout.

examples:
  kvdoctor record --exporter http://127.0.0.1:9745 --since 15m -o incident.om
  kvdoctor record --prometheus http://prometheus:9090 --selector '{pod="vllm-0"}' --since 1h -o incident.om
  kvdoctor record --exporter http://127.0.0.1:9745 --since 15m --seconds 300 -o incident.om
  kvdoctor record --exporter http://127.0.0.1:9745 --seconds 300 -o trace.om
  kvdoctor record --engine-url http://127.0.0.1:8000/metrics --seconds 60 --interval 1 -o vllm.om
  kvdoctor record --exporter http://127.0.0.1:9745 --seconds 60 -o trace.om --json
"""
EXIT_STATUS = """exit status: 0 the trace written (stopped early too), 2 a usage error (a flag out of range, -o where
no file can be written, a URL of the wrong scheme, a selector Prometheus refuses or that matches
several pods), 3 the source could not be read (nothing collected, or it holds nothing in --since),
or an internal error. With --json a failure is one JSON object on stdout too."""

DEFAULT_INTERVAL = 1.0
MAX_SECONDS = 7 * 86400.0  # a week: a trace is replayed whole, in memory
MAX_INTERVAL = 3600.0
ENGINE_TIMEOUT_SECONDS = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    flags.add(source, "--exporter", type=arguments.url, help="a kvdoctor exporter, e.g. http://127.0.0.1:9745")
    flags.add(
        source,
        "--prometheus",
        type=arguments.url,
        help="a Prometheus scraping kvdoctor exporters (with --since), e.g. http://prometheus:9090",
    )
    flags.add(source, "--engine-url", type=arguments.url, help="an engine's /metrics (vLLM, SGLang, ...), recorded raw")
    parser.add_argument(
        "--since",
        type=arguments.since,
        metavar="DURATION",
        help="write at once what the source already holds of the last DURATION, as kubectl logs --since "
        "takes it: 90s, 15m, 1h, 1h30m (at most a week)",
    )
    parser.add_argument(
        "--seconds",
        type=arguments.ranged(float, 0, MAX_SECONDS, "seconds (a week)"),
        metavar="S",
        help="record from now on for S seconds (at most a week)",
    )
    parser.add_argument(
        "--selector",
        metavar="SEL",
        help="with --prometheus: label matchers picking one pod, e.g. '{pod=\"vllm-0\"}' (default: every "
        "kvdoctor series, which must be one pod's)",
    )
    parser.add_argument(
        "--interval",
        type=arguments.ranged(float, 0, MAX_INTERVAL, "seconds"),
        metavar="S",
        help="seconds between polls (default: the exporter's interval, else 1)",
    )
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the trace file to write")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")


def _check_combination(args: argparse.Namespace) -> None:
    """--since, --seconds, --selector and the source: UsageError for what does not go together."""
    if args.seconds is None and args.since is None:
        raise UsageError("give --since DURATION (what the source already holds) and/or --seconds S (from now on)")
    if args.since is not None and not 0 < args.since <= MAX_SECONDS:
        raise UsageError(f"--since must be more than 0 up to a week ({MAX_SECONDS:,.0f} s), got {args.since:g} s")
    if args.selector is not None and not args.prometheus:
        raise UsageError("--selector goes with --prometheus")
    if args.prometheus and args.since is None:
        raise UsageError("--prometheus needs --since DURATION: it writes what Prometheus holds, e.g. --since 1h")
    if args.prometheus and args.seconds is not None:
        raise UsageError("--seconds goes with --exporter or --engine-url: Prometheus is read at once (--since)")
    if args.engine_url and args.since is not None:
        raise UsageError(
            "--since goes with --exporter or --prometheus: an engine's /metrics holds only the present "
            "(record it forward with --seconds)"
        )


def _check_output(path: str) -> Path:
    """The trace file, once a file could be made beside it (``/proc/x`` cannot): UsageError else."""
    check_writable_file(path, "-o")
    return Path(path)


class _Stop(Exception):
    """SIGTERM: stop recording like Ctrl-C does."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop()


def run(args: argparse.Namespace) -> int:
    _check_combination(args)
    if args.seconds is not None and not 0 < args.seconds <= MAX_SECONDS:  # a variable's value is checked here too
        raise UsageError(
            f"--seconds must be more than 0 up to {MAX_SECONDS:,.0f} seconds (a week), got {args.seconds:g}"
        )
    if args.interval is not None and not 0 < args.interval <= MAX_INTERVAL:
        raise UsageError(f"--interval must be more than 0 up to {MAX_INTERVAL:,.0f} seconds, got {args.interval:g}")
    output = _check_output(args.output)
    flag = "--exporter" if args.exporter else "--prometheus" if args.prometheus else "--engine-url"
    probe.check_scheme(args.exporter or args.prometheus or args.engine_url, flag)
    if args.prometheus:
        return _record_prometheus(args, output)
    # Ctrl-C and SIGTERM stop the recording and keep what it has, like the servers' own handlers:
    # set explicitly, as a job started in the background inherits SIGINT ignored.
    in_main_thread = threading.current_thread() is threading.main_thread()  # where handlers can be set
    stop_signals = (signal.SIGINT, signal.SIGTERM) if in_main_thread else ()
    previous = {signum: signal.signal(signum, _raise_stop) for signum in stop_signals}
    try:
        if args.exporter:
            return _record_exporter(args, output)
        return _record_engine(args, output)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _say(message: str) -> None:
    print(f"kvdoctor record: {message}", file=sys.stderr, flush=True)


def _record_exporter(args: argparse.Namespace, output: Path) -> int:
    try:
        client = ExporterClient(args.exporter)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    with client:
        recording = SnapshotRecording(output)
        try:
            interval = args.interval or client.interval() or DEFAULT_INTERVAL
            recorder = ExporterRecorder(client, recording, interval)
            held = _backfill(args, client.url, recorder) if args.since is not None else ""
            if args.seconds is None:
                return _finish(recording, False, client.url, WINDOW_PATH, args.json, held)
            recorder.first_poll()
        except SourceError as exc:
            raise SourceUnreadable(str(exc)) from None
        _say(f"recording {args.seconds:g} s from {client.url} ({recorder.mode}) every {interval:g} s into {output}")
        stopped = _loop(args.seconds, interval, recording, recorder.poll)
        if recorder.uses_window_api and not stopped:
            with contextlib.suppress(SourceError, KeyboardInterrupt, _Stop):
                recorder.poll()  # the last cycle may have landed after the last poll
    return _finish(recording, stopped, client.url, recorder.mode, args.json, held)


def _backfill(args: argparse.Namespace, url: str, recorder: ExporterRecorder) -> str:
    """What the exporter already holds of --since, into the recording; the words saying how much."""
    try:
        asked = recorder.backfill(args.since)
    except NoWindowApi:
        raise SourceUnreadable(
            f"{url} has no {WINDOW_PATH}, so its past cannot be read; record it forward with --seconds"
        ) from None
    times = recorder.recording.timestamps()
    if not times:
        raise SourceUnreadable(f"{url} holds no samples yet (it has not completed a collection); no trace written")
    held = f"the exporter held {times[-1] - times[0]:.0f} s of the {args.since:g} s asked for"
    if asked < args.since:
        held += f" (it serves at most {asked:g} s: its --max-window)"
    return held


def _record_prometheus(args: argparse.Namespace, output: Path) -> int:
    """What Prometheus holds of the last --since seconds of one pod's kvdoctor_* series, at once."""
    try:
        source = PrometheusSource(args.prometheus, args.selector)
    except SourceError as exc:  # a malformed URL or selector
        raise UsageError(str(exc)) from None
    with source:
        try:
            window = source.window(args.since)
        except BadSelector as exc:  # Prometheus refused the selector, or it matches several pods
            raise UsageError(str(exc)) from None
        except SourceError as exc:
            raise SourceUnreadable(str(exc)) from None
    recording = SnapshotRecording(output)
    recording.add_history(window)
    return _finish(recording, False, source.url, f"Prometheus {source.selector}", args.json)


def _record_engine(args: argparse.Namespace, output: Path) -> int:
    parts = urlsplit(args.engine_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(
            f"--engine-url needs an http(s) URL such as http://127.0.0.1:8000/metrics, got {args.engine_url!r}"
        )
    url = args.engine_url if parts.path not in ("", "/") else args.engine_url.rstrip("/") + METRICS_PATH
    interval = args.interval or DEFAULT_INTERVAL
    # The exporter's own page fetch: the trace holds what the exporter would have read.
    page = HttpExposition(url, timeout=min(ENGINE_TIMEOUT_SECONDS, max(interval, 0.5)))
    recording = RawRecording(output)

    def capture() -> str:
        taken = time.time()
        try:
            text = page.fetch()
        except collection.SourceError as exc:
            raise SourceError(str(exc)) from None
        recording.add(taken, text)
        return text

    try:
        try:
            names = family_names(capture())
        except SourceError as exc:
            raise SourceUnreadable(str(exc)) from None
        except ExpositionError as exc:
            raise UsageError(f"{url} is not a Prometheus exposition: {exc}") from None
        adapter = detect(names)
        if adapter is None:
            raise UsageError(f"{url}: no engine adapter ({', '.join(ADAPTERS)}) recognises this page")
        _say(f"recording {args.seconds:g} s of {adapter.name} metrics from {url} every {interval:g} s into {output}")
        stopped = _loop(args.seconds, interval, recording, capture)
    finally:
        page.close()
    return _finish(recording, stopped, url, f"raw {adapter.name} /metrics", args.json)


def _loop(seconds: float, interval: float, recording: Recording, poll: Callable[[], object]) -> bool:
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
            except SourceError as exc:
                if not failing:
                    _say(f"{exc}; retrying every {interval:g} s")
                failing = True
            try:
                recording.checkpoint()
            except OSError as exc:  # keep recording; the final write reports it if it persists
                _say(f"cannot write {recording.output} yet: {exc.strerror or exc}")
    except (KeyboardInterrupt, _Stop):
        return True


def _finish(recording: Recording, stopped: bool, url: str, mode: str, as_json: bool, held: str = "") -> int:
    times = recording.timestamps()
    if not times:
        raise SourceUnreadable(f"nothing was collected from {url}; no trace written")
    try:
        count = recording.write()
    except OSError as exc:
        raise UsageError(f"cannot write {recording.output}: {exc.strerror or exc}") from None
    span = times[-1] - times[0]
    how = "stopped early; " if stopped else ""
    if as_json:
        summary = {
            "output": str(recording.output),
            "source": url,
            "mode": mode,
            "snapshots": count,
            "seconds": round(span, 3),
            "start": times[0],
            "end": times[-1],
            "stopped_early": stopped,
        }
        print(json.dumps(summary), flush=True)
    _say(f"{how}wrote {count} snapshots covering {span:.0f} s to {recording.output}{'; ' + held if held else ''}")
    return 0
