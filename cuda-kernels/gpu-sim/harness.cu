// make gpu-sim-bench: one kernel launch under GPGPU-Sim, launched as its Rust wrapper
// (src/cuda/q8.rs) launches it, checked against a CPU reference.
//
//   harness copy BYTES             float4 copy, block 256, one float4 per thread
//   harness q8_gemv_f32 ROWS K B   q8_gemv_f32: block 32 * GEMV_ROWS_PER_BLOCK,
//                                  grid ceil(ROWS / GEMV_ROWS_PER_BLOCK), 8 columns a launch
//   harness q8_gemv_q8 ROWS K B    q8_gemv_q8: block 32 * GEMV_Q8_WARPS, grid as
//                                  gemv_q8_blocks in q8.rs (at most SMs *
//                                  GEMV_Q8_BLOCKS_PER_SM, every warp as many row groups)
//
// The launch constants come from q8.rs (scripts/gpu-sim-bench.sh reads them and passes
// -D flags), so the harness cannot drift from the wrapper. The simulator prints the cycles of
// each launch (gpu_sim_cycle); this program prints one JSON line with the bytes the launch
// must move and the check's result, and exits 1 when the check fails: every output must
// equal, bit for bit, a host replay of the kernel's documented float order (the order its
// CPU twin replays; the simulator needs gpgpusim-dp4a-fma.patch for that) and lie within
// 1e-4 of an f64 reference relative to the sum of the terms' magnitudes. Inputs are made before
// any launch and copied with cudaMemcpy, which the configuration does not let warm the L2, so
// the weights start in DRAM. The activations do not: in a decode step the kernel before the
// matvec (quantize.cu, or rmsnorm for the f32 matvec) has just written them, so they sit in
// L2. produce_x writes them the same way first (HARNESS_COLD_X=1 skips it and leaves them in
// DRAM too); its launch is counted in "warmup_launches", and the bench times only the
// launches after it.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// HARNESS_KERNELS: another kernel file in place of the real one (tuning experiments).
#ifdef HARNESS_KERNELS
#include HARNESS_KERNELS
#else
#include "../kernels/q8_layout.cu"
#include "../kernels/q8_gemv.cu"
#endif

#ifndef GEMV_ROWS_PER_BLOCK
#error "pass -DGEMV_ROWS_PER_BLOCK (scripts/gpu-sim-bench.sh reads it from src/cuda/q8.rs)"
#endif
// q8_gemv.cu defines Q8_GEMV_Q8_WARPS once it has q8_gemv_q8.
#if defined(Q8_GEMV_Q8_WARPS) && !defined(GEMV_Q8_WARPS)
#error "pass -DGEMV_Q8_WARPS, -DGEMV_Q8_ROWS_PER_WARP and -DGEMV_Q8_BLOCKS_PER_SM (from q8.rs)"
#endif

static const int kMaxCols = 8;  // GEMV_MAX_COLS

