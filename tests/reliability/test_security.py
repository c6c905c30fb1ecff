"""Security: what listens where, who gets in, and what the JSON API accepts.

- ``kvdoctor exporter``, ``kvdoctor dashboard`` and ``kvdoctor demo`` listen on loopback only
  unless told otherwise, checked on the real processes' listening sockets (not on the settings);
  ``--host 0.0.0.0`` does open the exporter to every interface.
- Dashboard basic auth through the real command: the page and the callback endpoint (where the
  data flows) refuse a missing or wrong password, accept the right one from the variable or a
  mounted file; a malformed users list fails at start without echoing any password.
- ``/api/v1`` inputs against a live exporter: odd values for ``seconds`` (huge, signed, hex,
  underscores, non-ASCII digits, overlong, repeated) are a 4xx or a bounded 200, never a 5xx;
  wrong methods and paths are refused; an oversized request line or header does not take the
  server down; the largest window answer stays bounded by the store's own bounds.

(tests/dashboard/test_settings_auth.py covers the auth functions and every GET route in-process;
tests/exporter/test_exporter_app.py the plain out-of-range ``seconds`` values.)
"""

from __future__ import annotations

import base64
import ipaddress
import socket
import time

import httpx
import psutil
import pytest

from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.server import serve_in_thread
from kvdoctor.exporter.settings import ExporterSettings
from tests.exporter.exporter_fakes import StaticCollector, engine_samples, gpu_samples
from tests.support.processes import Process, kvdoctor


def command(*args: str, env: dict | None = None) -> Process:
    """``python -m kvdoctor ARGS`` with no KVDOCTOR_* from the caller's environment: "by default"
    means no configuration at all."""
    return kvdoctor(*args, env=env, clean_env=True, merge_stderr=False)


def listening(process: Process, expected: int, timeout: float = 60.0) -> list[tuple[str, int]]:
    """The (address, port) pairs ``process`` listens on, once there are ``expected`` of them."""
    ps = psutil.Process(process.pid)

    def probe():
        found = sorted(
            {(c.laddr.ip, c.laddr.port) for c in ps.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        )
        return found if len(found) >= expected else None

    return process.wait_for(probe, timeout=timeout, what=f"{expected} listening sockets")


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


# ------------------------------------------------------------------------------------ binding


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, sockets",
    [
        (("exporter", "--port", "0", "--no-collector.nvml"), 1),
        (("dashboard", "--exporter", "http://127.0.0.1:9", "--port", "0"), 1),
        (("demo", "--port", "0", "--dashboard-port", "0", "--status-every", "0"), 3),  # engine, exporter, dashboard
    ],
    ids=["exporter", "dashboard", "demo"],
)
def test_every_server_listens_on_loopback_only_by_default(args, sockets, spawn):
    found = listening(spawn(command(*args)), sockets)
    assert len(found) == sockets, found
    assert all(is_loopback(address) for address, _ in found), f"{args[0]} listens on {found}"


@pytest.mark.slow
def test_the_exporter_listens_on_every_interface_only_when_configured(spawn):
    found = listening(spawn(command("exporter", "--port", "0", "--no-collector.nvml", "--host", "0.0.0.0")), 1)
    assert [address for address, _ in found] == ["0.0.0.0"]


# --------------------------------------------------------------------------- dashboard basic auth


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def start_dashboard(spawn, env: dict) -> str:
    """The dashboard's URL, once it printed it."""
    dashboard = spawn(command("dashboard", "--exporter", "http://127.0.0.1:9", "--port", "0", env=env))
    return dashboard.wait_for_line(r"^kvdoctor dashboard: (http://\S+)").group(1).rstrip("/")


