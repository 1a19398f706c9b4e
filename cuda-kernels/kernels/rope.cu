// Rotary position embedding, in place on x: [n_tok][n_head][head_dim] f32, token t at
// position pos[t]. Pair i < rot_dims/2 turns by pos * base^(-2i/rot_dims):
// rope_norm_f32 rotates (2i, 2i+1) (llama), rope_neox_f32 rotates (i, i + rot_dims/2)
// (NeoX, qwen2); dims from rot_dims on are left alone. Twin: src/cpu/rope.rs.
//
// Header-free (NVRTC with no options). The angle and its sine and cosine are computed in
// double with explicit fma/__dmul_rn only, never sin/cos/pow (whose results differ between
// CUDA and the CPU's libm), so the twin gets the same bits:
//   inv_freq = freq_scale^i by binary powering, freq_scale = base^(-2/rot_dims) from the host;
//   a = pos * inv_freq; k = rint(a * 2/pi); r = a - k*pi/2 in three fused steps;
//   sin r, cos r by Taylor series to r^15 / r^16 (|r| <= pi/4: below 1e-16), rounded to f32.
// Then x0' = fma(x0, c, -(x1*s)), x1' = fma(x0, s, x1*c).
// Launch: grid = n_tok, blockDim.x <= ROPE_THREADS (64); thread j takes pairs j, j + 64, ...
// and applies each to every head.

#ifndef ROPE_THREADS
#define ROPE_THREADS 64
#endif

__device__ __forceinline__ double powi(double b, int e) {
    double p = 1.0;
    while (e > 0) {
        if (e & 1) p = __dmul_rn(p, b);
        b = __dmul_rn(b, b);
        e >>= 1;
    }
    return p;
}

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

__device__ __forceinline__ void rope_impl(float* x, const int* pos, int n_head, int head_dim,
                                          int rot_dims, double freq_scale, bool neox) {
    const int half = rot_dims >> 1;
    x += (size_t)blockIdx.x * n_head * head_dim;
    const double p = (double)pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        rope_sincos(__dmul_rn(p, powi(freq_scale, i)), &s, &c);
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        for (int h = 0; h < n_head; ++h) {
            float* v = x + (size_t)h * head_dim;
            const float x0 = v[i0], x1 = v[i1];
            v[i0] = fmaf(x0, c, -__fmul_rn(x1, s));
            v[i1] = fmaf(x0, s, __fmul_rn(x1, c));
        }
    }
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
rope_norm_f32(float* x, const int* pos, int n_head, int head_dim, int rot_dims, double freq_scale) {
    rope_impl(x, pos, n_head, head_dim, rot_dims, freq_scale, false);
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
rope_neox_f32(float* x, const int* pos, int n_head, int head_dim, int rot_dims, double freq_scale) {
    rope_impl(x, pos, n_head, head_dim, rot_dims, freq_scale, true);
}
