#!/usr/bin/env bash
# make gpu-sim-bench GPGPUSIM_SRC=DIR: our decode kernels' DRAM bandwidth on a simulated
# Orin-NX-shaped GPU, without a GPU. GPGPU-Sim (a cycle-level simulator; its source is in no
# package registry, so this stays out of CI) runs cuda-kernels/gpu-sim/harness.cu, which
# #includes the real q8_gemv.cu and launches each kernel as src/cuda/q8.rs does. Each kernel's
# bandwidth is given as a ratio to a float4 copy kernel run under the same configuration.
#
#   GPGPUSIM_SRC  a git checkout of github.com/accel-sim/gpgpu-sim_distribution (measured at
#                 667834cf); it is cloned, patched and built once into $CACHE/sim-<commit>-<patch>
#   QUICK=1       two shapes, batch 1: 1536x576 and 1024x4096 (512 rows simulated)
#   COPY_BYTES    the copy kernel's size (default 16 MiB: a smaller copy leaves part of its
#                 writes in the 2 MB L2 and overstates the DRAM bandwidth); its result is
#                 kept in $CACHE per simulator build and configuration, so it runs once
#   KERNELS       default "q8_gemv_f32 q8_gemv_q8" (the copy always runs)
#   BATCHES       default "1 4"
#   MAX_SIM_BYTES weight bytes one run may simulate (default 4718592 = 4.5 MiB): larger
#                 matrices keep k and lose rows (rows_simulated in the output), keeping at
#                 least MIN_SIM_ROWS (384: every warp of a full grid gets rows)
#   SIM_JOBS      simulations run at once (default 1: each takes one core)
#   CACHE         default ~/.cache/inferloop/gpgpusim (toolkit venv, simulator builds)
#   SIM_MODE=func functional simulation only: checks results in seconds, no timing
#
# Writes out/gpu-sim/bench.json and out/gpu-sim/bench.md; each run's simulator log lies in
# out/gpu-sim/runs/. See docs/native-and-cuda.md for what the figures mean.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
here=cuda-kernels/gpu-sim

: "${GPGPUSIM_SRC:?set GPGPUSIM_SRC to a gpgpu-sim_distribution git checkout}"
CACHE=${CACHE:-$HOME/.cache/inferloop/gpgpusim}
OUT=${OUT:-out/gpu-sim}
KERNELS=${KERNELS:-q8_gemv_f32 q8_gemv_q8}
BATCHES=${BATCHES:-1 4}
if [ "${QUICK:-0}" = 1 ]; then
    MAX_SIM_BYTES=${MAX_SIM_BYTES:-2228224}
fi
MAX_SIM_BYTES=${MAX_SIM_BYTES:-4718592}
MIN_SIM_ROWS=${MIN_SIM_ROWS:-384}
SIM_JOBS=${SIM_JOBS:-1}
COPY_BYTES=${COPY_BYTES:-16777216}
mkdir -p "$CACHE" "$OUT/runs"
CACHE=$(cd "$CACHE" && pwd)
OUT=$(cd "$OUT" && pwd)
log() { printf 'gpu-sim-bench: %s\n' "$*" >&2; }

# --- toolkit: CUDA 13 nvcc for the harness, CUDA 11.8 headers for the simulator (PyPI) ---
venv=${CUDA_VENV:-$CACHE/cuda-venv}
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.88 nvidia-cuda-cccl nvidia-cuda-cuobjdump==13.2.51
    nvidia-cuda-runtime-cu11==11.8.89 nvidia-cuda-nvcc-cu11==11.8.89
    nvidia-cuda-profiler-api-cu11==11.8.86)
if [ ! -f "$venv/.installed-13.0.88" ]; then
    log "installing the CUDA 13 and 11.8 wheels into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${wheels[@]}"
    touch "$venv/.installed-13.0.88"
fi
nv=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia
cu13=$nv/cu13
ln -sfn lib "$cu13/lib64"
ln -sf libcudart.so.13 "$cu13/lib/libcudart.so"
# The simulator compiles against CUDA 11.8's headers (12+ dropped texture references) but
# calls the CUDA 13 nvcc and cuobjdump: a directory holding both.
cu11=$CACHE/cuda11
if [ ! -f "$cu11/.ready" ]; then
    mkdir -p "$cu11/include"
    for d in cuda_runtime cuda_nvcc cuda_profiler_api; do cp -rn "$nv/$d/include/." "$cu11/include/"; done
    ln -sfn "$cu13/bin" "$cu11/bin"
    ln -sfn "$cu13/lib" "$cu11/lib64"
    touch "$cu11/.ready"
fi

