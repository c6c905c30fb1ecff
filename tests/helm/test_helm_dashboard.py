"""The rendered dashboard container starts the real `kvdoctor dashboard` with exactly its command,
args and environment, reads its users from the file the Secret is mounted as, and answers the
probes' paths without credentials."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

from tests.helm.chart import arg_value, rendered_command, replaced
from tests.support import tools
from tests.support.processes import http_ok
from tests.support.servers import refusing_url
from tests.support.tools import requires_helm

pytestmark = [pytest.mark.slow, requires_helm]


def test_rendered_dashboard_starts_with_users_from_the_mounted_secret(helm, spawn, tmp_path):
    rendered = helm.render("custom-labels")
    pod, dash = rendered.container("dashboard")
    argv = dash["command"] + dash["args"]
    assert argv[:2] == ["kvdoctor", "dashboard"]

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
    args = replaced(argv, port=port, prometheus=refusing_url())  # nothing listens: the dashboard must start anyway
    assert arg_value(args, "--host") == "0.0.0.0"
    dashboard = spawn(rendered_command(args, env, tmp_path))
    base = f"http://127.0.0.1:{port}"
    for probe_name in ("livenessProbe", "readinessProbe"):
        path = dash[probe_name]["httpGet"]["path"]
        dashboard.wait_for(http_ok(f"{base}{path}"), timeout=60, what=f"answering {path} without credentials")
    assert httpx.get(f"{base}/", timeout=10).status_code == 401
    user, _, password = local_auth.read_text().strip().partition(":")
    assert httpx.get(f"{base}/", auth=(user, password), timeout=10).status_code == 200
