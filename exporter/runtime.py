"""The exporter's runtime: one collection thread, isolated collectors, the store and the page.

Every cycle (``settings.interval``) the runtime asks each collector for samples on its own worker
thread and waits for them up to a deadline, so a hung source (an engine that stops answering, an
NVML call stuck on a GPU that fell off the bus) costs that source its ``source_up`` and nothing
else. Outcomes:

- samples                -> ``kvdoctor_source_up{source} 1``; ``partial_errors`` are counted in
                            ``kvdoctor_source_errors_total{source,reason}`` but the source stays up
- ``NotApplicable``      -> no ``source_up`` series at all (nothing to collect here, not an error);
                            asked again every ``NOT_APPLICABLE_RETRY_SECONDS``
- ``SourceError(reason)``-> ``source_up 0``, ``errors_total{reason}`` + 1
- any other exception    -> the same with ``reason="exception"``
- past the deadline      -> the same with ``reason="timeout"``; the late answer is discarded

The merged samples (plus ``pod`` when configured, plus the self metrics) go into the ring store as
one snapshot, then the whole exposition is rendered once into bytes; ``metrics_bytes()`` hands out
those bytes, so ``/metrics`` never waits on a source. With a ``diagnose_hook`` the last 60 s are
diagnosed every cycle and ``kvdoctor_diagnosis_verdict{verdict}`` is added to the page.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvdoctor.exporter.exposition import ExpositionRenderer
from kvdoctor.exporter.store import RingStore
from kvdoctor.rules import signals as S
from kvdoctor.rules.collection import Collected, Collector, NotApplicable, SourceError
from kvdoctor.rules.ledger import decode_step_floor, kv_bytes_per_token
from kvdoctor.rules.window import Labels, SeriesKey, Snapshot, Window

log = logging.getLogger("kvdoctor.exporter")

DIAGNOSIS_WINDOW_SECONDS = 60.0
# Fewer snapshots than this give no rates (one snapshot has no increase): no verdict yet, rather
# than an "idle" or a low-confidence slow verdict read off a single instant after a restart.
MIN_DIAGNOSIS_SNAPSHOTS = 3
NOT_APPLICABLE_RETRY_SECONDS = 30.0
MAX_REASONS_PER_SOURCE = 16  # error reasons are label values: keep their number bounded
DIAGNOSIS_SOURCE = "diagnosis"  # errors of the diagnose hook are counted under this source

_REASON_CHARS = re.compile(r"[^a-z0-9_]+")


class Diagnosis(Protocol):
    verdict: str

    def to_json(self) -> dict: ...


def clean_reason(reason: Any) -> str:
    """A reason as a short snake_case label value."""
    text = _REASON_CHARS.sub("_", str(reason).strip().lower()).strip("_")[:64]
    return text or "unknown"


def known_verdicts() -> tuple[str, ...]:
    """Every verdict id: the verdict gauge is a state set over all of them."""
    from kvdoctor.rules.diagnosis import VERDICTS

    return tuple(VERDICTS)


def load_model_shape(path: str | Path):
    """The ledger's ModelShape from a Hugging Face config.json; ValueError if unusable."""
    from kvdoctor.rules.ledger import ModelShape

    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read model config {str(path)!r}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model config {str(path)!r} is not a JSON object")
    shape = ModelShape.from_hf_config(config)
    try:
        shape.weight_bytes  # noqa: B018  (validates the dtype now rather than every cycle)
    except ValueError as exc:
        raise ValueError(f"model config {str(path)!r}: {exc}") from None
    return shape


@dataclass
class SourceStatus:
    """What ``/api/v1/status`` says about one source."""

    name: str
    applicable: bool | None = None  # None until the source has been asked once
    up: bool | None = None
    last_scrape: float | None = None  # when the last answer (or timeout) came
    last_success: float | None = None
    duration_seconds: float | None = None
    series: int = 0
    last_error: str | None = None
    last_error_reason: str | None = None
    last_error_at: float | None = None
    errors: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "applicable": self.applicable,
            "up": self.up,
            "last_scrape": self.last_scrape,
            "last_success": self.last_success,
            "duration_seconds": self.duration_seconds,
            "series": self.series,
            "last_error": self.last_error,
            "last_error_reason": self.last_error_reason,
            "last_error_at": self.last_error_at,
            "errors": dict(self.errors),
        }


