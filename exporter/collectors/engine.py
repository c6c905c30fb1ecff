"""The engine collector: scrape an inference engine's /metrics and normalise it with its adapter.

Fetch and parse are apart (STYLE.md): ``HttpExposition`` fetches one exposition over HTTP (one
reused ``httpx.Client``, a streamed body with a size cap, an overall deadline) and turns every way
it can fail into a ``SourceError`` with a short reason; the dcgm collector uses it too.
``EngineCollector`` picks the engine adapter (``--engine`` or recognised from the families on the
page, once, and again after a failure), parses only the families the adapters want, and applies
the engine adapter plus every KV-tier adapter (LMCache, ...) whose families share the page.

Failure reasons (``kvdoctor_source_errors_total{source="engine",reason}``): ``timeout``,
``connection_refused``, ``connect_error`` (DNS, unreachable), ``transport_error`` (connection
dropped mid-response, bad HTTP), ``http_<status>``, ``body_too_large``, ``parse_error`` (the body
is not an exposition, e.g. an HTML page), ``unknown_engine`` (no adapter recognises the page).
"""

from __future__ import annotations

import errno
import functools
import ssl
import time
import zlib
from typing import Mapping

import httpx

from kvdoctor.exporter.adapters import ADAPTERS, TIER_ADAPTERS, detect, normalise_page
from kvdoctor.exporter.adapters.base import EngineAdapter
from kvdoctor.exporter.textparse import ExpositionError, family_names, iter_samples
from kvdoctor.rules.signals import Kind, signal_for_series
from kvdoctor.rules.window import SeriesKey

from .base import Collected, NotApplicable, SourceError, register

DEFAULT_TIMEOUT_SECONDS = 2.0
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # vLLM's page is ~50 KB; this only stops a runaway body
# Prometheus' own preference: the classic text format first, OpenMetrics accepted.
ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
# Only gzip is asked for: it is inflated here, in bounded steps, so the size cap holds on the
# inflated size (httpx's own decoder inflates a whole read at once, ~1000:1 for a gzip bomb).
REQUEST_HEADERS = {"Accept": ACCEPT, "Accept-Encoding": "gzip"}
GZIP_ENCODINGS = frozenset({"gzip", "x-gzip"})
IDENTITY_ENCODINGS = frozenset({"", "identity"})


