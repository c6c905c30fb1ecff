"""The exporter's runtime: one collection thread, the cycle, the store and the pre-rendered page.

Every cycle (``settings.interval``) the runtime asks every collector for samples, isolated
(``isolation.py``: a hung or failing source costs that source only), merges them within
``max_series`` with the ``pod`` label (``series_budget.py``), records each source's outcome and
adds the self metrics (``accounting.py``), adds the decode-step floor and the SLO counters
(``slo_counters.py``), stores the snapshot in the
ring store, diagnoses the last window (``live_diagnosis.py``) and renders the whole exposition
once into bytes. ``metrics_bytes()`` hands out those bytes, so ``/metrics`` never waits on a source.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kvdoctor.exporter.accounting import ProcessSamples, SourceAccounting
from kvdoctor.exporter.exposition import ExpositionRenderer
from kvdoctor.exporter.isolation import IsolatedCollection
from kvdoctor.exporter.live_diagnosis import (
    DiagnoseHook,
    LiveDiagnosis,
    PublishedContext,
    decode_floor,
)
from kvdoctor.exporter.series_budget import SeriesMerger
from kvdoctor.exporter.slo_counters import SloCounters, slo_counts
from kvdoctor.exporter.store import RingStore
from kvdoctor.ledger.model import ModelShape
from kvdoctor.rules.thresholds import DIAGNOSIS_WINDOW_SECONDS
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collector
from kvdoctor.signals.window import Snapshot
from kvdoctor.sources.model_files import load_model

__all__ = ["Exporter"]

log = logging.getLogger("kvdoctor.exporter")


class Exporter:
    """Collects every ``interval``, keeps a window, serves a pre-rendered page.

    ``start()``/``stop()`` run the collection thread; ``run_cycle()`` runs one cycle in the
    caller's thread (tests, tools). ``metrics_bytes()``, ``diagnosis()``, ``status()`` and
    ``store`` are safe to read from any thread.
    """

    def __init__(
        self,
        settings: Any,
        collectors: Iterable[Collector],
        diagnose_hook: DiagnoseHook | None = None,
        clock: Callable[[], float] = time.time,
        model_shape: ModelShape | None = None,
    ):
        self.settings = settings
        self.collectors: list[Collector] = list(collectors)
        names = [c.name for c in self.collectors]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"two collectors named {duplicates[0]!r}")
        self.diagnose_hook = diagnose_hook
        self._clock = clock
        self.store = RingStore(settings.retention_seconds, settings.max_snapshots, settings.max_series, clock)
        self._renderer = ExpositionRenderer()
        self._metrics = b"# kvdoctor: no collection cycle has completed yet\n"
        self._live: LiveDiagnosis | None = None
        if diagnose_hook is not None:
            window = getattr(settings, "diagnosis_window", DIAGNOSIS_WINDOW_SECONDS)
            self._live = LiveDiagnosis(diagnose_hook, window)

        self._collection = IsolatedCollection(self.collectors, float(settings.scrape_timeout) * 1.2 + 0.05)
        self._merger = SeriesMerger(settings.max_series, getattr(settings, "pod", None) or None)
        self.accounting = SourceAccounting(names)
        self._process = ProcessSamples()  # build info and process_* (page only)
        self._last_ts = 0.0

        self.model_shape = model_shape
        if self.model_shape is None and getattr(settings, "model_config_path", None):
            try:
                self.model_shape = load_model(settings.model_config_path)
            except ValueError as exc:
                log.warning("decode-step floor disabled: %s", exc)
        self.published = PublishedContext(settings, self.model_shape)  # the SLO, model and GPU it diagnoses with
        published = self.published.context
        self._slo_counters = SloCounters(slo_counts(published.slo_seconds, published.ttft_slo_seconds))

        self.cycles = 0
        self.last_cycle_seconds = 0.0
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public, any thread
    def metrics_bytes(self) -> bytes:
        return self._metrics

    def diagnosis(self) -> dict | None:
        return self._live.latest if self._live is not None else None

    def status(self) -> dict[str, dict]:
        return self.accounting.status_json()

    def context(self) -> dict:
        """The context it diagnoses with and publishes: SLO, model shape, GPU, peak bandwidth."""
        return self.published.to_json()

    @property
    def diagnosing(self) -> bool:
        """Whether each cycle ends with a diagnosis (a ``diagnose_hook`` was given)."""
        return self.diagnose_hook is not None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Exporter:
        """Start the collection thread (idempotent). An exporter cannot be restarted after stop()."""
        if self.running:
            return self
        if self._stopped:
            raise RuntimeError("this exporter was stopped (its collectors are closed); build a new one")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="kvdoctor-exporter", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop collecting and close the collectors; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        self._collection.shutdown()
        for collector in self.collectors:
            try:
                collector.close()
            except Exception as exc:  # closing is best effort
                log.debug("closing collector %s: %s", collector.name, exc)

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        interval = float(self.settings.interval)
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.run_cycle()
            except Exception:  # never let one bad cycle end collection
                log.exception("collection cycle failed")
            next_tick += interval
            now = time.monotonic()
            if next_tick < now:  # overran: skip the ticks we missed instead of bursting
                next_tick = now + interval - ((now - next_tick) % interval)
            self._stop.wait(next_tick - now)

    # ------------------------------------------------------------------ one cycle
    def run_cycle(self) -> Snapshot:
        """Collect once, store, diagnose, render. Returns the stored snapshot."""
        started = time.perf_counter()
        outcomes = self._collection.collect_all()
        ts = max(self._clock(), self._last_ts + 1e-6)
        self._last_ts = ts

        collected = [(name, o.collected.samples) for name, o in outcomes.items() if o.kind == "ok" and o.collected]
        samples, kept, capped = self._merger.merge(collected, self.settings.max_series - self._reserved_series())
        for name in capped:
            self.accounting.count_error(name, "series_cap")
        self.accounting.record(outcomes, kept, ts)
        key = self._merger.self_key
        samples.update(self.accounting.self_samples(key))
        if self.model_shape is not None:
            floor = decode_floor(samples, self.model_shape, getattr(self.settings, "gpu_peak_bandwidth", None))
            if floor is not None:
                samples[key(S.DECODE_STEP_FLOOR, ())] = floor
        self.published.update(samples)
        samples.update(self.published.series(key))
        samples.update(self._slo_counters.samples(samples))

        snapshot = Snapshot(ts, samples)
        dropped = self.store.append(snapshot)
        if dropped:  # only when the runtime's own budget was wrong; keep it visible anyway
            self.accounting.count_error("store", "series_cap")

        # Page-only series: verdicts (a diagnosis error counted after the snapshot), build info, process_*.
        extra = self._live.page_series(self.store, ts, self.accounting, key) if self._live is not None else []
        page = dict(samples)
        page.update(extra)
        page.update(self._process.samples(key))
        self._metrics = self._renderer.render(tuple(page), list(page.values()))

        self.cycles += 1
        self.last_cycle_seconds = time.perf_counter() - started
        self.ready.set()
        return snapshot

    def _reserved_series(self) -> int:
        """Series kept free for the exporter's own: up and duration per source, the error
        counters, the floor and the verdicts."""
        n = len(self.collectors)
        verdicts = len(self._live.verdicts) if self._live is not None else 0
        slo = self._slo_counters.series
        return (
            2 * n + self.accounting.error_series + 2 * n + 1 + verdicts + 2 + slo
        )  # + the SLO, context info, SLO counters
