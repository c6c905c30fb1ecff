"""kvdoctor.sources.http against a real HTTP server on loopback: the deadline over the whole answer,
the size cap, no redirects, and every failure as one SourceError line naming the server and the path."""

from __future__ import annotations

import json
import time

import pytest

from kvdoctor.signals.collection import SourceError
from kvdoctor.sources.http import HttpClient, check_base_url
from tests.support.servers import (
    JSON,
    FakeServer,
    declared_huge,
    gzip_bomb,
    gzipped,
    refusing_url,
    reset_mid_body,
    respond,
    stream,
    trickle,
)

TIMEOUT = 0.5


@pytest.fixture
def server():
    with FakeServer() as fake:
        yield fake


def client_of(url: str, **kwargs) -> HttpClient:
    kwargs.setdefault("timeout", TIMEOUT)
    return HttpClient(url, name="the thing", **kwargs)


def failure(call, reason: str) -> tuple[str, float]:
    """(the SourceError's message, seconds it took) of ``call()``, which must fail with one whose
    reason is ``reason`` (the exporter's collectors' word for the same failure)."""
    started = time.monotonic()
    with pytest.raises(SourceError) as error:
        call()
    assert error.value.reason == reason
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message, time.monotonic() - started


def test_get_json_reads_a_200(server):
    server.routes["/api"] = respond(b'{"a": [1, 2]}', content_type=JSON)
    with client_of(server.url()) as client:
        assert client.get_json("/api", {"n": 3}) == {"a": [1, 2]}
    assert server.paths == ["/api?n=3"]


def test_a_status_is_the_answer_of_get_and_an_error_of_get_json(server):
    server.routes["/api"] = respond(b'{"error": "boom"}', status=500, content_type=JSON)
    server.routes["/gone"] = respond(b"", status=404)
    with client_of(server.url()) as client:
        answer = client.get("/api")
        assert (answer.status, answer.json()) == (500, {"error": "boom"})
        message, _ = failure(lambda: client.get_json("/api"), "http_500")
        assert message == f"the thing at {server.url('/api')} answered HTTP 500"
        assert client.get_json("/gone", missing=(404,)) is None


def test_a_body_trickling_past_the_timeout_is_cut_at_the_deadline(server):
    # 400 bytes, 4 every 50 ms: each read is quick, the whole answer would take 5 s.
    server.routes["/slow"] = trickle(b"x" * 400, chunk=4, pause=0.05, content_type=JSON)
    with client_of(server.url()) as client:
        message, elapsed = failure(lambda: client.get("/slow"), "timeout")
    assert message == f"the thing at {server.url('/slow')} did not answer within 0.5 s"
    assert TIMEOUT <= elapsed < TIMEOUT + 0.5


def test_an_answer_that_never_comes_times_out(server):
    server.routes["/hang"] = respond(b"{}", content_type=JSON, delay=TIMEOUT * 4)
    with client_of(server.url()) as client:
        message, elapsed = failure(lambda: client.get("/hang"), "timeout")
    assert "did not answer within 0.5 s" in message and elapsed < TIMEOUT + 0.5


def test_an_answer_over_the_cap_is_refused(server):
    server.routes["/declared"] = declared_huge(10_000_000)  # says so in its Content-Length: not read
    server.routes["/streamed"] = stream(b"y" * 1000, total=4_000_000)  # no Content-Length: counted
    server.routes["/bomb"] = gzipped(gzip_bomb(8 * 2**20))  # small on the wire, 8 MiB decoded
    with client_of(server.url(), max_bytes=2**20) as client:
        for path in ("/declared", "/streamed", "/bomb"):
            message, elapsed = failure(lambda path=path: client.get(path), "body_too_large")
            assert message == f"the thing at {server.url(path)} sent an answer over 1 MiB"
            assert elapsed < TIMEOUT


def test_a_small_cap_is_named_in_bytes(server):
    server.routes["/page"] = respond(b"z" * 2000)
    with client_of(server.url(), max_bytes=1000) as client:
        message, _ = failure(lambda: client.get("/page"), "body_too_large")
    assert message.endswith("sent an answer over 1000 bytes")


def test_a_closed_port_is_connection_refused():
    url = refusing_url()
    with client_of(url) as client:
        message, elapsed = failure(lambda: client.get("/api/v1/window"), "connection_refused")
    assert message == f"cannot reach the thing at {url}/api/v1/window: connection refused"
    assert elapsed < TIMEOUT


def test_an_unresolvable_host_is_unreachable():
    with client_of("http://kvdoctor-no-such-host.invalid:9745") as client:
        message, _ = failure(lambda: client.get("/metrics"), "connect_error")
    assert message.startswith("cannot reach the thing at http://kvdoctor-no-such-host.invalid:9745/metrics: ")


def test_a_connection_reset_mid_answer_is_one_line(server):
    server.routes["/reset"] = reset_mid_body(b'{"a": "' + b"x" * 4000 + b'"}', content_type=JSON)
    with client_of(server.url()) as client:
        message, _ = failure(lambda: client.get("/reset"), "transport_error")
    assert message.startswith(f"the thing at {server.url('/reset')}")


def test_an_answer_that_is_not_json(server):
    server.routes["/login"] = respond(b"<html>a login page</html>", content_type="text/html")
    with client_of(server.url()) as client:
        answer = client.get("/login")
        with pytest.raises(ValueError):
            answer.json()
        message, _ = failure(lambda: client.get_json("/login"), "parse_error")
    assert message == f"the thing at {server.url('/login')} did not answer JSON (text/html)"


def test_a_redirect_is_not_followed(server):
    with FakeServer({"/api": respond(b'{"secret": 1}', content_type=JSON)}) as elsewhere:
        server.routes["/api"] = respond(b"", status=302, headers={"Location": elsewhere.url("/api")})
        with client_of(server.url()) as client:
            assert client.get("/api").status == 302
            message, _ = failure(lambda: client.get_json("/api"), "http_302")
            assert client.post_form("/api", {"query": "up"}).status == 302
        assert elsewhere.requests == 0
    assert message == (
        f"the thing at {server.url('/api')} answered HTTP 302, a redirect to {elsewhere.url('/api')} "
        "(not followed: give that URL)"
    )


def test_post_form_sends_the_form_in_the_body(server):
    server.routes["/api/v1/query"] = respond(json.dumps({"ok": True}).encode(), content_type=JSON)
    with client_of(server.url() + "/") as client:  # a trailing slash on the base is dropped
        assert client.post_form("/api/v1/query", {"query": 'up{job="x"}', "time": "1.000"}).json() == {"ok": True}
    assert server.paths == ["/api/v1/query"]
    assert server.forms() == [{"query": ['up{job="x"}'], "time": ["1.000"]}]


@pytest.mark.parametrize(
    "url, phrase",
    [
        ("ftp://x", r"needs an http\(s\) URL"),
        ("not a url", r"needs an http\(s\) URL"),
        ("", r"needs an http\(s\) URL"),
        ("http://host:99999", "bad port"),
        ("http://host:9090/?x=1", "must not carry a query"),
    ],
)
def test_bad_base_urls_are_refused_with_one_line(url, phrase):
    with pytest.raises(SourceError, match=phrase) as error:
        check_base_url(url, "Prometheus")
    assert str(error.value).startswith("Prometheus ")


def test_base_urls_keep_their_prefix():
    assert check_base_url(" https://example.com/prometheus/ ", "x") == "https://example.com/prometheus"
