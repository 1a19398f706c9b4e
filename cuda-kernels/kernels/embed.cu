// Embedding lookup: out[t] = dequantized row tokens[t] of a Q8_0 matrix [n_vocab][n_embd]
// (ggml layout: 34-byte blocks, f16 scale little-endian then 32 int8; n_embd % 32 == 0).
// Twin: src/cpu/embed.rs (q8::dequantize_row): out = d * q, one rounding, so equal bits.
// A token outside [0, n_vocab) gives a row of zeros (the kernel cannot report it; the
// twin returns an error). Header-free (NVRTC with no options).
// Launch: grid = n_tok, blockDim.x = EMBED_THREADS (256); thread j takes elements j, j+256...

#ifndef EMBED_THREADS
#define EMBED_THREADS 256
#endif

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

extern "C" __global__ void __launch_bounds__(EMBED_THREADS)
embed_q8_0(const unsigned char* __restrict__ w, const int* __restrict__ tokens,
           float* __restrict__ out, int n_embd, int n_vocab) {
    const int tok = tokens[blockIdx.x];
    out += (size_t)blockIdx.x * n_embd;
    if (tok < 0 || tok >= n_vocab) {
        for (int i = threadIdx.x; i < n_embd; i += blockDim.x) out[i] = 0.0f;
        return;
    }
    const unsigned char* row = w + (size_t)tok * (size_t)(n_embd / 32 * 34);
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) {
        const unsigned char* blk = row + (i >> 5) * 34;
        // Byte loads: a view of the matrix need not keep the scales 2-byte aligned.
        const float d = h2f((unsigned short)(blk[0] | (blk[1] << 8)));
        out[i] = __fmul_rn(d, (float)(signed char)blk[2 + (i & 31)]);
    }
}
