"""Regenerates the README's screenshots from the real pages: docs/img/{live,ledger,fleet}.png.

    .venv/bin/python scripts/screenshots.py              # into docs/img (about five minutes)
    .venv/bin/python scripts/screenshots.py --out /tmp/shots --history 30

Runs what a user runs: three `kvdoctor demo` processes (kv_thrashing, bandwidth_bound, healthy,
each with its pod name), a real Prometheus (the one under .tools/, as the tests use) scraping their
exporters with the rules `kvdoctor rules export` writes, and `kvdoctor dashboard --exporter
<the kv_thrashing demo> --prometheus <it>`; then, in headless Chromium, waits for each page's
verdict and some history, and saves each page. Everything it starts is stopped at the end.
Needs the test tools (scripts/install-test-deps.sh: Prometheus, Chromium).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support: the demo, Prometheus and browser helpers the tests use

from kvdoctor.rules.rule_file import render_rules_yaml  # noqa: E402
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds  # noqa: E402
from tests.support import tools  # noqa: E402
from tests.support.browser import Page, chromium_browser  # noqa: E402
from tests.support.demo import DemoProcess  # noqa: E402
from tests.support.processes import kvdoctor  # noqa: E402
from tests.support.prometheus import PrometheusServer  # noqa: E402

# The demo behind each Fleet row (the first is also the Live page's): scenario, pod name, its verdict.
DEMOS = (
    ("kv_thrashing", "vllm-llama-0", "kv_thrashing"),
    ("bandwidth_bound", "vllm-llama-1", "memory_bandwidth_bound"),
    ("healthy", "vllm-llama-2", "healthy"),
)
VERDICT_TIMEOUT_S = 180.0
SCRAPE_INTERVAL_S = 1


def say(text: str) -> None:
    print(f"screenshots: {text}", flush=True)


def verdict(page: Page) -> str | None:
    return page.page.locator(".banner").get_attribute("data-verdict")


def shoot(page: Page, path: Path) -> None:
    page.page.wait_for_timeout(1500)  # the last update drawn
    page.page.screenshot(path=str(path), full_page=True)
    say(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/img", help="folder for the images (default docs/img)")
    parser.add_argument(
        "--history", type=float, default=150.0, help="seconds of history on the charts before the shots (default 150)"
    )
    args = parser.parse_args(argv)
    prometheus, chromium = tools.find("prometheus"), tools.find("chromium")
    if not prometheus or not chromium:
        print(
            "screenshots: needs Prometheus and Chromium: bash scripts/install-test-deps.sh --only prometheus,chromium",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="kvdoctor-shots-") as work:
        demos = []
        for scenario, pod, _ in DEMOS:
            demo = DemoProcess(scenario, env={"KVDOCTOR_POD": pod}).start()
            stack.callback(demo.stop)
            demos.append(demo)
            say(f"demo {scenario} ({pod}): exporter {demo.exporter_url}")
        targets = [
            {"targets": [d.exporter_url.removeprefix("http://")], "labels": {"pod": pod, "namespace": "demo"}}
            for d, (_, pod, _) in zip(demos, DEMOS, strict=True)
        ]
        config = {
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
            "scrape_configs": [{"job_name": "kvdoctor", "static_configs": targets}],
        }
        rules = render_rules_yaml(Thresholds(), DEFAULT_SLO_SECONDS, SCRAPE_INTERVAL_S)
        prom = PrometheusServer.configured(prometheus, Path(work) / "prometheus", config, rule_files={"kv.yml": rules})
        prom.start().wait_for_targets_up()
        stack.callback(prom.stop)
        say(f"Prometheus {prom.url} scraping {len(demos)} exporters")

        dashboard = kvdoctor(
            "dashboard", "--exporter", demos[0].exporter_url, "--prometheus", prom.url, "--port", "0", env={}
        )
        dashboard.start()
        stack.callback(dashboard.stop)
        url = dashboard.wait_for_line(r"^kvdoctor dashboard: (http://\S+)").group(1)
        say(f"dashboard {url}")

        with chromium_browser(chromium) as browser:
            page = Page(browser, url)
            page.goto("/")
            tools.wait_until(lambda: verdict(page) == DEMOS[0][2], timeout=VERDICT_TIMEOUT_S, what="Live's verdict")
            say(f"Live says {DEMOS[0][2]}; {args.history:g} s of history for the charts")
            page.page.wait_for_timeout(args.history * 1000)
            shoot(page, args.out / "live.png")

            page.goto("/ledger")
            page.page.wait_for_selector("text=decode step floor", timeout=60_000)
            shoot(page, args.out / "ledger.png")

            tools.wait_until(
                lambda: all(d.verdict() == expected for d, (_, _, expected) in zip(demos, DEMOS, strict=True)),
                timeout=VERDICT_TIMEOUT_S,
                what="every demo's own verdict",
            )
            time.sleep(5)  # a few scrapes more, so Prometheus has them too
            page.goto("/fleet?range=900")  # the last 15 min: the demos' whole history on the sparklines
            for _, pod, _ in DEMOS:
                page.page.wait_for_selector(f"text={pod}", timeout=60_000)
            shoot(page, args.out / "fleet.png")
            if page.errors:
                say(f"the pages logged errors: {page.errors[:3]}")
            page.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
