#!/usr/bin/env bash
# Builds the kvdoctor container images from the Dockerfile without Docker: podman (or buildah),
# rootless or as root, with the runc runtime, on a Debian base made here with debootstrap (as
# root; rootless: mmdebstrap in a user namespace) -- no registry image is pulled. The base tarball
# is cached in .cache/image/, so only the first build pays for it (~1 min).
#
#   bash scripts/build-image.sh                   # the sidecar image: kvdoctor:<version>
#   bash scripts/build-image.sh --dashboard       # and the dashboard image: kvdoctor-dashboard:<version>
#   bash scripts/build-image.sh --base python:3.11-slim-bookworm   # a registry base instead (pulled)
#   bash scripts/build-image.sh --base-only       # only make (and cache) the Debian base
#   bash scripts/build-image.sh --print-refs      # the image references it builds, nothing else
#
# The images are tagged `kvdoctor:<version>` and `kvdoctor-dashboard:<version>` (the version of
# pyproject.toml = the Helm chart's appVersion, the chart's default image references); podman
# shows them as localhost/kvdoctor:<version>. Push with
#   podman push localhost/kvdoctor:<version> docker://REGISTRY/kvdoctor:<version>
# The build's pip sees this machine's pip configuration (index, local wheel folders, CA bundle),
# mounted read-only for the build only. Prints each image's reference, size and user, and the time taken.
# Exit status: 0 built, 1 the build failed, 2 bad usage or no podman/buildah.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) fails the script too

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
fail() { echo "build-image: $1" >&2; exit "${2:-1}"; }
PATH="$PATH:/usr/sbin:/sbin"  # debootstrap lives there; not on a user's PATH on Debian

SIDECAR_NAME="kvdoctor"
DASHBOARD_NAME="kvdoctor-dashboard"
SUITE="${KVDOCTOR_IMAGE_SUITE:-bookworm}"  # Debian release; its python3 must be >= 3.11
MIRROR="${KVDOCTOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES="python3,python3-venv,ca-certificates"
CACHE="$ROOT/.cache/image"

dashboard=0 base="" print_only=0 base_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dashboard) dashboard=1; shift ;;
    --base) base="${2:?--base needs an image reference}"; shift 2 ;;
    --base=*) base="${1#--base=}"; shift ;;
    --print-refs) print_only=1; shift ;;
    --base-only) base_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) fail "unknown argument '$1' (try --help)" 2 ;;
  esac
done

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
[[ -n "$VERSION" ]] || fail "no version in pyproject.toml" 2
SIDECAR_REF="$SIDECAR_NAME:$VERSION"
DASHBOARD_REF="$DASHBOARD_NAME:$VERSION"
if [[ "$print_only" == 1 ]]; then
  echo "sidecar $SIDECAR_REF"
  echo "dashboard $DASHBOARD_REF"
  exit 0
fi

if command -v podman >/dev/null; then
  build_cmd=(podman build --runtime runc); tool=podman
elif command -v buildah >/dev/null; then
  build_cmd=(buildah bud --runtime runc); tool=buildah
else
  fail "needs podman or buildah (install with: bash scripts/install-test-deps.sh --only podman)" 2
fi
t0=$(date +%s)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------------------------------- base
# A minimal Debian with python3 made once with debootstrap and cached (the slow part), then trimmed
# into the image's base: what a Python process never reads is left out -- docs, manuals, locales,
# apt's lists and caches, apt and perl themselves (the image never installs packages; dpkg's
# database stays, for image scanners), gconv modules and Python's own test suite.
TRIM=(
  './var/cache/apt/*' './var/lib/apt/lists/*' './var/log/*' './usr/share/doc/*' './usr/share/man/*'
  './usr/share/info/*' './usr/share/locale/*' './usr/share/lintian' './usr/share/lintian/*'
  './usr/lib/x86_64-linux-gnu/gconv' './usr/lib/x86_64-linux-gnu/gconv/*'
  './usr/bin/perl*' './usr/lib/x86_64-linux-gnu/perl-base' './usr/lib/x86_64-linux-gnu/perl-base/*'
  './usr/share/perl5' './usr/share/perl5/*' './usr/bin/apt' './usr/bin/apt-*' './usr/lib/apt' './usr/lib/apt/*'
  './usr/lib/x86_64-linux-gnu/libapt-*'
  './usr/lib/python3.*/test' './usr/lib/python3.*/test/*' './usr/lib/python3.*/idlelib'
  './usr/lib/python3.*/idlelib/*' './usr/lib/python3.*/turtledemo' './usr/lib/python3.*/turtledemo/*'
  './usr/lib/python3.*/lib2to3' './usr/lib/python3.*/lib2to3/*'
)
TRIM_PY='
import fnmatch, sys, tarfile
source, target, patterns = sys.argv[1], sys.argv[2], sys.argv[3:]
with tarfile.open(source) as tin, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tout:
    for member in tin:
        name = member.name if member.name.startswith("./") else "./" + member.name
        if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
'

