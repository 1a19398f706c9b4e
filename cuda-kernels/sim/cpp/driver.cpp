// libcuda_sim.so: the part of the CUDA driver API that cudarc calls, on the host CPU, so that
// the crate's launch wrappers, the kernels (compiled for the host by `cuda-sim`, see
// cuda_sim.hpp) and the daemon's CUDA forward pass run on a machine without a GPU. Installed
// as libcuda.so.1 in a directory that tests put first on LD_LIBRARY_PATH.
//
// Device memory is host memory: each allocation has its own mapping, starts 256-byte aligned
// as cuMemAlloc's do and ends as close to an inaccessible page as that allows; the bytes
// around it are a canary checked after every launch. So a kernel that reads or writes past
// its buffer faults with a message naming the kernel, block, thread and allocation, or its
// launch fails naming the corrupted allocation. Work on a stream runs at once (every stream
// is synchronous), which is one valid order of a CUDA program's work.
//
// What a GPU does differently and is modelled here: the device's limits come from a profile
// (sim_profile.hpp: INFERLOOP_SIM_PROFILE=orin-nx, the default, or h200); memory pools are
// reported supported, as on both parts, so cudarc allocates with cuMemAllocAsync and frees
// with cuMemFreeAsync into the device's default pool, which hands the same addresses out
// again (a freed block is inaccessible until then, so a use after free faults) and gives
// memory back at synchronisation above its release threshold, as a real pool does.
//
// Stream capture records a stream's launches instead of running them (their arguments
// copied by value, as a real graph keeps them); a graph launch replays them in order and
// counts as one launch. The driver counts kernel launches, graph launches and bytes copied
// (inferloop_sim_counters), so the host side's launches per step can be measured here.
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sim_abi.h"
#include "sim_profile.hpp"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum : CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_ILLEGAL_STATE = 401,
};

struct SimFunction;
struct SimGraph;

struct SimCtx {
    int device;
};
struct SimStream {
    // The graph being captured, or null; set when an uncapturable call met the capture.
    SimGraph* capture;
    bool invalidated;
};
struct SimEvent {
    std::chrono::steady_clock::time_point at;
    bool recorded;
};
struct SimModule {
    void* handle;
    std::string path;
};
struct SimFunction {
    sim_entry_fn entry;
    sim_args_fn args;
    std::string name;
};
// One captured launch: its arguments' bytes, one buffer each.
struct SimNode {
    SimFunction* f;
    unsigned grid[3], block[3], shared;
    std::vector<std::vector<char>> args;
};
struct SimGraph {
    std::vector<SimNode> nodes;
};
struct SimGraphExec {
    std::vector<SimNode> nodes;
};

typedef SimCtx* CUcontext;
typedef SimStream* CUstream;
typedef SimEvent* CUevent;
typedef SimModule* CUmodule;
typedef SimFunction* CUfunction;
typedef SimGraph* CUgraph;
typedef SimGraphExec* CUgraphExec;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kAlign = 256;
constexpr unsigned char kCanary = 0xa5;
// The emulated device's limits: INFERLOOP_SIM_PROFILE's, or the default's when that names
// no profile (cuInit then fails, saying so).
const SimProfile& prof() {
    static const SimProfile* p = sim_profile();
    return p ? *p : kSimProfiles[0];
}

struct Alloc {
    char* map;       // the whole mapping, guard pages included
    size_t map_len;
    char* data;      // first data page
    size_t data_len; // data pages only
    size_t size;     // what was asked for
    uint64_t serial;
    bool pooled;     // from cuMemAllocAsync: goes back to the pool when freed
};

// The device's default memory pool: freed blocks by their data length, kept mapped but
// inaccessible until an allocation of that length takes one back.
struct SimPool {
    uint64_t release_threshold = 0;
    int reuse[3] = {1, 1, 1};  // CU_MEMPOOL_ATTR_REUSE_*: accepted, all reuse is immediate
    uint64_t reserved = 0, reserved_high = 0, used = 0, used_high = 0;
    std::multimap<size_t, Alloc> free_blocks;
};
typedef SimPool* CUmemoryPool;

