"""kvdoctor rules export: the Prometheus rules compiled from the decision tree, for a scrape interval."""

from __future__ import annotations

import argparse
import math
import sys

from kvdoctor import arguments, flags
from kvdoctor.errors import UsageError
from kvdoctor.output import check_document, dashboard_base, runbook_base, write_document
from kvdoctor.rules.alert_specs import RUNBOOK_BASE_URL
from kvdoctor.rules.rule_file import NO_RUNBOOK_NOTE, render_rules_yaml
from kvdoctor.rules.thresholds import DEFAULT_SCRAPE_INTERVAL_SECONDS, DEFAULT_SLO_SECONDS

NAME = "rules"
HELP = "export the Prometheus alert rules compiled from the decision tree"
DESCRIPTION = """\
The Prometheus rules compiled from kvdoctor's decision tree. One action, export; its flags follow.

examples:
  kvdoctor rules export -o alerts.yaml
  kvdoctor rules export --scrape-interval 1m -o alerts.yaml
"""
EXPORT_DESCRIPTION = f"""\
Compile kvdoctor's decision tree into Prometheus recording and alerting rules over the canonical
kvdoctor_* signals (engine-agnostic): KVCacheThrashing, KVCacheTierMiss, KVCacheCapacityPressure,
RequestsQueueing, DecodeMemoryBandwidthBound, DecodeComputeBound, DecodeHostOverheadBound (the
causes, severity info), KvdoctorSourceDown, KvdoctorExporterDown, and the latency SLO's burn-rate
alerts KvdoctorLatencySLOFastBurn (page) and KvdoctorLatencySLOSlowBurn (ticket), and the same pair
on the TTFT SLO where an exporter publishes one (--ttft-slo-ms): docs/alerting.md.

Every range the rules read holds at least 4 scrapes of --scrape-interval (default
{DEFAULT_SCRAPE_INTERVAL_SECONDS:g}s; those rules also work at 30s). Give the interval your
Prometheus scrapes the exporters at when it is longer. The rules compare ITL with the SLO each pod
publishes (kvdoctor_inter_token_latency_slo_seconds, from `kvdoctor exporter --slo-ms`); --slo-ms
here is the fallback for pods that publish none.

examples:
  kvdoctor rules export                      # to stdout
  kvdoctor rules export -o alerts.yaml
  kvdoctor rules export --scrape-interval 1m -o alerts.yaml
  kvdoctor rules export --runbook-base-url https://kvdoctor.example.com/runbooks/
  kvdoctor rules export --dashboard-base-url https://kvdoctor.example.com/
  kvdoctor rules export --thresholds my-thresholds.yaml --slo-ms 50 -o alerts.yaml
  kvdoctor rules export --check -o rules/alerts.yaml   # exit 1 if the file is out of date

exit status: 0 written (or up to date), 1 out of date (--check), 2 a usage or input error,
3 an internal error.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="rules_action", metavar="ACTION")
    export = actions.add_parser(
        "export", help="write the rule file", description=EXPORT_DESCRIPTION, formatter_class=parser.formatter_class
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    flags.add(export, "--thresholds", help="YAML file overriding thresholds (names as in kvdoctor/rules/thresholds.py)")
    flags.add(
        export,
        "--slo-ms",
        type=arguments.positive_float,
        default=None,
        help=f"ITL SLO in milliseconds for pods that publish none (default {DEFAULT_SLO_SECONDS * 1e3:g})",
    )
    flags.add(
        export,
        "--scrape-interval",
        type=arguments.duration,
        help="how often Prometheus scrapes the exporters, e.g. 30s or 1m "
        f"(default {DEFAULT_SCRAPE_INTERVAL_SECONDS:g}s): every range holds at least 4 scrapes",
    )
    flags.add(
        export,
        "--runbook-base-url",
        help="where the runbooks are browsable, an absolute URL: each alert's runbook_url is URL/<Alert>.md "
        "(the dashboard serves them at <dashboard>/runbooks/; the repository's are at "
        f"<repository URL>/{RUNBOOK_BASE_URL}); without it the alerts carry no runbook_url",
    )
    flags.add(
        export,
        "--dashboard-base-url",
        help="the dashboard's external address, an absolute URL: each alert gets a dashboard link to its "
        "engine's page, URL?pod=<pod, else instance>; without it the alerts carry no dashboard link",
    )
    export.add_argument(
        "--check", action="store_true", help="do not write: exit 1 if FILE (-o) differs from what would be written"
    )


def _slo(args: argparse.Namespace) -> float:
    if args.slo_ms is None:
        return DEFAULT_SLO_SECONDS
    if not (args.slo_ms > 0 and math.isfinite(args.slo_ms)):
        raise UsageError(f"--slo-ms must be positive, got {args.slo_ms:g}")
    return float(args.slo_ms) / 1000.0


def _interval(args: argparse.Namespace) -> float:
    if args.scrape_interval is None:
        return DEFAULT_SCRAPE_INTERVAL_SECONDS
    if args.scrape_interval < 1:
        raise UsageError(f"--scrape-interval must be at least 1s, got {args.scrape_interval:g}s")
    return float(args.scrape_interval)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "rules_action", None) != "export":
        raise UsageError("missing action; try: kvdoctor rules export [-o FILE]")
    base = runbook_base(args.runbook_base_url)
    thresholds = arguments.read_thresholds(args.thresholds)
    dashboard = dashboard_base(args.dashboard_base_url)
    text = render_rules_yaml(thresholds, _slo(args), _interval(args), base, dashboard_base_url=dashboard)
    if args.check:
        return check_document(text, args.output, "kvdoctor rules export", getattr(args, "_argv", ()))
    write_document(text, args.output)
    if base is None:
        print(f"kvdoctor rules export: {NO_RUNBOOK_NOTE}", file=sys.stderr)
    return 0
