"""TLS, client certificates, basic auth, the rate limit and the configured headers, on real
sockets: every path, ``/metrics`` included, holds the same rules. Certificates come from a CA
made in the test (tests/support/certificates.py); a real Prometheus scrapes the exporter over
TLS with a client certificate and basic auth."""

from __future__ import annotations

import base64
import re
import shutil
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest

from kvdoctor.exporter import web_guard
from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.server import ServerHandle, serve_in_thread
from tests.exporter.test_exporter_app import make_exporter
from tests.support.certificates import PKI, make_pki
from tests.support.tools import needs, wait_until

PASSWORD = "correct horse"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
MTLS = TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: kvdoctor-test-ca.crt\n"
AUTH = f"basic_auth_users:\n  prometheus: '{HASH}'\n"
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def serve(pki, tmp_path) -> Iterator[Callable[[str], ServerHandle]]:
    """serve(web config text) -> a running exporter (one cycle done) with that configuration; the
    config file sits next to the certificates (relative paths)."""
    started = []

    def start(text: str) -> ServerHandle:
        config = pki.folder / f"web-{len(started)}-{tmp_path.name}.yml"
        config.write_text(text)
        exporter = make_exporter(web_config_file=str(config))
        exporter.run_cycle()
        handle = serve_in_thread(create_app(exporter), "127.0.0.1", 0)
        started.append((handle, exporter))
        return handle

    yield start
    for handle, exporter in started:
        handle.stop()
        exporter.stop()


def client(pki: PKI, cert: tuple[Path, Path] | None = None, **kw) -> httpx.Client:
    return httpx.Client(verify=pki.client_context(cert), timeout=10, **kw)


def handshake(handle: ServerHandle, context: ssl.SSLContext) -> bytes:
    """A raw TLS connection: handshake, one GET /healthz, the first bytes of the answer."""
    raw = socket.create_connection(("127.0.0.1", handle.port), timeout=10)
    with raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return tls.recv(64)


def refused(handle: ServerHandle, context: ssl.SSLContext) -> bool:
    """True when the server closes the connection without one byte of HTTP. (asyncio closes a
    failed handshake without sending OpenSSL's alert, so the client sees an EOF or a reset.)"""
    try:
        return handshake(handle, context) == b""
    except OSError:  # ssl.SSLError (EOF in the handshake), ConnectionResetError
        return True


# ---------------------------------------------------------------------------------------- TLS


def test_tls_serves_every_path_over_https_and_refuses_plain_http(serve, pki):
    handle = serve(TLS)
    assert handle.url.startswith("https://")
    with client(pki) as https:
        for path in ("/metrics", "/healthz", "/api/v1/status"):
            assert https.get(handle.url + path).status_code == 200, path
    with pytest.raises(httpx.HTTPError):
        httpx.get(handle.url.replace("https://", "http://") + "/metrics", timeout=5)


def test_a_client_without_the_required_certificate_is_refused_in_the_handshake(serve, pki):
    handle = serve(MTLS)
    assert handshake(handle, pki.client_context(pki.client)).startswith(b"HTTP/1.1 200")
    assert refused(handle, pki.client_context())
    assert refused(handle, pki.client_context(pki.stranger))
    # TLS 1.2 sends the client certificate before the handshake ends: the handshake itself fails.
    old = pki.client_context()
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(OSError):
        socket_ = socket.create_connection(("127.0.0.1", handle.port), timeout=10)
        with socket_:
            old.wrap_socket(socket_, server_hostname="127.0.0.1")
    old.load_cert_chain(*map(str, pki.client))
    assert handshake(handle, old).startswith(b"HTTP/1.1 200")


def test_client_allowed_sans_closes_a_connection_whose_certificate_names_none_of_them(serve, pki):
    refused_sans = serve(MTLS + "  client_allowed_sans: [other.kvdoctor.test]\n")
    allowed = serve(MTLS + "  client_allowed_sans: [prometheus.kvdoctor.test, other.kvdoctor.test]\n")
    assert handshake(allowed, pki.client_context(pki.client)).startswith(b"HTTP/1.1 200")
    assert refused(refused_sans, pki.client_context(pki.client))


