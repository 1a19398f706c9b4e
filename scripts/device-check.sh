#!/usr/bin/env bash
# The CUDA checks, on a machine with an NVIDIA GPU and no Rust toolchain. Fails closed: any
# step that cannot run on the GPU is a failure, never a skip. Takes a bundle made here by
# `make device-bundle` (out/device/: gpu-preflight, the test executables, native_decode,
# q8-bench, and kernels/ = sm_87/*.cubin, sm_90/*.cubin, ptx/*.ptx from `make kernels-check`).
#
#   1. gpu-preflight opens the GPU and loads every kernel module the way the daemon does
#      (cubin for the device, else the shipped PTX, else the device's NVRTC), printing the
#      driver, CUDA and NVRTC versions, the device's limits, where each module came from, and
#      one NVML/board thermal reading. If it fails, nothing else runs.
#   2. every test executable, with INFERLOOP_REQUIRE_GPU=1 (a GPU test that cannot open the
#      GPU panics instead of skipping); the GPU tests (those under a `gpu::` module in
#      `--list`) must each print "GPU test ran: <name>", and the count must match.
#   3. the daemon's CUDA forward pass against the CPU twins (its `gpu::` tests), native
#      decode on synthetic weights, q8-bench on the GPU and on the CPU.
#
# Writes OUT/summary.json (ok, gpu_tests_run, gpu_tests_expected, versions, device, kernel
# sources, thermal reading, per-step results) and exits non-zero unless everything passed.
#
#   x86-64 GPU box:  make device-bundle; copy out/device/ over; run device/device-check.sh
#   Jetson (Orin):   make device-bundle TARGET=aarch64-unknown-linux-gnu, same steps.
#
# Environment: OUT (default <bundle>/../out), QUICK=1 (small shapes, few tokens: the dry run
# on the CUDA emulator, `make device-check-sim`), SHAPES (native_decode shapes; default
# smollm2, plus llama3-8b when the device has 24 GiB or more: it needs about 17 GB),
# PTX_DIR (sets INFERLOOP_KERNELS_PTX, e.g. the emulator's modules), INFERLOOP_KERNELS_DIR
# (default <bundle>/kernels). Finishes in well under 5 minutes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/../out}
mkdir -p "$out"
: > "$out/steps.tsv"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export INFERLOOP_REQUIRE_GPU=1
export INFERLOOP_KERNELS_DIR=${INFERLOOP_KERNELS_DIR:-$here/kernels}
if [ -n "${PTX_DIR:-}" ]; then
    export INFERLOOP_KERNELS_PTX="$PTX_DIR"
    echo "device-check: modules from INFERLOOP_KERNELS_PTX=$PTX_DIR"
fi
expected=0
ran=0

step() { printf '%s\t%s\t%s\n' "$1" "$2" "${3:-}" >> "$out/steps.tsv"; }
finish() {
    "$here/gpu-preflight" summary "$out" --gpu-tests-expected "$expected" --gpu-tests-run "$ran"
    exit $?
}

echo "== gpu-preflight"
if "$here/gpu-preflight" --json "$out/preflight.json" 2>&1 | tee "$out/preflight.log"; then
    step preflight ok "$(grep -m1 '^kernels:' "$out/preflight.log")"
else
    step preflight failed "$(grep -m1 'FAILED' "$out/preflight.log")"
    echo "device-check: the preflight failed; nothing else runs" >&2
    finish
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.max.memory --format=csv \
    > "$out/gpu.csv" 2>&1 || true

