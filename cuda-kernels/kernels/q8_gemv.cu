// Q8_0 GEMVs for decode, one read of the weights serving every column (1..=8 tokens):
//   q8_gemv_f32: y = W x on f32 activations (the f32 mode's matvec);
//   q8_gemv_q8:  y = W x on int8 activations (quantize.cu's planar quants and scales), with
//                an optional bias and an optional in-place residual add in its epilogue.
//
// W: a Q8_0 matrix in the device layout of q8_layout.cu (compiled before this file): per
// row its quants, unit by unit of 32 blocks, first halves then second halves; the f16
// scales after all the quants.
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
// blocks (one unit of the row) and the butterfly is five shuffles; a CPU twin gets 8
// consecutive partials from 8 consecutive blocks in the lanes of one AVX2 vector.
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
// q8_gemv_q8 launch: block = 32 * Q8_GEMV_Q8_WARPS threads, any grid: each warp takes two
// rows (one column, k <= 1024), a row (one column, k <= 4096) or Q8_ANY_ROWS rows at a time
// (gemv_q8_rows_per_warp in q8.rs) and the warps walk the rows with
// a grid stride (the wrapper sizes the grid from the SM count and the rows, every warp as
// many rows). xq must be 16-byte aligned (k
// is a multiple of 32, so every block then is), xd, bias and y 4-byte. No shared memory.

#ifndef Q8_GEMV_ROWS_PER_BLOCK
#define Q8_GEMV_ROWS_PER_BLOCK 4
#endif

#ifndef Q8_GEMV_Q8_WARPS
#define Q8_GEMV_Q8_WARPS 4
#endif

#define Q8_GEMV_MAX_COLS 8

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

    const q8m wm = q8m_of(w, rows, k);
    const unsigned char* wrow = wm.q + (long long)row * k;
    for (int b = g; b < nb; b += 4) {
        const float d = q8m_scale(wm, row, nb, b);
        // Quants 4s..4s+3: one aligned 32-bit word.
        const unsigned int u = *(const unsigned int*)(wrow + q8m_qoff(b, 4 * s, nb));
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

struct alignas(16) q8_u4 {
    unsigned int a, b, c, d;
};

// A 16-byte load that skips L1 (p is 16-byte aligned and inside the weights): each weight
// byte is read once.
static __device__ __forceinline__ q8_u4 q8_ld16(const unsigned char* p) {
    q8_u4 r;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.a), "=r"(r.b), "=r"(r.c), "=r"(r.d) : "l"(p));
    return r;
}

// ---- q8_gemv_q8 memory access (tuned on GPGPU-Sim, docs/native-and-cuda.md) ----
// Lane l takes block l of each unit of a row: its quants' two 16-byte words (each load of
// the warp covers 512 contiguous bytes) and its scale, straight into registers. The next
// unit's (or row's) loads are issued before the current one is computed, so every warp
// keeps a unit or more in flight. One column with k <= 4096 (a decode step of one token):
// the lane's activations (its blocks of each unit, at most 4) stay in registers for all of
// the warp's rows. Otherwise two rows a warp share each read of a unit's activations,
// staged in shared memory when they fit, else from global.
// 5 blocks an SM (GEMV_Q8_BLOCKS_PER_SM in q8.rs): at most 96 registers a thread.
#ifndef Q8_GEMV_Q8_MIN_BLOCKS
#define Q8_GEMV_Q8_MIN_BLOCKS 5
#endif

// Block 32u + lane of row r (lane < m, the unit's blocks): quants and scale.
static __device__ __forceinline__ void q8_fetch(q8m w, long long r, int k, int nb, int u, int m,
                                                int lane, q8_u4& a, q8_u4& b,
                                                unsigned short& s) {
    const unsigned char* p = w.q + r * k + 1024 * u + 16 * lane;
    a = q8_ld16(p);
    b = q8_ld16(p + 16 * m);
    s = w.s[r * nb + 32 * u + lane];
}