# --- the simulator, once per (source commit, patch) ---
commit=$(git -C "$GPGPUSIM_SRC" rev-parse HEAD)
# gpgpusim-cuda13.patch: CUDA 13 programs run (the measured recipe); gpgpusim-dp4a-fma.patch:
# the simulator's dp4a was an assert(0) (q8_gemv_q8 is built on it) and its fma.f32 rounded
# twice (a*b+c), so results could not match the kernels' documented float order bit for bit.
patches=("$here/gpgpusim-cuda13.patch" "$here/gpgpusim-dp4a-fma.patch")
patch_id=$(cat "${patches[@]}" | sha256sum | cut -c1-8)
sim=$CACHE/sim-${commit:0:8}-$patch_id
if [ ! -f "$sim/.built" ]; then
    # Its Makefiles call these; without them the build stops deep in a makedepend line.
    for tool in makedepend bison flex g++; do
        command -v "$tool" > /dev/null || {
            log "$tool not found: apt-get install build-essential xutils-dev bison flex zlib1g-dev libglu1-mesa-dev"
            exit 1
        }
    done
    log "building GPGPU-Sim ${commit:0:8} into $sim (about 5 minutes on 2 cores)"
    rm -rf "$sim"
    git clone --quiet --no-checkout "$GPGPUSIM_SRC" "$sim"
    git -C "$sim" checkout --quiet "$commit"
    for p in "${patches[@]}"; do git -C "$sim" apply "$root/$p"; done
    (
        cd "$sim"
        export CUDA_INSTALL_PATH=$cu11
        set +eu
        # shellcheck disable=SC1091
        source setup_environment release > /dev/null || exit 1
        set -eu
        make -j"${JOBS:-2}" > "$sim/build.log" 2>&1 || { tail -30 "$sim/build.log"; exit 1; }
    )
    touch "$sim/.built"
fi
# The Orin-NX-shaped configuration: the RTX 3070 one, patched (8 SMs at 918 MHz, 8 x 16-bit
# channels at 1600 MHz = 102.4 GB/s, 2 MB L2, no L2-warming memcpy), and the interconnect
# sized for 8 SMs + 16 memory sub-partitions.
cfg=$OUT/config
rm -rf "$cfg" && mkdir -p "$cfg/configs/orin-nx"
cp "$sim/configs/tested-cfgs/SM86_RTX3070/"* "$cfg/configs/orin-nx/"
(cd "$cfg" && git apply "$root/$here/orin-nx-from-rtx3070.config.patch")
sed -i 's/^k = 78;/k = 24;/' "$cfg/configs/orin-nx/config_ampere_islip.icnt"
cfg=$cfg/configs/orin-nx
clock_mhz=$(awk '/^-gpgpu_clock_domains/ {split($2, c, ":"); print c[1]}' "$cfg/gpgpusim.config")
# Every launch's simulated cycles include this fixed launch latency (5000 cycles, 5.4 us):
# left out of the bandwidth, as back-to-back launches on a GPU overlap it.
launch_cycles=$(awk '/^-gpgpu_kernel_launch_latency/ {print $2}' "$cfg/gpgpusim.config")

# --- the harness, with the wrapper's launch constants read from q8.rs ---
const() {
    local v
    v=$(sed -n "s/^pub const $1: usize = \([0-9]*\);/\1/p" cuda-kernels/src/cuda/q8.rs)
    [ -n "$v" ] || { log "no $1 in cuda-kernels/src/cuda/q8.rs"; exit 1; }
    echo "$v"
}
defs=(-DGEMV_ROWS_PER_BLOCK="$(const GEMV_ROWS_PER_BLOCK)")
if grep -q "pub const GEMV_Q8_WARPS" cuda-kernels/src/cuda/q8.rs; then
    defs+=(-DGEMV_Q8_WARPS="$(const GEMV_Q8_WARPS)" -DGEMV_Q8_BLOCKS_PER_SM="$(const GEMV_Q8_BLOCKS_PER_SM)"
        -DGEMV_Q8_ROWS_PER_WARP="$(const GEMV_Q8_ROWS_PER_WARP)")
fi
if grep -q "pub const GEMV_Q8_ANY_ROWS" cuda-kernels/src/cuda/q8.rs; then
    defs+=(-DGEMV_Q8_ANY_ROWS="$(const GEMV_Q8_ANY_ROWS)" -DGEMV_Q8_XREG_K="$(const GEMV_Q8_XREG_K)"
        -DGEMV_Q8_PAIR_K="$(const GEMV_Q8_PAIR_K)")
fi
"$cu13/bin/nvcc" -O3 -arch=sm_86 -cudart shared -diag-suppress 177 "${defs[@]}" \
    -o "$OUT/harness" "$here/harness.cu"

