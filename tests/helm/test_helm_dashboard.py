"""The rendered dashboard container starts the real `kvdoctor dashboard` with exactly its command,
args and environment, reads its users from the file the Secret is mounted as, and answers the
probes' paths without credentials."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests import tools
from tests.helm.chart import arg_value
from tests.tools import requires_helm

pytestmark = [pytest.mark.slow, requires_helm]


def test_rendered_dashboard_starts_with_users_from_the_mounted_secret(helm, tmp_path):
    rendered = helm.render("custom-labels")
    pod, dash = rendered.container("dashboard")
    argv = dash["command"] + dash["args"]
    assert argv[:2] == ["kvdoctor", "dashboard"]
    exe = Path(sys.executable).with_name("kvdoctor")

    # The Secret, mounted where the pod mounts it (here: under tmp_path).
    env = {e["name"]: e["value"] for e in dash["env"]}
    auth_file = Path(env["KVDOCTOR_DASHBOARD_AUTH_FILE"])
    mount = next(m for m in dash["volumeMounts"] if str(auth_file).startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    secret = next(s for s in rendered.all("Secret") if s["metadata"]["name"] == volume["secret"]["secretName"])
    item = volume["secret"]["items"][0]
    local_auth = tmp_path / "auth" / item["path"]
    local_auth.parent.mkdir()
    local_auth.write_bytes(base64.b64decode(secret["data"][item["key"]]))
    env["KVDOCTOR_DASHBOARD_AUTH_FILE"] = str(local_auth)
    env["MPLCONFIGDIR"] = str(tmp_path / "matplotlib")

    port = tools.free_port()
    prometheus = f"http://127.0.0.1:{tools.free_port()}"  # nothing listens: the dashboard must start anyway
    args = [
        f"--port={port}"
        if a.startswith("--port=")
        else f"--prometheus={prometheus}"
        if a.startswith("--prometheus=")
        else a
        for a in argv[1:]
    ]
    assert arg_value(args, "--host") == "0.0.0.0"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KVDOCTOR_")}
    full_env.update(env)
    log = tmp_path / "dashboard.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(exe), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def probe(path: str):
            def ok():
                if proc.poll() is not None:
                    raise AssertionError(f"dashboard exited {proc.returncode}:\n{log.read_text()}")
                return httpx.get(f"{base}{path}", timeout=2).status_code == 200

            return ok

        for probe_name in ("livenessProbe", "readinessProbe"):
            path = dash[probe_name]["httpGet"]["path"]
            tools.wait_until(probe(path), timeout=60, what=f"the dashboard's {path} without credentials")
        assert httpx.get(f"{base}/", timeout=10).status_code == 401
        user, _, password = local_auth.read_text().strip().partition(":")
        assert httpx.get(f"{base}/", auth=(user, password), timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
