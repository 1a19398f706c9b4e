#!/usr/bin/env bash
# The CUDA checks, on a machine with an NVIDIA GPU and no Rust toolchain: runs the kernel
# tests (every CUDA kernel against its CPU twin), the daemon's CUDA forward pass against the
# CPU twins, native decode speed on synthetic weights (`native_decode`), and
# `q8-bench --device cuda`, and writes
# JSON under out/. Takes a bundle made here by `make device-bundle` (out/device/: the test
# executables, q8-bench, and PTX for sm_87 and sm_90 from `make kernels-check`).
#
#   x86-64 GPU box:  make device-bundle; copy out/device/ over; run  device/device-check.sh
#   Jetson (Orin):   make device-bundle TARGET=aarch64-unknown-linux-gnu, same steps. JetPack's
#                    own NVRTC compiles the kernels (/usr/local/cuda/lib64 on LD_LIBRARY_PATH);
#                    PTX_DIR=device/ptx/sm_87 uses the bundled PTX instead.
#
# Where the device's libnvrtc is not libnvrtc.so.12 (a CUDA 13 machine), the bundled PTX for
# the GPU's architecture is loaded through the driver alone; a newer driver JIT-compiles it.
# Finishes in well under 5 minutes.
#
# QUICK=1 (used by `make device-check-sim`, a dry run on the CUDA emulator, where a forward
# pass takes seconds): native_decode on the small shape for 2 tokens, q8-bench on the small
# shapes once each. Its figures are the emulator's, not a GPU's.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/../out}
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ -z "${PTX_DIR:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc.so.12' \
    && [ ! -e /usr/local/cuda/lib64/libnvrtc.so.12 ]; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
    PTX_DIR="$here/ptx/sm_${cc:-90}"
    [ -d "$PTX_DIR" ] || PTX_DIR="$here/ptx/sm_90"
fi
[ -n "${PTX_DIR:-}" ] && export INFERLOOP_KERNELS_PTX="$PTX_DIR" && echo "device-check: PTX from $PTX_DIR"

nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.max.memory --format=csv > "$out/gpu.csv" 2>&1
status=0
for t in "$here"/tests/*; do
    name=$(basename "$t")
    echo "== $name"
    if ! timeout 120 "$t" --test-threads=1 --nocapture > "$out/test-$name.log" 2>&1; then
        echo "FAILED: $name (see $out/test-$name.log)"; status=1
    fi
    grep -E "test result|GPU test skipped" "$out/test-$name.log" | sort | uniq -c
done
# The native forward pass on the GPU against the CPU twins, bit for bit (synthetic llama
# and qwen2 weights; no model file needed), from the daemon's own test binary.
if [ -x "$here/daemon/inferloopd-lib" ]; then
    echo "== inferloopd native cuda"
    if ! timeout 120 "$here/daemon/inferloopd-lib" cuda --test-threads=1 --nocapture \
        > "$out/test-inferloopd-cuda.log" 2>&1; then
        echo "FAILED: inferloopd cuda tests (see $out/test-inferloopd-cuda.log)"; status=1
    fi
    grep -E "test result|GPU test skipped" "$out/test-inferloopd-cuda.log" | sort | uniq -c
fi
# Native decode on the GPU with synthetic weights of the default model's and Llama-3-8B's
# shapes: tokens/s and the weight bytes read per token over the copy bandwidth.
quick=${QUICK:-0}
shapes="smollm2 llama3-8b"; tokens=64; bench_args=()
if [ "$quick" = 1 ]; then
    shapes=smollm2; tokens=2; bench_args=(--small --batch 1 --reps 1)
fi
if [ -x "$here/daemon/native_decode" ]; then
    for shape in $shapes; do
        echo "== native_decode --device cuda --shape $shape"
        timeout 120 "$here/daemon/native_decode" --device cuda --shape "$shape" --tokens "$tokens" \
            --json "$out/native-decode-$shape.json" > "$out/native-decode-$shape.log" 2>&1 \
            || { echo "FAILED: native_decode $shape (see $out/native-decode-$shape.log)"; status=1; }
        grep -E '"decode_tok_s"|"ratio"' "$out/native-decode-$shape.json" 2>/dev/null
    done
fi
echo "== q8-bench --device cuda"
timeout 150 "$here/q8-bench" --device cuda "${bench_args[@]}" --json "$out/q8-bench-cuda.json" || status=1
echo "== q8-bench --device cpu --small"
timeout 60 "$here/q8-bench" --device cpu --small --json "$out/q8-bench-cpu.json" || status=1
exit $status
