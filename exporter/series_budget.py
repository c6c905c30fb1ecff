"""One snapshot from many sources within ``max_series``, each source held to a fair share.

Sources are water-filled (the smallest first, each taking at most an equal part of what is left),
and within a source that is over its share the signal families are water-filled the same way, so
an exploding label in one family cannot push out the others. Every key gets the ``pod`` label
when one is configured; keys are interned, so a steady page allocates no new tuples per cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.window import Labels, SeriesKey

log = logging.getLogger("kvdoctor.exporter")

Samples = dict[SeriesKey, float]


def family_fair_keys(samples: Samples, share: int) -> list[SeriesKey]:
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


def _with_pod(name: str, labels: Labels, pod: str) -> SeriesKey:
    return (name, tuple(sorted((*labels, (S.POD_LABEL, pod)))))


class SeriesMerger:
    """Merges each cycle's samples of every source into one dict of pod-labelled, interned keys."""

    def __init__(self, max_series: int, pod: str | None):
        self.max_series = max_series
        self.pod = pod
        self._keys: dict[SeriesKey, SeriesKey] = {}  # interned (and pod-labelled) series keys
        self._self_keys: dict[tuple, SeriesKey] = {}
        self._warned_cap: set[str] = set()

    def merge(self, collected: Sequence[tuple[str, Samples]], budget: int) -> tuple[Samples, dict[str, int], list[str]]:
        """(merged samples, series kept per source, the sources cut to their share)."""
        by_size = sorted(collected, key=lambda item: len(item[1]))  # water-filling: small sources first
        merged: Samples = {}
        kept: dict[str, int] = {}
        capped: list[str] = []
        keys = self._keys
        if len(keys) > 4 * self.max_series:  # series churn: start the interning over
            keys.clear()
        intern = self._intern
        for position, (name, source_samples) in enumerate(by_size):
            share = max(0, budget // (len(by_size) - position))
            items = source_samples.items()
            if len(source_samples) > share:
                items = ((key, source_samples[key]) for key in family_fair_keys(source_samples, share))
                capped.append(name)
                if name not in self._warned_cap:
                    self._warned_cap.add(name)
                    log.warning(
                        "source %s produced %d series; keeping %d (max_series=%d)",
                        name,
                        len(source_samples),
                        share,
                        self.max_series,
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
        return merged, kept, capped

    def _intern(self, key: SeriesKey) -> SeriesKey:
        name, labels = key
        final = key
        if self.pod is not None and not any(k == S.POD_LABEL for k, _ in labels):
            final = _with_pod(name, labels, self.pod)
        self._keys[key] = final
        return final

    def self_key(self, name: str, labels: Labels) -> SeriesKey:
        """The key of one of the exporter's own series (pod-labelled, interned)."""
        cache_key = (name, labels)
        key = self._self_keys.get(cache_key)
        if key is None:
            key = (name, labels) if self.pod is None else _with_pod(name, labels, self.pod)
            self._self_keys[cache_key] = key
        return key
