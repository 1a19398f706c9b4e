// Fused kernels for the forward pass's decode step: each is existing kernels' arithmetic in
// one launch, operation for operation and in the same order, so its twin is the composition
// of their twins (src/cpu/fused.rs). Header-free (NVRTC with no options); every float step is
// an explicit correctly rounded operation, as in the files the text comes from.
//
// rmsnorm_quantize_f32: rmsnorm.cu's rmsnorm_f32, then quantize.cu's quantize_q8_f32 of the
//   normalized row. One block per output row m, blockDim.x = 256 (the rmsnorm twin's
//   THREADS): the sum of squares in rmsnorm_f32's order; then thread t takes elements t,
//   t + 256, ..., so warp w holds the whole Q8 block of elements 256j + 32w .. +31 (n is a
//   multiple of 32) and quantizes it with quantize_q8_f32's math. Row m reads input row
//   rows[m] (rows null: row m), so the wanted rows of a pass are gathered in the same launch.
// rope_store_f32: rope.cu's rotation of token t's q heads and k heads, in place in its fused
//   q|k|v row (n_head + 2 n_head_kv heads), then elementwise.cu's kv_store_f16 of its k and v
//   into cell cells[t] of the K and V caches. grid = n_tok, blockDim.x = ROPE_THREADS (64).
// attn_step_f16: attention.cu's attn_partial_f16 for each chunk of token t's sequence in
//   order, then attn_combine_f32 over them, in one block per (q head, token): grid (n_head,
//   n_tok), blockDim.x = ATTN_THREADS (128). The grid does not depend on any length: token t
//   attends positions 0 ..= pos[t] of the sequence whose position 0 is cell cells[t] - pos[t],
//   read on the device. Then warp w quantizes dims 32w .. 32w+31 of the head (one Q8 block:
//   head_dim is a multiple of 32) with quantize_q8_f32's math.
// silu_mul_quantize_f32: elementwise.cu's silu_mul_f32 on the fused gate|up rows ([n_tok]
//   [2 n_ff]: gate then up), then quantize_q8_f32; one warp per Q8 block, 8 per block of 256.

#ifndef RMSNORM_THREADS
#define RMSNORM_THREADS 256
#endif
#ifndef ROPE_THREADS
#define ROPE_THREADS 64
#endif
#ifndef ATTN_CHUNK
#define ATTN_CHUNK 256
#endif
#ifndef ATTN_THREADS
#define ATTN_THREADS 128
#endif

#define NEG_INF __int_as_float((int)0xff800000u)

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// e^x as in softmax.cu (the twin is cpu::vector::expf).
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

// quantize_q8_f32 for one Q8 block held by a whole warp, lane i holding element i: quants
// into q[0..32], the f16-rounded scale into *d.
__device__ __forceinline__ void quantize_warp(float v, signed char* q, float* d) {
    const int lane = threadIdx.x & 31;
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = __fdiv_rn(amax, 127.0f);
    const float id = scale != 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
    q[lane] = (signed char)(int)roundf(__fmul_rn(v, id));
    if (lane == 0) {
        unsigned short h;
        float r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(scale));
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
        *d = r;
    }
}

// x: [*][n]; q: [rows][n] int8, d: [rows][n / 32]; w: [n].
extern "C" __global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_quantize_f32(const float* __restrict__ x, const int* __restrict__ rows,
                     const float* __restrict__ w, signed char* __restrict__ q,
                     float* __restrict__ d, int n, float eps) {
    __shared__ float sh[32];
    const size_t m = blockIdx.x;
    const size_t row = rows ? (size_t)rows[m] : m;
    x += row * n;
    q += m * n;
    d += m * (size_t)(n >> 5);
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc = fmaf(x[i], x[i], acc);
    const float ss = block_sum(acc, sh);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
    // i < n holds for a whole warp or none of it (n and blockDim.x are multiples of 32).
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float y = __fmul_rn(__fmul_rn(x[i], inv), w[i]);
        quantize_warp(y, q + (i & ~31), d + (i >> 5));
    }
}

__device__ __forceinline__ double powi(double b, int e) {
    double p = 1.0;
    while (e > 0) {
        if (e & 1) p = __dmul_rn(p, b);
        b = __dmul_rn(b, b);
        e >>= 1;
    }
    return p;
}

