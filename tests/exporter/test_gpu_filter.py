"""The --gpu-filter policy: which of the GPUs NVML sees the exporter reports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvdoctor.exporter.gpu_filter import (
    ALL,
    GpuFilterError,
    GpuFilterPending,
    GpuFilterSpec,
    make_gpu_filter,
    namespace_pids,
    nvml_compute_pids,
    parse_device_list,
    parse_gpu_filter,
    select_auto,
    select_devices,
    select_engine_processes,
)
from kvdoctor.signals.collection import SourceError
from tests.support.errors import one_line_error

U0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
U1 = "GPU-1f2e3d4c-0000-1111-2222-333344445555"
U2 = "GPU-2badc0de-0000-1111-2222-333344445555"
U3 = "GPU-2bee0000-0000-1111-2222-333344445555"
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
NODE = [(0, U0, H100), (1, U1, H100), (2, U2, H100), (3, U3, H100)]
MIXED = [(0, U0, H100), (1, U1, L4), (2, U2, H100), (3, U3, L4)]


def indices(gpus):
    return [g[0] for g in gpus]


# ------------------------------------------------------------------------------ parse_gpu_filter


@pytest.mark.parametrize(
    "text, expected",
    [
        ("auto", GpuFilterSpec("auto")),
        ("  ALL ", GpuFilterSpec("all")),
        ("engine-processes", GpuFilterSpec("engine-processes")),
        (f"uuids:{U0},{U2}", GpuFilterSpec("uuids", uuids=(U0, U2))),
        (f"uuids: {U0} , ", GpuFilterSpec("uuids", uuids=(U0,))),
        ("uuids:GPU-0a1b", GpuFilterSpec("uuids", uuids=("GPU-0a1b",))),
        ("file:/var/run/kvdoctor/engine-gpus", GpuFilterSpec("file", path="/var/run/kvdoctor/engine-gpus")),
    ],
)
def test_parse_gpu_filter_accepts_each_mode(text, expected):
    spec = parse_gpu_filter(text)
    assert spec == expected
    assert parse_gpu_filter(str(spec)) == spec  # str() gives back a value the flag accepts


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "unknown value"),
        ("some", "unknown value 'some'"),
        ("uuids:", "needs at least one UUID"),
        ("uuids:0,1", "'0' is not a GPU UUID"),
        ("file:", "needs a path"),
        ("all:0", "takes no argument"),
        ("engine-processes:1234", "takes no argument"),
    ],
)
def test_parse_gpu_filter_rejects_with_one_clear_line(text, says):
    assert says in one_line_error(GpuFilterError, parse_gpu_filter, text)


# ---------------------------------------------------------------------------- device lists


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, ALL),
        ("all", ALL),
        ("ALL\n", ALL),
        ("", ()),
        ("none", ()),
        ("void", ()),
        ("0,2", ("0", "2")),
        (f"{U0}\n{U1}\n", (U0, U1)),  # nvidia-smi --query-gpu=uuid --format=csv,noheader
        (f'"{U0}", {U1}', (U0, U1)),
        ("  \n\n", ()),
    ],
)
def test_parse_device_list(text, expected):
    assert parse_device_list(text) == expected


def test_parse_device_list_rejects_all_mixed_with_devices():
    with pytest.raises(GpuFilterError, match="mixes all/none/void"):
        parse_device_list("all,0")


@pytest.mark.parametrize(
    "entries, kept, unmatched",
    [
        (("2", "0"), [0, 2], []),  # kept in NVML order, whatever the list's order
        ((U1,), [1], []),
        ((U1.upper(),), [1], []),  # UUIDs compare without case
        (("GPU-1f2e",), [1], []),  # a unique prefix, as CUDA accepts
        (("GPU-2b",), [], ["GPU-2b"]),  # ambiguous prefix (U2 and U3) names nothing
        (("7", U3), [3], ["7"]),  # out of range
        ((f"MIG-{U2}/1/0",), [2], []),  # legacy MIG name carries its parent GPU
        (("MIG-7c0ffee0-0000-1111-2222-333344445555",), [], ["MIG-7c0ffee0-0000-1111-2222-333344445555"]),
        ((), [], []),
    ],
)
def test_select_devices_by_entry(entries, kept, unmatched):
    got, missing = select_devices(NODE, entries)
    assert indices(got) == kept
    assert missing == unmatched


def test_select_devices_cuda_semantics_stop_at_first_invalid_entry():
    got, missing = select_devices(NODE, ("0", "2", "-1", "1"), cuda_semantics=True)
    assert indices(got) == [0, 2]
    assert missing == ["-1", "1"]


def test_select_devices_without_cuda_semantics_skips_invalid_entries():
    got, missing = select_devices(NODE, ("0", "2", "-1", "1"))
    assert indices(got) == [0, 1, 2]
    assert missing == ["-1"]


def test_select_devices_by_uuid_only_ignores_indices():
    got, missing = select_devices(NODE, ("1", U2), by_index=False)
    assert indices(got) == [2] and missing == ["1"]


# ------------------------------------------------------------------------------------- auto


@pytest.mark.parametrize(
    "environ, kept",
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "1,3"}, [1, 3]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": f"{U2}"}, [2]),
        ({"CUDA_VISIBLE_DEVICES": "3,9,0"}, [3]),
        # NVIDIA_VISIBLE_DEVICES is applied by the container runtime before NVML enumerates (and
        # renumbers from 0): filtering by it again would be wrong, so auto ignores it.
        ({"NVIDIA_VISIBLE_DEVICES": "3"}, [0, 1, 2, 3]),
    ],
)
def test_auto_is_what_cuda_would_give_this_process(environ, kept):
    assert indices(select_auto(NODE, environ)) == kept


def test_auto_refuses_indices_when_cuda_order_is_unknown_on_mixed_models():
    with pytest.raises(GpuFilterError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        select_auto(MIXED, {"CUDA_VISIBLE_DEVICES": "0,1"})


@pytest.mark.parametrize(
    "environ, kept",
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0, 1]),
        ({"CUDA_VISIBLE_DEVICES": f"{U1},{U3}"}, [1, 3]),  # UUIDs do not depend on the order
    ],
)
def test_auto_on_mixed_models_with_a_known_order(environ, kept):
    assert indices(select_auto(MIXED, environ)) == kept


def test_auto_filter_reports_an_unresolvable_environment_as_a_source_error():
    flt = make_gpu_filter("auto", environ={"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(SourceError) as err:
        flt(MIXED)
    assert err.value.reason == "gpu_filter_invalid"


def test_auto_filter_reads_the_environment_it_was_given():
    assert indices(make_gpu_filter("auto", environ={"CUDA_VISIBLE_DEVICES": "2"})(NODE)) == [2]
    assert indices(make_gpu_filter(GpuFilterSpec("all"))(NODE)) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------ uuids


def test_uuids_filter_keeps_the_listed_gpus():
    assert indices(make_gpu_filter(f"uuids:{U3},{U1}")(NODE)) == [1, 3]


def test_uuids_filter_keeps_the_found_ones_and_warns_once_about_the_others(caplog):
    flt = make_gpu_filter(f"uuids:{U1},GPU-deadbeef")
    with caplog.at_level("WARNING", logger="kvdoctor.exporter.gpu_filter"):
        assert indices(flt(NODE)) == [1]
        assert indices(flt(NODE)) == [1]
    warnings = [r for r in caplog.records if "GPU-deadbeef" in r.getMessage()]
    assert len(warnings) == 1


def test_uuids_filter_matching_nothing_is_an_error_not_silence():
    flt = make_gpu_filter("uuids:GPU-deadbeef")
    with pytest.raises(SourceError) as err:
        flt(NODE)
    assert err.value.reason == "gpu_not_found"
    assert U0 in str(err.value)  # says what NVML does see


# ------------------------------------------------------------------------------------- file


def test_file_filter_is_pending_until_the_engine_writes_its_list(tmp_path):
    path = tmp_path / "engine-gpus"
    flt = make_gpu_filter(f"file:{path}")
    with pytest.raises(GpuFilterPending) as err:
        flt(NODE)
    assert err.value.reason == "gpu_filter_pending" and str(path) in str(err.value)
    path.write_text(f"{U2}\n{U3}\n")
    assert indices(flt(NODE)) == [2, 3]
    path.write_text(f"{U0}\n")  # re-read every cycle: an engine restarted on another GPU
    assert indices(flt(NODE)) == [0]


@pytest.mark.parametrize(
    "content, kept",
    [
        ("all\n", [0, 1, 2, 3]),
        ("void\n", []),
        ("\n", []),  # the engine sees no GPU (a CPU engine)
        ("1,2\n", [1, 2]),  # node indices (device plugin with deviceIDStrategy=index)
        (f"{U1}\nGPU-deadbeef\n", [1]),
    ],
)
def test_file_filter_contents(tmp_path, content, kept):
    path = tmp_path / "engine-gpus"
    path.write_text(content)
    assert indices(make_gpu_filter(GpuFilterSpec("file", path=str(path)))(NODE)) == kept


def test_file_filter_naming_only_unseen_gpus_says_the_sidecar_may_be_blind(tmp_path):
    path = tmp_path / "engine-gpus"
    path.write_text("GPU-deadbeef\n")
    with pytest.raises(SourceError) as err:
        make_gpu_filter(f"file:{path}")(NODE[:1])
    assert err.value.reason == "gpu_not_found" and "NVIDIA_VISIBLE_DEVICES=all" in str(err.value)


def test_file_filter_with_a_malformed_list(tmp_path):
    path = tmp_path / "engine-gpus"
    path.write_text("all,3\n")
    with pytest.raises(SourceError) as err:
        make_gpu_filter(f"file:{path}")(NODE)
    assert err.value.reason == "gpu_filter_invalid"


def test_file_filter_on_a_node_where_nvml_sees_nothing_reports_nothing(tmp_path):
    path = tmp_path / "engine-gpus"
    path.write_text(f"{U1}\n")
    assert make_gpu_filter(f"file:{path}")([]) == []


# ------------------------------------------------------------------------- engine-processes


@pytest.mark.parametrize(
    "processes, engine, kept",
    [
        ({0: [900], 2: [101, 102], 3: [103]}, {101, 102, 103, 1}, [2, 3]),
        ({0: [900], 1: [901]}, {101}, []),
        ({}, {101}, []),
        ({1: [101]}, set(), []),
    ],
)
def test_select_engine_processes(processes, engine, kept):
    assert indices(select_engine_processes(NODE, processes, engine)) == kept


def test_engine_processes_filter_keeps_gpus_running_the_pods_processes():
    on_gpu = {0: [4242], 1: [], 2: [77], 3: []}
    flt = make_gpu_filter("engine-processes", engine_pids=lambda: {1, 77, 78}, gpu_pids=lambda index: on_gpu[index])
    assert indices(flt(NODE)) == [2]


def test_engine_processes_pending_while_no_process_is_on_a_gpu():
    flt = make_gpu_filter("engine-processes", engine_pids=lambda: {1, 77}, gpu_pids=lambda index: [])
    with pytest.raises(GpuFilterPending, match="no process runs on any GPU yet"):
        flt(NODE)


def test_engine_processes_explains_pids_from_another_namespace():
    # Drivers that do not translate PIDs report host PIDs, which are not in the pod's /proc.
    flt = make_gpu_filter("engine-processes", engine_pids=lambda: {1, 77}, gpu_pids=lambda index: [310_000 + index])
    with pytest.raises(GpuFilterPending) as err:
        flt(NODE)
    assert "shareProcessNamespace" in str(err.value) and "310000" in str(err.value)


def test_namespace_pids_lists_live_processes_without_the_excluded(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = namespace_pids(exclude=(os.getpid(),))
        assert child.pid in pids and os.getpid() not in pids
    finally:
        child.kill()
        child.wait()
    fake = tmp_path / "proc"
    for name in ("1", "42", "self", "sys", "4242"):
        (fake / name).mkdir(parents=True)
    assert namespace_pids(str(fake), exclude=(42,)) == {1, 4242}
    assert namespace_pids(str(tmp_path / "missing")) == set()


# ------------------------------------------------------------------- NVML process boundary


def test_nvml_compute_pids_without_a_driver_is_empty():
    # No GPU here: NVML is not initialised (or has no library), which means "cannot say".
    assert nvml_compute_pids(0) == []


def test_nvml_compute_pids_reads_compute_and_mps_processes(monkeypatch):
    import pynvml

    class Proc:
        def __init__(self, pid):
            self.pid = pid

    def mps(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: ("handle", index))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [Proc(10 + handle[1]), Proc(20)])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", mps)
    assert nvml_compute_pids(3) == [13, 20]


# ---------------------------------------------------------------------------------- the CLI


@pytest.mark.slow
@pytest.mark.parametrize(
    "value, says",
    [
        ("bogus", "--gpu-filter (KVDOCTOR_GPU_FILTER): unknown value 'bogus'"),
        ("uuids:0", "'0' is not a GPU UUID"),
    ],
)
def test_exporter_refuses_a_bad_gpu_filter_in_one_line(run_cli, value, says):
    result = run_cli("exporter", "--gpu-filter", value, "--port", "0", timeout=60)
    assert result.rc == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
