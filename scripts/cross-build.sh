#!/usr/bin/env bash
# Cross-builds inferloopd (llama.cpp included), the qualification suite (inferloop-qual) and
# the fleet agent (inferloop-ota, the image's `[ota] agent`) for aarch64-unknown-linux-gnu,
# release, tuned for the Jetson Orin's Cortex-A78AE (scripts/cross/aarch64-orin.cmake), and
# puts all three in target/aarch64-unknown-linux-gnu/release/.
#
# With a working Docker and `cross` on PATH it uses `cross` (Cross.toml). Otherwise it uses
# Debian packages: Debian's rustc-web with the arm64 standard library, the aarch64 GCC
# cross compilers, and qemu-user-static for `make cross-test`; missing ones are installed
# (as root). INFERLOOP_CROSS=apt forces the Debian path, INFERLOOP_CROSS=docker the other.
set -euo pipefail

TARGET=aarch64-unknown-linux-gnu
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/target/$TARGET/release/inferloopd"
QUAL_OUT="$ROOT/target/$TARGET/release/inferloop-qual"
OTA_OUT="$ROOT/target/$TARGET/release/inferloop-ota"
PACKAGES=(-p inferloopd -p inferloop-qual -p inferloop-ota)
export INFERLOOP_CROSS_DIR="$ROOT/scripts/cross"
export CMAKE_TOOLCHAIN_FILE_aarch64_unknown_linux_gnu="$INFERLOOP_CROSS_DIR/aarch64-orin.cmake"
LOCKED=()
[[ -f "$ROOT/Cargo.lock" ]] && LOCKED=(--locked)

log() { echo "cross-build: $*"; }
die() { echo "cross-build: error: $*" >&2; exit 1; }

have_docker() {
    command -v cross >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 \
        && docker info >/dev/null 2>&1
}

is_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

install_debian_toolchain() {
    command -v dpkg-query >/dev/null 2>&1 || die "no Docker+cross and not Debian: install an aarch64 cross toolchain"
    local pkgs=(rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu g++-aarch64-linux-gnu
                qemu-user-static cmake clang libclang-dev)
    local missing=() pkg
    for pkg in "${pkgs[@]}"; do is_installed "$pkg" || missing+=("$pkg"); done
    local need_arch=0
    dpkg --print-foreign-architectures | grep -qx arm64 || need_arch=1
    if [[ ${#missing[@]} -eq 0 && $need_arch -eq 0 ]]; then
        log "Debian cross toolchain present"
        return
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        die "missing: ${missing[*]}; run as root, or: sudo dpkg --add-architecture arm64 && sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    fi
    [[ $need_arch -eq 1 ]] && { log "adding the arm64 architecture"; dpkg --add-architecture arm64; }
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

cd "$ROOT"
mode="${INFERLOOP_CROSS:-auto}"
if [[ "$mode" != apt ]] && have_docker; then
    log "using cross (Docker)"
    cross build --release "${LOCKED[@]}" --target "$TARGET" "${PACKAGES[@]}"
else
    [[ "$mode" == docker ]] && die "INFERLOOP_CROSS=docker but cross or a running Docker is missing"
    log "no usable Docker: using Debian's cross toolchain"
    install_debian_toolchain
    # Debian's rustc (1.96 from rustc-web) matches libstd-rust-web-dev:arm64; rustup's rustc,
    # first on PATH, has no aarch64 std. Its own target dir keeps the two compilers' builds
    # (and cargo's build lock) apart from the host build in target/.
    export RUSTC=/usr/bin/rustc
    export CARGO_TARGET_DIR="$ROOT/target/cross"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    log "$("$RUSTC" --version), target $TARGET, ggml-cpu for armv8.2-a+dotprod+fp16"
    cargo build --release "${LOCKED[@]}" --target "$TARGET" "${PACKAGES[@]}"
    install -D -m 0755 "$CARGO_TARGET_DIR/$TARGET/release/inferloopd" "$OUT"
    install -D -m 0755 "$CARGO_TARGET_DIR/$TARGET/release/inferloop-qual" "$QUAL_OUT"
    install -D -m 0755 "$CARGO_TARGET_DIR/$TARGET/release/inferloop-ota" "$OTA_OUT"
fi

[[ -x "$OUT" ]] || die "no binary at $OUT"
[[ -x "$QUAL_OUT" ]] || die "no binary at $QUAL_OUT"
[[ -x "$OTA_OUT" ]] || die "no binary at $OTA_OUT"
log "built $OUT ($(stat -c %s "$OUT") bytes)"
log "built $QUAL_OUT ($(stat -c %s "$QUAL_OUT") bytes)"
log "built $OTA_OUT ($(stat -c %s "$OTA_OUT") bytes)"
command -v file >/dev/null 2>&1 && log "$(file -b "$OUT")"
# The int8 dot-product instructions are the point of the armv8.2-a+dotprod build.
if command -v aarch64-linux-gnu-objdump >/dev/null 2>&1; then
    log "sdot/udot instructions in the binary: $(aarch64-linux-gnu-objdump -d "$OUT" | grep -cE '\s(s|u)dot\s' || true)"
fi
