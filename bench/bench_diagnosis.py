"""The diagnosis benchmark: the decision tree scored on a labelled corpus, in Python and through the
PromQL rules (promtool), on the same cases.

    .venv/bin/python -m bench.bench_diagnosis                  # small corpus (CI), both halves
    .venv/bin/python -m bench.bench_diagnosis --size full      # every combination
    .venv/bin/python -m bench.bench_diagnosis --markdown       # the same as Markdown
    .venv/bin/python -m bench.bench_diagnosis --size full --markdown-out docs/diagnosis-benchmark.md
    .venv/bin/python -m bench.bench_diagnosis --record-floors  # write this run's figures as the floors

The corpus (tests/support/corpus.py) labels each case with what is truly happening: every cause
alone, with a queue (steady, growing), every change of cause, with noise, with a signal family
missing, at 1 s and 15 s sampling, on each engine's exposition, and the recordings the repository
holds. Printed for each half: the confusion matrix (rows: truth, columns: verdict), the accuracy
per cause (against the floor recorded in bench/diagnosis_floors.json), per missing signal family
and per engine, the worst cause-change lag (the time from the switch until the verdict is the new
cause and stays it; target <= 25 s at 1 s sampling), the false-healthy count (a slow cause
called healthy or idle) and every case the tree gets wrong, grouped.

Exit status: 0 (a figure below its recorded floor is printed as such: these are measurements;
tests/rules/test_diagnosis_accuracy.py is the guard), 1 with ``--check-floors`` when one is, 2
when promtool is needed and missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.table import Row, add_json_out, print_table, write_json
from tests.support.corpus import (
    ENGINES,
    INTERVALS,
    LABELS,
    LAG_TARGET_SECONDS,
    MISSING,
    MISSING_WORDS,
    SIZES,
    Case,
    Scores,
    Verdicts,
    below_floors,
    corpus,
    floors_of,
    judge_promql,
    judge_python,
    score,
)
from tests.support.tools import promtool

BENCH = "diagnosis"
BEGIN, END = "<!-- bench-diagnosis results: begin -->", "<!-- bench-diagnosis results: end -->"
FLOORS = Path(__file__).resolve().parent / "diagnosis_floors.json"
HALVES = {"python": "Python (rules/diagnosis.py diagnose)", "promql": "PromQL rules (promtool, kvdoctor:verdict)"}
SHORT = {
    "idle": "idle",
    "healthy": "healthy",
    "kv_thrashing": "thrash",
    "kv_tier_miss": "tier",
    "kv_capacity_pressure": "capac",
    "request_queueing": "queue",
    "memory_bandwidth_bound": "bandw",
    "compute_bound": "comp",
    "host_overhead_bound": "host",
    "unknown": "unknown",
}


def _short(label: str) -> str:
    return SHORT.get(label, label[:7])


# --------------------------------------------------------------------------------- tables


class Out:
    """Plain aligned text, or Markdown."""

    def __init__(self, markdown: bool, write: Callable[[str], None]):
        self.markdown, self.write = markdown, write

    def heading(self, text: str, level: int = 3) -> None:
        self.write(f"\n{'#' * level} {text}\n" if self.markdown else f"\n{text}\n{'-' * len(text)}")

    def line(self, text: str = "") -> None:
        self.write(text)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if self.markdown:
            self.write("| " + " | ".join(header) + " |")
            self.write("|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|")
            for r in rows:
                self.write("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
            self.write("")
            return
        widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
        fmt = [str.rjust if i and all(_numeric(r[i]) for r in rows) else str.ljust for i in range(len(header))]
        self.write("  ".join(f(h, w) for f, h, w in zip(fmt, header, widths, strict=True)).rstrip())
        for r in rows:
            self.write("  ".join(f(c, w) for f, c, w in zip(fmt, r, widths, strict=True)).rstrip())


def _numeric(cell: str) -> bool:
    return not cell or cell[0].isdigit() or cell in (".", "-") or cell.startswith("never")


def _pct(ok: int, n: int) -> str:
    return f"{100 * ok / n:.0f}% ({ok}/{n})" if n else "-"


def confusion(out: Out, scores: Scores, floors: dict[str, float]) -> None:
    truths = [t for t in LABELS if scores.matrix.get(t)]
    seen = {v for row in scores.matrix.values() for v in row}
    columns = [v for v in LABELS if v in seen] + sorted(seen - set(LABELS))
    accuracy = scores.accuracy()
    header = ["truth \\ verdict", *(_short(c) for c in columns), "cases", "accuracy", "floor"]
    rows = []
    for t in truths:
        row = scores.matrix[t]
        n = sum(row.values())
        floor = floors.get(t)
        mark = "" if floor is None or accuracy[t] + 1e-9 >= floor else " BELOW"
        rows.append(
            [
                t,
                *(str(row[c]) if row[c] else "." for c in columns),
                str(n),
                f"{100 * accuracy[t]:.1f}%{mark}",
                f"{100 * floor:.1f}%" if floor is not None else "-",
            ]
        )
    total = scores.cases
    rows.append(["all", *("" for _ in columns), str(total), f"{100 * scores.correct / total:.1f}%", ""])
    out.table(header, rows)
    if not out.markdown:
        out.line("columns: " + ", ".join(f"{_short(c)} = {c}" for c in columns))


def breakdown(out: Out, table: dict[str, dict[str, list[int]]], columns: Sequence[str], words: dict[str, str]) -> None:
    present = [c for c in columns if any(c in row for row in table.values())]
    rows = []
    for t in LABELS:
        if t not in table:
            continue
        rows.append([t, *(_pct(*table[t][c]) if c in table[t] else "-" for c in present)])
    out.table(["truth", *(words.get(c, c) for c in present)], rows)


def lags(out: Out, scores: Scores) -> list[str]:
    """The cause-change figures; returns the one-line summaries."""
    summaries = []
    for step in INTERVALS:
        for reference in (True, False):
            worst, case_id, settled, never = scores.worst_lag(step, reference)
            if not settled and not never:
                continue
            which = "vLLM V1, every signal family" if reference else "every change"
            target = f" (target <= {LAG_TARGET_SECONDS:g} s)" if step == 1.0 and reference else ""
            text = (
                f"at {step:g} s sampling, {which}: worst lag {worst:g} s ({case_id}){target}; "
                f"{settled} of {settled + never} changes settled on the new cause"
                if worst is not None
                else f"at {step:g} s sampling, {which}: no change settled ({never})"
            )
            summaries.append(text)
            out.line(("- " if out.markdown else "  ") + text)
    for step in INTERVALS:
        pair_matrix(out, scores, step)
    slow = sorted(
        (
            (v, k)
            for k, v in scores.lags.items()
            if scores.lag_case[k].reference and (v is None or v > LAG_TARGET_SECONDS)
        ),
        key=_lag_order,
    )
    if slow:
        out.line(
            f"\nChanges on vLLM V1 with every signal family over {LAG_TARGET_SECONDS:g} s or never settled "
            f"({len(slow)}), slowest first" + (" (first 25)" if len(slow) > 25 else "") + ":\n"
        )
        rows = []
        for value, k in slow[:25]:
            interim = ", ".join(f"{v} {n}x" for v, n in scores.interim.get(k, Counter()).most_common(3))
            rows.append([k, "never" if value is None else f"{value:g} s", interim or "-"])
        out.table(["change", "lag", "verdicts after the switch other than the new cause"], rows)
    return summaries


def pair_matrix(out: Out, scores: Scores, step: float) -> None:
    """The lag of every change of cause on vLLM V1, every signal family, no noise: rows the cause
    before, columns the cause after."""
    cell: dict[tuple[str, str], str] = {}
    for k, value in scores.lags.items():
        case = scores.lag_case[k]
        if case.reference and not case.noise and case.step == step:
            cell[(case.previous, case.cause)] = "never" if value is None else f"{value:g}"
    if not cell:
        return
    causes = [c for c in LABELS if any(c in pair for pair in cell)]
    out.line(
        f"\nLag in seconds at {step:g} s sampling, vLLM V1, every signal family, no noise "
        "(rows: the cause before, columns: the cause after; never: not the new cause at the end):\n"
    )
    header = ["before \\ after", *(_short(c) for c in causes)]
    rows = [[a, *(cell.get((a, b), "" if a == b else "-") for b in causes)] for a in causes]
    out.table(header, rows)


def _lag_order(item: tuple[float | None, str]) -> tuple[float, str]:
    value, key = item
    return (-(value if value is not None else 1e9), key)


def wrong_cases(out: Out, scores: Scores, limit: int = 3) -> None:
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for case_id, truth, verdict in scores.wrong:
        groups[(truth, verdict)].append(case_id)
    rows = []
    for (truth, verdict), ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        more = f" (+{len(ids) - limit} more)" if len(ids) > limit else ""
        rows.append([truth, verdict, str(len(ids)), "; ".join(ids[:limit]) + more])
    if rows:
        out.table(["truth", "verdict", "cases", "e.g."], rows)
    else:
        out.line("none")


def report_half(out: Out, name: str, scores: Scores, floors: dict, seconds: float) -> list[str]:
    out.heading(f"{HALVES[name]}: {scores.correct}/{scores.cases} right ({seconds:.1f} s)", 3)
    accuracy_floors = {k: float(v) for k, v in floors.get("accuracy", {}).items()}
    out.line("Confusion matrix (rows: the truth, columns: the verdict at the end of the case):\n")
    confusion(out, scores, accuracy_floors)
    out.line("\nAccuracy per cause, by missing signal family:\n")
    breakdown(out, scores.by_missing, MISSING, MISSING_WORDS)
    out.line("\nAccuracy per cause, by engine exposition:\n")
    breakdown(out, scores.by_engine, [*ENGINES, "recorded"], {})
    out.line("\nAccuracy per cause, by sampling interval:\n")
    breakdown(out, scores.by_step, [f"{s:g}s" for s in INTERVALS], {})
    out.line("\nCause changes (the lag: from the switch until the verdict is the new cause and stays it):\n")
    summaries = lags(out, scores)
    fh = scores.false_healthy
    fh_max = floors.get("false_healthy_max")
    out.line(
        f"\nFalse-healthy (a slow cause called healthy or idle): {len(fh)}"
        + (f" (recorded maximum {fh_max})" if fh_max is not None else "")
    )
    out.line("\nWhere the tree is wrong, grouped (truth -> verdict):\n")
    wrong_cases(out, scores)
    return summaries


def rows_for(name: str, scores: Scores, floors: dict) -> list[Row]:
    """The figures for ``python -m bench``'s table."""
    label = {"python": "Python", "promql": "PromQL"}[name]
    accuracy_floors = floors.get("accuracy", {})
    rows = [
        Row(BENCH, f"{label}: accuracy, all {scores.cases} cases", f"{100 * scores.correct / scores.cases:.1f}%"),
    ]
    for truth, acc in scores.accuracy().items():
        floor = accuracy_floors.get(truth)
        rows.append(
            Row(
                BENCH,
                f"  {label}: {truth}",
                f"{100 * acc:.1f}%",
                f"{100 * float(floor):.1f}% (recorded)" if floor is not None else "",
                f"{acc / float(floor):.2f}x" if floor else "",
                ">= floor" if floor is not None else "",
                None if floor is None else acc + 1e-9 >= float(floor),
            )
        )
    fh_max = floors.get("false_healthy_max")
    fh = len(scores.false_healthy)
    rows.append(
        Row(
            BENCH,
            f"{label}: false-healthy cases",
            str(fh),
            f"{fh_max} (recorded)" if fh_max is not None else "",
            target="<= floor" if fh_max is not None else "",
            ok=None if fh_max is None else fh <= fh_max,
        )
    )
    worst, case_id, settled, never = scores.worst_lag(1.0, reference=True)
    if settled or never:
        _, _, all_settled, all_never = scores.worst_lag(1.0)
        rows.append(
            Row(
                BENCH,
                f"{label}: worst cause-change lag at 1 s (vLLM V1, every signal)",
                f"{worst:g} s" if worst is not None else "none settled",
                target=f"<= {LAG_TARGET_SECONDS:g} s",
                ok=worst is not None and worst <= LAG_TARGET_SECONDS and not never,
                note=f"{case_id}; {never} of {settled + never} such changes never settled on the new cause, "
                f"{all_never} of {all_settled + all_never} of all changes at 1 s",
            )
        )
    return rows


