"""The simulated engine's HTTP face: real vLLM's exposition format, the scenario switch, /gpu.

The simulated /metrics is compared family by family with the real vLLM 0.32 captures in
tests/fixtures/vllm-0.32-cpu/ (names, types, HELP texts, bucket boundaries, labels, ``_created``),
parsed with prometheus_client's own parser, and mapped through the production vLLM adapter.
"""

from __future__ import annotations

import errno
import math
import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.exporter import adapters
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textparse import family_names, iter_samples
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.physics import Simulation
from kvdoctor.simulator.scenarios import SCENARIO_CHOICES
from kvdoctor.simulator.vllm_exposition import render_metrics

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu" / "big-model-after-long-decode.txt"
# Families the simulated engine adds: the offloading connector's counters (it runs with a CPU tier).
OFFLOAD_FAMILIES = {
    "vllm:kv_offload_total_bytes",
    "vllm:kv_offload_total_time",
    "vllm:kv_offload_total_bytes_created",
    "vllm:kv_offload_total_time_created",
}
T0 = 1_800_000_000.0


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def real():
    return families(FIXTURE.read_text())


@pytest.fixture(scope="module")
def sim():
    return Simulation("tier_miss", seed=1, clock=lambda: T0, warmup=10)


@pytest.fixture(scope="module")
def text(sim):
    return render_metrics(sim).decode()


@pytest.fixture(scope="module")
def simulated(text):
    return families(text)


def vllm_only(fams: dict) -> dict:
    return {name: f for name, f in fams.items() if name.startswith("vllm:")}


def test_same_vllm_families_types_and_help_as_real_vllm(real, simulated):
    real_v, sim_v = vllm_only(real), vllm_only(simulated)
    assert set(sim_v) == set(real_v) | OFFLOAD_FAMILIES
    for name, fam in real_v.items():
        assert (sim_v[name].type, sim_v[name].documentation) == (fam.type, fam.documentation), name


def test_same_family_order_and_created_gauges_as_real_vllm(text):
    def type_lines(body: str) -> list[str]:
        return [line for line in body.splitlines() if line.startswith("# TYPE vllm:")]

    real_lines = type_lines(FIXTURE.read_text())
    sim_lines = [line for line in type_lines(text) if "kv_offload" not in line]
    assert sim_lines == real_lines  # counters typed with _total, a _created gauge after each family


def test_same_histogram_buckets_and_labels_as_real_vllm(real, simulated):
    for name, fam in vllm_only(real).items():
        got = vllm_only(simulated)[name]
        if fam.type == "histogram":

            def bounds(f):
                return [s.labels["le"] for s in f.samples if s.name.endswith("_bucket")]

            assert bounds(got) == bounds(fam), name
        real_labels = {tuple(sorted(set(s.labels) - {"le"})) for s in fam.samples}
        sim_labels = {tuple(sorted(set(s.labels) - {"le"})) for s in got.samples}
        assert sim_labels == real_labels, name


def test_python_and_process_families_like_real_vllm(real, simulated):
    wanted = {n for n in real if n.startswith(("python_", "process_"))}
    assert wanted <= set(simulated)


def test_cache_config_info_describes_the_simulated_pool(sim, simulated):
    (sample,) = simulated["vllm:cache_config_info"].samples
    labels = sample.labels
    assert int(labels["num_gpu_blocks"]) == sim.config.num_gpu_blocks
    assert int(labels["block_size"]) == 16
    assert int(labels["kv_cache_size_tokens"]) == sim.config.capacity_tokens
    assert labels["engine"] == "0" and "model_name" not in labels  # as in the fixture


def test_histograms_are_consistent(simulated):
    for fam in vllm_only(simulated).values():
        if fam.type != "histogram":
            continue
        buckets = [s.value for s in fam.samples if s.name.endswith("_bucket")]
        count = next(s.value for s in fam.samples if s.name.endswith("_count"))
        assert buckets == sorted(buckets) and buckets[-1] == count, fam.name


