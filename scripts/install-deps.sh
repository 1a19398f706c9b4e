#!/usr/bin/env bash
# Install the build and test prerequisites on Debian (12 "bookworm" and later).
#
# `--fuzz` also installs cargo-fuzz (make fuzz, make fuzz-smoke).
#
# Only what is missing is installed, and `apt-get update` runs only when
# something is. Without root, the script prints the command to run and fails.
#
# Rust is not taken from apt: Debian 12's rustc (1.63) is older than the
# workspace's rust-version. A rustup toolchain is expected on PATH (or in
# ~/.cargo/bin); the machines we build on come with one.
set -euo pipefail

# build-essential: C/C++ compiler and make for llama.cpp's CMake build.
# clang + libclang-dev: bindgen in llama-cpp-sys-2 ("Unable to find libclang").
# squashfs-tools, erofs-utils, zstd: inferloop-image packs and unpacks root filesystem images.
APT_PACKAGES=(
    build-essential
    # ccache: llama.cpp's C++ compiled once for the workspace and the fuzz targets (Makefile).
    ccache
    ca-certificates
    cmake
    clang
    libclang-dev
    pkg-config
    python3
    python3-pip
    python3-venv
    squashfs-tools
    erofs-utils
    zstd
    # deploy/nginx/inferloop.conf is tested in a real nginx (tests/python/test_deploy_nginx.py).
    nginx-light
    # OTA (issue 15): RAUC bundles and installs, tested with a real D-Bus service.
    rauc
    rauc-service
    dbus
    openssl
    util-linux
)
MIN_RUST="1.85.0" # keep in step with rust-version in Cargo.toml

log() { echo "install-deps: $*"; }
die() { echo "install-deps: error: $*" >&2; exit 1; }

is_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# Is version $1 >= version $2 (dotted numbers)?
version_ge() {
    [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

install_apt_packages() {
    local missing=()
    if command -v dpkg-query >/dev/null 2>&1; then
        local pkg
        for pkg in "$@"; do
            is_installed "$pkg" || missing+=("$pkg")
        done
    else
        # Not Debian: check the tools themselves and hope the libraries follow.
        log "dpkg-query not found; checking commands only (not a Debian system?)"
        local cmd
        for cmd in cc c++ make cmake clang pkg-config python3; do
            command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
        done
        if [[ ${#missing[@]} -gt 0 ]]; then
            die "missing commands: ${missing[*]}; install them with your package manager"
        fi
        return 0
    fi

    if [[ ${#missing[@]} -eq 0 ]]; then
        log "system packages present: $*"
        return 0
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "install-deps: missing packages: ${missing[*]}" >&2
        echo "install-deps: run as root, or: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

install_apt_packages "${APT_PACKAGES[@]}"

# npm (issue 30): `make codex-cli` installs the Codex CLI from the npm registry for
# tests/python/test_codex_cli.py (it needs node >= 16). A machine with its own Node.js
# (e.g. NodeSource's nodejs, which carries npm and conflicts with Debian's npm) keeps it.
if ! command -v npm >/dev/null 2>&1; then
    install_apt_packages npm
fi

# Headless Chromium and its WebDriver (issue 30) for tests/python/test_page_browser.py,
# which drives the page at `/` through selenium.
install_apt_packages chromium chromium-driver

# --- Rust toolchain -------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

if ! command -v cargo >/dev/null 2>&1; then
    die "cargo not found. Install a Rust toolchain (>= $MIN_RUST) with rustup, with the
rustfmt and clippy components, then open a new shell (or: source \"\$HOME/.cargo/env\")."
fi

rustc_version="$(rustc --version | awk '{print $2}')"
if ! version_ge "${rustc_version%%-*}" "$MIN_RUST"; then
    if command -v rustup >/dev/null 2>&1; then
        die "rustc $rustc_version is older than $MIN_RUST; run: rustup update stable"
    fi
    die "rustc $rustc_version ($(command -v rustc)) is older than $MIN_RUST; install a current toolchain with rustup (https://rustup.rs)"
fi
log "rust toolchain: $(rustc --version)"

missing_components=()
cargo fmt --version >/dev/null 2>&1 || missing_components+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || missing_components+=(clippy)
if [[ ${#missing_components[@]} -gt 0 ]]; then
    if command -v rustup >/dev/null 2>&1; then
        log "adding rust components: ${missing_components[*]}"
        rustup component add "${missing_components[@]}"
    else
        # Not fatal: building and running need neither; `make test` does.
        echo "install-deps: warning: missing ${missing_components[*]} and no rustup to add them; 'make test' will fail" >&2
    fi
fi

# cargo-fuzz (issue 31), with --fuzz (make fuzz, make fuzz-smoke): from crates.io, built by
# the toolchain above (~1 minute on 2 cores). The targets build on stable: they use
# `--sanitizer none`, which needs no nightly flag.
CARGO_FUZZ_VERSION="0.13.2"
if [[ "${1:-}" == "--fuzz" ]]; then
    if cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
        log "cargo-fuzz present: $(cargo fuzz --version)"
    else
        log "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io"
        cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
    fi
fi
log "ok"