def disagreements(cases: Sequence[Case], python: Verdicts, prom: Verdicts) -> list[tuple[str, str, str]]:
    out = []
    for c in cases:
        a, b = python[c.id], prom[c.id]
        if a[max(a)] != b[max(b)]:
            out.append((c.id, a[max(a)], b[max(b)]))
    return out


# ------------------------------------------------------------------------------------ main


def load_floors(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def record_floors(path: Path, size: str, measured: dict[str, Scores]) -> None:
    floors = load_floors(path)
    floors.setdefault(
        "about",
        "Per-cause accuracy floors of the diagnosis benchmark (bench/bench_diagnosis.py), per corpus size and "
        "half; tests/rules/test_diagnosis_accuracy.py fails when the small corpus falls below them. "
        "Re-record after a deliberate change of the tree: .venv/bin/python -m bench.bench_diagnosis "
        "--size small --record-floors (and --size full).",
    )
    entry = floors.setdefault(size, {})
    for half, scores in measured.items():
        entry[half] = floors_of(scores)
    path.write_text(json.dumps(floors, indent=1, sort_keys=True) + "\n")


def save_verdicts(path: Path, halves: dict[str, tuple[Verdicts, float]]) -> None:
    doc = {
        name: {"seconds": seconds, "verdicts": {k: [[t, v] for t, v in got.items()] for k, got in verdicts.items()}}
        for name, (verdicts, seconds) in halves.items()
    }
    path.write_text(json.dumps(doc))


def load_verdicts(path: Path, cases: Sequence[Case]) -> dict[str, tuple[Verdicts, float]]:
    doc = json.loads(path.read_text())
    out: dict[str, tuple[Verdicts, float]] = {}
    for name, half in doc.items():
        verdicts = {k: {float(t): v for t, v in got} for k, got in half["verdicts"].items()}
        if set(verdicts) != {c.id for c in cases}:
            raise SystemExit(f"{path}: its verdicts are for another corpus (another size or generator)")
        out[name] = (verdicts, float(half["seconds"]))
    return out


def write_markdown(path: Path, text: str) -> None:
    """``text`` into ``path``: between its BEGIN and END lines when it has them, else the whole file."""
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    else:
        path.write_text(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="small", help="corpus size (default small, the CI one)")
    parser.add_argument("--no-promql", action="store_true", help="the Python half only (no promtool)")
    parser.add_argument("--jobs", type=int, default=2, help="processes at once, Python and promtool (default 2)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown (docs/diagnosis-benchmark.md)")
    parser.add_argument(
        "--markdown-out",
        type=Path,
        metavar="PATH",
        help=f"also write the report as Markdown: between the {BEGIN} and {END} lines when PATH has them",
    )
    parser.add_argument(
        "--save-verdicts", type=Path, metavar="PATH", help="also write every verdict (JSON), for --load-verdicts"
    )
    parser.add_argument(
        "--load-verdicts",
        type=Path,
        metavar="PATH",
        help="judge nothing: report the verdicts a --save-verdicts run wrote (re-rendering the report only)",
    )
    parser.add_argument("--floors", type=Path, default=FLOORS, help=f"the floors file (default {FLOORS.name})")
    parser.add_argument("--record-floors", action="store_true", help="write this run's figures as the floors")
    parser.add_argument("--check-floors", action="store_true", help="exit 1 when a figure is below its floor")
    add_json_out(parser)
    args = parser.parse_args(argv)

    cases = corpus(args.size)
    kinds = Counter(c.kind for c in cases)
    halves: dict[str, tuple[Verdicts, float]] = {}
    t0 = time.monotonic()
    if args.load_verdicts:
        halves = load_verdicts(args.load_verdicts, cases)
    else:
        halves["python"] = (judge_python(cases, args.jobs), time.monotonic() - t0)
    if not args.no_promql and not args.load_verdicts:
        tool = promtool()
        if tool is None:
            print("bench_diagnosis: promtool not found (bash scripts/install-test-deps.sh --only prometheus)")
            return 2
        t0 = time.monotonic()
        halves["promql"] = (judge_promql(cases, tool, jobs=args.jobs), time.monotonic() - t0)
    if args.save_verdicts:
        save_verdicts(args.save_verdicts, halves)
    measured = {name: score(cases, verdicts) for name, (verdicts, _) in halves.items()}
    all_floors = load_floors(args.floors).get(args.size, {})

    took = ", ".join(f"{'Python' if n == 'python' else 'PromQL'} {sec:.0f} s" for n, (_, sec) in halves.items())
    differ = disagreements(cases, halves["python"][0], halves["promql"][0]) if "promql" in halves else []

    def report(markdown: bool) -> str:
        lines: list[str] = []
        out = Out(markdown, lines.append)
        out.line(
            f"Diagnosis benchmark, {args.size} corpus: {len(cases)} cases "
            f"({', '.join(f'{n} {k}' for k, n in kinds.items())}); judged in {took}"
        )
        for name, (_, seconds) in halves.items():
            report_half(out, name, measured[name], all_floors.get(name, {}), seconds)
        if "promql" in halves:
            out.heading(f"Python and PromQL: {len(cases) - len(differ)}/{len(cases)} cases agree", 3)
            if differ:
                out.table(["case", "Python", "PromQL"], [list(d) for d in differ[:30]])
        return "\n".join(lines)

    rows: list[Row] = []
    for name in halves:
        rows += rows_for(name, measured[name], all_floors.get(name, {}))
    if "promql" in halves:
        rows.append(Row(BENCH, "Python and PromQL agree", f"{len(cases) - len(differ)}/{len(cases)} cases"))
    print(report(args.markdown))
    if args.markdown_out:
        write_markdown(args.markdown_out, report(True))
        print(f"\nMarkdown report written to {args.markdown_out}")

    problems = {name: below_floors(measured[name], all_floors[name]) for name in measured if name in all_floors}
    if args.record_floors:
        record_floors(args.floors, args.size, measured)
        print(f"\nfloors recorded in {args.floors} ({args.size}: {', '.join(measured)})")
    elif not args.markdown:
        print()
        print_table(rows)
    if args.json_out:
        write_json(rows, args.json_out)
    failing = {k: v for k, v in problems.items() if v}
    if failing and not args.record_floors:
        for name, items in failing.items():
            print(f"\n{HALVES[name]} below the recorded floors ({args.floors.name}, {args.size}):")
            print("\n".join(f"  {p}" for p in items))
        return 1 if args.check_floors else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
