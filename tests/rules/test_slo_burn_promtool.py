"""The latency SLO's burn alerts in promtool, on both SLOs (ITL, and TTFT where a pod publishes one):
an engine fast, then slow, then fast again, scraped every ``interval`` with the rules exported for it
(1 s, 15 s, 1 m, 2 m: the windows scale with the interval, so one scenario of 480 scrapes serves all).
Its exposition is the exporter's: the histogram (buckets and ``_count``) and the counter of the
observations over the SLO, computed from the buckets as the exporter does (``exporter/slo_counters.py``).

The fast burn pages while it is slow, stays firing for one evaluation after the short window is back
under its threshold (the evaluation whose words are the recovered ones: ``slo_alerts.burn_expr``),
then resolves; a pod without a TTFT SLO gets no TTFT alert; the check catches rules without the
recovering evaluation; and at every evaluation the recorded form burns exactly where the exact form
(the histogram's quantile over the raw buckets of both windows, what the rules read before the
ratios were recorded) does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kvdoctor.exporter.slo_counters import SloCount, histograms_over
from kvdoctor.rules import rule_file, slo_alerts
from kvdoctor.rules.feature_promql import ENGINE_KEYS, prom_number
from kvdoctor.rules.promql import duration
from kvdoctor.rules.slo_alerts import Burn
from kvdoctor.signals.vocabulary import ITL_SLO, TTFT_SLO
from kvdoctor.signals.window import labels_of
from tests.support.tools import promtool, requires_promtool

pytestmark = requires_promtool

SLO_SECONDS = 0.05
BUCKETS = ("0.01", "0.05", "0.1", "0.5", "1", "+Inf")
PER_SCRAPE = 10  # observations a scrape
FAST_UNTIL, SLOW_UNTIL, END = 300, 360, 480  # scrapes: fast, slow (all in the 0.1-0.5 s bucket), fast
ENGINE = {"namespace": "ns", "pod": "p", "instance": "i", "model_name": "m", "engine": "vllm"}
RECOVERING = "test:recovering"  # 1 at an evaluation where the alert fires with its short window under the SLO
DISAGREE = "test:disagree"  # 1 at an evaluation where the recorded and the exact form burn differently
ON = "on(" + ", ".join(ENGINE_KEYS) + ")"
_SLO_GAUGE = {"itl": ITL_SLO, "ttft": TTFT_SLO}
INTERVALS = (1, 15, 60, 120)


def _exposition(objective: slo_alerts.Objective) -> list[dict[str, str]]:
    """The exporter's series for ``objective`` at each scrape: the histogram's buckets and ``_count``,
    and the count of observations over the SLO, every observation fast, then slow, then fast."""
    counts = dict.fromkeys(BUCKETS, 0)
    over, events, buckets = [], [], {le: [] for le in BUCKETS}
    count = SloCount(objective.over_counter, objective.histogram, SLO_SECONDS)
    for step in range(END + 1):
        page = {(objective.histogram + "_bucket", labels_of(ENGINE, le=le)): float(n) for le, n in counts.items()}
        ((o, n),) = histograms_over(count, page).values()
        over.append(f"{o:g}")
        events.append(f"{n:g}")
        for le, n in counts.items():
            buckets[le].append(str(n))
        slow = FAST_UNTIL <= step < SLOW_UNTIL
        for le in BUCKETS:
            if (not slow and float(le) >= 0.01) or (slow and float(le) >= 0.5):
                counts[le] += PER_SCRAPE
    labels = ",".join(f'{k}="{v}"' for k, v in ENGINE.items())
    return [
        {"series": f"{objective.over_counter}{{{labels}}}", "values": " ".join(over)},
        {"series": f"{objective.events}{{{labels}}}", "values": " ".join(events)},
        *(
            {"series": f'{objective.histogram}_bucket{{{labels},le="{le}"}}', "values": " ".join(values)}
            for le, values in buckets.items()
        ),
    ]


def _slo_gauge(name: str) -> dict[str, str]:
    pod = ",".join(f'{k}="{ENGINE[k]}"' for k in ("namespace", "pod", "instance"))
    return {"series": f"{name}{{{pod}}}", "values": f"{SLO_SECONDS}x{END}"}


def _exact_burning(burn: Burn, interval: int) -> str:
    """The exact form: both windows' (1 - fraction) quantile over the raw buckets over the pod's SLO."""
    slo = f"on(namespace, pod, instance) group_left() {burn.objective.slo_record}"
    q = prom_number(round(1 - burn.fraction, 6))
    windows = [duration(w) for w in burn.windows(interval)]
    reads = [
        f"max by ({', '.join(ENGINE_KEYS)}) (histogram_quantile({q}, increase({burn.objective.histogram}_bucket[{w}])))"
        for w in windows
    ]
    return f"{reads[1]} > {slo}\nand {ON}\n{reads[0]} > {slo}"


def _rules(tmp_path: Path, interval: int, *, recovering: bool = True) -> Path:
    """The exported rules for ``interval``, with checks appended to each burn's group (so they read the
    alerts of the same evaluation): 1 where a burn alert fires while its short window is under its
    fraction, and 1 where the burning half of the alert and the exact form disagree."""
    doc = yaml.safe_load(rule_file.render_rules_yaml(scrape_interval_seconds=interval))
    for group in doc["groups"][1:]:
        for rule in [r for r in group["rules"] if "alert" in r]:
            burn = next(b for b in slo_alerts.BURNS if b.spec.name == rule["alert"])
            burning = rule["expr"].split(f"\nor {ON}\n")[0]
            if not recovering:  # the burning half only: resolves as soon as the short window recovers
                rule["expr"] = burning
            checks = {RECOVERING: _recovering(burn, interval), DISAGREE: _disagree(burning, burn, interval)}
            for record, expr in checks.items():
                group["rules"].append({"record": record, "labels": {"burn": burn.spec.name}, "expr": expr})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _recovering(burn: Burn, interval: int) -> str:
    """Engines whose burn alert fires while its short window is under the burn's fraction."""
    _, short = burn.windows(interval)
    short_ratio = slo_alerts.error_ratio(burn.objective, duration(short))
    return (
        f'group by ({", ".join(ENGINE_KEYS)}) (ALERTS{{alertname="{burn.spec.name}", alertstate="firing"}}) '
        f"and {ON} (({short_ratio}) <= {prom_number(burn.fraction)})"
    )


