"""Golden and detection tests for the non-vLLM engine adapters and the KV-tier adapters.

Each fixture under tests/fixtures/engines/<engine>/ is exposition text built from the engine's own
source (its header says which file and commit); its canonical output through the adapter is kept
under tests/fixtures/golden/<engine>/. ``KVDOCTOR_UPDATE_GOLDEN=1`` rewrites the goldens (read the
diff before committing it).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.exporter import adapters
from kvdoctor.exporter.adapters import dynamo_kvbm, lmcache
from kvdoctor.exporter.adapters.base import EngineAdapter
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textparse import family_names, iter_samples

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "tests" / "fixtures" / "engines"
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
VLLM_FIXTURES = sorted((ROOT / "tests" / "fixtures" / "vllm-0.32-cpu").rglob("*.txt"))
UPDATE = os.environ.get("KVDOCTOR_UPDATE_GOLDEN") == "1"

MY_ENGINES = ("sglang", "trtllm", "trtllm_triton", "tgi", "llamacpp")
MY_TIERS = ("lmcache", "dynamo_kvbm")

# Engine signals an engine adapter must either map or declare in cannot_provide.
ENGINE_SIGNALS = frozenset(
    name
    for name, sig in S.SIGNALS.items()
    if sig.labels[: len(S.ENGINE_LABELS)] == S.ENGINE_LABELS and name not in S.SLO_COUNTERS  # the exporter's own
)

# An illustrative KV size (bytes per token / per 16-token block) for the factory variants:
# a GQA model with 36 layers, 8 KV heads, head dim 128, bf16 -> 2*36*8*128*2 = 147,456 B/token.
BYTES_PER_TOKEN = 147456
BYTES_PER_BLOCK = 16 * BYTES_PER_TOKEN

# (golden id, adapter, fixture): the golden lives at golden/<id>.txt
CASES = [
    ("sglang/current", "sglang", "sglang/current.txt"),
    ("sglang/hicache-dp2", "sglang", "sglang/hicache-dp2.txt"),
    ("sglang/v0.5-midyear", "sglang", "sglang/v0.5-midyear.txt"),
    ("sglang/v0.4-old", "sglang", "sglang/v0.4-old.txt"),
    ("trtllm/serve-current", "trtllm", "trtllm/serve-current.txt"),
    ("trtllm/serve-1.1", "trtllm", "trtllm/serve-1.1.txt"),
    ("trtllm_triton/triton-current", "trtllm_triton", "trtllm_triton/triton-current.txt"),
    ("trtllm_triton/triton-2024", "trtllm_triton", "trtllm_triton/triton-2024.txt"),
    ("tgi/tgi-3", "tgi", "tgi/tgi-3.txt"),
    ("llamacpp/old-kv-metrics", "llamacpp", "llamacpp/old-kv-metrics.txt"),
    ("llamacpp/current", "llamacpp", "llamacpp/current.txt"),
    ("lmcache/vllm-with-lmcache", "lmcache", "lmcache/vllm-with-lmcache.txt"),
    ("lmcache/vllm-with-lmcache.bytes-per-token", "lmcache+bpt", "lmcache/vllm-with-lmcache.txt"),
    ("dynamo_kvbm/kvbm", "dynamo_kvbm", "dynamo_kvbm/kvbm.txt"),
    ("dynamo_kvbm/kvbm.bytes-per-block", "dynamo_kvbm+bpb", "dynamo_kvbm/kvbm.txt"),
]

# fixture -> the engine adapters.detect must pick (None: no engine on that page)
DETECT = {
    "sglang/current.txt": "sglang",
    "sglang/hicache-dp2.txt": "sglang",
    "sglang/v0.5-midyear.txt": "sglang",
    "sglang/v0.4-old.txt": "sglang",
    "trtllm/serve-current.txt": "trtllm",
    "trtllm/serve-1.1.txt": "trtllm",
    "trtllm_triton/triton-current.txt": "trtllm_triton",
    "trtllm_triton/triton-2024.txt": "trtllm_triton",
    "tgi/tgi-3.txt": "tgi",
    "llamacpp/old-kv-metrics.txt": "llamacpp",
    "llamacpp/current.txt": "llamacpp",
    "lmcache/vllm-with-lmcache.txt": "vllm",
    "dynamo_kvbm/kvbm.txt": None,
}
TIER_ON = {"lmcache/vllm-with-lmcache.txt": "lmcache", "dynamo_kvbm/kvbm.txt": "dynamo_kvbm"}


def adapter_for(key: str) -> EngineAdapter:
    if key == "lmcache+bpt":
        return lmcache.with_bytes_per_token(BYTES_PER_TOKEN)
    if key == "dynamo_kvbm+bpb":
        return dynamo_kvbm.with_bytes_per_block(BYTES_PER_BLOCK)
    return adapters.ADAPTERS.get(key) or adapters.TIER_ADAPTERS[key]


def read(fixture: str) -> str:
    return (ENGINES / fixture).read_text()


def normalise(adapter: EngineAdapter, text: str, selective: bool = True) -> dict:
    wanted = adapter.wanted_names() if selective else None
    return adapter.normalise((n, lab, v) for n, lab, v, _ts in iter_samples(text, wanted))


def value(out: dict, name: str, **labels) -> float:
    """The one canonical sample ``name`` whose labels include ``labels``."""
    hits = [v for (n, lab), v in out.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


def render(out: dict) -> str:
    lines = []
    for (name, labels), v in sorted(out.items()):
        label_text = ",".join(f'{k}="{x}"' for k, x in labels)
        lines.append(f"{name}{{{label_text}}} {v!r}")
    return "\n".join(lines) + "\n"


def signal_of(series: str) -> str:
    return S.signal_for_series(series).name


# ------------------------------------------------------------------------------- fixtures


def test_every_fixture_is_covered():
    on_disk = {str(p.relative_to(ENGINES)) for p in ENGINES.rglob("*.txt")}
    assert on_disk == set(DETECT) == {c[2] for c in CASES}


@pytest.mark.parametrize("fixture", sorted(DETECT))
def test_fixture_says_where_it_comes_from_and_parses_elsewhere_too(fixture):
    """A provenance header, and text that prometheus_client's own parser accepts as well."""
    text = read(fixture)
    header = []
    for line in text.splitlines():
        if not line.startswith("# ") or line.startswith(("# HELP ", "# TYPE ")):
            break
        header.append(line)
    assert "illustrative" in " ".join(header) and "/" in " ".join(header)
    families = list(text_string_to_metric_families(text))
    assert sum(len(f.samples) for f in families) > 0


