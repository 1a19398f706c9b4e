// Q8_0 GEMV for decode: y[c][r] = sum_k W[r][k] * x[c][k] for ncols (1..=8) right-hand
// columns, one read of the weights serving every column.
//
// W: ggml Q8_0 rows as they lie in the GGUF file (rows * k/32 blocks of 34 bytes: f16
// scale LE, 32 int8), only 2-byte aligned, so it is read with 16-bit loads.
// x: ncols consecutive f32 vectors of k (16-byte aligned: k is a multiple of 32).
// y: ncols consecutive f32 vectors of rows.
//
// One warp per row. Lane l = 8*g + s: group g (0..3) takes blocks g, g+4, g+8, ...; within
// a block, sub-lane s takes quants 4s..4s+3. Per block and column the lane forms
//   p = q0*x0; p = fma(q1,x1,p); p = fma(q2,x2,p); p = fma(q3,x3,p); acc = fma(d,p,acc)
// with explicit _rn intrinsics (no contraction choices left to the compiler), then the warp
// reduces with a butterfly (xor 16, 8, 4, 2, 1). src/cpu/gemv.rs replays exactly this order,
// so the two agree bit for bit.
//
// Launch: block = 32 * Q8_GEMV_ROWS_PER_BLOCK threads (the kernel reads rows per block from
// blockDim.x, the macro only bounds it), grid = ceil(rows / rows per block).

#ifndef Q8_GEMV_ROWS_PER_BLOCK
#define Q8_GEMV_ROWS_PER_BLOCK 4
#endif

#define Q8_GEMV_MAX_COLS 8
#define Q8_BLOCK_BYTES 34

// No headers: f16 -> f32 through PTX (exact for every f16, subnormals included).
static __device__ __forceinline__ float q8_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

struct alignas(16) q8_f4 {
    float a, b, c, d;
};

extern "C" __global__ void __launch_bounds__(32 * Q8_GEMV_ROWS_PER_BLOCK)
q8_gemv_f32(const unsigned char* __restrict__ w, const float* __restrict__ x,
            float* __restrict__ y, int rows, int k, int ncols) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // the whole warp leaves together: shuffles stay full-mask
    const int g = lane >> 3;
    const int s = lane & 7;
    const int nb = k >> 5;

    float acc[Q8_GEMV_MAX_COLS];
#pragma unroll
    for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) acc[c] = 0.0f;

    const unsigned char* wrow = w + (long long)row * nb * Q8_BLOCK_BYTES;
    for (int b = g; b < nb; b += 4) {
        const unsigned short* blk = (const unsigned short*)(wrow + b * Q8_BLOCK_BYTES);
        const float d = q8_f16_to_f32(blk[0]);
        // Quants 4s..4s+3 sit at byte 2 + 4s: two aligned 16-bit loads.
        const unsigned int u = (unsigned int)blk[1 + 2 * s] | ((unsigned int)blk[2 + 2 * s] << 16);
        const float q0 = (float)((int)(u << 24) >> 24);
        const float q1 = (float)((int)(u << 16) >> 24);
        const float q2 = (float)((int)(u << 8) >> 24);
        const float q3 = (float)((int)u >> 24);
        const q8_f4* xb = (const q8_f4*)(x + b * 32 + 4 * s);
#pragma unroll
        for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) {
            if (c < ncols) {
                const q8_f4 xv = *(const q8_f4*)((const float*)xb + (long long)c * k);
                float p = __fmul_rn(q0, xv.a);
                p = __fmaf_rn(q1, xv.b, p);
                p = __fmaf_rn(q2, xv.c, p);
                p = __fmaf_rn(q3, xv.d, p);
                acc[c] = __fmaf_rn(d, p, acc[c]);
            }
        }
    }

#pragma unroll
    for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) {
        if (c < ncols) {
            float v = acc[c];
            // Butterfly: every lane ends with the same sum (IEEE addition commutes).
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
            if (lane == 0) y[(long long)c * rows + row] = v;
        }
    }
}
