"""The exposition parser against prometheus_client's parsers, on real vLLM pages and edge cases."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.signals import textparse
from kvdoctor.signals.textparse import ExpositionError, family_names, is_openmetrics, iter_samples

ROOT = Path(__file__).resolve().parents[2]
VLLM_FIXTURES = sorted((ROOT / "tests/fixtures/vllm-0.32-cpu").rglob("*.txt"))
WANTED = frozenset(
    {
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:cache_config_info",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:inter_token_latency_seconds_count",
        "vllm:prompt_tokens_cached_by_source_total",
        "process_open_fds",
        "http_requests_total",
    }
)


def _key(value: float | None):
    """NaN-safe comparison key."""
    return "NaN" if value is not None and math.isnan(value) else value


def ours(text: str, wanted=None, **kw) -> list[tuple]:
    return sorted(
        ((n, tuple(sorted(lab.items())), _key(v), ts) for n, lab, v, ts in iter_samples(text, wanted, **kw)), key=repr
    )


def reference(text: str, parser=text_string_to_metric_families) -> list[tuple]:
    out = []
    for family in parser(text):
        for s in family.samples:
            ts = s.timestamp
            if ts is not None and not isinstance(ts, float):  # OpenMetrics Timestamp object
                ts = float(ts.sec) + ts.nsec / 1e9
            out.append((s.name, tuple(sorted(s.labels.items())), _key(float(s.value)), ts))
    return sorted(out, key=repr)


@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_sample_equals_prometheus_client(path):
    text = path.read_text()
    expected = reference(text)
    assert len(expected) > 400
    assert ours(text) == expected


@pytest.mark.parametrize("path", VLLM_FIXTURES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_wanted_yields_exactly_the_wanted_samples(path):
    text = path.read_text()
    expected = [s for s in reference(text) if s[0] in WANTED]
    assert {s[0] for s in expected} >= {"vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds_bucket"}
    textparse._LABEL_CACHE.clear()
    assert ours(text, WANTED) == expected  # cold: every label set parsed
    assert ours(text, WANTED) == expected  # warm: label sets from the cache


def test_escaped_and_awkward_label_values_match_prometheus_client():
    text = (
        'a{path="C:\\\\dir\\\\",quote="say \\"hi\\"",nl="two\\nlines",odd="{}=,# x"} 1\n'
        'a{path="x",quote="y",nl="z",odd="}"} 2\n'
        'b{trailing="comma",} 3\n'
        'b { spaced = "out" } 4\n'
    )
    got = ours(text)
    assert got == reference(text)
    labels = dict(got[0][1])
    assert labels == {"path": "C:\\dir\\", "quote": 'say "hi"', "nl": "two\nlines", "odd": "{}=,# x"}


def test_special_values():
    text = 'x{k="nan"} NaN\nx{k="pinf"} +Inf\nx{k="ninf"} -Inf\nx{k="exp"} 1.5e-3\nx{k="int"} 42\n'
    values = {dict(lab)["k"]: v for n, lab, v, ts in iter_samples(text)}
    assert math.isnan(values["nan"])
    assert values["pinf"] == math.inf and values["ninf"] == -math.inf
    assert values["exp"] == 0.0015 and values["int"] == 42.0
    assert ours(text) == reference(text)


def test_prometheus_text_timestamps_are_milliseconds():
    text = '# TYPE up gauge\nup{job="a"} 1 1700000000123\nup{job="b"} 0\n'
    got = {dict(lab)["job"]: ts for _, lab, _, ts in iter_samples(text)}
    assert got == {"a": 1700000000.123, "b": None}
    assert ours(text) == reference(text)


OPENMETRICS = """# TYPE req counter
# HELP req Requests.
req_total{path="/a"} 10 1700000000.5 # {trace_id="abc"} 1 1700000000.25
req_created{path="/a"} 1699990000.0 1700000000.5
# TYPE lat histogram
lat_bucket{le="0.1"} 3 # {trace_id="x y"} 0.05
lat_bucket{le="+Inf"} 5
lat_sum 0.9
lat_count 5
# EOF
"""


def test_openmetrics_seconds_exemplars_and_eof():
    assert is_openmetrics(OPENMETRICS)
    got = ours(OPENMETRICS)
    assert got == reference(OPENMETRICS, om_families)
    assert ("req_total", (("path", "/a"),), 10.0, 1700000000.5) in got
    # Lines after "# EOF" are not read (auto-detection looks at the last line, so say it here).
    assert ours(OPENMETRICS + "late 1\n", openmetrics=True) == got
    # Without "# EOF" a timestamp is Prometheus text's milliseconds.
    assert list(iter_samples("up 1 1700000000.5\n")) == [("up", {}, 1.0, 1700000.0005)]
    assert list(iter_samples("up 1 1700000000.5\n", openmetrics=True)) == [("up", {}, 1.0, 1700000000.5)]


def test_windows_line_endings_and_blank_or_indented_lines():
    text = '# TYPE a gauge\r\na{x="1"} 1\r\n\r\n   a{x="2"} 2\r\n\tb 3\r\n'
    assert ours(text) == [("a", (("x", "1"),), 1.0, None), ("a", (("x", "2"),), 2.0, None), ("b", (), 3.0, None)]


def test_quoted_metric_name_form():
    assert list(iter_samples('{"my.metric", a="b"} 7\n')) == [("my.metric", {"a": "b"}, 7.0, None)]


@pytest.mark.parametrize(
    "body",
    [
        "<!DOCTYPE html>\n<html><body><h1>502 Bad Gateway</h1></body></html>\n",
        '{"error": "not found"}\n',
        "Internal Server Error\n",
        "404 page not found\n",
        "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",  # gzip header (and a NUL)
        'up{job="a" 1\n',  # unterminated label set
        'up{job="a",job="b"} 1\n',  # duplicate label
        "up 1_000\n",
        "up\n",
    ],
)
def test_not_an_exposition_is_refused_with_and_without_wanted(body):
    with pytest.raises(ExpositionError):
        list(iter_samples(body))
    with pytest.raises(ExpositionError):
        list(iter_samples(body, frozenset({"vllm:kv_cache_usage_perc"})))
    with pytest.raises(ExpositionError):
        family_names(body)


def test_html_after_a_valid_first_line_is_refused_even_when_unwanted():
    text = "up 1\n<html>\n"
    with pytest.raises(ExpositionError, match="line 2"):
        list(iter_samples(text, frozenset({"up"})))


def test_returned_labels_are_the_callers_own():
    text = 'a{x="1"} 1\n'
    first = next(iter_samples(text))[1]
    first["x"] = "changed"
    assert next(iter_samples(text))[1] == {"x": "1"}


def test_a_cached_label_set_followed_by_a_timestamp_or_exemplar():
    list(iter_samples('a{x="1"} 1\n'))  # caches {x="1"}
    assert list(iter_samples('a{x="1"} 2 5000\n')) == [("a", {"x": "1"}, 2.0, 5.0)]
    assert list(iter_samples('a{x="1"} 3 # {t="u"} 1\n# EOF\n')) == [("a", {"x": "1"}, 3.0, None)]


def test_untyped_samples_after_a_skipped_family_are_not_lost():
    """The family skip must not swallow a wanted sample that follows without its own # TYPE."""
    text = (
        "# TYPE big_family gauge\n"
        'big_family{i="1"} 1\n'
        'big_family{i="2"} 2\n'
        "wanted_untyped 42\n"
        "# TYPE other gauge\n"
        "other 1\n"
        "# HELP also_wanted x\n"
        "also_wanted 7\n"
    )
    wanted = frozenset({"wanted_untyped", "also_wanted"})
    assert [(n, v) for n, _, v, _ in iter_samples(text, wanted)] == [("wanted_untyped", 42.0), ("also_wanted", 7.0)]


