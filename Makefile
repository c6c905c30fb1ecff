# kvdoctor developer commands. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-k prometheus -x"
PYTEST_ARGS ?=
# Extra arguments for the demo, e.g. make demo ARGS="--scenario kv_thrashing"
ARGS ?=

.PHONY: help setup dev test-deps demo demo-check lint generate check-generated test test-fast bench bench-quick bench-fleet bench-diagnosis

help:
	@echo "make setup      create .venv with kvdoctor (editable)"
	@echo "make dev        same, plus the [dev] extras the tests need"
	@echo "make demo       .venv with the [dashboard] extra, then 'kvdoctor demo' (simulated engine + GPU, exporter, dashboard)"
	@echo "make demo-check the same, bounded: waits for a verdict and the three pages, exits 0 or 1 naming what did not come up"
	@echo "make test-deps  install promtool/prometheus, helm, chromium, vLLM CPU + tiny model (scripts/install-test-deps.sh)"
	@echo "make generate   regenerate every committed generated file (rule files, chart copies, Grafana JSON, doc tables, chart schema)"
	@echo "make check-generated  make generate, then fail naming it if the checkout changed (CI, on a clean clone)"
	@echo "make lint       ruff, ruff format --check, import-linter layers, mypy --strict (scripts/lint.sh)"
	@echo "make test       test-deps, lint, then the whole test suite (what CI runs)"
	@echo "make test-fast  lint, then the fast tests only (-m 'not slow and not needs_tools'); needs no test-deps"
	@echo "make bench      run every benchmark (bench/run; the soak takes 30 minutes)"
	@echo "make bench-quick  the same at CI sizes (a few minutes)"
	@echo "make bench-fleet ENGINES=N  one Prometheus, N fake engines x 8 GPUs, the rules, the Fleet page (bench/bench_fleet.py)"
	@echo "make bench-diagnosis  the tree on the labelled corpus, Python and PromQL (BENCH_ARGS=\"--size full\"; bench/bench_diagnosis.py)"

# Stamps: re-run setup only when pyproject.toml changed since the last one.
$(VENV)/.kvdoctor-setup: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

# The demo serves the dashboard: the [dashboard] extra (the [dev] extras include it).
$(VENV)/.kvdoctor-demo: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh --dashboard
	touch $@ $(VENV)/.kvdoctor-setup

$(VENV)/.kvdoctor-dev: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh --dev
	touch $@ $(VENV)/.kvdoctor-setup $(VENV)/.kvdoctor-demo

setup: $(VENV)/.kvdoctor-setup
dev: $(VENV)/.kvdoctor-dev

test-deps: $(VENV)/.kvdoctor-dev
	bash scripts/install-test-deps.sh

demo: $(VENV)/.kvdoctor-demo
	$(VENV)/bin/kvdoctor demo $(ARGS)

# The README's first command, bounded (CI runs it on a clean clone before the tests): starts the
# demo, waits for the exporter's verdict and the Live, Ledger and Fleet pages, stops.
demo-check: $(VENV)/.kvdoctor-demo
	$(VENV)/bin/kvdoctor demo --check $(ARGS)

# pytest exits 5 when it collected no test: that must fail, not pass quietly.
define run_pytest
	@set +e; $(VENV)/bin/pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest ran no test (exit 5); failing" >&2; exit 1; fi; \
	exit $$rc
endef

lint: $(VENV)/.kvdoctor-dev
	bash scripts/lint.sh

# Every committed generated file, from its one source (the tests that check each one say which):
# the rule file and the chart's copies per scrape interval (15 s is rules/alerts.yaml itself, through
# the chart's symlink), the Grafana dashboard (the chart links to it), the tables of the README and
# docs/ (scripts/update_readme.py) and the chart schema's alert list (scripts/update_chart_schema.py,
# which reads the rules, so it runs after them).
CHART_INTERVALS := 30s 1m 2m
KVDOCTOR := $(VENV)/bin/kvdoctor
generate: $(VENV)/.kvdoctor-setup
	$(KVDOCTOR) rules export -o rules/alerts.yaml
	for interval in $(CHART_INTERVALS); do \
	  $(KVDOCTOR) rules export --scrape-interval $$interval -o helm/kvdoctor/files/alerts-$$interval.yaml || exit 1; \
	done
	$(KVDOCTOR) grafana export -o grafana/kvdoctor-dashboard.json
	$(PY) scripts/update_readme.py
	$(PY) scripts/update_chart_schema.py

# On a clean checkout (CI runs it on its clone): `make generate` must change nothing, else a
# committed generated file is stale and this fails naming the command and the files.
check-generated: generate
	@git rev-parse --git-dir >/dev/null 2>&1 || { echo "check-generated: not a git checkout, nothing to compare with" >&2; exit 1; }
	@stale="$$(git status --porcelain)" || exit 1; \
	if [ -n "$$stale" ]; then \
	  printf 'check-generated: `make generate` changed the checkout: commit what it wrote\n%s\n' "$$stale" >&2; \
	  git --no-pager diff --stat >&2; exit 1; \
	fi; echo "check-generated: every generated file is current"

test: test-deps lint
	$(call run_pytest,-rs --durations=15)

# The unit tests in FAST_WORKERS processes (pytest-xdist): they mostly wait on sockets and
# subprocesses, so 4 workers on 2 cores take 1m45s where one takes 5 min.
FAST_WORKERS ?= 4
test-fast: lint
	$(call run_pytest,-m "not slow and not needs_tools" -q -rs -n $(FAST_WORKERS))

# bench/run runs every benchmark in its own process and prints one table of figures and ratios
# against floors measured in the same run (BENCH_ARGS, e.g. "--only parse,diagnose").
BENCH_ARGS ?=
bench: $(VENV)/.kvdoctor-dev
	$(PY) -m bench $(BENCH_ARGS)

bench-quick: $(VENV)/.kvdoctor-dev
	$(PY) -m bench --quick $(BENCH_ARGS)

# The fleet benchmark at one size (README, "Fleet benchmark"): ENGINES engines x 8 GPUs on one Prometheus.
ENGINES ?= 100
bench-fleet: $(VENV)/.kvdoctor-dev
	$(PY) -m bench.bench_fleet --engines $(ENGINES) --markdown-row $(BENCH_ARGS)

# The diagnosis benchmark (docs/diagnosis-benchmark.md): confusion matrix, accuracy per cause against
# bench/diagnosis_floors.json, cause-change lags, false-healthy count; the small corpus unless BENCH_ARGS says.
bench-diagnosis: $(VENV)/.kvdoctor-dev
	$(PY) -m bench.bench_diagnosis $(BENCH_ARGS)
