#!/usr/bin/env bash
# Creates (or updates) .venv with kvdoctor installed editable.
#
#   bash scripts/setup.sh              # kvdoctor and its runtime dependencies (the sidecar and the CLI)
#   bash scripts/setup.sh --dashboard  # plus the [dashboard] extra: what `make demo` serves
#   bash scripts/setup.sh --dev        # plus the [dev] extras the tests need (the dashboard included)
#
# PYTHON=/path/to/python3.11+ picks the interpreter (default: python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

extras=""
case "${1:-}" in
  --dev) extras="[dev]" ;;
  --dashboard) extras="[dashboard]" ;;
  "") ;;
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup: unknown argument '$1' (use --dashboard, --dev or nothing)" >&2; exit 2 ;;
esac

py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "setup: $py not found; install Python 3.11 or newer, or set PYTHON=" >&2; exit 1; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "setup: kvdoctor needs Python 3.11 or newer; $py is $("$py" --version 2>&1). Set PYTHON=" >&2; exit 1; }

if [[ ! -x .venv/bin/python ]]; then
  # Make the venv from the base interpreter, never from another venv's python.
  base=$("$py" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
  "$base" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --no-input -e ".${extras}"
echo "setup: .venv ready with kvdoctor${extras} ($(.venv/bin/python --version 2>&1))"
