#!/usr/bin/env bash
# Builds the peer we compare against: llama.cpp's own llama-server, from the llama.cpp copy
# that the llama-cpp-python sdist vendors (the llama-cpp-2 crate ships no server sources).
# PyPI is reachable from our machines, GitHub is not. Output: peer/llama-server (ignored).
#
# GGML_NATIVE=OFF with AVX2 on, like inferloopd's llama.cpp (llama-cpp-sys-2 turns native
# off), so the comparison is of the serving layers, not of instruction sets.
# PEER_NATIVE=1 builds it the way a user's default build is instead (-march=native).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${PEER_LLAMA_CPP_PYTHON:-0.3.36}"
DIR="$ROOT/peer"
OUT="$DIR/llama-server"
SRC="$DIR/llama_cpp_python-$VERSION"

log() { echo "build-peer: $*"; }
die() { echo "build-peer: error: $*" >&2; exit 1; }

if [[ -x "$OUT" ]]; then
    log "$OUT present"
    exit 0
fi
command -v cmake >/dev/null 2>&1 || die "cmake not found (scripts/install-deps.sh)"
mkdir -p "$DIR"
if [[ ! -d "$SRC" ]]; then
    log "downloading the llama-cpp-python $VERSION sdist from PyPI"
    # --no-binary for this package only: with :all: pip also builds the sdist's build
    # dependencies (ninja, cmake) from source to read its metadata, which takes many minutes.
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$DIR"
    tar -xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
fi
[[ -d "$SRC/vendor/llama.cpp/tools/server" ]] || die "no tools/server in $SRC/vendor/llama.cpp"

native=OFF
[[ "${PEER_NATIVE:-0}" == 1 ]] && native=ON
log "building llama-server (GGML_NATIVE=$native)"
cmake -S "$SRC/vendor/llama.cpp" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE="$native" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$DIR/build" --target llama-server -j "$(nproc)"
install -m 0755 "$DIR/build/bin/llama-server" "$OUT"
log "built $OUT"