# --- one simulation: run NAME KERNEL ARGS... -> $OUT/runs/NAME/{sim.log,result.json} ---
run_one() {
    local name=$1
    shift
    local dir=$OUT/runs/$name
    rm -rf "$dir" && mkdir -p "$dir" && cp "$cfg"/* "$dir/"
    local t0=$SECONDS rc=0
    (
        cd "$dir"
        export CUDA_INSTALL_PATH=$cu11
        set +eu
        # shellcheck disable=SC1091
        source "$sim/setup_environment" release > /dev/null || exit 1
        set -eu
        if [ "${SIM_MODE:-perf}" = func ]; then export PTX_SIM_MODE_FUNC=1; fi
        exec "$OUT/harness" "$@"
    ) > "$dir/sim.log" 2>&1 || rc=$?
    local wall=$((SECONDS - t0))
    python3 - "$dir" "$clock_mhz" "$wall" "$rc" "${launch_cycles:-0}" <<'EOF'
import json, re, sys
d, mhz, wall, rc = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
launch = int(sys.argv[5])
text = open(f"{d}/sim.log", errors="replace").read()
m = re.search(r"^HARNESS (\{.*\})$", text, re.M)
row = json.loads(m.group(1)) if m else {"check": "no result"}
# Each launch prints its own cycles; the harness's warm-up launches (the kernel writing the
# activations, as the step's previous kernel does) come first and are not timed.
skip = int(row.get("warmup_launches", 0))
per_launch = [int(c) for c in re.findall(r"^gpu_sim_cycle = (\d+)", text, re.M)][skip:]
cycles = sum(per_launch)
insn = sum(int(c) for c in re.findall(r"^gpu_sim_insn = (\d+)", text, re.M)[skip:])
launches = len(per_launch)
row.update(cycles=cycles, launch_cycles=launches * launch, thread_insn=insn, sim_wall_s=wall,
           rc=rc)
if cycles > launches * launch:
    row["seconds_with_launch"] = cycles / (mhz * 1e6)
    row["seconds"] = (cycles - launches * launch) / (mhz * 1e6)
    row["gb_per_s"] = row.get("bytes", 0) / row["seconds"] / 1e9
json.dump(row, open(f"{d}/result.json", "w"))
EOF
}

# --- the plan: (label, rows, k) per model; rows shrink to MAX_SIM_BYTES, k never does ---
smollm="wq,wo:576:576 wk,wv:192:576 gate,up:1536:576 down:576:1536"
llama="wq,wo:4096:4096 wk,wv:1024:4096 gate,up:14336:4096 down:4096:14336"
if [ "${QUICK:-0}" = 1 ]; then
    smollm="gate,up:1536:576"
    llama="wk,wv:1024:4096"
    BATCHES=${QUICK_BATCHES:-1}
fi
plan=$OUT/plan.txt
: > "$plan"
echo "copy-$COPY_BYTES copy - - - $COPY_BYTES" >> "$plan"
for model in smollm llama; do
    for s in ${!model}; do
        IFS=: read -r label rows k <<< "$s"
        rb=$((k / 32 * 34))
        sim_rows=$rows
        if ((rows * rb > MAX_SIM_BYTES)); then sim_rows=$((MAX_SIM_BYTES / rb / 64 * 64)); fi
        ((sim_rows >= MIN_SIM_ROWS)) || sim_rows=$((rows < MIN_SIM_ROWS ? rows : MIN_SIM_ROWS))
        for kern in $KERNELS; do
            for b in $BATCHES; do
                echo "$kern-$model-$label-$rows-$k-b$b $kern $model $label $rows $sim_rows $k $b" >> "$plan"
            done
        done
    done
done
log "$(wc -l < "$plan") simulations, $SIM_JOBS at a time (config $cfg, ${clock_mhz} MHz)"

export -f run_one log
export OUT cfg sim cu11 clock_mhz launch_cycles SIM_MODE
one() {
    # NAME KERNEL MODEL LABEL ROWS SIM_ROWS K BATCH  |  NAME copy - - - BYTES
    if [ "$2" = copy ]; then run_one "$1" copy "$6"; else run_one "$1" "$2" "$6" "$7" "$8"; fi
    log "done $1 ($(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('check'), r.get('sim_wall_s'), 's')" "$OUT/runs/$1/result.json"))"
}
export -f one
# The copy depends only on the simulator and the configuration: run it once, keep it.
copy_key=$(cat "$cfg/gpgpusim.config" "$cfg/config_ampere_islip.icnt" "$here/harness.cu" | sha256sum | cut -c1-8)
copy_cache=$CACHE/copy-${sim##*/}-$copy_key-$COPY_BYTES.json
copy_name=copy-$COPY_BYTES
if [ -f "$copy_cache" ]; then
    log "copy kernel: cached result $copy_cache"
    mkdir -p "$OUT/runs/$copy_name" && cp "$copy_cache" "$OUT/runs/$copy_name/result.json"
    grep -v "^$copy_name " "$plan" > "$plan.todo"
else
    cp "$plan" "$plan.todo"
fi
xargs -P "$SIM_JOBS" -L 1 bash -c 'one "$@"' _ < "$plan.todo"
if [ ! -f "$copy_cache" ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(r.get("check") != "ok" or r.get("rc") != 0)' "$OUT/runs/$copy_name/result.json"; then
    cp "$OUT/runs/$copy_name/result.json" "$copy_cache"
fi

python3 "$here/report.py" "$plan" "$OUT"