// rope.cu's rope_sincos, the same text.
__device__ __forceinline__ void rope_sincos(double a, float* s_out, float* c_out) {
    const double k = rint(__dmul_rn(a, 0.6366197723675814));
    double r = fma(-k, 1.5707963267341256, a);
    r = fma(-k, 6.077100506303966e-11, r);
    r = fma(-k, 2.0222662487111665e-21, r);
    const double r2 = __dmul_rn(r, r);
    double sp = -7.647163731819816e-13;
    sp = fma(sp, r2, 1.6059043836821613e-10);
    sp = fma(sp, r2, -2.505210838544172e-08);
    sp = fma(sp, r2, 2.7557319223985893e-06);
    sp = fma(sp, r2, -0.0001984126984126984);
    sp = fma(sp, r2, 0.008333333333333333);
    sp = fma(sp, r2, -0.16666666666666666);
    const double sn = fma(__dmul_rn(r, r2), sp, r);
    double cp = 4.779477332387385e-14;
    cp = fma(cp, r2, -1.1470745597729725e-11);
    cp = fma(cp, r2, 2.08767569878681e-09);
    cp = fma(cp, r2, -2.755731922398589e-07);
    cp = fma(cp, r2, 2.48015873015873e-05);
    cp = fma(cp, r2, -0.001388888888888889);
    cp = fma(cp, r2, 0.041666666666666664);
    cp = fma(cp, r2, -0.5);
    const double cs = fma(cp, r2, 1.0);
    const long long q = (long long)k & 3;
    const double s = q == 0 ? sn : q == 1 ? cs : q == 2 ? -sn : -cs;
    const double c = q == 0 ? cs : q == 1 ? -sn : q == 2 ? -cs : sn;
    *s_out = __double2float_rn(s);
    *c_out = __double2float_rn(c);
}

// qkv: [n_tok][(n_head + 2 n_head_kv) * head_dim]; kc, vc: n_cells cells of
// n_head_kv * head_dim f16 values. A cell outside the caches is not written.
extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
rope_store_f32(float* qkv, const int* __restrict__ pos, const int* __restrict__ cells,
               unsigned short* __restrict__ kc, unsigned short* __restrict__ vc, int n_head,
               int n_head_kv, int head_dim, int rot_dims, double freq_scale, int neox,
               int n_cells) {
    const int qd = n_head * head_dim, kvd = n_head_kv * head_dim;
    float* x = qkv + (size_t)blockIdx.x * (qd + 2 * kvd);
    const int half = rot_dims >> 1;
    const double p = (double)pos[blockIdx.x];
    // The q heads and the k heads lie one after the other: rotate them as one row of heads.
    const int heads = n_head + n_head_kv;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        rope_sincos(__dmul_rn(p, powi(freq_scale, i)), &s, &c);
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        for (int h = 0; h < heads; ++h) {
            float* v = x + (size_t)h * head_dim;
            const float x0 = v[i0], x1 = v[i1];
            v[i0] = fmaf(x0, c, -__fmul_rn(x1, s));
            v[i1] = fmaf(x0, s, __fmul_rn(x1, c));
        }
    }
    __syncthreads();  // every rotated k value is written before any is stored
    const int cell = cells[blockIdx.x];
    if (cell < 0 || cell >= n_cells) return;
    const size_t dst = (size_t)cell * kvd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        kc[dst + i] = f2h(x[qd + i]);
        vc[dst + i] = f2h(x[qd + kvd + i]);
    }
}

