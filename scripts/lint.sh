#!/usr/bin/env bash
# make lint: every static check, each must report zero findings.
#   ruff check + ruff format --check   the whole tree (rules in pyproject.toml)
#   lint-imports                       the layers of docs/ARCHITECTURE.md (contracts in pyproject.toml)
#   mypy --strict                      the pure layers (signals, ledger, rules), sources, grafana
# import-linter and mypy read .cache/package-view, the installed package's shape built from the
# repository's folders (scripts/package_view.py); their file names are mapped back to the folders.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-.venv}"
status=0
step() { printf 'lint: %s\n' "$1"; }

step "ruff check"
"$VENV/bin/ruff" check --quiet . || status=1
step "ruff format --check"
"$VENV/bin/ruff" format --check --quiet . || status=1

view="$("$VENV/bin/python" scripts/package_view.py)"
# Paths in the view -> the repository's folders (kvdoctor/rules/x.py -> rules/x.py).
unview() { sed -E 's#(^|[^/A-Za-z_])kvdoctor/(signals|ledger|rules|sources|exporter|simulator|stress|dashboard|grafana)/#\1\2/#g'; }

step "lint-imports"
(cd "$view" && "$ROOT/$VENV/bin/lint-imports" --no-cache "$ROOT/pyproject.toml") > .cache/lint-imports.log 2>&1 \
  || { grep -v '^[ ╔╚║─▶◀┐┘└▲]*$\|^ *[╔╚║]' .cache/lint-imports.log | unview; status=1; }
step "mypy (strict: signals, ledger, rules, sources, grafana)"
(cd "$view" && "$ROOT/$VENV/bin/mypy" --config-file "$ROOT/pyproject.toml" --no-error-summary \
   -p kvdoctor.signals -p kvdoctor.ledger -p kvdoctor.rules -p kvdoctor.sources -p kvdoctor.grafana) 2>&1 | unview || status=1

if [[ $status -ne 0 ]]; then echo "lint: FAILED" >&2; else echo "lint: clean"; fi
exit $status
