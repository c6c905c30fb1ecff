"""Onset to verdict: from a demo scenario switch to the exporter's verdict gauge changing.

    .venv/bin/python -m bench.bench_onset            # every problem scenario, ~12 minutes
    .venv/bin/python -m bench.bench_onset --quick    # kv_thrashing and bandwidth_bound, ~3 minutes

Runs the real ``kvdoctor demo`` (simulated vLLM engine over HTTP, simulated GPU, exporter at
1 Hz, the rules' diagnosis every cycle) in its own process. For each problem scenario: switch
the engine to ``healthy``, let the exporter's 60 s diagnosis window fill with healthy data until
the verdict gauge says ``healthy``, then switch the engine to the scenario (``POST
/scenario``) and poll the exporter's ``/metrics`` every 0.1 s for
``kvdoctor_diagnosis_verdict{verdict=...} 1``.

Per scenario:
- floor: switch -> the first exporter cycle that scraped the engine after the switch (from
  ``/api/v1/status``): the earliest any verdict could move, i.e. the collection latency;
- first change: switch -> the verdict gauge first shows something other than ``healthy``;
- onset: switch -> the verdict gauge shows the scenario's expected verdict (``GET /scenario``).
Target (issue 7): onset <= 10 s.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass

import httpx

from bench.table import Row, add_json_out, report
from tests.support.demo import DemoProcess

TARGET_SECONDS = 10.0
BENCH = "onset"
ALL_SCENARIOS = ("kv_thrashing", "bandwidth_bound", "tier_miss", "capacity_pressure", "host_overhead", "compute_bound")
QUICK_SCENARIOS = ("kv_thrashing", "bandwidth_bound")
VERDICT_RE = re.compile(rb'^kvdoctor_diagnosis_verdict\{[^}]*verdict="([a-z_]+)"[^}]*\} 1(?:\.0)?$', re.M)
POLL = 0.1


def current_verdict(client, demo: DemoProcess) -> str | None:
    page = client.get(demo.metrics_url).content
    m = VERDICT_RE.search(page)
    return m.group(1).decode() if m else None


@dataclass
class Trial:
    scenario: str
    expected: str
    floor: float | None = None
    first_change: float | None = None
    first_verdict: str = ""
    onset: float | None = None
    baseline: str = ""


def wait_healthy(client, demo: DemoProcess, settle: float, timeout: float) -> str:
    """Switch to healthy, wait ``settle`` s, then until the verdict is healthy; returns it."""
    demo.switch("healthy")
    time.sleep(settle)
    deadline = time.monotonic() + timeout
    verdict = current_verdict(client, demo)
    while verdict != "healthy" and time.monotonic() < deadline:
        time.sleep(0.5)
        verdict = current_verdict(client, demo)
    return verdict or "none"


def trial(client, demo: DemoProcess, scenario: str, settle: float, limit: float) -> Trial:
    baseline = wait_healthy(client, demo, settle, timeout=120)
    t0 = time.time()
    state = demo.switch(scenario)
    result = Trial(scenario, state.get("expected_verdict", scenario), baseline=baseline)
    while time.time() - t0 < limit:
        now = time.time()
        if result.floor is None:
            status = client.get(demo.exporter_url + "/api/v1/status").json()
            engine = status.get("sources", {}).get("engine", {})
            if (engine.get("last_success") or 0) > t0:
                result.floor = now - t0
        verdict = current_verdict(client, demo)
        if verdict and verdict != baseline and result.first_change is None:
            result.first_change, result.first_verdict = now - t0, verdict
        if verdict == result.expected:
            result.onset = now - t0
            break
        time.sleep(POLL)
    return result


def measure(
    quick: bool = False, scenarios: tuple[str, ...] | None = None, settle: float | None = None, limit: float = 120.0
) -> list[Row]:
    scenarios = scenarios or (QUICK_SCENARIOS if quick else ALL_SCENARIOS)
    settle = settle if settle is not None else (30.0 if quick else 65.0)
    trials = []
    with DemoProcess("healthy", interval=1.0) as demo, httpx.Client(timeout=10) as client:
        for scenario in scenarios:
            trials.append(trial(client, demo, scenario, settle, limit))

    def s(v: float | None) -> str:
        return f"{v:.1f} s" if v is not None else f"> {limit:.0f} s"

    rows = []
    note_window = f"healthy for {settle:.0f} s before the switch" + (
        " (quick: less than the 60 s diagnosis window, which shortens onsets)" if settle < 60 else ""
    )
    for t in trials:
        first = f"first change {s(t.first_change)}" + (f" ({t.first_verdict})" if t.first_verdict else "")
        ratio = f"{t.onset / t.floor:.1f}x floor" if t.onset is not None and t.floor else ""
        ok = t.onset is not None and t.onset <= TARGET_SECONDS
        note = f"{first}; {note_window}"
        if t.baseline != "healthy":
            note += f"; the verdict before the switch was {t.baseline}, not healthy"
        rows.append(
            Row(
                BENCH,
                f"healthy -> {t.scenario} (expects {t.expected})",
                s(t.onset),
                s(t.floor),
                ratio,
                f"<= {TARGET_SECONDS:g} s",
                ok,
                note,
            )
        )
    onsets = [t.onset for t in trials]
    worst = max((o for o in onsets if o is not None), default=None) if all(o is not None for o in onsets) else None
    rows.append(
        Row(
            BENCH,
            f"worst of {len(trials)} scenarios",
            s(worst),
            "",
            "",
            f"<= {TARGET_SECONDS:g} s",
            worst is not None and worst <= TARGET_SECONDS,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_SCENARIOS)}, shorter settling")
    parser.add_argument("--scenario", action="append", choices=ALL_SCENARIOS, help="only these (repeatable)")
    parser.add_argument(
        "--settle", type=float, help="seconds of healthy traffic before each switch (default 65; quick 30)"
    )
    parser.add_argument("--limit", type=float, default=120.0, help="give up on a scenario after this many seconds")
    add_json_out(parser)
    args = parser.parse_args(argv)
    rows = measure(args.quick, tuple(args.scenario) if args.scenario else None, args.settle, args.limit)
    return report(rows, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
