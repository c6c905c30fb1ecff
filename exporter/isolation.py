"""Collector isolation: every collector is asked on its own worker thread, up to a deadline.

A hung source (an engine that stops answering, an NVML call stuck on a GPU that fell off the bus)
costs that source its ``source_up`` and nothing else:

- ``NotApplicable``       -> ``not_applicable``; asked again every ``NOT_APPLICABLE_RETRY_SECONDS``
- ``SourceError(reason)`` -> ``error`` with that reason
- any other exception     -> ``error`` with ``reason="exception"``
- past the deadline       -> ``timeout``; the late answer is discarded, and while the call is still
                             stuck the source is not asked again (it stays ``timeout``)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from kvdoctor.exporter.accounting import Outcome, clean_reason
from kvdoctor.signals.collection import Collected, Collector, NotApplicable, SourceError

NOT_APPLICABLE_RETRY_SECONDS = 30.0


def call_collector(collector: Collector) -> Outcome:
    """One collection, never raising: a failing source costs its own ``source_up``, never the scrape."""
    start = time.perf_counter()
    try:
        collected = collector.collect()
        if not isinstance(collected, Collected):
            raise TypeError(f"collect() returned {type(collected).__name__}, not Collected")
        return Outcome("ok", time.perf_counter() - start, collected)
    except NotApplicable as exc:
        return Outcome("not_applicable", time.perf_counter() - start, message=str(exc))
    except SourceError as exc:
        return Outcome("error", time.perf_counter() - start, reason=clean_reason(exc.reason), message=str(exc))
    except Exception as exc:  # any bug in a collector is that collector's failure only
        return Outcome("error", time.perf_counter() - start, reason="exception", message=f"{type(exc).__name__}: {exc}")


class IsolatedCollection:
    """Asks ``collectors`` (the caller's list, read every round) in parallel and waits ``deadline`` s."""

    def __init__(self, collectors: Sequence[Collector], deadline: float):
        self.collectors = collectors
        self.deadline = deadline
        self._executor = ThreadPoolExecutor(max_workers=max(1, len(collectors)), thread_name_prefix="kvdoctor-collect")
        self._inflight: dict[str, tuple[Future, float]] = {}
        self._retry_at: dict[str, float] = {}

    def collect_all(self) -> dict[str, Outcome]:
        """One round: every collector's outcome, by name."""
        now = time.monotonic()
        pending: dict[str, Future] = {}
        outcomes: dict[str, Outcome] = {}
        for collector in self.collectors:
            name = collector.name
            if name in self._inflight:
                future, since = self._inflight[name]
                if not future.done():  # still stuck in an earlier round's call
                    outcomes[name] = Outcome(
                        "timeout", now - since, reason="timeout", message=f"no answer for {now - since:.1f} s"
                    )
                    continue
                del self._inflight[name]  # its late answer is stale: discard it
            if self._retry_at.get(name, 0.0) > now:
                outcomes[name] = Outcome("not_applicable", 0.0)
                continue
            try:
                pending[name] = self._executor.submit(call_collector, collector)
            except RuntimeError:  # executor shut down (stopping)
                outcomes[name] = Outcome("error", 0.0, reason="stopped", message="exporter stopping")
        if pending:
            wait(pending.values(), timeout=self.deadline)
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
                outcomes[name] = Outcome(
                    "timeout",
                    time.monotonic() - now,
                    reason="timeout",
                    message=f"no answer within {self.deadline:.2f} s",
                )
        return outcomes

    def shutdown(self) -> None:
        """Stop the workers; a call still stuck is left to finish on its own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
