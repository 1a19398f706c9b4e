// What libcuda_sim.so and an emulated kernel module share: one launch's geometry, and where
// the launch is (for the message when a kernel touches memory it does not own).
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct sim_idx {
    unsigned x, y, z;
};

// One per OS thread, updated by the module as it switches blocks and threads; read by the
// driver's fault handler on the thread that faulted.
struct sim_where {
    const char* kernel;
    struct sim_idx block;
    struct sim_idx thread;
};

struct sim_launch {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
    // The calling OS thread's sim_where in the driver (each thread that runs blocks asks).
    struct sim_where* (*where_here)(void);
};

// Exported by a module once per kernel, as sim_entry_<kernel>: 0, or 1 with a message.
typedef int (*sim_entry_fn)(const struct sim_launch* l, void** params, char* err,
                            size_t err_len);

// Exported beside it as sim_args_<kernel>: the kernel's parameter count, and the size of each
// (up to max) in sizes, so that stream capture can copy a launch's arguments by value.
typedef size_t (*sim_args_fn)(size_t* sizes, size_t max);

// What the driver has done since it was loaded, read with the driver's exported
// inferloop_sim_counters, or by the calling OS thread with inferloop_sim_thread_counters (a
// real libcuda has neither symbol). Kernels replayed by a graph
// launch count as graph_kernels, not as kernel_launches; copies count their bytes.
struct sim_counters {
    unsigned long long kernel_launches;
    unsigned long long graph_launches;
    unsigned long long graph_kernels;
    unsigned long long htod_bytes;
    unsigned long long dtoh_bytes;
    unsigned long long dtod_bytes;
};

#ifdef __cplusplus
}
#endif
