"""Real /metrics pages that the engines' own projects published (docs, issues, PRs), one per
generation of names, through recognition and the adapters, every canonical value checked; plus
the rules those pages call for: a percent is never read as a ratio, a ratio is derived from its
parts only where the engine publishes no ratio, a page is recognised from any of its engine's
families, and prefix hits count every tier once.

The pages live in tests/fixtures/published/<engine>/, each opening with comment lines that say
where it was published, for which version and date, and what was trimmed.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from kvdoctor.exporter import adapters
from kvdoctor.exporter.adapters.base import PERCENT, PERCENT_OR_RATIO, MetricMap
from kvdoctor.exporter.collectors.engine import EngineCollector
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textparse import family_names, iter_samples
from kvdoctor.signals.trace import format_raw_captures, parse_trace
from kvdoctor.signals.units import RATIO

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "fixtures" / "published"
ENGINES = ROOT / "tests" / "fixtures" / "engines"
VLLM_CAPTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "after-prefix-hits.txt"

SG24 = {"engine": "sglang", "model_name": "google/gemma-2-9b-it"}
SG25 = {"engine": "sglang", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}
V0 = {"engine": "vllm", "model_name": "Qwen/Qwen2.5-Coder-1.5B-Instruct"}
V10 = {"engine": "vllm", "model_name": "zai-org/GLM-4.5", "dp_rank": "0"}
TRITON = {"engine": "trtllm_triton", "model_name": "tensorrt_llm"}
TRT = {"engine": "trtllm", "model_name": "Qwen/Qwen3-0.6B"}
LMC = {"engine": "lmcache", "model_name": "/mnt/models/Qwen-2.5-0.5b"}

# page -> (the engine recognised, or None; every canonical sample but histogram buckets, as
# (signal or sample name, labels) -> value)
EXPECTED: dict[str, tuple[str | None, dict[tuple[str, frozenset], float]]] = {}


def expect(page: str, engine: str | None, *rows: tuple[str, dict, float]) -> None:
    EXPECTED[page] = (engine, {(name, frozenset(labels.items())): v for name, labels, v in rows})


def triton(usage: float, waiting: float | None = None) -> list[tuple[str, dict, float]]:
    rows = [
        (S.KV_CACHE_USAGE, TRITON, usage),
        (S.KV_CACHE_CAPACITY, TRITON, 6239 * 64),  # max blocks x tokens per block
        (S.REQUESTS_RUNNING, TRITON, 0.0),  # request_type="active"
    ]
    return rows + ([(S.REQUESTS_WAITING, TRITON, waiting)] if waiting is not None else [])


# SGLang's two generations of names: each signal with its value on the 2024 page and the 2025 one
# (None: not on that page).
SGLANG_GENERATIONS = (("sglang/2024-11-name-label.txt", SG24), ("sglang/2025-model-name.txt", SG25))
SGLANG_VALUES: dict[str, tuple[float | None, float]] = {
    S.KV_CACHE_USAGE: (0.01, 0.28),
    S.KV_CACHE_CAPACITY: (161721.0, None),
    S.REQUESTS_RUNNING: (0.0, 162.0),  # sglang:num_requests_running, then num_running_reqs
    S.REQUESTS_WAITING: (0.0, 2826.0),  # sglang:num_requests_waiting, then num_queue_reqs
    S.PREFIX_CACHE_HIT_RATIO: (0.1061, 0.007507552643049313),  # published as 10.61 (percent), then a ratio
    S.PREFIX_CACHE_QUERIES: (506780.0, 8128902.0),
    S.PROMPT_TOKENS: (506780.0, 8128902.0),
    S.GENERATION_TOKENS: (424549.0, 7557572.0),
    S.TIME_TO_FIRST_TOKEN + "_sum": (656.0780844688416, 2351897.9474117756),
    S.TIME_TO_FIRST_TOKEN + "_count": (2124.0, 11008.0),
    S.INTER_TOKEN_LATENCY + "_sum": (29846.5393948555, 866964.5791549598),
    S.INTER_TOKEN_LATENCY + "_count": (422425.0, 7400757.0),
}
for generation, (rel, labels) in enumerate(SGLANG_GENERATIONS):
    expect(
        rel,
        "sglang",
        *((name, labels, v[generation]) for name, v in SGLANG_VALUES.items() if v[generation] is not None),
    )
expect(
    "vllm/v0-2025-01-aibrix.txt",
    "vllm",
    (S.KV_CACHE_USAGE, V0, 0.0),  # gpu_cache_usage_perc
    (S.KV_CACHE_HOST_USAGE, V0, 0.0),  # cpu_cache_usage_perc
    (S.REQUESTS_SWAPPED, V0, 0.0),
    (S.REQUESTS_RUNNING, V0, 0.0),
    (S.REQUESTS_WAITING, V0, 0.0),
    (S.PREEMPTIONS, V0, 0.0),
    (S.PROMPT_TOKENS, V0, 148.0),
    (S.GENERATION_TOKENS, V0, 955.0),
    (S.KV_CACHE_CAPACITY, {"engine": "vllm"}, 81767 * 16.0),  # num_gpu_blocks x block_size
    # gpu_prefix_cache_hit_rate is -1 (prefix caching off): no ratio at all, not -100 %
)
expect(
    "vllm/v1-0.10.0-excerpt.txt",
    "vllm",
    (S.KV_CACHE_USAGE, V10, 9.75010481363281e-06),
    (S.PREFIX_CACHE_QUERIES, V10, 32.0),  # the new name
    (S.PREFIX_CACHE_HITS, V10, 0.0),  # only the deprecated gpu_ name is in the excerpt
)
expect("trtllm_triton/2023-11-statistics.txt", "trtllm_triton", *triton(1 / 6239))
expect("trtllm_triton/2024-metrics.txt", "trtllm_triton", *triton(1 / 6239))
expect("trtllm_triton/2025-fraction.txt", "trtllm_triton", *triton(0.4875, waiting=1.0))
expect(
    "trtllm/2025-10-dynamo-1.1.0rc5.txt",
    "trtllm",
    (S.TIME_TO_FIRST_TOKEN + "_sum", TRT, 8.75),
    (S.TIME_TO_FIRST_TOKEN + "_count", TRT, 150.0),
    (S.INTER_TOKEN_LATENCY + "_sum", TRT, 12.5),  # per-request TPOT
    (S.INTER_TOKEN_LATENCY + "_count", TRT, 150.0),
)
expect(
    "lmcache/2025-07-vllm-page-excerpt.txt",
    None,  # only LMCache's families: a KV tier, no engine
    (S.PREFIX_CACHE_HITS_BY_TIER, {**LMC, "tier": "lmcache"}, 0.0),
)


def page(rel: str) -> str:
    return (PUBLISHED / rel).read_text()


def raw(text: str) -> list[tuple[str, dict, float]]:
    return [(n, lab, v) for n, lab, v, _ in iter_samples(text)]


def canonical(text: str) -> dict:
    """The page as the exporter reads it: recognised engine plus every KV tier, or only the tiers."""
    adapter = adapters.detect(family_names(text))
    samples = raw(text)
    if adapter is not None:
        return adapters.normalise_page(adapter, samples)
    out: dict = {}
    for tier in adapters.TIER_ADAPTERS.values():
        out.update(tier.normalise(samples))
    return out


def flat(out: dict, buckets: bool = False) -> dict:
    return {(n, frozenset(lab)): v for (n, lab), v in out.items() if buckets or not n.endswith("_bucket")}


def one(out: dict, name: str, **labels) -> float:
    hits = [v for (n, lab), v in out.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


# ------------------------------------------------------------------------------- the pages


def test_every_published_page_is_checked():
    assert {str(p.relative_to(PUBLISHED)) for p in PUBLISHED.rglob("*.txt")} == set(EXPECTED)


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_page_says_where_it_was_published(rel):
    header = " ".join(line for line in page(rel).splitlines()[:12] if re.match(r"# (?!HELP |TYPE )", line))
    assert re.search(r"[\w.-]+/[\w.-]+", header), "a repository or path"
    assert re.search(r"20\d\d", header), "a date"
    assert "as published" in header or "as quoted" in header
    assert "illustrative" not in header


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_page_is_recognised_as_its_engine(rel):
    adapter = adapters.detect(family_names(page(rel)))
    assert (adapter.name if adapter else None) == EXPECTED[rel][0]


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_canonical_values(rel):
    assert flat(canonical(page(rel))) == EXPECTED[rel][1]


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_buckets_are_the_engines_own(rel):
    """Histogram buckets pass through with the engine's bounds and counts, none added or lost."""
    text = page(rel)
    out = canonical(text)
    for canon in (S.INTER_TOKEN_LATENCY, S.TIME_TO_FIRST_TOKEN):
        ours = sorted((dict(lab)["le"], v) for (n, lab), v in out.items() if n == canon + "_bucket")
        count = [v for (n, _), v in out.items() if n == canon + "_count"]
        if not count:
            assert not ours
            continue
        engine_family = {
            S.INTER_TOKEN_LATENCY: ("inter_token_latency", "time_per_output_token"),
            S.TIME_TO_FIRST_TOKEN: ("time_to_first_token",),
        }[canon]
        theirs = sorted(
            (lab["le"], v)
            for n, lab, v in raw(text)
            if n.endswith("_seconds_bucket") and any(f in n for f in engine_family)
        )
        assert ours == theirs and ours


