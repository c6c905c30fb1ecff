"""The vLLM adapter: every real vLLM 0.32 capture through the parser and the adapter, compared
with golden canonical expositions, plus renamed, doubled and unknown families.

Goldens live in tests/fixtures/golden/vllm/<fixture path>.txt and hold the canonical exposition
as ``/metrics`` renders it (exporter/exposition.py), HELP lines left out so that rewording a help
text does not churn them. ``KVDOCTOR_UPDATE_GOLDEN=1`` rewrites them; read the diff.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.exporter.adapters import ADAPTERS, detect
from kvdoctor.exporter.adapters.vllm import ADAPTER, kv_capacity_tokens
from kvdoctor.exporter.exposition import render_samples
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textparse import family_names, iter_samples

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/vllm-0.32-cpu"
GOLDEN = ROOT / "tests/fixtures/golden/vllm"
RENAMES = ROOT / "tests/fixtures/vllm-renames"
PAGES = sorted(FIXTURES.rglob("*.txt"))
UPDATE = os.environ.get("KVDOCTOR_UPDATE_GOLDEN") == "1"
ENGINE = {"engine": "vllm", "dp_rank": "0", "model_name": "tiny"}


def canonical(text: str, **extra) -> dict:
    return ADAPTER.normalise(((n, lab, v) for n, lab, v, _ in iter_samples(text, ADAPTER.wanted_names())), extra)


def value(out: dict, name: str, **labels) -> float:
    hits = [v for (n, lab), v in out.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


def exposition(out: dict) -> str:
    return "".join(line + "\n" for line in render_samples(out).decode().splitlines() if not line.startswith("# HELP"))


def raw(text: str) -> dict:
    """The engine's own samples, by prometheus_client: (name, frozenset(labels)) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_golden(page):
    rel = page.relative_to(FIXTURES)
    header = (
        f"# golden: tests/fixtures/vllm-0.32-cpu/{rel} through the vllm adapter; KVDOCTOR_UPDATE_GOLDEN=1 rewrites\n"
    )
    got = header + exposition(canonical(page.read_text()))
    path = GOLDEN / rel
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden {path}: run with KVDOCTOR_UPDATE_GOLDEN=1 and read it"
    assert path.read_text() == got


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_canonical_values_are_the_engines_values(page):
    """Independently of the goldens: each canonical sample equals the vLLM sample it comes from."""
    text = page.read_text()
    out, engine = canonical(text), raw(text)
    base = {("engine", "0"), ("model_name", "tiny")}

    def src(name, **labels):
        return engine[(name, frozenset(base | set(labels.items())))]

    assert value(out, S.KV_CACHE_USAGE, **ENGINE) == src("vllm:kv_cache_usage_perc")
    assert value(out, S.PREEMPTIONS, **ENGINE) == src("vllm:num_preemptions_total")
    assert value(out, S.REQUESTS_RUNNING, **ENGINE) == src("vllm:num_requests_running")
    assert value(out, S.REQUESTS_WAITING, **ENGINE) == src("vllm:num_requests_waiting")
    assert value(out, S.PREFIX_CACHE_QUERIES, **ENGINE) == src("vllm:prefix_cache_queries_total")
    assert value(out, S.PREFIX_CACHE_HITS, **ENGINE) == src("vllm:prefix_cache_hits_total")
    assert value(out, S.GENERATION_TOKENS, **ENGINE) == src("vllm:generation_tokens_total")
    assert value(out, S.PROMPT_TOKENS, **ENGINE) == src("vllm:prompt_tokens_total")
    for tier in ("device", "host", "disk", "p2p"):
        assert value(out, S.PREFIX_CACHE_HITS_BY_TIER, tier=tier, **ENGINE) == src(
            "vllm:prompt_tokens_cached_by_source_total", source=tier
        )
    for canon, engine_name in (
        (S.INTER_TOKEN_LATENCY, "vllm:inter_token_latency_seconds"),
        (S.TIME_TO_FIRST_TOKEN, "vllm:time_to_first_token_seconds"),
    ):
        buckets = {dict(lab)["le"]: v for (n, lab), v in out.items() if n == canon + "_bucket"}
        engine_buckets = {dict(lab)["le"]: v for (n, lab), v in engine.items() if n == engine_name + "_bucket"}
        assert buckets == engine_buckets and len(buckets) >= 19 and "+Inf" in buckets
        assert value(out, canon + "_count", **ENGINE) == src(engine_name + "_count") == buckets["+Inf"]
        assert value(out, canon + "_sum", **ENGINE) == src(engine_name + "_sum")
    config = dict(next(lab for (n, lab) in engine if n == "vllm:cache_config_info"))
    capacity = value(out, S.KV_CACHE_CAPACITY, engine="vllm", dp_rank="0")
    assert (
        capacity
        == float(config["kv_cache_size_tokens"])
        == float(config["num_gpu_blocks"]) * float(config["block_size"])
    )
    assert not any(n.startswith("vllm:") for n, _ in out)
    assert {n for n, _ in out} <= {name for sig in S.SIGNALS.values() for name in sig.series_names}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_detected_as_vllm(page):
    assert detect(family_names(page.read_text())) is ADAPTERS["vllm"] is ADAPTER


