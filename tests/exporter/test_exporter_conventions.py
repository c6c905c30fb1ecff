"""What every Prometheus exporter serves, served here: ``kvdoctor_build_info``, the standard
``process_*`` metrics, and OpenMetrics to a scraper that asks for it (over a socket and in process alike),
checked by promtool and by a strict OpenMetrics parser."""

from __future__ import annotations

import math
import os
import platform
import resource
import subprocess
import time

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

import kvdoctor
from kvdoctor.exporter.accounting import build_revision
from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.exposition import to_openmetrics, wants_openmetrics
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textformat import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE
from tests.exporter.test_exporter_app import serving
from tests.support.exporter_rig import parse_page
from tests.support.tools import ROOT, needs, promtool

PROMETHEUS_ACCEPT = (  # what Prometheus 2.x sends
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


served = pytest.fixture(scope="module", name="served")(serving)


def page_of(exporter):
    return parse_page(exporter.metrics_bytes().decode())


# --------------------------------------------------------------------------------- build info


def test_build_info_names_the_version_the_revision_and_python(served):
    exporter, _ = served
    (labels,) = [dict(labels) for (name, labels), value in page_of(exporter).items() if name == S.BUILD_INFO]
    assert labels == {
        "version": kvdoctor.__version__,
        "revision": build_revision(),
        "python": platform.python_version(),
    }
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # an editable install in a checkout: the commit checked out
        assert labels["revision"] == head.stdout.strip()


def test_revision_comes_from_the_package_file_then_git_then_unknown(tmp_path):
    package = tmp_path / "kvdoctor"
    package.mkdir()
    assert build_revision(package) == "unknown"
    git = tmp_path / ".git"
    (git / "refs/heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text("# pack-refs\n" + "a" * 40 + " refs/heads/main\n")
    assert build_revision(package) == "a" * 40
    (git / "refs/heads/main").write_text("b" * 40 + "\n")
    assert build_revision(package) == "b" * 40
    (git / "HEAD").write_text("c" * 40 + "\n")  # a detached HEAD
    assert build_revision(package) == "c" * 40
    (package / "REVISION").write_text("d" * 12 + "-dirty\n")  # what the image build writes
    assert build_revision(package) == "d" * 12 + "-dirty"


# ----------------------------------------------------------------------------- process metrics


def test_process_metrics_describe_this_process(served):
    exporter, _ = served
    exporter.run_cycle()
    page = {name: value for (name, labels), value in page_of(exporter).items() if name.startswith("process_")}
    me = psutil.Process(os.getpid())
    with me.oneshot():
        memory, cpu, fds, created = me.memory_info(), me.cpu_times(), me.num_fds(), me.create_time()
    assert set(page) == set(S.PROCESS_SIGNALS)
    assert page[S.PROCESS_RESIDENT_MEMORY] == pytest.approx(memory.rss, rel=0.2)
    assert page[S.PROCESS_VIRTUAL_MEMORY] == pytest.approx(memory.vms, rel=0.2)
    assert page[S.PROCESS_CPU_SECONDS] == pytest.approx(cpu.user + cpu.system, abs=1.0)
    assert page[S.PROCESS_START_TIME] == pytest.approx(created, abs=1.0)
    assert page[S.PROCESS_START_TIME] < time.time()
    assert abs(page[S.PROCESS_OPEN_FDS] - fds) <= 3
    assert page[S.PROCESS_MAX_FDS] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_cpu_seconds_grow_with_work(served):
    exporter, _ = served
    exporter.run_cycle()
    before = page_of(exporter)[(S.PROCESS_CPU_SECONDS, frozenset())]
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    exporter.run_cycle()
    assert page_of(exporter)[(S.PROCESS_CPU_SECONDS, frozenset())] >= before + 0.25


# ------------------------------------------------------------------------------- OpenMetrics


@pytest.mark.parametrize(
    "accept, openmetrics",
    [
        (PROMETHEUS_ACCEPT, True),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text; version=0.0.1", True),
        ("", False),
        ("text/plain", False),
        ("*/*", False),
        ("text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5", False),
        ("application/openmetrics-text;version=2.0.0", False),
        ("application/openmetrics-text;q=0", False),
        ("application/openmetrics-text;q=bad", False),
    ],
)
def test_negotiation(accept, openmetrics):
    assert wants_openmetrics(accept) is openmetrics


def same_samples(classic: str, openmetrics: str) -> None:
    """The OpenMetrics page parses strictly and carries exactly the classic page's samples."""
    families = list(parse_openmetrics(openmetrics))
    samples = {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}
    expected = parse_page(classic)
    assert samples.keys() == expected.keys()
    assert all(math.isclose(samples[k], v) or (math.isnan(samples[k]) and math.isnan(v)) for k, v in expected.items())
    counters = {f.name for f in families if f.type == "counter"}
    assert "kvdoctor_preemptions" in counters and S.PROCESS_CPU_SECONDS.removesuffix("_total") in counters
    assert not any(name.endswith("_total") for name in counters)


@pytest.mark.parametrize("path", ["server", "app"])
def test_openmetrics_when_asked_classic_text_otherwise(served, path):
    exporter, handle = served
    if path == "server":
        get = lambda accept: httpx.get(f"{handle.url}/metrics", headers={"accept": accept} if accept else {})  # noqa: E731
    else:
        app = TestClient(create_app(exporter))
        get = lambda accept: app.get("/metrics", headers={"accept": accept} if accept else {})  # noqa: E731
    classic = get("")
    assert classic.headers["content-type"] == CONTENT_TYPE
    assert classic.content == exporter.metrics_bytes()
    assert get("text/plain;version=0.0.4").content == exporter.metrics_bytes()
    om = get(PROMETHEUS_ACCEPT)
    assert om.headers["content-type"] == OPENMETRICS_CONTENT_TYPE
    assert om.text.endswith("\n# EOF\n")
    same_samples(classic.text, om.text)


def test_openmetrics_is_converted_once_per_page(served):
    exporter, handle = served
    with httpx.Client() as http:
        first = http.get(f"{handle.url}/metrics", headers={"accept": PROMETHEUS_ACCEPT}).content
        assert http.get(f"{handle.url}/metrics", headers={"accept": PROMETHEUS_ACCEPT}).content == first
        exporter.run_cycle()
        later = http.get(f"{handle.url}/metrics", headers={"accept": PROMETHEUS_ACCEPT}).content
    assert later == to_openmetrics(exporter.metrics_bytes())


def test_a_page_before_the_first_cycle_is_valid_openmetrics():
    assert to_openmetrics(b"# kvdoctor: no collection cycle has completed yet\n") == b"# EOF\n"
    assert list(parse_openmetrics("# EOF\n")) == []


@needs("promtool")
def test_promtool_accepts_both_formats(served, tmp_path):
    """``promtool check metrics`` lints the classic page; Prometheus' own OpenMetrics parser
    (``promtool tsdb create-blocks-from openmetrics``, which wants a timestamp on each sample)
    reads the OpenMetrics page."""
    exporter, _ = served
    exporter.run_cycle()
    classic = exporter.metrics_bytes()
    lint = subprocess.run([promtool(), "check", "metrics"], input=classic, capture_output=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    now = int(time.time())
    lines = to_openmetrics(classic).decode().splitlines()
    stamped = "".join(f"{line}\n" if line.startswith("#") else f"{line} {now}\n" for line in lines)
    (tmp_path / "page.om").write_text(stamped)
    blocks = subprocess.run(
        [promtool(), "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "page.om"), str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert blocks.returncode == 0, blocks.stdout + blocks.stderr
    assert f"{len(parse_page(classic.decode()))}" in blocks.stdout.split()  # every sample became a series
