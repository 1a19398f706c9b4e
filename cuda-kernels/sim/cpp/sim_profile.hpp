// The device the emulator says it is: INFERLOOP_SIM_PROFILE=orin-nx (the default, the
// mission's box) or h200 (the lent test machine). Code that sizes grids from the SM count or
// the L2, or picks shared memory from the opt-in limit, sees the numbers it would see there.
// Figures are those cuDeviceGetAttribute reports on each part (deviceQuery); the Orin NX's
// L2 is the 16 GB module's. The emulator still runs every block on the host CPU: the
// profile shapes what the host side decides, not how fast anything runs.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

struct SimProfile {
    const char* name;
    int major, minor;
    int sm_count;
    int l2_bytes;
    size_t total_mem;
    int max_threads_per_block;
    int max_threads_per_sm;
    int max_blocks_per_sm;
    int shared_per_block;        // without opting in
    int shared_per_block_optin;  // cuFuncSetAttribute's ceiling
    int shared_per_sm;
    int regs_per_block, regs_per_sm;
    int clock_khz, memory_clock_khz, bus_width_bits;
    int integrated;              // 1: shares the CPU's memory (Jetson)
    int driver_version;          // cuDriverGetVersion: what the box runs
};

inline const SimProfile kSimProfiles[] = {
    // Jetson Orin NX 16 GB, JetPack 6.0 (CUDA 12.2): 8 SMs of sm_87, 2 MiB L2.
    {"orin-nx", 8, 7, 8, 2 << 20, 16ull << 30, 1024, 1536, 16, 48 << 10, 163 << 10, 164 << 10,
     65536, 65536, 918000, 3199000, 128, 1, 12020},
    // H200 (SXM, 141 GB HBM3e), CUDA 13 driver: 132 SMs of sm_90, 50 MiB L2.
    {"h200", 9, 0, 132, 50 << 20, 143771ull << 20, 1024, 2048, 32, 48 << 10, 227 << 10,
     228 << 10, 65536, 65536, 1980000, 3201000, 6144, 0, 13000},
};

// The profile INFERLOOP_SIM_PROFILE names (default orin-nx), or null for an unknown name.
inline const SimProfile* sim_profile() {
    const char* want = getenv("INFERLOOP_SIM_PROFILE");
    if (!want || !*want) want = "orin-nx";
    for (const SimProfile& p : kSimProfiles)
        if (strcmp(p.name, want) == 0) return &p;
    return nullptr;
}
