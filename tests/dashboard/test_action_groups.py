"""The verdict banner shows the actions in their two groups, three of each at most, with their
premises and every engine's flag; the new verdict has a title."""

from __future__ import annotations

from kvdoctor.dashboard import components
from kvdoctor.ledger.model import COMMON_MODELS
from kvdoctor.rules.context import Context
from kvdoctor.rules.diagnosis import diagnose
from tests.support.scenarios import SCENARIO_BY_NAME


def _texts(node) -> list[str]:
    out: list[str] = []
    children = getattr(node, "children", node)
    if isinstance(children, str):
        return [children]
    for child in children if isinstance(children, list) else [children]:
        if child is None:
            continue
        out.extend(_texts(child) if not isinstance(child, str) else [child])
    return out


def test_actions_are_grouped_three_at_most_and_mitigations_come_first():
    d = diagnose(
        SCENARIO_BY_NAME["thrashing_kv_oscillates_under_preemption"].window(),
        Context(model=COMMON_MODELS["Llama-2-7B"]),
    )
    payload = d.to_json()
    assert len(payload["actions"]) > 5
    block = components.action_list(payload["actions"])
    headings = [c.children for c in block.children if c.__class__.__name__ == "H5"]
    lists = [c for c in block.children if c.__class__.__name__ == "Ol"]
    assert headings == ["Mitigate now (minutes, no redeploy)", "Fix (a redeploy)"]
    assert [len(ol.children) for ol in lists] == [2, 3]
    text = " ".join(_texts(block))
    assert "Route traffic away" in text and "--kv-cache-dtype fp8" in text and "decode step floor" in text


def test_a_premise_and_the_llamacpp_flag_are_shown():
    d = diagnose(SCENARIO_BY_NAME["llamacpp_slots_full_queue"].window())
    text = " ".join(_texts(components.action_list(d.to_json()["actions"])))
    assert "(if the KV cache has room (its usage is not reported))" in text
    assert "llama.cpp: " in text and "--parallel <n>" in text
    assert components.verdict_title("request_queueing") == "Requests queue"
