"""The dcgm-exporter collector: the mapping on dcgm-exporter pages, and over real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvdoctor.exporter.collectors.dcgm import DcgmCollector, dcgm_collector, normalise_dcgm
from kvdoctor.exporter.collectors.engine import parse_exposition
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import NotApplicable, SourceError
from kvdoctor.signals.units import MIB
from tests.support.servers import respond

FIXTURES = Path(__file__).resolve().parents[2] / "tests/fixtures/dcgm"
H100 = (FIXTURES / "dcgm-exporter-h100x2.txt").read_text()
MIG = (FIXTURES / "dcgm-exporter-a100-mig.txt").read_text()
GPU0 = {"gpu": "0", "uuid": "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "model": "NVIDIA H100 80GB HBM3"}
GPU1 = {"gpu": "1", "uuid": "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a", "model": "NVIDIA H100 80GB HBM3"}


def key(name: str, **labels: str):
    return (name, tuple(sorted(labels.items())))


def expected_h100(**extra) -> dict:
    out = {}
    for gpu, (dram, sm, tx, rx), (temperature, watts) in (
        (GPU0, (0.823167, 0.412877, 183926741, 2417851639), (47.0, 512.347)),
        (GPU1, (0.817042, 0.405319, 179205316, 2399127485), (44.0, 498.12)),
    ):
        out[key(S.GPU_DRAM_BANDWIDTH_UTILIZATION, method="dcgm", **gpu, **extra)] = dram
        out[key(S.GPU_SM_ACTIVE, method="dcgm", **gpu, **extra)] = sm
        out[key(S.GPU_PCIE_TX, **gpu, **extra)] = float(tx)
        out[key(S.GPU_PCIE_RX, **gpu, **extra)] = float(rx)
        out[key(S.GPU_MEMORY_USED, **gpu, **extra)] = 74424.0 * MIB
        # the health fields of dcgm-exporter's default counters
        out[key(S.GPU_TEMPERATURE, **gpu, **extra)] = temperature
        out[key(S.GPU_POWER_DRAW, **gpu, **extra)] = watts
        out[key(S.GPU_CLOCK, clock="sm", **gpu, **extra)] = 1980e6
        out[key(S.GPU_CLOCK, clock="memory", **gpu, **extra)] = 2619e6
        out[key(S.GPU_PCIE_REPLAYS, **gpu, **extra)] = 0.0
        out[key(S.GPU_LAST_XID, **gpu, **extra)] = 0.0
        out[key(S.GPU_REMAPPED_ROWS, error="corrected", **gpu, **extra)] = 0.0
        out[key(S.GPU_REMAPPED_ROWS, error="uncorrected", **gpu, **extra)] = 0.0
        out[key(S.GPU_ROW_REMAP_FAILURE, **gpu, **extra)] = 0.0
    return out


def test_h100_page_maps_to_canonical_gpu_signals():
    out = normalise_dcgm(parse_exposition(H100))
    assert out == expected_h100()
    # dcgm-exporter's workload labels (pod/namespace/container on GPU 0) are not carried over.
    assert all("pod" not in dict(labels) and "namespace" not in dict(labels) for _, labels in out)


def test_extra_labels_and_selective_parse():
    from kvdoctor.exporter.collectors.dcgm import WANTED

    assert normalise_dcgm(parse_exposition(H100, WANTED), {"pod": "me"}) == expected_h100(pod="me")


def test_mig_instances_are_skipped_for_the_whole_gpu():
    out = normalise_dcgm(parse_exposition(MIG))
    gpu = {"gpu": "0", "uuid": "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"}  # this page has no modelName
    assert out == {
        key(S.GPU_DRAM_BANDWIDTH_UTILIZATION, method="dcgm", **gpu): 0.690789,  # not the instance's 0.800339
        key(S.GPU_PCIE_TX, **gpu): 33011804.0,
        key(S.GPU_PCIE_RX, **gpu): 97863601.0,
        key(S.GPU_MEMORY_USED, **gpu): 4845.0 * MIB,
    }


def test_framebuffer_total_when_exported():
    out = normalise_dcgm(parse_exposition('DCGM_FI_DEV_FB_TOTAL{gpu="3",UUID="GPU-x",modelName="NVIDIA L4"} 23034\n'))
    assert out == {key(S.GPU_MEMORY_TOTAL, gpu="3", uuid="GPU-x", model="NVIDIA L4"): 23034.0 * MIB}


ADDED_FIELDS = """\
DCGM_FI_DEV_ENFORCED_POWER_LIMIT{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 350.000000
DCGM_FI_DEV_MAX_SM_CLOCK{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 1980
DCGM_FI_DEV_MAX_MEM_CLOCK{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 2619
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 5
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 0
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 17
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 1
DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 1
DCGM_FI_DEV_PCIE_LINK_GEN{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 3
DCGM_FI_DEV_PCIE_LINK_WIDTH{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 8
DCGM_FI_DEV_PCIE_MAX_LINK_GEN{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 5
DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 16
DCGM_FI_DEV_MEMORY_TEMP{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 9223372036854775794
DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-z",modelName="NVIDIA H100 80GB HBM3"} 9223372036854775794
"""


def test_fields_added_to_dcgm_exporters_counters_map_too_and_blanks_are_skipped():
    out = normalise_dcgm(parse_exposition(ADDED_FIELDS))
    gpu = {"gpu": "2", "uuid": "GPU-z", "model": "NVIDIA H100 80GB HBM3"}
    assert out == {
        key(S.GPU_POWER_LIMIT, **gpu): 350.0,
        key(S.GPU_MAX_CLOCK, clock="sm", **gpu): 1980e6,
        key(S.GPU_MAX_CLOCK, clock="memory", **gpu): 2619e6,
        key(S.GPU_ECC_ERRORS, error="corrected", scope="volatile", **gpu): 5.0,
        key(S.GPU_ECC_ERRORS, error="uncorrected", scope="volatile", **gpu): 0.0,
        key(S.GPU_ECC_ERRORS, error="corrected", scope="aggregate", **gpu): 17.0,
        key(S.GPU_ECC_ERRORS, error="uncorrected", scope="aggregate", **gpu): 1.0,
        key(S.GPU_ROW_REMAP_PENDING, **gpu): 1.0,
        key(S.GPU_PCIE_LINK_GENERATION, **gpu): 3.0,
        key(S.GPU_PCIE_LINK_WIDTH, **gpu): 8.0,
        key(S.GPU_PCIE_LINK_MAX_GENERATION, **gpu): 5.0,
        key(S.GPU_PCIE_LINK_MAX_WIDTH, **gpu): 16.0,
    }  # the GPU temperature left blank by DCGM (an unsupported field) is not a temperature


@pytest.mark.parametrize("field", ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"])
def test_the_clock_event_mask_becomes_the_throttle_reason_state_set(field):
    out = normalise_dcgm(parse_exposition(f'{field}{{gpu="0",UUID="GPU-x",modelName="NVIDIA L4"}} 68\n'))  # 0x44
    states = {dict(labels)["reason"]: v for (name, labels), v in out.items() if name == S.GPU_CLOCK_THROTTLE_REASON}
    assert states == {reason: 0.0 for _, reason in S.CLOCK_THROTTLE_REASONS} | {
        "sw_power_cap": 1.0,
        "hw_thermal_slowdown": 1.0,
    }
    assert all(dict(labels)["uuid"] == "GPU-x" for _, labels in out)


@pytest.fixture
def server(fake_server):
    return fake_server()


def test_over_http_with_the_engine_collectors_failure_reasons(server):
    server.routes["/metrics"] = respond(H100.encode())
    collector = dcgm_collector(ExporterSettings(dcgm_url=server.url(""), pod="pod-a", nvml=False))
    try:
        assert isinstance(collector, DcgmCollector)
        assert collector.collect().samples == expected_h100(pod="pod-a")
        server.routes["/metrics"] = respond(b"oops\n", status=500)
        with pytest.raises(SourceError) as caught:
            collector.collect()
        assert caught.value.reason == "http_500"
        server.routes["/metrics"] = respond(b"<html>dcgm is down</html>\n", content_type="text/html")
        with pytest.raises(SourceError) as caught:
            collector.collect()
        assert caught.value.reason == "parse_error"
        server.routes["/metrics"] = respond(b'DCGM_FI_DEV_ENC_UTIL{gpu="0",UUID="GPU-x"} 0\n')
        with pytest.raises(SourceError) as caught:
            collector.collect()
        assert caught.value.reason == "no_dcgm_fields"
    finally:
        collector.close()


def test_no_url_is_not_applicable():
    with pytest.raises(NotApplicable):
        DcgmCollector(None).collect()
    with pytest.raises(NotApplicable):
        dcgm_collector(ExporterSettings(nvml=False))


def test_gpu_filter_keeps_only_the_pods_gpus(server):
    """dcgm-exporter reports the whole node; the sidecar keeps the GPUs its engine uses."""
    server.routes["/metrics"] = respond(H100.encode())
    only_gpu1 = DcgmCollector(server.url("/metrics"), gpu_filter=lambda gpus: [g for g in gpus if g[1] == GPU1["uuid"]])
    try:
        samples = only_gpu1.collect().samples
    finally:
        only_gpu1.close()
    assert samples and all(dict(labels)["uuid"] == GPU1["uuid"] for _, labels in samples)
    assert len(samples) == len(expected_h100()) // 2


def test_settings_gpu_filter_reaches_the_dcgm_collector():
    collector = dcgm_collector(ExporterSettings(dcgm_url="http://127.0.0.1:9/metrics", gpu_filter="uuids:GPU-x"))
    try:
        assert collector._filter([(0, "GPU-x", "H100"), (1, "GPU-y", "H100")]) == [(0, "GPU-x", "H100")]
    finally:
        collector.close()
