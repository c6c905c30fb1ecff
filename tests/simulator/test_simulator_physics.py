"""The simulated engine's physics: each workload lands where the ledger says it should.

Every test drives a ``Simulation`` on an injected clock, so it runs in simulated time (tens of
simulated seconds in a fraction of a real one) and is deterministic.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvdoctor.ledger.arithmetic import decode_step_floor, kv_bytes_per_token
from kvdoctor.simulator import scenarios, vllm_metrics
from kvdoctor.simulator.deployment import EngineConfig
from kvdoctor.simulator.physics import Simulation
from kvdoctor.simulator.scenarios import SCENARIOS, Scenario
from tests.support.sim_pipeline import Clock


def run(
    scenario: str,
    seconds: float = 20.0,
    seed: int = 0,
    warmup: float = 12.0,
    step: float = 1.0,
    monkey_scenarios: dict[str, Scenario] | None = None,
):
    """(sim, per-step readings): each reading is (state, stats, gpu) after ``step`` more seconds."""
    clock = Clock()
    sim = Simulation(scenario, seed=seed, clock=clock, warmup=warmup)
    readings = [(sim.state(), sim.snapshot()[1], sim.gpu_reading())]
    for _ in range(int(seconds / step)):
        clock.t += step
        sim.sync()
        readings.append((sim.state(), sim.snapshot()[1], sim.gpu_reading()))
    return sim, readings


def gpu_ratios(sim: Simulation, first, last) -> tuple[float, float, float]:
    """(DRAM bandwidth, SM active, PCIe RX bytes/s) between two GPU readings, as GPM would report."""
    elapsed = last.time - first.time
    dram = (last.dram_bytes - first.dram_bytes) / (elapsed * sim.config.gpu.peak_bandwidth)
    sm = (last.sm_active_seconds - first.sm_active_seconds) / elapsed
    rx = (last.pcie_rx_bytes - first.pcie_rx_bytes) / elapsed
    return dram, sm, rx


def itl_increase(first, last) -> tuple[list[int], float]:
    h0 = first.histograms["vllm:inter_token_latency_seconds"]
    h1 = last.histograms["vllm:inter_token_latency_seconds"]
    return [b - a for a, b in zip(h0.counts, h1.counts, strict=True)], h1.sum - h0.sum


def mean_itl(first, last) -> float:
    counts, total = itl_increase(first, last)
    return total / sum(counts)


def counter(stats, name: str) -> float:
    return stats.counters[name]


# ------------------------------------------------------------------------------------- the ledger


def test_the_pool_is_the_ledgers_pool():
    cfg = EngineConfig()
    assert cfg.kv_bytes_per_token == kv_bytes_per_token(cfg.shape) == 2 * 32 * 32 * 128 * 2  # Llama-2-7B, fp16
    pool = math.ceil(80 * 2**30 * 0.9) - cfg.shape.weight_bytes - cfg.activation_reserve_bytes  # 80 GiB H100
    assert cfg.num_gpu_blocks == int(pool // (cfg.kv_bytes_per_token * 16))
    assert 110_000 < cfg.capacity_tokens < 120_000


def test_decode_steps_never_beat_the_ledgers_floor():
    """The mean ITL is at least the decode floor for the KV actually resident, and close to it
    (memory-bound decode reaches ~90% of peak bandwidth), in a purely decode-heavy workload."""
    sim, readings = run("bandwidth_bound", seconds=10)
    (s0, st0, _), (s1, st1, _) = readings[0], readings[-1]
    resident_tokens = (s0.used_blocks + s1.used_blocks) / 2 * sim.config.block_size
    floor = decode_step_floor(
        sim.config.shape.weight_bytes, resident_tokens * sim.config.kv_bytes_per_token, sim.config.gpu.peak_bandwidth
    )
    itl = mean_itl(st0, st1)
    assert floor < itl < 1.35 * floor


def test_itl_rises_with_resident_kv():
    """Same clients, longer contexts: more KV resident, and ITL grows with it."""
    points = []
    for prompt in (500, 1500, 3000):
        variant = dataclasses.replace(
            SCENARIOS["bandwidth_bound"], name="probe", prompt_tokens=prompt, output_tokens=800, clients=20
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(scenarios.SCENARIOS, "probe", variant)
            _sim, readings = run("probe", seconds=6)
        usage = sum(r[0].kv_usage for r in readings) / len(readings)
        points.append((usage, mean_itl(readings[0][1], readings[-1][1])))
    usages = [u for u, _ in points]
    itls = [i for _, i in points]
    assert usages == sorted(usages) and usages[-1] > 3 * usages[0]
    assert itls == sorted(itls) and itls[-1] > 1.5 * itls[0]


# ------------------------------------------------------------------------------------- preemption


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "kv_thrashing"])
def test_no_preemption_while_demand_fits_the_pool(name):
    _sim, readings = run(name, seconds=15)
    assert counter(readings[-1][1], "vllm:num_preemptions") == 0


def test_preemptions_only_when_the_pool_is_exhausted(monkeypatch):
    usage_at_preemption = []
    original = Simulation._preempt

    def spy(self, req):
        usage_at_preemption.append(self.state().kv_usage)
        original(self, req)

    monkeypatch.setattr(Simulation, "_preempt", spy)
    sim, _readings = run("kv_thrashing", seconds=15)
    assert len(usage_at_preemption) > 15  # demand is far above the pool: it preempts every second
    # a decode token needs one block: the pool is within a block or two of full when it preempts
    assert min(usage_at_preemption) > 1 - 3 / sim.config.num_gpu_blocks


def test_thrashing_kv_oscillates_just_under_the_ceiling_and_itl_gets_stalls():
    _sim, readings = run("kv_thrashing", seconds=15, step=0.5)
    usage = [r[0].kv_usage for r in readings]
    assert min(usage) > 0.9 and max(usage) <= 1.0
    assert max(usage) - min(usage) > 0.002  # each preemption frees blocks: it moves, it is not pinned
    counts, _ = itl_increase(readings[0][1], readings[-1][1])
    bounds = vllm_metrics.HISTOGRAM_BUCKETS["vllm:inter_token_latency_seconds"]
    stalls = sum(c for b, c in zip((*bounds, float("inf")), counts, strict=True) if b > 0.3)
    assert stalls > 10  # resumed requests observe their whole wait: the tail of the knee
    assert readings[-1][0].waiting > 0


def test_healthy_has_no_latency_tail():
    _sim, readings = run("healthy", seconds=15)
    counts, _ = itl_increase(readings[0][1], readings[-1][1])
    assert sum(counts[:1]) / sum(counts) > 0.95  # almost every token within the first bucket (10 ms)
    assert max(r[0].kv_usage for r in readings) < 0.3 and readings[-1][0].waiting == 0


def test_capacity_pressure_fills_the_pool_and_grows_the_queue_without_preempting():
    _sim, readings = run("capacity_pressure", seconds=30)
    usage = sorted(r[0].kv_usage for r in readings)
    assert usage[len(usage) // 2] >= 0.9
    waiting = [r[0].waiting for r in readings]
    assert waiting[-1] > waiting[0] + 30
    assert counter(readings[-1][1], "vllm:num_preemptions") == 0


# ------------------------------------------------------------------------------------- the GPU


def test_bandwidth_bound_saturates_dram_not_sms():
    sim, readings = run("bandwidth_bound", seconds=15)
    dram, sm, rx = gpu_ratios(sim, readings[0][2], readings[-1][2])
    assert dram >= 0.8 and sm < 0.5 and rx < 1e8


def test_compute_bound_saturates_sms_not_dram():
    sim, readings = run("compute_bound", seconds=15)
    dram, sm, _ = gpu_ratios(sim, readings[0][2], readings[-1][2])
    assert sm >= 0.85 and dram < 0.4


def test_host_overhead_leaves_the_gpu_idle_with_requests_running():
    sim, readings = run("host_overhead", seconds=15)
    dram, sm, _ = gpu_ratios(sim, readings[0][2], readings[-1][2])
    assert dram < 0.2 and sm < 0.2
    assert all(r[0].running > 0 for r in readings)
    assert mean_itl(readings[0][1], readings[-1][1]) > 0.1


def test_tier_miss_moves_prefix_hits_over_pcie():
    sim, readings = run("tier_miss", seconds=15)
    first, last = readings[0][1], readings[-1][1]
    _, _, rx = gpu_ratios(sim, readings[0][2], readings[-1][2])
    loaded = (
        last.labelled["vllm:kv_offload_total_bytes"]["CPU_to_GPU"]
        - first.labelled["vllm:kv_offload_total_bytes"]["CPU_to_GPU"]
    )
    host_hits = (
        last.labelled["vllm:prompt_tokens_cached_by_source"]["host"]
        - first.labelled["vllm:prompt_tokens_cached_by_source"]["host"]
    )
    assert rx > 5e9  # GB/s of KV over PCIe
    assert loaded == pytest.approx(host_hits * sim.config.kv_bytes_per_token)
    assert loaded / 15 == pytest.approx(rx, rel=0.05)  # PCIe RX is the KV loads (plus token ids)
    assert max(r[0].kv_usage for r in readings) < 0.9  # the pool has room: a tier miss, not thrashing
    assert counter(last, "vllm:external_prefix_cache_hits") > 0


@pytest.mark.parametrize("name", ["healthy", "bandwidth_bound", "compute_bound", "host_overhead", "kv_thrashing"])
def test_no_pcie_traffic_without_a_host_tier(name):
    sim, readings = run(name, seconds=5)
    _, _, rx = gpu_ratios(sim, readings[0][2], readings[-1][2])
    assert rx < 1e8
    assert readings[-1][1].labelled["vllm:kv_offload_total_bytes"]["CPU_to_GPU"] == 0


# ------------------------------------------------------------------------------------- bookkeeping


def test_counters_and_histograms_only_grow_across_scenario_switches():
    clock = Clock()
    sim = Simulation("cycle", seed=3, clock=clock, warmup=5, cycle_period=6)
    previous = sim.snapshot()[1]
    seen = set()
    for _ in range(50):  # 50 s: every scenario of the cycle, and back
        clock.t += 1
        sim.sync()
        seen.add(sim.active_scenario.name)
        stats = sim.snapshot()[1]
        for name, value in stats.counters.items():
            assert value >= previous.counters[name], name
        for family, values in stats.labelled.items():
            for label, value in values.items():
                assert value >= previous.labelled[family][label], (family, label)
        for name, hist in stats.histograms.items():
            before = previous.histograms[name]
            assert all(b >= a for a, b in zip(before.counts, hist.counts, strict=True)), name
            assert hist.sum >= before.sum - 1e-9, name
            cumulative = [c for _, c in hist.cumulative()]
            assert cumulative == sorted(cumulative), name
        previous = stats
    assert seen == set(SCENARIOS)
    assert previous.labelled["vllm:request_success"]["abort"] > 0  # switching disconnects the old clients


def test_the_engine_keeps_its_books():
    """Blocks in use match the requests holding them; generated tokens match ITL + first tokens."""
    sim, readings = run("kv_thrashing", seconds=10)
    bs = sim.config.block_size
    private = sum(r.private_blocks for r in sim.running)
    assert sim.state().used_blocks == private + sim.blocks.shared_blocks
    for req in sim.running:
        assert req.private_blocks == -(-max(0, req.computed - req.shared) // bs) or req.computed < req.target
    stats = readings[-1][1]
    itl = stats.histograms["vllm:inter_token_latency_seconds"].count
    ttft = stats.histograms["vllm:time_to_first_token_seconds"].count
    assert stats.counters["vllm:generation_tokens"] == itl + ttft


def test_same_seed_same_run_whatever_the_read_pattern():
    a_clock, b_clock = Clock(), Clock()
    a = Simulation("kv_thrashing", seed=7, clock=a_clock, warmup=5)
    b = Simulation("kv_thrashing", seed=7, clock=b_clock, warmup=5)
    for _ in range(20):  # a is read every 0.5 s, b once at the end
        a_clock.t += 0.5
        a.sync()
    b_clock.t += 10
    b.sync()
    assert a.snapshot()[1] == b.snapshot()[1]
    assert a.gpu_reading() == b.gpu_reading()


def test_another_seed_another_run():
    a = Simulation("healthy", seed=1, clock=Clock(), warmup=5)
    b = Simulation("healthy", seed=2, clock=Clock(), warmup=5)
    assert a.snapshot()[1].histograms != b.snapshot()[1].histograms


def test_switching_scenario_takes_effect_at_once():
    clock = Clock()
    sim = Simulation("healthy", seed=0, clock=clock, warmup=10)
    before = sim.state()
    assert before.kv_usage < 0.3 and 0 < before.running + before.waiting <= 16
    sim.set_scenario("kv_thrashing")
    assert sim.scenario == sim.active_scenario.name == "kv_thrashing"
    # the healthy clients disconnected: their requests are aborted and their blocks freed
    assert sim.snapshot()[1].labelled["vllm:request_success"]["abort"] == before.running + before.waiting
    assert sim.state().used_blocks == 0
    clock.t += 8
    sim.sync()
    assert sim.state().kv_usage > 0.9 and sim.stats.counters["vllm:num_preemptions"] > 0


def test_unknown_scenario_is_refused():
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        Simulation("nope", clock=Clock(), warmup=0)
    sim = Simulation("healthy", clock=Clock(), warmup=0)
    with pytest.raises(ValueError, match="choose from"):
        sim.set_scenario("nope")


def test_cycle_walks_every_scenario_in_order():
    names = [scenarios.scenario_at("cycle", k * 10.0, period=10.0).name for k in range(len(scenarios.CYCLE_ORDER) + 1)]
    assert names == [*scenarios.CYCLE_ORDER, scenarios.CYCLE_ORDER[0]]
    assert set(scenarios.CYCLE_ORDER) == set(SCENARIOS)


def test_a_model_that_does_not_fit_is_refused():
    from kvdoctor.ledger.gpus import gpu_spec
    from kvdoctor.ledger.model import COMMON_MODELS

    with pytest.raises(ValueError, match="no room for a KV cache"):
        Simulation(
            config=EngineConfig(shape=COMMON_MODELS["Llama-3.1-70B"], gpu=gpu_spec("H100")),
            clock=Clock(),
            warmup=0,
        )
