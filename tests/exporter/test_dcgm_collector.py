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
    for gpu, (dram, sm, tx, rx) in (
        (GPU0, (0.823167, 0.412877, 183926741, 2417851639)),
        (GPU1, (0.817042, 0.405319, 179205316, 2399127485)),
    ):
        out[key(S.GPU_DRAM_BANDWIDTH_UTILIZATION, method="dcgm", **gpu, **extra)] = dram
        out[key(S.GPU_SM_ACTIVE, method="dcgm", **gpu, **extra)] = sm
        out[key(S.GPU_PCIE_TX, **gpu, **extra)] = float(tx)
        out[key(S.GPU_PCIE_RX, **gpu, **extra)] = float(rx)
        out[key(S.GPU_MEMORY_USED, **gpu, **extra)] = 74424.0 * MIB
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
        server.routes["/metrics"] = respond(b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x"} 40\n')
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
