"""Run every benchmark and print one table of figures and ratios measured in the same run.

    bench/run                      # everything at full size (the soak alone is 30 minutes)
    bench/run --quick              # CI-sized: shorter runs, a 3-minute soak (~10 minutes in all)
    bench/run --only parse,onset   # some of them (names below)
    bench/run --markdown out.md    # also write the table as Markdown (the README's copy)
    python -m bench ...            # the same

Each benchmark runs as ``python -m bench.bench_NAME`` in its own process (so one's memory and
threads never weigh on another's figures), its own output streamed as it goes; then one table
gathers every figure with its floor, ratio and target. Benchmarks written for this runner hand
their rows over as JSON (``--json-out``); the older ones' printed figures are read from their
output. A benchmark not known here still runs, and the table says to read its output.

Exit status: 0 when every benchmark ran (MISSED targets included: these are measurements, not
tests; ``--fail-on-missed`` makes a missed target fail), 1 when one could not run.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.table import Row, markdown, missed, print_table, read_json
from tests.support.processes import Process

BENCH_DIR = Path(__file__).resolve().parent


# ------------------------------------------------------------------------ reading printed output

_NUMBER = r"-?[\d,]*\.?\d+"


def _num(text: str) -> float | None:
    m = re.search(_NUMBER, text)
    return float(m.group(0).replace(",", "")) if m else None


def _column_table(output: str) -> list[list[str]]:
    """Rows of the first table whose header is followed by a line of dash groups (column spans)."""
    lines = output.splitlines()
    for i in range(1, len(lines)):
        if re.fullmatch(r"-+(  +-+)+ *", lines[i]):
            spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[i])]
            rows = []
            for line in lines[i + 1 :]:
                if not line.strip():
                    break
                cells = [
                    line[a : (spans[k + 1][0] if k + 1 < len(spans) else len(line))].rstrip()
                    for k, (a, _) in enumerate(spans)
                ]
                rows.append(cells)
            return rows
    return []


def _target_ok(measure: str, ours: str) -> tuple[str, bool | None]:
    """A ``(target <= 5 ms)`` written in the measure's name, and whether ``ours`` meets it."""
    m = re.search(r"target\s*(<=|>=|<|>)\s*(" + _NUMBER + r")\s*([a-zA-Z%]*)", measure)
    value = _num(ours)
    if not m or value is None:
        return "", None
    op, bound = m.group(1), float(m.group(2).replace(",", ""))
    ok = {"<=": value <= bound, ">=": value >= bound, "<": value < bound, ">": value > bound}[op]
    return f"{op} {m.group(2)} {m.group(3)}".strip(), ok


def parse_exporter(output: str) -> list[Row]:
    rows = []
    for cells in _column_table(output):
        measure, ours, floor, ratio = [*cells, "", "", "", ""][:4]
        target, ok = _target_ok(measure, ours)
        clean = re.sub(r"\s*\(target [^)]*\)", "", measure)
        ratio = ratio.strip()
        if ratio[:1].isdigit():  # a bare number is the bench's ours/floor column
            ratio += " ours/floor"
        rows.append(Row("exporter", clean, ours.strip(), floor.strip(), ratio, target, ok))
    return rows


def parse_diagnose(output: str) -> list[Row]:
    n = _NUMBER
    diag = re.search(rf"^diagnose\s+({n})\s+({n})\s+budget\s+({n})\s*ms", output, re.M)
    window = re.search(r"^window: (.*)$", output, re.M)
    if not diag:
        return []
    cpu, budget = float(diag.group(2)), float(diag.group(3))
    floors = re.findall(r"^floor (.+?)\s+(" + _NUMBER + r")\s+(" + _NUMBER + r")\s+(" + _NUMBER + r")x", output, re.M)
    first = floors[0] if floors else None
    rows = [
        Row(
            "diagnose",
            "diagnose(), 15 min x 1 Hz x 8 GPUs (CPU)",
            f"{cpu:.2f} ms",
            f"{float(first[2]):.2f} ms ({first[0]})" if first else "",
            f"{cpu / float(first[2]):.2f}x" if first else "",
            f"<= {budget:g} ms",
            cpu <= budget,
            window.group(1) if window else "",
        )
    ]
    last60 = re.search(r"^diagnose, last 60 s only\s+(" + _NUMBER + r")\s+(" + _NUMBER + ")", output, re.M)
    if last60:
        rows.append(
            Row(
                "diagnose",
                "  the last 60 s only (what the exporter does each cycle)",
                f"{float(last60.group(2)):.2f} ms",
            )
        )
    for name, _wall, cpu_ms, _ratio in floors[1:]:
        rows.append(
            Row("diagnose", f"  floor {name}", f"{float(cpu_ms):.2f} ms", "", f"diagnose {cpu / float(cpu_ms):.2f}x")
        )
    sparse_budget = re.search(rf"^signals missing: .*budget ({n}) ms", output, re.M)
    for name, _wall, cpu_ms, first in re.findall(
        rf"^diagnose, sparse: (.+?)\s+({n})\s+({n})\s+first call ({n}) ms", output, re.M
    ):
        bound = float(sparse_budget.group(1)) if sparse_budget else 2.0
        rows.append(
            Row(
                "diagnose",
                f"  the last 60 s, signals missing: {name}",
                f"{float(cpu_ms):.2f} ms",
                target=f"<= {bound:g} ms",
                ok=float(cpu_ms) <= bound,
                note=f"first call {first} ms (the confidence search's memo cold for that window)",
            )
        )
    return rows