# ------------------------------------------------------------------- percent, never a ratio


def test_sglang_2024_percent_is_a_ratio_and_no_headline_says_1061_percent():
    text = page("sglang/2024-11-name-label.txt")
    assert ("sglang:cache_hit_rate", {"name": "google/gemma-2-9b-it"}, 10.61) in raw(text)  # as published
    captures = [(1_700_000_000.0 + 5 * i, text) for i in range(13)]
    trace = parse_trace(format_raw_captures(captures), AdapterNormaliser())
    assert trace.engine == "sglang"
    ratios = [values for key, values in trace.window.series.items() if key[0] == S.PREFIX_CACHE_HIT_RATIO]
    assert len(ratios) == 1 and all(math.isclose(v, 0.1061) for v in ratios[0])
    result = diagnose(trace.window).to_json()
    rows = [row for row in result["evidence"] if "prefix_hit_ratio" in (row.get("feature"), row.get("name"))]
    assert all(math.isclose(row["value"], 0.1061) for row in rows)
    rendered = str(result)  # the headline, the evidence, the notes
    assert not re.search(r"1,?061(\.\d+)?\s*%", rendered) and "10.61" not in rendered


def ratio_row(unit: str, percent_labels: tuple[str, ...] = ()) -> MetricMap:
    return MetricMap(("x",), S.PREFIX_CACHE_HIT_RATIO, unit=unit, percent_labels=percent_labels)


