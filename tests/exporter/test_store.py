"""RingStore: bounds (time, count, series), windows as columns, thread safety."""

from __future__ import annotations

import math
import random
import threading

import numpy as np
import pytest

from kvdoctor.exporter.store import RingStore
from kvdoctor.signals.window import Snapshot, Window, labels_of
from tests.exporter.exporter_fakes import FakeClock


def snap(ts: float, **values: float) -> Snapshot:
    s = Snapshot(ts)
    for name, value in values.items():
        s.add(name, value, labels_of(gpu="0"))
    return s


def test_empty_store_has_no_latest_and_an_empty_window():
    store = RingStore()
    assert store.latest() is None
    assert len(store.window(60, now=100.0)) == 0


def test_latest_is_the_last_appended_snapshot():
    store = RingStore()
    store.append(snap(1.0, a=1.0))
    store.append(snap(2.0, a=2.0, b=3.0))
    latest = store.latest()
    assert latest.ts == 2.0
    assert latest.samples == {("a", (("gpu", "0"),)): 2.0, ("b", (("gpu", "0"),)): 3.0}


def test_window_selects_by_time_relative_to_the_clock():
    clock = FakeClock(100.0)
    store = RingStore(clock=clock)
    for ts in range(90, 101):
        store.append(snap(float(ts), a=float(ts)))
    w = store.window(5)
    assert list(w.timestamps) == [95.0, 96.0, 97.0, 98.0, 99.0, 100.0]
    assert list(w.series[("a", (("gpu", "0"),))]) == [95.0, 96.0, 97.0, 98.0, 99.0, 100.0]
    clock.advance(3)
    assert list(store.window(5).timestamps) == [98.0, 99.0, 100.0]


def test_window_fills_nan_where_a_series_was_absent():
    store = RingStore()
    store.append(snap(1.0, a=1.0))
    store.append(snap(2.0, a=2.0, b=20.0))
    store.append(snap(3.0, b=30.0))
    w = store.window(10, now=3.0)
    a = w.series[("a", (("gpu", "0"),))]
    b = w.series[("b", (("gpu", "0"),))]
    assert a[:2].tolist() == [1.0, 2.0] and math.isnan(a[2])
    assert math.isnan(b[0]) and b[1:].tolist() == [20.0, 30.0]


def test_window_matches_window_from_snapshots_on_random_schemas():
    rng = random.Random(7)
    names = [f"s{i}" for i in range(12)]
    snaps = []
    for t in range(50):
        present = rng.sample(names, rng.randint(0, len(names)))
        snaps.append(Snapshot(float(t), {(n, ()): rng.random() for n in present}))
    store = RingStore()
    for s in snaps:
        store.append(s)
    got = store.window(1000, now=49.0)
    want = Window.from_snapshots(snaps)
    assert got.timestamps.tolist() == want.timestamps.tolist()
    assert set(got.series) == set(want.series)
    for key, values in want.series.items():
        np.testing.assert_array_equal(got.series[key], values)


def test_count_bound_keeps_the_newest_snapshots():
    store = RingStore(max_snapshots=5)
    for t in range(20):
        store.append(snap(float(t), a=float(t)))
    assert len(store) == 5
    assert store.window(1000, now=19.0).timestamps.tolist() == [15.0, 16.0, 17.0, 18.0, 19.0]


def test_time_bound_drops_snapshots_older_than_retention():
    store = RingStore(retention_seconds=10)
    for t in range(0, 31, 2):
        store.append(snap(float(t), a=1.0))
    assert store.window(1000, now=30.0).timestamps.tolist() == [20.0, 22.0, 24.0, 26.0, 28.0, 30.0]


def test_series_cap_drops_the_excess_and_counts_it():
    store = RingStore(max_series=3)
    s = Snapshot(1.0, {(f"m{i}", ()): float(i) for i in range(5)})
    assert store.append(s) == 2
    assert store.dropped_series == 2
    assert len(store.latest().samples) == 3
    assert store.append(Snapshot(2.0, {("m0", ()): 1.0})) == 0
    assert store.dropped_series == 2


def test_snapshots_older_than_the_newest_are_refused():
    store = RingStore()
    store.append(snap(5.0, a=1.0))
    with pytest.raises(ValueError):
        store.append(snap(4.0, a=1.0))


def test_consecutive_identical_schemas_share_one_object():
    store = RingStore()
    for t in range(3):
        store.append(Snapshot(float(t), {("a", ()): 1.0, ("b", ()): 2.0}))
    schemas = {id(e.schema) for e in store._entries}
    assert len(schemas) == 1


def test_window_values_are_copies_not_views_of_the_store():
    store = RingStore()
    store.append(snap(1.0, a=1.0))
    w = store.window(10, now=1.0)
    w.series[("a", (("gpu", "0"),))][0] = 99.0
    assert store.window(10, now=1.0).series[("a", (("gpu", "0"),))][0] == 1.0


def test_concurrent_appends_and_reads_stay_consistent():
    store = RingStore(max_snapshots=200)
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer():
        for t in range(2000):
            s = Snapshot(float(t), {(f"m{t % 3}", ()): 1.0, ("x", ()): float(t)})
            store.append(s)
        stop.set()

    def reader():
        try:
            while not stop.is_set():
                w = store.window(1e9, now=1e9)
                for values in w.series.values():
                    assert len(values) == len(w.timestamps)
                assert len(w) <= 200
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(store) == 200
    assert store.latest().samples[("x", ())] == 1999.0


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        RingStore(retention_seconds=0)
    with pytest.raises(ValueError):
        RingStore(max_snapshots=0)


def test_window_includes_snapshots_newer_than_a_clock_that_stepped_back():
    clock = FakeClock(100.0)
    store = RingStore(clock=clock)
    store.append(snap(100.0, a=1.0))
    store.append(snap(101.0, a=2.0))
    clock.advance(-10)
    assert store.window(60).timestamps.tolist() == [100.0, 101.0]
