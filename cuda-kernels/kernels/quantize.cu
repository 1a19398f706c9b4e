// Activation quantization for the Q8_0 GEMM: f32 rows (a multiple of 32 long) into blocks
// of 32 int8 with one f32 scale, as ggml's q8_1 but without its block sum (Q8_0 weights
// have no offset, so the GEMM never needs it).
//
// Layout (planar, so the GEMM can load the quants as aligned 32-bit words):
//   q: int8  [nblocks * 32]  block b holds x[32b .. 32b+31]
//   d: f32   [nblocks]       scale of block b, an f16 value held in an f32
// Rows are consecutive, so a tokens x k matrix is simply tokens * k / 32 blocks.
//
// Math (the CPU twin, src/cpu/quantize.rs, is bit-identical): amax = max |x|,
// d = amax / 127, id = d != 0 ? 1 / d : 0, q = roundf(x * id) (half away from zero), every
// step correctly rounded (explicit _rn intrinsics), and the stored d is rounded to f16 (the
// quants keep the unrounded id): ggml's block_q8_0, which llama.cpp's CPU matmuls quantize
// activations into, does the same, and the native forward matches their numerics.
// |x * id| <= 127 + a rounding error, so q stays in [-127, 127] and never needs a clamp.
//
// Launch: one warp per block, lane i takes element i. block = 256 threads (8 blocks),
// grid = ceil(nblocks / 8).

extern "C" __global__ void quantize_q8_f32(const float* __restrict__ x, signed char* __restrict__ q,
                                           float* __restrict__ d, int nblocks) {
    const int lane = threadIdx.x & 31;
    const long long blk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk >= nblocks) return;  // whole warps only: shuffles stay full-mask
    const float v = x[blk * 32 + lane];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = __fdiv_rn(amax, 127.0f);
    const float id = scale != 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
    q[blk * 32 + lane] = (signed char)(int)roundf(__fmul_rn(v, id));
    if (lane == 0) {
        unsigned short h;
        float r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(scale));
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
        d[blk] = r;
    }
}
