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
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "sim_abi.h"

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
};

struct SimCtx {
    int device;
};
struct SimStream {
    int unused;
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
    std::string name;
};

typedef SimCtx* CUcontext;
typedef SimStream* CUstream;
typedef SimEvent* CUevent;
typedef SimModule* CUmodule;
typedef SimFunction* CUfunction;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kAlign = 256;
constexpr unsigned char kCanary = 0xa5;
// What the emulated device reports: an Orin-class part (sm_87), 16 GiB.
constexpr int kMajor = 8, kMinor = 7;
constexpr size_t kTotalMem = 16ull << 30;
const char* const kName = "InferLoop CUDA emulator (host CPU, not a GPU)";

struct Alloc {
    char* map;       // the whole mapping, guard pages included
    size_t map_len;
    char* data;      // first data page
    size_t data_len; // data pages only
    size_t size;     // what was asked for
    uint64_t serial;
};

std::mutex mu;
std::map<uintptr_t, Alloc> allocs;  // by device address (the start of what was asked for)
uint64_t next_serial = 1;
size_t in_use = 0;
bool initialised = false;
SimCtx primary{0};
thread_local CUcontext current = nullptr;
thread_local sim_where where{nullptr, {0, 0, 0}, {0, 0, 0}};

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
    if (a) {
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
    return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) {
    (void)flags;
    std::lock_guard<std::mutex> g(mu);
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
    *v = 12020;
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
    snprintf(name, (size_t)len, "%s", kName);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = kTotalMem;
    return CUDA_SUCCESS;
}

// Attribute numbers are CUdevice_attribute's.
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
        case 1: *v = 1024; break;              // max threads per block
        case 2: *v = 1024; break;              // max block dim x
        case 3: *v = 1024; break;              // y
        case 4: *v = 64; break;                // z
        case 5: *v = 2147483647; break;        // max grid dim x
        case 6: *v = 65535; break;             // y
        case 7: *v = 65535; break;             // z
        case 8: *v = 48 * 1024; break;         // shared memory per block
        case 10: *v = 32; break;               // warp size
        case 16: *v = 1; break;                // multiprocessors
        case 38: *v = 4 << 20; break;          // L2 cache bytes (an Orin NX's 4 MiB)
        case 75: *v = kMajor; break;           // compute capability major
        case 76: *v = kMinor; break;           // minor
        case 115: *v = 0; break;               // memory pools: no, cuMemAlloc instead
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

CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = 0;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* s, unsigned flags) {
    (void)flags;
    *s = new SimStream{0};
    return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream* s, unsigned flags, int priority) {
    (void)priority;
    return cuStreamCreate(s, flags);
}

CUresult cuStreamDestroy_v2(CUstream s) {
    delete s;
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned) { return CUDA_SUCCESS; }

CUresult cuStreamIsCapturing(CUstream, int* status) {
    *status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* e, unsigned flags) {
    (void)flags;
    *e = new SimEvent{std::chrono::steady_clock::now(), false};
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream) {
    e->at = std::chrono::steady_clock::now();
    e->recorded = true;
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }

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
    *total = kTotalMem;
    *free_bytes = in_use < kTotalMem ? kTotalMem - in_use : 0;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t size) {
    if (CUresult r = need_init()) return r;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> g(mu);
    if (size > kTotalMem - in_use) return CUDA_ERROR_OUT_OF_MEMORY;
    // [guard][data pages: canary, the buffer, canary][guard]; the buffer ends as late as
    // its 256-byte aligned start allows.
    const size_t data_len = (size + kAlign - 1 + kPage - 1) / kPage * kPage;
    const size_t map_len = data_len + 2 * kPage;
    void* m = mmap(nullptr, map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    char* data = (char*)m + kPage;
    if (mprotect(data, data_len, PROT_READ | PROT_WRITE) != 0) {
        munmap(m, map_len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const uintptr_t start = ((uintptr_t)data + data_len - size) / kAlign * kAlign;
    memset(data, kCanary, data_len);
    // Fresh device memory is not zero on a GPU either; a pattern makes reading it before
    // writing it visible.
    memset((void*)start, 0xcd, size);
    allocs[start] = Alloc{(char*)m, map_len, data, data_len, size, next_serial++};
    in_use += size;
    *p = start;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    std::lock_guard<std::mutex> g(mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) {
        say("cuMemFree: 0x%llx is not the start of an allocation", p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    in_use -= it->second.size;
    munmap(it->second.map, it->second.map_len);
    allocs.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr* p, size_t size, CUstream) { return cuMemAlloc_v2(p, size); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream) { return cuMemFree_v2(p); }

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
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream) {
    return cuMemcpyHtoD_v2(dst, src, n);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream) {
    return cuMemcpyDtoH_v2(dst, src, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream) {
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
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream) {
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
    if (!e) return CUDA_ERROR_NOT_FOUND;
    *f = new SimFunction{(sim_entry_fn)e, name};
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int* v, int attrib, CUfunction) {
    *v = attrib == 0 ? 1024 : 0;  // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction, int, int) { return CUDA_SUCCESS; }

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream, void** params,
                        void** extra) {
    if (extra) {
        say("cuLaunchKernel(%s): the `extra` argument form is not emulated", f->name.c_str());
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    sim_launch l{{gx, gy, gz}, {bx, by, bz}, shared, where_here};
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
                f->name.c_str(), gx, gy, gz, bx, by, bz, (unsigned long)a.serial, a.size,
                (unsigned long)start);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
    }
    return CUDA_SUCCESS;
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
