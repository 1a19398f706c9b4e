#!/usr/bin/env bash
# The kernels that ship, built and checked without a GPU. NVIDIA's NVRTC and ptxas from
# PyPI, pinned to CUDA 12.2 (JetPack 6.0, the oldest driver supported: a driver JIT-compiles
# PTX only up to its own ISA, 8.2 here; NVRTC 12.6 writes 8.5 and 12.9 writes 8.8), into a
# venv; then `kernels-check` compiles each kernel through the crate's own NVRTC path
# (--fmad=false), assembles SASS cubins for sm_87 (Orin) and sm_90 (H200) with ptxas -v,
# writes PTX for compute_75 at ISA 8.2, and fails on an error, a register spill, another PTX
# version or contraction. Output: out/kernels/{sm_87,sm_90}/*.cubin, out/kernels/ptx/*.ptx
# (what `make device-bundle` and the image install as the daemon's kernels directory),
# out/kernels/kernels.md (the table in docs/native-and-cuda.md) and kernels.json.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${CUDA_VENV:-.venv-cuda}
CUDA_VERSION=12.2.140
CUDA_WHEELS=("nvidia-cuda-nvrtc-cu12==$CUDA_VERSION" "nvidia-cuda-nvcc-cu12==$CUDA_VERSION")

if [ ! -f "$VENV/.installed-$CUDA_VERSION" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${CUDA_WHEELS[@]}"
    touch "$VENV/.installed-$CUDA_VERSION"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nvrtc_lib="$site/nvidia/cuda_nvrtc/lib"
ptxas="$site/nvidia/cuda_nvcc/bin/ptxas"
[ -f "$nvrtc_lib/libnvrtc.so.12" ] || { echo "kernels-check: no libnvrtc.so.12 under $nvrtc_lib" >&2; exit 1; }
[ -x "$ptxas" ] || { echo "kernels-check: no ptxas at $ptxas" >&2; exit 1; }

# --workspace, never -p: `make build`'s artifacts are reused (ARCHITECTURE.md, the rules).
cargo build --release --locked --workspace --bin kernels-check
rm -rf out/kernels/sm_* out/kernels/ptx out/kernels/build
# The crate opens libnvrtc by its versioned names: the wheel's directory goes on the path.
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    target/release/kernels-check --ptxas "$ptxas" --ptx-isa 8.2 --out out/kernels "$@"
# The NVRTC tests (every source for the shipped targets) with that NVRTC loaded.
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --release --locked --workspace --test ops -- nvrtc