// A block's 32 products: quants a, b against activation words x0, x1.
static __device__ __forceinline__ int q8_dot(const q8_u4& a, const q8_u4& b, const q8_i4& x0,
                                             const q8_i4& x1) {
    int isum = __dp4a((int)a.a, x0.a, 0);
    isum = __dp4a((int)a.b, x0.b, isum);
    isum = __dp4a((int)a.c, x0.c, isum);
    isum = __dp4a((int)a.d, x0.d, isum);
    isum = __dp4a((int)b.a, x1.a, isum);
    isum = __dp4a((int)b.b, x1.b, isum);
    isum = __dp4a((int)b.c, x1.c, isum);
    return __dp4a((int)b.d, x1.d, isum);
}

// The butterfly and the epilogue of one (row, column): lane 0 writes.
static __device__ __forceinline__ void q8_finish(float v, const float* __restrict__ bias,
                                                 float* out, long long r, int accumulate) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) {
        if (bias) v = __fadd_rn(v, bias[r]);
        *out = accumulate ? __fadd_rn(*out, v) : v;
    }
}

static __device__ __forceinline__ int q8_unit_blocks(int nb, int u) {
    return nb - 32 * u < 32 ? nb - 32 * u : 32;
}

// Block b's activations (one column) for a lane's registers: its 32 quants and its scale,
// or zeros where the row has no such block (`have` false).
struct q8_xblock {
    q8_i4 x0, x1;
    float d;
};
static __device__ __forceinline__ q8_xblock q8_load_x(const signed char* __restrict__ xq,
                                                      const float* __restrict__ xd, int b,
                                                      bool have) {
    q8_xblock r = {{0, 0, 0, 0}, {0, 0, 0, 0}, 0.0f};
    if (have) {
        const q8_i4* p = (const q8_i4*)(xq + 32 * b);
        r.x0 = p[0];
        r.x1 = p[1];
        r.d = xd[b];
    }
    return r;
}

// The butterfly's last four steps (within a half warp) and the epilogue of one (row,
// column): lane 0 of each half writes its row, if it has one.
static __device__ __forceinline__ void q8_finish_half(float v, const float* __restrict__ bias,
                                                      float* y, long long r, long long rows,
                                                      int accumulate) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 15) == 0 && r < rows) {
        if (bias) v = __fadd_rn(v, bias[r]);
        y[r] = accumulate ? __fadd_rn(y[r], v) : v;
    }
}

// One column, k <= 1024 (a single unit of nb <= 32 blocks, so a row fills at most 32
// lanes and often only 18): two rows side by side, a half warp each, so that a warp keeps
// two rows' loads in flight and fills its lanes. Lane j of a half owns partials j and
// j + 16 (blocks j and j + 16 where they exist) and adds the two itself, which is the
// butterfly's first step (v_j + v_(j xor 16)); the other four stay within the half: the
// float order is q8_gemv_q8's, bit for bit. Warp g takes rows 2g, 2g + 1, then
// 2(g + groups), ...; the next pair's loads go out as soon as this pair's are computed.
static __device__ __forceinline__ void q8_gemv_q8_x1h(q8m w, const signed char* __restrict__ xq,
                                                      const float* __restrict__ xd,
                                                      const float* __restrict__ bias, float* y,
                                                      int rows, int k, int accumulate, int group,
                                                      int groups) {
    const int lane = threadIdx.x & 31;
    const int j = lane & 15, h = lane >> 4;
    const int nb = k >> 5;
    q8_i4 x0[2], x1[2];
    float xs[2];
    q8_u4 wa[2], wb[2];
    unsigned short ws[2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        const q8_xblock xb = q8_load_x(xq, xd, j + 16 * t, j + 16 * t < nb);
        x0[t] = xb.x0;
        x1[t] = xb.x1;
        xs[t] = xb.d;
        wa[t] = {0, 0, 0, 0};
        wb[t] = wa[t];
        ws[t] = 0;
    }
    const long long step = 2LL * groups;
    long long base = 2LL * group;  // the warp's pair: rows base, base + 1
    if (base + h < rows) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
            if (j + 16 * t < nb) q8_fetch(w, base + h, k, nb, 0, nb, j + 16 * t, wa[t], wb[t], ws[t]);
    }
    // Whole warps loop and leave together (base is the warp's): full-mask shuffles.
    while (base < rows) {
        const long long r = base + h, rn = r + step;
        float acc[2];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const int b = j + 16 * t;
            acc[t] = 0.0f;
            if (b < nb) {
                const int isum = q8_dot(wa[t], wb[t], x0[t], x1[t]);
                acc[t] = __fmaf_rn(__fmul_rn(q8_f16_to_f32(ws[t]), xs[t]), __int2float_rn(isum),
                                   acc[t]);
                if (rn < rows) q8_fetch(w, rn, k, nb, 0, nb, b, wa[t], wb[t], ws[t]);
            }
        }
        q8_finish_half(__fadd_rn(acc[0], acc[1]), bias, y, r, rows, accumulate);
        base += step;
    }
}