def _floor(match: re.Match[str] | None, what: str) -> dict[str, str]:
    """The floor and ratio columns from a "<floor> ms -> <ratio>x" match (empty without one)."""
    return {"floor": f"{match.group(1)} ms ({what})", "ratio": f"{match.group(2)}x"} if match else {}


def _at_most(value: float, bound: float, shown: str) -> dict[str, Any]:
    """The target and ok columns of a figure that must stay at or below ``bound`` (``shown``)."""
    return {"target": f"<= {shown}", "ok": value <= bound}


def parse_dashboard(output: str) -> list[Row]:
    rows = []
    row = functools.partial(Row, "dashboard")
    n = _NUMBER
    live = re.search(rf"server time median ({n}) ms, p95 ({n}) ms; payload median ({n}) KB, max ({n}) KB", output)
    live_floor = re.search(rf"no-op Dash round trip ({n}) ms -> ({n})x", output)
    live_target = re.search(rf"live update.*?target <= ({n}) KB and <= ({n}) ms", output, re.S)
    if live:
        t_med, size_max = float(live.group(1).replace(",", "")), float(live.group(4).replace(",", ""))
        kb_t, ms_t = (float(live_target.group(1)), float(live_target.group(2))) if live_target else (50.0, 50.0)
        rows.append(
            row(
                "live update: server time (median)",
                f"{t_med:.1f} ms",
                **_floor(live_floor, "no-op Dash round trip"),
                **_at_most(t_med, ms_t, f"{ms_t:g} ms"),
                note=f"p95 {live.group(2)} ms",
            )
        )
        rows.append(
            row(
                "live update: payload (max)",
                f"{size_max:.1f} KB",
                **_at_most(size_max, kb_t, f"{kb_t:g} KB"),
                note=f"median {live.group(3)} KB",
            )
        )
    load = re.search(rf"^\s+total\s+({n}) ms\s+({n}) KB", output, re.M)
    load_floor = re.search(rf"raw \d+ s window: ({n}) ms -> ({n})x", output)
    if load:
        page_load = f"{load.group(1)} ms, {load.group(2)} KB"
        rows.append(row("initial page load (15 min of data)", page_load, **_floor(load_floor, "raw window fetch")))
    hist = re.search(rf"history.*?server time ({n}) ms.*?payload ({n}) KB", output, re.S)
    hist_floor = re.search(rf"raw range queries alone ({n}) ms -> ({n})x", output)
    render = re.search(rf"Plotly\.newPlot\): ({n}) ms", output)
    total = re.search(rf"server \+ render ({n}) ms; target <= ({n}) ms", output)
    if hist:
        rows.append(
            row(
                "24 h history: server time",
                f"{hist.group(1)} ms",
                **_floor(hist_floor, "raw range queries"),
                note=f"payload {hist.group(2)} KB",
            )
        )
    if total:
        t, bound = float(total.group(1).replace(",", "")), float(total.group(2).replace(",", ""))
        rows.append(
            row(
                "24 h history: server + browser render",
                f"{t:,.0f} ms",
                **_at_most(t, bound, f"{bound:,.0f} ms"),
                note=f"render {render.group(1)} ms in headless Chromium" if render else "no browser render",
            )
        )
    return rows


# ------------------------------------------------------------------------------------ the benches


class Bench:
    def __init__(
        self,
        name: str,
        module: str,
        full: list[str],
        quick: list[str],
        parse: Callable[[str], list[Row]] | None = None,
        json_rows: bool = False,
    ):
        self.name, self.module, self.full, self.quick = name, module, full, quick
        self.parse, self.json_rows = parse, json_rows