def test_min_version_refuses_older_clients(serve, pki):
    handle = serve(TLS + "  min_version: TLS13\n")
    old = pki.client_context()
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    assert refused(handle, old)
    assert handshake(handle, pki.client_context()).startswith(b"HTTP/1.1 200")


def test_rotated_certificate_files_serve_new_connections(serve, pki, tmp_path):
    folder = tmp_path / "certs"
    folder.mkdir()
    shutil.copy(pki.server_cert, folder / "tls.crt")
    shutil.copy(pki.server_key, folder / "tls.key")
    config = f"tls_server_config:\n  cert_file: {folder / 'tls.crt'}\n  key_file: {folder / 'tls.key'}\n"
    handle = serve(config)

    def serving_certificate() -> bytes:
        raw = socket.create_connection(("127.0.0.1", handle.port), timeout=10)
        with raw, pki.client_context().wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)

    first = serving_certificate()
    assert first == ssl.PEM_cert_to_DER_cert(pki.server_cert.read_text())
    cert, key = pki.new_server_certificate(f"rotated-{tmp_path.name}")
    (folder / "tls.key.new").write_bytes(key.read_bytes())
    (folder / "tls.crt.new").write_bytes(cert.read_bytes())
    (folder / "tls.key.new").replace(folder / "tls.key")
    (folder / "tls.crt.new").replace(folder / "tls.crt")
    assert serving_certificate() == ssl.PEM_cert_to_DER_cert(cert.read_text())
    # A broken replacement keeps the last good certificate.
    (folder / "tls.crt").write_text("not a certificate\n")
    assert serving_certificate() == ssl.PEM_cert_to_DER_cert(cert.read_text())


# ---------------------------------------------------------------------------------- basic auth


@pytest.mark.parametrize("path", ["/metrics", "/api/v1/status", "/api/v1/window", "/openapi.json"])
def test_a_missing_or_wrong_password_is_401_with_a_challenge_on_every_path(serve, pki, path):
    handle = serve(TLS + AUTH)
    with client(pki) as https:
        for auth in (None, ("prometheus", "wrong"), ("nobody", PASSWORD), ("prometheus", PASSWORD + "x" * 80)):
            answer = https.get(handle.url + path, auth=auth)
            assert answer.status_code == 401, (auth, answer.text)
            assert answer.headers["www-authenticate"].startswith("Basic")
        assert https.get(handle.url + path, auth=("prometheus", PASSWORD)).status_code == 200


def test_probes_answer_without_the_password_but_not_without_tls(serve, pki):
    handle = serve(MTLS + AUTH)
    with client(pki, pki.client) as https:
        assert https.get(handle.url + "/healthz").status_code == 200
        assert https.get(handle.url + "/readyz").status_code == 200
        assert https.get(handle.url + "/metrics").status_code == 401
    assert refused(handle, pki.client_context())


def test_basic_auth_without_tls_works_on_plain_http_and_takes_htpasswd_hashes(serve):
    htpasswd = HASH.replace("$2b$", "$2y$", 1)  # what `htpasswd -nB` writes
    handle = serve(AUTH + f"  oncall: '{htpasswd}'\n")
    assert handle.url.startswith("http://")
    assert httpx.get(handle.url + "/metrics", timeout=5).status_code == 401
    for user in ("prometheus", "oncall"):
        assert httpx.get(handle.url + "/metrics", auth=(user, PASSWORD), timeout=5).status_code == 200


