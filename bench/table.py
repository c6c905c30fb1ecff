"""Rows of benchmark figures, one table format for every benchmark and for ``python -m bench``.

A benchmark builds ``Row``s (a figure, the floor it is compared with, the ratio, the target and
whether it is met) and ``report``s them: printed, and, given ``--json-out PATH`` (``add_json_out``),
written as JSON so ``python -m bench`` can gather every benchmark's rows into one table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TextIO


@dataclass
class Row:
    """One measured figure. ``ok`` is None when the row has no target (context, a part of a whole)."""

    bench: str
    measure: str
    ours: str  # the figure measured
    floor: str = ""  # what it is compared with (a hardware or reference floor)
    ratio: str = ""  # how ours compares with it, e.g. "3.2x"
    target: str = ""
    ok: bool | None = None
    note: str = ""

    @property
    def status(self) -> str:
        return "" if self.ok is None else ("OK" if self.ok else "MISSED")


COLUMNS = (
    ("bench", "bench"),
    ("measure", "measure"),
    ("ours", "ours"),
    ("floor", "floor"),
    ("ratio", "ratio"),
    ("target", "target"),
    ("status", ""),
)


def print_table(rows: Iterable[Row], out: TextIO | None = None, notes: bool = True) -> None:
    """Aligned columns; the notes (why a figure is what it is) as numbered lines below."""
    out = out or sys.stdout
    rows = list(rows)
    cells = [[getattr(r, attr) for attr, _ in COLUMNS] for r in rows]
    header = [title for _, title in COLUMNS]
    widths = [max([len(header[i])] + [len(c[i]) for c in cells]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip(), file=out)
    if notes:
        numbered = [(r.bench, r.measure, r.note) for r in rows if r.note]
        for i, (bench, measure, note) in enumerate(numbered, 1):
            print(f"  [{i}] {bench} / {measure}: {note}", file=out)


def add_json_out(parser: argparse.ArgumentParser) -> None:
    """The ``--json-out PATH`` option every benchmark written for ``python -m bench`` takes."""
    parser.add_argument("--json-out", metavar="PATH", help="also write the rows as JSON (for python -m bench)")


def report(rows: list[Row], json_out: str | None) -> int:
    """Prints the rows, writes them to ``json_out`` when given; the benchmark's exit status (0)."""
    print_table(rows)
    if json_out:
        write_json(rows, json_out)
    return 0


def write_json(rows: Iterable[Row], path: str | Path) -> None:
    Path(path).write_text(json.dumps([asdict(r) for r in rows], indent=1))


def read_json(path: str | Path) -> list[Row]:
    names = {f.name for f in fields(Row)}
    return [Row(**{k: v for k, v in item.items() if k in names}) for item in json.loads(Path(path).read_text())]


def missed(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.ok is False]


def markdown(rows: Iterable[Row]) -> str:
    """The rows as a Markdown table (for the README), notes as a numbered list below it."""
    rows = list(rows)

    def cell(text: str) -> str:
        return text.replace("|", "\\|").strip()

    lines = ["| bench | measure | ours | floor | ratio | target | |", "|---|---|---|---|---|---|---|"]
    notes = []
    for r in rows:
        measure = cell(r.measure)
        if r.note:
            notes.append(r.note)
            measure += f" [{len(notes)}]"
        lines.append(
            f"| {cell(r.bench)} | {measure} | {cell(r.ours)} | {cell(r.floor)} | {cell(r.ratio)} | "
            f"{cell(r.target)} | {r.status} |"
        )
    lines.append("")
    lines += [f"{i}. {note}" for i, note in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"