@pytest.mark.parametrize(
    ("unit", "labels", "published", "expected"),
    [
        (PERCENT_OR_RATIO, {"name": "m"}, 10.61, 0.1061),  # the 2024 generation: a percent
        (PERCENT_OR_RATIO, {"name": "m"}, 0.75, 0.0075),  # still a percent below 1 (its label says so)
        (PERCENT_OR_RATIO, {"model_name": "m"}, 0.0075, 0.0075),  # 2025 on: a ratio
        (PERCENT_OR_RATIO, {"model_name": "m"}, 10.61, 0.1061),  # above 1: only a percent can be
        (PERCENT_OR_RATIO, {"model_name": "m"}, 150.0, None),  # no reading makes it 0..1
        (PERCENT, {}, 42.0, 0.42),
        (RATIO, {}, 1.0, 1.0),
        (RATIO, {}, 1.0 + 1e-12, 1.0),  # float noise on a full pool
        (RATIO, {}, 1.3, None),  # never a ratio: dropped, not clipped
        (RATIO, {}, -1.0, None),  # vLLM V0's "no data"
        (RATIO, {}, math.nan, None),
    ],
)
def test_ratio_rule(unit, labels, published, expected):
    got = ratio_row(unit, ("name",) if unit == PERCENT_OR_RATIO else ()).to_canonical(labels, published)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_units_are_declared_where_they_can_apply():
    with pytest.raises(ValueError):
        MetricMap(("x",), S.PROMPT_TOKENS, unit=PERCENT)  # a counter is no ratio
    with pytest.raises(ValueError):
        MetricMap(("x",), S.KV_CACHE_USAGE, unit="per_mille")
    with pytest.raises(ValueError):
        MetricMap(("x",), S.KV_CACHE_USAGE, unit=RATIO, percent_labels=("name",))