def test_maps_through_the_vllm_adapter(sim, text):
    adapter = adapters.detect(family_names(text))
    assert adapter is not None and adapter.name == "vllm"
    samples = [(name, labels, value) for name, labels, value, _ in iter_samples(text, adapter.wanted_names())]
    canonical = adapter.normalise(samples)
    names = {name for name, _ in canonical}
    for signal in (
        S.KV_CACHE_USAGE,
        S.KV_CACHE_CAPACITY,
        S.PREEMPTIONS,
        S.REQUESTS_RUNNING,
        S.REQUESTS_WAITING,
        S.GENERATION_TOKENS,
        S.PROMPT_TOKENS,
        S.PREFIX_CACHE_QUERIES,
        S.PREFIX_CACHE_HITS,
        S.PREFIX_CACHE_HITS_BY_TIER,
        S.KV_TRANSFER_BYTES,
    ):
        assert signal in names, signal
    for hist in (S.INTER_TOKEN_LATENCY, S.TIME_TO_FIRST_TOKEN):
        assert {hist + "_bucket", hist + "_sum", hist + "_count"} <= names

    def value(name, **match):
        hits = [v for (n, labels), v in canonical.items() if n == name and match.items() <= dict(labels).items()]
        assert len(hits) == 1, (name, match, hits)
        return hits[0]

    state = sim.state()
    assert value(S.KV_CACHE_USAGE) == pytest.approx(state.kv_usage)
    assert value(S.KV_CACHE_CAPACITY) == sim.config.capacity_tokens
    assert value(S.REQUESTS_RUNNING) == state.running
    loaded = sim.stats.labelled["vllm:kv_offload_total_bytes"]["CPU_to_GPU"]
    assert loaded > 0 and value(S.KV_TRANSFER_BYTES, direction="to_gpu") == pytest.approx(loaded)
    assert value(S.PREFIX_CACHE_HITS_BY_TIER, tier="host") > 0
    labels = dict(next(labels for (n, labels) in canonical if n == S.KV_CACHE_USAGE))
    assert labels == {"engine": "vllm", "dp_rank": "0", "model_name": sim.config.model_name}


# ------------------------------------------------------------------------------------- over HTTP


@pytest.fixture
def server():
    with EngineServer(Simulation("healthy", seed=0, warmup=5)) as srv:
        yield srv


def test_serves_metrics_health_and_models(server):
    with httpx.Client(base_url=server.url, timeout=10) as client:
        resp = client.get("/metrics")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "vllm:kv_cache_usage_perc" in family_names(resp.text)
        assert client.get("/health").status_code == 200
        assert client.get("/v1/models").json()["data"][0]["id"] == server.sim.config.model_name
        assert client.get("/nope").status_code == 404


def test_scenario_switch_over_http(server):
    with httpx.Client(base_url=server.url, timeout=10) as client:
        state = client.get("/scenario").json()
        assert state["scenario"] == "healthy" and state["expected_verdict"] == "healthy"
        assert state["choices"] == list(SCENARIO_CHOICES)

        resp = client.post("/scenario", json={"scenario": "kv_thrashing"})
        assert resp.status_code == 200 and resp.json()["active"] == "kv_thrashing"
        assert server.sim.active_scenario.name == "kv_thrashing"

        assert client.post("/scenario", params={"scenario": "cycle"}).json()["scenario"] == "cycle"

        bad = client.post("/scenario", json={"scenario": "nope"})
        assert bad.status_code == 400 and "kv_thrashing" in bad.json()["choices"]
        assert client.post("/scenario", content=b"{not json").status_code == 400
        assert client.post("/elsewhere").status_code == 404
        assert server.sim.scenario == "cycle"


def test_gpu_endpoint_reports_cumulative_counters(server):
    with httpx.Client(base_url=server.url, timeout=10) as client:
        first = client.get("/gpu").json()
        assert first["name"] == "NVIDIA H100 80GB HBM3"
        assert first["memory_total_bytes"] == 80 * 2**30 and 0 < first["memory_used_bytes"] < 80 * 2**30
        assert first["dram_bytes"] > 0 and first["sm_active_seconds"] > 0


def test_port_in_use_is_an_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as info:
            EngineServer(Simulation("healthy", warmup=0), port=taken.getsockname()[1])
        assert info.value.errno == errno.EADDRINUSE


def test_values_are_finite(text):
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            assert math.isfinite(sample.value) or sample.labels.get("le") == "+Inf", sample
