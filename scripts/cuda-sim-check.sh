#!/usr/bin/env bash
# make cuda-sim-test: the CUDA path, on a machine with no GPU, on the CUDA emulator
# (the crate inferloop-cuda-sim in cuda-kernels/sim/: every kernel compiled for this CPU
# behind a stand-in libcuda.so.1).
# It checks what can fail without hardware (indexing, bounds, barriers, shuffles, launch
# geometry, the host side's buffers and arguments, the daemon's CUDA forward pass end to
# end), not speed and not the GPU itself: scripts/device-check.sh does that on a GPU.
#
#   1. every CUDA kernel test against its twin and the daemon's CUDA forward pass against
#      the CPU twins, bit for bit, with each block's threads run first-to-last and again
#      last-to-first (a missing barrier shows in one of the two orders; SIM_ORDERS picks,
#      `none` skips this step); with
#      INFERLOOP_REQUIRE_GPU=1, and every GPU test listed must have run on the emulator;
#   2. golden on the real Q8_0 model: --device cuda reports what --device cpu reports;
#   3. the daemon served with --backend native --device cuda answers the openai client
#      exactly as --device cpu does, whole and streamed;
#   4. q8-bench and native_decode run their CUDA branches (their figures are the
#      emulator's, meaningless as speed).
# About 3 minutes on 2 cores once `make build` is done.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCKED=${LOCKED---locked}
BIN=${BIN:-target/release/inferloopd}
MODEL_Q8=${MODEL_Q8:-models/SmolLM2-135M-Instruct.Q8_0.gguf}
PY=${PY:-.venv/bin/python}
out=out/cuda-sim
mkdir -p "$out/check"

step() { printf '\n== cuda-sim: %s\n' "$*"; }

step "building the emulator"
# Whole-workspace builds (no -p), so that `make build` and `make test`'s artifacts are reused.
cargo build --release $LOCKED --bins --example native_decode
env_lines=$(target/release/cuda-sim --out "$out")
while read -r line; do export "${line?}"; done <<< "$env_lines"
echo "$env_lines"

# INFERLOOP_REQUIRE_GPU=1: a GPU test that cannot open the (emulated) GPU panics instead of
# saying "GPU test skipped" and passing. Each GPU test (one under a `gpu::` module) prints
# "GPU test ran: <name>"; every listed one must have, and the count is printed.
export INFERLOOP_REQUIRE_GPU=1
gpu_listed=$(cargo test --release $LOCKED --workspace -- gpu cuda --list 2>/dev/null \
    | sed -n 's/: test$//p' | grep -E '(^|::)gpu::' | sort -u || true)
all_gpu_tests_ran() {
    local got missing
    if grep -q "GPU test skipped" "$1"; then
        grep "GPU test skipped" "$1" | sort | uniq -c
        echo "cuda-sim: tests skipped their GPU part: the emulator was not loaded" >&2
        exit 1
    fi
    got=$(sed -n 's/.*GPU test ran: \([^ ]*\).*/\1/p' "$1" | sort -u)
    missing=$(comm -23 <(printf '%s\n' "$gpu_listed") <(printf '%s\n' "$got"))
    if [ -n "$missing" ] || [ -z "$gpu_listed" ]; then
        echo "cuda-sim: GPU tests listed but not run on the emulator: ${missing:-none listed}" >&2
        exit 1
    fi
    echo "  $(printf '%s\n' "$got" | grep -c .) GPU tests ran on the emulator, as many as listed"
}

# Every test named gpu or cuda in the workspace: the kernels against their twins and the
# daemon's CUDA forward pass against the CPU twins (and its selection and ledger tests).
# SIM_ORDERS picks the orders; `none` runs no test, only steps 2-4 (what CI does: its device
# phase runs the same GPU tests on the emulator in the forward order, through
# scripts/device-check.sh).
read -r -a orders <<< "${SIM_ORDERS:-forward reverse}"
[ "${orders[*]}" = none ] && orders=()
for order in ${orders[@]+"${orders[@]}"}; do
    step "GPU tests, threads run $order"
    INFERLOOP_SIM_ORDER=$order cargo test --release $LOCKED --workspace -- gpu cuda --nocapture \
        > "$out/check/tests-$order.log" 2>&1 || { tail -50 "$out/check/tests-$order.log"; exit 1; }
    grep -E "^test .* ok$" "$out/check/tests-$order.log" | grep -E "gpu|cuda" | sed 's/^/  /'
    all_gpu_tests_ran "$out/check/tests-$order.log"
done

step "golden on $MODEL_Q8: --device cuda against --device cpu"
printf 'Name the capital city of France.\n' > "$out/check/golden-prompts.txt"
for dev in cpu cuda; do
    "$BIN" golden --model "$MODEL_Q8" --prompts "$out/check/golden-prompts.txt" --continue 4 \
        --device "$dev" --json > "$out/check/golden-$dev.json" 2> "$out/check/golden-$dev.log" \
        || { tail -20 "$out/check/golden-$dev.log"; exit 1; }
done
python3 - "$out/check/golden-cpu.json" "$out/check/golden-cuda.json" <<'PY'
import json, sys
cpu, cuda = (json.load(open(p)) for p in sys.argv[1:3])
for r in (cpu, cuda):
    for k in ("llama_seconds", "native_seconds"):
        r.pop(k, None)
print("golden cuda:", json.dumps(cuda))
assert cuda["positions"] >= 20, cuda
assert cuda == cpu, f"golden differs between devices:\n cpu  {cpu}\n cuda {cuda}"
print("golden: --device cuda reports exactly what --device cpu reports")
PY

step "served with --backend native --device cuda, against --device cpu"
"$PY" tests/cuda-sim/served.py "$BIN" "$MODEL_Q8"

step "q8-bench and native_decode, CUDA branches"
target/release/q8-bench --device cuda --small --batch 1 --reps 1 --json "$out/check/q8-bench.json" > /dev/null
python3 - "$out/check/q8-bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
rows = rows["rows"] if isinstance(rows, dict) else rows
assert rows and all("emulator" in r["device"] for r in rows), rows
print(f"q8-bench: {len(rows)} rows on {rows[0]['device']}")
PY
target/release/examples/native_decode --device cuda --shape smollm2 --prompt 4 --tokens 1 \
    --json "$out/check/native-decode.json" > /dev/null
grep -q '"device": "cuda InferLoop CUDA emulator' "$out/check/native-decode.json"
echo "native_decode: ran on the emulator"
echo
echo "cuda-sim: every check passed"