def test_vllm_v0_no_data_hit_rate_is_no_ratio():
    text = page("vllm/v0-2025-01-aibrix.txt")
    assert ("vllm:gpu_prefix_cache_hit_rate", {"model_name": V0["model_name"]}, -1.0) in raw(text)
    assert not any(n == S.PREFIX_CACHE_HIT_RATIO for n, _ in canonical(text))
    ratio_page = text.replace(
        "vllm:gpu_prefix_cache_hit_rate{model_name", 'vllm:gpu_prefix_cache_hit_rate{x="",model_name'
    )
    ratio_page = ratio_page.replace('x="",model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct"} -1.0', 'model_name="m"} 0.42')
    assert one(canonical(ratio_page), S.PREFIX_CACHE_HIT_RATIO) == 0.42  # a real ratio passes


# ------------------------------------------------------------------ ratios from their parts


def test_ratio_from_parts_only_where_the_engine_publishes_no_ratio():
    older = canonical(page("trtllm_triton/2024-metrics.txt"))
    current = canonical(page("trtllm_triton/2025-fraction.txt"))
    assert one(older, S.KV_CACHE_USAGE) == 1 / 6239  # used / max blocks
    assert one(current, S.KV_CACHE_USAGE) == 0.4875  # the published fraction wins over used / max


def test_ratio_parts_pair_up_by_rank_and_a_zero_whole_gives_nothing():
    sglang = adapters.ADAPTERS["sglang"]
    base = {"engine_type": "unified", "model_name": "glm", "tp_rank": "0"}
    samples = [
        ("sglang:hicache_host_used_tokens", {**base, "dp_rank": "0"}, 3000000.0),
        ("sglang:hicache_host_total_tokens", {**base, "dp_rank": "0"}, 3908736.0),
        ("sglang:hicache_host_used_tokens", {**base, "dp_rank": "1"}, 2000000.0),
        ("sglang:hicache_host_total_tokens", {**base, "dp_rank": "1"}, 4000000.0),
        ("sglang:hicache_host_used_tokens", {**base, "dp_rank": "2"}, 5.0),
        ("sglang:hicache_host_total_tokens", {**base, "dp_rank": "2"}, 0.0),  # before the pool is sized
        ("sglang:hicache_host_used_tokens", {**base, "dp_rank": "3"}, 5.0),  # no partner
    ]
    out = sglang.normalise(samples)
    by_rank = {dict(lab)["dp_rank"]: v for (n, lab), v in out.items() if n == S.KV_CACHE_HOST_USAGE}
    assert by_rank == {"0": 3000000.0 / 3908736.0, "1": 0.5}


# ---------------------------------------------------- recognised from any of its families


def vllm_ttft_lines() -> str:
    """vLLM's TTFT histogram family alone, from the real vLLM 0.32 capture."""
    lines = VLLM_CAPTURE.read_text().splitlines()
    return "\n".join(line for line in lines if "vllm:time_to_first_token_seconds" in line) + "\n"


