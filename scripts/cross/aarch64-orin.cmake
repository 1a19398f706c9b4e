# CMake toolchain for llama.cpp inside llama-cpp-sys-2, cross-compiled for the Jetson Orin
# family (Cortex-A78AE cores: ARMv8.2-A with the dot-product and FP16 arithmetic extensions).
# scripts/cross-build.sh passes it as CMAKE_TOOLCHAIN_FILE_aarch64_unknown_linux_gnu, which
# the cmake crate reads for this target only (host build scripts are untouched).

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# llama-cpp-sys-2 0.1.161 puts -DGGML_CPU_ARM_ARCH=armv8-a on the command line for every
# non-native aarch64 Linux build, after (and so over) any GGML_CPU_ARM_ARCH from the
# environment. The toolchain file runs inside project(), after the -D cache entries are
# set, so a FORCEd cache entry here is the one ggml-cpu sees. armv8-a would leave out the
# SDOT/UDOT int8 dot products that the quantized matmuls use on Orin.
set(INFERLOOP_ARM_ARCH "armv8.2-a+dotprod+fp16" CACHE STRING "ggml-cpu -march for Orin")
set(GGML_CPU_ARM_ARCH "${INFERLOOP_ARM_ARCH}" CACHE STRING "ggml-cpu -march (forced for Orin)" FORCE)