// One column, NU units a row (k <= 1024 NU): the activations in registers. The loads of
// unit u of the next row go out as soon as unit u of this one is computed.
template <int NU>
static __device__ __forceinline__ void q8_gemv_q8_x1(q8m w, const signed char* __restrict__ xq,
                                                     const float* __restrict__ xd,
                                                     const float* __restrict__ bias, float* y,
                                                     int rows, int k, int accumulate,
                                                     int group, int groups) {
    const int lane = threadIdx.x & 31;
    const int nb = k >> 5;
    q8_i4 x0[NU], x1[NU];
    float xs[NU];
    q8_u4 wa[NU], wb[NU];
    unsigned short ws[NU];
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        const q8_xblock xb = q8_load_x(xq, xd, 32 * u + lane, lane < q8_unit_blocks(nb, u));
        x0[u] = xb.x0;
        x1[u] = xb.x1;
        xs[u] = xb.d;
        wa[u] = {0, 0, 0, 0};
        wb[u] = wa[u];
        ws[u] = 0;
    }
    long long r = group;
    if (r < rows) {
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            const int m = q8_unit_blocks(nb, u);
            if (lane < m) q8_fetch(w, r, k, nb, u, m, lane, wa[u], wb[u], ws[u]);
        }
    }
    // The rows are the warp's, so whole warps loop and leave together: full-mask shuffles.
    while (r < rows) {
        const long long rn = r + groups;
        float acc = 0.0f;
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            const int m = q8_unit_blocks(nb, u);
            if (lane < m) {
                const int isum = q8_dot(wa[u], wb[u], x0[u], x1[u]);
                acc = __fmaf_rn(__fmul_rn(q8_f16_to_f32(ws[u]), xs[u]), __int2float_rn(isum), acc);
                if (rn < rows) q8_fetch(w, rn, k, nb, u, m, lane, wa[u], wb[u], ws[u]);
            }
        }
        q8_finish(acc, bias, y + r, r, accumulate);
        r = rn;
    }
}

// Activation bytes (ncols * k) a block stages in shared memory for q8_gemv_q8_any; more
// are read from global (through L1).
#ifndef Q8_XS_BYTES
#define Q8_XS_BYTES 16384
#endif

// Rows a warp takes side by side in q8_gemv_q8_any (GEMV_Q8_ANY_ROWS in q8.rs): each
// activation read serves them all.
#ifndef Q8_ANY_ROWS
#define Q8_ANY_ROWS 2
#endif

// A unit of Q8_ANY_ROWS rows for one lane, fetched ahead: quants, scales, and which rows
// and unit.
struct q8_unit_regs {
    q8_u4 a[Q8_ANY_ROWS], b[Q8_ANY_ROWS];
    unsigned short s[Q8_ANY_ROWS];
    long long row0;
    int u;
};

