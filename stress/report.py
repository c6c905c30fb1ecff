"""``kvdoctor stress``, the report: the KV/latency figure, a self-contained HTML page, the files.

The figure (``kv-latency.png``) puts KV usage (%, left axis) and the per-token latency p50/p95
(ms, right axis) on one time axis, marks each concurrency step, the preemptions and the knee; a
side panel shows the same bins as latency against KV usage, where the knee lives. Drawn with
matplotlib's object API on the Agg canvas: no pyplot, no global backend switch, no display.
matplotlib comes with the ``[dashboard]`` extra: without it there is no figure (``render_figure``
returns None) and the page says so; the rest of the report does not need it.
"""

from __future__ import annotations

import base64
import html
import json
import os
import textwrap
from pathlib import Path

import numpy as np

from kvdoctor.signals.units import MISSING, fmt_number, fmt_pct
from kvdoctor.stress.plan import Saturation, StepSummary, Verdict
from kvdoctor.stress.timeline import Bins

__all__ = ["FIGURE_NEEDS_EXTRA", "render_figure", "render_html", "write_json"]

KV_COLOUR = "#3b7dd8"
P50_COLOUR = "#e07b00"
P95_COLOUR = "#c0392b"
MEAN_COLOUR = "#6d4c41"
KNEE_COLOUR = "#8e44ad"
SLO_COLOUR = "#333333"
SLO_IN_VIEW = 3.0  # the SLO line is drawn when at most this many times the highest p50 or mean latency
STEP_SHADE = "#f2f2f2"
FIGURE_NEEDS_EXTRA = "the figure (kv-latency.png) needs matplotlib: pip install 'kvdoctor[dashboard]'"


def _step_colours(cmap, n: int) -> list:
    return [cmap(0.9 * i / max(n - 1, 1)) for i in range(n)]


def _latency_scale(values: np.ndarray) -> str:
    finite = values[np.isfinite(values) & (values > 0)]
    if len(finite) and finite.max() / max(finite.min(), 1e-9) > 20:
        return "log"
    return "linear"


