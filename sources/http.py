"""The one small HTTP client under kvdoctor's API clients (the exporter's API, Prometheus').

It owns what every client needs and none should copy:

- a deadline for the whole answer, not for each read: a server that trickles its body, each read
  well inside the timeout, is cut when the timeout has passed (checked after every read; connecting
  and the headers are each bounded by the timeout too);
- a cap on the body's size (as decoded), checked against its Content-Length first, then while reading;
- no redirects: the base URL is fixed once, and nothing an answer says makes the client fetch another
  URL (a dashboard must never be steered to one);
- every failure is one ``SourceError`` (``kvdoctor.signals.collection``, the exporter's collectors
  raise it too) whose message is one line naming the server and the path, and whose reason is
  the collectors' word for it: ``connection_refused`` or ``connect_error``, ``timeout``,
  ``transport_error`` (closed without an answer), ``http_<status>``, ``parse_error`` (not JSON),
  ``body_too_large``; ``bad_url`` for a base URL it cannot use.

An HTTP status is not a failure here: ``get`` and ``post_form`` return the ``Answer`` whatever its
status, since what a 404 or an error body means is the API's business; ``get_json`` is the common
case, a 200 with JSON or a ``SourceError``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import httpx

from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.units import MIB
from kvdoctor.sources.urls import UrlError, base_url

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Answer",
    "ApiClient",
    "Closing",
    "HttpClient",
    "check_base_url",
    "one_line",
]

DEFAULT_MAX_BYTES = 256 * MIB  # a bigger answer is refused, not parsed
MAX_MESSAGE_CHARS = 300

Params = Mapping[str, str | int | float]


def one_line(text: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def check_base_url(url: str, name: str) -> str:
    """``url`` as a base URL without a trailing slash (``sources/urls.py``); ``SourceError`` naming
    ``name`` where it is not one."""
    try:
        return base_url(url)
    except UrlError as exc:
        raise SourceError("bad_url", one_line(exc.about(name))) from None


@dataclass(frozen=True)
class Answer:
    """A whole answer: its status and body (``url`` is what was asked, without the query)."""

    url: str
    status: int
    reason: str
    content_type: str
    location: str  # where a redirect pointed (not followed)
    body: bytes

    def json(self) -> Any:
        """The body as JSON; ``ValueError`` when it is not JSON."""
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n} bytes"


class Closing:
    """``with client:`` closes the client when the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


class HttpClient(Closing):
    """Requests to one base URL; ``name`` is what the messages call the server ("Prometheus")."""

    def __init__(
        self,
        base_url: str,
        *,
        name: str,
        timeout: float,
        max_bytes: int = DEFAULT_MAX_BYTES,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"the timeout must be a positive number of seconds, got {timeout!r}")
        self.name = name
        self.base_url = check_base_url(base_url, name)
        self.timeout = float(timeout)
        self.max_bytes = int(max_bytes)
        self._client = httpx.Client(timeout=self.timeout, follow_redirects=False, headers=dict(headers or {}))

    def where(self, path: str) -> str:
        """``"<name> at <url>"``, how every message names the server."""
        return f"{self.name} at {self.base_url}{path}"

    def get(self, path: str, params: Params | None = None) -> Answer:
        return self._request("GET", path, params=params)

    def post_form(self, path: str, form: Mapping[str, str]) -> Answer:
        """A form-encoded POST (keeps long expressions out of the URL)."""
        return self._request("POST", path, data=form)

    def get_json(self, path: str, params: Params | None = None, *, missing: Collection[int] = ()) -> Any:
        """The JSON of a 200 answer; None for a status in ``missing``; ``SourceError`` otherwise."""
        answer = self.get(path, params)
        if answer.status in missing:
            return None
        if answer.status != 200:
            raise self.status_error(answer)
        try:
            return answer.json()
        except ValueError:
            raise SourceError(
                "parse_error",
                one_line(f"{self.where(path)} did not answer JSON ({answer.content_type or 'no content type'})"),
            ) from None

    def status_error(self, answer: Answer) -> SourceError:
        """The error for an answer whose status the caller cannot use."""
        text = f"{self.name} at {answer.url} answered HTTP {answer.status}"
        if 300 <= answer.status < 400 and answer.location:
            text += f", a redirect to {answer.location} (not followed: give that URL)"
        return SourceError(f"http_{answer.status}", one_line(text))

    def _request(self, method: str, path: str, **kwargs: Any) -> Answer:
        where = self.where(path)
        deadline = time.monotonic() + self.timeout
        try:
            with self._client.stream(method, self.base_url + path, **kwargs) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise self._too_big(where)
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise self._too_big(where)
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise self._timed_out(where)
                if time.monotonic() > deadline:  # the headers alone took the whole time
                    raise self._timed_out(where)
                return Answer(
                    url=self.base_url + path,
                    status=response.status_code,
                    reason=response.reason_phrase,
                    content_type=response.headers.get("content-type", ""),
                    location=response.headers.get("location", ""),
                    body=b"".join(chunks),
                )
        except httpx.TimeoutException:
            raise self._timed_out(where) from None
        except httpx.ConnectError as exc:
            refused = "refused" in str(exc).lower()
            why = "connection refused" if refused else (str(exc) or type(exc).__name__)
            reason = "connection_refused" if refused else "connect_error"
            raise SourceError(reason, one_line(f"cannot reach {where}: {why}")) from None
        except httpx.RemoteProtocolError:
            raise SourceError(
                "transport_error", one_line(f"{where} closed the connection without a complete answer")
            ) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise SourceError("transport_error", one_line(f"{where}: {type(exc).__name__}: {exc}")) from None

    def _timed_out(self, where: str) -> SourceError:
        return SourceError("timeout", one_line(f"{where} did not answer within {self.timeout:g} s"))

    def _too_big(self, where: str) -> SourceError:
        return SourceError("body_too_large", one_line(f"{where} sent an answer over {_size(self.max_bytes)}"))

    def close(self) -> None:
        self._client.close()


class ApiClient(Closing):
    """The base of one API's client: the ``HttpClient`` it asks through, and its base URL."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http

    @property
    def url(self) -> str:
        """The API's base URL."""
        return self._http.base_url

    def close(self) -> None:
        self._http.close()
