"""The rendered sidecar: it starts the real exporter with exactly its command, args and env; the
GPU-visibility wiring (engine hook -> shared file -> --gpu-filter) works end to end; the README's
copy-paste snippet is what the named templates render."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from kvdoctor.exporter.gpu_filter import GpuFilterPending, make_gpu_filter, parse_gpu_filter
from tests.helm.chart import CHART_DIR, ROOT, arg_value, prometheus_seconds, rendered_command, replaced
from tests.support import tools
from tests.support.processes import http_ok
from tests.support.servers import respond
from tests.support.tools import requires_helm

pytestmark = requires_helm

FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "idle.txt"
POD_NAME = "kvdoctor-test-pod"
U0 = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
U1 = "GPU-1f2e3d4c-0000-1111-2222-333344445555"
U2 = "GPU-2badc0de-0000-1111-2222-333344445555"
NODE = [(0, U0, "NVIDIA H100 80GB HBM3"), (1, U1, "NVIDIA H100 80GB HBM3"), (2, U2, "NVIDIA H100 80GB HBM3")]


# ------------------------------------------------------------------- the real exporter process


@pytest.fixture
def engine_metrics_server(fake_server):
    """A local stand-in for the engine: serves a real vLLM 0.32 /metrics capture (idle.txt)."""
    return fake_server({"/metrics": respond(FIXTURE.read_bytes())}).url("/metrics")


def container_env(container: dict) -> dict[str, str]:
    """The container's environment as the kubelet would set it (downward API: the pod name)."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = POD_NAME
        else:
            raise AssertionError(f"the test does not know how to resolve env {var}")
    return env


@pytest.mark.slow
def test_rendered_sidecar_starts_the_real_exporter(helm, engine_metrics_server, spawn, tmp_path):
    rendered = helm.render("default")
    _, engine = rendered.container("engine")
    _, sidecar = rendered.container("kvdoctor")
    argv = sidecar["command"] + sidecar["args"]
    assert argv[:2] == ["kvdoctor", "exporter"]
    # What the sidecar scrapes is the engine container's port on the pod's loopback.
    engine_port = engine["ports"][0]["containerPort"]
    assert arg_value(argv, "--engine-url") == f"http://127.0.0.1:{engine_port}/metrics"
    port = tools.free_port()
    argv = replaced(argv, port=port, engine_url=engine_metrics_server)
    exporter = spawn(rendered_command(argv, container_env(sidecar), tmp_path))
    base = f"http://127.0.0.1:{port}"
    exporter.wait_for(http_ok(f"{base}/readyz"), timeout=60, what="ready on /readyz (the readiness probe's path)")
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200  # the liveness probe's path
    metrics = httpx.get(f"{base}/metrics", timeout=5)
    assert metrics.status_code == 200
    text = metrics.text
    assert re.search(r'^kvdoctor_kv_cache_usage_ratio\{[^}]*pod="kvdoctor-test-pod"', text, re.M), text[:2000]
    assert re.search(r"^kvdoctor_source_up\{[^}]*\} 1(\.0)?$", text, re.M)


# --------------------------------------------------------------------------- GPU visibility


@pytest.mark.parametrize("scenario, mode", [("default", "engineFile"), ("engine-processes", "engineProcesses")])
def test_every_rendered_gpu_filter_is_one_the_exporter_accepts(helm, scenario, mode):
    _, sidecar = helm.render(scenario).container("kvdoctor")
    parse_gpu_filter(arg_value(sidecar["args"], "--gpu-filter"))


@pytest.mark.parametrize(
    "values, expected",
    [
        (("--set", "sidecar.gpuVisibility.mode=all"), "all"),
        (("--set", "sidecar.gpuVisibility.mode=auto"), "auto"),
        (
            ("--set", "sidecar.gpuVisibility.mode=uuids", "--set", f"sidecar.gpuVisibility.uuids={{{U1},{U2}}}"),
            f"uuids:{U1},{U2}",
        ),
    ],
)
def test_gpu_visibility_modes_become_gpu_filters(helm, values, expected):
    rendered = helm.render("default", *values)
    pod, sidecar = rendered.container("kvdoctor")
    _, engine = rendered.container("engine")
    assert arg_value(sidecar["args"], "--gpu-filter") == expected
    assert str(parse_gpu_filter(expected)) == expected
    assert "lifecycle" not in engine and not pod.get("shareProcessNamespace")
    assert "kvdoctor-run" not in {v["name"] for v in pod["volumes"]}


