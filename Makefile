# kvdoctor developer commands. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-k prometheus -x"
PYTEST_ARGS ?=
# Extra arguments for the demo, e.g. make demo ARGS="--scenario kv_thrashing"
ARGS ?=

.PHONY: help setup dev test-deps demo test test-fast bench

help:
	@echo "make setup      create .venv with kvdoctor (editable)"
	@echo "make dev        same, plus the [dev] extras the tests need"
	@echo "make demo       run 'kvdoctor demo' (simulated engine + GPU, exporter, dashboard)"
	@echo "make test-deps  install promtool/prometheus, helm, chromium, vLLM CPU + tiny model (scripts/install-test-deps.sh)"
	@echo "make test       test-deps, then the whole test suite (what CI runs)"
	@echo "make test-fast  the fast tests only (-m 'not slow'); needs no test-deps"
	@echo "make bench      run the benchmarks (bench/bench_*.py)"

# Stamps: re-run setup only when pyproject.toml changed since the last one.
$(VENV)/.kvdoctor-setup: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

$(VENV)/.kvdoctor-dev: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh --dev
	touch $@ $(VENV)/.kvdoctor-setup

setup: $(VENV)/.kvdoctor-setup
dev: $(VENV)/.kvdoctor-dev

test-deps: $(VENV)/.kvdoctor-dev
	bash scripts/install-test-deps.sh

demo: $(VENV)/.kvdoctor-setup
	$(VENV)/bin/kvdoctor demo $(ARGS)

# pytest exits 5 when it collected no test: that must fail, not pass quietly.
define run_pytest
	@set +e; $(VENV)/bin/pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest ran no test (exit 5); failing" >&2; exit 1; fi; \
	exit $$rc
endef

test: test-deps
	$(call run_pytest,-rs --durations=15)

test-fast: $(VENV)/.kvdoctor-dev
	$(call run_pytest,-m "not slow" -q -rs)

# Each benchmark is a module bench/bench_*.py run as `python -m bench.bench_NAME` (helpers such as
# bench/loadgen.py are not benchmarks). Benchmarks print ratios against a floor measured in the same run.
bench: $(VENV)/.kvdoctor-dev
	@set -e; mods=$$(cd bench 2>/dev/null && ls bench_*.py 2>/dev/null | sed 's/\.py$$//'); \
	if [ -z "$$mods" ]; then echo "make bench: no bench/bench_*.py yet" >&2; exit 1; fi; \
	for m in $$mods; do echo "== bench.$$m"; $(PY) -m bench.$$m; done
