//! The GPU side: finding a CUDA device without panicking, loading every kernel for its
//! architecture, and handing out functions to launch. Launch wrappers live beside this
//! module, one file per group of kernels; each has a CPU twin in [`crate::cpu`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use crate::kernels::SOURCES;
use crate::nvrtc::{self, CompileError};

pub use cudarc;

pub mod ops;
pub mod q8;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver found: libcuda.so.1 cannot be loaded (no NVIDIA driver on this machine, or not on the library path)")]
    NoDriver,
    #[error("no CUDA device {ordinal}: {source}")]
    NoDevice { ordinal: usize, source: DriverError },
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("cannot read PTX {path}: {source}")]
    Ptx {
        path: String,
        source: std::io::Error,
    },
    #[error("no kernel {entry} in module {module}")]
    NoKernel { module: String, entry: String },
}

/// Whether libcuda can be loaded (cudarc panics on first use when it cannot).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One CUDA device with every kernel module loaded.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// Compute capability, e.g. (8, 7) on Orin.
    pub capability: (i32, i32),
    pub name: String,
    /// Streaming multiprocessors (8 on an Orin NX, 132 on an H200): grids are sized from it.
    pub sm_count: usize,
    /// L2 cache bytes: benchmarks that mean to read DRAM cycle through more than this.
    pub l2_bytes: usize,
    modules: HashMap<&'static str, Arc<CudaModule>>,
}

impl Gpu {
    /// Opens device `ordinal` and compiles every kernel for its architecture with the
    /// device's own NVRTC.
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        Self::open_with(ordinal, |name, code, arch| {
            Ok(nvrtc::compile(name, code, arch, &[])?)
        })
    }

    /// Opens device `ordinal` and loads `<dir>/<kernel>.ptx` for every kernel through the
    /// driver alone (no NVRTC needed; a newer driver JIT-compiles older PTX).
    pub fn open_with_ptx(ordinal: usize, dir: &Path) -> Result<Self, GpuError> {
        Self::open_with(ordinal, |name, _, _| {
            let path = dir.join(format!("{name}.ptx"));
            let text = std::fs::read_to_string(&path).map_err(|source| GpuError::Ptx {
                path: path.display().to_string(),
                source,
            })?;
            Ok(Ptx::from_src(text))
        })
    }

    fn open_with(
        ordinal: usize,
        mut ptx: impl FnMut(&'static str, &'static str, &'static str) -> Result<Ptx, GpuError>,
    ) -> Result<Self, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|source| GpuError::NoDevice { ordinal, source })?;
        let capability = ctx.compute_capability()?;
        let name = ctx.name()?;
        let attr =
            |a| -> Result<usize, GpuError> { Ok(usize::try_from(ctx.attribute(a)?).unwrap_or(0)) };
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1);
        let l2_bytes = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
        let arch = nvrtc::arch_name(capability.0, capability.1);
        let mut modules = HashMap::new();
        for s in SOURCES {
            let module = ctx.load_module(ptx(s.name, s.code, arch)?)?;
            modules.insert(s.name, module);
        }
        let stream = ctx.default_stream();
        Ok(Self {
            ctx,
            stream,
            capability,
            name,
            sm_count,
            l2_bytes,
            modules,
        })
    }

    /// The kernel `entry` of module `module` (a [`SOURCES`] name).
    pub fn function(&self, module: &str, entry: &str) -> Result<CudaFunction, GpuError> {
        let no_kernel = || GpuError::NoKernel {
            module: module.to_string(),
            entry: entry.to_string(),
        };
        let m = self.modules.get(module).ok_or_else(no_kernel)?;
        m.load_function(entry).map_err(|_| no_kernel())
    }
}

/// The name of CUDA device `ordinal`, without compiling or loading any kernel: for deciding
/// whether a GPU is there before [`Gpu::open`] does the (slower) real work once.
pub fn probe(ordinal: usize) -> Result<String, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    let ctx = CudaContext::new(ordinal).map_err(|source| GpuError::NoDevice { ordinal, source })?;
    Ok(ctx.name()?)
}

/// Environment variable naming a directory of precompiled `<kernel>.ptx` files: set where
/// the device's NVRTC is not the one this build loads (e.g. CUDA 13 with a CUDA 12 build).
pub const PTX_DIR_ENV: &str = "INFERLOOP_KERNELS_PTX";

impl Gpu {
    /// [`Gpu::open_with_ptx`] when [`PTX_DIR_ENV`] is set, else [`Gpu::open`].
    pub fn open_default(ordinal: usize) -> Result<Self, GpuError> {
        match std::env::var_os(PTX_DIR_ENV) {
            Some(dir) => Self::open_with_ptx(ordinal, Path::new(&dir)),
            None => Self::open(ordinal),
        }
    }
}

/// A GPU for tests, or `None` with the reason printed (the test then checks nothing on the
/// GPU and says so).
pub fn test_gpu() -> Option<Gpu> {
    match Gpu::open_default(0) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("GPU test skipped: {e}");
            None
        }
    }
}

/// Device-to-device copy bandwidth in GB/s (bytes read plus written) over `bytes`, best of
/// `reps`: the ceiling a GPU kernel's throughput is read against.
pub fn copy_gbps(gpu: &Gpu, bytes: usize, reps: usize) -> Result<f64, GpuError> {
    let src = gpu.stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = gpu.stream.alloc_zeros::<u8>(bytes)?;
    let mut fastest = f64::INFINITY;
    for _ in 0..reps.max(1) + 1 {
        gpu.stream.synchronize()?;
        let t = std::time::Instant::now();
        gpu.stream.memcpy_dtod(&src, &mut dst)?;
        gpu.stream.synchronize()?;
        fastest = fastest.min(t.elapsed().as_secs_f64());
    }
    Ok(2.0 * bytes as f64 / fastest / 1e9)
}
