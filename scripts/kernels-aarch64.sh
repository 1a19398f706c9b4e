#!/usr/bin/env bash
# Cross-builds the inferloop-kernels tests for aarch64 and runs them under qemu-user, so the
# NEON paths of the CPU twins are checked (bit for bit against the scalar path, and against
# the f64 references) without an ARM machine. Uses the Debian cross toolchain that
# scripts/cross-build.sh installs (rustc-web with the arm64 std, aarch64-linux-gnu-gcc,
# qemu-user-static).
set -euo pipefail

TARGET=aarch64-unknown-linux-gnu
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

for tool in /usr/bin/rustc aarch64-linux-gnu-gcc qemu-aarch64-static; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "kernels-aarch64: error: $tool missing; run scripts/cross-build.sh once (it installs the cross toolchain)" >&2
        exit 2
    }
done

export RUSTC=/usr/bin/rustc
export CARGO_TARGET_DIR="$ROOT/target/cross"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
LOCKED=()
[[ -f Cargo.lock ]] && LOCKED=(--locked)

mapfile -t bins < <(cargo test --release "${LOCKED[@]}" -p inferloop-kernels --target "$TARGET" \
    --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')
[[ ${#bins[@]} -gt 0 ]] || { echo "kernels-aarch64: error: no test executables built" >&2; exit 1; }

# Without -E LD_LIBRARY_PATH the cross loader meets the arm64 libc and hangs (FACTS.md).
for bin in "${bins[@]}"; do
    echo "kernels-aarch64: $(basename "$bin")"
    qemu-aarch64-static -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib \
        "$bin" --test-threads 2
done
echo "kernels-aarch64: every test passed on aarch64 (NEON and scalar twins)"