def render_figure(
    bins: Bins,
    steps: list[StepSummary],
    step_starts: list[float],
    saturation: Saturation,
    verdict: Verdict,
    path: str | os.PathLike,
    title: str = "",
    slo_seconds: float | None = None,
) -> Path | None:
    """Draws the figure into ``path`` (PNG) and returns the path; None without matplotlib.
    ``slo_seconds``: the ITL SLO the exporter published, drawn on the latency axis."""
    # matplotlib is optional (the [dashboard] extra): imported here so the rest of the report works without it.
    try:
        from matplotlib import colormaps  # noqa: PLC0415
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
        from matplotlib.lines import Line2D  # noqa: PLC0415
        from matplotlib.patches import Patch  # noqa: PLC0415
        from matplotlib.transforms import blended_transform_factory  # noqa: PLC0415
    except ImportError:
        return None

    start = float(step_starts[0]) if step_starts else float(bins.edges[0])
    x = bins.centres - start
    kv = bins.kv_usage * 100
    p50 = bins.itl_p50 * 1000
    p95 = bins.itl_p95 * 1000

    fig = Figure(figsize=(12.5, 5.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1, 2, width_ratios=(3, 1.15))
    ax = fig.add_subplot(grid[0, 0])
    side = fig.add_subplot(grid[0, 1])

    # concurrency steps: alternate shading, a label at the top
    top = blended_transform_factory(ax.transData, ax.transAxes)
    ends = [*step_starts[1:], float(bins.edges[-1])]
    for i, (s, t0, t1) in enumerate(zip(steps, step_starts, ends, strict=False)):
        a, b = t0 - start, t1 - start
        if i % 2:
            ax.axvspan(a, b, color=STEP_SHADE, zorder=0)
        if i:
            ax.axvline(a, color="#999999", lw=0.8, ls=":", zorder=1)
        ax.text(
            (a + b) / 2, 0.985, f"×{s.concurrency}", transform=top, ha="center", va="top", fontsize=9, color="#555555"
        )

    # KV usage
    has_kv = not np.isnan(kv).all()
    if has_kv:
        ax.fill_between(x, 0, np.nan_to_num(kv), step="mid", color=KV_COLOUR, alpha=0.18, lw=0)
        ax.plot(x, kv, drawstyle="steps-mid", color=KV_COLOUR, lw=1.6)
    else:
        ax.text(
            0.5,
            0.5,
            "KV usage not recorded (no exporter signals)",
            transform=ax.transAxes,
            ha="center",
            color=KV_COLOUR,
        )
    ax.set_ylim(0, 108)
    ax.set_ylabel("KV-cache usage (%)", color=KV_COLOUR)
    ax.tick_params(axis="y", colors=KV_COLOUR)
    ax.set_xlabel("seconds since the start of the run (step = concurrency ×N)")
    ax.set_xlim(min(0.0, float(bins.edges[0] - start)), float(bins.edges[-1] - start))

    # preemptions, as ticks along the top of the KV axis
    with np.errstate(invalid="ignore"):
        pre = bins.preemptions > 0
    if pre.any():
        ax.plot(x[pre], np.full(pre.sum(), 101.5), "v", color=P95_COLOUR, ms=5, zorder=5)

    # per-token latency on the right axis
    lat = ax.twinx()
    mean = bins.itl_mean * 1000
    lat.plot(x, p50, color=P50_COLOUR, lw=1.5, marker=".", ms=3)
    lat.plot(x, p95, color=P95_COLOUR, lw=1.0, ls="--")
    lat.plot(x, mean, color=MEAN_COLOUR, lw=1.0, ls=":")
    scale = _latency_scale(np.concatenate([p50, p95, mean]))
    lat.set_yscale(scale)
    slo_ms = slo_seconds * 1000 if slo_seconds else None
    measured = np.concatenate([p95, mean])
    measured = measured[np.isfinite(measured)]
    typical = np.concatenate([p50, mean])
    typical = typical[np.isfinite(typical)]
    # The SLO line is drawn where the curves are; one far above them would flatten them (a p95
    # spike does not count): the legend then says where it is instead.
    slo_in_view = bool(slo_ms) and (not len(typical) or slo_ms <= SLO_IN_VIEW * typical.max())
    if scale == "linear":
        top = max([*measured.tolist(), *([slo_ms] if slo_in_view else [])], default=1.0)
        lat.set_ylim(0, top * 1.15)
    if slo_in_view:
        lat.axhline(slo_ms, color=SLO_COLOUR, lw=1.2, ls=":", zorder=3)
    lat.set_ylabel("per-token latency (ms)", color=P50_COLOUR)
    lat.tick_params(axis="y", colors=P50_COLOUR)

    # the knee: where latency jumps (a rise with KV has no single level to mark)
    jump = verdict.knee.kind == "jump" and verdict.knee.kv_level is not None and has_kv
    if jump:
        level = verdict.knee.kv_level * 100
        ax.axhline(level, color=KNEE_COLOUR, lw=1, ls="-.", zorder=2)
        if verdict.knee_time is not None:
            kx = verdict.knee_time - start
            ax.axvline(kx, color=KNEE_COLOUR, lw=1.6, zorder=2)
            ax.annotate(
                f"knee: KV ≈ {level:.0f}%",
                (kx, level),
                xytext=(8, -18),
                textcoords="offset points",
                color=KNEE_COLOUR,
                fontsize=9,
                fontweight="bold",
            )

    handles = [
        Patch(color=KV_COLOUR, alpha=0.4, label="KV usage (%)"),
        Line2D([], [], color=P50_COLOUR, lw=1.5, label="per-token latency p50"),
        Line2D([], [], color=P95_COLOUR, lw=1.0, ls="--", label="per-token latency p95"),
        Line2D([], [], color=MEAN_COLOUR, lw=1.0, ls=":", label="per-token latency mean (the knee's input)"),
    ]
    if slo_ms:
        where = "" if slo_in_view else ", above this axis"
        handles.append(
            Line2D([], [], color=SLO_COLOUR, lw=1.2, ls=":", label=f"ITL SLO {slo_ms:g} ms (the exporter's{where})")
        )
    if pre.any():
        handles.append(Line2D([], [], color=P95_COLOUR, marker="v", ls="", label="preemption"))
    if jump:
        handles.append(Line2D([], [], color=KNEE_COLOUR, lw=1.6, label="knee"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.93), fontsize=8, framealpha=0.9)

    # side panel: latency against KV usage, one point per bin
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(bins.itl_mean) & np.isfinite(bins.kv_usage) & (bins.tokens > 0)
    if ok.any():
        cmap = _step_colours(colormaps["viridis"], len(steps))
        for i, s in enumerate(steps):
            mine = ok & (bins.step == s.index)
            if mine.any():
                sizes = 10 + 40 * bins.tokens[mine] / max(bins.tokens[ok].max(), 1)
                side.scatter(
                    kv[mine],
                    bins.itl_mean[mine] * 1000,
                    s=sizes,
                    color=cmap[i],
                    alpha=0.85,
                    edgecolors="none",
                    label=f"×{s.concurrency}",
                )
        side.set_yscale(_latency_scale(bins.itl_mean[ok] * 1000))
        if jump:
            side.axvline(verdict.knee.kv_level * 100, color=KNEE_COLOUR, lw=1.4)
        side.legend(title="concurrency", fontsize=8, title_fontsize=8, loc="upper left")
    else:
        side.text(0.5, 0.5, "no (KV, latency) pairs", transform=side.transAxes, ha="center")
    side.set_xlabel("KV-cache usage (%)")
    side.set_ylabel("mean per-token latency (ms)")
    side.set_title("latency vs KV usage (one point per interval)", fontsize=8)
    side.grid(alpha=0.3)

    headline = "\n".join(textwrap.wrap(verdict.headline, 125, break_on_hyphens=False)[:3])
    fig.suptitle((title + "\n" if title else "") + headline, fontsize=10, x=0.01, ha="left")
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def write_json(data: dict, path: str | os.PathLike) -> Path:
    out = Path(path)
    out.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    return out


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1180px;
color:#1d1d1f;padding:0 1rem}
h1{font-size:1.35rem;margin-bottom:.2rem}.sub{color:#666;margin-top:0}
.verdict{border-left:5px solid #8e44ad;background:#faf6fd;padding:.7rem 1rem;margin:1rem 0;font-size:1.05rem}
.verdict.bandwidth_bound{border-color:#e07b00;background:#fff8ef}.verdict.no_knee,.verdict.unknown{border-color:#888;
background:#f6f6f6}
img{max-width:100%;border:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0 1.2rem}td,th{padding:.25rem .6rem;border-bottom:1px solid #e5e5e5;
text-align:right}th{background:#fafafa}td:first-child,th:first-child{text-align:left}
tr.sat td{background:#fdecea}.kv{font-family:ui-monospace,Menlo,monospace;font-size:13px}
.notes{color:#555;font-size:.92rem}
"""


def render_html(summary: dict, png_path: str | os.PathLike | None, path: str | os.PathLike) -> Path:
    """report.html: one file, the figure embedded (when ``png_path`` is a file), every number from
    ``summary``."""
    e = html.escape
    settings, endpoint, verdict = summary["settings"], summary["endpoint"], summary["verdict"]
    saturation, steps = summary["saturation"], summary["steps"]
    if png_path is not None and Path(png_path).is_file():
        png = base64.b64encode(Path(png_path).read_bytes()).decode()
        figure = f'<img alt="KV usage and per-token latency over the run" src="data:image/png;base64,{png}">'
        figure_link = '<a href="kv-latency.png">kv-latency.png</a> · '
    else:
        figure = f'<p class="notes">No figure: {e(FIGURE_NEEDS_EXTRA)}.</p>'
        figure_link = ""
    sat_step = saturation.get("step")
    rows = []
    for s in steps:
        cls = ' class="sat"' if sat_step is not None and s["index"] == sat_step else ""
        rows.append(
            f"<tr{cls}><td>×{s['concurrency']}</td><td>{fmt_number(s['seconds'], 's', 0)}</td>"
            f"<td>{s['requests_started']}</td><td>{s['requests_completed']}</td><td>{s['requests_failed']}</td>"
            f"<td>{fmt_number(s['tokens_per_second'], '', 1)}</td>"
            f"<td>{fmt_number(s.get('engine_tokens_per_second'), '', 1)}</td>"
            f"<td>{fmt_number(s['itl_p50_ms'], 'ms')}</td>"
            f"<td>{fmt_number(s['itl_p95_ms'], 'ms')}</td>"
            f"<td>{fmt_number(s.get('engine_mean_per_token_ms'), 'ms')}</td>"
            f"<td>{fmt_number(s['ttft_p50_ms'], 'ms', 0)}</td>"
            f"<td>{fmt_pct(s['kv_usage_median'], missing=MISSING)}</td>"
            f"<td>{fmt_pct(s['kv_usage_max'], missing=MISSING)}</td>"
            f"<td>{fmt_number(s['preemptions'], '', 0)}</td><td>{fmt_number(s['waiting_max'], '', 0)}</td></tr>"
        )
    knee = verdict["knee"]
    if saturation.get("reached") and saturation.get("reason") in ("queue", "ttft"):
        why = (
            f"a median {fmt_number(saturation.get('waiting'), '', 0)} requests waited"
            if saturation.get("reason") == "queue"
            else f"the median time to first token, {fmt_number(saturation.get('ttft_p50_ms'), 'ms', 0)}, passed "
            f"its SLO ({fmt_number(settings.get('ttft_slo_seconds', 0) * 1000, 'ms', 0)})"
        )
        sat_text = (
            f"No KV usage signal, so the run stopped on the queue instead: at concurrency "
            f"×{saturation.get('concurrency')}, {why}."
        )
    elif saturation.get("reached"):
        why = {"preemptions": "the engine preempted", "kv_ceiling": f"KV usage reached {settings['kv_saturation']:.0%}"}
        sat_text = (
            f"Saturated at concurrency ×{saturation.get('concurrency')}: "
            f"{why.get(saturation.get('reason'), saturation.get('reason'))}"
            + (f" (KV usage up to {saturation['kv_usage']:.0%})" if saturation.get("kv_usage") is not None else "")
            + "."
        )
    else:
        sat_text = f"KV did not saturate up to concurrency ×{settings['max_concurrency']}."
    diag = summary.get("diagnosis") or {}
    diag_text = (
        (
            f"<p>The exporter's decision tree on the last {e(str(diag.get('window_seconds', '')))} s: "
            f"<b>{e(str(diag.get('verdict')))}</b> — {e(str(diag.get('headline', '')))}</p>"
        )
        if diag
        else ""
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in endpoint.get("notes", []))
    prompts = summary.get("prompts") or {}
    run_id = e(str(prompts.get("run_id", "")))
    if prompts.get("shared_prefix", settings.get("share_prefix")):
        prefix_text = (
            f"Every request shares the same fixed text as its prefix (--share-prefix; its tag, run {run_id}, "
            "comes last), so prefix caching can share that text's KV between requests: the test measures KV "
            "with prefix caching at work"
        )
    else:
        prefix_text = (
            f"Each request starts with its own tag (this run's random id {run_id} and its number), then the "
            "same fixed text, so prefix caching cannot share KV between requests, nor with an earlier run"
        )
    signals = summary.get("signals", {})
    if summary.get("latency_source") == "client":
        latency_text = (
            "Per-token latency: the time between two streamed tokens of one request, at the client "
            "(the exporter recorded no ITL histogram), per exporter interval; p50 and p95 over its tokens."
        )
    else:
        latency_text = (
            "Per-token latency: the engine's own inter-token latency histogram (via the exporter), per "
            "collection interval; p50 and p95 from the buckets' increases, the mean from sum / count. "
            "TTFT and tokens/s are measured at the client."
        )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvdoctor stress — {e(endpoint.get("model", ""))}</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{_CSS}</style></head><body>
<h1>KV-cache pressure test</h1>
<p class="sub">{e(endpoint.get("model", ""))} at {e(endpoint.get("api", ""))} ·
{settings["prompt_tokens"]}-token prompt (server counted {e(str(endpoint.get("prompt_tokens")))}),
{settings["max_tokens"]} generated tokens per request · {summary["seconds"]:.0f} s</p>
<div class="verdict {e(verdict["pattern"])}"><b>{e(verdict["headline"])}</b></div>
<p>{e(sat_text)} Knee: {e(knee.get("note") or "–")}.</p>
{diag_text}
{figure}
<h2>Steps</h2>
<table><tr><th>concurrency</th><th>time</th><th>started</th><th>completed</th><th>failed</th><th>tokens/s</th>
<th>engine tokens/s</th><th>ITL p50</th><th>ITL p95</th><th>engine mean/token</th><th>TTFT p50</th><th>KV median</th>
<th>KV max</th><th>preemptions</th>
<th>waiting max</th></tr>
{"".join(rows)}</table>
<h2>How this was measured</h2>
<ul class="notes">
<li>{latency_text}</li>
<li>KV usage, preemptions and the queue: {e(signals.get("source", "not recorded"))}
({signals.get("snapshots", 0)} snapshots, in <span class="kv">trace.om</span>).</li>
<li>{e(prefix_text)}; concurrency doubles every {settings["step_seconds"]:g} s until KV usage reaches
{settings["kv_saturation"]:.0%} or the engine preempts (without a KV signal: until requests queue or wait
for their first token past the TTFT SLO), or ×{settings["max_concurrency"]}.</li>
<li>Tokens/s: streamed tokens counted once at the client (usage per chunk, at the end or none); "engine
tokens/s" and "engine mean/token" come from the engine's own counters where it has them (llama.cpp adds a
request's tokens when it ends, so short steps read them unevenly).</li>
<li>The knee: a straight line and a two-level step fitted to log(latency) against KV usage
(<span class="kv">kvdoctor.rules.knee</span>).</li>
{notes}</ul>
<p class="notes">Files: {figure_link}<a href="summary.json">summary.json</a> ·
<a href="trace.om">trace.om</a> (replay: <span class="kv">kvdoctor diagnose --replay trace.om</span>)</p>
</body></html>
"""
    out = Path(path)
    out.write_text(page)
    return out
