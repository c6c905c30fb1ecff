"""`kvdoctor stress` against the real vLLM, recorded by a real exporter subprocess.

Small settings on the ~4,000-token KV cache: a 256-token prompt and 256 generated tokens hold
~512 tokens a request, so x8 fills the pool and the run stops there. Set
KVDOCTOR_UPDATE_DOCS_IMG=1 to copy the figure to docs/img/stress-vllm-cpu.png (the README's).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time

import pytest

from kvdoctor.rules.verdicts import VERDICTS
from tests.e2e.kvdoctor_stack import ROOT, ExporterProcess
from tests.support.tools import requires_vllm

pytestmark = [pytest.mark.slow, requires_vllm]

DOCS_IMG = ROOT / "docs" / "img" / "stress-vllm-cpu.png"


def png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_stress_against_real_vllm_writes_the_report_and_finds_saturation(vllm_server, tmp_path, run_cli):
    exporter = ExporterProcess(vllm_server.metrics_url, tmp_path, pod="e2e-stress").start()
    out = tmp_path / "report"
    try:
        started = time.monotonic()
        result = run_cli(
            "stress",
            "--engine-url",
            vllm_server.url,
            "--exporter",
            exporter.url,
            "--prompt-tokens",
            "256",
            "--max-tokens",
            "256",
            "--max-concurrency",
            "16",
            "--step-seconds",
            "10",
            "-o",
            out,
            timeout=240,
        )
        seconds = time.monotonic() - started
    finally:
        exporter.stop()
    print(f"\nstress ran {seconds:.0f} s\n{result.stderr}{result.stdout}")
    assert result.rc == 0, result.stderr

    assert sorted(p.name for p in out.iterdir()) == ["kv-latency.png", "report.html", "summary.json", "trace.om"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["endpoint"]["model"] == vllm_server.model and summary["endpoint"]["kind"] == "completions"
    assert abs(summary["endpoint"]["prompt_tokens"] - 256) <= 6
    assert summary["latency_source"] == "engine"
    steps = summary["steps"]
    assert [s["concurrency"] for s in steps] == [1, 2, 4, 8, 16][: len(steps)]
    assert all(s["requests_failed"] == 0 and s["tokens"] > 0 for s in steps), steps
    # KV usage grows with concurrency, and the run stopped when the pool was full
    kv = [s["kv_usage_max"] for s in steps]
    assert kv[0] < 0.3 < kv[-1] and kv[-1] == max(kv), kv
    assert summary["saturation"]["reached"], summary["saturation"]
    assert summary["saturation"]["concurrency"] == steps[-1]["concurrency"] <= 16
    # A preemption frees the preempted request's blocks before the next sample, so in this small
    # pool the sampled usage around one has read anywhere from 0.81 to 1.0: a preempting step is
    # checked for a mostly full pool, a ceiling stop for the ceiling it names.
    saturation = summary["saturation"]
    assert saturation["reason"] in ("preemptions", "kv_ceiling"), saturation
    if saturation["reason"] == "kv_ceiling":
        assert saturation["kv_usage"] >= 0.85, saturation
    assert 0 < saturation["kv_usage"] <= kv[-1] and kv[-1] >= 0.7, (saturation, kv)
    assert summary["verdict"]["pattern"] in ("bandwidth_bound", "preemption_onset", "no_knee")
    assert summary["verdict"]["knee"]["points"] >= 10

    width, height = png_size(out / "kv-latency.png")
    assert width >= 1000 and height >= 500
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and summary["verdict"]["headline"][:40] in page.replace("&#x27;", "'")
    # the trace replays through the same decision tree
    replay = run_cli("diagnose", "--replay", out / "trace.om", "--json", timeout=60)
    assert replay.rc in (0, 1), replay.stderr
    assert json.loads(replay.stdout)["verdict"] in VERDICTS
    if os.environ.get("KVDOCTOR_UPDATE_DOCS_IMG"):
        DOCS_IMG.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "kv-latency.png", DOCS_IMG)