def _family_fair_keys(samples: dict[SeriesKey, float], share: int) -> list[SeriesKey]:
    """At most ``share`` keys of ``samples``, shared fairly among signal families.

    Water-filling over families (a histogram's ``_bucket``/``_sum``/``_count`` are one family):
    the smallest families are kept whole first, each taking no more than an equal part of what
    is left, so the largest (an exploding label) is the one cut and cannot push out the others.
    """
    families: dict[str, list[SeriesKey]] = {}
    family_of: dict[str, str] = {}
    for key in samples:
        name = key[0]
        family = family_of.get(name)
        if family is None:
            signal = S.signal_for_series(name)
            family = family_of[name] = signal.name if signal is not None else name
        families.setdefault(family, []).append(key)
    groups = sorted(families.values(), key=len)
    kept: list[SeriesKey] = []
    budget = share
    for position, group in enumerate(groups):
        part = max(0, budget // (len(groups) - position))
        taken = group[:part]
        kept.extend(taken)
        budget -= len(taken)
    return kept


@dataclass
class _Outcome:
    kind: str  # "ok" | "not_applicable" | "error" | "timeout"
    duration: float
    collected: Collected | None = None
    reason: str = ""
    message: str = ""


def _call(collector: Collector) -> _Outcome:
    """One collection, never raising: the isolation STYLE.md asks for."""
    start = time.perf_counter()
    try:
        collected = collector.collect()
        if not isinstance(collected, Collected):
            raise TypeError(f"collect() returned {type(collected).__name__}, not Collected")
        return _Outcome("ok", time.perf_counter() - start, collected)
    except NotApplicable as exc:
        return _Outcome("not_applicable", time.perf_counter() - start, message=str(exc))
    except SourceError as exc:
        return _Outcome("error", time.perf_counter() - start, reason=clean_reason(exc.reason), message=str(exc))
    except Exception as exc:  # any bug in a collector is that collector's failure only
        return _Outcome(
            "error", time.perf_counter() - start, reason="exception", message=f"{type(exc).__name__}: {exc}"
        )


class Exporter:
    """Collects every ``interval``, keeps a window, serves a pre-rendered page.

    ``start()``/``stop()`` run the collection thread; ``run_cycle()`` runs one cycle in the
    caller's thread (tests, tools). ``metrics_bytes()``, ``diagnosis()``, ``status()`` and
    ``store`` are safe to read from any thread.
    """

    def __init__(
        self,
        settings,
        collectors: Iterable[Collector],
        diagnose_hook: Callable[[Window], Diagnosis] | None = None,
        clock: Callable[[], float] = time.time,
        model_shape=None,
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
        self._diagnosis: dict | None = None
        self._verdicts = known_verdicts() if diagnose_hook is not None else None

        self._pod = getattr(settings, "pod", None) or None
        self._deadline = float(settings.scrape_timeout) * 1.2 + 0.05
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, len(self.collectors)), thread_name_prefix="kvdoctor-collect"
        )
        self._inflight: dict[str, tuple[Future, float]] = {}
        self._retry_at: dict[str, float] = {}
        self._status = {c.name: SourceStatus(c.name) for c in self.collectors}
        self._errors: dict[tuple[str, str], int] = {}
        self._keys: dict[SeriesKey, SeriesKey] = {}  # interned (and pod-labelled) series keys
        self._self_keys: dict[tuple, SeriesKey] = {}
        self._last_ts = 0.0
        self._warned_cap: set[str] = set()

        self.model_shape = model_shape
        if self.model_shape is None and getattr(settings, "model_config_path", None):
            try:
                self.model_shape = load_model_shape(settings.model_config_path)
            except ValueError as exc:
                log.warning("decode-step floor disabled: %s", exc)

        self.cycles = 0
        self.last_cycle_seconds = 0.0
        self.ready = threading.Event()
        self._lock = threading.RLock()  # guards status reads against the cycle's writes
        self._stop = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public, any thread
    def metrics_bytes(self) -> bytes:
        return self._metrics

    def diagnosis(self) -> dict | None:
        return self._diagnosis

    def status(self) -> dict[str, dict]:
        with self._lock:
            return {name: st.to_json() for name, st in self._status.items()}

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
        self._executor.shutdown(wait=False, cancel_futures=True)
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
        outcomes = self._collect_all()
        ts = max(self._clock(), self._last_ts + 1e-6)
        self._last_ts = ts

        samples, per_source = self._merge(outcomes)
        with self._lock:
            self._account(outcomes, per_source, ts)
        self._add_self_metrics(samples)
        floor = self._decode_floor(samples)
        if floor is not None:
            samples[self._self_key(S.DECODE_STEP_FLOOR, ())] = floor

        snapshot = Snapshot(ts, samples)
        dropped = self.store.append(snapshot)
        if dropped:  # only when the runtime's own budget was wrong; keep it visible anyway
            self._count_error("store", "series_cap")

        extra = self._diagnose()
        if extra:  # page-only series (verdicts; a diagnosis error counted after the snapshot)
            page = dict(samples)
            page.update(extra)
        else:
            page = samples
        self._metrics = self._renderer.render(tuple(page), list(page.values()))

        self.cycles += 1
        self.last_cycle_seconds = time.perf_counter() - started
        self.ready.set()
        return snapshot

    def _collect_all(self) -> dict[str, _Outcome]:
        now = time.monotonic()
        pending: dict[str, Future] = {}
        outcomes: dict[str, _Outcome] = {}
        for collector in self.collectors:
            name = collector.name
            if name in self._inflight:
                future, since = self._inflight[name]
                if not future.done():  # still stuck in an earlier cycle's call
                    outcomes[name] = _Outcome(
                        "timeout", now - since, reason="timeout", message=f"no answer for {now - since:.1f} s"
                    )
                    continue
                del self._inflight[name]  # its late answer is stale: discard it
            if self._retry_at.get(name, 0.0) > now:
                outcomes[name] = _Outcome("not_applicable", 0.0)
                continue
            try:
                pending[name] = self._executor.submit(_call, collector)
            except RuntimeError:  # executor shut down (stopping)
                outcomes[name] = _Outcome("error", 0.0, reason="stopped", message="exporter stopping")
        if pending:
            wait(pending.values(), timeout=self._deadline)
        for name, future in pending.items():
            if future.done():
                outcome = future.result()
                if outcome.kind == "not_applicable":
                    self._retry_at[name] = time.monotonic() + NOT_APPLICABLE_RETRY_SECONDS
                else:
                    self._retry_at.pop(name, None)
                outcomes[name] = outcome
            else:
                self._inflight[name] = (future, now)
                outcomes[name] = _Outcome(
                    "timeout",
                    time.monotonic() - now,
                    reason="timeout",
                    message=f"no answer within {self._deadline:.2f} s",
                )
        return outcomes

    def _merge(self, outcomes: dict[str, _Outcome]) -> tuple[dict[SeriesKey, float], dict[str, int]]:
        """All collected samples in one dict, each source held to a fair share of max_series."""
        budget = self.settings.max_series - self._reserved_series()
        collected = [(name, o.collected.samples) for name, o in outcomes.items() if o.kind == "ok" and o.collected]
        collected.sort(key=lambda item: len(item[1]))  # water-filling: small sources first
        merged: dict[SeriesKey, float] = {}
        kept: dict[str, int] = {}
        keys = self._keys
        if len(keys) > 4 * self.settings.max_series:  # series churn: start the interning over
            keys.clear()
        intern = self._intern
        for position, (name, source_samples) in enumerate(collected):
            share = max(0, budget // (len(collected) - position))
            items = source_samples.items()
            if len(source_samples) > share:
                items = ((key, source_samples[key]) for key in _family_fair_keys(source_samples, share))
                self._count_error(name, "series_cap")
                if name not in self._warned_cap:
                    self._warned_cap.add(name)
                    log.warning(
                        "source %s produced %d series; keeping %d (max_series=%d)",
                        name,
                        len(source_samples),
                        share,
                        self.settings.max_series,
                    )
            count = 0
            for key, value in items:
                final = keys.get(key)
                if final is None:
                    final = intern(key)
                merged[final] = value
                count += 1
            kept[name] = count
            budget -= count
        return merged, kept

    def _reserved_series(self) -> int:
        n = len(self.collectors)
        return 2 * n + len(self._errors) + 2 * n + 1 + len(self._verdicts or ())

    def _intern(self, key: SeriesKey) -> SeriesKey:
        name, labels = key
        final = key
        if self._pod is not None and not any(k == S.POD_LABEL for k, _ in labels):
            final = (name, tuple(sorted(labels + ((S.POD_LABEL, self._pod),))))
        self._keys[key] = final
        return final

    def _self_key(self, name: str, labels: Labels) -> SeriesKey:
        cache_key = (name, labels)
        key = self._self_keys.get(cache_key)
        if key is None:
            key = (name, labels)
            if self._pod is not None:
                key = (name, tuple(sorted(labels + ((S.POD_LABEL, self._pod),))))
            self._self_keys[cache_key] = key
        return key

    def _count_error(self, source: str, reason: str) -> None:
        with self._lock:
            if (source, reason) not in self._errors:
                if sum(1 for s, _ in self._errors if s == source) >= MAX_REASONS_PER_SOURCE:
                    reason = "other"
            self._errors[(source, reason)] = self._errors.get((source, reason), 0) + 1
            status = self._status.get(source)
            if status is not None:
                status.errors[reason] = status.errors.get(reason, 0) + 1

    def _account(self, outcomes: dict[str, _Outcome], kept: dict[str, int], ts: float) -> None:
        for name, outcome in outcomes.items():
            st = self._status[name]
            if outcome.kind == "not_applicable":
                if st.applicable is not False:
                    log.info(
                        "source %s: not applicable here%s", name, f" ({outcome.message})" if outcome.message else ""
                    )
                st.applicable, st.up = False, None
                continue
            st.applicable = True
            st.last_scrape = ts
            st.duration_seconds = outcome.duration
            if outcome.kind == "ok":
                if st.up is False:
                    log.info("source %s: up again", name)
                st.up = True
                st.last_success = ts
                st.series = kept.get(name, 0)
                for reason in outcome.collected.partial_errors:
                    self._count_error(name, clean_reason(reason))
            else:
                if st.up is not False or st.last_error_reason != outcome.reason:
                    log.warning("source %s down: %s (%s)", name, outcome.reason, outcome.message)
                st.up = False
                st.series = 0
                st.last_error = outcome.message or outcome.reason
                st.last_error_reason = outcome.reason
                st.last_error_at = ts
                self._count_error(name, outcome.reason)

    def _add_self_metrics(self, samples: dict[SeriesKey, float]) -> None:
        key = self._self_key
        for name, st in self._status.items():
            if not st.applicable:
                continue
            source = (("source", name),)
            samples[key(S.SOURCE_UP, source)] = 1.0 if st.up else 0.0
            samples[key(S.SOURCE_SCRAPE_DURATION, source)] = float(st.duration_seconds or 0.0)
        for (source, reason), count in sorted(self._errors.items()):
            samples[key(S.SOURCE_ERRORS, (("reason", reason), ("source", source)))] = float(count)

    # ------------------------------------------------------------------ ledger and diagnosis
    def _decode_floor(self, samples: dict[SeriesKey, float]) -> float | None:
        """(weights + live KV bytes) / peak bandwidth of the GPUs seen, when the shape is known.

        Live KV is the fullest engine pool (usage x capacity; with data parallelism each rank has
        its own pool and the slowest sets the pace). The peak is per GPU (the override, else what
        the GPU collectors report) times the number of GPUs seen, i.e. the model is assumed to be
        sharded over the GPUs this exporter sees (tensor parallelism within the pod).
        """
        shape = self.model_shape
        if shape is None:
            return None
        usage: dict[Labels, float] = {}
        capacity: dict[Labels, float] = {}
        peaks: dict[str, float] = {}
        for (name, labels), value in samples.items():
            # vLLM's cache_config_info carries no model_name: join usage and capacity without it.
            pool = tuple(kv for kv in labels if kv[0] != "model_name")
            if name == S.KV_CACHE_USAGE:
                usage[pool] = value
            elif name == S.KV_CACHE_CAPACITY:
                capacity[pool] = value
            elif name == S.GPU_DRAM_PEAK_BANDWIDTH:
                peaks[dict(labels).get("gpu", "")] = value
        gpus = max(1, len(peaks))
        per_gpu = self.settings.gpu_peak_bandwidth or (max(peaks.values()) if peaks else None)
        if not per_gpu:
            return None
        try:
            per_token = kv_bytes_per_token(shape)
            live = max((u * capacity[lb] * per_token for lb, u in usage.items() if lb in capacity), default=0.0)
            return decode_step_floor(shape.weight_bytes, live, per_gpu * gpus)
        except ValueError as exc:
            log.debug("no decode-step floor: %s", exc)
            return None

    def _diagnose(self) -> list[tuple[SeriesKey, float]]:
        if self.diagnose_hook is None:
            return []
        window = self.store.window(getattr(self.settings, "diagnosis_window", DIAGNOSIS_WINDOW_SECONDS))
        if len(window) < MIN_DIAGNOSIS_SNAPSHOTS:
            return []
        try:
            result = self.diagnose_hook(window)
            payload = result.to_json()
            verdict = str(result.verdict)
        except Exception as exc:  # the diagnosis is an extra; its failure must not cost the page
            self._count_error(DIAGNOSIS_SOURCE, "exception")
            log.warning("diagnosis failed: %s: %s", type(exc).__name__, exc)
            labels = (("reason", "exception"), ("source", DIAGNOSIS_SOURCE))
            return [(self._self_key(S.SOURCE_ERRORS, labels), float(self._errors[(DIAGNOSIS_SOURCE, "exception")]))]
        self._diagnosis = {**payload, "ts": self._last_ts} if isinstance(payload, dict) else payload
        if not self._verdicts:
            return []
        return [
            (self._self_key(S.DIAGNOSIS_VERDICT, (("verdict", v),)), 1.0 if v == verdict else 0.0)
            for v in self._verdicts
        ]


def default_diagnose_hook(settings, model_shape=None) -> Callable[[Window], Diagnosis] | None:
    """``rules.diagnosis.diagnose`` with the model, GPU and SLO context of the settings."""
    from kvdoctor.rules import diagnosis

    context = diagnosis.Context(
        model=model_shape,
        gpu_peak_bandwidth=getattr(settings, "gpu_peak_bandwidth", None),
        slo_seconds=float(getattr(settings, "slo_ms", 100.0)) / 1e3,
    )

    def diagnose(window: Window):
        return diagnosis.diagnose(window, context=context)

    return diagnose