BENCHES = [
    Bench("parse", "bench.bench_parse", [], ["--quick"], json_rows=True),
    Bench("diagnose", "bench.bench_diagnose", [], ["--repeat", "10"], parse=parse_diagnose),
    Bench("exporter", "bench.bench_exporter", [], ["--quick"], parse=parse_exporter),
    Bench("exporter_resources", "bench.bench_exporter_resources", [], ["--quick"], json_rows=True),
    Bench("dashboard", "bench.bench_dashboard", [], ["--updates", "5"], parse=parse_dashboard),
    Bench("onset", "bench.bench_onset", [], ["--quick"], json_rows=True),
    Bench("soak", "bench.bench_soak", [], ["--quick"], json_rows=True),
    Bench("fleet", "bench.bench_fleet", [], ["--quick"], json_rows=True),
    Bench("diagnosis", "bench.bench_diagnosis", ["--size", "full"], ["--size", "small"], json_rows=True),
]


def discover() -> list[Bench]:
    """The known benches, then any other bench/bench_*.py (run without arguments)."""
    known = {b.module for b in BENCHES}
    extra = [
        Bench(p.stem.removeprefix("bench_"), f"bench.{p.stem}", [], [])
        for p in sorted(BENCH_DIR.glob("bench_*.py"))
        if f"bench.{p.stem}" not in known
    ]
    present = [b for b in BENCHES if (BENCH_DIR / (b.module.split(".")[1] + ".py")).exists()]
    return present + extra


def run_one(bench: Bench, quick: bool, extra_args: list[str]) -> tuple[list[Row], int, float]:
    args = list(bench.quick if quick else bench.full) + extra_args
    with tempfile.TemporaryDirectory(prefix="kvdoctor-bench-") as tmp:
        json_path = Path(tmp) / "rows.json"
        if bench.json_rows:
            args += ["--json-out", str(json_path)]
        print(f"\n== {bench.module} {' '.join(args)}".rstrip(), flush=True)
        started = time.monotonic()
        proc = Process([sys.executable, "-m", bench.module, *args], echo=True, name=bench.name).start()
        rc = proc.wait()
        elapsed = time.monotonic() - started
        output = proc.output
        rows: list[Row] = []
        if bench.json_rows and json_path.exists():
            rows = read_json(json_path)
        elif bench.parse is not None:
            rows = bench.parse(output)
    if not rows:
        why = f"exit {rc}" if rc else "its figures could not be read"
        rows = [Row(bench.name, f"({why}: see its output above)", "", ok=False if rc else None)]
    return rows, rc, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized runs (a 3-minute soak)")
    parser.add_argument("--only", metavar="NAMES", help="comma-separated bench names (see --list)")
    parser.add_argument("--skip", metavar="NAMES", help="comma-separated bench names to leave out")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--soak-minutes", type=float, help="the soak's length (default 30; quick 3)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
    parser.add_argument("--fail-on-missed", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    benches = discover()
    names = [b.name for b in benches]
    if args.list:
        print("\n".join(names))
        return 0
    for option in (args.only, args.skip):
        unknown = [n for n in (option or "").split(",") if n and n not in names]
        if unknown:
            parser.error(f"unknown bench {unknown[0]!r} (choose from {', '.join(names)})")
    if args.only:
        wanted = set(args.only.split(","))
        benches = [b for b in benches if b.name in wanted]
    if args.skip:
        unwanted = set(args.skip.split(","))
        benches = [b for b in benches if b.name not in unwanted]

    all_rows: list[Row] = []
    failed: list[str] = []
    timings = []
    started = time.monotonic()
    for bench in benches:
        extra = ["--minutes", f"{args.soak_minutes:g}"] if bench.name == "soak" and args.soak_minutes else []
        rows, rc, elapsed = run_one(bench, args.quick, extra)
        all_rows += rows
        timings.append(f"{bench.name} {elapsed:.0f} s")
        if rc not in (0,) and not (bench.name == "diagnose" and rc == 1 and rows[0].ok is False):
            failed.append(f"{bench.name} (exit {rc})")

    load1, load5, _ = os.getloadavg()
    print("\n" + "=" * 100)
    print(
        f"kvdoctor benchmarks{' (--quick)' if args.quick else ''}: {time.strftime('%Y-%m-%d %H:%M:%S')}, "
        f"{os.cpu_count()} CPUs, load average {load1:.1f} / {load5:.1f}; {', '.join(timings)} "
        f"({(time.monotonic() - started) / 60:.1f} min in all)"
    )
    print("floor = a reference measured in the same run (each bench says which); ratio as labelled\n")
    print_table(all_rows)
    misses = missed(all_rows)
    print(
        f"\n{len(all_rows)} figures, {sum(r.ok is not None for r in all_rows)} with a target, "
        f"{len(misses)} missed{': ' + '; '.join(f'{r.bench}/{r.measure.strip()}' for r in misses) if misses else ''}"
    )
    if failed:
        print(f"could not run: {', '.join(failed)}")
    if args.markdown:
        Path(args.markdown).write_text(markdown(all_rows))
        print(f"Markdown table written to {args.markdown}")
    return 1 if failed or (args.fail_on_missed and misses) else 0


if __name__ == "__main__":
    sys.exit(main())
