"""Traces: OpenMetrics with timestamps, read through the same adapters as live scraping."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kvdoctor.exporter.collectors.engine import EngineCollector
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.trace import TraceError, format_raw_captures, format_window
from kvdoctor.signals.trace import parse_trace as parse_canonical
from kvdoctor.signals.window import Snapshot, Window, labels_of
from kvdoctor.sources.traces import load_trace as load_canonical
from kvdoctor.sources.traces import write_raw_captures, write_window
from tests.support import tools
from tests.support.errors import one_line_error

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FILL = sorted((FIXTURES / "vllm-0.32-cpu" / "fill-sequence").glob("*.txt"))
T0 = 1_700_000_000.0


def parse_trace(text: str, engine: str | None = None, source: str = "trace"):
    """A trace read as ``kvdoctor diagnose --replay`` reads it: raw families through the adapters."""
    return parse_canonical(text, AdapterNormaliser(engine), source=source)


def load_trace(path):
    return load_canonical(path, AdapterNormaliser())


def fill_captures(start: float = T0, step: float = 1.0) -> list[tuple[float, str]]:
    """The 16 real vLLM scrapes of the fill sequence, given synthetic timestamps ``step`` apart."""
    return [(start + i * step, path.read_text()) for i, path in enumerate(FILL)]


def small_window() -> Window:
    """Gauges, a counter, a histogram and awkward label values, with a gap (absent sample)."""
    eng = labels_of(engine="vllm", model_name='we"ird\\name\nx', pod="p-0")
    snaps = []
    for i in range(5):
        snap = Snapshot(T0 + i * 0.5 + 0.123)
        snap.add(S.KV_CACHE_USAGE, 0.25 * i, eng)
        if i != 2:
            snap.add(S.REQUESTS_WAITING, float(i), eng)
        snap.add(S.PREEMPTIONS, 10.0 + i, eng)
        cumulative = 0.0
        for le in ("0.01", "0.1", "1.0", "+Inf"):
            cumulative += i + 1
            snap.add(S.INTER_TOKEN_LATENCY + "_bucket", cumulative, labels_of(dict(eng), le=le))
        snap.add(S.INTER_TOKEN_LATENCY + "_count", cumulative, eng)
        snap.add(S.INTER_TOKEN_LATENCY + "_sum", 0.37 * i, eng)
        snap.add(S.GPU_DRAM_BANDWIDTH_UTILIZATION, 0.8, labels_of(gpu="0", uuid="GPU-0", model="H100", method="gpm"))
        snaps.append(snap)
    return Window.from_snapshots(snaps)


def assert_same_window(a: Window, b: Window) -> None:
    assert np.array_equal(a.timestamps, b.timestamps)
    assert set(a.series) == set(b.series)
    for key in a.series:
        assert np.array_equal(a.series[key], b.series[key], equal_nan=True), key


# ------------------------------------------------------------------------------------ round trip


def test_a_canonical_window_survives_writing_and_reading_exactly():
    window = small_window()
    trace = parse_trace(format_window(window))
    assert trace.engine is None and trace.canonical_families and not trace.raw_families
    assert_same_window(trace.window, window)


def test_the_written_trace_is_openmetrics_with_a_timestamp_on_every_sample():
    text = format_window(small_window())
    lines = text.splitlines()
    assert lines[-1] == "# EOF"
    samples = [line for line in lines if not line.startswith("#")]
    assert samples and all(re.search(r" \d+\.\d{3}$", line) for line in samples)
    # counters are OpenMetrics families without _total; samples keep it
    assert f"# TYPE {S.PREEMPTIONS.removesuffix('_total')} counter" in lines
    assert any(line.startswith(S.PREEMPTIONS + "{") for line in samples)
    # each family is declared once and its samples are contiguous (OpenMetrics forbids interleaving)
    declared = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(declared) == len(set(declared))
    families_in_order = []
    for line in samples:
        family = next(f for f in declared if line.startswith(f))
        if not families_in_order or families_in_order[-1] != family:
            families_in_order.append(family)
    assert len(families_in_order) == len(set(families_in_order))


def test_a_histogram_point_keeps_buckets_count_and_sum_together_per_timestamp():
    text = format_window(small_window())
    itl = [line for line in text.splitlines() if line.startswith(S.INTER_TOKEN_LATENCY)]
    stamps = [line.rsplit(" ", 1)[1] for line in itl]
    # 6 lines (4 buckets, count, sum) per timestamp, timestamps in order, never revisited
    assert [stamps[i] for i in range(0, len(stamps), 6)] == sorted(set(stamps))
    first = [line.split("{")[0].split(" ")[0] for line in itl[:6]]
    assert first == [S.INTER_TOKEN_LATENCY + "_bucket"] * 4 + [
        S.INTER_TOKEN_LATENCY + "_count",
        S.INTER_TOKEN_LATENCY + "_sum",
    ]
    assert 'le="+Inf"' in itl[3]


def test_write_window_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "t.om"
    path.write_text("old")
    assert write_window(small_window(), path) == 5
    assert load_trace(path).window.series
    assert [p.name for p in tmp_path.iterdir()] == ["t.om"]


# ----------------------------------------------------------------------------- raw engine traces


def test_raw_vllm_captures_replay_through_the_same_adapter_as_a_live_scrape():
    captures = fill_captures()
    trace = parse_trace(format_raw_captures(captures))
    assert trace.engine == "vllm" and trace.raw_families and not trace.canonical_families
    assert len(trace.window) == len(FILL) == 16
    snapshots = list(trace.window.snapshots())
    for (ts, text), snap in zip(captures, snapshots, strict=True):
        live = EngineCollector(None).normalise(text)  # the engine collector's own path
        assert snap.ts == ts
        assert snap.samples == live


ENGINE_PAGES = sorted((FIXTURES / "engines").glob("*/*.txt"))


@pytest.mark.parametrize("page", ENGINE_PAGES, ids=[f"{p.parent.name}/{p.stem}" for p in ENGINE_PAGES])
def test_every_engines_page_replays_as_the_live_collector_reads_it(page):
    text = page.read_text()
    raw = format_raw_captures([(T0, text), (T0 + 1, text)])
    live_collector = EngineCollector(None)
    try:
        live = live_collector.normalise(text)
    except SourceError as exc:  # a KV tier's own endpoint (Dynamo KVBM): no engine on the page
        assert exc.reason == "unknown_engine"
        with pytest.raises(TraceError, match="no family of a known engine"):
            parse_trace(raw)
        return
    trace = parse_trace(raw)
    assert trace.engine == live_collector.adapter.name
    for snap in trace.window.snapshots():
        assert snap.samples == live


def test_raw_vllm_trace_shows_the_fill_sequence():
    window = parse_trace(format_raw_captures(fill_captures())).window
    (usage,) = window.select(S.KV_CACHE_USAGE).values()
    (waiting,) = window.select(S.REQUESTS_WAITING).values()
    assert usage.max() == pytest.approx(0.9677, abs=1e-3)
    assert waiting[0] == 0 and waiting[-1] == 13
    (labels,) = window.select(S.KV_CACHE_USAGE)
    assert dict(labels) == {"engine": "vllm", "model_name": "tiny", "dp_rank": "0"}


def test_forcing_the_engine_uses_that_adapter():
    text = format_raw_captures(fill_captures())
    assert parse_trace(text, engine="vllm").window.series.keys() == parse_trace(text).window.series.keys()
    with pytest.raises(TraceError, match="no samples kvdoctor can use"):
        parse_trace(text, engine="sglang")
    with pytest.raises(ValueError, match="unknown engine 'nope'"):
        parse_trace(text, engine="nope")


def test_without_a_normaliser_only_canonical_families_are_read():
    with pytest.raises(TraceError, match="holds no kvdoctor_\\* family and no raw family read here"):
        parse_canonical(format_raw_captures(fill_captures()))


def test_raw_and_canonical_families_in_one_trace_are_merged_per_timestamp():
    captures = fill_captures()[:4]
    raw = format_raw_captures(captures)
    gpu = Window.from_snapshots(
        Snapshot(ts, {(S.GPU_SM_ACTIVE, labels_of(gpu="0", uuid="u", model="H100", method="gpm")): 0.5})
        for ts, _ in captures
    )
    text = raw.replace("# EOF\n", "") + format_window(gpu)
    window = parse_trace(text).window
    assert len(window) == 4
    assert window.select(S.GPU_SM_ACTIVE) and window.select(S.KV_CACHE_USAGE)


def test_dcgm_exporter_families_are_normalised_too():
    page = (
        "# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge\n"
        'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3"} 0.83\n'
    )
    text = format_raw_captures([(T0, page), (T0 + 1, page)])
    window = parse_trace(text).window
    (labels,) = window.select(S.GPU_DRAM_BANDWIDTH_UTILIZATION)
    assert dict(labels)["method"] == "dcgm"


def test_a_counter_reset_in_a_raw_trace_is_kept_as_a_drop_for_the_rules_to_handle():
    captures = fill_captures() + [(T0 + 20 + i, p.read_text()) for i, p in enumerate(FILL[:3])]
    window = parse_trace(format_raw_captures(captures)).window
    (gen,) = window.select(S.GENERATION_TOKENS).values()
    assert gen[15] > gen[16]  # the restart: the counter starts again from its first value
    assert np.all(np.diff(gen[:16]) >= 0)


def test_raw_captures_must_be_expositions_in_time_order():
    with pytest.raises(TraceError, match="timestamps must increase"):
        format_raw_captures([(T0, "a 1\n"), (T0, "a 2\n")])
    with pytest.raises(TraceError, match="not an exposition"):
        format_raw_captures([(T0, "<html>oops</html>")])
    with pytest.raises(TraceError, match="not Unix seconds"):
        format_raw_captures([(T0 * 1000, "a 1\n")])


def test_raw_counters_declared_with_total_become_openmetrics_counter_families(tmp_path):
    path = tmp_path / "raw.om"
    write_raw_captures(fill_captures()[:2], path)
    text = path.read_text()
    assert "# TYPE vllm:num_preemptions counter\n" in text
    assert "# TYPE vllm:num_preemptions_total" not in text
    assert "# TYPE vllm:inter_token_latency_seconds histogram\n" in text


# ------------------------------------------------------------------------------------ bad traces

GOOD = '# TYPE kvdoctor_kv_cache_usage_ratio gauge\nkvdoctor_kv_cache_usage_ratio{engine="vllm"} 0.5 1700000000.000\n'

BAD_TRACES = {
    "empty": ("", "is empty"),
    "only blanks": ("\n \n", "is empty"),
    "no EOF": (GOOD, "does not end with a '# EOF' line"),
    "cut mid-line": (GOOD + 'kvdoctor_kv_cache_usage_ratio{engine="vl', "truncated"),
    "JSON": ('{"timestamps": [1, 2], "series": []}\n', "not an OpenMetrics trace"),
    "HTML": ("<html><body>502 Bad Gateway</body></html>\n", "not an OpenMetrics trace"),
    "text after EOF": (GOOD + "# EOF\nkvdoctor_kv_cache_usage_ratio 1 1700000001\n", "after its '# EOF'"),
    "no timestamps": (GOOD.replace(" 1700000000.000", "") + "# EOF\n", "has no timestamp"),
    "milliseconds": (GOOD.replace("1700000000.000", "1700000000000") + "# EOF\n", "looks like milliseconds"),
    "backwards": (
        GOOD + GOOD.splitlines()[1].replace("1700000000.000", "1699999999.000") + "\n# EOF\n",
        "timestamps must increase",
    ),
    "repeated timestamp": (GOOD + GOOD.splitlines()[1] + "\n# EOF\n", "repeats timestamp"),
    "nothing kvdoctor knows": ("# TYPE foo gauge\nfoo 1 1700000000\n# EOF\n", "no kvdoctor_\\* family"),
    "only EOF": ("# EOF\n", "no kvdoctor_\\* family"),
}


@pytest.mark.parametrize("case", BAD_TRACES, ids=list(BAD_TRACES))
def test_bad_traces_raise_one_clear_line(case):
    text, message = BAD_TRACES[case]
    said = one_line_error(TraceError, parse_trace, text, source="t.om")
    assert re.search(message, said) and said.startswith("t.om")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x00\x01\x02binary", "binary file"),
        (b"\xff\xfe# TYPE \xff", "not UTF-8"),
    ],
)
def test_unreadable_files_raise_one_clear_line(tmp_path, content, message):
    path = tmp_path / "bad.om"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        load_trace(path)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.om")
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path)


def test_awkward_but_valid_lines_read_as_the_exposition_parser_reads_them():
    """Blanks inside label values, escaped quotes, exemplars, NaN and +Inf, a series first seen
    with an exemplar: the trace reader's per-series shortcut must agree with textparse."""
    from kvdoctor.signals.textparse import iter_samples

    name = S.REQUESTS_RUNNING
    text = (
        f"# TYPE {name} gauge\n"
        f'{name}{{engine="a b",model_name="x \\"q\\" y"}} 1 1700000000 # {{trace_id="t 1"}} 1 1700000000\n'
        f'{name}{{engine="a b",model_name="x \\"q\\" y"}} 2 1700000001\n'
        f'{name}{{engine="a b",model_name="x \\"q\\" y"}} NaN 1700000002\n'
        f'{name}{{engine="a b",model_name="x \\"q\\" y"}} +Inf 1700000003\n'
        f"{name} 7 1700000000.5\n"
        f"{name}  8   1700000001.5\n"
        "# EOF\n"
    )
    want: dict = {}
    for n, labels, value, ts in iter_samples(text, openmetrics=True):
        want.setdefault((n, tuple(sorted(labels.items()))), []).append((ts, value))
    window = parse_trace(text).window
    got = {
        key: [(t, v) for t, v in zip(window.timestamps, values, strict=True) if not np.isnan(v)]
        for key, values in window.series.items()
    }
    # NaN is a real value in a trace but "absent" in a Window
    want = {key: [(t, v) for t, v in points if not np.isnan(v)] for key, points in want.items()}
    assert got == want


