"""`kvdoctor demo --gpus N`: the simulated deployment split tensor parallel over N GPUs with the
ledger's arithmetic, each GPU reported with its own identity, memory and readings."""

from __future__ import annotations

import contextlib
import io

import pytest

from kvdoctor.cli import main as kvdoctor_main
from kvdoctor.ledger.arithmetic import kv_capacity, kv_pool_bytes
from kvdoctor.signals import vocabulary as S
from kvdoctor.simulator.deployment import EngineConfig
from kvdoctor.simulator.gpu import SimulatedGpuCollector, gpu_payload
from kvdoctor.simulator.physics import Simulation


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def by_name(collected) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for (name, labels), value in collected.samples.items():
        out.setdefault(name, []).append((dict(labels), value))
    return out


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_each_gpu_holds_the_ledgers_share_of_weights_and_kv(tp):
    config = EngineConfig(tensor_parallel=tp)
    shape = config.shape
    pool = kv_pool_bytes(shape, config.gpu, config.gpu_memory_utilization, config.activation_reserve_bytes, tp)
    assert config.kv_pool_bytes == pool
    assert config.weight_bytes_per_gpu == shape.weight_bytes / tp
    ledger = kv_capacity(shape, pool, config.max_model_len, config.block_size, tp)
    assert config.num_gpu_blocks == ledger.num_blocks  # vLLM's count, per GPU
    assert config.kv_bytes_per_token * config.block_size == ledger.bytes_per_block


def test_more_gpus_hold_more_tokens_and_step_faster():
    one, eight = EngineConfig(), EngineConfig(tensor_parallel=8)
    assert eight.capacity_tokens > 8 * one.capacity_tokens  # the weights' share freed on each GPU too
    assert one.all_reduce_seconds(64) == 0 < eight.all_reduce_seconds(64)


def test_a_split_the_model_does_not_allow_is_refused_as_vllm_would():
    with pytest.raises(ValueError, match="does not divide the model's 32 attention heads"):
        EngineConfig(tensor_parallel=3)


def test_each_gpu_reports_its_own_identity_memory_and_readings():
    clock = Clock()
    sim = Simulation("bandwidth_bound", clock=clock, warmup=2, config=EngineConfig(tensor_parallel=4))
    payload = gpu_payload(sim)
    assert [g["index"] for g in payload["gpus"]] == [0, 1, 2, 3]
    collector = SimulatedGpuCollector.for_simulation(sim)
    collector.collect()
    clock.t += 2
    samples = by_name(collector.collect())
    dram = {labels["gpu"]: (labels["uuid"], value) for labels, value in samples[S.GPU_DRAM_BANDWIDTH_UTILIZATION]}
    assert sorted(dram) == ["0", "1", "2", "3"]
    assert len({uuid for uuid, _ in dram.values()}) == 4
    assert dram["0"][1] > dram["3"][1] > 0  # rank 0 also samples: its own, busier reading
    assert len(samples[S.GPU_MEMORY_USED]) == len(samples[S.GPU_PCIE_RX]) == 4
    uuids = {labels["uuid"] for labels, _ in samples[S.GPU_MEMORY_USED]}
    assert uuids == {g["uuid"] for g in payload["gpus"]}


def _demo(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = kvdoctor_main(["demo", "--no-dashboard", *args])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, err.getvalue()


@pytest.mark.parametrize(
    "gpus, phrase", [("3", "--gpus 3: 3 does not divide the model's 32 attention heads"), ("0", "at least 1")]
)
def test_demo_refuses_a_gpu_count_the_model_cannot_split_over(gpus, phrase):
    rc, err = _demo("--gpus", gpus, "--port", "0")
    assert rc == 2 and len(err.splitlines()) == 1 and phrase in err, err
