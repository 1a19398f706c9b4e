// Elementwise ops, one thread per element (grid-stride). Twin: src/cpu/elementwise.rs.
// Header-free (NVRTC with no options); each result is a fixed sequence of correctly rounded
// operations, so the twin's scalar loop gives the same bits.
//
// silu_mul_f32: out = silu(gate) * up, silu(g) = g * sigmoid(g) with
//   e = il_expf(-|g|), sigmoid = g >= 0 ? 1 / (1 + e) : e / (1 + e)   (never overflows).
// add_f32: out = a + b (out may be a or b: the residual add in place).
// Launch: blockDim.x = EW_THREADS (256), grid = ceil(n / 256).

#ifndef EW_THREADS
#define EW_THREADS 256
#endif

// e^x as in softmax.cu (same text in every file that needs it; the twin is cpu::vector::expf).
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

extern "C" __global__ void __launch_bounds__(EW_THREADS)
silu_mul_f32(const float* gate, const float* up, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float e = il_expf(-fabsf(g));
        const float d = __fadd_rn(1.0f, e);
        const float sig = g >= 0.0f ? __fdiv_rn(1.0f, d) : __fdiv_rn(e, d);
        out[i] = __fmul_rn(__fmul_rn(g, sig), up[i]);
    }
}

extern "C" __global__ void __launch_bounds__(EW_THREADS)
add_f32(const float* a, const float* b, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = __fadd_rn(a[i], b[i]);
}

// kv_store_f16: the KV cache write. Token t's `width` values go, rounded to f16 (nearest
// even, `cvt.rn`), into cell cells[t] of a cache of n_cells cells of `width` values:
// cache[cells[t] * width + i] = f16(x[t * width + i]). A cell outside the cache is skipped
// (the host computes cells; the twin refuses them). Launch: blockDim.x = EW_THREADS,
// grid = (ceil(width / EW_THREADS), tokens).
extern "C" __global__ void __launch_bounds__(EW_THREADS)
kv_store_f16(const float* x, const int* cells, unsigned short* cache, int width, int n_cells) {
    const int t = blockIdx.y;
    const int cell = cells[t];
    if (cell < 0 || cell >= n_cells) return;
    const long long dst = (long long)cell * width;
    const long long src = (long long)t * width;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x[src + i]));
        cache[dst + i] = h;
    }
}
