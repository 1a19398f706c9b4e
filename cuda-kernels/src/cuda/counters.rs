//! What the CUDA emulator's driver has done since it was loaded: kernel launches, graph
//! launches, bytes copied each way. A real driver has no such record, so on a GPU
//! [`read`] is `None`; on the emulator (`inferloop-cuda-sim`) the counts let a benchmark
//! report launches per decode step without a GPU.

/// The driver's counts (the C struct `sim_counters` of `sim/cpp/sim_abi.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Kernels launched one by one (`cuLaunchKernel` outside a capture).
    pub kernel_launches: u64,
    /// `cuGraphLaunch` calls, each one launch whatever the graph holds.
    pub graph_launches: u64,
    /// Kernels run by graph launches.
    pub graph_kernels: u64,
    pub htod_bytes: u64,
    pub dtoh_bytes: u64,
    pub dtod_bytes: u64,
}

impl Counters {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            kernel_launches: self.kernel_launches - earlier.kernel_launches,
            graph_launches: self.graph_launches - earlier.graph_launches,
            graph_kernels: self.graph_kernels - earlier.graph_kernels,
            htod_bytes: self.htod_bytes - earlier.htod_bytes,
            dtoh_bytes: self.dtoh_bytes - earlier.dtoh_bytes,
            dtod_bytes: self.dtod_bytes - earlier.dtod_bytes,
        }
    }
}

/// The counts of the whole process on the loaded `libcuda.so.1` when it is the emulator's;
/// `None` on a real driver or with none loaded (call it after a GPU was opened).
pub fn read() -> Option<Counters> {
    read_symbol(b"inferloop_sim_counters\0")
}

/// [`read`] for what the calling thread did alone (tests running side by side in one
/// process each see their own launches).
pub fn read_thread() -> Option<Counters> {
    read_symbol(b"inferloop_sim_thread_counters\0")
}

fn read_symbol(symbol: &[u8]) -> Option<Counters> {
    if !super::driver_present() {
        return None;
    }
    // SAFETY: libcuda.so.1 is already loaded by cudarc (opening it again only takes a
    // reference); the symbol, where present, is the emulator's
    // `void f(sim_counters*)`, which writes the struct mirrored above.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1").ok()?;
        let f: libloading::Symbol<unsafe extern "C" fn(*mut Counters)> = lib.get(symbol).ok()?;
        let mut c = Counters::default();
        f(&mut c);
        Some(c)
    }
}
