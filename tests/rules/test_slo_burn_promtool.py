"""The latency SLO's burn alerts in promtool, on both SLOs (ITL, and TTFT where a pod publishes one):
an engine fast, then slow for a minute, then fast again, scraped every second with the rules exported
for 1 s. The fast burn pages while it is slow, stays firing for one evaluation after the short window
is back under the SLO (the evaluation whose words are the recovered ones: ``slo_alerts.burn_expr``),
then resolves; a pod without a TTFT SLO gets no TTFT alert; and the check catches rules without the
recovering evaluation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kvdoctor.rules import rule_file, slo_alerts
from kvdoctor.rules.feature_promql import ENGINE_KEYS
from kvdoctor.rules.slo_alerts import Burn
from kvdoctor.signals.vocabulary import ITL_SLO, TTFT_SLO
from tests.support.tools import promtool, requires_promtool

pytestmark = requires_promtool

SLO_SECONDS = 0.05
BUCKETS = ("0.01", "0.05", "0.1", "0.5", "1", "+Inf")
PER_SECOND = 10  # observations a second
FAST_UNTIL, SLOW_UNTIL, END = 300, 360, 480  # seconds: fast, slow (all in the 0.1-0.5 s bucket), fast
ENGINE = {"namespace": "ns", "pod": "p", "instance": "i", "model_name": "m", "engine": "vllm"}
RECOVERING = "test:recovering"  # 1 at an evaluation where the alert fires with its short window under the SLO


def _histogram(family: str) -> list[dict[str, str]]:
    """Cumulative bucket counts a second: every observation fast, then slow, then fast."""
    series = []
    for le in BUCKETS:
        count, values = 0, []
        for t in range(END + 1):
            values.append(str(count))
            slow = FAST_UNTIL <= t < SLOW_UNTIL
            if (not slow and float(le) >= 0.01) or (slow and float(le) >= 0.5):
                count += PER_SECOND
        labels = ",".join(f'{k}="{v}"' for k, v in {**ENGINE, "le": le}.items())
        series.append({"series": f"{family}_bucket{{{labels}}}", "values": " ".join(values)})
    return series


def _slo_gauge(name: str) -> dict[str, str]:
    pod = ",".join(f'{k}="{ENGINE[k]}"' for k in ("namespace", "pod", "instance"))
    return {"series": f"{name}{{{pod}}}", "values": f"{SLO_SECONDS}x{END}"}


def _rules(tmp_path: Path, *, recovering: bool = True) -> Path:
    """The exported rules for 1 s, with a check appended to the SLO group (so it reads the alerts of the
    same evaluation): 1 where a burn alert fires while its short window is under the SLO."""
    doc = yaml.safe_load(rule_file.render_rules_yaml(scrape_interval_seconds=1))
    group = doc["groups"][1]
    on = "on(" + ", ".join(ENGINE_KEYS) + ")"
    for rule in [r for r in group["rules"] if "alert" in r]:
        burn = next(b for b in slo_alerts.BURNS if b.spec.name == rule["alert"])
        if not recovering:  # the burning half only: resolves as soon as the short window recovers
            rule["expr"] = rule["expr"].split(f"\nor {on}\n")[0]
        group["rules"].append({"record": RECOVERING, "labels": {"burn": burn.spec.name}, "expr": _recovering(burn)})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _recovering(burn: Burn) -> str:
    on = "on(" + ", ".join(ENGINE_KEYS) + ")"
    _, short = burn.windows(1)
    short_quantile = slo_alerts.quantile_over(burn.objective.histogram, f"{short:g}s", burn.quantile)
    slo = f"on(namespace, pod, instance) group_left() {burn.objective.slo_record}"
    return (
        f'group by ({", ".join(ENGINE_KEYS)}) (ALERTS{{alertname="{burn.spec.name}", alertstate="firing"}}) '
        f"and {on} ({short_quantile} <= {slo})"
    )


def _firing(burn: Burn, at: int, firing: bool) -> dict:
    labels = {"alertname": burn.spec.name, "alertstate": "firing", **ENGINE, "severity": burn.spec.severity}
    labels["slo"] = burn.objective.key
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    expr = f'ALERTS{{alertname="{burn.spec.name}", alertstate="firing"}}'
    return {"expr": expr, "eval_time": f"{at}s", "exp_samples": [{"labels": f"ALERTS{{{inner}}}", "value": 1}] * firing}


def _test_file(tmp_path: Path, rules: Path, burn: Burn, slo_gauges: tuple[str, ...], pages: bool = True) -> Path:
    seen = f'max_over_time({RECOVERING}{{burn="{burn.spec.name}"}}[{END - SLOW_UNTIL}s])'
    tests = [
        _firing(burn, FAST_UNTIL - 1, False),  # fast: nothing
        _firing(burn, SLOW_UNTIL, pages),  # a minute slow: the page
        _firing(burn, END, False),  # two minutes fast again: resolved
        {  # ... after one evaluation firing with the short window already back under the SLO
            "expr": f"group by ({', '.join(ENGINE_KEYS)}) ({seen})",
            "eval_time": f"{END}s",
            "exp_samples": [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in ENGINE.items()) + "}", "value": 1}]
            * pages,
        },
    ]
    doc = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [*_histogram(burn.objective.histogram), *(_slo_gauge(g) for g in slo_gauges)],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / f"{burn.spec.name}.test.yaml"
    path.write_text(json.dumps(doc))
    return path


def _promtool_test(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("burn", [slo_alerts.FAST, slo_alerts.TTFT_FAST], ids=lambda b: b.spec.name)
def test_the_fast_burn_pages_then_resolves_after_one_recovering_evaluation(tmp_path, burn):
    result = _promtool_test(_test_file(tmp_path, _rules(tmp_path), burn, (ITL_SLO, TTFT_SLO)))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def test_the_check_catches_rules_without_the_recovering_evaluation(tmp_path):
    rules = _rules(tmp_path, recovering=False)
    result = _promtool_test(_test_file(tmp_path, rules, slo_alerts.FAST, (ITL_SLO,)))
    assert result.returncode != 0 and RECOVERING in result.stdout + result.stderr, result.stdout[-2000:]


def test_a_pod_without_a_ttft_slo_gets_no_ttft_alert(tmp_path):
    """The same slow first tokens, no TTFT SLO published: no TTFT page (and the ITL SLO alone is no
    stand-in for it)."""
    rules = _rules(tmp_path)
    result = _promtool_test(_test_file(tmp_path, rules, slo_alerts.TTFT_FAST, (ITL_SLO,), pages=False))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
