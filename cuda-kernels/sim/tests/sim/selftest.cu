// Kernels that test the CUDA emulator itself (tests/sim.rs): correct programs with known
// results, and faulty ones the emulator must refuse. Valid CUDA, header-free like the
// product's kernels.

// Every thread writes its block's and its own linear index: checks the 3-D built-ins.
extern "C" __global__ void ids_3d(unsigned* out) {
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned n = blockDim.x * blockDim.y * blockDim.z;
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[b * n + t] = (b << 16) | t;
}

// The four shuffle forms, one warp per 32 threads.
extern "C" __global__ void shuffles(const float* x, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = x[i];
    out[4 * i + 0] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[4 * i + 1] = __shfl_down_sync(0xffffffffu, v, 3);
    out[4 * i + 2] = __shfl_up_sync(0xffffffffu, v, 2);
    out[4 * i + 3] = __shfl_sync(0xffffffffu, v, 7, 16);
}

// Shared memory across a barrier: each block reverses its part of x.
extern "C" __global__ void reverse_in_block(const int* x, int* y) {
    __shared__ int s[256];
    const int t = threadIdx.x, base = blockIdx.x * blockDim.x;
    s[t] = x[base + t];
    __syncthreads();
    y[base + t] = s[blockDim.x - 1 - t];
}

// A race: thread t reads what thread t - 1 wrote, with no barrier between. Right when the
// threads happen to run in order, wrong when they run the other way.
extern "C" __global__ void shift_racy(const int* x, int* y) {
    __shared__ int s[256];
    const int t = threadIdx.x;
    s[t] = x[t];
    y[t] = t > 0 ? s[t - 1] : 0;
}

// Undefined on a GPU: a barrier that the threads past n never reach.
extern "C" __global__ void barrier_after_return(int* y, int n) {
    if ((int)threadIdx.x >= n) return;
    __syncthreads();
    y[threadIdx.x] = 1;
}

// Undefined on a GPU: a full-mask shuffle after lane 3 has left.
extern "C" __global__ void shuffle_after_return(float* y) {
    if (threadIdx.x == 3) return;
    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// One element past the end of y (n elements).
extern "C" __global__ void write_past_end(float* y, int n) {
    if (threadIdx.x == 0) y[n] = 1.0f;
}

// 64 elements past the end of a short x, in one thread of one block of several: beyond
// the canary, on the page the emulator keeps inaccessible after every allocation.
extern "C" __global__ void read_far_past_end(const float* x, float* y, int n) {
    if (blockIdx.x == 3 && threadIdx.x == 5) y[0] = x[n + 64];
}

static __device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// f16 -> f32 of every h, f32 -> f16 (round to nearest even) of every x: the inline PTX the
// kernels use, through the emulator's rewrite.
extern "C" __global__ void f16_convert(const unsigned short* h, float* hf, const float* x,
                                       unsigned short* xh, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    hf[i] = f16_to_f32(h[i]);
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x[i]));
    xh[i] = r;
}

struct alignas(16) f4 {
    float a, b, c, d;
};

// A 16-byte load from x + 1: misaligned, which faults on a GPU.
extern "C" __global__ void misaligned_load(const float* x, float* y) {
    const f4 v = *(const f4*)(x + 1);
    y[threadIdx.x] = v.a + v.d;
}

// 64 threads writing a 32-float shared array.
extern "C" __global__ void shared_overflow(float* y) {
    __shared__ float s[32];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    y[threadIdx.x] = s[threadIdx.x & 31];
}
