//! The CUDA emulator's own tests (`inferloop_cuda_sim`): its built-ins, shuffles,
//! shared memory and f16 conversions give what a GPU gives, and what is undefined on a GPU
//! (a barrier or a full-mask shuffle not every thread reaches, memory outside an
//! allocation, a race between threads) is refused or shows.
//!
//! Each case runs in a child process (this test binary again, the `child` test) whose
//! libcuda is the emulator's: the driver library is picked when a process starts.

use std::error::Error;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use inferloop_cuda_sim::{self as sim, Built};
use inferloop_kernels::kernels::Source;

const CASE_ENV: &str = "INFERLOOP_SIM_CASE";
const MODULE_ENV: &str = "INFERLOOP_SIM_SELFTEST";

const SELFTEST: Source = Source {
    name: "selftest",
    code: include_str!("sim/selftest.cu"),
    own: include_str!("sim/selftest.cu"),
};

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-sim-selftest");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        sim::build_with(&out, &cxx, &[SELFTEST])
            .unwrap_or_else(|e| panic!("building the emulator (a C++17 compiler is needed): {e}"))
    })
}

/// Runs `case` in a child process on the emulator, threads in `order`.
fn run(case: &str, order: &str) -> Output {
    let b = built();
    let exe = std::env::current_exe().expect("the test binary's path");
    Command::new(exe)
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CASE_ENV, case)
        .env("LD_LIBRARY_PATH", &b.lib_dir)
        .env(MODULE_ENV, b.modules_dir.join("selftest.ptx"))
        .env("INFERLOOP_SIM_ORDER", order)
        .output()
        .expect("running the child")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn assert_passes(case: &str, order: &str) {
    let o = run(case, order);
    assert!(
        o.status.success(),
        "case {case} ({order}) failed:\n{}",
        text(&o)
    );
}

/// Runs a case that must fail, and returns what it printed.
fn failing(case: &str) -> String {
    let o = run(case, "forward");
    let t = text(&o);
    assert!(!o.status.success(), "case {case} should fail:\n{t}");
    t
}

#[test]
fn built_ins_shuffles_shared_memory_and_f16_behave_as_on_a_gpu() {
    for order in ["forward", "reverse"] {
        for case in ["ids", "shuffles", "reverse", "f16", "geometry"] {
            assert_passes(case, order);
        }
    }
}

#[test]
fn a_race_on_shared_memory_shows_in_one_of_the_two_orders() {
    let forward = text(&run("racy", "forward"));
    let reverse = text(&run("racy", "reverse"));
    assert!(forward.contains("racy: as if ordered"), "{forward}");
    assert!(reverse.contains("racy: differs"), "{reverse}");
}

#[test]
fn barriers_and_shuffles_not_every_thread_reaches_are_launch_errors() {
    let t = failing("barrier");
    assert!(
        t.contains("barrier_after_return: block (0,0,0) thread (40,0,0): __syncthreads reached by 40 of 64 threads"),
        "{t}"
    );
    assert!(t.contains("CUDA_ERROR_LAUNCH_FAILED"), "{t}");
    let t = failing("shuffle_exit");
    assert!(
        t.contains("thread (3,0,0): a lane of this warp returned before its warp's shuffle"),
        "{t}"
    );
}

