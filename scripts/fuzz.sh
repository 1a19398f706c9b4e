#!/usr/bin/env bash
# Runs the libFuzzer targets in fuzz/ (cargo fuzz) one after another and writes what each
# did to $FUZZ_OUT/summary.txt: executions, exec/s, coverage (libFuzzer's cov: and ft:),
# corpus size, peak RSS. Fails on the first target that finds a crash, a timeout or an
# out-of-memory, naming the input libFuzzer saved under fuzz/artifacts/<target>/.
#
#   FUZZ_RUNS      executions per target (1000000)
#   FUZZ_MAX_TIME  seconds per target at most, whichever comes first (0: no limit)
#   FUZZ_TARGETS   which targets (all of them)
#   FUZZ_TIMEOUT   seconds one input may take before it counts as a hang (10)
#   FUZZ_OUT       where the logs and summary go (out/fuzz)
#   FUZZ_CORPUS    where each target's corpus grows, one folder per target (fuzz/corpus)
#   FUZZ_BUILD     release (optimized; what `make fuzz` uses) or dev (unoptimized: a cold
#                  build of every dependency and llama.cpp's C++ takes a fraction of the time,
#                  inputs run slower; what make fuzz-smoke uses)
#
# Built with --sanitizer none (the code under test is safe Rust; no nightly flag needed, so
# the stable toolchain builds it) and --debug-assertions (overflow checks on). The corpus
# grows in fuzz/corpus/<target> (ignored by git); fuzz/seeds/<target> is read as well.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs="${FUZZ_RUNS:-1000000}"
max_time="${FUZZ_MAX_TIME:-0}"
timeout="${FUZZ_TIMEOUT:-10}"
out="${FUZZ_OUT:-out/fuzz}"
corpora="${FUZZ_CORPUS:-fuzz/corpus}"
read -r -a targets <<<"${FUZZ_TARGETS:-request_body template tool_calls sse gguf ddi}"
case "${FUZZ_BUILD:-release}" in
    release) flags=(--sanitizer none --debug-assertions) ;;
    dev) flags=(--sanitizer none --dev) ;;
    *) echo "fuzz: FUZZ_BUILD must be release or dev, not ${FUZZ_BUILD}" >&2; exit 2 ;;
esac

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: cargo-fuzz is missing; install it with: cargo install cargo-fuzz --locked" >&2
    echo "      (scripts/install-deps.sh does)" >&2
    exit 1
fi

# cargo fuzz sets RUSTFLAGS, which replaces .cargo/config.toml's target-cpu: give it the same
# one, so llama.cpp's C++ gets the workspace build's flags (and a ccache hit, see Makefile).
if [[ -z "${RUSTFLAGS:-}" && "$(uname -m)" == x86_64 ]]; then
    export RUSTFLAGS="-C target-cpu=x86-64-v3"
fi

mkdir -p "$out"
start=$SECONDS
cargo fuzz build "${flags[@]}"
echo "fuzz: built in $((SECONDS - start))s"

summary="$out/summary.txt"
printf '%-13s %10s %8s %7s %7s %6s %7s %8s\n' target execs exec/s cov ft corpus rss_mb seconds >"$summary"
failed=()
for t in "${targets[@]}"; do
    corpus="$corpora/$t"
    mkdir -p "$corpus" "fuzz/artifacts/$t"
    log="$out/$t.log"
    echo "fuzz: $t: $runs runs (at most ${max_time}s; 0 = no limit), log in $log"
    t0=$SECONDS
    rc=0
    cargo fuzz run "${flags[@]}" "$t" "$corpus" "fuzz/seeds/$t" -- \
        -runs="$runs" -max_total_time="$max_time" -timeout="$timeout" \
        -print_final_stats=1 >"$log" 2>&1 || rc=$?
    took=$((SECONDS - t0))
    stat() { grep -m1 "^stat::$1:" "$log" | awk '{print $2}'; }
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n1 || true)
    field() { sed -nE "s/.* $1: ([0-9]+).*/\1/p" <<<"$last"; }
    printf '%-13s %10s %8s %7s %7s %6s %7s %8s\n' "$t" "$(stat number_of_executed_units)" \
        "$(stat average_exec_per_sec)" "$(field cov)" "$(field ft)" "$(field corp)" \
        "$(stat peak_rss_mb)" "$took" | tee -a "$summary"
    if [[ $rc -ne 0 ]]; then
        echo "fuzz: $t FAILED (exit $rc); the last lines of $log:" >&2
        tail -n 30 "$log" >&2
        failed+=("$t")
    fi
done
echo
cat "$summary"
echo "total $((SECONDS - start))s"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: findings in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
