// Q8_0 GEMM for prefill: Y[t][r] = W[r] . X[t] for many tokens, X pre-quantized by
// quantize.cu (planar: int8 quants xq[tokens * k], f32 scales xd[tokens * k/32]).
//
// W: a Q8_0 matrix in q8_layout.cu's device layout (compiled before this file).
// Y: tokens consecutive f32 vectors of rows.
//
// Per output and per 32-block b: isum = sum of the 32 int8 products (__dp4a, exact in
// int32), then acc = fma(dw * dx, (float)isum, acc), blocks in increasing order, one thread
// owning each output, every step correctly rounded (explicit _rn intrinsics). isum fits in
// 24 bits, so its conversion is exact; src/cpu/gemm.rs replays this order bit for bit.
//
// Tiling: a block of 16 x 16 threads computes Q8_GEMM_TR * 16 rows by Q8_GEMM_TT * 16
// tokens; thread (tx, ty) owns rows tx + 16i and tokens ty + 16j (tx on rows so the stores
// of a half-warp are 16 consecutive floats). The k axis is walked Q8_GEMM_KB blocks at a
// time through shared memory, rows padded by one word so the 16 rows (or tokens) a
// half-warp reads fall in 16 different banks.
//
// Launch: block = (16, 16, 1), grid = (ceil(rows / (16 * Q8_GEMM_TR)),
// ceil(tokens / (16 * Q8_GEMM_TT)), 1), no dynamic shared memory.

#ifndef Q8_GEMM_TR
#define Q8_GEMM_TR 4
#endif
#ifndef Q8_GEMM_TT
#define Q8_GEMM_TT 4
#endif
#ifndef Q8_GEMM_KB
#define Q8_GEMM_KB 4
#endif

#define Q8_GEMM_ROWS (16 * Q8_GEMM_TR)
#define Q8_GEMM_TOKS (16 * Q8_GEMM_TT)
#define Q8_GEMM_STRIDE (Q8_GEMM_KB * 8 + 1)
#define Q8_GEMM_THREADS 256

extern "C" __global__ void __launch_bounds__(Q8_GEMM_THREADS)
q8_gemm_f32(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
            const float* __restrict__ xd, float* __restrict__ y, int rows, int k, int tokens) {
    __shared__ int s_wq[Q8_GEMM_ROWS * Q8_GEMM_STRIDE];
    __shared__ int s_xq[Q8_GEMM_TOKS * Q8_GEMM_STRIDE];
    __shared__ float s_wd[Q8_GEMM_ROWS * Q8_GEMM_KB];
    __shared__ float s_xd[Q8_GEMM_TOKS * Q8_GEMM_KB];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int tid = ty * 16 + tx;
    const int r0 = blockIdx.x * Q8_GEMM_ROWS;
    const int t0 = blockIdx.y * Q8_GEMM_TOKS;
    const int nb = k >> 5;
    const q8m wm = q8m_of(w, rows, k);
    const int* xq32 = (const int*)xq;  // k % 32 == 0: every block starts 4-byte aligned

    float acc[Q8_GEMM_TR][Q8_GEMM_TT];
#pragma unroll
    for (int i = 0; i < Q8_GEMM_TR; ++i)
#pragma unroll
        for (int j = 0; j < Q8_GEMM_TT; ++j) acc[i][j] = 0.0f;

    for (int kb0 = 0; kb0 < nb; kb0 += Q8_GEMM_KB) {
        const int kbn = nb - kb0 < Q8_GEMM_KB ? nb - kb0 : Q8_GEMM_KB;

        // Weight quants: item = (row, block, word); consecutive threads walk one row's
        // blocks, a warp Q8_GEMM_KB blocks of a row (their halves 16 bytes apart).
        for (int item = tid; item < Q8_GEMM_ROWS * Q8_GEMM_KB * 8; item += Q8_GEMM_THREADS) {
            const int word = item & 7;
            const int kb = (item >> 3) % Q8_GEMM_KB;
            const int rt = (item >> 3) / Q8_GEMM_KB;
            int v = 0;
            if (r0 + rt < rows && kb < kbn) {
                v = *(const int*)(wm.q + (long long)(r0 + rt) * k +
                                  q8m_qoff(kb0 + kb, 4 * word, nb));
            }
            s_wq[rt * Q8_GEMM_STRIDE + kb * 8 + word] = v;
        }
        for (int item = tid; item < Q8_GEMM_ROWS * Q8_GEMM_KB; item += Q8_GEMM_THREADS) {
            const int kb = item % Q8_GEMM_KB;
            const int rt = item / Q8_GEMM_KB;
            float dv = 0.0f;
            if (r0 + rt < rows && kb < kbn) {
                dv = q8m_scale(wm, r0 + rt, nb, kb0 + kb);
            }
            s_wd[rt * Q8_GEMM_KB + kb] = dv;
        }
        // Activation quants and scales.
        for (int item = tid; item < Q8_GEMM_TOKS * Q8_GEMM_KB * 8; item += Q8_GEMM_THREADS) {
            const int word = item & 7;
            const int kb = (item >> 3) % Q8_GEMM_KB;
            const int tt = (item >> 3) / Q8_GEMM_KB;
            int v = 0;
            if (t0 + tt < tokens && kb < kbn) {
                v = xq32[(long long)(t0 + tt) * (k >> 2) + (kb0 + kb) * 8 + word];
            }
            s_xq[tt * Q8_GEMM_STRIDE + kb * 8 + word] = v;
        }
        for (int item = tid; item < Q8_GEMM_TOKS * Q8_GEMM_KB; item += Q8_GEMM_THREADS) {
            const int kb = item % Q8_GEMM_KB;
            const int tt = item / Q8_GEMM_KB;
            float dv = 0.0f;
            if (t0 + tt < tokens && kb < kbn) dv = xd[(long long)(t0 + tt) * nb + kb0 + kb];
            s_xd[tt * Q8_GEMM_KB + kb] = dv;
        }
        __syncthreads();

        // Only the kbn real blocks: padding would add +0 and could turn a -0 into +0.
        for (int kb = 0; kb < kbn; ++kb) {
            int wv[Q8_GEMM_TR][8];
            float wd[Q8_GEMM_TR];
#pragma unroll
            for (int i = 0; i < Q8_GEMM_TR; ++i) {
                const int rt = tx + 16 * i;
#pragma unroll
                for (int u = 0; u < 8; ++u) wv[i][u] = s_wq[rt * Q8_GEMM_STRIDE + kb * 8 + u];
                wd[i] = s_wd[rt * Q8_GEMM_KB + kb];
            }
#pragma unroll
            for (int j = 0; j < Q8_GEMM_TT; ++j) {
                const int tt = ty + 16 * j;
                int xv[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) xv[u] = s_xq[tt * Q8_GEMM_STRIDE + kb * 8 + u];
                const float dx = s_xd[tt * Q8_GEMM_KB + kb];
#pragma unroll
                for (int i = 0; i < Q8_GEMM_TR; ++i) {
                    int isum = 0;
#pragma unroll
                    for (int u = 0; u < 8; ++u) isum = __dp4a(wv[i][u], xv[u], isum);
                    acc[i][j] = __fmaf_rn(__fmul_rn(wd[i], dx), __int2float_rn(isum), acc[i][j]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int j = 0; j < Q8_GEMM_TT; ++j) {
        const int t = t0 + ty + 16 * j;
#pragma unroll
        for (int i = 0; i < Q8_GEMM_TR; ++i) {
            const int r = r0 + tx + 16 * i;
            if (r < rows && t < tokens) y[(long long)t * rows + r] = acc[i][j];
        }
    }
}