class HttpExposition:
    """GET one exposition page, as text, or raise ``SourceError(reason)``.

    ``timeout`` bounds connecting and each read, and the whole body is abandoned once the time
    since the request started exceeds it (a server that trickles bytes cannot hold a cycle for
    longer than about twice the timeout). ``client`` may be passed in (tests, shared pools);
    otherwise one client is made with the fetcher and reused, keeping the connection alive.
    Redirects are followed (a Prometheus app mounted at /metrics may redirect to /metrics/).
    """

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, client: httpx.Client | None = None):
        self.url = url
        self.timeout = float(timeout)
        self.max_body_bytes = int(max_body_bytes)
        self._owns_client = client is None
        # Made here, not on the first fetch: the first client of a process loads the CA bundle
        # (0.15-0.35 s), which must not eat into the first collection's deadline.
        self._client = client or self._new_client()

    def _new_client(self) -> httpx.Client:
        return httpx.Client(timeout=self.timeout, follow_redirects=True, headers=REQUEST_HEADERS,
                            verify=_tls_context())

    def _http(self) -> httpx.Client:
        if self._client is None:  # closed, then used again
            self._client = self._new_client()
        return self._client

    def fetch(self) -> str:
        deadline = time.monotonic() + self.timeout
        try:
            with self._http().stream("GET", self.url, timeout=self.timeout, headers=REQUEST_HEADERS) as response:
                if not 200 <= response.status_code < 300:
                    raise SourceError(f"http_{response.status_code}", f"GET {self.url}: HTTP {response.status_code}")
                content_encoding = response.headers.get("content-encoding", "").strip().lower()
                if content_encoding in GZIP_ENCODINGS:
                    inflater = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, 32 KiB window
                elif content_encoding in IDENTITY_ENCODINGS:
                    inflater = None
                else:
                    raise SourceError("unsupported_encoding", f"GET {self.url}: Content-Encoding {content_encoding!r}")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_body_bytes:
                    raise self._too_large(int(declared))
                body = bytearray()
                cap = self.max_body_bytes
                for chunk in response.iter_raw():  # as sent: inflated below, never more than the cap + 1
                    if inflater is None:
                        body += chunk
                    else:
                        while chunk:
                            body += inflater.decompress(chunk, cap + 1 - len(body))
                            if len(body) > cap:
                                raise self._too_large(len(body))
                            chunk = inflater.unconsumed_tail
                    if len(body) > cap:
                        raise self._too_large(len(body))
                    if time.monotonic() > deadline:
                        raise SourceError("timeout", f"GET {self.url}: body not complete after {self.timeout:g} s")
                if inflater is not None:
                    body += inflater.flush()
                    if len(body) > cap:
                        raise self._too_large(len(body))
                encoding = response.charset_encoding or "utf-8"
        except httpx.TimeoutException:
            raise SourceError("timeout", f"GET {self.url}: no answer within {self.timeout:g} s") from None
        except httpx.ConnectError as exc:
            raise SourceError(_connect_reason(exc), f"GET {self.url}: {exc}") from None
        except httpx.HTTPError as exc:  # protocol errors, a connection dropped mid-body
            raise SourceError("transport_error", f"GET {self.url}: {type(exc).__name__}: {exc}") from None
        except zlib.error as exc:  # a corrupt gzip body
            raise SourceError("transport_error", f"GET {self.url}: bad gzip body: {exc}") from None
        try:
            return body.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            raise SourceError("parse_error", f"GET {self.url}: the body is not {encoding} text") from None

    def _too_large(self, size: int) -> SourceError:
        return SourceError("body_too_large", f"GET {self.url}: body of {size}+ bytes exceeds the cap of {self.max_body_bytes}")

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every client of the process (loading CAs is the slow part)."""
    return httpx.create_ssl_context()


def _connect_reason(exc: BaseException) -> str:
    seen: BaseException | None = exc
    for _ in range(8):  # httpx wraps httpcore's error, which wraps the OSError
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == errno.ECONNREFUSED:
            return "connection_refused"
        seen = seen.__cause__ or seen.__context__
    return "connection_refused" if "refused" in str(exc).lower() else "connect_error"


def parse_exposition(text: str, wanted: frozenset[str] | None = None) -> list[tuple[str, dict, float]]:
    """``(name, labels, value)`` for the wanted samples of ``text``; ``SourceError("parse_error")``."""
    try:
        return [(name, labels, value) for name, labels, value, _ts in iter_samples(text, wanted)]
    except ExpositionError as exc:
        raise SourceError("parse_error", str(exc)) from None


def _clean_raw(raw: list[tuple[str, dict, float]], errors: list[str]) -> list[tuple[str, dict, float]]:
    """``raw`` without repeated series (the first kept) and non-finite samples; reasons to ``errors``."""
    seen: set = set()
    add = seen.add
    out = []
    append = out.append
    duplicates = non_finite = False
    for sample in raw:
        name, labels, value = sample
        key = (name, tuple(labels.items()))
        if key in seen:
            duplicates = True
            continue
        add(key)
        if value - value != 0.0:  # NaN and +-Inf (inf - inf is NaN)
            non_finite = True
            continue
        append(sample)
    if duplicates:
        errors.append("duplicate_series")
    if non_finite:
        errors.append("non_finite_value")
    return out


class EngineCollector:
    """One engine's /metrics, as canonical samples.

    ``engine``: an adapter name, or ``"auto"`` to recognise the engine from the page's families
    (once; again after any failed collection, in case another engine now answers on the port).
    ``extra_labels`` (e.g. ``{"pod": ...}``) go on every sample. KV-tier adapters whose families
    are on the same page are applied too, with the engine's name in their ``engine`` label; where
    both produce the very same series, the engine adapter's value is kept.
    """

    name = "engine"

    def __init__(self, url: str | None, engine: str = "auto", timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, extra_labels: Mapping[str, str] | None = None,
                 client: httpx.Client | None = None):
        if engine != "auto" and engine not in ADAPTERS:
            raise ValueError(f"unknown engine {engine!r} (choose from auto, {', '.join(sorted(ADAPTERS))})")
        self.url = url or None
        self.engine = engine
        self.extra_labels = dict(extra_labels or {})
        self._http = HttpExposition(url, timeout, max_body_bytes, client) if url else None
        self._adapter: EngineAdapter | None = None if engine == "auto" else ADAPTERS[engine]
        self._wanted: frozenset[str] | None = None
        self._engine_names: frozenset[str] = frozenset()
        self._monotonic: dict[str, bool] = {}  # canonical name -> counter or histogram series
        self._previous: dict[SeriesKey, float] = {}  # last page's counter/histogram values
        self._use(self._adapter)

    @property
    def adapter(self) -> EngineAdapter | None:
        """The adapter in use (None until an ``auto`` collector has recognised its engine)."""
        return self._adapter

    def collect(self) -> Collected:
        if self._http is None:
            raise NotApplicable("no engine URL configured")
        try:
            text = self._http.fetch()
            partial_errors: list[str] = []
            return Collected(self.normalise(text, partial_errors), partial_errors)
        except SourceError:
            if self.engine == "auto":
                self._use(None)  # recognise the engine again on the next success
            raise

    def normalise(self, text: str, partial_errors: list[str] | None = None) -> dict[SeriesKey, float]:
        """The canonical samples of one page (the pure half of ``collect``).

        Raw samples are cleaned first: a repeated series keeps its first sample (as Prometheus
        does; ``duplicate_series``), NaN and +-Inf samples are dropped (``non_finite_value``).
        A counter or histogram series lower than in the previous page is flagged
        ``counter_reset`` but passes through (raw counters: ``rate()`` handles resets).
        Each reason goes once per page into ``partial_errors`` when given.
        """
        adapter = self._adapter or self._use(self._recognise(text))
        raw = parse_exposition(text, self._wanted)
        if self.engine == "auto" and not any(name in self._engine_names for name, _, _ in raw):
            # The page no longer shows the engine we knew: another engine may answer here now.
            adapter = self._use(self._recognise(text))
            raw = parse_exposition(text, self._wanted)
        errors = partial_errors if partial_errors is not None else []
        raw = _clean_raw(raw, errors)
        out = normalise_page(adapter, raw, self.extra_labels)
        self._check_resets(out, errors)
        return out

    def _check_resets(self, samples: dict[SeriesKey, float], errors: list[str]) -> None:
        monotonic = self._monotonic
        previous = self._previous
        current: dict[SeriesKey, float] = {}
        reset = False
        for key, value in samples.items():
            name = key[0]
            is_monotonic = monotonic.get(name)
            if is_monotonic is None:
                signal = signal_for_series(name)
                is_monotonic = monotonic[name] = signal is not None and signal.kind is not Kind.GAUGE
            if is_monotonic:
                current[key] = value
                if not reset:
                    before = previous.get(key)
                    if before is not None and value < before:
                        reset = True
        self._previous = current
        if reset:
            errors.append("counter_reset")

    def _recognise(self, text: str) -> EngineAdapter:
        try:
            names = family_names(text)
        except ExpositionError as exc:
            raise SourceError("parse_error", str(exc)) from None
        adapter = detect(names)
        if adapter is None:
            raise SourceError("unknown_engine", f"no engine adapter ({', '.join(ADAPTERS)}) recognises the page at {self.url}")
        return adapter

    def _use(self, adapter: EngineAdapter | None) -> EngineAdapter | None:
        self._adapter = adapter
        if adapter is None:
            self._wanted, self._engine_names = None, frozenset()
        else:
            self._engine_names = adapter.wanted_names() | frozenset(adapter.detect)
            self._wanted = self._engine_names.union(*(tier.wanted_names() for tier in TIER_ADAPTERS.values()))
        return adapter

    def close(self) -> None:
        if self._http is not None:
            self._http.close()


def labels_from_settings(settings) -> dict[str, str]:
    """The labels every sample gets (``pod`` when configured)."""
    pod = getattr(settings, "pod", None)
    return {"pod": pod} if pod else {}


@register("engine", "the inference engine's /metrics (vLLM, SGLang, TensorRT-LLM, TGI, llama.cpp), normalised", True)
def engine_collector(settings) -> EngineCollector:
    """Factory: ``--engine-url`` (none: not applicable), ``--engine``, ``--scrape-timeout``, ``--max-body-bytes``."""
    url = getattr(settings, "engine_url", None)
    if not url:
        raise NotApplicable("no engine URL configured (--engine-url / KVDOCTOR_ENGINE_URL)")
    return EngineCollector(
        url,
        engine=getattr(settings, "engine", "auto") or "auto",
        timeout=getattr(settings, "scrape_timeout", None) or DEFAULT_TIMEOUT_SECONDS,
        max_body_bytes=getattr(settings, "max_body_bytes", None) or DEFAULT_MAX_BODY_BYTES,
        extra_labels=labels_from_settings(settings),
    )
