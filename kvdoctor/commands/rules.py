"""kvdoctor rules export [-o FILE] [--thresholds FILE] [--slo-ms N] [--check]"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from kvdoctor.errors import UsageError
from kvdoctor.rules.promql import render_rules_yaml
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds

NAME = "rules"
HELP = "export the Prometheus alert rules compiled from the decision tree"
DESCRIPTION = """\
Compile kvdoctor's decision tree into Prometheus recording and alerting rules over the canonical
kvdoctor_* signals (engine-agnostic): KVCacheThrashing, KVCacheTierMiss, KVCacheCapacityPressure,
DecodeMemoryBandwidthBound, DecodeComputeBound, DecodeHostOverheadBound, KvdoctorSourceDown.

  kvdoctor rules export                      # to stdout
  kvdoctor rules export -o alerts.yaml
  kvdoctor rules export --thresholds my-thresholds.yaml --slo-ms 50 -o alerts.yaml
  kvdoctor rules export --check -o rules/alerts.yaml   # exit 1 if the file is out of date
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="rules_action", metavar="ACTION")
    export = actions.add_parser(
        "export", help="write the rule file", description=DESCRIPTION, formatter_class=parser.formatter_class
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    export.add_argument(
        "--thresholds",
        metavar="FILE",
        help="YAML file overriding thresholds (names as in kvdoctor/rules/thresholds.py)",
    )
    export.add_argument(
        "--slo-ms",
        type=float,
        default=None,
        metavar="N",
        help=f"inter-token latency SLO in milliseconds (default {DEFAULT_SLO_SECONDS * 1e3:g})",
    )
    export.add_argument(
        "--check", action="store_true", help="do not write: exit 1 if FILE (-o) differs from what would be written"
    )


def run(args: argparse.Namespace) -> int:
    if getattr(args, "rules_action", None) != "export":
        raise UsageError("missing action; try: kvdoctor rules export [-o FILE]")
    try:
        thresholds = Thresholds.from_yaml(args.thresholds) if args.thresholds else Thresholds()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    slo = DEFAULT_SLO_SECONDS
    if args.slo_ms is not None:
        if not args.slo_ms > 0:
            raise UsageError(f"--slo-ms must be positive, got {args.slo_ms:g}")
        slo = args.slo_ms / 1000.0
    text = render_rules_yaml(thresholds, slo)

    if args.check:
        if not args.output:
            raise UsageError("--check needs -o FILE to compare with")
        try:
            current = Path(args.output).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {args.output}: {exc.strerror or exc}") from None
        if current != text:
            print(
                f"{args.output} is out of date; regenerate it with: kvdoctor rules export -o {args.output}",
                file=sys.stderr,
            )
            return 1
        return 0

    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return 0
    target = Path(args.output)
    if not target.parent.is_dir():
        raise UsageError(f"cannot write {args.output}: directory {target.parent} does not exist")
    try:
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)  # mkstemp creates 0600; the rule file is meant to be read by others
        os.replace(tmp, target)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    return 0


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
