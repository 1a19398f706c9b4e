#!/usr/bin/env bash
# Compile check of every CUDA kernel without a GPU: NVIDIA's NVRTC and ptxas from PyPI
# (pinned to 12.6: NVRTC 12.9 writes PTX 8.8, which ptxas 12.6 and JetPack 6's CUDA 12.2/12.6
# drivers reject) into a venv, then `kernels-check` compiles each kernel through the crate's
# own NVRTC path for sm_87 (Orin) and sm_90 (H200), runs `ptxas -v`, fails on an error or a
# register spill, and writes out/kernels/kernels.md (the table in docs/native-and-cuda.md) and kernels.json.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${CUDA_VENV:-.venv-cuda}
CUDA_WHEELS=("nvidia-cuda-nvrtc-cu12==12.6.85" "nvidia-cuda-nvcc-cu12==12.6.85")

if [ ! -f "$VENV/.installed-12.6.85" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${CUDA_WHEELS[@]}"
    touch "$VENV/.installed-12.6.85"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nvrtc_lib="$site/nvidia/cuda_nvrtc/lib"
ptxas="$site/nvidia/cuda_nvcc/bin/ptxas"
[ -f "$nvrtc_lib/libnvrtc.so.12" ] || { echo "kernels-check: no libnvrtc.so.12 under $nvrtc_lib" >&2; exit 1; }
[ -x "$ptxas" ] || { echo "kernels-check: no ptxas at $ptxas" >&2; exit 1; }

cargo build --release --locked -p inferloop-kernels --bin kernels-check
# cudarc opens libnvrtc by its bare name: the wheel's directory goes on the search path.
LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    target/release/kernels-check --ptxas "$ptxas" --out out/kernels "$@"
