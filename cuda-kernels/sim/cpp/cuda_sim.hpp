// The CUDA emulator's prelude: what a kernel file needs from CUDA (built-in indices,
// __shared__, __syncthreads, warp shuffles, the _rn intrinsics, __dp4a), on the host CPU.
//
// The `cuda-sim` tool compiles each kernel file with this header in front (its inline PTX
// rewritten into sim_* calls) into a shared object that libcuda_sim.so loads in place of a
// PTX module. It exists so that the launch wrappers, the kernels and the daemon's CUDA
// forward pass run somewhere without a GPU; it proves indexing, bounds, reductions and
// barriers, not speed, and not the hardware itself.
//
// Execution model: a launch's blocks are shared out among a few OS threads (the caller and a
// pool), each running one block at a time. Every CUDA thread of a block is a fiber with its
// own stack on that OS thread; a fiber runs until
// it reaches __syncthreads or a shuffle, or returns. A shuffle completes when every lane of
// its warp has reached it; __syncthreads when every thread of the block has. Anything else
// (a lane that left before a full-mask shuffle, a barrier some threads skip, a warp split
// between a shuffle and a barrier) is a launch error naming the kernel, block and thread:
// undefined behaviour on a GPU, refused here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>

#include "sim_abi.h"

struct dim3 {
    unsigned x, y, z;
};
typedef dim3 uint3;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
// An OS thread runs one block at a time, so a block's shared arrays can be that thread's
// statics (contents left over from an earlier block, as on a GPU).
#define __shared__ static thread_local

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