// Any columns and k: warp g takes rows R*g .. R*g+R-1 (R = Q8_ANY_ROWS), then
// R*(g + groups) .., a unit of all R rows at a time, the next unit's loads in flight
// while one is computed (two in flight measured the same, at one row a warp). The
// activations come from xs / xds (XST: staged by q8_gemv_q8_rows, a unit's block l at
// words l and m + l, so the lanes' 16-byte reads are conflict-free) or from global, read
// once for the R rows.
template <bool XST>
static __device__ __forceinline__ void q8_gemv_q8_any(
    q8m w, const signed char* __restrict__ xq, const float* __restrict__ xd,
    const float* __restrict__ bias, float* y, int rows, int k, int ncols, int accumulate,
    int group, int groups, long long ystride, const q8_i4* xs, const float* xds) {
    const int lane = threadIdx.x & 31;
    const int nb = k >> 5;
    const int nunits = (nb + 31) >> 5;
    long long row0 = (long long)group * Q8_ANY_ROWS;  // the next unit to fetch
    int u = 0;
    q8_unit_regs next;
#pragma unroll
    for (int d = 0; d < Q8_ANY_ROWS; ++d) {
        next.a[d] = {0, 0, 0, 0};
        next.b[d] = next.a[d];
        next.s[d] = 0;
    }
    // Fetch the next unit into S (S.row0 >= rows: none left).
#define Q8_FETCH_INTO(S)                                                               \
    do {                                                                               \
        (S).row0 = row0;                                                               \
        (S).u = u;                                                                     \
        if (row0 < rows) {                                                             \
            const int m_ = q8_unit_blocks(nb, u);                                      \
            _Pragma("unroll") for (int d = 0; d < Q8_ANY_ROWS; ++d) {                  \
                if (row0 + d < rows && lane < m_)                                      \
                    q8_fetch(w, row0 + d, k, nb, u, m_, lane, (S).a[d], (S).b[d],      \
                             (S).s[d]);                                                \
            }                                                                          \
            if (++u == nunits) {                                                       \
                u = 0;                                                                 \
                row0 += (long long)groups * Q8_ANY_ROWS;                               \
            }                                                                          \
        }                                                                              \
    } while (0)
    float acc[Q8_ANY_ROWS][Q8_GEMV_MAX_COLS];
#pragma unroll
    for (int d = 0; d < Q8_ANY_ROWS; ++d)
#pragma unroll
        for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) acc[d][c] = 0.0f;
    auto consume = [&](const q8_unit_regs& cur) {
        const int cu = cur.u;
        const int blk = 32 * cu + lane;
        const int m = q8_unit_blocks(nb, cu);
        if (lane < m) {
            float dw[Q8_ANY_ROWS];
#pragma unroll
            for (int d = 0; d < Q8_ANY_ROWS; ++d) dw[d] = q8_f16_to_f32(cur.s[d]);
#pragma unroll
            for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) {
                if (c < ncols) {
                    q8_i4 x0, x1;
                    float dx;
                    if (XST) {
                        const q8_i4* xu = xs + c * (k >> 4) + 64 * cu + lane;
                        x0 = xu[0];
                        x1 = xu[m];
                        dx = xds[c * nb + blk];
                    } else {
                        const q8_i4* xp = (const q8_i4*)(xq + (long long)c * k + 32 * blk);
                        x0 = xp[0];
                        x1 = xp[1];
                        dx = xd[(long long)c * nb + blk];
                    }
#pragma unroll
                    for (int d = 0; d < Q8_ANY_ROWS; ++d) {
                        const int isum = q8_dot(cur.a[d], cur.b[d], x0, x1);
                        acc[d][c] =
                            __fmaf_rn(__fmul_rn(dw[d], dx), __int2float_rn(isum), acc[d][c]);
                    }
                }
            }
        }
        if (cu == nunits - 1) {
#pragma unroll
            for (int d = 0; d < Q8_ANY_ROWS; ++d) {
                const long long r = cur.row0 + d;
#pragma unroll
                for (int c = 0; c < Q8_GEMV_MAX_COLS; ++c) {
                    if (c < ncols && r < rows)  // warp-uniform: full-mask shuffles
                        q8_finish(acc[d][c], bias, y + c * ystride + r, r, accumulate);
                    acc[d][c] = 0.0f;
                }
            }
        }
    };
    Q8_FETCH_INTO(next);
    // The rows are the warp's, so whole warps loop and leave together.
    while (next.row0 < rows) {
        const q8_unit_regs cur = next;
        Q8_FETCH_INTO(next);
        consume(cur);
    }
