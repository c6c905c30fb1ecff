"""Fetching one exposition page over HTTP, as text decoded as it is read (engine and dcgm collectors).

``HttpExposition`` is a lean HTTP/1.1 client on the standard library's sockets: one kept-alive
connection, reopened and the request sent again once when the server had closed it while idle;
TLS with one verifying context per process (the system's CA store; proxy variables are not
used); redirects followed; gzip inflated in bounded steps; a size cap on the inflated body; one
deadline for the whole fetch, the caller's parsing of the pieces included. ``iter_text()`` yields
the body in pieces of text, so the page is never held whole; ``fetch()`` joins them. Every way a
fetch can fail is a ``SourceError`` with a short reason: ``timeout``, ``connection_refused``,
``connect_error`` (DNS, unreachable, TLS handshake), ``transport_error`` (connection dropped
mid-response, malformed HTTP, a corrupt gzip body, too many redirects), ``http_<status>``,
``body_too_large``, ``parse_error`` (not text in its declared charset), ``unsupported_encoding``.
"""

from __future__ import annotations

import codecs
import functools
import socket
import ssl
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from kvdoctor.rules.collection import SourceError

DEFAULT_TIMEOUT_SECONDS = 2.0
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # vLLM's page is ~50 KB; this only stops a runaway body
# Prometheus' own preference: the classic text format first, OpenMetrics accepted.
ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
# Only gzip is asked for: it is inflated here, in bounded steps, so the size cap holds on the
# inflated size (a gzip bomb inflates ~1000:1).
REQUEST_HEADERS = {"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "kvdoctor-exporter"}
GZIP_ENCODINGS = frozenset({"gzip", "x-gzip"})
IDENTITY_ENCODINGS = frozenset({"", "identity"})
REQUEST_HEADER_LINES = "".join(f"{name}: {value}\r\n" for name, value in REQUEST_HEADERS.items())
# Bytes read (and inflated) per step: a step's bytes and its decoded text are all the memory a
# fetch holds of the page at once, besides a line cut by a step's end.
READ_SIZE = 16 * 1024
DRAIN_READ_SIZE = 64 * 1024  # read, counted and dropped: the rest of a body too slow to parse
PARSE_SHARE = 0.5  # of the timeout, for the caller's parsing of the pieces (see HttpExposition)
MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_DRAINED_REDIRECT_BODY = 64 * 1024  # a redirect's body up to this is read, to keep the connection
MAX_HEAD_BYTES = 64 * 1024  # status line and headers
MAX_LINE_BYTES = 4 * 1024  # a chunk-size or trailer line
MAX_TRAILER_LINES = 64


class HttpExposition:
    """GET one exposition page, as text, or raise ``SourceError(reason)``.

    ``iter_text()`` yields the body as decoded text in pieces of up to ``READ_SIZE`` characters,
    cut wherever a read ended (inside a line; the bytes of a character split between two reads
    wait in the incremental decoder); ``fetch()`` joins them, for callers that keep the page.

    HTTP/1.1 on a plain socket (a GET needs little of a client: vLLM's page costs ~0.2 ms of CPU,
    decoding included, where http.client took ~0.45 ms, mostly parsing headers as e-mail, and
    httpx ~1.5-2.6 ms): Content-Length, chunked and close-delimited bodies; one connection kept
    alive across fetches, reopened and the request sent again once when the server had closed
    it while idle (to one origin: a redirect to another host moves it there); TLS for https
    with one verifying context per process. Redirects (a Prometheus app mounted at /metrics may
    redirect to /metrics/) are followed up to ``MAX_REDIRECTS`` times. Proxies from the
    environment are not used.

    ``timeout`` bounds the whole fetch: connecting, the answer, every redirect, the body, and the
    caller's parsing of the pieces meanwhile share one deadline, so a server that trickles bytes
    cannot hold a collection longer. The caller's parsing may use half of it (``PARSE_SHARE``):
    past that, e.g. on a runaway body of wanted lines, the rest of the body is only read and
    counted, so that a body over the cap is still reported as ``body_too_large`` (and found
    cheaply), and a page under the cap too slow to parse as ``timeout``.
    """

    def __init__(
        self, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ):
        self.url = url
        self.timeout = float(timeout)
        self.max_body_bytes = int(max_body_bytes)
        self._sock: socket.socket | None = None
        self._origin: tuple[str, str, int] | None = None
        self._buf = b""  # received from the socket and not consumed yet, from self._pos
        self._pos = 0
        self._read_size = READ_SIZE
        if url.lower().startswith("https:"):
            # Now, not on the first fetch: loading the CA bundle (0.1-0.3 s) must not eat into
            # the first collection's deadline.
            _tls_context()

    def fetch(self) -> str:
        """The whole page as one str."""
        return "".join(self.iter_text())

    def iter_text(self) -> Iterator[str]:
        """The page as decoded text, piece by piece (a generator: the GET starts on the first ``next``)."""
        deadline = time.monotonic() + self.timeout
        self._read_size = READ_SIZE
        head, url = self._open(deadline)
        reusable = False
        try:
            yield from self._body(head, url, deadline)
            reusable = head.keep_alive and self._pos == len(self._buf)
        finally:
            if not reusable:  # unread bytes, a broken stream, or the server closes after this answer
                self._drop()

    def close(self) -> None:
        self._drop()

    # -- the request ---------------------------------------------------------------------------

    def _open(self, deadline: float) -> tuple[_Head, str]:
        """The head of the 2xx answer to GET ``self.url``, redirects followed, and its URL."""
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            head = self._request(url, deadline)
            location = head.headers.get("location") if head.status in REDIRECT_STATUSES else None
            if location:
                self._discard(head, url, deadline)
                url = urljoin(url, location)
                continue
            if not 200 <= head.status < 300:
                self._drop()
                raise SourceError(f"http_{head.status}", f"GET {url}: HTTP {head.status}")
            return head, url
        self._drop()
        raise SourceError("transport_error", f"GET {self.url}: more than {MAX_REDIRECTS} redirects")

    def _request(self, url: str, deadline: float) -> _Head:
        try:
            parts = urlsplit(url)
            scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
        except ValueError as exc:
            raise SourceError("transport_error", f"GET {url}: bad URL: {exc}") from None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if scheme not in ("http", "https") or not host or any(c in target for c in " \r\n"):
            raise SourceError("transport_error", f"GET {url}: not a usable http:// or https:// URL")
        default_port = 443 if scheme == "https" else 80
        origin = (scheme, host, port or default_port)
        if origin != self._origin:
            self._drop()
            self._origin = origin
        authority = f"[{host}]" if ":" in host else host
        if port and port != default_port:
            authority += f":{port}"
        request = f"GET {target} HTTP/1.1\r\nHost: {authority}\r\n{REQUEST_HEADER_LINES}\r\n".encode()
        for attempt in (1, 2):
            reused = self._sock is not None
            if not reused:
                self._connect(origin, url, deadline)
            try:
                self._sock.settimeout(self._remaining(deadline, url))
                self._sock.sendall(request)
                return self._read_head(url, deadline)
            except TimeoutError:
                self._drop()
                raise SourceError("timeout", f"GET {url}: no answer within {self.timeout:g} s") from None
            except (OSError, _BadHttp) as exc:
                self._drop()
                if reused and attempt == 1 and isinstance(exc, _STALE_CONNECTION):
                    continue  # closed by the server while idle: once more on a new connection
                raise SourceError("transport_error", f"GET {url}: {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")

    def _connect(self, origin: tuple[str, str, int], url: str, deadline: float) -> None:
        scheme, host, port = origin
        try:
            sock = socket.create_connection((host, port), timeout=self._remaining(deadline, url))
        except TimeoutError:
            raise SourceError("timeout", f"GET {url}: no connection within {self.timeout:g} s") from None
        except ConnectionRefusedError as exc:
            raise SourceError("connection_refused", f"GET {url}: {exc}") from None
        except OSError as exc:  # DNS, unreachable
            raise SourceError("connect_error", f"GET {url}: {type(exc).__name__}: {exc}") from None
        if scheme == "https":
            try:
                sock.settimeout(self._remaining(deadline, url))
                sock = _tls_context().wrap_socket(sock, server_hostname=host)  # the handshake, verified
            except TimeoutError:
                sock.close()
                raise SourceError("timeout", f"GET {url}: no TLS handshake within {self.timeout:g} s") from None
            except OSError as exc:  # a certificate not trusted, a server that does not speak TLS
                sock.close()
                raise SourceError("connect_error", f"GET {url}: {type(exc).__name__}: {exc}") from None
            except SourceError:
                sock.close()
                raise
        self._sock, self._buf, self._pos = sock, b"", 0

    def _read_head(self, url: str, deadline: float) -> _Head:
        """The status line and headers of the next answer (1xx interim answers skipped)."""
        while True:
            buf, start = self._buf, self._pos
            while True:
                crlf, lf = buf.find(b"\r\n\r\n", start), buf.find(b"\n\n", start)  # bare LF: lenient
                end, skip = (crlf, 4) if crlf != -1 and (lf == -1 or crlf < lf) else (lf, 2)
                if end != -1:
                    break
                if len(buf) - start > MAX_HEAD_BYTES:
                    raise _BadHttp(f"response head over {MAX_HEAD_BYTES} bytes")
                data = self._recv(url, deadline)
                if not data:
                    if len(buf) == start:
                        raise _Closed("the connection closed without an answer")
                    raise _BadHttp("the connection closed inside the response head")
                buf, start = buf[start:] + data, 0
            self._buf, self._pos = buf, end + skip
            lines = buf[start:end].decode("latin-1").splitlines()
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not code.isdigit() or rest[3:4] not in ("", " "):
                raise _BadHttp(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
            status = int(code)
            headers: dict[str, str] = {}
            name = ""
            for line in lines[1:]:
                if line[:1] in (" ", "\t") and name:  # an obsolete folded continuation
                    headers[name] += " " + line.strip()
                    continue
                name, sep, value = line.partition(":")
                name = name.strip().lower()
                if not sep or not name:
                    raise _BadHttp(f"bad header line {line[:80]!r}")
                value = value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            if 100 <= status < 200 and status != 101:
                continue
            return _Head.of(status, version, headers)

    def _discard(self, head: _Head, url: str, deadline: float) -> None:
        """Read a redirect's small body so the connection serves the next request; else drop it."""
        if not head.keep_alive or head.chunked or head.length is None or head.length > MAX_DRAINED_REDIRECT_BODY:
            self._drop()
            return
        try:
            for _ in self._framed_body(head, url, deadline):
                pass
        except (OSError, _BadHttp, SourceError):
            self._drop()

    # -- reading -------------------------------------------------------------------------------

    def _recv(self, url: str, deadline: float) -> bytes:
        """One recv of up to ``self._read_size`` bytes (b"" at the end of the stream)."""
        self._sock.settimeout(self._remaining(deadline, url))
        return self._sock.recv(self._read_size)

    def _take(self, most: int, url: str, deadline: float) -> bytes:
        """Up to ``most`` bytes: what is buffered, else one recv (b"" at the end of the stream)."""
        buf, pos = self._buf, self._pos
        if pos < len(buf):
            end = pos + most
            if end >= len(buf):
                self._buf, self._pos = b"", 0
                return buf[pos:] if pos else buf
            self._pos = end
            return buf[pos:end]
        if most < self._read_size:
            self._sock.settimeout(self._remaining(deadline, url))
            return self._sock.recv(most)
        return self._recv(url, deadline)

    def _line(self, url: str, deadline: float) -> bytes:
        """The next line of chunked framing, without its line end."""
        buf, pos = self._buf, self._pos
        while True:
            nl = buf.find(b"\n", pos)
            if nl != -1:
                self._buf, self._pos = buf, nl + 1
                return buf[pos:nl].rstrip(b"\r")
            if len(buf) - pos > MAX_LINE_BYTES:
                raise _BadHttp(f"a chunked-framing line over {MAX_LINE_BYTES} bytes")
            data = self._recv(url, deadline)
            if not data:
                raise _BadHttp("the connection closed inside the chunked framing")
            buf, pos = buf[pos:] + data, 0

    def _framed_body(self, head: _Head, url: str, deadline: float) -> Iterator[bytes]:
        """The body's bytes as they arrive, framing removed; ``_BadHttp`` when cut short."""
        if head.chunked:
            while True:
                size_line = self._line(url, deadline).split(b";", 1)[0].strip()
                if not size_line or size_line.strip(b"0123456789abcdefABCDEF"):
                    raise _BadHttp(f"bad chunk size {size_line[:20]!r}")
                left = int(size_line, 16)
                if not left:
                    break
                while left:
                    data = self._take(left, url, deadline)
                    if not data:
                        raise _BadHttp("the connection closed inside a chunk")
                    left -= len(data)
                    yield data
                if self._line(url, deadline):
                    raise _BadHttp("a chunk longer than its size")
            for _ in range(MAX_TRAILER_LINES):
                if not self._line(url, deadline):
                    return
            raise _BadHttp("too many trailer lines")
        if head.length is not None:
            left = head.length
            while left:
                data = self._take(left, url, deadline)
                if not data:
                    raise _BadHttp(f"the connection closed {left} bytes before the end of the body")
                left -= len(data)
                yield data
            return
        while True:  # no length: the body ends when the server closes the connection
            data = self._take(self._read_size, url, deadline)
            if not data:
                return
            yield data

    def _remaining(self, deadline: float, url: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            self._drop()
            raise SourceError("timeout", f"GET {url}: not complete after {self.timeout:g} s")
        return left

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf, self._pos = None, b"", 0

    # -- the body ------------------------------------------------------------------------------

    def _body(self, head: _Head, url: str, deadline: float) -> Iterator[str]:
        if head.transfer_encoding_unknown:
            raise SourceError(
                "unsupported_encoding", f"GET {url}: Transfer-Encoding {head.headers['transfer-encoding']!r}"
            )
        content_encoding = head.headers.get("content-encoding", "").lower()
        if content_encoding in GZIP_ENCODINGS:
            inflater = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, 32 KiB window
        elif content_encoding in IDENTITY_ENCODINGS:
            inflater = None
        else:
            raise SourceError("unsupported_encoding", f"GET {url}: Content-Encoding {content_encoding!r}")
        cap = self.max_body_bytes
        if head.length is not None and head.length > cap:
            raise self._too_large(url, head.length)
        charset = head.charset
        try:
            decode = codecs.getincrementaldecoder(charset)("strict").decode
        except LookupError:
            raise SourceError("parse_error", f"GET {url}: unknown charset {charset!r}") from None
        size = 0  # bytes of the body after inflating
        parsing = True  # False once the caller's parsing has used its share of the timeout
        parse_budget = self.timeout * PARSE_SHARE
        parse_seconds = 0.0
        try:
            for received in self._framed_body(head, url, deadline):
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
                        if parse_seconds > parse_budget:
                            # The rest is only read and counted: to report a body over the cap
                            # as such, and a page too slow to parse as a timeout.
                            parsing = False
                            self._read_size = DRAIN_READ_SIZE
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
        except TimeoutError:
            raise SourceError("timeout", f"GET {url}: body not complete after {self.timeout:g} s") from None
        except (OSError, _BadHttp) as exc:  # a connection dropped mid-body, bad chunked framing
            raise SourceError("transport_error", f"GET {url}: {type(exc).__name__}: {exc}") from None
        except zlib.error as exc:  # a corrupt gzip body
            raise SourceError("transport_error", f"GET {url}: bad gzip body: {exc}") from None
        except UnicodeDecodeError:
            raise SourceError("parse_error", f"GET {url}: the body is not {charset} text") from None

    def _too_large(self, url: str, size: int) -> SourceError:
        return SourceError(
            "body_too_large", f"GET {url}: body of {size}+ bytes exceeds the cap of {self.max_body_bytes}"
        )


class _BadHttp(Exception):
    """The server's answer is not well-formed HTTP/1.x (reason ``transport_error``)."""


class _Closed(ConnectionError):
    """The connection closed before any byte of an answer (on a reused one: closed while idle)."""


# A reused connection that fails like this before any answer was closed by the server while idle.
_STALE_CONNECTION = (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


@dataclass(frozen=True, slots=True)
class _Head:
    """An answer's status line and headers (names lowercased), and how its body is framed."""

    status: int
    headers: dict[str, str]
    keep_alive: bool  # the connection may serve another request once the body is read
    chunked: bool
    length: int | None  # Content-Length; None: chunked, or up to the end of the stream
    transfer_encoding_unknown: bool
    charset: str

    @classmethod
    def of(cls, status: int, version: str, headers: dict[str, str]) -> _Head:
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
        transfer = headers.get("transfer-encoding", "").lower()
        chunked = transfer == "chunked"
        length = None
        if status in (204, 304):
            length = 0
        elif transfer:
            keep_alive = keep_alive and chunked
        elif "content-length" in headers:
            declared = {v.strip() for v in headers["content-length"].split(",")}
            if len(declared) != 1 or not next(iter(declared)).isdigit():
                raise _BadHttp(f"bad Content-Length {headers['content-length'][:40]!r}")
            length = int(declared.pop())
        else:
            keep_alive = False  # the body ends when the server closes the connection
        charset = "utf-8"
        for param in headers.get("content-type", "").split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset" and value.strip().strip('"'):
                charset = value.strip().strip('"')
        return cls(status, headers, keep_alive, chunked, length, bool(transfer) and not chunked, charset)


def _inflate_steps(inflater, data: bytes) -> Iterator[bytes]:
    """``data`` inflated in steps of at most ``READ_SIZE`` bytes: a gzip bomb never inflates at once."""
    while data:
        yield inflater.decompress(data, READ_SIZE)
        data = inflater.unconsumed_tail


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every connection of the process (loading CAs is the slow part)."""
    return ssl.create_default_context()