def _disagree(burning: str, burn: Burn, interval: int) -> str:
    exact = _exact_burning(burn, interval)
    group = f"group by ({', '.join(ENGINE_KEYS)})"
    return f"({group} ({burning}) unless {ON} ({exact})) or ({group} ({exact}) unless {ON} ({burning}))"


def _firing(burn: Burn, at: int, firing: bool) -> dict:
    labels = {"alertname": burn.spec.name, "alertstate": "firing", **ENGINE, "severity": burn.spec.severity}
    labels["slo"] = burn.objective.key
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    expr = f'ALERTS{{alertname="{burn.spec.name}", alertstate="firing"}}'
    return {"expr": expr, "eval_time": f"{at}s", "exp_samples": [{"labels": f"ALERTS{{{inner}}}", "value": 1}] * firing}


def _ever(record: str, burn: Burn, interval: int, expected: bool) -> dict:
    """``record`` was 1 at some evaluation after the slowdown began (``expected``), or never."""
    seen = f'max_over_time({record}{{burn="{burn.spec.name}"}}[{(END - FAST_UNTIL + 1) * interval}s])'
    return {
        "expr": f"group by ({', '.join(ENGINE_KEYS)}) ({seen})",
        "eval_time": f"{END * interval}s",
        "exp_samples": [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in ENGINE.items()) + "}", "value": 1}]
        * expected,
    }


def _test_file(
    tmp_path: Path, rules: Path, burn: Burn, slo_gauges: tuple[str, ...], interval: int, pages: bool = True
) -> Path:
    exposition = _exposition(burn.objective)
    if _SLO_GAUGE[burn.objective.key] not in slo_gauges:  # no SLO: the exporter counts nothing over it
        exposition = [s for s in exposition if not s["series"].startswith(burn.objective.over_counter)]
    tests = [
        _firing(burn, (FAST_UNTIL - 1) * interval, False),  # fast: nothing
        _firing(burn, SLOW_UNTIL * interval, pages),  # a minute's worth of scrapes slow: the page
        _firing(burn, END * interval, False),  # two minutes' worth fast again: resolved
        _ever(RECOVERING, burn, interval, pages),  # ... after one evaluation with the short window recovered
    ]
    if pages:
        tests.append(_ever(DISAGREE, burn, interval, False))  # and burning exactly where the exact form does
    doc = {
        "rule_files": [str(rules)],
        "evaluation_interval": f"{interval}s",
        "tests": [
            {
                "interval": f"{interval}s",
                "input_series": [*exposition, *(_slo_gauge(g) for g in slo_gauges)],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / f"{burn.spec.name}.test.yaml"
    path.write_text(json.dumps(doc))
    return path


def _promtool_test(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=300)


# The ITL page at every interval the chart ships rules for; the TTFT page (the same rules on another
# counter) at 1 s: each case is a promtool run of 480 scrapes, 20-40 s on 2 cores.
CASES = [(slo_alerts.FAST, i) for i in INTERVALS] + [(slo_alerts.TTFT_FAST, 1)]


@pytest.mark.parametrize("burn, interval", CASES, ids=lambda c: c.spec.name if isinstance(c, Burn) else f"{c}s")
def test_the_fast_burn_pages_then_resolves_after_one_recovering_evaluation(tmp_path, burn, interval):
    rules = _rules(tmp_path, interval)
    result = _promtool_test(_test_file(tmp_path, rules, burn, (ITL_SLO, TTFT_SLO), interval))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def test_the_check_catches_rules_without_the_recovering_evaluation(tmp_path):
    rules = _rules(tmp_path, 1, recovering=False)
    result = _promtool_test(_test_file(tmp_path, rules, slo_alerts.FAST, (ITL_SLO,), 1))
    assert result.returncode != 0 and RECOVERING in result.stdout + result.stderr, result.stdout[-2000:]


def test_a_pod_without_a_ttft_slo_gets_no_ttft_alert(tmp_path):
    """The same slow first tokens, no TTFT SLO published (so the exporter counts no request over one):
    no TTFT page (and the ITL SLO alone is no stand-in for it)."""
    rules = _rules(tmp_path, 1)
    result = _promtool_test(_test_file(tmp_path, rules, slo_alerts.TTFT_FAST, (ITL_SLO,), 1, pages=False))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