# Runs test executable $2 (filter $3, optional) as step $1, and checks its GPU tests.
tests() {
    local name=$1 exe=$2 filter=${3:-} log="$out/test-$1.log"
    local listed got missing extra
    listed=$("$exe" --list $filter 2>/dev/null | sed -n 's/: test$//p' | grep -E '(^|::)gpu::' | sort -u)
    echo "== $name ($(printf '%s' "$listed" | grep -c .) GPU tests listed)"
    if ! timeout 300 "$exe" $filter --test-threads=1 --nocapture > "$log" 2>&1; then
        step "$name" failed "see $log: $(grep -m3 -E 'panicked|FAILED|failed' "$log" | tr '\n' ' ')"
        echo "FAILED: $name (see $log)"
    else
        step "$name" ok "$(grep -E '^test result' "$log" | tail -1)"
    fi
    got=$(sed -n 's/.*GPU test ran: \([^ ]*\).*/\1/p' "$log" | sort -u)
    missing=$(comm -23 <(printf '%s\n' "$listed" | grep .) <(printf '%s\n' "$got" | grep .))
    extra=$(comm -13 <(printf '%s\n' "$listed" | grep .) <(printf '%s\n' "$got" | grep .))
    expected=$((expected + $(printf '%s' "$listed" | grep -c .)))
    ran=$((ran + $(comm -12 <(printf '%s\n' "$listed" | grep .) <(printf '%s\n' "$got" | grep .) | grep -c .)))
    if [ -n "$missing" ] || [ -n "$extra" ]; then
        step "$name gpu tests" failed "listed but not run on the GPU: ${missing//$'\n'/ }; ran outside a gpu:: module: ${extra//$'\n'/ }"
        echo "FAILED: $name: GPU tests not run: ${missing//$'\n'/ } ${extra:+; outside gpu::: ${extra//$'\n'/ }}"
    fi
    grep -E "test result|GPU test skipped" "$log" | sort | uniq -c
}

for t in "$here"/tests/*; do
    tests "$(basename "$t")" "$t"
done
# The native forward pass on the GPU against the CPU twins, bit for bit (synthetic llama
# and qwen2 weights; no model file needed), from the daemon's own test binary.
if [ -x "$here/daemon/inferloopd-lib" ]; then
    tests inferloopd-gpu "$here/daemon/inferloopd-lib" gpu::
fi

# Native decode on the GPU with synthetic weights: tokens/s and the weight bytes read per
# token over the copy bandwidth. Llama-3-8B's shape needs ~17 GB: only on a device that big.
quick=${QUICK:-0}
total=$(sed -n 's/.*"total_bytes": \([0-9]*\).*/\1/p' "$out/preflight.json" | head -1)
shapes=${SHAPES:-smollm2}
if [ -z "${SHAPES:-}" ] && [ "${total:-0}" -ge $((24 << 30)) ] && [ "$quick" != 1 ]; then
    shapes="smollm2 llama3-8b"
fi
tokens=64; bench_args=()
if [ "$quick" = 1 ]; then
    tokens=2; bench_args=(--small --batch 1 --reps 1)
fi
if [ -x "$here/daemon/native_decode" ]; then
    for shape in $shapes; do
        echo "== native_decode --device cuda --shape $shape"
        if timeout 180 "$here/daemon/native_decode" --device cuda --shape "$shape" --tokens "$tokens" \
            --json "$out/native-decode-$shape.json" > "$out/native-decode-$shape.log" 2>&1; then
            step "native_decode $shape" ok "$(grep -E '"decode_tok_s"' "$out/native-decode-$shape.json" | tr -d ' ,')"
        else
            step "native_decode $shape" failed "see $out/native-decode-$shape.log"
            echo "FAILED: native_decode $shape (see $out/native-decode-$shape.log)"
        fi
        grep -E '"decode_tok_s"|"ratio"' "$out/native-decode-$shape.json" 2>/dev/null
    done
fi
echo "== q8-bench --device cuda"
if timeout 150 "$here/q8-bench" --device cuda "${bench_args[@]}" --json "$out/q8-bench-cuda.json"; then
    step "q8-bench cuda" ok "$out/q8-bench-cuda.json"
else
    step "q8-bench cuda" failed "exit $?"
fi
echo "== q8-bench --device cpu --small"
if timeout 60 "$here/q8-bench" --device cpu --small --json "$out/q8-bench-cpu.json"; then
    step "q8-bench cpu" ok "$out/q8-bench-cpu.json"
else
    step "q8-bench cpu" failed "exit $?"
fi
finish
