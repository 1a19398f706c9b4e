// Decode attention: one query token per sequence over an f16 KV cache, split along the
// sequence (split-K). Twin: src/cpu/attention.rs. Header-free (NVRTC with no options);
// every float step is explicitly rounded, exp is il_expf, so the twin gets the same bits.
//
// Layouts (f16 stored as u16 bits; one layer's cache, the caller offsets to the layer):
//   q:   [n_seq][n_head][head_dim] f32
//   k,v: [n_seq][n_ctx][n_head_kv][head_dim] f16; sequence s attends to positions
//        0 .. kv_len[s] (its own token already written at kv_len[s] - 1; causal decode)
//   out: [n_seq][n_head][head_dim] f32
//   part (workspace): [n_seq][n_head][max_chunks][2 + head_dim] f32 = (max, sum, o[])
// Grouped-query: q head h reads kv head h / (n_head / n_head_kv). head_dim is a multiple of
// 32 up to 128. scale is 1/sqrt(head_dim), passed in.
//
// attn_partial_f16: grid (n_head, max_chunks, n_seq), blockDim.x = ATTN_THREADS (128).
// Block (h, c, s) takes positions [c*chunk, min((c+1)*chunk, kv_len[s])), chunk <= ATTN_CHUNK:
//   score p: lane l sums fmaf(q[l+32j], k[l+32j], acc) for j = 0.. in order; xor butterfly;
//            times scale. Warp w takes positions w, w + nwarps, ...
//   m = max of scores; e_p = il_expf(score_p - m); thread t sums e_p for p = t, t+128, ...,
//   block sum (warp butterflies, then warp totals padded to 32 lanes) = l;
//   o[d] = sum over p in order of fmaf(e_p, v_p[d], o[d]), thread d.
// attn_combine_f32: grid (n_head, n_seq), blockDim.x = ATTN_THREADS. Thread d:
//   M = max m_c; w_c = il_expf(m_c - M); L = fmaf(l_c, w_c, L), O = fmaf(o_c[d], w_c, O)
//   over c in order; out[d] = O / L (0 when kv_len is 0).

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

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attn_partial_f16(const float* __restrict__ q, const unsigned short* __restrict__ k,
                 const unsigned short* __restrict__ v, const int* __restrict__ kv_len,
                 float* __restrict__ part, int n_head, int n_head_kv, int head_dim, int n_ctx,
                 int max_chunks, int chunk, float scale) {
    __shared__ float sc[ATTN_CHUNK];
    __shared__ float sh[32];
    if (chunk > ATTN_CHUNK) return;  // the wrapper refuses this; never overrun sc
    const int h = blockIdx.x, c = blockIdx.y, s = blockIdx.z;
    const int n_kv = kv_len[s] < n_ctx ? kv_len[s] : n_ctx;
    const int start = c * chunk;
    if (start >= n_kv) return;
    const int len = n_kv - start < chunk ? n_kv - start : chunk;
    const int hk = h / (n_head / n_head_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int nj = head_dim >> 5;
    const size_t pos_stride = (size_t)n_head_kv * head_dim;
    const size_t base = (size_t)s * n_ctx * pos_stride + (size_t)hk * head_dim;

    q += ((size_t)s * n_head + h) * head_dim;
    float qr[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) qr[j] = j < nj ? q[j * 32 + lane] : 0.0f;

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

    float* out = part + (((size_t)s * n_head + h) * max_chunks + c) * (size_t)(head_dim + 2);
    const unsigned short* vb = v + base + (size_t)start * pos_stride;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < len; ++p) acc = fmaf(sc[p], h2f(vb[(size_t)p * pos_stride + d]), acc);
        out[2 + d] = acc;
    }
    if (threadIdx.x == 0) {
        out[0] = m;
        out[1] = l;
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attn_combine_f32(const float* __restrict__ part, const int* __restrict__ kv_len,
                 float* __restrict__ out, int n_head, int head_dim, int n_ctx, int max_chunks,
                 int chunk) {
    const int h = blockIdx.x, s = blockIdx.y;
    const int n_kv = kv_len[s] < n_ctx ? kv_len[s] : n_ctx;
    int nc = (n_kv + chunk - 1) / chunk;
    if (nc > max_chunks) nc = max_chunks;
    const size_t stride = (size_t)(head_dim + 2);
    const float* pb = part + ((size_t)s * n_head + h) * max_chunks * stride;
    out += ((size_t)s * n_head + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        if (nc <= 0) {
            out[d] = 0.0f;
            continue;
        }
        float mx = NEG_INF;
        for (int c = 0; c < nc; ++c) mx = fmaxf(mx, pb[c * stride]);
        float l = 0.0f, o = 0.0f;
        for (int c = 0; c < nc; ++c) {
            const float w = il_expf(__fsub_rn(pb[c * stride], mx));
            l = fmaf(pb[c * stride + 1], w, l);
            o = fmaf(pb[c * stride + 2 + d], w, o);
        }
        out[d] = __fdiv_rn(o, l);
    }
}
