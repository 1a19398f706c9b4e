// Embedding lookup: out[t] = dequantized row tokens[t] of a Q8_0 matrix [n_vocab][n_embd]
// (q8_layout.cu's device layout, compiled before this file; n_embd % 32 == 0).
// Twin: src/cpu/embed.rs (q8::dequantize_row): out = d * q, one rounding, so equal bits.
// A token outside [0, n_vocab) gives a row of zeros (the kernel cannot report it; the
// twin returns an error). Header-free (NVRTC with no options).
// Launch: grid = n_tok, blockDim.x = EMBED_THREADS (256); thread j takes elements j, j+256...

#ifndef EMBED_THREADS
#define EMBED_THREADS 256
#endif

extern "C" __global__ void __launch_bounds__(EMBED_THREADS)
embed_q8_0(const unsigned char* __restrict__ w, const int* __restrict__ tokens,
           float* __restrict__ out, int n_embd, int n_vocab) {
    const int tok = tokens[blockIdx.x];
    out += (size_t)blockIdx.x * n_embd;
    if (tok < 0 || tok >= n_vocab) {
        for (int i = threadIdx.x; i < n_embd; i += blockDim.x) out[i] = 0.0f;
        return;
    }
    const q8m wm = q8m_of(w, n_vocab, n_embd);
    const int nb = n_embd >> 5;
    const unsigned char* row = wm.q + (size_t)tok * n_embd;
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) {
        const float d = q8m_scale(wm, tok, nb, i >> 5);
        out[i] = __fmul_rn(d, (float)(signed char)row[q8m_qoff(i >> 5, i & 31, nb)]);
    }
}