def test_bcrypt_runs_once_per_credential_not_once_per_scrape(serve, pki, monkeypatch):
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(web_guard.bcrypt, "checkpw", lambda pw, h: calls.append(pw) or real(pw, h))
    handle = serve(TLS + AUTH)
    with client(pki, auth=("prometheus", PASSWORD)) as https:
        for _ in range(10):
            assert https.get(handle.url + "/metrics").status_code == 200
            assert https.get(handle.url + "/api/v1/status").status_code == 200
    with client(pki, auth=("prometheus", "wrong")) as https:
        for _ in range(5):
            assert https.get(handle.url + "/metrics").status_code == 401
    assert calls == [PASSWORD.encode(), b"wrong"]


def test_a_pipelined_scrape_waiting_for_bcrypt_is_answered_in_order(serve):
    handle = serve(AUTH)
    token = b"Basic " + base64.b64encode(b"prometheus:" + PASSWORD.encode())
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n\r\n" % token
    with socket.create_connection(("127.0.0.1", handle.port), timeout=10) as sock:
        sock.sendall(request * 3 + b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while received.count(b"HTTP/1.1 ") < 4 or not received.endswith(b"Unauthorized\n"):
            chunk = sock.recv(65536)
            assert chunk, received[-200:]
            received += chunk
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", received)
    assert statuses == [b"200", b"200", b"200", b"401"]


# --------------------------------------------------------------------- headers and rate limit


def test_configured_headers_are_on_every_answer(serve, pki):
    handle = serve(TLS + AUTH + "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    with client(pki) as https:
        for path, auth in (("/metrics", None), ("/metrics", ("prometheus", PASSWORD)), ("/healthz", None)):
            assert https.get(handle.url + path, auth=auth).headers["x-frame-options"] == "deny", path
        status = https.get(handle.url + "/api/v1/status", auth=("prometheus", PASSWORD))
        assert status.headers["x-frame-options"] == "deny"


def test_the_rate_limit_answers_429_past_the_burst_but_never_to_probes(serve):
    handle = serve("rate_limit:\n  interval: 1h\n  burst: 3\n")
    with httpx.Client(timeout=5) as http:
        codes = [http.get(handle.url + path).status_code for path in ["/metrics"] * 2 + ["/api/v1/status"] * 2]
        assert codes == [200, 200, 200, 429]
        assert http.get(handle.url + "/metrics").status_code == 429
        assert http.get(handle.url + "/healthz").status_code == 200


# ------------------------------------------------------------------------- real Prometheus


@pytest.mark.slow
@needs("prometheus")
def test_real_prometheus_scrapes_over_tls_with_a_client_certificate_and_basic_auth(serve, pki, prometheus_server):
    handle = serve(MTLS + AUTH)
    job = {
        "job_name": "kvdoctor",
        "scheme": "https",
        "tls_config": {
            "ca_file": str(pki.ca),
            "cert_file": str(pki.client_cert),
            "key_file": str(pki.client_key),
        },
        "basic_auth": {"username": "prometheus", "password": PASSWORD},
        "static_configs": [{"targets": [f"127.0.0.1:{handle.port}"]}],
    }
    wrong = {**job, "job_name": "wrong-password", "basic_auth": {"username": "prometheus", "password": "no"}}
    no_cert = {**job, "job_name": "no-client-cert", "tls_config": {"ca_file": str(pki.ca)}}
    prom = prometheus_server({"global": {"scrape_interval": "1s"}, "scrape_configs": [job, wrong, no_cert]})
    prom.wait_for('up{job="kvdoctor"} == 1')
    series = prom.wait_for('kvdoctor_source_up{job="kvdoctor"}')
    assert {s["metric"]["source"] for s in series} >= {"engine", "gpu"}
    assert prom.query_values('kvdoctor_build_info{job="kvdoctor"}') == [1.0]

    def refused() -> dict | None:
        health = {t["labels"]["job"]: t for t in prom.targets()}
        done = all(health[job]["health"] == "down" for job in ("wrong-password", "no-client-cert"))
        return health if done else None

    health = wait_until(refused, timeout=30, what="the wrong-password and no-client-cert jobs down")
    assert "401" in health["wrong-password"]["lastError"]
    assert health["kvdoctor"]["health"] == "up"