CALLBACK = {
    "output": "live-badge.children",
    "outputs": {"id": "live-badge", "property": "children"},
    "inputs": [{"id": "live-health", "property": "data", "value": None}],
    "changedPropIds": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("source", ["variable", "file"])
def test_dashboard_basic_auth_guards_pages_and_callbacks(source, tmp_path, spawn):
    if source == "variable":
        env = {"KVDOCTOR_DASHBOARD_USERS": "ann:s3cret-pw,bob:other"}
    else:
        secret = tmp_path / "users"
        secret.write_text("# mounted secret\nann:s3cret-pw\n")
        env = {"KVDOCTOR_DASHBOARD_AUTH_FILE": str(secret)}
    url = start_dashboard(spawn, env)
    with httpx.Client(timeout=10) as client:
        for headers in ({}, basic("ann", "wrong"), basic("mallory", "s3cret-pw"), {"Authorization": "Basic ???"}):
            page = client.get(url + "/", headers=headers)
            assert page.status_code == 401 and "Basic" in page.headers["WWW-Authenticate"]
            assert "kvdoctor" not in page.text.lower().replace('realm="kvdoctor"', "")
            callback = client.post(url + "/_dash-update-component", json=CALLBACK, headers=headers)
            assert callback.status_code == 401
        assert client.get(url + "/", headers=basic("ann", "s3cret-pw")).status_code == 200
        authorised = client.post(url + "/_dash-update-component", json=CALLBACK, headers=basic("ann", "s3cret-pw"))
        assert authorised.status_code != 401


@pytest.mark.slow
def test_a_malformed_users_list_fails_at_start_without_echoing_passwords(run_cli):
    result = run_cli(
        "dashboard",
        "--exporter",
        "http://127.0.0.1:9",
        "--port",
        "0",
        env={"KVDOCTOR_DASHBOARD_USERS": "ann:hunter2-secret,bob-without-password"},
    )
    assert result.rc == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "entry 2" in result.stderr and "hunter2" not in result.stderr


# ----------------------------------------------------------------------------------- /api/v1 inputs

MAX_WINDOW = 120
MAX_SERIES = 200
MAX_SNAPSHOTS = 150


@pytest.fixture(scope="module")
def live_exporter():
    settings = ExporterSettings(
        interval=0.05, nvml=False, max_window_seconds=MAX_WINDOW, max_series=MAX_SERIES, max_snapshots=MAX_SNAPSHOTS
    )
    exporter = Exporter(
        settings, [StaticCollector("engine", engine_samples), StaticCollector("gpu", lambda step: gpu_samples(8, step))]
    )
    for _ in range(MAX_SNAPSHOTS + 20):  # the store at its bounds
        exporter.run_cycle()
    http = serve_in_thread(create_app(exporter), "127.0.0.1", 0)
    yield http
    http.stop()
    exporter.stop()


@pytest.mark.parametrize(
    "query",
    [
        "seconds=1" + "0" * 40,
        "seconds=-0",
        "seconds=+60",
        "seconds=0x10",
        "seconds=60_000",
        "seconds=%D9%A1%D9%A2",
        "seconds=1e2",
        "seconds=%2060%20",
        "seconds=60%00",
        "seconds=NaN",
        "seconds=inf",
        "seconds=" + "9" * 5000,
        "seconds=60&seconds=100000",
        "seconds[]=60",
        "seconds=%ff%fe",
    ],
)
def test_window_odd_seconds_are_refused_or_bounded_never_a_server_error(live_exporter, query):
    resp = httpx.get(f"{live_exporter.url}/api/v1/window?{query}", timeout=10)
    assert resp.status_code < 500, resp.text[:200]
    if resp.status_code == 200:
        payload = resp.json()
        assert 1 <= payload["seconds"] <= MAX_WINDOW
        assert len(payload["series"]) <= MAX_SERIES and len(payload["timestamps"]) <= MAX_SNAPSHOTS
    else:
        assert resp.status_code == 422 and resp.headers["content-type"].startswith("application/json")


def test_the_largest_window_answer_is_bounded_by_the_store(live_exporter):
    resp = httpx.get(f"{live_exporter.url}/api/v1/window", params={"seconds": MAX_WINDOW}, timeout=10)
    assert resp.status_code == 200
    payload = resp.json()
    assert len(payload["timestamps"]) <= MAX_SNAPSHOTS and len(payload["series"]) <= MAX_SERIES
    # ~25 bytes per value at most (a float and its comma), plus the labels
    assert len(resp.content) < MAX_SNAPSHOTS * MAX_SERIES * 25 + 200 * MAX_SERIES


@pytest.mark.parametrize(
    "method, path, expected",
    [
        ("POST", "/api/v1/window", 405),
        ("DELETE", "/metrics", 405),
        ("PUT", "/api/v1/diagnosis", 405),
        ("GET", "/api/v1/../../etc/passwd", 404),
        ("GET", "/api/v2/window", 404),
        ("GET", "/%2e%2e/%2e%2e/etc/passwd", 404),
    ],
)
def test_methods_and_paths_outside_the_api_are_refused(live_exporter, method, path, expected):
    with socket.create_connection(("127.0.0.1", live_exporter.port), timeout=10) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    assert int(head.split(b" ", 2)[1]) == expected, head[:200]


@pytest.mark.parametrize("what", ["request_line", "header"])
def test_an_oversized_request_does_not_take_the_exporter_down(live_exporter, what):
    big = "a" * 200_000
    with socket.create_connection(("127.0.0.1", live_exporter.port), timeout=10) as sock:
        if what == "request_line":
            request = f"GET /api/v1/window?seconds=60&pad={big} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        else:
            request = f"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {big}\r\nConnection: close\r\n\r\n"
        try:
            sock.sendall(request.encode())
            answer = sock.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""  # refusing to read it is fine
    if answer:
        assert not answer.startswith(b"HTTP/1.1 5"), answer[:200]
    time.sleep(0.1)
    assert httpx.get(f"{live_exporter.url}/metrics", timeout=10).status_code == 200
