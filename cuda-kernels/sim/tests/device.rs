//! What the emulator reports about the device, as a real part would: its limits from a
//! profile (`INFERLOOP_SIM_PROFILE`), and memory pools, so that cudarc allocates with
//! `cuMemAllocAsync` into a pool that hands addresses out again and gives memory back at
//! synchronisation above its release threshold.
//!
//! Each case runs in a child process (this test binary again) whose libcuda is the
//! emulator's, with the profile in its environment.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use inferloop_cuda_sim::{self as sim, Built};

const CASE_ENV: &str = "INFERLOOP_SIM_DEVICE_CASE";

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-sim-device");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        sim::build_with(&out, &cxx, &[]).unwrap_or_else(|e| panic!("building the emulator: {e}"))
    })
}

/// Runs `case` in a child on the emulator with `profile` (None: the default); its output.
fn run(case: &str, profile: Option<&str>) -> (bool, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child", "--ignored", "--nocapture"])
        .env(CASE_ENV, case)
        .env("LD_LIBRARY_PATH", &built().lib_dir)
        .env_remove("INFERLOOP_SIM_PROFILE");
    if let Some(p) = profile {
        cmd.env("INFERLOOP_SIM_PROFILE", p);
    }
    let o = cmd.output().expect("running the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

fn passes(case: &str, profile: Option<&str>) {
    let (ok, text) = run(case, profile);
    assert!(ok, "case {case} ({profile:?}) failed:\n{text}");
}

#[test]
fn the_default_profile_is_an_orin_nx() {
    passes("orin-nx", None);
    passes("orin-nx", Some("orin-nx"));
}

#[test]
fn the_h200_profile_reports_its_132_sms_and_cuda_13() {
    passes("h200", Some("h200"));
}

#[test]
fn an_unknown_profile_fails_cuinit_naming_the_choices() {
    let (ok, text) = run("unknown", Some("gtx-480"));
    assert!(ok, "{text}");
    assert!(
        text.contains("INFERLOOP_SIM_PROFILE=gtx-480 names no profile (orin-nx, h200)"),
        "{text}"
    );
}

#[test]
fn allocations_go_through_the_memory_pool_as_on_a_gpu() {
    passes("pool", None);
}

#[test]
#[ignore = "run by the tests above, in a child process on the emulator"]
fn child() {
    let case = std::env::var(CASE_ENV).expect("the case to run");
    if let Err(e) = cases::run(&case) {
        panic!("case {case}: {e}");
    }
}

mod cases {
    use std::error::Error;

    use inferloop_kernels::cuda::cudarc::driver::sys::{
        self, CUdevice_attribute as A, CUmemPool_attribute as P,
    };
    use inferloop_kernels::cuda::cudarc::driver::{CudaContext, DevicePtr};

    type R = Result<(), Box<dyn Error>>;

    pub fn run(case: &str) -> R {
        match case {
            "orin-nx" => profile("orin-nx", (8, 7), 8, 2 << 20, 1536, 12020, true),
            "h200" => profile("h200", (9, 0), 132, 50 << 20, 2048, 13000, false),
            "unknown" => {
                assert!(
                    CudaContext::new(0).is_err(),
                    "cuInit accepted an unknown profile"
                );
                Ok(())
            }
            "pool" => pool(),
            other => Err(format!("no case {other}").into()),
        }
    }

    fn profile(
        name: &str,
        cc: (i32, i32),
        sms: i32,
        l2: i32,
        threads_per_sm: i32,
        driver: i32,
        integrated: bool,
    ) -> R {
        let ctx = CudaContext::new(0)?;
        assert!(
            ctx.name()?.ends_with(&format!("profile {name})")),
            "{}",
            ctx.name()?
        );
        assert_eq!(ctx.compute_capability()?, cc);
        assert_eq!(
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            sms
        );
        assert_eq!(ctx.attribute(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?, l2);
        let per_sm = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?;
        assert_eq!(per_sm, threads_per_sm);
        assert_eq!(
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)? == 1,
            integrated
        );
        let optin = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        assert!(optin > 48 << 10, "opt-in shared memory {optin}");
        assert_eq!(inferloop_kernels::cuda::driver_version()?, driver);
        Ok(())
    }

    fn pool_attr(pool: sys::CUmemoryPool, attr: P) -> Result<u64, Box<dyn Error>> {
        let mut v = 0u64;
        // SAFETY: attributes 4..8 are cuuint64_t.
        unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) }.result()?;
        Ok(v)
    }

    fn pool() -> R {
        let ctx = CudaContext::new(0)?;
        assert!(ctx.has_async_alloc(), "cudarc does not see memory pools");
        let stream = ctx.default_stream();
        let mut pool = std::ptr::null_mut();
        // SAFETY: writes one handle for device 0.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, 0) }.result()?;
        let (used, reserved) = (
            P::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            P::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        );

        // Freed and allocated again at the same size: the pool hands back the same address,
        // with the fresh-memory pattern rather than the old bytes.
        let a = stream.clone_htod(&[7u8; 1000])?;
        let pa = a.device_ptr(&stream).0;
        assert_eq!(pool_attr(pool, used)?, 4096);
        drop(a);
        assert_eq!(pool_attr(pool, used)?, 0);
        assert_eq!(
            pool_attr(pool, reserved)?,
            4096,
            "a freed block stays in the pool"
        );
        // SAFETY: read back before any write, to see what the pool hands out.
        let b = unsafe { stream.alloc::<u8>(1000)? };
        assert_eq!(
            b.device_ptr(&stream).0,
            pa,
            "the pool did not reuse the block"
        );
        assert!(stream.clone_dtoh(&b)?.iter().all(|&x| x == 0xcd));
        let pb = b.device_ptr(&stream).0;
        drop(b);

        // A pointer freed to the pool is no longer device memory.
        let mut host = [0u8; 16];
        // SAFETY: a 16-byte copy into a 16-byte buffer; the source was freed.
        let r = unsafe { sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), pb, 16) };
        assert_ne!(r, sys::CUresult::CUDA_SUCCESS, "read after cuMemFreeAsync");

        // Release threshold 0 (the default): a synchronisation gives the memory back.
        stream.synchronize()?;
        assert_eq!(pool_attr(pool, reserved)?, 0);
        // With a threshold above it the pool keeps it until trimmed.
        let mut keep = u64::MAX;
        // SAFETY: the release threshold is a cuuint64_t.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                P::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        }
        .result()?;
        drop(stream.alloc_zeros::<f32>(5000)?);
        stream.synchronize()?;
        assert_eq!(pool_attr(pool, reserved)?, 20480);
        assert!(pool_attr(pool, P::CU_MEMPOOL_ATTR_USED_MEM_HIGH)? >= 20480);
        // SAFETY: trims the device's own pool.
        unsafe { sys::cuMemPoolTrimTo(pool, 0) }.result()?;
        assert_eq!(pool_attr(pool, reserved)?, 0);
        // cuMemGetInfo counts what the pool holds as taken.
        let (free, total) = ctx.mem_get_info()?;
        assert_eq!(free, total);
        Ok(())
    }
}