# ------------------------------------------------------------------------------- goldens


@pytest.mark.parametrize(("golden_id", "key", "fixture"), CASES, ids=[c[0] for c in CASES])
def test_golden(golden_id, key, fixture):
    """The adapter turns the fixture into exactly the canonical samples in the golden file."""
    out = normalise(adapter_for(key), read(fixture))
    assert out, "the adapter produced nothing from its own engine's page"
    header = f"# golden: {fixture} through {key}; regenerate with KVDOCTOR_UPDATE_GOLDEN=1\n"
    path = GOLDEN / f"{golden_id}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + render(out))
    assert path.read_text() == header + render(out)


@pytest.mark.parametrize(("golden_id", "key", "fixture"), CASES, ids=[c[0] for c in CASES])
def test_selective_parse_matches_full_parse(golden_id, key, fixture):
    """Asking the parser only for the adapter's wanted names loses nothing."""
    adapter = adapter_for(key)
    text = read(fixture)
    assert normalise(adapter, text, selective=True) == normalise(adapter, text, selective=False)


@pytest.mark.parametrize(("golden_id", "key", "fixture"), CASES, ids=[c[0] for c in CASES])
def test_golden_signals_are_declared(golden_id, key, fixture):
    """Nothing an adapter emits is also listed as something it cannot provide."""
    adapter = adapter_for(key)
    emitted = {signal_of(name) for name, _ in normalise(adapter, read(fixture))}
    assert not emitted & set(adapter.cannot_provide)
    assert emitted <= {m.target for m in adapter.maps}
    for name, _ in normalise(adapter, read(fixture)):
        assert S.signal_for_series(name) is not None, name


