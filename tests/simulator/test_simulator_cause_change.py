"""A change of cause on the demo: the verdict follows the incident (issue 24, "Why" 3).

The demo's pipeline on simulated time (tests/support/sim_pipeline.py), driven by the onset
benchmark's own trial (bench/bench_onset.py ``pair_trial``): scenario A until the exporter's 60 s
window holds nothing else, then scenario B with the engine slow throughout. The new cause must be
the verdict within one state window plus a scrape (<= 25 s at the demo's 1 s interval), never pass
through a hybrid verdict on the way, and stay once shown. On the tree before issue 24 the features
that pick the cause read the whole window, so the first two pairs lag a minute.
"""

from __future__ import annotations

import pytest

from bench.bench_onset import PAIR_TARGET_AT_1S, pair_target, pair_trial


@pytest.mark.parametrize(
    "before, after, queue",
    [
        ("tier_miss", "host_overhead", "none"),  # the old transfer rate must not keep kv_tier_miss
        ("kv_thrashing", "bandwidth_bound", "none"),  # preemptions stop: kv_thrashing must not persist
        ("capacity_pressure", "tier_miss", "none"),  # no hybrid kv_thrashing between the two
        ("tier_miss", "host_overhead", "growing"),  # the same with a queue behind both
    ],
)
def test_the_demo_verdict_follows_a_change_of_cause(before, after, queue):
    trial = pair_trial(before, after, interval=1.0, queue=queue, hold=15.0)
    assert trial.baseline == trial.expected_before, f"{before} did not settle: {trial.baseline}"
    assert trial.lag is not None and trial.lag <= PAIR_TARGET_AT_1S, (
        f"{before} -> {after}: lag {trial.lag} s, on the way {trial.passed_through}"
    )
    assert "kv_thrashing" not in trial.passed_through  # no hybrid of the old pool and the new transfers
    assert set(trial.after_cause) == {trial.expected_after}, trial.after_cause


def test_the_targets_are_one_state_window_and_a_scrape():
    assert PAIR_TARGET_AT_1S == 25.0 and pair_target(1.0) == 25.0
    assert pair_target(15.0) == 75.0  # the default rule file's 60 s state window plus one 15 s scrape