def test_engine_file_mode_shares_one_file_between_the_engine_hook_and_the_sidecar(helm):
    pod, sidecar = helm.render("default").container("kvdoctor")
    _, engine = helm.render("default").container("engine")
    spec = parse_gpu_filter(arg_value(sidecar["args"], "--gpu-filter"))
    assert spec.mode == "file"
    hook = engine["lifecycle"]["postStart"]["exec"]["command"]
    assert hook[-1] == spec.path
    directory = str(Path(spec.path).parent)
    engine_mount = next(m for m in engine["volumeMounts"] if m["mountPath"] == directory)
    sidecar_mount = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == directory)
    assert engine_mount["name"] == sidecar_mount["name"] and sidecar_mount.get("readOnly") is True
    assert "readOnly" not in engine_mount
    volume = next(v for v in pod["volumes"] if v["name"] == engine_mount["name"])
    assert "emptyDir" in volume
    assert not pod.get("shareProcessNamespace")


def test_engine_processes_mode_shares_the_process_namespace(helm):
    rendered = helm.render("engine-processes")
    pod, sidecar = rendered.container("kvdoctor")
    _, engine = rendered.container("engine")
    assert pod["shareProcessNamespace"] is True
    assert arg_value(sidecar["args"], "--gpu-filter") == "engine-processes"
    assert "lifecycle" not in engine


@pytest.mark.parametrize("expose, visible", [(True, "all"), (False, None)])
def test_sidecar_sees_node_gpus_through_nvml_only(helm, expose, visible):
    _, sidecar = helm.render(
        "default", "--set", f"sidecar.gpuVisibility.exposeNodeGpus={str(expose).lower()}"
    ).container("kvdoctor")
    env = container_env(sidecar)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == visible
    if expose:
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # NVML, not CUDA
    assert env["KVDOCTOR_POD"] == POD_NAME


def test_dcgm_url_can_name_the_pods_own_node(helm):
    url = "http://$(HOST_IP):9400/metrics"
    _, sidecar = helm.render("default", "--set", f"sidecar.dcgmUrl={url}").container("kvdoctor")
    assert arg_value(sidecar["args"], "--dcgm-url") == url
    host_ip = next(e for e in sidecar["env"] if e["name"] == "HOST_IP")
    assert host_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    _, without = helm.render("default").container("kvdoctor")
    assert "HOST_IP" not in {e["name"] for e in without["env"]}
    assert arg_value(without["args"], "--dcgm-url") is None


