// RMSNorm, one block per row: y = x / sqrt(mean(x^2) + eps) * w.
// Twin: src/cpu/rmsnorm.rs. Header-free (NVRTC with no options); every float step is an
// explicit correctly rounded operation (fmaf, __f*_rn), so the default -fmad=true cannot
// fuse anything differently from the twin.
//
// Reduction order (mirrored by the twin): thread t sums fmaf(x[i], x[i], acc) for
// i = t, t + blockDim.x, ...; each warp sums its lanes with an xor butterfly (16..1); then
// every warp sums the warp totals, padded with zeros to 32 lanes, the same way.
// The launch uses blockDim.x = the twin's THREADS (256), at most RMSNORM_THREADS.

#ifndef RMSNORM_THREADS
#define RMSNORM_THREADS 256
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Every thread returns the block's sum; sh holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // a previous reduction may still read sh
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
    return warp_sum(v);
}

// x, y: [rows][n] (y may be x: each thread rewrites only what it read); w: [n].
extern "C" __global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_f32(const float* x, const float* __restrict__ w, float* y, int n, float eps) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    x += row * n;
    y += row * n;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc = fmaf(x[i], x[i], acc);
    const float ss = block_sum(acc, sh);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fmul_rn(__fmul_rn(x[i], inv), w[i]);
}