// qkv as above (q read only); k, v: one layer's caches of n_cells cells; part (workspace):
// [n_tok][n_head][max_chunks][2 + head_dim]; out: [n_tok][n_head * head_dim] f32, and its
// quantization oq (int8, same layout) and od ([n_tok][n_head * head_dim / 32]).
// attn_step_f16's block (h, t) as a device function (layer.cu's qkv kernel runs it in its
// epilogue): any block of at least head_dim threads, a multiple of 32; out may be null.
// qkv, k and v are not __restrict__: layer.cu's kernel writes them earlier in the launch.
static __device__ __forceinline__ void attn_head_token(
    int h, int t, const float* qkv, const unsigned short* k, const unsigned short* v,
    const int* __restrict__ pos, const int* __restrict__ cells, float* __restrict__ part,
    float* __restrict__ out, signed char* __restrict__ oq, float* __restrict__ od, int n_head,
    int n_head_kv, int head_dim, int n_ctx, int n_cells, int max_chunks, int chunk,
    float scale) {
    __shared__ float sc[ATTN_CHUNK];
    __shared__ float sh[32];
    if (chunk > ATTN_CHUNK) return;  // the wrapper refuses this; never overrun sc
    const int qd = n_head * head_dim, kvd = n_head_kv * head_dim;
    const int p_t = pos[t];
    const int cell0 = cells[t] - p_t;
    int n_kv = p_t + 1 < n_ctx ? p_t + 1 : n_ctx;
    // Lengths live on the device: one that would read outside the caches attends nothing.
    if (p_t < 0 || cell0 < 0 || cell0 > n_cells - n_kv) n_kv = 0;
    int nc = (n_kv + chunk - 1) / chunk;
    if (nc > max_chunks) nc = max_chunks;
    const int hk = h / (n_head / n_head_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int nj = head_dim >> 5;
    const size_t pos_stride = (size_t)kvd;
    const size_t base = (size_t)cell0 * kvd + (size_t)hk * head_dim;
    const size_t stride = (size_t)(head_dim + 2);
    float* pb = part + ((size_t)t * n_head + h) * max_chunks * stride;

    const float* q = qkv + (size_t)t * (qd + 2 * kvd) + (size_t)h * head_dim;
    float qr[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) qr[j] = j < nj ? q[j * 32 + lane] : 0.0f;

    for (int c = 0; c < nc; ++c) {
        // attn_partial_f16's block (h, c, t).
        __syncthreads();  // the previous chunk is done with sc
        const int start = c * chunk;
        const int len = n_kv - start < chunk ? n_kv - start : chunk;
        for (int p = warp; p < len; p += nwarps) {
            const unsigned short* kp = k + base + (size_t)(start + p) * pos_stride;
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (j < nj) acc = fmaf(qr[j], h2f(kp[j * 32 + lane]), acc);
            acc = warp_sum(acc);
            if (lane == 0) sc[p] = __fmul_rn(acc, scale);
        }
        __syncthreads();
        float m = NEG_INF;
        for (int p = threadIdx.x; p < len; p += blockDim.x) m = fmaxf(m, sc[p]);
        m = block_max(m, sh);
        float l = 0.0f;
        for (int p = threadIdx.x; p < len; p += blockDim.x) {
            const float e = il_expf(__fsub_rn(sc[p], m));
            sc[p] = e;
            l = __fadd_rn(l, e);
        }
        l = block_sum(l, sh);
        __syncthreads();  // every e_p is in sc
        float* po = pb + c * stride;
        const unsigned short* vb = v + base + (size_t)start * pos_stride;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float acc = 0.0f;
            for (int p = 0; p < len; ++p)
                acc = fmaf(sc[p], h2f(vb[(size_t)p * pos_stride + d]), acc);
            po[2 + d] = acc;
        }
        if (threadIdx.x == 0) {
            po[0] = m;
            po[1] = l;
        }
    }
    __syncthreads();  // every chunk's (m, l, o) is in part

    // attn_combine_f32's thread d (head_dim <= ATTN_THREADS: one dim per thread).
    const int d = threadIdx.x;
    float r = 0.0f;
    if (d < head_dim && nc > 0) {
        float mx = NEG_INF;
        for (int c = 0; c < nc; ++c) mx = fmaxf(mx, pb[c * stride]);
        float l = 0.0f, o = 0.0f;
        for (int c = 0; c < nc; ++c) {
            const float wc = il_expf(__fsub_rn(pb[c * stride], mx));
            l = fmaf(pb[c * stride + 1], wc, l);
            o = fmaf(pb[c * stride + 2 + d], wc, o);
        }
        r = __fdiv_rn(o, l);
    }
    const size_t at = (size_t)t * qd + (size_t)h * head_dim;
    if (out && d < head_dim) out[at + d] = r;
    // Whole warps only (head_dim is a multiple of 32): warp w's dims are one Q8 block.
    if (warp * 32 < head_dim) quantize_warp(r, oq + at + warp * 32, od + (at >> 5) + warp);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attn_step_f16(const float* __restrict__ qkv, const unsigned short* __restrict__ k,
              const unsigned short* __restrict__ v, const int* __restrict__ pos,
              const int* __restrict__ cells, float* __restrict__ part, float* __restrict__ out,
              signed char* __restrict__ oq, float* __restrict__ od, int n_head, int n_head_kv,
              int head_dim, int n_ctx, int n_cells, int max_chunks, int chunk, float scale) {
    attn_head_token(blockIdx.x, blockIdx.y, qkv, k, v, pos, cells, part, out, oq, od, n_head,
                    n_head_kv, head_dim, n_ctx, n_cells, max_chunks, chunk, scale);
}

// gu: [n_tok][2 n_ff] (gate, then up); q, d: the [n_tok][n_ff] product quantized.
extern "C" __global__ void __launch_bounds__(256)
silu_mul_quantize_f32(const float* __restrict__ gu, signed char* __restrict__ q,
                      float* __restrict__ d, int n_ff, int nblocks) {
    const int lane = threadIdx.x & 31;
    const long long blk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk >= nblocks) return;  // whole warps only: shuffles stay full-mask
    const long long i = blk * 32 + lane;
    const long long t = i / n_ff, j = i % n_ff;
    const float g = gu[t * 2 * n_ff + j];
    const float u = gu[t * 2 * n_ff + n_ff + j];
    const float e = il_expf(-fabsf(g));
    const float den = __fadd_rn(1.0f, e);
    const float sig = g >= 0.0f ? __fdiv_rn(1.0f, den) : __fdiv_rn(e, den);
    quantize_warp(__fmul_rn(__fmul_rn(g, sig), u), q + blk * 32, d + blk);
}
