"""The engine collector's HTTP fetch (httpx, the body parsed as it arrives)
against real local servers: a kept-alive connection the server closed while idle, redirects,
chunked bodies cut anywhere (inside a line, inside a UTF-8 character), other charsets, interim
and malformed answers, a body cut short, a trickle past the timeout, and https with a verifying
context."""

from __future__ import annotations

import gzip
import re
import shutil
import ssl
import subprocess
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvdoctor.exporter.collectors import http as http_module
from kvdoctor.exporter.collectors.engine import EngineCollector
from kvdoctor.exporter.collectors.http import HttpExposition
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.textparse import ExpositionError, iter_samples, iter_samples_streamed
from tests.support.servers import EXPOSITION, Behaviour, FakeServer, respond, trickle

ROOT = Path(__file__).resolve().parents[2]
VLLM_TEXT = (ROOT / "tests/fixtures/vllm-0.32-cpu/fill-sequence/08.txt").read_text()
# The same page with multi-byte characters in a label every sample carries (2, 3 and 4 bytes).
VLLM_UNICODE_TEXT = VLLM_TEXT.replace('model_name="tiny"', 'model_name="tíny-日本-😀"')


def chunked(
    body: bytes, sizes: tuple[int, ...], content_type: str = EXPOSITION, headers: dict | None = None
) -> Behaviour:
    """``Transfer-Encoding: chunked``, chunks of ``sizes`` in turn (each is one read on the client side)."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Transfer-Encoding", "chunked")
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        out, pos, i = [], 0, 0
        while pos < len(body):
            piece = body[pos : pos + sizes[i % len(sizes)]]
            out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
            pos += len(piece)
            i += 1
        out.append(b"0\r\n\r\n")
        h.wfile.write(b"".join(out))

    return behave


def redirect(location: str, status: int = 301) -> Behaviour:
    return respond(b"moved\n", status=status, content_type="text/plain", headers={"Location": location})


@pytest.fixture
def serve(fake_server):
    def start(routes: dict[str, Behaviour], tls: ssl.SSLContext | None = None) -> FakeServer:
        return fake_server(routes, tls=tls)

    return start


def collect(url: str, **kwargs):
    collector = EngineCollector(url, **kwargs)
    try:
        return collector.collect()
    finally:
        collector.close()


def reason_of(url: str, **kwargs) -> str:
    with pytest.raises(SourceError) as caught:
        collect(url, **kwargs)
    return caught.value.reason


def whole_page(text: str) -> dict:
    """What ``normalise`` makes of the whole text at once (the reference for the streamed path),
    with the ``engine_info`` series every collection adds."""
    collector = EngineCollector(None)
    out = collector.normalise(text)
    return {**out, collector.info_key(): 1.0}


# -- keep-alive ------------------------------------------------------------------------------------


def _scrape_vllm_page_twice(url: str) -> None:
    """Two collections from ``url``, each the whole vLLM page (how many connections: the caller's check)."""
    collector = EngineCollector(url)
    try:
        for _ in range(2):
            assert collector.collect().samples == whole_page(VLLM_TEXT)
    finally:
        collector.close()


def test_a_kept_alive_connection_the_server_closed_is_reopened_and_the_request_retried(serve):
    server = serve({"/metrics": respond(VLLM_TEXT.encode(), close_after=True)})
    collector = EngineCollector(server.url("/metrics"))
    try:
        first = collector.collect().samples
        assert server.closed.acquire(timeout=5)  # the server has closed the idle connection
        assert collector.collect().samples == first == whole_page(VLLM_TEXT)
    finally:
        collector.close()
    assert server.requests >= 2 and server.connections == 2


def test_a_new_connection_closed_without_an_answer_is_not_retried(serve):
    def hang_up(h: BaseHTTPRequestHandler) -> None:
        h.close_connection = True  # no status line at all

    server = serve({"/metrics": hang_up})
    assert reason_of(server.url("/metrics")) == "transport_error"
    assert server.requests == 1


# -- redirects -------------------------------------------------------------------------------------


def test_redirects_are_followed_relative_and_absolute_on_one_connection(serve):
    server = serve({})
    server.routes.update(
        {
            "/metrics": redirect("/metrics/"),  # as a Prometheus app mounted at /metrics answers
            "/metrics/": redirect(server.url("/real"), status=307),
            "/real": respond(VLLM_TEXT.encode()),
        }
    )
    _scrape_vllm_page_twice(server.url("/metrics"))
    assert server.requests == 6 and server.connections == 1


def test_a_redirect_loop_is_a_transport_error(serve):
    server = serve({"/a": redirect("/b"), "/b": redirect("/a")})
    assert reason_of(server.url("/a")) == "transport_error"
    assert server.requests == http_module.MAX_REDIRECTS + 1


def test_a_redirect_to_another_origin_moves_the_connection(serve):
    target = serve({"/metrics": respond(VLLM_TEXT.encode())})
    origin = serve({"/metrics": redirect(target.url("/metrics", host="localhost"), status=302)})
    assert collect(origin.url("/metrics")).samples == whole_page(VLLM_TEXT)
    assert target.requests == 1


# -- bodies cut anywhere ---------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(1,), (7, 13, 4093), (16 * 1024 + 1,)], ids=["1-byte", "odd", "just-over-a-read"])
def test_a_chunked_body_cut_inside_lines_and_characters_gives_the_whole_page_samples(serve, sizes):
    body = VLLM_UNICODE_TEXT.encode()
    if sizes == (1,):  # its first and last lines only: 1-byte chunks of the whole page take seconds
        body = body[: body.index(b"\n", 12000) + 1] + body[body.index(b"\n", len(body) - 3000) + 1 :]
    server = serve({"/metrics": chunked(body, sizes)})
    samples = collect(server.url("/metrics")).samples
    assert samples == whole_page(body.decode())
    assert any("😀" in value for _, labels in samples for _, value in labels), "the multi-byte label survived"


def test_a_gzip_body_in_small_chunks_is_inflated_and_parsed_as_it_comes(serve):
    server = serve(
        {"/metrics": chunked(gzip.compress(VLLM_UNICODE_TEXT.encode()), (5, 301), headers={"Content-Encoding": "gzip"})}
    )
    assert collect(server.url("/metrics")).samples == whole_page(VLLM_UNICODE_TEXT)


def test_the_charset_of_the_content_type_is_used(serve):
    text = VLLM_TEXT.replace('model_name="tiny"', 'model_name="tíny"')
    server = serve({"/metrics": respond(text.encode("latin-1"), content_type="text/plain; charset=ISO-8859-1")})
    assert collect(server.url("/metrics")).samples == whole_page(text)
    server.routes["/bad"] = respond(b"up 1\n", content_type="text/plain; charset=no-such-charset")
    assert reason_of(server.url("/bad")) == "parse_error"


def test_a_utf8_character_cut_by_the_end_of_the_body_is_a_parse_error(serve):
    body = VLLM_UNICODE_TEXT.encode()
    server = serve({"/metrics": chunked(body[: body.index("😀".encode()) + 2], (4096,))})
    assert reason_of(server.url("/metrics")) == "parse_error"


def test_a_body_shorter_than_its_content_length_is_a_transport_error(serve):
    def short(h: BaseHTTPRequestHandler) -> None:
        body = VLLM_TEXT.encode()
        h.send_response(200)
        h.send_header("Content-Type", EXPOSITION)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body[: len(body) // 2])  # then a clean close (FIN), not a reset
        h.close_connection = True

    server = serve({"/metrics": short})
    assert reason_of(server.url("/metrics")) == "transport_error"


def raw_answer(data: bytes) -> Behaviour:
    """Exactly these bytes, then the connection closes."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(data)
        h.close_connection = True

    return behave


def test_an_interim_1xx_answer_is_skipped(serve):
    body = VLLM_TEXT.encode()
    server = serve(
        {
            "/metrics": raw_answer(
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        }
    )
    assert collect(server.url("/metrics")).samples == whole_page(VLLM_TEXT)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "transport_error"),  # not HTTP at all
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12, 13\r\n\r\nup 1\n", "transport_error"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nup 1\n\r\n0\r\n\r\n", "transport_error"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nup 1\n", "transport_error"),  # cut in a chunk
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nup 1XX\r\n0\r\n\r\n", "transport_error"),
        # httpx (h11) reads chunked framing only: any other Transfer-Encoding is malformed for it
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "transport_error"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 0\r\n\r\n", "unsupported_encoding"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n", "transport_error"),  # cut in the head
    ],
    ids=[
        "not-http",
        "two-lengths",
        "bad-chunk-size",
        "cut-in-a-chunk",
        "chunk-longer-than-said",
        "gzip-transfer-encoding",
        "brotli-content-encoding",
        "cut-in-the-head",
    ],
)
def test_malformed_answers_have_a_reason(serve, answer, reason):
    server = serve({"/metrics": raw_answer(answer)})
    assert reason_of(server.url("/metrics")) == reason


def test_a_body_up_to_the_end_of_the_connection_is_read_whole(serve):
    body = VLLM_TEXT.encode()
    server = serve({"/metrics": raw_answer(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body)})
    _scrape_vllm_page_twice(server.url("/metrics"))  # no length: the next GET opens another connection
    assert server.connections == 2


def test_a_trickling_body_is_abandoned_at_the_timeout(serve):
    # every read is quick; the whole body takes ~5 s
    server = serve({"/metrics": trickle(VLLM_TEXT.encode(), chunk=512, pause=0.05)})
    started = time.monotonic()
    assert reason_of(server.url("/metrics"), timeout=0.3) == "timeout"
    assert time.monotonic() - started < 1.0


def test_fetch_joins_the_pieces_and_the_connection_is_reused_after_it(serve):
    server = serve({"/metrics": chunked(VLLM_UNICODE_TEXT.encode(), (1000, 3))})
    page = HttpExposition(server.url("/metrics"))
    try:
        assert len(list(page.iter_text())) > 10
        assert page.fetch() == VLLM_UNICODE_TEXT
    finally:
        page.close()
    assert server.connections == 1


# -- the streamed parser ---------------------------------------------------------------------------


def test_the_streamed_parser_matches_the_whole_text_parser_however_the_text_is_cut():
    wanted = frozenset({"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total"})
    for text in (VLLM_UNICODE_TEXT, VLLM_UNICODE_TEXT.replace("\n", "\r\n"), VLLM_UNICODE_TEXT + "# EOF\n"):
        for w in (None, wanted):
            expected = [(n, lab, v) for n, lab, v, _ in iter_samples(text, w)]
            for size in (1, 2, 5, 64, 4099):
                pieces = [text[i : i + size] for i in range(0, len(text), size)]
                assert list(iter_samples_streamed(pieces, w)) == expected, (size, w is None)


def test_the_streamed_parser_names_the_line_of_the_whole_text():
    text = VLLM_TEXT[: VLLM_TEXT.index("\n", 20000) + 1] + "<html>\n"
    line = text.count("\n")
    for size in (1, 333, len(text)):
        with pytest.raises(ExpositionError, match=rf"^line {line}: not an exposition line"):
            list(iter_samples_streamed(text[i : i + size] for i in range(0, len(text), size)))


# -- https -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> Path:
    """A self-signed certificate for 127.0.0.1 (made with the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    out = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(out / "key.pem"),
            "-out",
            str(out / "cert.pem"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def _tls_server(serve, certificate: Path) -> FakeServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate / "cert.pem", certificate / "key.pem")
    return serve({"/metrics": respond(VLLM_TEXT.encode())}, tls=context)


def test_https_with_an_untrusted_certificate_is_refused(serve, certificate):
    server = _tls_server(serve, certificate)
    assert reason_of(server.url("/metrics")) == "connect_error"


def test_https_with_a_trusted_certificate_is_scraped_on_one_connection(serve, certificate, monkeypatch):
    trusting = ssl.create_default_context(cafile=str(certificate / "cert.pem"))
    monkeypatch.setattr(http_module, "_tls_context", lambda: trusting)  # the process-wide context, plus our CA
    server = _tls_server(serve, certificate)
    _scrape_vllm_page_twice(server.url("/metrics"))
    assert server.connections == 1


def test_plain_http_loads_no_ca_store_and_a_redirect_to_https_is_verified(serve, certificate, monkeypatch):
    loaded = []
    trusting = ssl.create_default_context(cafile=str(certificate / "cert.pem"))
    monkeypatch.setattr(http_module, "_tls_context", lambda: loaded.append(True) or trusting)
    plain = serve({"/metrics": respond(VLLM_TEXT.encode())})
    assert collect(plain.url("/metrics")).samples == whole_page(VLLM_TEXT)
    assert loaded == []
    secure = _tls_server(serve, certificate)
    origin = serve({"/metrics": redirect(secure.url("/metrics"), status=302)})
    assert collect(origin.url("/metrics")).samples == whole_page(VLLM_TEXT)
    assert loaded == [True]
    monkeypatch.setattr(http_module, "_tls_context", ssl.create_default_context)  # our CA not trusted
    assert reason_of(origin.url("/metrics")) == "connect_error"


def test_a_redirect_with_a_body_over_the_cap_is_followed_on_a_new_connection(serve):
    server = serve({})
    big = b"x" * (http_module.MAX_REDIRECT_BODY * 4)
    server.routes.update(
        {
            "/metrics": respond(big, status=301, content_type="text/plain", headers={"Location": "/real"}),
            "/real": respond(VLLM_TEXT.encode()),
        }
    )
    assert collect(server.url("/metrics")).samples == whole_page(VLLM_TEXT)
    assert server.connections == 2


# -- anything a server may send --------------------------------------------------------------------

_STATUS_LINES = st.sampled_from(
    [b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 301 Moved", b"HTTP/1.1 503 Busy", b"HTTP/2 200", b"ICY 200 OK"]
)
_HEADERS = st.lists(
    st.sampled_from(
        [
            b"Content-Length: 5",
            b"Content-Length: -1",
            b"Content-Length: 99999999999",
            b"Transfer-Encoding: chunked",
            b"Content-Encoding: gzip",
            b"Content-Type: text/plain; charset=utf-16",
            b"Location: /metrics",
            b"Location: ftp://x/",
            b"Connection: close",
            b" folded",
        ]
    )
    | st.binary(max_size=40).filter(lambda b: b"\r\n" not in b),
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=_STATUS_LINES, headers=_HEADERS, body=st.binary(max_size=300), cut=st.integers(0, 400))
@example(status=b"HTTP/1.1 200 OK", headers=[b"Content-Encoding: gzip"], body=b"not gzip at all", cut=0)
@example(status=b"HTTP/1.1 200 OK", headers=[b"Content-Type: text/plain; charset=utf-16"], body=b"\xff", cut=0)
@example(status=b"HTTP/1.1 200 OK", headers=[b"Content-Type: text/plain; charset=utf-16"], body=b"up 1\n", cut=0)
@example(status=b"HTTP/1.1 301 Moved", headers=[b"Location: ftp://x/"], body=b"", cut=0)
@example(status=b"HTTP/1.1 200 OK", headers=[b"Content-Length: -1"], body=b"up 1\n", cut=0)
@example(status=b"HTTP/1.1 200 OK", headers=[b"Content-Encoding: gzip"], body=gzip.compress(b"x" * 5000), cut=0)
def test_whatever_the_server_answers_the_fetch_gives_text_or_a_source_error(fake_server, status, headers, body, cut):
    """A failing source never takes the exporter down: every answer, however malformed or cut
    short, is the page's text or a ``SourceError`` with a reason, within the deadline."""
    answer = (status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body)[: cut or None]
    server = fake_server({"/metrics": raw_answer(answer)})
    page = HttpExposition(server.url("/metrics"), timeout=0.5, max_body_bytes=1000)
    started = time.monotonic()
    try:
        assert isinstance(page.fetch(), str)
    except SourceError as exc:
        assert re.fullmatch(r"[a-z0-9_]+", exc.reason) and "\n" not in str(exc)
    finally:
        page.close()
        server.stop()
    assert time.monotonic() - started < 2.0