# ------------------------------------------------------------------------------- detection


@pytest.mark.parametrize("fixture", sorted(DETECT))
def test_detect_picks_the_engine(fixture):
    names = family_names(read(fixture))
    expected = DETECT[fixture]
    picked = adapters.detect(names)
    if expected == "vllm" and "vllm" not in adapters.ADAPTERS:
        assert picked is None or picked.name not in MY_ENGINES  # the vLLM adapter is not here yet
    else:
        assert (picked.name if picked else None) == expected


@pytest.mark.parametrize("fixture", sorted(DETECT))
def test_no_other_engine_claims_the_page(fixture):
    """Only the page's own engine adapter (if any) finds its identifying families on it."""
    names = family_names(read(fixture))
    claimed = {key for key in MY_ENGINES if any(n in names for n in adapters.ADAPTERS[key].detect)}
    expected = DETECT[fixture]
    assert claimed == ({expected} if expected in MY_ENGINES else set())


@pytest.mark.parametrize("fixture", sorted(DETECT))
def test_no_other_engine_recognises_any_family_of_the_page(fixture):
    """Not even weakly: no family another engine reads, no family with its prefix."""
    names = family_names(read(fixture))
    others = {key: a.recognises(names) for key, a in adapters.ADAPTERS.items() if key != DETECT[fixture]}
    assert not any(others.values()), others


@pytest.mark.parametrize("fixture", sorted(DETECT))
def test_tier_adapters_recognise_only_their_pages(fixture):
    names = family_names(read(fixture))
    present = {key for key in MY_TIERS if any(n in names for n in adapters.TIER_ADAPTERS[key].detect)}
    assert present == ({TIER_ON[fixture]} if fixture in TIER_ON else set())


@pytest.mark.parametrize("fixture", VLLM_FIXTURES, ids=lambda p: p.name)
def test_real_vllm_pages_are_not_claimed(fixture):
    """Real vLLM captures are not mistaken for another engine or a KV tier."""
    names = family_names(fixture.read_text())
    for key in MY_ENGINES:
        assert not any(n in names for n in adapters.ADAPTERS[key].detect), key
    for key in MY_TIERS:
        assert not any(n in names for n in adapters.TIER_ADAPTERS[key].detect), key


def test_all_adapters_are_registered():
    assert set(MY_ENGINES) <= set(adapters.ADAPTERS)
    assert set(MY_TIERS) <= set(adapters.TIER_ADAPTERS)
    assert not set(MY_TIERS) & set(adapters.ADAPTERS)


# ------------------------------------------------------------------------------- declarations


@pytest.mark.parametrize("key", sorted(adapters.ADAPTERS))
def test_engine_adapter_accounts_for_every_engine_signal(key):
    """Each engine signal is either mapped or declared in cannot_provide, never both; what only
    older generations publish is mapped. A ratio gauge is optional when the engine gives the
    query/hit counters the ratio is computed from."""
    adapter = adapters.ADAPTERS[key]
    mapped = {m.target for m in adapter.maps}
    cannot = set(adapter.cannot_provide)
    assert cannot <= ENGINE_SIGNALS
    assert not mapped & cannot
    assert set(adapter.legacy_only) <= mapped
    missing = set(ENGINE_SIGNALS) - mapped - cannot
    if {S.PREFIX_CACHE_QUERIES, S.PREFIX_CACHE_HITS} <= mapped:
        missing.discard(S.PREFIX_CACHE_HIT_RATIO)
    assert not missing, f"{key} neither maps nor declares {sorted(missing)}"