def test_a_bad_line_deep_in_a_trace_is_reported_with_its_line_number():
    lines = [f"# TYPE {S.REQUESTS_RUNNING} gauge"] + [f"{S.REQUESTS_RUNNING} {i} {T0 + i}" for i in range(10)]
    lines[7] = f"{S.REQUESTS_RUNNING} seven {T0 + 6}"
    with pytest.raises(TraceError, match="line 8: value or timestamp is not a number"):
        parse_trace("\n".join(lines) + "\n# EOF\n")


def test_non_monotonic_timestamps_are_checked_per_series_not_across_series():
    # series-major layout: b's first sample is older than a's last one, which is fine
    text = (
        "# TYPE kvdoctor_requests_running gauge\n"
        'kvdoctor_requests_running{engine="a"} 1 1700000001\n'
        'kvdoctor_requests_running{engine="a"} 1 1700000002\n'
        'kvdoctor_requests_running{engine="b"} 1 1700000001\n# EOF\n'
    )
    assert len(parse_trace(text).window) == 2


# ------------------------------------------------------------------------------- promtool accepts


@tools.requires_promtool
@pytest.mark.parametrize("kind", ["canonical", "raw vllm"])
def test_promtool_backfills_every_sample_of_a_trace(tmp_path, kind):
    text = format_window(small_window()) if kind == "canonical" else format_raw_captures(fill_captures())
    path = tmp_path / "trace.om"
    path.write_text(text)
    out = subprocess.run(
        [tools.promtool(), "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    # the summary table: BLOCK ULID, MIN TIME, MAX TIME, DURATION, NUM SAMPLES, ...
    row = out.stdout.strip().splitlines()[-1].split()
    assert int(row[4]) == samples
    assert math.isclose(
        int(row[1]) / 1000,
        min(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")),
    )