def test_selective_parse_matches_full_parse():
    text = (FIXTURES / "after-prefix-hits.txt").read_text()
    full = ADAPTER.normalise((n, lab, v) for n, lab, v, _ in iter_samples(text))
    assert canonical(text) == full


def test_extra_labels_go_on_every_sample():
    out = canonical((FIXTURES / "idle.txt").read_text(), pod="vllm-0")
    assert out and all(dict(lab)["pod"] == "vllm-0" for _, lab in out)


# A small page under the families' pre-rename names, and one under their current names.
OLD_NAMES = (RENAMES / "old-names.txt").read_text()
NEW_NAMES = (RENAMES / "new-names.txt").read_text()

M = {"engine": "vllm", "dp_rank": "0", "model_name": "m"}


def test_old_names_map_onto_the_same_signals():
    out = canonical(OLD_NAMES)
    assert value(out, S.KV_CACHE_USAGE, **M) == 0.5
    assert value(out, S.PREFIX_CACHE_QUERIES, **M) == 40.0
    assert value(out, S.PREFIX_CACHE_HITS, **M) == 10.0
    assert value(out, S.INTER_TOKEN_LATENCY + "_bucket", le="0.01", **M) == 3.0
    assert value(out, S.INTER_TOKEN_LATENCY + "_count", **M) == 7.0
    assert value(out, S.INTER_TOKEN_LATENCY + "_sum", **M) == 0.2
    assert value(out, S.KV_TRANSFER_BYTES, direction="to_gpu", tier="cpu", **M) == 1000.0
    assert value(out, S.KV_TRANSFER_BYTES, direction="from_gpu", tier="cpu", **M) == 3000.0
    assert value(out, S.KV_TRANSFER_BYTES, direction="to_gpu", tier="shared_storage", **M) == 500.0
    assert detect(family_names(OLD_NAMES)) is ADAPTER


def test_both_names_present_count_once_newest_wins():
    """During a deprecation window vLLM exposes old and new names with the same data."""
    both = canonical(OLD_NAMES + NEW_NAMES)
    new = canonical(NEW_NAMES)
    assert value(both, S.KV_CACHE_USAGE, **M) == 0.75
    assert value(both, S.PREFIX_CACHE_QUERIES, **M) == 400.0
    assert value(both, S.INTER_TOKEN_LATENCY + "_count", **M) == 70.0  # not 77
    assert value(both, S.INTER_TOKEN_LATENCY + "_sum", **M) == 2.0
    assert value(both, S.KV_TRANSFER_BYTES, direction="to_gpu", tier="cpu", **M) == 1000.0  # not 2000
    assert value(both, S.KV_TRANSFER_BYTES, direction="from_gpu", tier="cpu", **M) == 3000.0
    # Everything the new names give is identical; the old page adds only what has no new name.
    assert {k: v for k, v in both.items() if k in new} == new
    assert set(both) - set(new) == {
        (S.KV_TRANSFER_BYTES, tuple(sorted({**M, "direction": "to_gpu", "tier": "shared_storage"}.items()))),
        (S.REQUESTS_RUNNING, tuple(sorted(M.items()))),
    }


def test_unknown_families_are_skipped():
    noise = (
        '# TYPE vllm:brand_new_metric_total counter\nvllm:brand_new_metric_total{engine="0",model_name="m"} 5\n'
        'some_other_exporter_metric{a="b"} 1\n# TYPE vllm:spec_decode_x histogram\n'
        'vllm:spec_decode_x_bucket{le="+Inf"} 1\n'
    )
    assert canonical(NEW_NAMES + noise) == canonical(NEW_NAMES)
    assert canonical(noise) == {}