namespace sim {

enum class State : uint8_t { Run, Sync, Shfl, Done };
enum class ShflKind : uint8_t { Xor, Down, Up, Idx };

// Switching fibers: a register-saving stack switch on x86-64 and aarch64 (ucontext's
// swapcontext makes a signal-mask system call on every switch, which dominated the run
// time), ucontext elsewhere.
#if defined(__x86_64__) || defined(__aarch64__)
#define SIM_FAST_SWITCH 1
extern "C" void sim_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
asm(R"(
.text
.p2align 4
.type sim_switch, @function
sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size sim_switch, .-sim_switch
)");
#else
asm(R"(
.text
.p2align 4
.type sim_switch, %function
sim_switch:
    sub sp, sp, #160
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x2, sp
    str x2, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #160
    ret
.size sim_switch, .-sim_switch
)");
#endif
#endif

struct Context {
#ifdef SIM_FAST_SWITCH
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

struct Thread {
    Context ctx;
    State state;
    dim3 idx;
    // The pending shuffle: this lane's value (as bits), its operand, mask and width.
    ShflKind kind;
    uint64_t value;
    int operand;
    unsigned mask;
    int width;
};

struct Stack {
    void* base = nullptr;
    size_t size = 0;
};

// Fiber stacks, kept per OS thread across launches (mmap'd, so only touched pages count).
constexpr size_t kStackBytes = 256 * 1024;

struct Runner {
    const char* kernel;
    const std::function<void()>* body;
    std::vector<Thread> threads;
    Context sched;
    unsigned current = 0;
    std::string error;
    sim_where* where = nullptr;
    // Run the threads of each phase last to first (INFERLOOP_SIM_ORDER=reverse): a read of
    // another thread's write with no barrier between gives different results in the two
    // orders, so running a test both ways exposes the race.
    bool reverse = false;
};

inline thread_local Runner* runner = nullptr;
inline thread_local std::vector<Stack> stacks;

inline void switch_to(Context& save, Context& load) {
#ifdef SIM_FAST_SWITCH
    sim_switch(&save.sp, load.sp);
#else
    swapcontext(&save.uc, &load.uc);
#endif
}

inline void yield_to_scheduler() {
    Runner* r = runner;
    switch_to(r->threads[r->current].ctx, r->sched);
}

// A fiber's first code; it never returns (a finished fiber is never resumed).
[[noreturn]] inline void fiber_main() {
    Runner* r = runner;
    (*r->body)();
    r->threads[r->current].state = State::Done;
    switch_to(r->threads[r->current].ctx, r->sched);
    __builtin_trap();
}

// Prepares ctx to start fiber_main on the given stack at its first switch.
inline void start_context(Context& ctx, const Stack& st) {
#ifdef SIM_FAST_SWITCH
    uintptr_t top = ((uintptr_t)st.base + st.size) & ~(uintptr_t)15;
    void** sp = (void**)top;
#if defined(__x86_64__)
    // What sim_switch pops: control words, r15..rbp, then the return address. The slot
    // after the return address is 16-byte aligned, as at a call.
    *--sp = nullptr;  // fake return address of fiber_main (never used)
    *--sp = (void*)&fiber_main;
    for (int i = 0; i < 6; ++i) *--sp = nullptr;
    --sp;
    unsigned csr;
    unsigned short cw;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    memcpy((char*)sp, &csr, 4);
    memcpy((char*)sp + 4, &cw, 2);
#else
    sp -= 20;  // 160 bytes: x19..x30, d8..d15
    memset(sp, 0, 160);
    sp[11] = (void*)&fiber_main;  // x30, the return address
#endif
    ctx.sp = sp;
#else
    getcontext(&ctx.uc);
    ctx.uc.uc_stack.ss_sp = st.base;
    ctx.uc.uc_stack.ss_size = st.size;
    ctx.uc.uc_link = nullptr;
    makecontext(&ctx.uc, (void (*)())fiber_main, 0);
#endif
}

inline unsigned linear(const dim3& t, const dim3& b) { return t.x + b.x * (t.y + b.y * t.z); }

inline void fail(Runner& r, const char* what, unsigned thread) {
    if (!r.error.empty()) return;
    const dim3& t = r.threads[thread].idx;
    char buf[512];
    snprintf(buf, sizeof buf, "%s: block (%u,%u,%u) thread (%u,%u,%u): %s", r.kernel, blockIdx.x,
             blockIdx.y, blockIdx.z, t.x, t.y, t.z, what);
    r.error = buf;
}

// Completes the shuffles of warps whose every lane is waiting at one; true if any did.
inline bool resolve_warps(Runner& r) {
    bool progressed = false;
    const unsigned n = (unsigned)r.threads.size();
    for (unsigned w0 = 0; w0 < n; w0 += 32) {
        const unsigned lanes = n - w0 < 32 ? n - w0 : 32;
        unsigned shfl = 0, done = 0, sync = 0;
        for (unsigned l = 0; l < lanes; ++l) {
            const State s = r.threads[w0 + l].state;
            shfl += s == State::Shfl;
            done += s == State::Done;
            sync += s == State::Sync;
        }
        if (shfl == 0) continue;
        for (unsigned l = 0; l < lanes; ++l) {
            const Thread& t = r.threads[w0 + l];
            if (t.state != State::Shfl) {
                fail(r,
                     t.state == State::Done
                         ? "a lane of this warp returned before its warp's shuffle"
                         : "this lane waits at __syncthreads while its warp shuffles",
                     w0 + l);
                return false;
            }
        }
        const Thread& first = r.threads[w0];
        if (first.mask != 0xffffffffu || lanes != 32) {
            fail(r, "only full-warp shuffles (mask 0xffffffff, 32 lanes) are emulated", w0);
            return false;
        }
        uint64_t out[32];
        for (unsigned l = 0; l < 32; ++l) {
            const Thread& t = r.threads[w0 + l];
            if (t.mask != first.mask || t.kind != first.kind || t.width != first.width) {
                fail(r, "the lanes of this warp are at different shuffles", w0 + l);
                return false;
            }
            const int w = t.width;
            const int seg = (int)l & ~(w - 1), li = (int)l & (w - 1);
            int src = (int)l;
            switch (t.kind) {
                case ShflKind::Xor: {
                    const int s = li ^ t.operand;
                    src = s < w ? seg + s : (int)l;
                    break;
                }
                case ShflKind::Down:
                    src = li + t.operand < w ? (int)l + t.operand : (int)l;
                    break;
                case ShflKind::Up:
                    src = li - t.operand >= 0 ? (int)l - t.operand : (int)l;
                    break;
                case ShflKind::Idx:
                    src = seg + (t.operand & (w - 1));
                    break;
            }
            out[l] = r.threads[w0 + src].value;
        }
        for (unsigned l = 0; l < 32; ++l) {
            r.threads[w0 + l].value = out[l];
            r.threads[w0 + l].state = State::Run;
        }
        progressed = true;
        (void)done;
        (void)sync;
    }
    return progressed;
}

// Runs one block to the end; false (with r.error set) on a launch error.
inline bool run_block(Runner& r) {
    const unsigned n = (unsigned)r.threads.size();
    for (unsigned i = 0; i < n; ++i) {
        Thread& t = r.threads[i];
        t.state = State::Run;
        t.idx = dim3{i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
        start_context(t.ctx, stacks[i]);
    }
    for (;;) {
        for (unsigned j = 0; j < n; ++j) {
            const unsigned i = r.reverse ? n - 1 - j : j;
            if (r.threads[i].state != State::Run) continue;
            r.current = i;
            threadIdx = r.threads[i].idx;
            if (r.where) r.where->thread = {threadIdx.x, threadIdx.y, threadIdx.z};
            switch_to(r.sched, r.threads[i].ctx);
        }
        if (resolve_warps(r)) continue;
        if (!r.error.empty()) return false;
        unsigned sync = 0, done = 0, first_done = 0, first_sync = 0;
        for (unsigned i = 0; i < n; ++i) {
            const State s = r.threads[i].state;
            if (s == State::Sync && sync++ == 0) first_sync = i;
            if (s == State::Done && done++ == 0) first_done = i;
        }
        if (done == n) return true;
        if (sync + done != n) {
            fail(r, "deadlock: threads wait at a shuffle that cannot complete", first_sync);
            return false;
        }
        if (done > 0) {
            char what[160];
            snprintf(what, sizeof what,
                     "__syncthreads reached by %u of %u threads; this one returned before it",
                     sync, n);
            fail(r, what, first_done);
            return false;
        }
        for (unsigned i = 0; i < n; ++i) r.threads[i].state = State::Run;
    }
}

inline bool ensure_stacks(size_t n) {
    while (stacks.size() < n) {
        void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        // The lowest page is a guard: a fiber that overflows its stack faults instead of
        // writing into its neighbour's.
        mprotect(p, 4096, PROT_NONE);
        stacks.push_back(Stack{(char*)p + 4096, kStackBytes - 4096});
    }
    return true;
}

// The helper threads that run a launch's blocks beside the calling thread (one pool per
// module, INFERLOOP_SIM_THREADS threads in all, default one per CPU). Blocks of a launch are
// independent on a GPU too, so they may run at the same time; a launch that finds the pool
// busy with another thread's launch runs its blocks alone.
class Pool {
  public:
    static Pool& get() {
        static Pool* pool = new Pool();  // never destroyed: its threads outlive main
        return *pool;
    }
    bool empty() const { return threads_.empty(); }
    // Runs job on the caller and on every helper; false (nothing run) when busy.
    bool run(const std::function<void()>& job) {
        std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
        if (!busy.owns_lock()) return false;
        {
            std::lock_guard<std::mutex> g(m_);
            job_ = &job;
            pending_ = threads_.size();
            ++generation_;
        }
        wake_.notify_all();
        job();
        std::unique_lock<std::mutex> g(m_);
        done_.wait(g, [&] { return pending_ == 0; });
        job_ = nullptr;
        return true;
    }

  private:
    Pool() {
        unsigned n = std::thread::hardware_concurrency();
        if (const char* e = getenv("INFERLOOP_SIM_THREADS")) n = (unsigned)atoi(e);
        n = n < 1 ? 1 : n > 64 ? 64 : n;
        for (unsigned i = 1; i < n; ++i) threads_.emplace_back([this] { serve(); });
        for (auto& t : threads_) t.detach();
    }
    void serve() {
        uint64_t seen = 0;
        for (;;) {
            const std::function<void()>* job;
            {
                std::unique_lock<std::mutex> g(m_);
                wake_.wait(g, [&] { return generation_ != seen; });
                seen = generation_;
                job = job_;
            }
            (*job)();
            std::lock_guard<std::mutex> g(m_);
            if (--pending_ == 0) done_.notify_one();
        }
    }
    std::mutex busy_, m_;
    std::condition_variable wake_, done_;
    const std::function<void()>* job_ = nullptr;
    size_t pending_ = 0;
    uint64_t generation_ = 0;
    std::vector<std::thread> threads_;
};

// The modules are built with UBSan's alignment, bounds and shift checks, which stop the
// process at a misaligned load (a fault on a GPU too), an index past a fixed-size array
// (shared memory included) or an out-of-range shift. UBSan names the source line; this
// adds which kernel, block and thread it was.
extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

inline void report_where() {
    if (Runner* r = runner) {
        const dim3& t = r->threads[r->current].idx;
        fprintf(stderr, "cuda-sim: in kernel %s, block (%u,%u,%u) thread (%u,%u,%u)\n", r->kernel,
                blockIdx.x, blockIdx.y, blockIdx.z, t.x, t.y, t.z);
    }
}

inline int launch(const char* kernel, const std::function<void()>& body, const sim_launch& l,
                  char* err, size_t err_len) {
    static const bool hooked = [] {
        if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(report_where);
        return true;
    }();
    (void)hooked;
    auto refuse = [&](const std::string& why) {
        snprintf(err, err_len, "%s: %s", kernel, why.c_str());
        return 1;
    };
    const unsigned n = l.block[0] * l.block[1] * l.block[2];
    if (n == 0 || n > 1024 || l.block[2] > 64)
        return refuse("block of " + std::to_string(l.block[0]) + "x" + std::to_string(l.block[1]) +
                      "x" + std::to_string(l.block[2]) + " threads (CUDA allows 1..1024)");
    if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0 || l.grid[1] > 65535 ||
        l.grid[2] > 65535)
        return refuse("grid of " + std::to_string(l.grid[0]) + "x" + std::to_string(l.grid[1]) +
                      "x" + std::to_string(l.grid[2]) + " blocks is not launchable");
    if (l.shared_bytes != 0) return refuse("dynamic shared memory is not emulated");
    const char* order = getenv("INFERLOOP_SIM_ORDER");
    const bool reverse = order && strcmp(order, "reverse") == 0;
    const uint64_t gx = l.grid[0], gy = l.grid[1];
    const uint64_t blocks = gx * gy * l.grid[2];
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex error_mu;
    std::string error;

    // What each OS thread does: take the next block until none is left.
    const std::function<void()> work = [&] {
        sim_where* where = l.where_here ? l.where_here() : nullptr;
        if (where) where->kernel = kernel;
        Runner r;
        r.kernel = kernel;
        r.body = &body;
        r.where = where;
        r.reverse = reverse;
        bool ok = ensure_stacks(n);
        if (!ok) r.error = std::string(kernel) + ": cannot map fiber stacks";
        r.threads.resize(n);
        Runner* outer = runner;
        runner = &r;
        gridDim = dim3{l.grid[0], l.grid[1], l.grid[2]};
        blockDim = dim3{l.block[0], l.block[1], l.block[2]};
        while (ok && !failed.load(std::memory_order_relaxed)) {
            const uint64_t b = next.fetch_add(1);
            if (b >= blocks) break;
            blockIdx = dim3{(unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / (gx * gy))};
            if (where) where->block = {blockIdx.x, blockIdx.y, blockIdx.z};
            ok = run_block(r);
        }
        runner = outer;
        if (where) where->kernel = nullptr;
        if (!ok) {
            failed = true;
            std::lock_guard<std::mutex> g(error_mu);
            if (error.empty()) error = r.error;
        }
    };
    Pool& pool = Pool::get();
    if (blocks < 2 || pool.empty() || !pool.run(work)) work();
    if (failed) {
        snprintf(err, err_len, "%s", error.c_str());
        return 1;
    }
    return 0;
}

template <class T>
inline T shuffle(ShflKind kind, unsigned mask, T v, int operand, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of this type");
    Runner* r = runner;
    Thread& t = r->threads[r->current];
    t.kind = kind;
    t.mask = mask;
    t.operand = operand;
    t.width = width;
    t.value = 0;
    memcpy(&t.value, &v, sizeof v);
    t.state = State::Shfl;
    yield_to_scheduler();
    T out;
    memcpy(&out, &r->threads[r->current].value, sizeof out);
    return out;
}

template <class... A, size_t... I>
inline void invoke_with(void (*k)(A...), void** params, std::index_sequence<I...>) {
    k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(params[I])...);
}

template <class... A>
inline void invoke(void (*k)(A...), void** params) {
    invoke_with(k, params, std::index_sequence_for<A...>{});
}

// The kernel's parameter count; the first `max` of their sizes go into `sizes`.
template <class... A>
inline size_t arg_sizes(void (*)(A...), size_t* sizes, size_t max) {
    const size_t all[] = {sizeof(std::remove_cv_t<std::remove_reference_t<A>>)..., 0};
    const size_t n = sizeof...(A);
    for (size_t i = 0; i < n && i < max; ++i) sizes[i] = all[i];
    return n;
}

}  // namespace sim

