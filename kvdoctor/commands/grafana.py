"""kvdoctor grafana export [-o FILE] [--thresholds FILE] [--slo-ms N] [--scrape-interval S] [--runbook-base-url URL]"""

from __future__ import annotations

import argparse

from kvdoctor import arguments, flags
from kvdoctor.errors import UsageError
from kvdoctor.grafana.builder import render_dashboard
from kvdoctor.output import check_document, runbook_base, write_document
from kvdoctor.rules.alert_specs import RUNBOOK_BASE_URL
from kvdoctor.rules.thresholds import DEFAULT_SCRAPE_INTERVAL_SECONDS, DEFAULT_SLO_SECONDS

NAME = "grafana"
HELP = "export the Grafana dashboard generated from the rules"
DESCRIPTION = """\
The Grafana dashboard generated from kvdoctor's rules. One action, export; its flags follow.

examples:
  kvdoctor grafana export -o kvdoctor-dashboard.json
  kvdoctor grafana export --scrape-interval 1m -o kvdoctor-dashboard.json
"""
EXPORT_DESCRIPTION = """\
Write kvdoctor's Grafana dashboard as JSON: the verdict per pod and the firing kvdoctor alerts, KV
usage and ITL against the SLO, DRAM bandwidth vs SM activity, preemptions and PCIe, the queue and the
prefix-cache hits by tier, with datasource, namespace and pod variables. Its panels read the series
the rules record (`kvdoctor rules export`): give both commands the same --thresholds, --slo-ms,
--scrape-interval and --runbook-base-url.

examples:
  kvdoctor grafana export                          # to stdout
  kvdoctor grafana export -o kvdoctor-dashboard.json
  kvdoctor grafana export --thresholds my-thresholds.yaml --slo-ms 50 -o dashboard.json
  kvdoctor grafana export --runbook-base-url https://github.com/ORG/kvdoctor/blob/main/docs/runbooks/
  kvdoctor grafana export --scrape-interval 1m -o dashboard.json
  kvdoctor grafana export --check -o grafana/kvdoctor-dashboard.json   # exit 1 if the file is out of date

exit status: 0 written (or up to date), 1 out of date (--check), 2 a usage or input error (a flag, a
thresholds file, a runbook URL, a file that cannot be written), 3 an internal error.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="grafana_action", metavar="ACTION")
    export = actions.add_parser(
        "export",
        help="write the dashboard JSON",
        description=EXPORT_DESCRIPTION,
        formatter_class=parser.formatter_class,
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    flags.add(
        export,
        "--thresholds",
        help="YAML file overriding thresholds (names as in kvdoctor/rules/thresholds.py), as given to rules export",
    )
    flags.add(
        export,
        "--slo-ms",
        type=arguments.positive_float,
        default=None,
        help=f"the SLO line where an exporter publishes none, in milliseconds (default {DEFAULT_SLO_SECONDS * 1e3:g})",
    )
    flags.add(
        export,
        "--scrape-interval",
        type=arguments.duration,
        default=None,
        help="Prometheus' scrape interval the rules are sized for, e.g. 30s or 1m "
        f"(default {DEFAULT_SCRAPE_INTERVAL_SECONDS:g}s; the recorded series are named after their ranges)",
    )
    flags.add(
        export,
        "--runbook-base-url",
        help="where the runbooks are, an http(s) URL or a path, as rules export takes it (URL/<Alert>.md); an "
        f"http(s) URL adds runbook links (default {RUNBOOK_BASE_URL}: no links)",
    )
    export.add_argument(
        "--check", action="store_true", help="do not write: exit 1 if FILE (-o) differs from what would be written"
    )


def run(args: argparse.Namespace) -> int:
    if getattr(args, "grafana_action", None) != "export":
        raise UsageError("missing action; try: kvdoctor grafana export [-o FILE]")
    base = runbook_base(args.runbook_base_url)
    thresholds = arguments.read_thresholds(args.thresholds)
    slo = DEFAULT_SLO_SECONDS
    if args.slo_ms is not None:
        if not 0 < args.slo_ms < float("inf"):
            raise UsageError(f"--slo-ms must be a positive number, got {args.slo_ms:g}")
        slo = args.slo_ms / 1000.0
    if args.scrape_interval is not None and not 0 < args.scrape_interval < float("inf"):
        raise UsageError(f"--scrape-interval must be a positive number of seconds, got {args.scrape_interval:g}")
    text = render_dashboard(thresholds, slo, args.scrape_interval, base)
    if args.check:
        return check_document(text, args.output, "kvdoctor grafana export", getattr(args, "_argv", ()))
    write_document(text, args.output)
    return 0
