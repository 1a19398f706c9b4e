// The device layout of a Q8_0 matrix: made once at upload from the GGUF's 34-byte blocks
// (src/q8.rs, to_device_layout), the same size, read by every kernel that takes weights.
// No kernels here: the programs that read weights are compiled after this file.
//
//   quants: rows * k bytes, row r at r * k. A row's unit u (blocks 32u .. 32u + m - 1,
//           m = min(32, nb - 32u), nb = k / 32) lies at 1024 u: the first 16 quants of
//           each of its m blocks, then their last 16. Block 32u + l's quants are at
//           1024 u + 16 l and 1024 u + 16 m + 16 l.
//   scales: rows * nb f16 after the quants (at byte rows * k), block b of row r at r * nb + b.
//
// Why: lane l of a warp reading block l of a unit loads its 32 quants with two aligned
// 16-byte loads that, with the other lanes', each cover 512 contiguous bytes, and its scale
// with one 2-byte load: no staging in shared memory, no shuffles, no selects. The GGUF's
// blocks are only 2-byte aligned at a 34-byte stride. On GPGPU-Sim's Orin NX the decode
// matvec went from 0.71 to 0.91 of the copy kernel's bandwidth (docs/native-and-cuda.md).
#ifndef Q8_LAYOUT_CU
#define Q8_LAYOUT_CU

// A matrix (or its rows from some r0 on): quants and scales.
struct q8m {
    const unsigned char* q;
    const unsigned short* s;
};

// The matrix of `rows` rows of k at w.
static __device__ __forceinline__ q8m q8m_of(const unsigned char* w, long long rows, int k) {
    q8m m;
    m.q = w;
    m.s = (const unsigned short*)(w + rows * k);
    return m;
}

// Its rows from r0 on.
static __device__ __forceinline__ q8m q8m_from(q8m m, long long r0, int k) {
    m.q += r0 * k;
    m.s += r0 * (k >> 5);
    return m;
}

// Byte offset in its row of quant i (0..31) of block b, nb blocks a row.
static __device__ __forceinline__ int q8m_qoff(int b, int i, int nb) {
    const int u = b >> 5;
    const int m = nb - 32 * u < 32 ? nb - 32 * u : 32;
    return 1024 * u + (i >> 4) * 16 * m + 16 * (b & 31) + (i & 15);
}

// The f16 scale of block b of row r as f32 (exact for every f16, subnormals included).
static __device__ __forceinline__ float q8m_scale(q8m m, long long r, int nb, int b) {
    const unsigned short h = m.s[r * nb + b];
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

#endif