def _fake_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _run_hook(command: list[str], target: Path, bin_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    sh = shutil.which("sh")
    assert sh, "needs /bin/sh"
    argv = [sh, *command[1:-1], str(target)]  # the same script, writing under tmp instead of /var/run
    assert command[0] == "/bin/sh"
    path = f"{bin_dir}:{os.path.dirname(sh)}:/usr/bin:/bin"
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": path, **env})


@pytest.mark.parametrize(
    "nvidia_smi, env, kept",
    [
        # nvidia-smi in the engine container lists the GPUs the container was given.
        (f"printf '%s\\n' {U1} {U2}\n", {}, [1, 2]),
        # No nvidia-smi: the device plugin's NVIDIA_VISIBLE_DEVICES (envvar strategy) ...
        (None, {"NVIDIA_VISIBLE_DEVICES": f"{U2}"}, [2]),
        # ... or node indices (deviceIDStrategy=index) ...
        (None, {"NVIDIA_VISIBLE_DEVICES": "0,2"}, [0, 2]),
        # nvidia-smi failing falls back the same way.
        ("exit 9\n", {"NVIDIA_VISIBLE_DEVICES": f"{U0}"}, [0]),
    ],
)
def test_engine_hook_output_drives_the_sidecars_gpu_filter(helm, tmp_path, nvidia_smi, env, kept):
    _, engine = helm.render("default").container("engine")
    _, sidecar = helm.render("default").container("kvdoctor")
    command = engine["lifecycle"]["postStart"]["exec"]["command"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi is not None:
        _fake_tool(bin_dir, "nvidia-smi", nvidia_smi)
    target = tmp_path / "run" / "engine-gpus"
    target.parent.mkdir()
    result = _run_hook(command, target, bin_dir, env)
    assert result.returncode == 0, result.stderr
    assert not target.with_name("engine-gpus.tmp").exists()
    spec = parse_gpu_filter(arg_value(sidecar["args"], "--gpu-filter"))
    flt = make_gpu_filter(f"file:{target}" if spec.mode == "file" else str(spec))
    assert [g[0] for g in flt(NODE)] == kept


def test_engine_hook_volume_mounts_strategy_lists_the_device_files(helm, tmp_path):
    _, engine = helm.render("default").container("engine")
    devices = tmp_path / "nvidia-container-devices"
    devices.mkdir()
    (devices / U1).touch()
    target = tmp_path / "engine-gpus"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    result = _run_hook(
        engine["lifecycle"]["postStart"]["exec"]["command"], target, bin_dir, {"NVIDIA_VISIBLE_DEVICES": str(devices)}
    )
    assert result.returncode == 0
    assert [g[0] for g in make_gpu_filter(f"file:{target}")(NODE)] == [1]


def test_engine_hook_without_any_source_writes_nothing_and_never_fails(helm, tmp_path):
    _, engine = helm.render("default").container("engine")
    command = engine["lifecycle"]["postStart"]["exec"]["command"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    target = tmp_path / "engine-gpus"
    assert _run_hook(command, target, bin_dir, {}).returncode == 0
    assert not target.exists()
    with pytest.raises(GpuFilterPending):
        make_gpu_filter(f"file:{target}")(NODE)
    # Not even an unwritable directory makes the hook fail (a failing postStart kills the engine).
    assert (
        _run_hook(command, tmp_path / "missing" / "engine-gpus", bin_dir, {"NVIDIA_VISIBLE_DEVICES": U0}).returncode
        == 0
    )


# -------------------------------------------------------------------- the sidecar-only snippet

SNIPPET = re.compile(r"<!-- sidecar-snippet:start -->\s*```yaml\n(.*?)```\s*<!-- sidecar-snippet:end -->", re.S)

SNIPPET_TEMPLATE = """\
{{- $kv := dict "sidecar" .Values.sidecar "image" .Values.image "tag" .Chart.AppVersion }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: snippet
data:
  container: |
{{ include "kvdoctor.sidecar.container" $kv | indent 4 }}
  volumes: |
{{ include "kvdoctor.sidecar.volumes" $kv | indent 4 }}
  engineMounts: |
{{ include "kvdoctor.engine.volumeMounts" $kv | indent 4 }}
  engineLifecycle: |
{{ include "kvdoctor.engine.lifecycle" $kv | indent 4 }}
"""


@pytest.fixture
def named_templates(helm, tmp_path):
    """What the named templates a parent chart includes render, for the chart's default values."""
    chart = tmp_path / "kvdoctor"
    shutil.copytree(helm.chart.path, chart, symlinks=False)
    (chart / "templates" / "zz-snippet.yaml").write_text(SNIPPET_TEMPLATE)
    out = helm.run("template", "snippet", str(chart), "--show-only", "templates/zz-snippet.yaml").stdout
    data = yaml.safe_load(out)["data"]
    return {key: yaml.safe_load(value) for key, value in data.items()}


def test_readme_snippet_is_what_the_named_templates_render(named_templates):
    readme = (CHART_DIR / "README.md").read_text()
    match = SNIPPET.search(readme)
    assert match, "README.md lacks the <!-- sidecar-snippet:start/end --> block"
    snippet = yaml.safe_load(match.group(1))
    engine, *sidecars = snippet["containers"]
    assert sidecars == named_templates["container"]
    assert engine["lifecycle"] == named_templates["engineLifecycle"]
    assert engine["volumeMounts"] == named_templates["engineMounts"]
    assert snippet["volumes"] == named_templates["volumes"]


def test_sidecar_only_pod_monitor_scrapes_at_the_snippets_interval(helm, named_templates):
    (sidecar,) = named_templates["container"]
    monitor = helm.render("sidecar-only").one("PodMonitor")
    interval = float(arg_value(sidecar["args"], "--interval"))
    assert prometheus_seconds(monitor["spec"]["podMetricsEndpoints"][0]["interval"]) == interval
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in sidecar["ports"]}


# -------------------------------------------------------------------- the model reaches the sidecar


def sidecar_model(rendered) -> tuple[str | None, dict, dict]:
    """(--served-model, the sidecar's volume mounts by name, its env) of a rendering."""
    _, sidecar = rendered.container("kvdoctor")
    mounts = {m["name"]: m for m in sidecar["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    return arg_value(sidecar["args"], "--served-model"), mounts, env


def test_engine_model_reaches_the_sidecar_with_the_model_volume_read_only(helm):
    rendered = helm.render("default", "--set", "engine.model=Qwen/Qwen3-8B")
    model, mounts, env = sidecar_model(rendered)
    assert model == "Qwen/Qwen3-8B"
    assert mounts["model-cache"] == {"name": "model-cache", "mountPath": "/models", "readOnly": True}
    _, engine = rendered.container("engine")
    engine_env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["HF_HOME"] == engine_env["HF_HOME"] == "/models/huggingface"  # the same cache the engine fills
    assert not any(m.get("readOnly") for m in engine["volumeMounts"] if m["name"] == "model-cache")


def test_sidecar_model_overrides_engine_model(helm):
    model, _, _ = sidecar_model(helm.render("default", "--set", "sidecar.model=meta-llama/Llama-3.1-8B-Instruct"))
    assert model == "meta-llama/Llama-3.1-8B-Instruct"


def test_the_served_model_the_chart_passes_is_one_the_real_exporter_resolves(helm):
    """The default engine.model is in the built-in catalogue: the sidecar has its shape offline."""
    from kvdoctor.sources.model_files import load_model

    model, _, _ = sidecar_model(helm.render("default"))
    assert model and load_model(model, environ={"HF_HUB_CACHE": "/nonexistent"}).num_layers > 0


def test_sidecar_only_a_value_names_the_model_and_its_volume(helm, tmp_path):
    """engine.enabled=false: the named templates a parent chart includes take sidecar.model and
    sidecar.modelVolume.name (the parent pod's volume), and nothing without them."""
    chart = tmp_path / "kvdoctor"
    shutil.copytree(helm.chart.path, chart, symlinks=False)
    (chart / "templates" / "zz-snippet.yaml").write_text(SNIPPET_TEMPLATE)

    def container(*values: str) -> dict:
        args = ["template", "snippet", str(chart), "--show-only", "templates/zz-snippet.yaml"]
        args += ["-f", helm.values_file("sidecar-only"), *values]
        return yaml.safe_load(yaml.safe_load(helm.run(*args).stdout)["data"]["container"])[0]

    bare = container("--set", "engine.enabled=false")
    assert arg_value(bare["args"], "--served-model") is None
    assert not any(m["name"] == "models" for m in bare["volumeMounts"])
    named = container(
        "--set",
        "engine.enabled=false",
        "--set",
        "sidecar.model=Qwen/Qwen3-30B-A3B",
        "--set",
        "sidecar.modelVolume.name=models",
    )
    assert arg_value(named["args"], "--served-model") == "Qwen/Qwen3-30B-A3B"
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in named["volumeMounts"]
    assert {"name": "HF_HOME", "value": "/models/huggingface"} in named["env"]