std::mutex mu;
std::map<uintptr_t, Alloc> allocs;  // by device address (the start of what was asked for)
uint64_t next_serial = 1;
size_t in_use = 0;
SimPool pool;
bool initialised = false;
SimCtx primary{0};
thread_local CUcontext current = nullptr;
thread_local sim_where where{nullptr, {0, 0, 0}, {0, 0, 0}};
// The counts of the whole process, and of each calling OS thread (tests that run side by side
// in one process each read their own).
sim_counters totals{};
std::mutex totals_mu;
thread_local sim_counters mine{};

void count(unsigned long long sim_counters::*field, unsigned long long n) {
    mine.*field += n;
    std::lock_guard<std::mutex> g(totals_mu);
    totals.*field += n;
}

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda-sim: %s\n", buf);
}

// The allocation holding [p, p + n), or null.
const Alloc* find(uintptr_t p, size_t n) {
    auto it = allocs.upper_bound(p);
    if (it == allocs.begin()) return nullptr;
    --it;
    const uintptr_t start = it->first;
    if (p < start || p + n > start + it->second.size || p + n < p) return nullptr;
    return &it->second;
}

// The allocation whose mapping (guards included) holds p, or null.
const Alloc* find_mapping(uintptr_t p) {
    for (const auto& [start, a] : allocs)
        if (p >= (uintptr_t)a.map && p < (uintptr_t)a.map + a.map_len) return &a;
    return nullptr;
}

void on_fault(int sig, siginfo_t* info, void*) {
    char buf[512];
    const uintptr_t p = (uintptr_t)info->si_addr;
    const Alloc* a = find_mapping(p);
    int n;
    const Alloc* freed = nullptr;
    for (const auto& [len, b] : pool.free_blocks)
        if (p >= (uintptr_t)b.map && p < (uintptr_t)b.map + b.map_len) freed = &b;
    if (!a && freed) {
        n = snprintf(buf, sizeof buf,
                     "cuda-sim: illegal address 0x%lx in kernel %s, block (%u,%u,%u) thread "
                     "(%u,%u,%u): inside allocation #%lu (%zu bytes), already freed to the "
                     "memory pool (use after cuMemFreeAsync)\n",
                     (unsigned long)p, where.kernel ? where.kernel : "(host code)",
                     where.block.x, where.block.y, where.block.z, where.thread.x,
                     where.thread.y, where.thread.z, (unsigned long)freed->serial, freed->size);
    } else if (a) {
        const uintptr_t start = (uintptr_t)a->data + (a->data_len - a->size) / kAlign * kAlign;
        n = snprintf(buf, sizeof buf,
                     "cuda-sim: illegal address 0x%lx in kernel %s, block (%u,%u,%u) thread "
                     "(%u,%u,%u): %ld bytes from the start of allocation #%lu (%zu bytes)\n",
                     (unsigned long)p, where.kernel ? where.kernel : "(none)", where.block.x,
                     where.block.y, where.block.z, where.thread.x, where.thread.y, where.thread.z,
                     (long)(p - start), (unsigned long)a->serial, a->size);
    } else {
        n = snprintf(buf, sizeof buf,
                     "cuda-sim: fault at 0x%lx (kernel %s, block (%u,%u,%u) thread (%u,%u,%u))\n",
                     (unsigned long)p, where.kernel ? where.kernel : "(host code)", where.block.x,
                     where.block.y, where.block.z, where.thread.x, where.thread.y, where.thread.z);
    }
    if (n > 0) (void)!write(2, buf, (size_t)n);
    signal(sig, SIG_DFL);
    raise(sig);
}

sim_where* where_here() { return &where; }

bool canaries_intact(const Alloc& a, uintptr_t start) {
    const char* lo = a.data;
    const char* hi = a.data + a.data_len;
    for (const char* c = lo; c < (const char*)start; ++c)
        if ((unsigned char)*c != kCanary) return false;
    for (const char* c = (const char*)start + a.size; c < hi; ++c)
        if ((unsigned char)*c != kCanary) return false;
    return true;
}