#[test]
fn a_write_just_past_an_allocation_fails_the_launch_naming_it() {
    let t = failing("write_oob");
    assert!(
        t.contains("kernel write_past_end (grid 1x1x1, block 32x1x1) wrote outside allocation"),
        "{t}"
    );
    assert!(t.contains("(40 bytes at 0x"), "{t}");
    assert!(t.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{t}");
}

#[test]
fn a_read_far_past_an_allocation_faults_naming_kernel_block_and_thread() {
    let t = failing("read_oob");
    assert!(
        t.contains("in kernel read_far_past_end, block (3,0,0) thread (5,0,0): 296 bytes from the start of allocation"),
        "{t}"
    );
    assert!(t.contains("(40 bytes)"), "{t}");
}

#[test]
fn a_misaligned_load_and_a_shared_array_overrun_stop_naming_the_line_and_thread() {
    let t = failing("misaligned");
    assert!(
        t.contains("selftest.cu:")
            && t.contains("misaligned address")
            && t.contains("16 byte alignment"),
        "{t}"
    );
    assert!(
        t.contains("cuda-sim: in kernel misaligned_load, block (0,0,0) thread (0,0,0)"),
        "{t}"
    );
    let t = failing("shared_overflow");
    assert!(
        t.contains("selftest.cu:") && t.contains("out of bounds"),
        "{t}"
    );
    assert!(
        t.contains("cuda-sim: in kernel shared_overflow, block (0,0,0) thread (32,0,0)"),
        "{t}"
    );
}

#[test]
fn stream_capture_records_launches_and_a_graph_launch_replays_them_counted_as_one() {
    for order in ["forward", "reverse"] {
        assert_passes("graph", order);
    }
}

/// The child's side: one case on the emulator (what `run` starts).
#[test]
#[ignore = "run by the other tests, in a process whose libcuda is the emulator"]
fn child() {
    let case = std::env::var(CASE_ENV).expect("INFERLOOP_SIM_CASE names the case");
    if let Err(e) = cases::run(&case) {
        panic!("case {case}: {e}");
    }
}

mod cases {
    use super::*;

    use inferloop_kernels::cuda::cudarc::driver::{
        CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
    };
    use inferloop_kernels::cuda::cudarc::nvrtc::Ptx;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    type R = Result<(), Box<dyn Error>>;

    fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: 0,
        }
    }

    struct Dev {
        stream: Arc<CudaStream>,
        module: Arc<inferloop_kernels::cuda::cudarc::driver::CudaModule>,
    }

    impl Dev {
        fn open() -> Result<Self, Box<dyn Error>> {
            let ctx = CudaContext::new(0)?;
            let name = ctx.name()?;
            assert!(name.contains("emulator"), "not the emulator: {name}");
            let marker = std::fs::read_to_string(std::env::var(MODULE_ENV)?)?;
            let module = ctx.load_module(Ptx::from_src(marker))?;
            Ok(Self {
                stream: ctx.default_stream(),
                module,
            })
        }
        fn f(&self, name: &str) -> Result<CudaFunction, Box<dyn Error>> {
            Ok(self.module.load_function(name)?)
        }
    }

    pub fn run(case: &str) -> R {
        let d = Dev::open()?;
        match case {
            "ids" => ids(&d),
            "shuffles" => shuffles(&d),
            "reverse" => reverse(&d),
            "racy" => racy(&d),
            "f16" => f16(&d),
            "geometry" => geometry(&d),
            "barrier" => barrier(&d),
            "shuffle_exit" => shuffle_exit(&d),
            "write_oob" => write_oob(&d),
            "read_oob" => read_oob(&d),
            "misaligned" => misaligned(&d),
            "shared_overflow" => shared_overflow(&d),
            "graph" => graph(&d),
            other => Err(format!("no case {other}").into()),
        }
    }

    fn ids(d: &Dev) -> R {
        let (grid, block) = ((3, 2, 2), (8, 4, 2));
        let (blocks, threads) = (12u32, 64u32);
        let mut out = d.stream.alloc_zeros::<u32>((blocks * threads) as usize)?;
        let f = d.f("ids_3d")?;
        // SAFETY: out holds one u32 per thread of the launch.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&mut out)
                .launch(cfg(grid, block))?
        };
        let got = d.stream.clone_dtoh(&out)?;
        for b in 0..blocks {
            for t in 0..threads {
                assert_eq!(
                    got[(b * threads + t) as usize],
                    (b << 16) | t,
                    "block {b} thread {t}"
                );
            }
        }
        Ok(())
    }

    fn shuffles(d: &Dev) -> R {
        let n = 64usize;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 1.5).collect();
        let dx = d.stream.clone_htod(&x)?;
        let mut out = d.stream.alloc_zeros::<f32>(4 * n)?;
        let f = d.f("shuffles")?;
        // SAFETY: x has one value per thread, out four.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&dx)
                .arg(&mut out)
                .launch(cfg((1, 1, 1), (n as u32, 1, 1)))?
        };
        let got = d.stream.clone_dtoh(&out)?;
        for i in 0..n {
            let (w, l) = (i & !31, i & 31);
            let want = [
                x[w + (l ^ 5)],
                x[if l + 3 < 32 { i + 3 } else { i }],
                x[if l >= 2 { i - 2 } else { i }],
                x[w + (l & !15) + 7],
            ];
            assert_eq!(got[4 * i..4 * i + 4], want, "thread {i}");
        }
        Ok(())
    }

    fn reverse(d: &Dev) -> R {
        let x: Vec<i32> = (0..3 * 256).map(|i| i * 7 + 1).collect();
        let dx = d.stream.clone_htod(&x)?;
        let mut dy = d.stream.alloc_zeros::<i32>(x.len())?;
        let f = d.f("reverse_in_block")?;
        // SAFETY: 3 blocks of 256 over 768 values.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&dx)
                .arg(&mut dy)
                .launch(cfg((3, 1, 1), (256, 1, 1)))?
        };
        let y = d.stream.clone_dtoh(&dy)?;
        for b in 0..3 {
            for t in 0..256 {
                assert_eq!(y[b * 256 + t], x[b * 256 + 255 - t]);
            }
        }
        Ok(())
    }

    fn racy(d: &Dev) -> R {
        let x: Vec<i32> = (1..=256).collect();
        let dx = d.stream.clone_htod(&x)?;
        let mut dy = d.stream.alloc_zeros::<i32>(256)?;
        let f = d.f("shift_racy")?;
        // SAFETY: one block of 256 over 256 values.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&dx)
                .arg(&mut dy)
                .launch(cfg((1, 1, 1), (256, 1, 1)))?
        };
        let y = d.stream.clone_dtoh(&dy)?;
        let ordered: Vec<i32> = (0..256).collect();
        println!(
            "racy: {}",
            if y == ordered {
                "as if ordered"
            } else {
                "differs"
            }
        );
        Ok(())
    }

    fn f16(d: &Dev) -> R {
        let h: Vec<u16> = (0..=u16::MAX).collect();
        let mut rng = StdRng::seed_from_u64(16);
        let mut x: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            65504.0,
            65519.99,
            65520.0,
            -65520.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            5.960_464_5e-8,
            2.980_232_2e-8,
            2.980_233e-8,
            8.940_697e-8,
            6.097_555e-5,
            6.103_515_6e-5,
            1e-10,
            -3.0e38,
        ];
        // Halfway cases between consecutive f16 values, and random magnitudes over the
        // whole f32 range.
        for b in (0u16..0x7c00).step_by(97) {
            let lo = half::f16::from_bits(b).to_f32() as f64;
            let hi = half::f16::from_bits(b + 1).to_f32() as f64;
            x.push(((lo + hi) / 2.0) as f32);
        }
        while x.len() < h.len() {
            let bits: u32 = rng.gen();
            x.push(f32::from_bits(bits));
        }
        x.truncate(h.len());
        let n = h.len();
        let dh = d.stream.clone_htod(&h)?;
        let dx = d.stream.clone_htod(&x)?;
        let mut dhf = d.stream.alloc_zeros::<f32>(n)?;
        let mut dxh = d.stream.alloc_zeros::<u16>(n)?;
        let f = d.f("f16_convert")?;
        let ni = n as i32;
        // SAFETY: four arrays of n; the kernel checks i < n.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&dh)
                .arg(&mut dhf)
                .arg(&dx)
                .arg(&mut dxh)
                .arg(&ni)
                .launch(cfg((n.div_ceil(256) as u32, 1, 1), (256, 1, 1)))?
        };
        let hf = d.stream.clone_dtoh(&dhf)?;
        let xh = d.stream.clone_dtoh(&dxh)?;
        for i in 0..n {
            let want = half::f16::from_bits(h[i]).to_f32();
            assert!(
                hf[i].to_bits() == want.to_bits() || (want.is_nan() && hf[i].is_nan()),
                "f16 {:#06x}: {} vs {want}",
                h[i],
                hf[i]
            );
            let want = half::f16::from_f32(x[i]);
            let got = half::f16::from_bits(xh[i]);
            assert!(
                got.to_bits() == want.to_bits() || (want.is_nan() && got.is_nan()),
                "f32 {:e} ({:#010x}): {:#06x} vs {:#06x}",
                x[i],
                x[i].to_bits(),
                got.to_bits(),
                want.to_bits()
            );
        }
        Ok(())
    }

    fn geometry(d: &Dev) -> R {
        let f = d.f("ids_3d")?;
        let mut out = d.stream.alloc_zeros::<u32>(4096)?;
        for bad in [(2048, 1, 1), (32, 32, 2), (1, 1, 128)] {
            // SAFETY: refused before any thread runs.
            let r = unsafe {
                d.stream
                    .launch_builder(&f)
                    .arg(&mut out)
                    .launch(cfg((1, 1, 1), bad))
            };
            assert!(r.is_err(), "block {bad:?} was launched");
        }
        Ok(())
    }

    fn barrier(d: &Dev) -> R {
        let mut y = d.stream.alloc_zeros::<i32>(64)?;
        let n = 40i32;
        let f = d.f("barrier_after_return")?;
        // SAFETY: y holds one value per thread.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&mut y)
                .arg(&n)
                .launch(cfg((1, 1, 1), (64, 1, 1)))?
        };
        Ok(())
    }

    fn shuffle_exit(d: &Dev) -> R {
        let mut y = d.stream.alloc_zeros::<f32>(32)?;
        let f = d.f("shuffle_after_return")?;
        // SAFETY: y holds one value per thread.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&mut y)
                .launch(cfg((1, 1, 1), (32, 1, 1)))?
        };
        Ok(())
    }

    fn write_oob(d: &Dev) -> R {
        let mut y = d.stream.alloc_zeros::<f32>(10)?;
        let n = 10i32;
        let f = d.f("write_past_end")?;
        // SAFETY: deliberately not: the kernel writes y[10], which the emulator reports.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&mut y)
                .arg(&n)
                .launch(cfg((1, 1, 1), (32, 1, 1)))?
        };
        Ok(())
    }

    fn read_oob(d: &Dev) -> R {
        let x = d.stream.clone_htod(&[1.0f32; 10])?;
        let mut y = d.stream.alloc_zeros::<f32>(1)?;
        let n = 10i32;
        let f = d.f("read_far_past_end")?;
        // SAFETY: deliberately not: block 3 reads x[74], on the emulator's guard page (its
        // blocks are shared among OS threads, so the fault may be on a helper thread).
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&x)
                .arg(&mut y)
                .arg(&n)
                .launch(cfg((8, 1, 1), (32, 1, 1)))?
        };
        Ok(())
    }

    fn misaligned(d: &Dev) -> R {
        let x = d.stream.clone_htod(&[1.0f32; 64])?;
        let mut y = d.stream.alloc_zeros::<f32>(32)?;
        let f = d.f("misaligned_load")?;
        // SAFETY: deliberately not: the kernel loads 16 bytes from x + 4 bytes.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&x)
                .arg(&mut y)
                .launch(cfg((1, 1, 1), (32, 1, 1)))?
        };
        Ok(())
    }

    fn shared_overflow(d: &Dev) -> R {
        let mut y = d.stream.alloc_zeros::<f32>(64)?;
        let f = d.f("shared_overflow")?;
        // SAFETY: deliberately not: threads 32..63 index past the 32-float shared array.
        unsafe {
            d.stream
                .launch_builder(&f)
                .arg(&mut y)
                .launch(cfg((1, 1, 1), (64, 1, 1)))?
        };
        Ok(())
    }

    /// Capture on a stream of its own: launches are recorded (not run, not counted), the
    /// graph replays them in order with the arguments they were captured with, reading
    /// device memory as it is at replay; one graph launch counts as one. Capture of the
    /// legacy stream and a copy inside a capture are refused, as on a GPU.
    fn graph(d: &Dev) -> R {
        use inferloop_kernels::cuda::counters;
        use inferloop_kernels::cuda::cudarc::driver::sys::{
            CUgraphInstantiate_flags, CUstreamCaptureMode,
        };
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        assert!(
            d.stream.begin_capture(mode).is_err(),
            "NULL stream captured"
        );
        // SAFETY: everything below runs on one stream, in order; without the events cudarc
        // otherwise records around each launch (which a capture would refuse).
        unsafe { d.stream.context().disable_event_tracking() };
        let st = d.stream.context().new_stream()?;
        let f = d.f("reverse_in_block")?;
        let x0: Vec<i32> = (0..256).collect();
        let mut dx = st.clone_htod(&x0)?;
        let mut dy = st.alloc_zeros::<i32>(256)?;
        let mut dz = st.alloc_zeros::<i32>(256)?;
        let c0 = counters::read_thread().ok_or("no counters on the emulator")?;
        st.begin_capture(mode)?;
        // SAFETY: one block of 256 over buffers of 256, twice: y = reverse(x), z = reverse(y).
        unsafe {
            st.launch_builder(&f)
                .arg(&dx)
                .arg(&mut dy)
                .launch(cfg((1, 1, 1), (256, 1, 1)))?;
            st.launch_builder(&f)
                .arg(&dy)
                .arg(&mut dz)
                .launch(cfg((1, 1, 1), (256, 1, 1)))?;
        }
        let g = st
            .end_capture(CUgraphInstantiate_flags(0))?
            .ok_or("no graph")?;
        let c1 = counters::read_thread().ok_or("no counters")?;
        assert_eq!(c1.since(&c0).kernel_launches, 0, "captured launches ran");
        assert_eq!(st.clone_dtoh(&dz)?, vec![0; 256], "nothing ran yet");
        for round in 0..3 {
            let x: Vec<i32> = (0..256).map(|i| i * 3 + round).collect();
            st.memcpy_htod(&x, &mut dx)?;
            let before = counters::read_thread().ok_or("no counters")?;
            g.launch()?;
            let c = counters::read_thread().ok_or("no counters")?.since(&before);
            assert_eq!(
                (c.kernel_launches, c.graph_launches, c.graph_kernels),
                (0, 1, 2)
            );
            let y = st.clone_dtoh(&dy)?;
            let z = st.clone_dtoh(&dz)?;
            assert_eq!(
                y,
                x.iter().rev().copied().collect::<Vec<_>>(),
                "round {round}"
            );
            assert_eq!(z, x, "round {round}");
        }
        let c = counters::read_thread().ok_or("no counters")?.since(&c1);
        assert_eq!(c.htod_bytes, 3 * 256 * 4);
        // Two reads per round and the check that nothing ran before the first.
        assert_eq!(c.dtoh_bytes, 7 * 256 * 4);
        st.begin_capture(mode)?;
        assert!(st.memcpy_htod(&x0, &mut dx).is_err(), "a copy was captured");
        assert!(
            st.end_capture(CUgraphInstantiate_flags(0)).is_err(),
            "an invalidated capture made a graph"
        );
        drop(g);
        Ok(())
    }
}
