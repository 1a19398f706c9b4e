// The decode layer in four launches (steps of 1..=8 tokens). Compiled as one program after
// q8_layout.cu, q8_gemv.cu and fused.cu (kernels.rs joins the four texts), whose device
// functions it calls: each kernel is q8_gemv_q8's matvec with a prologue or epilogue made of existing
// kernels' arithmetic, operation for operation, so its twin is the composition of their
// twins and no float order changes (src/cpu/fused.rs, `layer_*`).
//
// A kernel whose epilogue needs every block's result (a norm over a whole row, attention
// over every head of a group) finishes it in the block that finishes last: each block makes
// its writes visible (__threadfence), then takes a ticket from a counter (atomicAdd); the
// block that draws the last ticket resets the counter for the next launch and runs the
// epilogue alone. Which block that is does not change any value: the epilogue's arithmetic
// and order are fixed. No block waits for another, so no grid-wide barrier is needed.
//
// layer_qkv: block b owns head b of the joined q|k|v rows (n_head q heads, n_head_kv k
//   heads, n_head_kv v heads; head_dim rows each): q8_gemv_q8 (bias in its epilogue), then
//   rope_store_f32's rotation of its head if a q or k head and its f16 store into the
//   caches if a k or v head. The heads of kv group g (q heads g*G .. g*G+G-1, G = n_head /
//   n_head_kv; k head g; v head g) share counter g; the group's last block runs
//   attn_step_f16's block (h, t) for its q heads h and every token t: the attention reads
//   only the group's kv head. grid = n_head + 2 n_head_kv, block = 32 * Q8_GEMV_Q8_WARPS
//   (at least head_dim threads).
// layer_residual_norm: x += W a (q8_gemv_q8 with accumulate, grid-stride over the rows);
//   then, when nw is given, the last block runs rmsnorm_quantize_f32 on rows sel[m] (sel
//   null: row m) of the new x, for m < n_out. Its sum of squares replays rmsnorm_f32's
//   RMSNORM_THREADS threads, whatever the block size (rms_inv below).
// layer_gate_up: block b owns gate rows 32b .. 32b+31 and the up rows n_ff + 32b ..: two
//   q8_gemv_q8 calls, then silu_mul_quantize_f32 of its 32 outputs per token (one Q8 block).
//   grid = n_ff / 32.

// The ticket: true in every thread of the block that finished last. Every thread's writes
// before it are visible to that block's reads after it.
static __device__ __forceinline__ bool layer_last_block(int* counter, int blocks) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const int ticket = atomicAdd(counter, 1);
        __threadfence();
        last = ticket == blocks - 1;
        if (last) *counter = 0;  // no other block of this launch touches it again
    }
    __syncthreads();
    return last != 0;
}

// rmsnorm_f32's 1 / rms of the n values at x, in its order for RMSNORM_THREADS threads:
// thread t of this block (blockDim.x a multiple of 32 dividing RMSNORM_THREADS) plays the
// kernel's threads t, t + blockDim.x, ..., and block_sum's warps in the same pairs.
static __device__ __forceinline__ float rms_inv(const float* x, int n, float eps) {
    __shared__ float sh[RMSNORM_THREADS / 32];
    const int lane = threadIdx.x & 31;
    __syncthreads();  // a previous row may still read sh
    for (int vt = threadIdx.x; vt < RMSNORM_THREADS; vt += blockDim.x) {
        float acc = 0.0f;
        for (int i = vt; i < n; i += RMSNORM_THREADS) acc = fmaf(x[i], x[i], acc);
        acc = warp_sum(acc);
        if (lane == 0) sh[vt >> 5] = acc;
    }
    __syncthreads();
    const float ss = warp_sum(lane < RMSNORM_THREADS / 32 ? sh[lane] : 0.0f);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
}

