"""kvdoctor stress's report folder: the finished run analysed (steps, saturation, the verdict and a
diagnosis of its last window) and written as summary.json, report.html, kv-latency.png and
trace.om."""

from __future__ import annotations

import sys
from pathlib import Path

from kvdoctor.rules.context import PUBLISHED
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.thresholds import DIAGNOSIS_WINDOW_SECONDS
from kvdoctor.sources.traces import write_window
from kvdoctor.stress import plan as S
from kvdoctor.stress.report import FIGURE_NEEDS_EXTRA, render_figure, render_html, write_json
from kvdoctor.stress.timeline import bin_run

TAIL_SECONDS = 1.5  # after the load stops: one more exporter cycle reaches the trace


def write_report(settings, result: dict, out_dir) -> dict:
    """Analyses a finished run and writes the report folder; returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runner, steps, window = result.runner, result.steps, result.window
    start, end = result.run_start, result.run_end
    bins = bin_run(runner.requests, steps, window, start, end, bin_seconds=1.0)
    summaries = S.summarise_steps(runner.requests, steps, bins, window)
    saturation = S.find_saturation(bins, steps, settings.kv_saturation, summaries, settings.ttft_slo_seconds)
    verdict = S.stress_verdict(bins, saturation, dram_peak=S.dram_bandwidth_peak(window))

    diagnosis = None
    slo_seconds = None  # the SLO the exporter published: the diagnosis compares with it, the figure draws it
    if len(window) >= 2:
        tail = window.slice(end - DIAGNOSIS_WINDOW_SECONDS, end + TAIL_SECONDS + 1)
        if len(tail) >= 2:
            d = diagnose(tail)
            diagnosis = {
                "verdict": d.verdict,
                "headline": d.headline,
                "confidence": round(d.confidence, 3),
                "window_seconds": round(d.window_seconds),
                "slo_seconds": d.context.slo,
                "slo_source": d.context.slo_source,
            }
            slo_seconds = d.context.slo if d.context.slo_source == PUBLISHED else None
    trace_series = 0
    if len(window):
        trace_series = write_window(window, out / "trace.om")
    else:
        (out / "trace.om").write_text("# EOF\n")
    endpoint = result.endpoint
    extra = {
        "signals": {
            "source": result.signals.description,
            "snapshots": len(window),
            "trace_series": trace_series,
            "poll_errors": result.poll_errors,
        },
        "latency_source": bins.latency_source,
        "diagnosis": diagnosis,
        "failed": result.failed or None,
        "interrupted": result.interrupted,
        "requests": runner.counts(),
        "prompts": {"run_id": runner.run_id, "shared_prefix": runner.share_prefix},
        "files": {"report": "report.html", "figure": "kv-latency.png", "trace": "trace.om", "summary": "summary.json"},
    }
    summary = S.summary_json(settings, endpoint.describe(), summaries, saturation, verdict, start, end, extra)
    title = (
        f"kvdoctor stress — {endpoint.model}, {endpoint.prompt_tokens or settings.prompt_tokens}-token prompt, "
        f"{settings.max_tokens} tokens generated"
    )
    figure = render_figure(
        bins, summaries, [s.started for s in steps], saturation, verdict, out / "kv-latency.png", title, slo_seconds
    )
    if figure is None:  # no matplotlib (the [dashboard] extra): the rest of the report stands without it
        summary["files"]["figure"] = None
        print(f"kvdoctor stress: note: {FIGURE_NEEDS_EXTRA}", file=sys.stderr, flush=True)
    write_json(summary, out / "summary.json")
    render_html(summary, figure, out / "report.html")
    return summary