extern "C" __global__ void copy_f4(const float4* __restrict__ src, float4* __restrict__ dst,
                                   long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// Writes n 4-byte words of activations from src to dst, as the kernel before the matvec does.
extern "C" __global__ void produce_x(const unsigned* __restrict__ src, unsigned* __restrict__ dst,
                                     long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

#define CK(call)                                                                   \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        if (e_ != cudaSuccess) {                                                   \
            fprintf(stderr, "harness: %s: %s\n", #call, cudaGetErrorString(e_));   \
            exit(2);                                                               \
        }                                                                          \
    } while (0)

// Deterministic inputs (xorshift), so every run of a shape moves the same data.
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static float f16_to_f32(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

// Q8_0 rows: per block an f16 scale in [2^-8, 2^-7) and 32 quants in [-127, 127].
static std::vector<uint8_t> make_weights(int rows, int k) {
    std::vector<uint8_t> w((size_t)rows * (k / 32) * 34);
    for (size_t b = 0; b < w.size(); b += 34) {
        const uint16_t h = (uint16_t)(0x1c00 | (rnd() & 1023));
        w[b] = (uint8_t)h;
        w[b + 1] = (uint8_t)(h >> 8);
        for (int i = 0; i < 32; ++i) w[b + 2 + i] = (uint8_t)(int8_t)((int)(rnd() % 255) - 127);
    }
    return w;
}

// The matrix in the kernels' device layout (kernels/q8_layout.cu, src/q8.rs): per row its
// quants unit by unit of 32 blocks, first halves then second halves; then every f16 scale.
static std::vector<uint8_t> device_layout(const std::vector<uint8_t>& w, int rows, int k) {
    const int nb = k / 32;
    std::vector<uint8_t> d(w.size());
    for (int r = 0; r < rows; ++r)
        for (int b = 0; b < nb; ++b) {
            const size_t blk = ((size_t)r * nb + b) * 34;
            const int u = b / 32, m = nb - 32 * u < 32 ? nb - 32 * u : 32;
            uint8_t* q = &d[(size_t)r * k + 1024 * u + 16 * (b % 32)];
            memcpy(q, &w[blk + 2], 16);
            memcpy(q + 16 * m, &w[blk + 18], 16);
            memcpy(&d[(size_t)rows * k + 2 * ((size_t)r * nb + b)], &w[blk], 2);
        }
    return d;
}

// Dequantized weight (row r, index i) and the absolute size of the dot's terms.
static double wval(const std::vector<uint8_t>& w, int k, int r, int i) {
    const size_t b = ((size_t)r * (k / 32) + i / 32) * 34;
    return (double)f16_to_f32((uint16_t)(w[b] | (w[b + 1] << 8))) * (int8_t)w[b + 2 + i % 32];
}

struct Check {
    double max_rel = 0;
    long long bad = 0;
    long long inexact = 0;  // results whose bits differ from the documented float order's
};

// The xor butterfly of q8_gemv.cu's reductions over 32 partials: v_l += v_(l xor o).
static float butterfly(float* v) {
    for (int o = 16; o > 0; o >>= 1) {
        float n[32];
        for (int l = 0; l < 32; ++l) n[l] = v[l] + v[l ^ o];
        memcpy(v, n, sizeof n);
    }
    return v[0];
}

static float q8_scale(const std::vector<uint8_t>& w, size_t blk) {
    return f16_to_f32((uint16_t)(w[blk * 34] | (w[blk * 34 + 1] << 8)));
}

// q8_gemv_f32's order: lane 8g+s takes blocks g, g+4, ... and quants 4s..4s+3 of each.
static float replay_f32(const std::vector<uint8_t>& w, int k, int r, const float* x) {
    const int nb = k / 32;
    float acc[32] = {0};
    for (int l = 0; l < 32; ++l)
        for (int b = l >> 3; b < nb; b += 4) {
            const size_t blk = (size_t)r * nb + b;
            const int8_t* q = (const int8_t*)&w[blk * 34 + 2 + 4 * (l & 7)];
            const float* xv = x + b * 32 + 4 * (l & 7);
            float p = (float)q[0] * xv[0];
            p = std::fmaf((float)q[1], xv[1], p);
            p = std::fmaf((float)q[2], xv[2], p);
            p = std::fmaf((float)q[3], xv[3], p);
            acc[l] = std::fmaf(q8_scale(w, blk), p, acc[l]);
        }
    return butterfly(acc);
}

// q8_gemv_q8's order: partial l takes blocks l, l+32, ...: acc = fma(dw * dx, isum, acc).
static float replay_q8(const std::vector<uint8_t>& w, int k, int r, const int8_t* xq,
                       const float* xd) {
    const int nb = k / 32;
    float acc[32] = {0};
    for (int b = 0; b < nb; ++b) {
        const size_t blk = (size_t)r * nb + b;
        int isum = 0;
        for (int i = 0; i < 32; ++i) isum += (int8_t)w[blk * 34 + 2 + i] * xq[b * 32 + i];
        const float p = q8_scale(w, blk) * xd[b];
        acc[b & 31] = std::fmaf(p, (float)isum, acc[b & 31]);
    }
    return butterfly(acc);
}

// |got - ref| against the sum of |terms| (f32 accumulation of k terms: well under 1e-4).
static void check(Check& c, float got, float exact, double ref, double mag) {
    if (memcmp(&got, &exact, 4) != 0) ++c.inexact;
    const double rel = std::fabs(got - ref) / (mag + 1e-30);
    static int shown = 0;
    if (getenv("HARNESS_DEBUG") && shown < 8) {
        ++shown;
        fprintf(stderr, "got %.9g ref %.9g mag %.6g\n", got, ref, mag);
    }
    if (rel > c.max_rel) c.max_rel = rel;
    if (!(rel <= 1e-4)) ++c.bad;
}

// Copies `bytes` (a multiple of 4) of host activations to `dst` through produce_x, so that
// they end in L2 as a real step leaves them; returns the launches made (0 with
// HARNESS_COLD_X=1, where a plain cudaMemcpy leaves them in DRAM).
static int upload_x(void* dst, const void* host, size_t bytes) {
    if (getenv("HARNESS_COLD_X")) {
        CK(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
        return 0;
    }
    void* src;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMemcpy(src, host, bytes, cudaMemcpyHostToDevice));
    produce_x<<<64, 256>>>((const unsigned*)src, (unsigned*)dst, (long long)(bytes / 4));
    CK(cudaGetLastError());
    CK(cudaFree(src));  // waits for produce_x
    return 1;
}

// An attribute, not cudaGetDeviceProperties: the simulator's cudaDeviceProp is CUDA 11.8's
// layout, this program's CUDA 13's.
static int sm_count() {
    int n = 0;
    CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
}

static void report(const char* kernel, long long rows, long long k, int batch, double bytes,
                   unsigned grid, unsigned block, int launches, const Check& c,
                   int warmup_launches = 0) {
    printf("HARNESS {\"kernel\":\"%s\",\"rows\":%lld,\"k\":%lld,\"batch\":%d,\"bytes\":%.0f,"
           "\"grid\":%u,\"block\":%u,\"launches\":%d,\"warmup_launches\":%d,\"check\":\"%s\","
           "\"max_rel_err\":%.3g,\"not_bit_exact\":%lld}\n",
           kernel, rows, k, batch, bytes, grid, block, launches, warmup_launches,
           c.bad || c.inexact ? "FAILED" : "ok",
           c.max_rel, c.inexact);
    fflush(stdout);
}

static int run_copy(long long bytes) {
    const long long n = bytes / 16;
    std::vector<float> h((size_t)n * 4);
    for (auto& v : h) v = (float)(rnd() % 1000);
    float4 *src, *dst;
    CK(cudaMalloc(&src, n * 16));
    CK(cudaMalloc(&dst, n * 16));
    CK(cudaMemcpy(src, h.data(), n * 16, cudaMemcpyHostToDevice));
    const unsigned grid = (unsigned)((n + 255) / 256);
    copy_f4<<<grid, 256>>>(src, dst, n);
    CK(cudaGetLastError());
    std::vector<float> out(h.size());
    CK(cudaMemcpy(out.data(), dst, n * 16, cudaMemcpyDeviceToHost));
    Check c;
    c.bad = memcmp(out.data(), h.data(), n * 16) != 0;
    report("copy", 0, 0, 0, 2.0 * n * 16, grid, 256, 1, c);
    return c.bad ? 1 : 0;
}

static int run_gemv_f32(int rows, int k, int batch) {
    const auto w = make_weights(rows, k);
    std::vector<float> x((size_t)batch * k);
    for (auto& v : x) v = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    uint8_t* dw;
    float *dx, *dy;
    CK(cudaMalloc(&dw, w.size()));
    CK(cudaMalloc(&dx, x.size() * 4));
    CK(cudaMalloc(&dy, (size_t)batch * rows * 4));
    CK(cudaMemcpy(dw, device_layout(w, rows, k).data(), w.size(), cudaMemcpyHostToDevice));
    const int warm = upload_x(dx, x.data(), x.size() * 4);
    const unsigned grid = (unsigned)((rows + GEMV_ROWS_PER_BLOCK - 1) / GEMV_ROWS_PER_BLOCK);
    const unsigned block = 32 * GEMV_ROWS_PER_BLOCK;
    int launches = 0;
    for (int c0 = 0; c0 < batch; c0 += kMaxCols, ++launches) {
        const int n = batch - c0 < kMaxCols ? batch - c0 : kMaxCols;
        q8_gemv_f32<<<grid, block>>>(dw, dx + (size_t)c0 * k, dy + (size_t)c0 * rows, rows, k, n);
        CK(cudaGetLastError());
    }
    std::vector<float> y((size_t)batch * rows);
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    Check chk;
    for (int c = 0; c < batch; ++c)
        for (int r = 0; r < rows; ++r) {
            double ref = 0, mag = 0;
            for (int i = 0; i < k; ++i) {
                const double t = wval(w, k, r, i) * x[(size_t)c * k + i];
                ref += t;
                mag += std::fabs(t);
            }
            check(chk, y[(size_t)c * rows + r], replay_f32(w, k, r, &x[(size_t)c * k]), ref, mag);
        }
    // Weights once, the activations once per launch, the outputs once.
    const double bytes = (double)w.size() + 4.0 * x.size() + 4.0 * y.size();
    report("q8_gemv_f32", rows, k, batch, bytes, grid, block, launches, chk, warm);
    return chk.bad || chk.inexact ? 1 : 0;
}

#ifdef Q8_GEMV_Q8_WARPS
static int run_gemv_q8(int rows, int k, int batch) {
    const auto w = make_weights(rows, k);
    const int nb = k / 32;
    std::vector<int8_t> xq((size_t)batch * k);
    std::vector<float> xd((size_t)batch * nb);
    for (auto& v : xq) v = (int8_t)((int)(rnd() % 255) - 127);
    for (auto& v : xd) v = f16_to_f32((uint16_t)(0x1c00 | (rnd() & 1023)));
    uint8_t* dw;
    int8_t* dq;
    float *dd, *dy;
    CK(cudaMalloc(&dw, w.size()));
    CK(cudaMalloc(&dq, xq.size()));
    CK(cudaMalloc(&dd, xd.size() * 4));
    CK(cudaMalloc(&dy, (size_t)batch * rows * 4));
    CK(cudaMemcpy(dw, device_layout(w, rows, k).data(), w.size(), cudaMemcpyHostToDevice));
    // xq's size (batch * k, k a multiple of 32) is a multiple of 4.
    int warm = upload_x(dq, xq.data(), xq.size());
    warm += upload_x(dd, xd.data(), xd.size() * 4);
    // gemv_q8_blocks in q8.rs: every warp the same number of row groups.
#ifdef GEMV_Q8_ANY_ROWS  // gemv_q8_rows_per_warp in q8.rs
    const int per = batch == 1 && k <= GEMV_Q8_PAIR_K   ? 2
                    : batch == 1 && k <= GEMV_Q8_XREG_K ? GEMV_Q8_ROWS_PER_WARP
                                                        : GEMV_Q8_ANY_ROWS;
#else
    const int per = GEMV_Q8_ROWS_PER_WARP;
#endif
    const long long groups = (rows + per - 1) / per;
    const long long max_warps = (long long)sm_count() * GEMV_Q8_BLOCKS_PER_SM * GEMV_Q8_WARPS;
    const long long passes = (groups + max_warps - 1) / max_warps;
    const long long warps = (groups + passes - 1) / passes;
    long long blocks = (warps + GEMV_Q8_WARPS - 1) / GEMV_Q8_WARPS;
    const long long sms = sm_count(), first = (groups + GEMV_Q8_WARPS - 1) / GEMV_Q8_WARPS;
    blocks = (blocks + sms - 1) / sms * sms;  // whole SMs,
    if (blocks > sms * GEMV_Q8_BLOCKS_PER_SM) blocks = sms * GEMV_Q8_BLOCKS_PER_SM;
    if (blocks > first) blocks = first;  // no block without a row group in the first pass
    const unsigned grid = (unsigned)blocks, block = 32 * GEMV_Q8_WARPS;
    q8_gemv_q8<<<grid, block>>>(dw, (const signed char*)dq, dd, nullptr, dy, rows, k, batch, 0);
    CK(cudaGetLastError());
    std::vector<float> y((size_t)batch * rows);
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    Check chk;
    for (int c = 0; c < batch; ++c)
        for (int r = 0; r < rows; ++r) {
            double ref = 0, mag = 0;
            for (int i = 0; i < k; ++i) {
                const double t =
                    wval(w, k, r, i) * xq[(size_t)c * k + i] * xd[(size_t)c * nb + i / 32];
                ref += t;
                mag += std::fabs(t);
            }
            check(chk, y[(size_t)c * rows + r],
                  replay_q8(w, k, r, &xq[(size_t)c * k], &xd[(size_t)c * nb]), ref, mag);
        }
    const double bytes = (double)w.size() + xq.size() + 4.0 * xd.size() + 4.0 * y.size();
    report("q8_gemv_q8", rows, k, batch, bytes, grid, block, 1, chk, warm);
    return chk.bad || chk.inexact ? 1 : 0;
}
#endif

int main(int argc, char** argv) {
    if (argc == 3 && !strcmp(argv[1], "copy")) return run_copy(atoll(argv[2]));
    if (argc == 5) {
        const int rows = atoi(argv[2]), k = atoi(argv[3]), batch = atoi(argv[4]);
        if (rows <= 0 || k <= 0 || k % 32 || batch < 1 || batch > kMaxCols) {
            fprintf(stderr, "harness: bad shape %s x %s, batch %s\n", argv[2], argv[3], argv[4]);
            return 2;
        }
        if (!strcmp(argv[1], "q8_gemv_f32")) return run_gemv_f32(rows, k, batch);
#ifdef Q8_GEMV_Q8_WARPS
        if (!strcmp(argv[1], "q8_gemv_q8")) return run_gemv_q8(rows, k, batch);
#endif
    }
    fprintf(stderr,
            "usage: harness copy BYTES | harness q8_gemv_f32|q8_gemv_q8 ROWS K BATCH\n");
    return 2;
}
