"""Actions in two groups, each checked against the facts (issue #14: "actions that fit the facts")."""

from __future__ import annotations

import dataclasses
import re

import pytest

from kvdoctor.ledger.model import COMMON_MODELS
from kvdoctor.rules.action_checks import LedgerFacts
from kvdoctor.rules.actions import FIX, MITIGATE, SHOWN_PER_GROUP, plan_actions, shown
from kvdoctor.rules.context import Context
from kvdoctor.rules.diagnosis import diagnose
from tests.support.scenarios import SCENARIO_BY_NAME

LLAMA3 = COMMON_MODELS["Llama-3.1-8B"]  # GQA: 8 KV heads for 32 attention heads
LLAMA2 = COMMON_MODELS["Llama-2-7B"]  # MHA: 32 KV heads


def ids(actions) -> list[str]:
    return [a.id for a in actions]


@pytest.mark.parametrize("verdict", ["kv_thrashing", "kv_tier_miss", "kv_capacity_pressure", "request_queueing",
                                     "memory_bandwidth_bound", "compute_bound", "host_overhead_bound"])  # fmt: skip
def test_mitigations_come_first_then_fixes_each_cheapest_first(verdict):
    actions = plan_actions(verdict, LedgerFacts())
    groups = [a.group for a in actions]
    assert groups == sorted(groups, key=lambda g: g != MITIGATE) and groups[0] == MITIGATE and FIX in groups
    for group in (MITIGATE, FIX):
        costs = [a.cost for a in actions if a.group == group]
        assert costs == sorted(costs), (verdict, group)
    assert all(a.group == MITIGATE for a in actions if a.id in ("route_away", "shed_load"))


def test_the_gqa_action_is_dropped_for_a_gqa_model_and_states_its_premise_without_one():
    d = diagnose(SCENARIO_BY_NAME["high_hit_ratio_bandwidth_bound"].window(), Context(model=LLAMA3))
    assert "gqa_model" not in ids(d.actions)
    unknown = diagnose(SCENARIO_BY_NAME["high_hit_ratio_bandwidth_bound"].window())
    gqa = next(a for a in unknown.actions if a.id == "gqa_model")
    assert gqa.premise.startswith("if the model has no GQA") and gqa.effect is None
    mha = diagnose(SCENARIO_BY_NAME["high_hit_ratio_bandwidth_bound"].window(), Context(model=LLAMA2))
    gqa = next(a for a in mha.actions if a.id == "gqa_model")
    assert gqa.premise is None and "decode step floor" in gqa.effect


def test_prefix_caching_is_not_suggested_when_the_engine_reports_prefix_hits():
    d = diagnose(SCENARIO_BY_NAME["compute_bound_with_prefix_hits"].window())
    assert d.verdict == "compute_bound" and "enable_prefix_caching" not in ids(d.actions)
    blind = plan_actions("compute_bound", LedgerFacts(prefix_hits=None))
    caching = next(a for a in blind if a.id == "enable_prefix_caching")
    assert caching.premise == "if prefix caching is off"
    assert "enable_prefix_caching" not in ids(plan_actions("compute_bound", LedgerFacts(prefix_hits=True)))


def test_a_tier_miss_never_suggests_adding_a_host_tier():
    d = diagnose(SCENARIO_BY_NAME["tier_miss_cache_hit_but_slow"].window())
    assert d.verdict == "kv_tier_miss" and "kv_offload_prefetch" not in ids(d.actions)
    thrashing = plan_actions("kv_thrashing", LedgerFacts(kv_tier=True))
    assert "kv_offload_prefetch" not in ids(thrashing)  # KV already moves between tiers


def test_fp8_kv_is_dropped_when_the_cache_is_already_8_bit():
    assert "fp8_kv_cache" not in ids(plan_actions("kv_thrashing", LedgerFacts(model=LLAMA3, kv_dtype="fp8_e4m3")))
    assert "fp8_kv_cache" not in ids(plan_actions("kv_thrashing", LedgerFacts(kv_dtype="fp8")))
    unknown = next(a for a in plan_actions("kv_thrashing", LedgerFacts()) if a.id == "fp8_kv_cache")
    assert unknown.premise == "if the KV cache is not 8-bit already"


def test_400_waiting_on_a_full_pool_adds_capacity_before_anything_else():
    d = diagnose(SCENARIO_BY_NAME["capacity_pressure_400_waiting"].window())
    assert d.verdict == "kv_capacity_pressure"
    assert ids(d.actions)[:2] == ["route_away", "shed_load"]
    assert "cap_sequences" not in ids(d.actions)  # capping sequences would only lengthen the queue


def test_every_fix_carries_the_ledgers_effect_with_a_model_config():
    d = diagnose(SCENARIO_BY_NAME["high_hit_ratio_bandwidth_bound"].window(), Context(model=LLAMA2))
    fixes = [a for a in d.actions if a.group == FIX and a.id != "bigger_gpus"]
    assert fixes and all(a.effect and "decode step floor" in a.effect for a in fixes), [(a.id, a.effect) for a in fixes]
    for action in fixes:
        before, after = map(float, re.search(r"decode step floor ([\d.]+) ms -> ([\d.]+) ms", action.effect).groups())
        assert after < before, action.id


def test_raising_the_sequence_limit_needs_room_in_the_pool():
    full = LedgerFacts(kv_usage=0.95, kv_ceiling=0.9, requests_running=64)
    assert "raise_sequence_limit" not in ids(plan_actions("request_queueing", full))
    room = next(
        a
        for a in plan_actions("request_queueing", dataclasses.replace(full, kv_usage=0.45))
        if a.id == "raise_sequence_limit"
    )
    assert room.effect.startswith("KV usage 45% with 64 running: room for about 64 more sequences")
    assert room.flag_vllm == "--max-num-seqs <n>" and room.flag_sglang == "--max-running-requests <n>"
    assert room.flag_llamacpp.startswith("--parallel <n>")


def test_the_page_and_the_cli_show_three_per_group_and_json_has_all():
    d = diagnose(SCENARIO_BY_NAME["thrashing_kv_oscillates_under_preemption"].window())
    groups = shown(d.actions)
    assert set(groups) == {MITIGATE, FIX} and all(len(a) <= SHOWN_PER_GROUP for a in groups.values())
    assert len(d.to_json()["actions"]) == len(d.actions) > sum(len(a) for a in groups.values())
    assert {"group", "cost", "premise", "flag_llamacpp"} <= set(d.to_json()["actions"][0])


def test_a_kv_usage_too_small_to_divide_by_says_the_pool_has_room():
    tiny = LedgerFacts(kv_usage=2e-311, kv_ceiling=0.9, requests_running=64)
    room = next(a for a in plan_actions("request_queueing", tiny) if a.id == "raise_sequence_limit")
    assert room.effect.endswith("the pool has room")