def test_family_names_has_declared_families_and_sample_names():
    names = family_names(VLLM_FIXTURES[0].read_text())
    assert {
        "vllm:inter_token_latency_seconds",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_preemptions_total",
        "python_gc_objects_collected_total",
    } <= names
    assert family_names(OPENMETRICS) >= {"req", "req_total", "lat", "lat_bucket"}


def _declared_and_sampled(text: str) -> set[str]:
    """``family_names`` the long way: the second word of every # TYPE/# HELP line, and the name of
    every sample the full parse returns."""
    declared = {line.split()[2] for line in text.splitlines() if line.startswith(("# TYPE ", "# HELP "))}
    return declared | {name for name, *_ in iter_samples(text)}


@pytest.mark.parametrize(
    "text",
    [
        *(p.read_text() for p in VLLM_FIXTURES[:5]),
        OPENMETRICS,
        '# HELP a x\r\n# TYPE a counter\r\na_total{x="1"} 1\r\n  b 2\n\tc{y="}"} 3\n',
        '# TYPE "dotted.name" gauge\n{"dotted.name", x="1"} 1\nplain 2\n',
    ],
    ids=[*(p.stem for p in VLLM_FIXTURES[:5]), "openmetrics", "crlf-and-indent", "quoted-names"],
)
def test_family_names_are_the_declared_names_and_the_sample_names(text):
    assert family_names(text) == {n.strip('"') for n in _declared_and_sampled(text)}


def test_family_names_collected_while_streaming_are_those_of_the_whole_text():
    text = VLLM_FIXTURES[0].read_text()
    names: set[str] = set()
    list(textparse.iter_samples_streamed((text[i : i + 977] for i in range(0, len(text), 977)), WANTED, names=names))
    assert names == family_names(text)


def test_selective_parse_does_not_copy_the_text():
    """Memory while parsing a 1.5 MB page selectively stays a small fraction of the page."""
    text = "".join(p.read_text() for p in VLLM_FIXTURES[:30])
    text = text * max(1, 1_500_000 // len(text))
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_samples(text, WANTED))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count > 100
    assert peak < len(text) * 0.1, f"peak {peak} bytes while parsing {len(text)}"
