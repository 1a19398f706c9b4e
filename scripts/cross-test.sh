#!/usr/bin/env bash
# Runs the cross-built aarch64 inferloopd under qemu: --version, then a short real
# generation with the default model (serve --port 0, one chat request, max_tokens 4), then
# the cross-built qualification suite (also emulated) against that daemon: its case list and
# the checks that need no generation (emulated decode is a few tokens per second).
#
# -E LD_LIBRARY_PATH=...: without it the emulated loader from libc6-arm64-cross meets the
# libc6:arm64 that the arm64 std package pulled in, and the daemon hangs at its first
# pthread_create.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/target/aarch64-unknown-linux-gnu/release/inferloopd}"
QUAL="${QUAL:-$ROOT/target/aarch64-unknown-linux-gnu/release/inferloop-qual}"
# Qualification cases that only read routes, metrics and status: no generation.
QUAL_FILTER='api.healthz.*,api.readyz.*,api.models.*,api.route.*,api.method.*,device.metrics.*,device.status.*'

MODEL="${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
SYSROOT=/usr/aarch64-linux-gnu
QEMU=(qemu-aarch64-static -L "$SYSROOT" -E "LD_LIBRARY_PATH=$SYSROOT/lib")

log() { echo "cross-test: $*"; }
die() { echo "cross-test: error: $*" >&2; exit 1; }

[[ -x "$BIN" ]] || die "no $BIN; run: make cross"
[[ -x "$QUAL" ]] || die "no $QUAL; run: make cross"
[[ -f "$MODEL" ]] || die "no $MODEL; run: make model"
command -v qemu-aarch64-static >/dev/null 2>&1 || die "qemu-aarch64-static not found (apt-get install qemu-user-static)"
command -v curl >/dev/null 2>&1 || die "curl not found"

log "$(timeout 60 "${QEMU[@]}" "$BIN" --version)"

logfile="$(mktemp)"
"${QEMU[@]}" "$BIN" serve --model "$MODEL" --port 0 --threads 2 --slots 1 --ctx 256 \
    2>"$logfile" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; rm -f "$logfile"; }
trap cleanup EXIT

SECONDS=0
addr=""
for _ in $(seq 1 600); do
    addr="$(sed -n 's/.*listening on http:\/\/\([0-9.:]*\).*/\1/p' "$logfile" | head -n1)"
    [[ -n "$addr" ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$logfile" >&2; die "the daemon exited"; }
    sleep 0.5
done
[[ -n "$addr" ]] || { cat "$logfile" >&2; die "no 'listening on' line after 300 s"; }
for _ in $(seq 1 600); do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/readyz")" == 200 ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$logfile" >&2; die "the daemon exited"; }
    sleep 0.5
done
log "ready on $addr after ${SECONDS} s (emulated)"
sysinfo="$(curl -s "http://$addr/v1/status" | python3 -c 'import json, sys; print(json.load(sys.stdin)["llama"]["system_info"])')"
log "llama.cpp: $sysinfo"
[[ "$sysinfo" == *"DOTPROD = 1"* ]] || die "llama.cpp was not built with the int8 dot product"

body='{"model":"SmolLM2-135M-Instruct.Q4_1","messages":[{"role":"user","content":"Say hello"}],"max_tokens":4,"temperature":0}'
response="$(curl -s --max-time 600 -w '\n%{time_total}' "http://$addr/v1/chat/completions" \
    -H 'Content-Type: application/json' -d "$body")"
elapsed="$(tail -n1 <<<"$response")"
json="$(sed '$d' <<<"$response")"
log "request took ${elapsed} s (emulated)"
python3 - "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print("cross-test: text:", repr(r["choices"][0]["message"]["content"]))
print("cross-test: usage:", r.get("usage"))
t = r.get("timings") or {}
print("cross-test: timings:", {k: t[k] for k in sorted(t)})
PY

cases="$(timeout 120 "${QEMU[@]}" "$QUAL" --list | wc -l)"
log "inferloop-qual (aarch64) lists $cases cases"
[[ "$cases" -eq 385 ]] || die "expected 385 cases"
qual_status=0
timeout 600 "${QEMU[@]}" "$QUAL" --base-url "http://$addr" --filter "$QUAL_FILTER" || qual_status=$?
log "inferloop-qual (aarch64) on $QUAL_FILTER exited with $qual_status"
[[ $qual_status -eq 0 ]] || die "qualification cases failed under emulation"

kill -TERM "$pid"
wait "$pid" && status=0 || status=$?
log "daemon exited with $status after SIGTERM"
[[ $status -eq 0 ]] || { cat "$logfile" >&2; die "expected exit 0"; }