def test_data_parallel_ranks_stay_apart():
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5\n'
        'vllm:num_preemptions_total{engine="0",model_name="m"} 1\n'
        'vllm:num_preemptions_total{engine="1",model_name="m"} 2\n'
    )
    out = canonical(text)
    assert value(out, S.KV_CACHE_USAGE, dp_rank="0") == 0.25
    assert value(out, S.KV_CACHE_USAGE, dp_rank="1") == 0.5
    assert value(out, S.PREEMPTIONS, dp_rank="1") == 2.0


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"kv_cache_size_tokens": "4096", "num_gpu_blocks": "32", "block_size": "128"}, 4096.0),
        ({"num_gpu_blocks": "2000", "block_size": "16"}, 32000.0),  # older builds: no kv_cache_size_tokens
        ({"kv_cache_size_tokens": "None", "num_gpu_blocks": "10", "block_size": "16"}, 160.0),
        ({"num_gpu_blocks": "None", "block_size": "16"}, None),  # before the pool is sized
        ({"block_size": "16"}, None),
    ],
)
def test_kv_capacity_from_cache_config_labels(labels, expected):
    assert kv_capacity_tokens(labels, 1.0) == expected


def test_capacity_absent_until_known():
    text = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="None"} 1.0\n'
    assert canonical(text) == {}


def test_declarations():
    emitted = {S.signal_for_series(n).name for p in PAGES for n, _ in canonical(p.read_text())}
    engine_signals = {
        n for n, sig in S.SIGNALS.items() if sig.labels[:2] == S.ENGINE_LABELS and n not in S.SLO_COUNTERS
    }
    # The captures show every engine signal but the offload bytes (no connector configured) and
    # what only V0 published ...
    assert engine_signals - emitted - set(ADAPTER.cannot_provide) - set(ADAPTER.legacy_only) == {S.KV_TRANSFER_BYTES}
    assert not emitted & set(ADAPTER.legacy_only)
    assert S.KV_TRANSFER_BYTES in {S.signal_for_series(n).name for n, _ in canonical(NEW_NAMES)}
    assert not emitted & set(ADAPTER.cannot_provide)
    assert all(not math.isnan(v) for p in PAGES for v in canonical(p.read_text()).values())


V0_PAGE = """\
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="m"} 3.0
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.98
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.4
# TYPE vllm:cpu_prefix_cache_hit_rate gauge
vllm:cpu_prefix_cache_hit_rate{model_name="m"} -1.0
"""


def test_v0_swapping_and_the_host_pool_are_signals():
    """V0's swap preemption: swapped requests and the CPU swap pool's usage (0..1, like the GPU's)."""
    out = canonical(V0_PAGE)
    m = {"engine": "vllm", "model_name": "m"}
    assert value(out, S.REQUESTS_SWAPPED, **m) == 3.0
    assert value(out, S.KV_CACHE_HOST_USAGE, **m) == 0.25
    assert value(out, S.KV_CACHE_USAGE, **m) == 0.98
    assert value(out, S.PREFIX_CACHE_HIT_RATIO, **m) == 0.4
    assert {S.signal_for_series(n).name for n, _ in out} == {
        S.REQUESTS_SWAPPED,
        S.KV_CACHE_HOST_USAGE,
        S.KV_CACHE_USAGE,
        S.PREFIX_CACHE_HIT_RATIO,
    }
    assert canonical(V0_PAGE.replace("} 0.4", "} -1.0")).keys() == out.keys() - {
        (S.PREFIX_CACHE_HIT_RATIO, tuple(sorted(m.items())))
    }  # -1: prefix caching off, no ratio


def test_connector_hits_count_in_the_total_and_in_their_own_tier():
    page = NEW_NAMES + (
        "# TYPE vllm:external_prefix_cache_hits_total counter\n"
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 60.0\n'
    )
    out = canonical(page)
    assert value(out, S.PREFIX_CACHE_HITS, **M) == 100.0 + 60.0
    assert value(out, S.PREFIX_CACHE_QUERIES, **M) == 400.0  # connector queries are a subset
    tiers = {dict(lab)["tier"]: v for (n, lab), v in out.items() if n == S.PREFIX_CACHE_HITS_BY_TIER}
    assert tiers == {"device": 100.0, "external_unspecified": 60.0}
    # no connector counter: no tier split invented from the local hits alone
    assert not any(n == S.PREFIX_CACHE_HITS_BY_TIER for n, _ in canonical(NEW_NAMES))