CUresult need_init() { return initialised ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

// Places a buffer of `size` bytes in the data pages of `a`: as late as its 256-byte aligned
// start allows, canaries around it, the fresh-memory pattern inside.
uintptr_t place(Alloc& a, size_t size) {
    const uintptr_t start = ((uintptr_t)a.data + a.data_len - size) / kAlign * kAlign;
    memset(a.data, kCanary, a.data_len);
    // Fresh device memory is not zero on a GPU either; a pattern makes reading it before
    // writing it visible. (A real pool hands back the old bytes; the pattern is stricter.)
    memset((void*)start, 0xcd, size);
    a.size = size;
    a.serial = next_serial++;
    return start;
}

size_t data_len_for(size_t size) { return (size + kAlign - 1 + kPage - 1) / kPage * kPage; }

// Gives freed pool blocks back to the system until the pool reserves at most `keep` bytes.
void trim_pool(uint64_t keep) {
    for (auto it = pool.free_blocks.begin(); it != pool.free_blocks.end() && pool.reserved > keep;) {
        munmap(it->second.map, it->second.map_len);
        pool.reserved -= it->first;
        it = pool.free_blocks.erase(it);
    }
}

// What a synchronisation does to the pool: memory above the release threshold goes back.
void pool_sync() {
    std::lock_guard<std::mutex> g(mu);
    trim_pool(pool.release_threshold);
}

size_t pool_idle_bytes() { return pool.reserved - pool.used; }

CUresult copy(uintptr_t dst, bool dst_dev, uintptr_t src, bool src_dev, size_t n,
              const char* what) {
    if (n == 0) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> g(mu);
    if (dst_dev && !find(dst, n)) {
        say("%s: destination 0x%lx + %zu bytes is not inside one allocation", what,
            (unsigned long)dst, n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (src_dev && !find(src, n)) {
        say("%s: source 0x%lx + %zu bytes is not inside one allocation", what,
            (unsigned long)src, n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    memmove((void*)dst, (const void*)src, n);
    count(dst_dev ? (src_dev ? &sim_counters::dtod_bytes : &sim_counters::htod_bytes)
                  : &sim_counters::dtoh_bytes,
          n);
    return CUDA_SUCCESS;
}

// A stream that is capturing cannot take a call that is not recorded (a copy, a memset, a
// synchronisation): as on a GPU, the call fails and the capture is invalidated.
CUresult refuse_in_capture(CUstream s, const char* what) {
    if (!s || !s->capture) return CUDA_SUCCESS;
    say("%s on a capturing stream is not emulated: the capture is invalidated", what);
    s->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// Runs one launch now, then checks every allocation's canaries.
CUresult run_kernel(CUfunction f, const unsigned grid[3], const unsigned block[3],
                    unsigned shared, void** params) {
    sim_launch l{{grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, shared, where_here};
    char err[1024] = {0};
    const int rc = f->entry(&l, params, err, sizeof err);
    if (rc != 0) {
        say("launch failed: %s", err);
        return CUDA_ERROR_LAUNCH_FAILED;
    }
    std::lock_guard<std::mutex> g(mu);
    for (const auto& [start, a] : allocs) {
        if (!canaries_intact(a, start)) {
            say("kernel %s (grid %ux%ux%u, block %ux%ux%u) wrote outside allocation #%lu "
                "(%zu bytes at 0x%lx)",
                f->name.c_str(), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                (unsigned long)a.serial, a.size, (unsigned long)start);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
    }
    return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) {
    (void)flags;
    std::lock_guard<std::mutex> g(mu);
    if (!sim_profile()) {
        say("INFERLOOP_SIM_PROFILE=%s names no profile (orin-nx, h200)",
            getenv("INFERLOOP_SIM_PROFILE"));
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!initialised) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, nullptr);
        sigaction(SIGBUS, &sa, nullptr);
        initialised = true;
    }
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
    *v = prof().driver_version;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* n) {
    *n = 1;
    return need_init();
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (CUresult r = need_init()) return r;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "InferLoop CUDA emulator (host CPU, not a GPU; profile %s)",
             prof().name);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = prof().total_mem;
    return CUDA_SUCCESS;
}

// Attribute numbers are CUdevice_attribute's; limits come from the profile.
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    const SimProfile& p = prof();
    switch (attr) {
        case 1: *v = p.max_threads_per_block; break;
        case 2: *v = 1024; break;              // max block dim x
        case 3: *v = 1024; break;              // y
        case 4: *v = 64; break;                // z
        case 5: *v = 2147483647; break;        // max grid dim x
        case 6: *v = 65535; break;             // y
        case 7: *v = 65535; break;             // z
        case 8: *v = p.shared_per_block; break;
        case 9: *v = 64 * 1024; break;         // constant memory
        case 10: *v = 32; break;               // warp size
        case 12: *v = p.regs_per_block; break;
        case 13: *v = p.clock_khz; break;
        case 16: *v = p.sm_count; break;       // multiprocessors
        case 18: *v = p.integrated; break;
        case 19: *v = 1; break;                // can map host memory
        case 36: *v = p.memory_clock_khz; break;
        case 37: *v = p.bus_width_bits; break;
        case 38: *v = p.l2_bytes; break;
        case 39: *v = p.max_threads_per_sm; break;
        case 75: *v = p.major; break;          // compute capability major
        case 76: *v = p.minor; break;          // minor
        case 81: *v = p.shared_per_sm; break;
        case 82: *v = p.regs_per_sm; break;
        case 83: *v = 1; break;                // managed memory
        case 97: *v = p.shared_per_block_optin; break;
        case 106: *v = p.max_blocks_per_sm; break;
        case 115: *v = 1; break;               // memory pools: yes, as on Orin and H200
        default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
    if (CUresult r = need_init()) return r;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *c = &primary;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxSetCurrent(CUcontext c) {
    current = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* c) {
    *c = current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    pool_sync();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = 0;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* s, unsigned flags) {
    (void)flags;
    *s = new SimStream{nullptr, false};
    return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream* s, unsigned flags, int priority) {
    (void)priority;
    return cuStreamCreate(s, flags);
}

CUresult cuStreamDestroy_v2(CUstream s) {
    if (s) delete s->capture;
    delete s;
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
    CUresult r = refuse_in_capture(s, "cuStreamSynchronize");
    if (r == CUDA_SUCCESS) pool_sync();
    return r;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent, unsigned) {
    return refuse_in_capture(s, "cuStreamWaitEvent");
}

CUresult cuStreamIsCapturing(CUstream s, int* status) {
    // CU_STREAM_CAPTURE_STATUS_NONE, _ACTIVE, _INVALIDATED
    *status = !s || !s->capture ? 0 : s->invalidated ? 2 : 1;
    return CUDA_SUCCESS;
}

// Capture of the legacy NULL stream is refused, as CUDA refuses it: a pass that captures
// must run on a stream of its own.
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    (void)mode;
    if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->capture) return CUDA_ERROR_ILLEGAL_STATE;
    s->capture = new SimGraph{};
    s->invalidated = false;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
    if (!s || !s->capture) return CUDA_ERROR_ILLEGAL_STATE;
    SimGraph* graph = s->capture;
    s->capture = nullptr;
    if (s->invalidated) {
        delete graph;
        *g = nullptr;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = graph;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long flags) {
    (void)flags;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    *e = new SimGraphExec{g->nodes};
    return CUDA_SUCCESS;
}

// Replays the captured launches in order, each with the arguments it was captured with.
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = refuse_in_capture(s, "cuGraphLaunch")) return r;
    count(&sim_counters::graph_launches, 1);
    std::vector<void*> params;
    for (SimNode& n : e->nodes) {
        params.clear();
        for (auto& a : n.args) params.push_back(a.data());
        count(&sim_counters::graph_kernels, 1);
        if (CUresult r = run_kernel(n.f, n.grid, n.block, n.shared, params.data())) return r;
    }
    return CUDA_SUCCESS;
}

CUresult cuGraphUpload(CUgraphExec e, CUstream) {
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphExecDestroy(CUgraphExec e) {
    delete e;
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g) {
    delete g;
    return CUDA_SUCCESS;
}

void inferloop_sim_counters(sim_counters* c) {
    std::lock_guard<std::mutex> g(totals_mu);
    *c = totals;
}

void inferloop_sim_thread_counters(sim_counters* c) { *c = mine; }

CUresult cuEventCreate(CUevent* e, unsigned flags) {
    (void)flags;
    *e = new SimEvent{std::chrono::steady_clock::now(), false};
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
    if (CUresult r = refuse_in_capture(s, "cuEventRecord")) return r;
    e->at = std::chrono::steady_clock::now();
    e->recorded = true;
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent) {
    pool_sync();
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
    return cuEventElapsedTime(ms, a, b);
}

CUresult cuEventDestroy_v2(CUevent e) {
    delete e;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> g(mu);
    const size_t total_mem = prof().total_mem, taken = in_use + pool_idle_bytes();
    *total = total_mem;
    *free_bytes = taken < total_mem ? total_mem - taken : 0;
    return CUDA_SUCCESS;
}

namespace {

// [guard][data pages: canary, the buffer, canary][guard]; the buffer ends as late as its
// 256-byte aligned start allows. Pooled allocations first take back a freed block of the
// same data length, at the same place when the size is the same (as a pool does).
CUresult alloc(CUdeviceptr* p, size_t size, bool pooled) {
    if (CUresult r = need_init()) return r;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(mu);
    const size_t total_mem = prof().total_mem;
    if (size > total_mem - in_use) return CUDA_ERROR_OUT_OF_MEMORY;
    const size_t data_len = data_len_for(size);
    Alloc a{};
    auto reuse = pooled ? pool.free_blocks.find(data_len) : pool.free_blocks.end();
    if (reuse != pool.free_blocks.end()) {
        a = reuse->second;
        pool.free_blocks.erase(reuse);
        if (mprotect(a.data, a.data_len, PROT_READ | PROT_WRITE) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        if (data_len > total_mem - in_use - pool_idle_bytes()) trim_pool(0);
        const size_t map_len = data_len + 2 * kPage;
        void* m = mmap(nullptr, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
        char* data = (char*)m + kPage;
        if (mprotect(data, data_len, PROT_READ | PROT_WRITE) != 0) {
            munmap(m, map_len);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        a = Alloc{(char*)m, map_len, data, data_len, 0, 0, pooled};
        if (pooled) {
            pool.reserved += data_len;
            if (pool.reserved > pool.reserved_high) pool.reserved_high = pool.reserved;
        }
    }
    const uintptr_t start = place(a, size);
    if (pooled) {
        pool.used += data_len;
        if (pool.used > pool.used_high) pool.used_high = pool.used;
    }
    allocs[start] = a;
    in_use += size;
    *p = start;
    return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr p, const char* what) {
    std::lock_guard<std::mutex> g(mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) {
        say("%s: 0x%llx is not the start of an allocation", what, p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    Alloc a = it->second;
    in_use -= a.size;
    allocs.erase(it);
    if (!a.pooled) {
        munmap(a.map, a.map_len);
        return CUDA_SUCCESS;
    }
    pool.used -= a.data_len;
    mprotect(a.data, a.data_len, PROT_NONE);
    pool.free_blocks.emplace(a.data_len, a);
    return CUDA_SUCCESS;
}

}  // namespace

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t size) { return alloc(p, size, false); }
CUresult cuMemFree_v2(CUdeviceptr p) { return release(p, "cuMemFree"); }
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t size, CUstream) { return alloc(p, size, true); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream) { return release(p, "cuMemFreeAsync"); }

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t size, CUmemoryPool mp, CUstream s) {
    if (mp != &pool) return CUDA_ERROR_INVALID_VALUE;
    return cuMemAllocAsync(p, size, s);
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* mp, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *mp = &pool;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool* mp, CUdevice d) { return cuDeviceGetDefaultMemPool(mp, d); }

// Attribute numbers are CUmemPool_attribute's: 1-3 int reuse flags, 4-8 cuuint64_t.
CUresult cuMemPoolGetAttribute(CUmemoryPool mp, int attr, void* v) {
    if (mp != &pool || !v) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(mu);
    uint64_t* u = (uint64_t*)v;
    switch (attr) {
        case 1: case 2: case 3: *(int*)v = pool.reuse[attr - 1]; break;
        case 4: *u = pool.release_threshold; break;
        case 5: *u = pool.reserved; break;
        case 6: *u = pool.reserved_high; break;
        case 7: *u = pool.used; break;
        case 8: *u = pool.used_high; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool mp, int attr, void* v) {
    if (mp != &pool || !v) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(mu);
    const uint64_t u = *(uint64_t*)v;
    switch (attr) {
        case 1: case 2: case 3: pool.reuse[attr - 1] = *(int*)v; break;
        case 4: pool.release_threshold = u; break;
        // Only a reset to zero is allowed: the high marks restart from the current figure.
        case 6: if (u != 0) return CUDA_ERROR_INVALID_VALUE; pool.reserved_high = pool.reserved; break;
        case 8: if (u != 0) return CUDA_ERROR_INVALID_VALUE; pool.used_high = pool.used; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool mp, size_t keep) {
    if (mp != &pool) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(mu);
    trim_pool(keep);
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void** p, size_t size, unsigned flags) {
    (void)flags;
    *p = malloc(size ? size : 1);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void* p) {
    free(p);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    return copy((uintptr_t)dst, true, (uintptr_t)src, false, n, "cuMemcpyHtoD");
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    return copy((uintptr_t)dst, false, (uintptr_t)src, true, n, "cuMemcpyDtoH");
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy((uintptr_t)dst, true, (uintptr_t)src, true, n, "cuMemcpyDtoD");
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
    if (CUresult r = refuse_in_capture(s, "cuMemcpyHtoDAsync")) return r;
    return cuMemcpyHtoD_v2(dst, src, n);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
    if (CUresult r = refuse_in_capture(s, "cuMemcpyDtoHAsync")) return r;
    return cuMemcpyDtoH_v2(dst, src, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    if (CUresult r = refuse_in_capture(s, "cuMemcpyDtoDAsync")) return r;
    return cuMemcpyDtoD_v2(dst, src, n);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    if (n == 0) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> g(mu);
    if (!find((uintptr_t)dst, n)) {
        say("cuMemsetD8: 0x%llx + %zu bytes is not inside one allocation", dst, n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset((void*)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
    if (CUresult r = refuse_in_capture(s, "cuMemsetD8Async")) return r;
    return cuMemsetD8_v2(dst, v, n);
}

// A module is a marker text written by cuda-sim in place of PTX:
//   //inferloop-cuda-sim <path of the module's shared object>
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    static const char kTag[] = "//inferloop-cuda-sim ";
    const char* text = (const char*)image;
    if (strncmp(text, kTag, sizeof kTag - 1) != 0) {
        say("cuModuleLoadData: not a cuda-sim module (real PTX needs a real GPU; point "
            "INFERLOOP_KERNELS_PTX at cuda-sim's modules directory)");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    std::string path(text + sizeof kTag - 1);
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r' || path.back() == ' '))
        path.pop_back();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        say("cuModuleLoadData: %s", dlerror());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    *m = new SimModule{h, path};
    return CUDA_SUCCESS;
}

// Modules stay mapped: their thread-local shared arrays may still belong to live threads.
CUresult cuModuleUnload(CUmodule m) {
    delete m;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    const std::string sym = std::string("sim_entry_") + name;
    void* e = dlsym(m->handle, sym.c_str());
    void* a = dlsym(m->handle, (std::string("sim_args_") + name).c_str());
    if (!e || !a) return CUDA_ERROR_NOT_FOUND;
    *f = new SimFunction{(sim_entry_fn)e, (sim_args_fn)a, name};
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int* v, int attrib, CUfunction) {
    *v = attrib == 0 ? 1024 : 0;  // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction, int, int) { return CUDA_SUCCESS; }

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream s, void** params,
                        void** extra) {
    if (extra) {
        say("cuLaunchKernel(%s): the `extra` argument form is not emulated", f->name.c_str());
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    if (s && s->capture) {
        // Recorded, not run: the arguments' bytes as they are now.
        SimNode n{f, {gx, gy, gz}, {bx, by, bz}, shared, {}};
        size_t sizes[64];
        const size_t count = f->args(sizes, 64);
        if (count > 64) {
            say("cuLaunchKernel(%s): %zu parameters, more than capture keeps", f->name.c_str(),
                count);
            s->invalidated = true;
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        for (size_t i = 0; i < count; ++i)
            n.args.emplace_back((const char*)params[i], (const char*)params[i] + sizes[i]);
        s->capture->nodes.push_back(std::move(n));
        return CUDA_SUCCESS;
    }
    count(&sim_counters::kernel_launches, 1);
    return run_kernel(f, grid, block, shared, params);
}

CUresult cuGetErrorName(CUresult e, const char** s) {
    switch (e) {
        case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
        case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
        case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
        case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
        case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
        case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
        case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
        case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
        case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
        default: *s = "CUDA_ERROR_UNKNOWN"; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult e, const char** s) {
    cuGetErrorName(e, s);
    return CUDA_SUCCESS;
}

}  // extern "C"