def lmcache_lines() -> str:
    lines = (ENGINES / "lmcache" / "vllm-with-lmcache.txt").read_text().splitlines()
    return (
        "\n".join(line for line in lines if line.startswith(("lmcache:", "# HELP lmcache:", "# TYPE lmcache:"))) + "\n"
    )


def test_a_page_with_some_vllm_families_and_lmcache_counters_is_vllm_and_keeps_the_tier_hits():
    text = vllm_ttft_lines() + lmcache_lines()
    names = family_names(text)
    assert not any(n in names for n in adapters.ADAPTERS["vllm"].detect)  # no identifying family
    assert adapters.detect(names) is adapters.ADAPTERS["vllm"]
    out = EngineCollector(None).normalise(text)
    assert one(out, S.PREFIX_CACHE_HITS_BY_TIER, tier="lmcache", engine="vllm") == 6144.0
    # vLLM counted no connector hits on this page, so the tier's hits are all the hits there are
    assert one(out, S.PREFIX_CACHE_HITS, engine="vllm") == 6144.0
    assert one(out, S.TIME_TO_FIRST_TOKEN + "_count", engine="vllm") > 0


@pytest.mark.parametrize("seed", range(5))
def test_pages_mixing_engines_resolve_the_same_way_whatever_the_order(seed):
    sglang = page("sglang/2025-model-name.txt")
    vllm_weak = vllm_ttft_lines()
    vllm_strong = page("vllm/v0-2025-01-aibrix.txt")
    rng = random.Random(seed)

    def detected(*parts: str) -> str:
        names = list(family_names("".join(parts)))
        rng.shuffle(names)
        return adapters.detect(names).name

    assert detected(vllm_weak, sglang) == "sglang"  # identifying families beat incidental ones
    assert detected(sglang, vllm_strong) == "vllm"  # both identified: the first in detection order
    assert detected(vllm_weak) == "vllm"


# --------------------------------------------------------- prefix hits, every tier once


def test_vllm_hits_are_every_tier_and_the_tier_split_adds_up():
    out = canonical(VLLM_CAPTURE.read_text())
    tiers = {dict(lab)["tier"]: v for (n, lab), v in out.items() if n == S.PREFIX_CACHE_HITS_BY_TIER}
    assert tiers["device"] == 20608.0
    assert one(out, S.PREFIX_CACHE_HITS) == sum(tiers.values())  # local + external = the split


def test_vllm_prompt_tokens_include_the_prefix_hits():
    """vLLM's prompt_tokens_total is what was sent: computed + cached tokens (its own split)."""
    text = VLLM_CAPTURE.read_text()
    by_source = {lab["source"]: v for n, lab, v in raw(text) if n == "vllm:prompt_tokens_by_source_total"}
    assert by_source["local_cache_hit"] > 0
    assert one(canonical(text), S.PROMPT_TOKENS) == sum(by_source.values())


def test_a_kv_tier_names_the_hits_vllm_could_not_place():
    text = (ENGINES / "lmcache" / "vllm-with-lmcache.txt").read_text()
    counters = {n: v for n, _, v in raw(text)}
    out = canonical(text)
    tiers = {dict(lab)["tier"]: v for (n, lab), v in out.items() if n == S.PREFIX_CACHE_HITS_BY_TIER}
    assert tiers == {
        "device": counters["vllm:prefix_cache_hits_total"],
        "lmcache": counters["lmcache:num_hit_tokens_total"],
    }
    assert one(out, S.PREFIX_CACHE_HITS) == (
        counters["vllm:prefix_cache_hits_total"] + counters["vllm:external_prefix_cache_hits_total"]
    )
    alone = adapters.ADAPTERS["vllm"].normalise(raw(text))  # without the tier: vLLM's own label
    assert (
        one(alone, S.PREFIX_CACHE_HITS_BY_TIER, tier=adapters.UNATTRIBUTED_TIER)
        == (counters["vllm:external_prefix_cache_hits_total"])
    )
