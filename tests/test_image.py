"""The real images: scripts/build-image.sh builds them without Docker (podman, runc, a Debian base
made here), and the sidecar image runs as uid 65532 on a read-only root filesystem, behind TLS and
basic auth, scraping a stand-in engine; it is at most 200 MB and carries no dashboard dependency.
The dashboard image (the Dockerfile's second target) runs `kvdoctor dashboard`."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator

import bcrypt
import httpx
import pytest
import yaml

import kvdoctor
from tests.support.certificates import make_pki
from tests.support.processes import Completed, run
from tests.support.servers import respond
from tests.support.tools import ROOT, free_port, needs, wait_until

pytestmark = [pytest.mark.slow, needs("podman")]

MAX_SIDECAR_BYTES = 200 * 1000 * 1000
UID = "65532"
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "idle.txt"
DASHBOARD_ONLY = ("dash", "plotly", "matplotlib", "flask", "PIL", "tsdownsample")


def podman(*args: str, timeout: float = 120) -> Completed:
    return run(["podman", *args], timeout=timeout)


def run_args() -> list[str]:
    """What every `podman run` here needs: runc (crun fails on this kind of host), the limits the
    build script uses, and the host's network (the exporter binds a loopback port of its own)."""
    return ["--runtime", "runc", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=1024:1024", "--network", "host"]


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Both images built once by the script: {"sidecar": ref, "dashboard": ref}."""
    result = run(["bash", str(ROOT / "scripts/build-image.sh"), "--dashboard"], timeout=1800)
    assert result.rc == 0, result.stdout + result.stderr
    refs = dict(re.findall(r"^build-image: (sidecar|dashboard)\s+(\S+)", result.stdout, re.M))
    assert set(refs) == {"sidecar", "dashboard"}, result.stdout
    return refs


def inspect(ref: str) -> dict:
    found = podman("image", "inspect", ref)
    assert found.rc == 0, found.stderr
    return json.loads(found.stdout)[0]


def test_the_sidecar_image_is_small_non_root_and_without_the_dashboard(images):
    image = inspect(images["sidecar"])
    assert image["Size"] <= MAX_SIDECAR_BYTES, f"{image['Size'] / 1e6:.0f} MB"
    assert image["Config"]["User"] == f"{UID}:{UID}"
    assert not image["Config"].get("Healthcheck"), "Kubernetes probes; no HEALTHCHECK"
    assert image["Config"]["Entrypoint"] == ["kvdoctor"]
    probe = "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if u.find_spec(m)])"
    found = podman("run", "--rm", *run_args(), "--entrypoint", "/opt/kvdoctor/bin/python", images["sidecar"],
                   "-c", probe, *DASHBOARD_ONLY, "pip", "setuptools", "bcrypt", "numpy")  # fmt: skip
    assert found.rc == 0, found.stderr
    assert found.stdout.split() == ["bcrypt", "numpy"]


def test_the_charts_default_images_are_the_ones_built(images):
    values = yaml.safe_load((ROOT / "helm/kvdoctor/values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "helm/kvdoctor/Chart.yaml").read_text())
    assert chart["appVersion"] == kvdoctor.__version__
    assert images["sidecar"] == f"localhost/{values['image']['repository']}:{chart['appVersion']}"
    assert images["dashboard"] == f"localhost/{values['dashboard']['image']['repository']}:{chart['appVersion']}"


@pytest.fixture
def container() -> Iterator[list[str]]:
    """Started containers (by id) are removed after the test."""
    started: list[str] = []
    yield started
    for cid in started:
        podman("rm", "--force", "--time", "2", cid)


def test_the_sidecar_runs_read_only_as_65532_behind_tls_and_basic_auth(images, container, fake_server, tmp_path):
    pki = make_pki(tmp_path / "pki")
    web = tmp_path / "web"
    web.mkdir()
    for source in (pki.server_cert, pki.server_key):
        shutil.copy(source, web / source.name)
    hashed = bcrypt.hashpw(b"scrape", bcrypt.gensalt(rounds=6)).decode()
    (web / "web-config.yml").write_text(
        f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  prom: '{hashed}'\n"
    )
    for path in web.iterdir():
        path.chmod(0o644)  # readable by uid 65532 through the bind mount
    engine = fake_server({"/metrics": respond(FIXTURE.read_bytes())}).url("/metrics")
    port = free_port()
    started = podman(
        "run", "--detach", "--read-only", *run_args(), "--volume", f"{web}:/etc/kvdoctor/web:ro",
        images["sidecar"], "exporter", "--host", "127.0.0.1", f"--port={port}", "--no-collector.nvml",
        f"--engine-url={engine}", "--web.config.file=/etc/kvdoctor/web/web-config.yml", "--pod=image-test",
    )  # fmt: skip
    assert started.rc == 0, started.stderr
    cid = started.stdout.strip()
    container.append(cid)
    base = f"https://127.0.0.1:{port}"
    with httpx.Client(verify=pki.client_context(), timeout=5) as https:

        def ready() -> bool:
            state = podman("inspect", "--format", "{{.State.Running}}", cid).stdout.strip()
            assert state == "true", podman("logs", cid).stderr[-2000:]
            try:
                return https.get(f"{base}/readyz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=90, what="the container's /readyz")
        assert https.get(f"{base}/healthz").json() == {"status": "ok"}  # probes need no password
        assert https.get(f"{base}/metrics").status_code == 401
        page = wait_until(
            lambda: (
                (r := https.get(f"{base}/metrics", auth=("prom", "scrape"))).status_code == 200
                and 'kvdoctor_source_up{pod="image-test",source="engine"} 1' in r.text
                and r.text
            ),
            timeout=30,
            what="the engine scraped",
        )
    revision = run(["git", "rev-parse", "HEAD"], cwd=ROOT).stdout.strip()
    build_info = re.search(r"^kvdoctor_build_info\{(.*)\} 1", page, re.M).group(1)
    assert f'version="{kvdoctor.__version__}"' in build_info
    assert not revision or f'revision="{revision}' in build_info, build_info
    # The exporter is the container's PID 1; its uids inside the container (rootless: the host maps them).
    status = podman("exec", cid, "cat", "/proc/1/status").stdout
    assert re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split() == [UID] * 4, status
    assert podman("top", cid, "user").stdout.split()[1:] == ["kvdoctor"]
    assert podman("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", cid).stdout.strip() == "true"
    assert podman("exec", cid, "touch", "/opt/kvdoctor/written").rc != 0


def test_the_dashboard_image_runs_the_dashboard(images, container):
    image = inspect(images["dashboard"])
    assert image["Config"]["User"] == f"{UID}:{UID}"
    shown = podman("run", "--rm", "--read-only", *run_args(), images["dashboard"], "dashboard", "--help")
    assert shown.rc == 0, shown.stderr
    assert "--prometheus" in shown.stdout
    probe = "import dash, plotly, matplotlib; print('ok')"
    found = podman("run", "--rm", *run_args(), "--entrypoint", "/opt/kvdoctor/bin/python", images["dashboard"],
                   "-c", probe)  # fmt: skip
    assert found.stdout.strip() == "ok", found.stderr