// k, v: one layer's caches; part, oq, od: attn_step_f16's; counters: n_head_kv of them.
extern "C" __global__ void __launch_bounds__(32 * Q8_GEMV_Q8_WARPS)
layer_qkv(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
          const float* __restrict__ xd, const float* __restrict__ bias, float* qkv, int k,
          int ncols, const int* __restrict__ pos, const int* __restrict__ cells,
          unsigned short* kc, unsigned short* vc, int n_head, int n_head_kv, int head_dim,
          int rot_dims, double freq_scale, int neox, int n_cells, int n_ctx, int max_chunks,
          int chunk, float scale, float* __restrict__ part, signed char* __restrict__ oq,
          float* __restrict__ od, int* counters) {
    const int b = blockIdx.x;
    const int qd = n_head * head_dim, kvd = n_head_kv * head_dim, width = qd + 2 * kvd;
    const long long r0 = (long long)b * head_dim;
    q8_gemv_q8_rows(q8m_from(q8m_of(w, width, k), r0, k), xq, xd, bias ? bias + r0 : bias,
                    qkv + r0, head_dim, k, ncols, 0, threadIdx.x >> 5, blockDim.x >> 5, width);
    __syncthreads();  // the head's values, written by lane 0 of each warp, are in qkv
    const int gq = n_head / n_head_kv;
    // The kv group of head b.
    const int g = b < n_head ? b / gq : b < n_head + n_head_kv ? b - n_head : b - n_head - n_head_kv;
    if (b < n_head + n_head_kv) {
        const int half = rot_dims >> 1;
        for (int t = 0; t < ncols; ++t) {
            float* x = qkv + (size_t)t * width + r0;
            const double p = (double)pos[t];
            for (int i = threadIdx.x; i < half; i += blockDim.x) {
                float s, c;
                rope_sincos(__dmul_rn(p, powi(freq_scale, i)), &s, &c);
                const int i0 = neox ? i : 2 * i;
                const int i1 = neox ? i + half : 2 * i + 1;
                const float x0 = x[i0], x1 = x[i1];
                x[i0] = fmaf(x0, c, -__fmul_rn(x1, s));
                x[i1] = fmaf(x0, s, __fmul_rn(x1, c));
            }
        }
        __syncthreads();  // every rotated value is written before any is stored
    }
    if (b >= n_head) {
        unsigned short* cache = b < n_head + n_head_kv ? kc : vc;
        for (int t = 0; t < ncols; ++t) {
            const int cell = cells[t];
            if (cell < 0 || cell >= n_cells) continue;
            const float* x = qkv + (size_t)t * width + r0;
            unsigned short* dst = cache + (size_t)cell * kvd + (size_t)g * head_dim;
            for (int i = threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = f2h(x[i]);
        }
    }
    if (!layer_last_block(counters + g, gq + 2)) return;
    for (int t = 0; t < ncols; ++t)
        for (int h = g * gq; h < (g + 1) * gq; ++h)
            attn_head_token(h, t, qkv, kc, vc, pos, cells, part, nullptr, oq, od, n_head,
                            n_head_kv, head_dim, n_ctx, n_cells, max_chunks, chunk, scale);
}

// x: [ncols][rows], the residual (rows = n_embd); nw: [rows] or null; sel: [n_out] or null;
// q, d: [n_out][rows] and its scales.
extern "C" __global__ void __launch_bounds__(32 * Q8_GEMV_Q8_WARPS)
layer_residual_norm(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
                    const float* __restrict__ xd, float* x, int rows, int k, int ncols,
                    const float* __restrict__ nw, float eps, const int* __restrict__ sel,
                    int n_out, signed char* __restrict__ q, float* __restrict__ d,
                    int* counter) {
    const int warps = blockDim.x >> 5;
    q8_gemv_q8_rows(q8m_of(w, rows, k), xq, xd, nullptr, x, rows, k, ncols, 1,
                    blockIdx.x * warps + (threadIdx.x >> 5), gridDim.x * warps, rows);
    if (!nw) return;
    if (!layer_last_block(counter, gridDim.x)) return;
    for (int m = 0; m < n_out; ++m) {
        const float* xr = x + (size_t)(sel ? sel[m] : m) * rows;
        const float inv = rms_inv(xr, rows, eps);
        // i < rows holds for a whole warp or none of it (rows is a multiple of 32).
        for (int i = threadIdx.x; i < rows; i += blockDim.x) {
            const float y = __fmul_rn(__fmul_rn(xr[i], inv), nw[i]);
            quantize_warp(y, q + (size_t)m * rows + (i & ~31),
                          d + (size_t)m * (rows >> 5) + (i >> 5));
        }
    }
}

// gu: [ncols][2 n_ff] (gate, then up); q, d: the [ncols][n_ff] product quantized.
extern "C" __global__ void __launch_bounds__(32 * Q8_GEMV_Q8_WARPS)
layer_gate_up(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
              const float* __restrict__ xd, float* gu, int n_ff, int k, int ncols,
              signed char* __restrict__ q, float* __restrict__ d) {
    const q8m wm = q8m_of(w, 2LL * n_ff, k);
    const long long r0 = (long long)blockIdx.x * 32;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    for (int part = 0; part < 2; ++part) {
        const long long r = r0 + (long long)part * n_ff;
        q8_gemv_q8_rows(q8m_from(wm, r, k), xq, xd, nullptr, gu + r, 32, k, ncols, 0, warp, warps,
                        2LL * n_ff);
    }
    __syncthreads();  // the block's gate and up values are in gu
    for (int t = warp; t < ncols; t += warps) {
        const float g = gu[(size_t)t * 2 * n_ff + r0 + lane];
        const float u = gu[(size_t)t * 2 * n_ff + n_ff + r0 + lane];
        const float e = il_expf(-fabsf(g));
        const float den = __fadd_rn(1.0f, e);
        const float sig = g >= 0.0f ? __fdiv_rn(1.0f, den) : __fdiv_rn(e, den);
        const size_t blk = (size_t)t * (n_ff >> 5) + blockIdx.x;
        quantize_warp(__fmul_rn(__fmul_rn(g, sig), u), q + blk * 32, d + blk);
    }
}
