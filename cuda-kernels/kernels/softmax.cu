// Row softmax, one block per row: y = exp(x - max) / sum. Twin: src/cpu/softmax.rs.
// Header-free (NVRTC with no options). exp is il_expf below, not the CUDA expf, so that the
// twin can compute the same bits; every float step is explicitly rounded (no fmad fusion).
//
// Order (mirrored by the twin): the max is exact in any order; thread t then computes
// e = il_expf(x[i] - max) for i = t, t + blockDim.x, ..., stores it in y[i] and adds it to
// its partial; the block sums the partials as rmsnorm.cu does (warp xor butterfly, then the
// warp totals padded to 32 lanes); y[i] = e / sum. blockDim.x = the twin's THREADS (256).

#ifndef SOFTMAX_THREADS
#define SOFTMAX_THREADS 256
#endif

#define NEG_INF __int_as_float((int)0xff800000u)

// e^x: k = rint(x log2 e), r = x - k ln2 (two fused steps), degree-7 Taylor in Horner form,
// times 2^k from its bits; 0 below -87, inputs clamped at 88. Same as cpu::vector::expf.
__device__ __forceinline__ float il_expf(float x) {
    if (x < -87.0f) return 0.0f;
    x = fminf(x, 88.0f);
    const float k = rintf(__fmul_rn(x, 1.442695f));
    float r = fmaf(-k, 0.69314575f, x);
    r = fmaf(-k, 1.4286068e-6f, r);
    float p = 0.0001984127f;
    p = fmaf(p, r, 0.0013888889f);
    p = fmaf(p, r, 0.008333334f);
    p = fmaf(p, r, 0.041666668f);
    p = fmaf(p, r, 0.16666667f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return __fmul_rn(p, __int_as_float(((int)k + 127) << 23));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
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

__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : NEG_INF;
    return warp_max(v);
}

// x, y: [rows][n]; y may be x (each thread rewrites only what it read).
extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS)
softmax_f32(const float* x, float* y, int n) {
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    x += row * n;
    y += row * n;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, x[i]);
    m = block_max(m, sh);
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = il_expf(__fsub_rn(x[i], m));
        y[i] = e;
        acc = __fadd_rn(acc, e);
    }
    const float s = block_sum(acc, sh);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fdiv_rn(y[i], s);
}
