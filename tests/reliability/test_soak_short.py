"""The CI soak: the real ``kvdoctor demo`` at 10 Hz collection under concurrent scrapers for three
minutes; RSS, open file descriptors and threads stay flat and every request succeeds.

The soak itself is bench/bench_soak.py (``python -m bench.bench_soak`` runs the 30-minute one);
"flat" is defined there: after the ring store has filled, the last third's median RSS within 5 MB
of the first third's, and no more fds or threads. The ring is held to 300 snapshots (30 s at
10 Hz) so three minutes reach the store's steady state; kv_thrashing is the busiest scenario
(preemptions, every histogram moving).
"""

from __future__ import annotations

import pytest

from bench.bench_soak import RSS_FLAT_BYTES, soak

MINUTES = 3.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(MINUTES * 60) + 180)]


def test_three_minutes_at_10_hz_keep_rss_fds_and_threads_flat():
    result = soak(MINUTES, interval=0.1, scrapers=8, scenario="kv_thrashing", max_snapshots=300)
    assert not result.errors, f"{len(result.errors)} failed requests, e.g. {result.errors[:3]}"
    assert result.requests > 1000 and result.cycles > 0
    first, last = result.thirds()
    assert len(first) >= 10 and len(last) >= 10, "too few samples after the warm-up"
    rss0, rss1 = result.growth("rss")
    fd0, fd1 = result.growth("fds")
    th0, th1 = result.growth("threads")
    flat = result.flat()
    assert flat["rss"], f"RSS grew {(rss1 - rss0) / 1e6:+.1f} MB (allowed {RSS_FLAT_BYTES / 1e6:g} MB)"
    assert flat["fds"], f"open fds went from {fd0:g} to {fd1:g}"
    assert flat["threads"], f"threads went from {th0:g} to {th1:g}"