def test_tgi_cannot_provide_kv_usage_or_prefix_hits():
    cannot = set(adapters.ADAPTERS["tgi"].cannot_provide)
    assert {S.KV_CACHE_USAGE, S.PREFIX_CACHE_HITS, S.PREFIX_CACHE_QUERIES, S.TIME_TO_FIRST_TOKEN} <= cannot


def test_docs_table_matches_the_adapters():
    """docs/engines.md lists, per adapter, exactly what it maps and what it declares missing."""
    rows = {}
    for line in (ROOT / "docs" / "engines.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].split("`")[1]] = cells
    assert set(rows) == set(adapters.ADAPTERS) | set(adapters.TIER_ADAPTERS)
    for key, (_, detect_by, provided, cannot) in rows.items():
        adapter = adapter_for(key)
        short = lambda cell: {"kvdoctor_" + n for n in re.findall(r"`([a-z0-9_]+)`", cell)}  # noqa: E731
        assert short(provided) == {m.target for m in adapter.maps}, key
        assert short(cannot) == set(adapter.cannot_provide), key
        assert any(f"`{n}`" in detect_by for n in adapter.detect), key


# ------------------------------------------------------------------------------- semantics


def test_sglang_interval_gauge_is_not_a_preemption_counter():
    """sglang:num_retracted_reqs is reset every log interval; only the totals count preemptions."""
    current = normalise(adapters.ADAPTERS["sglang"], read("sglang/current.txt"))
    assert value(current, S.PREEMPTIONS) == 3.0  # num_retracted_requests_total, not the 0 gauge
    midyear = normalise(adapters.ADAPTERS["sglang"], read("sglang/v0.5-midyear.txt"))
    assert value(midyear, S.PREEMPTIONS) == 14.0  # the cumulative total_retracted_reqs gauge
    old = normalise(adapters.ADAPTERS["sglang"], read("sglang/v0.4-old.txt"))
    assert not any(name == S.PREEMPTIONS for name, _ in old)


def test_sglang_old_itl_name_and_hit_tiers():
    sg = adapters.ADAPTERS["sglang"]
    old = normalise(sg, read("sglang/v0.4-old.txt"))
    assert value(old, S.INTER_TOKEN_LATENCY + "_count") == 15140.0
    hicache = normalise(sg, read("sglang/hicache-dp2.txt"))
    tiers = {dict(lab)["tier"]: v for (n, lab), v in hicache.items() if n == S.PREFIX_CACHE_HITS_BY_TIER}
    assert tiers == {"device": 702336.0, "host": 388608.0, "storage_file": 65536.0}
    assert value(hicache, S.PREFIX_CACHE_HITS) == sum(tiers.values())
    # one KV pool per DP rank: usage stays per rank, byte counters too
    assert value(hicache, S.KV_CACHE_USAGE, dp_rank="1") == 0.71
    assert value(hicache, S.KV_TRANSFER_BYTES, direction="to_gpu", dp_rank="0") == 2.61e9
    midyear = normalise(sg, read("sglang/v0.5-midyear.txt"))  # cached_tokens_total without cache_source
    assert value(midyear, S.PREFIX_CACHE_HITS) == 31577.0
    assert not any(name == S.PREFIX_CACHE_HITS_BY_TIER for name, _ in midyear)


def test_trtllm_tiers_and_transfers():
    out = normalise(adapters.ADAPTERS["trtllm"], read("trtllm/serve-current.txt"))
    tiers = {dict(lab)["tier"] for (n, lab), _ in out.items() if n == S.PREFIX_CACHE_HITS_BY_TIER}
    assert tiers == {"device", "host", "disk"}  # TRT-LLM's "gpu" is the canonical "device"
    assert value(out, S.KV_TRANSFER_BYTES, direction="to_gpu", tier="host") == 3.221225472e9
    assert value(out, S.KV_CACHE_USAGE) == 0.9140625
    old = normalise(adapters.ADAPTERS["trtllm"], read("trtllm/serve-1.1.txt"))
    assert {signal_of(n) for n, _ in old} == {S.INTER_TOKEN_LATENCY, S.TIME_TO_FIRST_TOKEN}


def test_triton_kv_usage_from_the_fraction_or_from_its_parts():
    triton = adapters.ADAPTERS["trtllm_triton"]
    current = normalise(triton, read("trtllm_triton/triton-current.txt"))
    assert math.isclose(value(current, S.KV_CACHE_USAGE, model_name="tensorrt_llm"), 5720 / 6239)
    assert value(current, S.REQUESTS_WAITING) == 17.0
    assert value(current, S.PROMPT_TOKENS) == 4500 + 82000 + 36000
    assert value(current, S.KV_CACHE_CAPACITY) == 6239 * 64  # max blocks x tokens per block
    old = normalise(triton, read("trtllm_triton/triton-2024.txt"))  # no fraction: used / max blocks
    raw = {lab.get("kv_cache_block_type"): v for n, lab, v, _ in iter_samples(read("trtllm_triton/triton-2024.txt"))}
    assert "fraction" not in raw
    assert value(old, S.KV_CACHE_USAGE, model_name="tensorrt_llm") == raw["used"] / raw["max"]
    assert {signal_of(n) for n, _ in old} == {S.REQUESTS_RUNNING, S.KV_CACHE_CAPACITY, S.KV_CACHE_USAGE}


def test_llamacpp_queries_are_processed_plus_cached_tokens():
    lc = adapters.ADAPTERS["llamacpp"]
    current = normalise(lc, read("llamacpp/current.txt"))
    # the page rounds to 6 significant digits: 1.36238e+06 and 2.72238e+07
    assert value(current, S.PREFIX_CACHE_QUERIES) == 1.36238e06 + 2.72238e07
    assert value(current, S.PREFIX_CACHE_HITS) == 2.72238e07
    assert not any(n == S.KV_CACHE_USAGE for n, _ in current)
    old = normalise(lc, read("llamacpp/old-kv-metrics.txt"))
    assert value(old, S.KV_CACHE_USAGE) == 0.854492
    assert not any(n == S.PREFIX_CACHE_HITS for n, _ in old)
    assert not any(n == S.PREFIX_CACHE_QUERIES for n, _ in old)  # no cached counter: queries unknown


def test_kvbm_host_to_disk_offload_never_counts_as_gpu_traffic():
    """kvbm_offload_blocks_h2d is host -> disk: with a block size known, only GPU-boundary block
    counters become transfer bytes."""
    text = read("dynamo_kvbm/kvbm.txt")
    raw = {n: v for n, _lab, v, _ts in iter_samples(text)}
    assert raw["kvbm_offload_blocks_h2d"] > 0  # the fixture does exercise the trap
    out = normalise(dynamo_kvbm.with_bytes_per_block(BYTES_PER_BLOCK), text)
    from_gpu = sum(v for (n, lab), v in out.items() if n == S.KV_TRANSFER_BYTES and ("direction", "from_gpu") in lab)
    to_gpu = sum(v for (n, lab), v in out.items() if n == S.KV_TRANSFER_BYTES and ("direction", "to_gpu") in lab)
    assert (
        from_gpu
        == (raw["kvbm_offload_blocks_d2h"] + raw["kvbm_offload_blocks_d2d"]) * BYTES_PER_BLOCK
        + raw["kvbm_offload_bytes_object"]
    )
    assert (
        to_gpu
        == (raw["kvbm_onboard_blocks_h2d"] + raw["kvbm_onboard_blocks_d2d"]) * BYTES_PER_BLOCK
        + raw["kvbm_onboard_bytes_object"]
    )
    assert value(out, S.KV_TRANSFER_BYTES, direction="to_gpu", tier="host") == 9400 * BYTES_PER_BLOCK
    # without a block size, block counters are not guessed at
    plain = normalise(adapters.TIER_ADAPTERS["dynamo_kvbm"], text)
    assert {dict(lab)["tier"] for (n, lab), _ in plain.items() if n == S.KV_TRANSFER_BYTES} == {"object"}


def test_lmcache_tokens_become_bytes_only_with_a_size():
    text = read("lmcache/vllm-with-lmcache.txt")
    plain = normalise(adapters.TIER_ADAPTERS["lmcache"], text)
    assert {signal_of(n) for n, _ in plain} == {S.PREFIX_CACHE_HITS_BY_TIER}
    assert value(plain, S.PREFIX_CACHE_HITS_BY_TIER, tier="lmcache", engine="lmcache") == 6144.0
    sized = normalise(lmcache.with_bytes_per_token(BYTES_PER_TOKEN), text)
    assert value(sized, S.KV_TRANSFER_BYTES, direction="to_gpu") == 6144 * BYTES_PER_TOKEN
    assert value(sized, S.KV_TRANSFER_BYTES, direction="from_gpu") == 25344 * BYTES_PER_TOKEN
    # the vLLM families on the same page are not the tier adapter's business
    assert all(dict(lab)["engine"] == "lmcache" for _, lab in sized)


@pytest.mark.parametrize("factory", [lmcache.with_bytes_per_token, dynamo_kvbm.with_bytes_per_block])
@pytest.mark.parametrize("size", [0, -1, float("nan")])
def test_size_factories_refuse_nonsense(factory, size):
    with pytest.raises(ValueError):
        factory(size)


def test_tgi_gives_queue_batch_and_per_request_latency_only():
    out = normalise(adapters.ADAPTERS["tgi"], read("tgi/tgi-3.txt"))
    assert {signal_of(n) for n, _ in out} == {
        S.REQUESTS_RUNNING,
        S.REQUESTS_WAITING,
        S.INTER_TOKEN_LATENCY,
        S.PROMPT_TOKENS,
        S.GENERATION_TOKENS,
    }
    assert value(out, S.PROMPT_TOKENS) == 30 * 310 + 18 * 1900
    assert value(out, S.INTER_TOKEN_LATENCY + "_count") == 48.0
    buckets = [dict(lab)["le"] for (n, lab), _ in out.items() if n == S.INTER_TOKEN_LATENCY + "_bucket"]
    assert len(buckets) == 36  # TGI's 35 geometric buckets + +Inf, re-exposed as they are


def test_cached_keys_follow_the_extra_labels_and_stay_bounded():
    from kvdoctor.exporter.adapters.base import MAX_CACHED_KEYS

    vllm = adapters.ADAPTERS["vllm"]
    raw = [("vllm:num_requests_running", {"model_name": "m"}, 3.0)]
    first = vllm.normalise(raw, {"pod": "a"})
    second = vllm.normalise(raw, {"pod": "b"})
    assert [dict(labels)["pod"] for _, labels in first] == ["a"]
    assert [dict(labels)["pod"] for _, labels in second] == ["b"]
    for i in range(MAX_CACHED_KEYS + 50):  # label churn: one new model name per scrape
        churn = vllm.normalise([("vllm:num_requests_running", {"model_name": f"m{i}"}, 1.0)])
        assert [dict(labels)["model_name"] for _, labels in churn] == [f"m{i}"]
    assert len(vllm._keys) <= MAX_CACHED_KEYS
    explosion = [("vllm:num_requests_running", {"model_name": f"x{i}"}, 1.0) for i in range(3 * MAX_CACHED_KEYS)]
    assert len(vllm.normalise(explosion)) == len(explosion)  # nothing lost, however many
    assert len(vllm._keys) <= MAX_CACHED_KEYS  # and the cache stays bounded within one page too
