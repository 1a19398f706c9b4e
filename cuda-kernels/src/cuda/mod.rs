//! The GPU side: finding a CUDA device without panicking, loading every kernel for its
//! architecture, and handing out functions to launch. Launch wrappers live beside this
//! module, one file per group of kernels; each has a CPU twin in [`crate::cpu`].

use std::collections::HashMap;
use std::sync::Arc;

use crate::kernels::SOURCES;
use crate::nvrtc::CompileError;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};

pub use cudarc;
pub use load::{KernelsFrom, ModuleSource, Origin, KERNELS_DIR_ENV, PTX_DIR_ENV};

pub mod counters;
pub mod fused;
pub mod layer;
pub mod load;
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
    #[error("cannot read kernel module {module} from {path}: {source}")]
    ModuleFile {
        module: String,
        path: String,
        source: std::io::Error,
    },
    #[error("kernel module {module} ({origin} {detail}) does not load: {source}")]
    ModuleLoad {
        module: String,
        origin: &'static str,
        detail: String,
        source: DriverError,
    },
    #[error("no kernel module {module}: no cubin or PTX for it in the kernels dir ({}) and {source}", dir.as_deref().unwrap_or("none found"))]
    NoModule {
        module: String,
        dir: Option<String>,
        source: Box<CompileError>,
    },
    #[error("{KERNELS_DIR_ENV}={path} is not a directory")]
    KernelsDir { path: String },
    #[error("no kernel {entry} in module {module}")]
    NoKernel { module: String, entry: String },
}

/// Whether libcuda can be loaded (cudarc panics on first use when it cannot).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// `cuDriverGetVersion`: 12020 for CUDA 12.2. Call only once [`driver_present`].
pub fn driver_version() -> Result<i32, GpuError> {
    let mut v = 0;
    // SAFETY: writes one int; the library was found.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

/// One CUDA device with every kernel module loaded.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// Compute capability, e.g. (8, 7) on Orin.
    pub capability: (i32, i32),
    pub name: String,
    /// `cuDriverGetVersion`, e.g. 12020.
    pub driver_version: i32,
    /// Where each kernel module came from (cubin, PTX, NVRTC).
    pub kernels: KernelsFrom,
    /// Streaming multiprocessors (8 on an Orin NX, 132 on an H200): grids are sized from it.
    pub sm_count: usize,
    /// L2 cache bytes: benchmarks that mean to read DRAM cycle through more than this.
    pub l2_bytes: usize,
    modules: HashMap<&'static str, Arc<CudaModule>>,
}

impl Gpu {
    /// Opens device `ordinal` and loads every kernel module, each from the first of
    /// [`load`]'s sources that has it, logging where they came from.
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
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
        let target = load::Target {
            capability,
            driver: driver_version()?,
        };
        let dir = load::kernels_dir()?;
        let override_dir = load::ptx_override();
        let mut kernels = KernelsFrom {
            dir: dir.clone(),
            modules: Vec::new(),
        };
        let mut modules = HashMap::new();
        for s in SOURCES {
            let (ptx, from) = load::module(
                s.name,
                s.code,
                &target,
                override_dir.as_deref(),
                dir.as_deref(),
            )?;
            let module = ctx
                .load_module(ptx)
                .map_err(|source| GpuError::ModuleLoad {
                    module: s.name.to_string(),
                    origin: from.origin.as_str(),
                    detail: from.detail.clone(),
                    source,
                })?;
            tracing::debug!(module = s.name, origin = from.origin.as_str(), detail = %from.detail, "kernel module loaded");
            modules.insert(s.name, module);
            kernels.modules.push(from);
        }
        tracing::info!(gpu = %name, sm = format!("{}.{}", capability.0, capability.1), driver = target.driver, kernels = %kernels.summary(), "kernels loaded");
        let stream = ctx.default_stream();
        Ok(Self {
            ctx,
            stream,
            capability,
            name,
            driver_version: target.driver,
            kernels,
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

impl Gpu {
    /// [`Gpu::open`]; the name the daemon and tools have always called.
    pub fn open_default(ordinal: usize) -> Result<Self, GpuError> {
        Self::open(ordinal)
    }
}

/// Set to `1` (the device check and the emulator run do) and [`test_gpu`] panics instead of
/// skipping: there, a GPU test that cannot open the GPU is a failure.
pub const REQUIRE_GPU_ENV: &str = "INFERLOOP_REQUIRE_GPU";

/// What [`test_gpu`] prints when it hands out a GPU, followed by the test's name: the
/// device check counts these lines against the GPU tests it listed.
pub const GPU_TEST_MARK: &str = "GPU test ran:";

/// A GPU for tests, or `None` with the reason printed (the test then checks nothing on the
/// GPU and says so). With [`REQUIRE_GPU_ENV`]`=1` no GPU is a panic naming the reason.
pub fn test_gpu() -> Option<Gpu> {
    let required = std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1");
    match Gpu::open(0) {
        Ok(g) => {
            let test = std::thread::current().name().unwrap_or("?").to_string();
            eprintln!("{GPU_TEST_MARK} {test} on {}", g.name);
            Some(g)
        }
        Err(e) if required => panic!("{REQUIRE_GPU_ENV}=1 and the GPU does not open: {e}"),
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