// One exported entry per kernel: what libcuda_sim's cuModuleGetFunction looks up.
#define SIM_ENTRY(k)                                                                       \
    extern "C" int sim_entry_##k(const sim_launch* l, void** params, char* err,           \
                                 size_t err_len) {                                         \
        const std::function<void()> body = [params] { sim::invoke(k, params); };          \
        return sim::launch(#k, body, *l, err, err_len);                                    \
    }                                                                                      \
    extern "C" size_t sim_args_##k(size_t* sizes, size_t max) {                            \
        return sim::arg_sizes(k, sizes, max);                                              \
    }

// ---------- CUDA device functions the kernels use ----------

inline void __syncthreads() {
    sim::Runner* r = sim::runner;
    r->threads[r->current].state = sim::State::Sync;
    sim::yield_to_scheduler();
}

// A warp barrier (shared memory written by some lanes, then read by others): here a shuffle
// that every lane of the warp must reach, which is what __syncwarp asks of the warp.
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)sim::shuffle(sim::ShflKind::Idx, mask, 0, 0, 32);
}

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return sim::shuffle(sim::ShflKind::Xor, mask, v, lane_mask, width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return sim::shuffle(sim::ShflKind::Down, mask, v, (int)delta, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return sim::shuffle(sim::ShflKind::Up, mask, v, (int)delta, width);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int lane, int width = 32) {
    return sim::shuffle(sim::ShflKind::Idx, mask, v, lane, width);
}

// Blocks of a launch run on several OS threads: atomics are the host's, and a fence is a
// full one (what __threadfence orders on a GPU, and more).
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// The _rn intrinsics: IEEE round-to-nearest-even single operations. The emulator is built
// with -ffp-contract=off, so each is exactly one rounding, as on the GPU.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __double2float_rn(double a) { return (float)a; }
inline float __int2float_rn(int a) { return (float)a; }
inline float __int_as_float(int a) {
    float f;
    memcpy(&f, &a, sizeof f);
    return f;
}
inline int __float_as_int(float f) {
    int a;
    memcpy(&a, &f, sizeof a);
    return a;
}
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float fabsf(float a) { return std::fabs(a); }
inline float rintf(float a) { return std::nearbyint(a); }
inline float roundf(float a) { return std::round(a); }

// Four signed byte products added to c (PTX dp4a.s32.s32).
inline int __dp4a(int a, int b, int c) {
    int s = c;
    for (int i = 0; i < 4; ++i)
        s += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return s;
}

// The inline PTX the kernels use, rewritten by cuda-sim into these calls.
// ld.global.cg.v4.u32 (a 16-byte load that skips L1 on a GPU; p is 16-byte aligned).
inline void sim_ld_global_v4_u32(unsigned& a, unsigned& b, unsigned& c, unsigned& d,
                                 const void* p) {
    unsigned v[4];
    memcpy(v, p, sizeof v);
    a = v[0];
    b = v[1];
    c = v[2];
    d = v[3];
}
inline float sim_cvt_f32_f16(unsigned short h) {
    const unsigned sign = (unsigned)(h >> 15) << 31;
    const unsigned exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    unsigned bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);  // inf, quiet NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {
        float f = (float)man * 5.9604644775390625e-8f;  // man * 2^-24, exact
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// f32 -> f16, round to nearest even, overflow to infinity, NaN stays NaN (cvt.rn.f16.f32).
inline unsigned short sim_cvt_rn_f16_f32(float f) {
    unsigned x;
    memcpy(&x, &f, sizeof x);
    const unsigned sign = (x >> 16) & 0x8000u;
    const unsigned ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to >= 65520
    if (ax < 0x38800000u) {
        // Subnormal or zero in f16: scale so that one f16 ulp (2^-24) is 1, round once.
        const float a = std::fabs(f) * 16777216.0f;
        return (unsigned short)(sign | (unsigned)std::nearbyint(a));
    }
    const unsigned e = ((ax >> 23) - 112) << 10;
    const unsigned m = ax & 0x7fffffu;
    unsigned h = e | (m >> 13);
    const unsigned rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
    return (unsigned short)(sign | h);
}