base_image() {
  local raw
  raw="$CACHE/debian-$SUITE-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-8).tar"
  if [[ ! -s "$raw" ]]; then
    echo "build-image: making the $SUITE base (once; cached in ${raw#"$ROOT"/})" >&2
    if [[ "$(id -u)" == 0 ]]; then
      command -v debootstrap >/dev/null || fail "needs debootstrap for the base (or give --base IMAGE)" 2
      debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$tmp/rootfs" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1 || fail "debootstrap failed (see ${CACHE#"$ROOT"/}/debootstrap.log)"
      tar --numeric-owner -C "$tmp/rootfs" -cf "$raw.tmp" . && mv "$raw.tmp" "$raw" && rm -rf "$tmp/rootfs"
    elif command -v mmdebstrap >/dev/null; then  # debootstrap needs root (mknod); mmdebstrap has a user namespace
      # merged-usr hook: /usr merged as debootstrap does it, without the usrmerge package (and its perl)
      mmdebstrap --mode=unshare --format=tar --variant=minbase --aptopt='APT::Install-Recommends "false"' \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --include="$BASE_PACKAGES" "$SUITE" "$raw.tmp" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1 || fail "mmdebstrap failed (see ${CACHE#"$ROOT"/}/debootstrap.log)"
      mv "$raw.tmp" "$raw"
    else
      fail "making the base needs root (debootstrap) or mmdebstrap: run 'bash scripts/build-image.sh --base-only' once as root, or install mmdebstrap" 2
    fi
  fi
  local trimmed="$tmp/base.tar" digest
  python3 -c "$TRIM_PY" "$raw" "$trimmed" "${TRIM[@]}"
  digest="$(sha256sum "$trimmed" | cut -c1-12)"
  BASE_REF="localhost/kvdoctor-base:$SUITE-$digest"
  if ! "$tool" inspect --type image "$BASE_REF" >/dev/null 2>&1; then
    if [[ "$tool" == podman ]]; then
      podman import --quiet "$trimmed" "$BASE_REF" >/dev/null
    else
      local ctr
      ctr="$(buildah from scratch)"
      buildah add --quiet "$ctr" "$trimmed" / >/dev/null
      buildah commit --quiet "$ctr" "$BASE_REF" >/dev/null
      buildah rm "$ctr" >/dev/null
    fi
  fi
  echo "$BASE_REF"
}

# ----------------------------------------------------------------------------- pip of the host
# The host's pip configuration (config files and PIP_* variables) merged into one pip.conf, and
# every local path it names (wheel folders, file:// indexes, the CA bundle), for -v mounts.
pip_mounts() {
  local conf="$tmp/pip.conf"
  python3 - "$conf" <<'EOF'
import configparser, os, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
config = configparser.ConfigParser(interpolation=None)
for line in listed.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.partition(".")
    if name:
        config.setdefault(section, {})
        config[section][name] = value.strip().strip("'\"")
for key, value in os.environ.items():
    if key.startswith("PIP_") and key not in ("PIP_CONFIG_FILE",):
        config.setdefault("global", {})
        config["global"][key[4:].lower().replace("_", "-")] = value
with open(sys.argv[1], "w") as out:
    config.write(out)
paths = set()
for section in config.sections():
    for value in config[section].values():
        for token in value.split():
            path = token.removeprefix("file://").rstrip("/")
            if token.startswith("file://") and os.path.basename(path) == "simple":
                path = os.path.dirname(path)  # a local PEP 503 index links to files beside it
            if path.startswith("/") and os.path.exists(path):
                paths.add(os.path.realpath(path) if os.path.isfile(path) else path)
for path in sorted(paths):
    print(path)
EOF
}

build() {  # build TARGET REF
  local target="$1" ref="$2" t
  t=$(date +%s)
  "${build_cmd[@]}" --network host "${ULIMITS[@]}" \
    --layers --target "$target" --tag "$ref" \
    --build-arg "PYTHON_IMAGE=$BASE_REF" --build-arg "REVISION=$REVISION" \
    "${MOUNTS[@]}" --file Dockerfile . >"$CACHE/build-$target.log" 2>&1 \
    || { tail -n 20 "$CACHE/build-$target.log" >&2; fail "building $target failed (see ${CACHE#"$ROOT"/}/build-$target.log)"; }
  local size user
  size="$("$tool" inspect --type image --format '{{.Size}}' "$ref" 2>/dev/null || echo 0)"
  user="$("$tool" inspect --type image --format '{{.Config.User}}' "$ref" 2>/dev/null || echo '?')"
  printf 'build-image: %-9s localhost/%s  %d MB  user %s  (%ds)\n' "$target" "$ref" $((size / 1000000)) "$user" $(($(date +%s) - t))
}

# Explicit limits for the build's containers: runc fails to start them (setrlimit: operation not
# permitted) when asked for the runtime's defaults, above what this machine allows. Capped by this
# shell's hard limits.
cap() { local v; v="$(ulimit "$1")"; [[ "$v" == unlimited || "$v" -gt "$2" ]] && echo "$2" || echo "$v"; }
ULIMITS=(--ulimit "nofile=$(cap -Hn 20000):$(cap -Hn 20000)" --ulimit "nproc=$(cap -Hu 4096):$(cap -Hu 4096)")

mkdir -p "$CACHE"
if [[ -n "$base" ]]; then BASE_REF="$base"; else BASE_REF="$(base_image)"; fi
if [[ "$base_only" == 1 ]]; then
  echo "build-image: base $BASE_REF ready ($(($(date +%s) - t0))s)"
  exit 0
fi
REVISION="$(git rev-parse HEAD 2>/dev/null || true)"
if [[ -n "$REVISION" ]] && [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  REVISION="$REVISION-dirty"
fi
MOUNTS=(--volume "$tmp/pip.conf:/etc/pip.conf:ro")
while IFS= read -r path; do
  [[ -n "$path" ]] && MOUNTS+=(--volume "$path:$path:ro")
done < <(pip_mounts)

build sidecar "$SIDECAR_REF"
[[ "$dashboard" == 1 ]] && build dashboard "$DASHBOARD_REF"
echo "build-image: done in $(($(date +%s) - t0))s (base $BASE_REF, revision ${REVISION:-unknown})"
