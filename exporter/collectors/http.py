"""Fetching one exposition page over HTTP with httpx, as text decoded as it is read (engine and dcgm collectors).

``HttpExposition`` asks through httpx's transports: one kept-alive connection (httpx opens a new
one when the server closed it while idle); TLS with one verifying context per process (the system's
CA store; proxy variables are not used); redirects followed by hand, so that the deadline and a
small cap hold on each redirect's body too; gzip inflated here in bounded steps, so that the size
cap holds on the inflated body; one deadline for the whole fetch, the caller's parsing of the
pieces included. ``iter_text()`` yields the body in pieces of text, so the page is never held
whole; ``fetch()`` joins them. Every way a fetch can fail is a ``SourceError`` with a short
reason: ``timeout``, ``connection_refused``, ``connect_error`` (DNS, unreachable, TLS handshake),
``transport_error`` (connection dropped mid-response, malformed HTTP, a Transfer-Encoding other
than chunked, a corrupt gzip body, too many redirects), ``http_<status>``, ``body_too_large``,
``parse_error`` (not text in its declared charset), ``unsupported_encoding`` (Content-Encoding).
"""

from __future__ import annotations

import codecs
import functools
import ssl
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpx

from kvdoctor.signals.collection import SourceError

DEFAULT_TIMEOUT_SECONDS = 2.0
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # vLLM's page is ~50 KB; this only stops a runaway body
# Prometheus' own preference: the classic text format first, OpenMetrics accepted.
ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
# Only gzip is asked for: it is inflated here, in bounded steps, so the size cap holds on the
# inflated size (a gzip bomb inflates ~1000:1).
REQUEST_HEADERS = {"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "kvdoctor-exporter"}
GZIP_ENCODINGS = frozenset({"gzip", "x-gzip"})
IDENTITY_ENCODINGS = frozenset({"", "identity"})
# Bytes inflated per step: a step's bytes and its decoded text are all the memory a fetch holds
# of the page at once, besides what one network read returned and a line cut by a step's end.
READ_SIZE = 16 * 1024
PARSE_SHARE = 0.5  # of the timeout, for the caller's parsing of the pieces (see HttpExposition)
MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECT_BODY = 64 * 1024  # a redirect's body up to this is read, to keep the connection


class HttpExposition:
    """GET one exposition page, as text, or raise ``SourceError(reason)``.

    ``iter_text()`` yields the body as decoded text in pieces, cut wherever a read ended (inside
    a line; the bytes of a character split between two reads wait in the incremental decoder);
    ``fetch()`` joins them, for callers that keep the page.

    Redirects (a Prometheus app mounted at /metrics may redirect to /metrics/) are followed up to
    ``MAX_REDIRECTS`` times. ``timeout`` bounds the whole fetch: connecting, the answer, every
    redirect, the body, and the caller's parsing of the pieces meanwhile share one deadline,
    checked after every read, so a server that trickles bytes cannot hold a collection longer
    (one read that gets nothing at all waits at most the time that was left when the request was
    sent: httpx fixes a request's read timeout when it starts reading). The caller's parsing may use half of it
    (``PARSE_SHARE``): past that, e.g. on a runaway body of wanted lines, the rest of the body is
    only read and counted, so that a body over the cap is still reported as ``body_too_large``
    (and found cheaply), and a page under the cap too slow to parse as ``timeout``.
    """

    def __init__(
        self, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ):
        self.url = url
        self.timeout = float(timeout)
        self.max_body_bytes = int(max_body_bytes)
        # httpx's transports, without its Client: a page fetched every second needs no cookie
        # jar, auth flow or event hooks (half of the Client's cost per request), and redirects are
        # followed here anyway.
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        # plain http never uses its TLS context; https goes through the lazy transport
        self._http = httpx.HTTPTransport(verify=_NO_TLS, limits=limits, trust_env=False)
        self._https = _LazyTlsTransport(limits)
        if url.lower().startswith("https:"):
            # Now, not on the first fetch: loading the CA store (tens of ms, ~2 MB) must not eat
            # into the first collection's deadline. For plain http it is loaded only if a
            # redirect leads to https.
            self._https.transport()

    def fetch(self) -> str:
        """The whole page as one str."""
        return "".join(self.iter_text())

    def iter_text(self) -> Iterator[str]:
        """The page as decoded text, piece by piece (a generator: the GET starts on the first ``next``)."""
        deadline = time.monotonic() + self.timeout
        url = self.url
        try:
            response, url = self._open(deadline)
            try:
                yield from self._body(response, url, deadline)
            finally:
                response.close()  # a body not read to its end closes the connection
        except httpx.TimeoutException:
            raise SourceError("timeout", f"GET {url}: no answer within {self.timeout:g} s") from None
        except httpx.ConnectError as exc:
            refused = _caused_by(exc, ConnectionRefusedError)
            raise SourceError(
                "connection_refused" if refused else "connect_error", f"GET {url}: {_describe(exc)}"
            ) from None
        except httpx.HTTPError as exc:  # a connection dropped, malformed HTTP, a bad URL
            raise SourceError("transport_error", f"GET {url}: {_describe(exc)}") from None
        except httpx.InvalidURL as exc:
            raise SourceError("transport_error", f"GET {url}: bad URL: {exc}") from None

    def close(self) -> None:
        self._http.close()
        self._https.close()

    # -- the request ---------------------------------------------------------------------------

    def _open(self, deadline: float) -> tuple[httpx.Response, str]:
        """The 2xx answer to GET ``self.url``, redirects followed, its body not read yet; and its URL."""
        url = httpx.URL(self.url)
        for _ in range(MAX_REDIRECTS + 1):
            timeout = httpx.Timeout(self._remaining(deadline, str(url))).as_dict()
            request = httpx.Request("GET", url, headers=REQUEST_HEADERS, extensions={"timeout": timeout})
            transport = self._https if url.scheme == "https" else self._http
            response = transport.handle_request(request)
            status = response.status_code
            location = response.headers.get("location") if status in REDIRECT_STATUSES else None
            if not location:
                if not 200 <= status < 300:
                    response.close()
                    raise SourceError(f"http_{status}", f"GET {url}: HTTP {status}")
                return response, str(url)
            self._discard(response, str(url), deadline)
            url = url.join(location)
        raise SourceError("transport_error", f"GET {self.url}: more than {MAX_REDIRECTS} redirects")

    def _discard(self, response: httpx.Response, url: str, deadline: float) -> None:
        """Read a redirect's small body so the connection serves the next request; else drop it."""
        size = 0
        try:
            for data in response.iter_raw():
                size += len(data)
                if size > MAX_REDIRECT_BODY:
                    break  # closing the answer unread closes its connection
                self._remaining(deadline, url)
        finally:
            response.close()

    def _remaining(self, deadline: float, url: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SourceError("timeout", f"GET {url}: not complete after {self.timeout:g} s")
        return left

    # -- the body ------------------------------------------------------------------------------

    def _body(self, response: httpx.Response, url: str, deadline: float) -> Iterator[str]:
        content_encoding = response.headers.get("content-encoding", "").lower()
        if content_encoding in GZIP_ENCODINGS:
            inflater = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, 32 KiB window
        elif content_encoding in IDENTITY_ENCODINGS:
            inflater = None
        else:
            raise SourceError("unsupported_encoding", f"GET {url}: Content-Encoding {content_encoding!r}")
        cap = self.max_body_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise self._too_large(url, int(declared))
        charset = response.charset_encoding or "utf-8"
        try:
            decode = codecs.getincrementaldecoder(charset)("strict").decode
        except LookupError:
            raise SourceError("parse_error", f"GET {url}: unknown charset {charset!r}") from None
        size = 0  # bytes of the body after inflating
        parsing = True  # False once the caller's parsing has used its share of the timeout
        parse_budget = self.timeout * PARSE_SHARE
        parse_seconds = 0.0
        try:
            for received in response.iter_raw():
                for chunk in (received,) if inflater is None else _inflate_steps(inflater, received):
                    size += len(chunk)
                    if size > cap:
                        raise self._too_large(url, size)
                    if not parsing:
                        continue
                    text = decode(chunk)
                    del chunk
                    if text:
                        paused = time.monotonic()
                        yield text
                        parse_seconds += time.monotonic() - paused
                        # The rest is only read and counted: to report a body over the cap as
                        # such, and a page too slow to parse as a timeout.
                        parsing = parse_seconds <= parse_budget
                self._remaining(deadline, url)
            last = b""
            if inflater is not None:
                last = inflater.flush()
                size += len(last)
                if size > cap:
                    raise self._too_large(url, size)
                if not inflater.eof:
                    raise zlib.error("the gzip stream ends early")
            if not parsing:
                raise SourceError(
                    "timeout",
                    f"GET {url}: parsing the page took over {parse_budget:g} s ({PARSE_SHARE:.0%} of the timeout)",
                )
            text = decode(last, True)
            if text:
                yield text
        except zlib.error as exc:  # a corrupt gzip body
            raise SourceError("transport_error", f"GET {url}: bad gzip body: {exc}") from None
        except UnicodeError:  # UnicodeDecodeError, or a UTF-16 body without its byte-order mark
            raise SourceError("parse_error", f"GET {url}: the body is not {charset} text") from None

    def _too_large(self, url: str, size: int) -> SourceError:
        return SourceError(
            "body_too_large", f"GET {url}: body of {size}+ bytes exceeds the cap of {self.max_body_bytes}"
        )


class _LazyTlsTransport(httpx.BaseTransport):
    """The https transport, made with the process's verifying TLS context on first use."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._transport: httpx.HTTPTransport | None = None

    def transport(self) -> httpx.HTTPTransport:
        if self._transport is None:
            self._transport = httpx.HTTPTransport(verify=_tls_context(), limits=self._limits, trust_env=False)
        return self._transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.transport().handle_request(request)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def _inflate_steps(inflater: Any, data: bytes) -> Iterator[bytes]:
    """``data`` inflated in steps of at most ``READ_SIZE`` bytes: a gzip bomb never inflates at once."""
    while data:
        yield inflater.decompress(data, READ_SIZE)
        data = inflater.unconsumed_tail


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``kind`` is in ``exc``'s chain of causes (httpx wraps the OSError twice)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(exc: BaseException) -> str:
    """``TypeName: message`` of the deepest cause (``ConnectionRefusedError: [Errno 111] ...``)."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    return f"{type(root).__name__}: {root}" if str(root) else type(root).__name__


# For the plain-http transport, which never makes a TLS connection: no CA store loaded, and it
# would verify against none (a TLS connection through it fails).
_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every connection of the process (loading CAs is the slow part)."""
    return ssl.create_default_context()
