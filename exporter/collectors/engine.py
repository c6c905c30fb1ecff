"""The engine collector: scrape an inference engine's /metrics and normalise it with its adapter.

Fetch and parse are apart, but the page is never held whole: ``HttpExposition``
(``http.py``) yields the body as text decoded as it is read, and
``textparse.iter_samples_streamed`` parses the complete lines of each piece as it comes.
``EngineCollector`` picks the engine adapter (``--engine`` or recognised from the families on
the page, once, and again after a failure or when the page stops showing the engine it knew),
parses only the families the adapters want, and applies the engine adapter plus every KV-tier
adapter (LMCache, ...) whose families share the page.

Failure reasons (``kvdoctor_source_errors_total{source="engine",reason}``): ``timeout``,
``connection_refused``, ``connect_error`` (DNS, unreachable, TLS handshake), ``transport_error``
(connection dropped mid-response, malformed HTTP, a corrupt gzip body, too many redirects),
``http_<status>``, ``body_too_large``, ``parse_error`` (the body is not text in its declared
charset, or not an exposition, e.g. an HTML page), ``unsupported_encoding`` (a Content-Encoding
other than gzip, a Transfer-Encoding other than chunked), ``unknown_engine`` (no adapter
recognises the page).

An adapter may read JSON endpoints next to /metrics too (llama.cpp's ``/slots`` and ``/props``:
``EngineAdapter.endpoints``). Each is fetched after the page, within what is left of the
timeout, with its own size cap; only the numbers its reader needs survive parsing. One that
fails is not a failure of the source: the /metrics part stays up, and its reason is counted
as a partial error prefixed with the endpoint's name (``slots_http_501``, ``slots_timeout``,
``props_parse_error``). One that answers "not here" (HTTP 401, 403, 404, 405, 501: disabled,
or protected) is asked again only after ``ENDPOINT_RETRY_SECONDS``.

Every collection also yields ``kvdoctor_engine_info{engine,adapter,selection,endpoints,
cannot_provide} 1``; ``describe()`` is the same for ``/api/v1/status``, and the adapter is
logged once when it is recognised or changes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kvdoctor.exporter.adapters import ADAPTERS, TIER_ADAPTERS, detect, normalise_page
from kvdoctor.exporter.adapters.base import EngineAdapter, JsonEndpoint
from kvdoctor.exporter.collectors.base import register
from kvdoctor.signals.collection import Collected, NotApplicable, SourceError
from kvdoctor.signals.textparse import ExpositionError, iter_samples_streamed
from kvdoctor.signals.vocabulary import ENGINE_INFO, Kind, signal_for_series
from kvdoctor.signals.window import SeriesKey
from kvdoctor.sources.environment import ENV_PREFIX
from kvdoctor.sources.paths import METRICS_PATH

from .http import DEFAULT_MAX_BODY_BYTES, DEFAULT_TIMEOUT_SECONDS, HttpExposition

log = logging.getLogger("kvdoctor.exporter")

ENDPOINT_RETRY_SECONDS = 60.0  # before asking again an endpoint that answered "not here"
ENDPOINT_ABSENT = frozenset({"http_401", "http_403", "http_404", "http_405", "http_501"})
MIN_ENDPOINT_SECONDS = 0.05  # less left of the timeout than this: the endpoint is not asked


def parse_exposition(
    page: str | Iterable[str], wanted: frozenset[str] | None = None, names: set[str] | None = None
) -> list[tuple[str, dict, float]]:
    """``(name, labels, value)`` for the wanted samples of a page; ``SourceError("parse_error")``.

    ``page``: the whole text, or its pieces as they arrive (``HttpExposition.iter_text()``; it is
    closed here, read to the end or not). ``names``, when given, receives the page's family names.
    """
    pieces = (page,) if isinstance(page, str) else page
    try:
        return list(iter_samples_streamed(pieces, wanted, names=names))
    except ExpositionError as exc:
        raise SourceError("parse_error", str(exc)) from None
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()


@functools.cache
def _any_adapter_wanted() -> frozenset[str]:
    """Every family any engine or KV-tier adapter reads or recognises an engine by."""
    return frozenset().union(
        *(a.wanted_names() | frozenset(a.detect) for a in ADAPTERS.values()),
        *(tier.wanted_names() for tier in TIER_ADAPTERS.values()),
    )


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


def endpoint_url(metrics_url: str, path: str) -> str:
    """The URL of an endpoint next to the engine's /metrics: same origin, and the same path prefix
    when the metrics path ends in /metrics (``http://h/llm/metrics`` -> ``http://h/llm/slots``)."""
    parts = urlsplit(metrics_url)
    prefix = parts.path.rstrip("/")
    prefix = prefix[: -len(METRICS_PATH)] if prefix.endswith(METRICS_PATH) else ""
    return urlunsplit((parts.scheme, parts.netloc, prefix + path, "", ""))


@dataclass
class _Endpoint:
    """One JSON endpoint of the adapter in use, and how it last answered."""

    spec: JsonEndpoint
    url: str
    http: HttpExposition
    up: bool | None = None  # None: not asked yet
    reason: str | None = None
    retry_at: float = 0.0


class EngineCollector:
    """One engine's /metrics, as canonical samples.

    ``engine``: an adapter name, or ``"auto"`` to recognise the engine from the page's families
    (once; again after any failed collection, in case another engine now answers on the port).
    ``extra_labels`` (e.g. ``{"pod": ...}``) go on every sample. KV-tier adapters whose families
    are on the same page are applied too, with the engine's name in their ``engine`` label; where
    both produce the very same series, the engine adapter's value is kept.
    """

    name = "engine"

    def __init__(
        self,
        url: str | None,
        engine: str = "auto",
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        extra_labels: Mapping[str, str] | None = None,
    ):
        if engine != "auto" and engine not in ADAPTERS:
            raise ValueError(f"unknown engine {engine!r} (choose from auto, {', '.join(sorted(ADAPTERS))})")
        self.url = url or None
        self.engine = engine
        self.timeout = float(timeout)
        self.extra_labels = dict(extra_labels or {})
        self._http = HttpExposition(url, timeout, max_body_bytes) if url else None
        self._endpoints: list[_Endpoint] = []
        self._announced: str | None = None  # the adapter last logged
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
        started = time.monotonic()
        try:
            partial_errors: list[str] = []
            # The page is parsed as it arrives, never held whole (see the module docstring).
            samples = self._normalise(self._http.iter_text, partial_errors, started)
        except SourceError:
            if self.engine == "auto":
                self._use(None)  # recognise the engine again on the next success
            raise
        self._announce()
        samples[self.info_key()] = 1.0
        return Collected(samples, partial_errors)

    def cannot_provide(self) -> list[str]:
        """The canonical signals the engine in use cannot provide now: what its adapter declares,
        and what only endpoints that are unavailable now would give."""
        adapter = self._adapter
        if adapter is None:
            return []
        failing = {s for ep in self._endpoints if ep.up is False for s in ep.spec.provides}
        working = {s for ep in self._endpoints if ep.up for s in ep.spec.provides}
        return sorted(set(adapter.cannot_provide) | (failing - working))

    def describe(self) -> dict[str, Any]:
        """What ``/api/v1/status`` says about the engine: the adapter, how it was chosen, the
        endpoints it reads and how they last answered, what the engine cannot provide."""
        adapter = self._adapter
        return {
            "url": self.url,
            "adapter": adapter.name if adapter else None,
            "selection": "auto" if self.engine == "auto" else "configured",
            "endpoints": {
                ep.spec.path: {"url": ep.url, "up": ep.up, "last_error_reason": ep.reason} for ep in self._endpoints
            },
            "cannot_provide": self.cannot_provide(),
        }

    def info_key(self) -> SeriesKey:
        """The ``kvdoctor_engine_info`` series of the adapter in use (every collection adds it, = 1)."""
        adapter = self._adapter
        assert adapter is not None
        endpoints = [METRICS_PATH, *(ep.spec.path for ep in self._endpoints if ep.up)]
        labels = {
            **self.extra_labels,
            "engine": adapter.name,
            "adapter": adapter.name,
            "selection": "auto" if self.engine == "auto" else "configured",
            "endpoints": ",".join(endpoints),
            "cannot_provide": ",".join(n.removeprefix("kvdoctor_") for n in self.cannot_provide()),
        }
        return (ENGINE_INFO, tuple(sorted(labels.items())))

    def _announce(self) -> None:
        """Log the adapter once when it is recognised or changes."""
        adapter = self._adapter
        if adapter is None or adapter.name == self._announced:
            return
        self._announced = adapter.name
        how = "recognised from its /metrics" if self.engine == "auto" else "as configured"
        reads = ", ".join([METRICS_PATH, *(ep.spec.path for ep in self._endpoints)])
        gaps = ", ".join(n.removeprefix("kvdoctor_") for n in self.cannot_provide()) or "nothing"
        log.info("engine %s: adapter %s (%s); reads %s; cannot provide: %s", self.url, adapter.name, how, reads, gaps)

    def normalise(self, text: str, partial_errors: list[str] | None = None) -> dict[SeriesKey, float]:
        """The canonical samples of one page (the pure half of ``collect``, without ``engine_info``).

        Raw samples are cleaned first: a repeated series keeps its first sample (as Prometheus
        does; ``duplicate_series``), NaN and +-Inf samples are dropped (``non_finite_value``).
        A counter or histogram series lower than in the previous page is flagged
        ``counter_reset`` but passes through (raw counters: ``rate()`` handles resets).
        Each reason goes once per page into ``partial_errors`` when given.
        """
        return self._normalise(lambda: (text,), partial_errors)

    def _normalise(
        self,
        open_page: Callable[[], Iterable[str]],
        partial_errors: list[str] | None,
        started: float | None = None,
    ) -> dict[SeriesKey, float]:
        """``normalise`` of the page ``open_page()`` yields in pieces (called again, i.e. the page
        fetched again, only when the engine it showed must be recognised anew); with ``started``
        (when the collection began), the adapter's JSON endpoints are read too."""
        adapter = self._adapter
        if adapter is None:
            adapter, raw = self._recognise(open_page())
        else:
            raw = parse_exposition(open_page(), self._wanted)
            if self.engine == "auto" and not any(name in self._engine_names for name, _, _ in raw):
                # The page no longer shows the engine we knew: another engine may answer here now.
                # Only our engine's families were kept, so the page is read again, all of it.
                adapter, raw = self._recognise(open_page())
        errors = partial_errors if partial_errors is not None else []
        if started is not None and self._endpoints:
            raw.extend(self._read_endpoints(started, errors))
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

    def _recognise(self, pieces: Iterable[str]) -> tuple[EngineAdapter, list[tuple[str, dict, float]]]:
        """The engine adapter recognised from the page's family names, now in use, and the
        page's samples it wants; in one reading of the page (every adapter's families kept)."""
        names: set[str] = set()
        raw = parse_exposition(pieces, _any_adapter_wanted(), names)
        adapter = detect(names)
        if adapter is None:
            raise SourceError(
                "unknown_engine", f"no engine adapter ({', '.join(ADAPTERS)}) recognises the page at {self.url}"
            )
        self._use(adapter)
        wanted = self._wanted
        return adapter, [sample for sample in raw if sample[0] in wanted]

    def _read_endpoints(self, started: float, errors: list[str]) -> list[tuple[str, dict, float]]:
        """The raw samples of the adapter's JSON endpoints, each asked within what is left of the
        timeout; a failure is a partial error (``<endpoint>_<reason>``), never the source's."""
        raw: list[tuple[str, dict, float]] = []
        gave: set[str] = set()
        for ep in self._endpoints:
            spec = ep.spec
            if any(name in gave for name in spec.only_without) or time.monotonic() < ep.retry_at:
                continue
            left = self.timeout - (time.monotonic() - started)
            if left < MIN_ENDPOINT_SECONDS:  # not its fault: counted, its state left as it was
                errors.append(f"{spec.name}_timeout")
                continue
            ep.http.timeout = left
            try:
                samples = spec.samples(ep.http.fetch())
            except SourceError as exc:
                self._endpoint_failed(ep, exc.reason, str(exc), errors)
                continue
            except (ValueError, RecursionError) as exc:  # not the JSON the reader expects
                self._endpoint_failed(ep, "parse_error", f"GET {ep.url}: {type(exc).__name__}: {exc}", errors)
                continue
            if ep.up is False:
                log.info("engine endpoint %s: answering again", ep.url)
            ep.up, ep.reason = True, None
            if samples:
                gave.add(spec.name)
            raw.extend((name, dict(labels), value) for name, labels, value in samples)
        return raw

    def _endpoint_failed(self, ep: _Endpoint, reason: str, message: str, errors: list[str]) -> None:
        errors.append(f"{ep.spec.name}_{reason}")
        if ep.up is not False or ep.reason != reason:
            log.warning("engine endpoint %s unavailable: %s (%s); /metrics is still read", ep.url, reason, message)
        ep.up, ep.reason = False, reason
        if reason in ENDPOINT_ABSENT:
            ep.retry_at = time.monotonic() + ENDPOINT_RETRY_SECONDS

    def _use(self, adapter: EngineAdapter | None) -> EngineAdapter | None:
        specs = adapter.endpoints if adapter is not None else ()
        if tuple(ep.spec for ep in self._endpoints) != specs:
            for ep in self._endpoints:
                ep.http.close()
            self._endpoints = [
                _Endpoint(spec, url, HttpExposition(url, self.timeout, spec.max_body_bytes))
                for spec in specs
                if self.url
                for url in (endpoint_url(self.url, spec.path),)
            ]
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
        for ep in self._endpoints:
            ep.http.close()


def engine_status(collectors: Iterable[Any]) -> dict[str, Any] | None:
    """``describe()`` of the engine collector among ``collectors``, or None if there is none."""
    for collector in collectors:
        if isinstance(collector, EngineCollector):
            return collector.describe()
    return None


def labels_from_settings(settings) -> dict[str, str]:
    """The labels every sample gets (``pod`` when configured)."""
    pod = getattr(settings, "pod", None)
    return {"pod": pod} if pod else {}


def configured_url(settings, field: str, what: str) -> str:
    """The URL setting ``field`` (e.g. ``engine_url``); NotApplicable where it is not set."""
    url = getattr(settings, field, None)
    if not url:
        flag, variable = "--" + field.replace("_", "-"), ENV_PREFIX + field.upper()
        raise NotApplicable(f"no {what} URL configured ({flag} / {variable})")
    return str(url)


def scrape_options(settings) -> dict[str, Any]:
    """What an HTTP-scraping collector takes from the settings: ``--scrape-timeout``,
    ``--max-body-bytes`` (their defaults where unset) and the labels every sample gets."""
    return {
        "timeout": getattr(settings, "scrape_timeout", None) or DEFAULT_TIMEOUT_SECONDS,
        "max_body_bytes": getattr(settings, "max_body_bytes", None) or DEFAULT_MAX_BODY_BYTES,
        "extra_labels": labels_from_settings(settings),
    }


@register("engine", "the inference engine's /metrics (vLLM, SGLang, TensorRT-LLM, TGI, llama.cpp), normalised", True)
def engine_collector(settings) -> EngineCollector:
    """Factory: ``--engine-url`` (none: not applicable), ``--engine``, ``--scrape-timeout``, ``--max-body-bytes``."""
    return EngineCollector(
        configured_url(settings, "engine_url", "engine"),
        engine=getattr(settings, "engine", "auto") or "auto",
        **scrape_options(settings),
    )
