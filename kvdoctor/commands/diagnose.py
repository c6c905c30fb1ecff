"""kvdoctor diagnose: why is decode slow? The decision tree on a window from an exporter,
a Prometheus, or a recorded trace."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import UTC, datetime

import numpy as np

from kvdoctor import arguments, flags, probe
from kvdoctor.commands.ledger import load_gpu, load_model
from kvdoctor.errors import EXIT_OK, EXIT_SLOW, SourceUnreadable, UsageError
from kvdoctor.exporter.adapters import ADAPTERS
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.fleet_report import DEFAULT_LIMIT, render_fleet
from kvdoctor.rules.actions import GROUP_TITLES, shown
from kvdoctor.rules.context import Context, resolve
from kvdoctor.rules.diagnosis import Diagnosis, diagnose
from kvdoctor.rules.fleet import FleetRow, FleetSummary
from kvdoctor.rules.promql import quote
from kvdoctor.rules.thresholds import sized_for_interval
from kvdoctor.rules.verdicts import UNKNOWN
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.trace import TraceError
from kvdoctor.signals.units import fmt_ms, plural
from kvdoctor.signals.window import Window
from kvdoctor.sources.exporter_api import ExporterClient, WindowRefused
from kvdoctor.sources.fleet import read_fleet
from kvdoctor.sources.prometheus import BadSelector, PrometheusClient, PrometheusSource
from kvdoctor.sources.traces import load_trace

NAME = "diagnose"
HELP = "say why decode is slow: verdict, evidence and actions for a window of samples"
DESCRIPTION = """\
Run kvdoctor's decision tree on a window of canonical samples and print the verdict, its
confidence, a headline, the evidence (the comparisons that decided it and the state that explains
it, each with its windowed value and its threshold, measured or missing) and the actions in two
groups: "mitigate now" (minutes, no redeploy) and "fix" (a redeploy), each cheapest first, three of
each (--json has them all).

The SLO, the model and the GPU are the exporter's own (its /api/v1/status, or the
kvdoctor_inter_token_latency_slo_seconds and kvdoctor_context_info series it publishes, also through
Prometheus and in traces), so this command agrees with the exporter; --slo-ms, --model,
--gpu and --gpu-peak-bandwidth override them.

Where the window comes from (one of):
  --exporter URL                       a running kvdoctor exporter (its /api/v1/window)
  --prometheus URL [--selector SEL] [--namespace NS]
                                       a Prometheus (or VictoriaMetrics, Thanos, Mimir) scraping
                                       exporters; SEL: label matchers, e.g. '{pod="vllm-0"}'
  --replay FILE                        a trace written by `kvdoctor record` (or raw engine /metrics
                                       captures with timestamps: replayed through the engine adapters)