#undef Q8_FETCH_INTO
}

// q8_gemv_q8's body as a device function, so fused kernels (layer.cu) run the same matvec
// between a prologue and an epilogue of their own: warp `group` of `groups` takes rows
// group, group + groups, ... of the `rows` rows of w (one column, k <= 4096; pairs of
// rows from 2 * group on when k <= 1024), or
// Q8_ANY_ROWS at a time from Q8_ANY_ROWS * group on (otherwise); column c of the result is
// y[c * ystride + row]. Every thread of the block calls it (the activations' staging has
// block barriers), with at most Q8_GEMV_Q8_WARPS warps.
// y must not be __restrict__: with accumulate, each element is read and then written by
// the same thread (the residual add in place).
static __device__ __forceinline__ void q8_gemv_q8_rows(
    q8m w, const signed char* __restrict__ xq, const float* __restrict__ xd,
    const float* __restrict__ bias, float* y, int rows, int k, int ncols, int accumulate,
    int group, int groups, long long ystride) {
    if (ncols == 1) {
        switch (((k >> 5) + 31) >> 5) {
            case 1:
                return q8_gemv_q8_x1h(w, xq, xd, bias, y, rows, k, accumulate, group, groups);
            case 2:
                return q8_gemv_q8_x1<2>(w, xq, xd, bias, y, rows, k, accumulate, group, groups);
            case 3:
                return q8_gemv_q8_x1<3>(w, xq, xd, bias, y, rows, k, accumulate, group, groups);
            case 4:
                return q8_gemv_q8_x1<4>(w, xq, xd, bias, y, rows, k, accumulate, group, groups);
            default:
                break;
        }
    }
    __shared__ q8_i4 xs[Q8_XS_BYTES / 16];
    __shared__ float xds[Q8_XS_BYTES / 32];
    if (ncols * k > Q8_XS_BYTES) {
        q8_gemv_q8_any<false>(w, xq, xd, bias, y, rows, k, ncols, accumulate, group, groups,
                              ystride, xs, xds);
        return;
    }
    // Column c's unit u (m blocks, 2m words) at words c*k/16 + 64u: block l's at l, m + l.
    const int nb = k >> 5, kw = k >> 4;
    __syncthreads();  // a previous call of this block may still read xs
    for (int i = threadIdx.x; i < ncols * kw; i += blockDim.x) {
        const int c = i / kw, wi = i - c * kw, uu = wi >> 6, r = wi & 63;
        xs[c * kw + 64 * uu + (r & 1) * q8_unit_blocks(nb, uu) + (r >> 1)] =
            ((const q8_i4*)(xq + (long long)c * k))[wi];
    }
    for (int i = threadIdx.x; i < ncols * nb; i += blockDim.x) xds[i] = xd[i];
    __syncthreads();
    q8_gemv_q8_any<true>(w, xq, xd, bias, y, rows, k, ncols, accumulate, group, groups, ystride,
                         xs, xds);
}

extern "C" __global__ void __launch_bounds__(32 * Q8_GEMV_Q8_WARPS, Q8_GEMV_Q8_MIN_BLOCKS)
q8_gemv_q8(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
           const float* __restrict__ xd, const float* __restrict__ bias, float* y, int rows,
           int k, int ncols, int accumulate) {
    q8_gemv_q8_rows(q8m_of(w, rows, k), xq, xd, bias, y, rows, k, ncols, accumulate,
                    blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5),
                    gridDim.x * (blockDim.x >> 5), rows);
}
