#!/usr/bin/env bash
# Run kvdoctor's real NVML path on this machine's GPUs and print what it read per GPU: GPM
# support, the values (the GPU health readings too: temperature, power and its limit, clocks and
# their maxima, throttle reasons, XID and ECC errors, remapped rows, the PCIe link and replays),
# the readings the GPU does not support, the CPU one collection costs, NVML's memory bus width and max memory clock with the peak they give
# (bus x clock x 2 / 8), next to the GPU catalogue's row for the exact NVML name (its published
# bus width, clock and datasheet peak; ledger/gpus.py) and the peak the exporter uses.
# Exit 0 when every GPU was read; non-zero, with one line on stderr, when NVML is unavailable.
#
# Usage: scripts/gpu_check.sh [--pause SECONDS]
# Python: $PYTHON, else the repository's .venv, else python3. Without an installed kvdoctor
# (a bare GPU machine with a copy of the repository) the package is put together in a temporary
# folder from the repository's sources; numpy and nvidia-ml-py must be importable.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "gpu check: no Python interpreter ($python)" >&2
  exit 1
fi
missing=$("$python" - <<'PY'
import importlib.util
print(" ".join(m for m in ("numpy", "pynvml") if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu check: $python lacks $missing (pip install numpy nvidia-ml-py)" >&2
  exit 1
fi
if ! (cd / && "$python" -c "import kvdoctor.exporter.collectors.nvml" >/dev/null 2>&1); then
  shim=$(mktemp -d)
  trap 'rm -rf "$shim"' EXIT
  mkdir "$shim/kvdoctor"
  cp -r "$root/kvdoctor/." "$shim/kvdoctor/"
  for package in exporter rules ledger signals sources; do  # pyproject.toml's package-dir
    ln -s "$root/$package" "$shim/kvdoctor/$package"
  done
  export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" -c "import sys; from kvdoctor.exporter.collectors.nvml import main; sys.exit(main(['--check', *sys.argv[1:]]))" "$@"