With --prometheus, where the selector (none: every pod) matches several pods, a fleet summary:
the count of each verdict (each exporter's own, kvdoctor_diagnosis_verdict) and the worst pods
first (slow verdicts, then ITL p95 over the pod's SLO) with their KV usage, queue and first action,
read from the recording rules of `kvdoctor rules export` in a handful of instant queries; --limit
rows (default {limit}; 0: all), --json every row. Where it matches one pod, that pod's full diagnosis.

The window is --window seconds (default 60, widened to 12 sampling intervals for sparser samples,
e.g. 180 s at Prometheus' 15 s: the window the alert rules read) ending at the newest sample, or at
--at (Unix seconds or RFC 3339, e.g. 2025-03-01T14:05:00Z).

exit status: 0 healthy or idle, 1 a slow verdict, 2 a usage or input error (a bad URL, selector,
flag or trace file, or a window with too few samples to judge), 3 the exporter or Prometheus could
not be read (or had no samples), or an internal error.

examples:
  kvdoctor diagnose --exporter http://127.0.0.1:9745
  kvdoctor diagnose --prometheus http://prometheus:9090 --selector '{pod="vllm-0"}' --at 2025-03-01T14:05:00Z
  kvdoctor diagnose --prometheus http://prometheus:9090 --namespace serving --limit 10
  kvdoctor diagnose --replay incident.om --json
"""

HTTP_TIMEOUT_SECONDS = 10.0
MAX_WINDOW_SECONDS = 86400.0  # a day: longer than any exporter keeps, and than an incident's window
MAX_SLO_MS = 3_600_000.0
MAX_LIMIT = 1_000_000
EARLIEST = 946_684_800.0  # 2000-01-01T00:00:00Z: no kvdoctor sample is older
FUTURE_SLACK_SECONDS = 3600.0  # clocks differ; an hour ahead is still a mistake worth a word
WITHOUT_VARIABLE = ("--replay", "--at", "--engine")  # this run's own input, not a setting
DESCRIPTION = DESCRIPTION.replace("{limit}", str(DEFAULT_LIMIT))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    flags.add(source, "--exporter", type=arguments.url, help="a kvdoctor exporter, e.g. http://127.0.0.1:9745")
    flags.add(source, "--prometheus", type=arguments.url, help="a Prometheus server, e.g. http://prometheus:9090")
    source.add_argument("--replay", metavar="FILE", help="a trace file (OpenMetrics with timestamps)")
    parser.add_argument(
        "--selector",
        metavar="SEL",
        help="with --prometheus: label matchers picking the pods, e.g. '{pod=\"vllm-0\"}' (default: every pod)",
    )
    parser.add_argument("--namespace", metavar="NS", help="with --prometheus: only the pods of this namespace")
    parser.add_argument(
        "--limit",
        type=arguments.ranged(int, 0, MAX_LIMIT, "rows", low_open=False),
        metavar="N",
        help=f"with --prometheus, several pods: show the N worst (default {DEFAULT_LIMIT}; 0: all; --json: all)",
    )
    parser.add_argument(
        "--at", metavar="TIME", help="end of the window: Unix seconds or RFC 3339 (default: newest sample)"
    )
    parser.add_argument(
        "--window",
        type=arguments.ranged(float, 0, MAX_WINDOW_SECONDS, "seconds"),
        metavar="S",
        help="window length in seconds (default: the thresholds' window_seconds, 60)",
    )
    flags.add(
        parser,
        "--slo-ms",
        type=arguments.ranged(float, 0, MAX_SLO_MS, "ms"),
        help="inter-token latency SLO in ms (default: the exporter's published SLO, else 100)",
    )
    flags.add(parser, "--thresholds", help="a YAML file overriding decision-tree thresholds")
    flags.add(
        parser,
        "--model",
        "--model-config",
        help="the served model: a config.json, a model folder, a cached Hugging Face id or a built-in name "
        "(enables the ledger's predicted effects; default: the exporter's published model)",
    )
    gpu = parser.add_mutually_exclusive_group()
    flags.add(
        gpu,
        "--gpu",
        help="GPU model for the ledger: its NVML name or a short name such as 'H100 SXM' (default: from the samples)",
    )
    flags.add(
        gpu,
        "--gpu-peak-bandwidth",
        type=arguments.ranged(float, 0, 1e15, "bytes/s"),
        help="peak DRAM bandwidth of one GPU, bytes/s",
    )
    flags.add(
        parser,
        "--engine",
        help="with --replay: the engine whose raw families the trace holds (default: recognised)",
    )
    flags.add(
        parser,
        "--timeout",
        type=arguments.timeout_seconds,
        default=HTTP_TIMEOUT_SECONDS,
        help=f"how long to wait for the exporter or Prometheus (default {HTTP_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")


# ------------------------------------------------------------------------------------- inputs


def parse_time(text: str) -> float:
    """Unix seconds or an RFC 3339 timestamp (with a zone: ``Z`` or ``+02:00``) -> Unix seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not math.isfinite(seconds) or seconds < 0:
            raise UsageError(f"--at {text!r}: not a time")
        if seconds > 1e11:
            raise UsageError(f"--at {text!r} looks like milliseconds; give Unix seconds")
        return seconds
    iso = value[:-1] + "+00:00" if value[-1:] in ("Z", "z") else value
    try:
        parsed = datetime.fromisoformat(iso.replace(" ", "T", 1) if "T" not in iso and " " in iso else iso)
    except ValueError:
        raise UsageError(f"--at {text!r}: give Unix seconds or RFC 3339, e.g. 2025-03-01T14:05:00Z") from None
    if parsed.tzinfo is None:
        raise UsageError(f"--at {text!r} has no time zone: add Z (UTC) or an offset such as +02:00")
    return parsed.timestamp()


def check_time(text: str, now: float | None = None) -> float:
    """``--at`` as Unix seconds, refused unless between 2000-01-01 and an hour from now."""
    at = parse_time(text)
    latest = (time.time() if now is None else now) + FUTURE_SLACK_SECONDS
    if not EARLIEST <= at <= latest:
        raise UsageError(
            f"--at must be a time from {_iso(EARLIEST)} to an hour from now ({_iso(latest)}), got {text!r}"
        )
    return at


def check_span(args: argparse.Namespace, at: float | None, now: float | None = None) -> None:
    """An exporter keeps its last minutes only: the window it is asked for (--window back from
    --at, and --at back from now) must be one it could serve, at most a day."""
    if not args.exporter or at is None:
        return
    ago = (time.time() if now is None else now) - at
    seconds = args.window if args.window is not None else 0.0
    if ago + seconds > MAX_WINDOW_SECONDS:
        raise UsageError(
            f"--at {args.at!r} is {ago:,.0f} s ago: an exporter keeps its last --retention seconds "
            f"(at most {MAX_WINDOW_SECONDS:,.0f}); give a time within that, or read the past from --prometheus"
        )


def _context(args: argparse.Namespace) -> Context:
    """What the flags say (None where they say nothing: the exporter's published context then)."""
    slo_seconds = None
    if args.slo_ms is not None:
        if not (args.slo_ms > 0 and math.isfinite(args.slo_ms)):
            raise UsageError(f"--slo-ms must be a positive number of milliseconds, got {args.slo_ms:g}")
        slo_seconds = args.slo_ms / 1000.0
    model = None
    if args.model:
        model = load_model(args.model)
    peak = None
    gpu_model = None
    if args.gpu:
        spec = load_gpu(args.gpu)
        peak, gpu_model = spec.peak_bandwidth, spec.name
    elif args.gpu_peak_bandwidth is not None:
        if not (args.gpu_peak_bandwidth > 0 and math.isfinite(args.gpu_peak_bandwidth)):
            raise UsageError(
                f"--gpu-peak-bandwidth must be a positive number of bytes/s, got {args.gpu_peak_bandwidth:g}"
            )
        peak = args.gpu_peak_bandwidth
    return Context(model=model, gpu_peak_bandwidth=peak, slo_seconds=slo_seconds, gpu_model=gpu_model)


def _validate(args: argparse.Namespace) -> None:
    for flag in ("selector", "namespace", "limit"):
        if getattr(args, flag) is not None and not args.prometheus:
            raise UsageError(f"--{flag} goes with --prometheus")
    if args.engine is not None:
        if not args.replay:
            raise UsageError("--engine goes with --replay (an exporter or Prometheus already holds canonical series)")
        if args.engine not in ADAPTERS:
            raise UsageError(f"unknown engine {args.engine!r} (choose from {', '.join(sorted(ADAPTERS))})")
    arguments.check_timeout(args.timeout)


def read_pods(args: argparse.Namespace, at: float | None) -> FleetSummary:
    """The pods the Prometheus selector matches (a few instant queries, whatever their number);
    UsageError for a bad URL or selector, SourceUnreadable when it cannot be read or nothing matches."""
    try:
        client = PrometheusClient(args.prometheus, timeout=args.timeout)
    except SourceError as exc:  # a malformed URL
        raise UsageError(str(exc)) from None
    try:
        with client:
            summary = read_fleet(client, args.selector, args.namespace, at)
    except BadSelector as exc:
        raise UsageError(str(exc)) from None
    except SourceError as exc:
        raise SourceUnreadable(str(exc)) from None
    if not summary.rows:
        when = f" at {_iso(at)}" if at is not None else ""
        raise SourceUnreadable(
            f"no kvdoctor pods match {summary.selector} at {client.url}{when} (no kvdoctor exporter series "
            f"in the 5 minutes before; for older data give --at)"
        )
    return summary


def pod_selector(row: FleetRow) -> str:
    """The one pod the fleet read found, as a selector for its window (GPU series included)."""
    if not row.pod:
        return ""
    return "{" + f"namespace={quote(row.namespace)},pod={quote(row.pod)}" + "}"


def load_window(
    args: argparse.Namespace, seconds: float, at: float | None, selector: str | None = None
) -> tuple[Window, str, Context | None]:
    """(the window to diagnose, where it came from, the exporter's published context if it said);
    UsageError on bad input, SourceUnreadable when the source cannot be read or holds no samples.
    ``selector``: the pod's, for --prometheus (default: --selector)."""
    if args.replay:
        return (*_replay_window(args, seconds, at), None)
    try:
        if args.prometheus:
            source = PrometheusSource(args.prometheus, selector or args.selector, timeout=args.timeout)
        else:
            client = ExporterClient(args.exporter, timeout=args.timeout)
    except SourceError as exc:  # a malformed URL or selector
        raise UsageError(str(exc)) from None
    try:
        if args.prometheus:
            with source:
                return source.window(seconds, at=at), f"Prometheus {source.url}, {source.selector}", None
        with client:
            # The exporter serves "the last N seconds of its clock"; ask for a little more, cut here.
            back = seconds + (max(0.0, time.time() - at) if at is not None else 0.0) + 5
            full = client.window(back)
            published = client.context()
    except BadSelector as exc:  # Prometheus refused the selector, or it matches several pods
        raise UsageError(str(exc)) from None
    except WindowRefused as exc:  # it keeps less than --window (and --at) ask for: the input's fault
        raise UsageError(f"--window/--at: {exc}") from None
    except SourceError as exc:
        raise SourceUnreadable(str(exc)) from None
    if not len(full) or not full.series:
        raise SourceUnreadable(f"the exporter at {client.url} holds no samples yet")
    return _cut(full, seconds, at, f"the exporter at {client.url}"), f"exporter {client.url}", published


def _replay_window(args: argparse.Namespace, seconds: float, at: float | None) -> tuple[Window, str]:
    try:
        trace = load_trace(args.replay, AdapterNormaliser(args.engine))
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    how = f"raw {trace.engine} families through the {trace.engine} adapter" if trace.engine else "canonical series"
    return _cut(trace.window, seconds, at, args.replay), f"replay of {args.replay} ({how})"


def _cut(full: Window, seconds: float, at: float | None, holder: str) -> Window:
    """The ``seconds`` of ``full`` up to ``at`` (default: its end); UsageError naming ``holder`` if empty."""
    end = full.end if at is None else at
    window = full.slice(end - seconds, end)
    if not len(window) or not window.series:
        raise UsageError(
            f"{holder} has no samples in the {seconds:g} s before {_iso(end)} "
            f"(it covers {_iso(full.start)} to {_iso(full.end)})"
        )
    return window


# ------------------------------------------------------------------------------------- output


def sampling_interval(window: Window) -> float | None:
    """The median spacing of the window's samples (None for fewer than two)."""
    if len(window) < 2:
        return None
    return float(np.median(np.diff(window.timestamps)))


def run(args: argparse.Namespace) -> int:
    _validate(args)
    at = check_time(args.at) if args.at is not None else None
    check_span(args, at)
    thresholds = arguments.read_thresholds(args.thresholds)
    given = _context(args)
    probe.check_scheme(args.exporter or args.prometheus, "--exporter" if args.exporter else "--prometheus")
    selector = None
    if args.prometheus:
        pods = read_pods(args, at)
        if len(pods.rows) > 1:
            return _print_fleet(args, pods)
        selector = pod_selector(pods.rows[0]) or args.selector
    seconds = args.window if args.window is not None else thresholds.window_seconds
    window, origin, published = load_window(args, seconds, at, selector)
    interval = sampling_interval(window)
    if interval is not None and interval > 0:
        # sparse samples (a Prometheus scraping every 15 s): the ranges the alert rules read
        sized = sized_for_interval(thresholds, interval)
        if args.window is None and sized.window_seconds > seconds:
            window, origin, published = load_window(args, sized.window_seconds, at, selector)
        thresholds = sized
    result = diagnose(window, resolve(given, published), thresholds)
    if result.verdict == UNKNOWN:
        raise UsageError(f"--window: {result.headline[0].lower()}{result.headline[1:]}; widen --window or wait")
    if args.json:
        text = json.dumps(result.to_json(), indent=2, allow_nan=False)
    else:
        text = render(result, window, origin, colour=_colour())
    _print(text)
    return EXIT_SLOW if result.slow else EXIT_OK


def _print_fleet(args: argparse.Namespace, pods: FleetSummary) -> int:
    limit = args.limit if args.limit is not None else (None if args.json else DEFAULT_LIMIT)
    if args.json:
        text = json.dumps(pods.to_json(limit or None), indent=2, allow_nan=False)
    else:
        text = render_fleet(pods, f"Prometheus {args.prometheus.rstrip('/')}", limit, colour=_colour())
    _print(text)
    return EXIT_SLOW if pods.slow else EXIT_OK


def _colour() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _print(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `kvdoctor diagnose ... | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


_COLOURS = {"ok": "32", "slow": "31", "dim": "2", "bold": "1", "warn": "33"}


def _paint(text: str, style: str, colour: bool) -> str:
    return f"\033[{_COLOURS[style]}m{text}\033[0m" if colour else text


def render(result: Diagnosis, window: Window, origin: str, colour: bool = False) -> str:
    """The human report: verdict, headline, evidence table, notes, actions by group."""
    ctx = result.context
    lines = [
        _paint(result.verdict, "slow" if result.slow else "ok", colour) + f"  (confidence {result.confidence:.2f})",
        _paint(result.headline, "bold", colour),
        "",
        _paint(
            f"window: {_span(window)} s, {plural(len(window), 'snapshot')} ending {_iso(window.end)}; {origin}; "
            f"ITL SLO {fmt_ms(ctx.slo, trim=True)} ({ctx.slo_source})"
            + (f"; model {ctx.model.name}" if ctx.model is not None else ""),
            "dim",
            colour,
        ),
    ]
    if result.differential:
        lines += ["", "also present"]
        for c in result.differential:
            lines.append(f"  {c.verdict}  (confidence {c.confidence:.2f})  {c.summary}")
    lines += ["", "evidence"]
    for e in result.evidence:
        role = "explains" if e.context else ("decides" if e.holds is not None else "")
        text = f"  {e.text}" + (f"  [{role}]" if role and e.measured else "")
        lines.append(_paint(text, "dim", colour) if not e.measured else text)
    if result.missing:
        lines.append(_paint("  missing signals: " + ", ".join(result.missing), "warn", colour))
    if result.unresolved:
        lines.append(_paint("  not ruled out for want of signals: " + ", ".join(result.unresolved), "warn", colour))
    for note in result.notes:
        lines.append(f"  note: {note}")
    knee = result.knee
    if knee.kind:
        lines += ["", f"knee: {knee.note}"]
    for group, actions in shown(result.actions).items():
        lines += ["", f"{GROUP_TITLES[group]}, cheapest first"]
        for n, action in enumerate(actions, 1):
            flags = "; ".join(
                f"{engine} {flag}"
                for engine, flag in (
                    ("vLLM", action.flag_vllm),
                    ("SGLang", action.flag_sglang),
                    ("llama.cpp", action.flag_llamacpp),
                )
                if flag
            )
            lines.append(f"  {n}. {action.title}" + (f"  [{flags}]" if flags else ""))
            lines.append(f"     {action.premise + ': ' if action.premise else ''}{action.why}")
            if action.effect:
                lines.append(f"     effect: {action.effect}")
    more = len(result.actions) - sum(len(a) for a in shown(result.actions).values())
    if more > 0:
        lines.append(_paint(f"  ({more} more with --json)", "dim", colour))
    return "\n".join(lines)


def _span(window) -> str:
    return f"{window.end - window.start:.0f}" if len(window) else "0"


def _iso(t: float) -> str:
    if t is None or not math.isfinite(t):
        return "?"
    stamp = datetime.fromtimestamp(t, tz=UTC)
    return (
        stamp.strftime("%Y-%m-%dT%H:%M:%S") + (f".{stamp.microsecond // 1000:03d}" if stamp.microsecond else "") + "Z"
    )
