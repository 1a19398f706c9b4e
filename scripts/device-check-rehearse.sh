#!/usr/bin/env bash
# make device-check-rehearse: scripts/device-check.sh from the bundle (out/device/, made by
# `make device-bundle`) rehearsed three ways on a machine without a GPU, each outcome
# asserted, so the script a lent GPU runs is known to pass where it should and to fail
# closed, explaining itself, where it should:
#
#   1. on the CUDA emulator (out/cuda-sim/, `make cuda-sim`): passes; summary.json says ok,
#      with as many GPU tests run as the test lists name, and where the kernels came from;
#   2. with no libcuda on the library path: fails at the preflight, naming libcuda;
#   3. on the emulator with one kernel module corrupted: fails at the preflight, naming it.
#
# Outputs under out/device-check-sim/ (1) and out/device-check-rehearse/{no-libcuda,corrupt}/.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=out/device
sim=$(pwd)/out/cuda-sim
[ -x "$bundle/device-check.sh" ] || { echo "rehearse: no $bundle (make device-bundle)" >&2; exit 1; }
[ -e "$sim/lib/libcuda.so.1" ] || { echo "rehearse: no $sim (make cuda-sim)" >&2; exit 1; }

field() { # file key: the value of "key" in summary.json's top level, as Python sees it
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))' "$1" "$2"
}

echo "== rehearsal 1: on the CUDA emulator (must pass)"
out1=$(pwd)/out/device-check-sim
rm -rf "$out1"
LD_LIBRARY_PATH="$sim/lib" PTX_DIR="$sim/modules" QUICK=1 OUT="$out1" \
    "$bundle/device-check.sh" > "$out1.log" 2>&1 || { tail -40 "$out1.log"; echo "rehearse: the emulator run failed" >&2; exit 1; }
python3 - "$out1/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["ok"] is True, s
assert s["gpu_tests_run"] == s["gpu_tests_expected"] > 0, s
assert "emulator" in s["device"]["name"], s["device"]
assert all(m["origin"] == "ptx-override" for m in s["kernels"]["modules"]), s["kernels"]
assert s["device"]["sm_count"] == 8 and s["device"]["memory_pools"] is True, s["device"]
assert "absent" in s["thermal"].get("nvml", s["thermal"]), s["thermal"]
print(f"rehearsal 1: ok, {s['gpu_tests_run']} of {s['gpu_tests_expected']} GPU tests ran on "
      f"{s['device']['name']}, {len(s['steps'])} steps")
PY

echo "== the loader's order on the emulator: the profile's cubin, else the shipped PTX"
# The emulator's stand-in modules laid out as the daemon's kernels directory.
kdir=$(pwd)/out/device-check-rehearse/kernels
rm -rf "$kdir" && mkdir -p "$kdir/sm_87" "$kdir/ptx"
n_modules=$(ls "$sim"/modules/*.ptx | wc -l)
for f in "$sim"/modules/*.ptx; do
    n=$(basename "$f" .ptx)
    cp "$f" "$kdir/sm_87/$n.cubin" && cp "$f" "$kdir/ptx/$n.ptx"
done
LD_LIBRARY_PATH="$sim/lib" INFERLOOP_KERNELS_DIR="$kdir" "$bundle/gpu-preflight" 2>/dev/null \
    | grep -x "kernels: cubin x$n_modules (kernels dir $kdir)"
LD_LIBRARY_PATH="$sim/lib" INFERLOOP_SIM_PROFILE=h200 INFERLOOP_KERNELS_DIR="$kdir" \
    "$bundle/gpu-preflight" 2>/dev/null | grep -x "kernels: ptx x$n_modules (kernels dir $kdir)"

if ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '; then
    echo "rehearse: this machine has a system libcuda.so.1: rehearsal 2 needs a machine without one" >&2
    exit 1
fi
echo "== rehearsal 2: no libcuda on the library path (must fail naming it)"
out2=$(pwd)/out/device-check-rehearse/no-libcuda
rm -rf "$out2" && mkdir -p "$out2"
if LD_LIBRARY_PATH= OUT="$out2" "$bundle/device-check.sh" > "$out2.log" 2>&1; then
    cat "$out2.log"; echo "rehearse: device-check passed without libcuda" >&2; exit 1
fi
grep -m1 'FAILED' "$out2.log"
grep -q 'FAILED: no CUDA driver found: libcuda.so.1 cannot be loaded' "$out2.log"
[ "$(field "$out2/summary.json" ok)" = false ]
grep -q 'libcuda' "$out2/summary.json"
echo "rehearsal 2: failed as it must, naming libcuda"

echo "== rehearsal 3: a corrupted kernel module (must fail naming it)"
out3=$(pwd)/out/device-check-rehearse/corrupt
rm -rf "$out3" && mkdir -p "$out3/modules"
cp "$sim"/modules/*.ptx "$out3/modules/"
printf 'this is not a kernel module\n' > "$out3/modules/rope.ptx"
if LD_LIBRARY_PATH="$sim/lib" PTX_DIR="$out3/modules" OUT="$out3" \
    "$bundle/device-check.sh" > "$out3.log" 2>&1; then
    cat "$out3.log"; echo "rehearse: device-check passed with a corrupted module" >&2; exit 1
fi
grep -m1 'FAILED' "$out3.log"
grep -q "FAILED: kernel module rope (ptx-override $out3/modules/rope.ptx) does not load" "$out3.log"
[ "$(field "$out3/summary.json" ok)" = false ]
grep -q 'kernel module rope' "$out3/summary.json"
echo "rehearsal 3: failed as it must, naming the module"
echo
echo "device-check rehearsals: all three outcomes as expected"
