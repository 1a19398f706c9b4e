// Q8_0 GEMVs for decode, one read of the weights serving every column (1..=8 tokens):
//   q8_gemv_f32: y = W x on f32 activations (the f32 mode's matvec);
//   q8_gemv_q8:  y = W x on int8 activations (quantize.cu's planar quants and scales), with
//                an optional bias and an optional in-place residual add in its epilogue.
//
// W: ggml Q8_0 rows as they lie in the GGUF file (rows * k/32 blocks of 34 bytes: f16
// scale LE, 32 int8), only 2-byte aligned, so it is read with 16-bit loads.
//
// ---- q8_gemv_q8: the float order (fixed; src/cpu/gemv_q8.rs replays it bit for bit) ----
// Per (row r, column c) there are 32 partial sums, partial l owning the blocks
// b = l, l+32, l+64, ... (k/32 blocks in all), taken in increasing b:
//   isum_b = sum of the block's 32 int8 x int8 products    (int32 via __dp4a: exact, any order)
//   acc_l  = fma(dw_b * dx_b, (float)isum_b, acc_l)         (acc_l starts at +0)
// where dw_b is the weight block's f16 scale, dx_b = xd[c * k/32 + b]; every step is one
// correctly rounded IEEE operation (explicit _rn intrinsics; |isum| < 2^24, so the
// conversion is exact). Then the partials are summed by an xor butterfly,
//   v_l = v_l + v_(l xor o)   for o = 16, 8, 4, 2, 1,
// and v_0 is the dot product. Epilogue, in this order:
//   t = dot;  if bias: t = t + bias[r];  if accumulate: y = y + t  else  y = t.
// Why this order: partial l is lane l of one warp, so the 32 lanes read 32 consecutive
// blocks (one 1088-byte stretch of the row) and the butterfly is five shuffles; a CPU twin
// gets 8 consecutive partials from 8 consecutive blocks in the lanes of one AVX2 vector.
// A launch shape may hold the partials differently (e.g. several short rows per warp, a
// lane keeping partials l and l+16 and doing the o = 16 step as a local add), as long as
// each partial's sequence and the butterfly's pairs stay these.
//
// ---- q8_gemv_f32 ----
// x: ncols consecutive f32 vectors of k (16-byte aligned: k is a multiple of 32).
// y: ncols consecutive f32 vectors of rows.
// One warp per row. Lane l = 8*g + s: group g (0..3) takes blocks g, g+4, g+8, ...; within
// a block, sub-lane s takes quants 4s..4s+3. Per block and column the lane forms
//   p = q0*x0; p = fma(q1,x1,p); p = fma(q2,x2,p); p = fma(q3,x3,p); acc = fma(d,p,acc)
// with explicit _rn intrinsics (no contraction choices left to the compiler), then the warp
// reduces with a butterfly (xor 16, 8, 4, 2, 1). src/cpu/gemv.rs replays exactly this order,
// so the two agree bit for bit.
//
// Launch: block = 32 * Q8_GEMV_ROWS_PER_BLOCK threads (the kernel reads rows per block from
// blockDim.x, the macro only bounds it), grid = ceil(rows / rows per block).
//
// q8_gemv_q8 launch: block = 32 * Q8_GEMV_Q8_WARPS threads, any grid: warps walk the
// rows with a grid stride (the wrapper sizes the grid from the SM count). xq must be
// 16-byte aligned (k is a multiple of 32, so every block then is), xd, bias and y 4-byte.

#ifndef Q8_GEMV_ROWS_PER_BLOCK
#define Q8_GEMV_ROWS_PER_BLOCK 4
#endif

#ifndef Q8_GEMV_Q8_WARPS
#define Q8_GEMV_Q8_WARPS 4
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

struct alignas(16) q8_i4 {
    int a, b, c, d;
};

// y must not be __restrict__: with accumulate, each element is read and then written by
// the same thread (the residual add in place).
extern "C" __global__ void __launch_bounds__(32 * Q8_GEMV_Q8_WARPS)
q8_gemv_q8(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
           const float* __restrict__ xd, const float* __restrict__ bias, float* y, int rows,
           int k, int ncols, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int warps = gridDim.x * (blockDim.x >> 5);
    const int nb = k >> 5;
    const long long row_bytes = (long long)nb * Q8_BLOCK_BYTES;
    // The row is the warp's, so whole warps loop and leave together: full-mask shuffles.
    for (int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows;
         row += warps) {
        float acc[Q8_GEMV_MAX_COLS];
#pragma unroll
        for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) acc[c] = 0.0f;

        const unsigned char* wrow = w + row * row_bytes;
        for (int b = lane; b < nb; b += 32) {
            const unsigned short* blk = (const unsigned short*)(wrow + b * Q8_BLOCK_BYTES);
            const float dw = q8_f16_to_f32(blk[0]);
            int wq[8];
#pragma unroll
            for (int u = 0; u < 8; ++u)
                wq[u] = (int)((unsigned int)blk[1 + 2 * u] | ((unsigned int)blk[2 + 2 * u] << 16));
#pragma unroll
            for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) {
                if (c < ncols) {
                    const q8_i4* xb = (const q8_i4*)(xq + (long long)c * k + b * 32);
                    const q8_i4 x0 = xb[0];
                    const q8_i4 x1 = xb[1];
                    int isum = __dp4a(wq[0], x0.a, 0);
                    isum = __dp4a(wq[1], x0.b, isum);
                    isum = __dp4a(wq[2], x0.c, isum);
                    isum = __dp4a(wq[3], x0.d, isum);
                    isum = __dp4a(wq[4], x1.a, isum);
                    isum = __dp4a(wq[5], x1.b, isum);
                    isum = __dp4a(wq[6], x1.c, isum);
                    isum = __dp4a(wq[7], x1.d, isum);
                    const float dx = xd[(long long)c * nb + b];
                    acc[c] = __fmaf_rn(__fmul_rn(dw, dx), __int2float_rn(isum), acc[c]);
                }
            }
        }

#pragma unroll
        for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) {
            if (c < ncols) {
                float v = acc[c];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
                if (lane == 0) {
                    float* out = y + (long long)c * rows + row;
                    if (bias) v = __fadd_rn(v, bias[row]);
                    *out = accumulate ? __fadd_rn(*out, v) : v;
                }
            }
        }
    }
}
