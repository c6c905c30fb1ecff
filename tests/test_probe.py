"""kvdoctor/probe.py: which scheme a port speaks, told within its budget, against real servers
(plain HTTP, HTTPS, HTTPS that wants a client certificate, a port that never answers, none)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from kvdoctor import probe
from kvdoctor.errors import UsageError
from tests.support import servers
from tests.support.certificates import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server_context(pki, *, client_certificate: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    if client_certificate:  # TLS 1.2: the server refuses the handshake itself, with an alert
        context.load_verify_locations(str(pki.ca))
        context.verify_mode = ssl.CERT_REQUIRED
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port
    return port


@pytest.mark.parametrize("first", [probe.TLS, probe.HTTP])
def test_a_plain_http_server_speaks_http_whichever_is_asked_first(first):
    with servers.FakeServer() as plain:
        assert probe.speaks("127.0.0.1", _port(plain.url()), first=first) == probe.HTTP


@pytest.mark.parametrize("first", [probe.TLS, probe.HTTP])
def test_an_https_server_speaks_https_whichever_is_asked_first(pki, first):
    with servers.FakeServer(tls=_server_context(pki)) as secure:
        assert probe.speaks("127.0.0.1", _port(secure.url()), first=first) == probe.TLS


def test_an_https_server_that_refuses_a_client_without_certificate_still_speaks_https(pki):
    with servers.FakeServer(tls=_server_context(pki, client_certificate=True)) as secure:
        assert probe.speaks("127.0.0.1", _port(secure.url()), first=probe.HTTP) == probe.TLS


def test_a_port_that_never_answers_decides_nothing_within_the_budget():
    with silent_port() as port:
        started = time.monotonic()
        assert probe.speaks("127.0.0.1", port, budget=0.4) is None
        assert time.monotonic() - started < 1.0


def test_a_refused_port_decides_nothing_at_once():
    started = time.monotonic()
    assert probe.speaks("127.0.0.1", _port(servers.refusing_url())) is None
    assert time.monotonic() - started < 0.5


def test_check_scheme_names_the_flag_and_the_url_to_give(pki):
    with servers.FakeServer() as plain:
        wrong = plain.url("/x").replace("http://", "https://")
        with pytest.raises(UsageError) as told:
            probe.check_scheme(wrong, "--exporter")
    netloc = urlsplit(wrong).netloc
    assert str(told.value) == (
        f"--exporter {wrong}: the server at {netloc} speaks plain HTTP, not HTTPS; give {plain.url('/x')}"
    )
    with servers.FakeServer(tls=_server_context(pki)) as secure:
        wrong = secure.url().replace("https://", "http://")
        with pytest.raises(UsageError, match=r"speaks HTTPS \(TLS\), not plain HTTP; give https://"):
            probe.check_scheme(wrong, "--engine-url")
        probe.check_scheme(secure.url(), "--engine-url")  # the right scheme: nothing to say


@pytest.mark.parametrize(
    "url",
    [None, "", "ftp://127.0.0.1:21/", "http://127.0.0.1:notaport/", "https://a..b:8000/", "http://[::1]:1/"],
)
def test_check_scheme_leaves_what_it_cannot_decide_to_the_command(url):
    probe.check_scheme(url, "--exporter", budget=0.2)
