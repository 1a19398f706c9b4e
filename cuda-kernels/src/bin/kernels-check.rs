//! The kernels that ship, built and checked without a GPU: every kernel through the crate's
//! own NVRTC path (contraction off, as at run time), then
//!
//! - for each target architecture, `ptxas -v` turns the PTX into SASS,
//!   `<out>/sm_XY/<kernel>.cubin` (what the loader prefers on that device), and the table
//!   (kernel, entry, arch, registers, shared memory, spills) is read from its report;
//! - `<out>/ptx/<kernel>.ptx` for [`nvrtc::BASELINE_ARCH`], whose `.version` must be the ISA
//!   the oldest supported driver JIT-compiles (`--ptx-isa`, JetPack 6.0's CUDA 12.2: 8.2),
//!   also assembled by ptxas to prove it is whole.
//!
//! Fails on a compile error, a register spill, a PTX version other than `--ptx-isa`, or a
//! compile that contracts `a*b+c` into an FMA. Writes the table as Markdown and JSON.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use serde::Serialize;

use inferloop_kernels::kernels::SOURCES;
use inferloop_kernels::nvrtc;

#[derive(Parser)]
#[command(
    about = "Build every kernel as cubins and baseline PTX with NVRTC and ptxas, no GPU needed"
)]
struct Args {
    /// Architectures (compute capability as major.minor) to build cubins for.
    #[arg(long, value_delimiter = ',', default_value = "8.7,9.0")]
    arch: Vec<String>,
    /// The PTX ISA version the shipped PTX must declare (the oldest driver's).
    #[arg(long, default_value = "8.2")]
    ptx_isa: String,
    /// The ptxas binary (from the nvidia-cuda-nvcc-cu12 wheel).
    #[arg(long, default_value = "ptxas")]
    ptxas: PathBuf,
    /// Where `sm_XY/*.cubin`, `ptx/*.ptx`, the table (`kernels.md`) and `kernels.json` go.
    #[arg(long, default_value = "out/kernels")]
    out: PathBuf,
}

#[derive(Serialize)]
struct Row {
    kernel: String,
    entry: String,
    arch: String,
    registers: u32,
    shared_bytes: u32,
    spill_stores: u32,
    spill_loads: u32,
    stack_bytes: u32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let info = nvrtc::info()?;
    println!("NVRTC {} ({})", info.version, info.library);
    check_no_contraction()?;
    let build = args.out.join("build");
    let mut rows = Vec::new();
    for arch in &args.arch {
        let (major, minor) = parse_arch(arch)?;
        let compute = nvrtc::arch_name(major, minor);
        let sm = format!("sm_{major}{minor}");
        let (dir, work) = (args.out.join(&sm), build.join(&sm));
        for d in [&dir, &work] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        for s in SOURCES {
            let ptx = nvrtc::compile(s.name, s.code, &compute, &[])?;
            let path = work.join(format!("{}.ptx", s.name));
            write(&path, &ptx.to_src())?;
            let cubin = dir.join(format!("{}.cubin", s.name));
            let log = ptxas(&args.ptxas, &sm, &path, &cubin)?;
            let found = parse_ptxas(s.name, &sm, &log);
            if found.is_empty() {
                bail!("ptxas reported no kernel in {}.cu for {sm}:\n{log}", s.name);
            }
            rows.extend(found);
        }
    }
    baseline_ptx(&args)?;
    std::fs::write(args.out.join("kernels.md"), table(&rows))?;
    std::fs::write(
        args.out.join("kernels.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    print!("{}", table(&rows));
    let spilled: Vec<_> = rows
        .iter()
        .filter(|r| r.spill_stores > 0 || r.spill_loads > 0)
        .map(|r| format!("{} ({})", r.entry, r.arch))
        .collect();
    if !spilled.is_empty() {
        bail!("register spills in {}", spilled.join(", "));
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `<out>/ptx/*.ptx` for the baseline architecture, at exactly `--ptx-isa`.
fn baseline_ptx(args: &Args) -> Result<()> {
    let (major, minor) = nvrtc::BASELINE_ARCH;
    let want = parse_arch(&args.ptx_isa)?;
    let want = (want.0 as u32, want.1 as u32);
    let dir = args.out.join("ptx");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for s in SOURCES {
        let ptx = nvrtc::compile(s.name, s.code, &nvrtc::arch_name(major, minor), &[])?.to_src();
        let isa = nvrtc::ptx_isa(&ptx);
        ensure!(
            isa == Some(want),
            "{}.ptx declares PTX ISA {isa:?}, not {}: the oldest supported driver cannot JIT it \
             (compile with the NVRTC of that CUDA version)",
            s.name,
            args.ptx_isa
        );
        let path = dir.join(format!("{}.ptx", s.name));
        write(&path, &ptx)?;
        ptxas(
            &args.ptxas,
            &format!("sm_{major}{minor}"),
            &path,
            Path::new("/dev/null"),
        )?;
    }
    println!(
        "PTX for compute_{major}{minor} at ISA {} -> {}",
        args.ptx_isa,
        dir.display()
    );
    Ok(())
}

/// NVRTC fuses `a*b+c` into one rounding unless told not to; the crate's compile path must
/// keep the two roundings the CPU twins make. Checked on a probe kernel each run.
fn check_no_contraction() -> Result<()> {
    const PROBE: &str = "extern \"C\" __global__ void madd(const float* a, const float* b, \
        const float* c, float* y) { int i = threadIdx.x; y[i] = a[i] * b[i] + c[i]; }";
    let arch = nvrtc::arch_name(nvrtc::BASELINE_ARCH.0, nvrtc::BASELINE_ARCH.1);
    let ours = nvrtc::compile("madd", PROBE, &arch, &[])?.to_src();
    ensure!(
        !ours.contains("fma.rn.f32") && ours.contains("mul.rn.f32") && ours.contains("add.rn.f32"),
        "the crate's NVRTC options contract a*b+c:\n{ours}"
    );
    // And the probe does detect contraction: NVRTC's default fuses it.
    let default = nvrtc::compile_raw("madd", PROBE, &[format!("--gpu-architecture={arch}")])?;
    ensure!(
        default.contains("fma.rn.f32"),
        "NVRTC's default no longer contracts a*b+c; the probe checks nothing:\n{default}"
    );
    println!(
        "contraction: off ({}: mul.rn + add.rn, default would fma.rn)",
        nvrtc::FMAD_OFF
    );
    Ok(())
}

fn parse_arch(arch: &str) -> Result<(i32, i32)> {
    let parsed = arch
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    parsed.with_context(|| format!("architecture {arch:?} is not major.minor, e.g. 8.7"))
}

fn ptxas(ptxas: &Path, sm: &str, ptx: &Path, cubin: &Path) -> Result<String> {
    let out = Command::new(ptxas)
        .args(["-v", "-arch", sm, "-o"])
        .arg(cubin)
        .arg(ptx)
        .output()
        .with_context(|| {
            format!(
                "running {} (make kernels-check installs it)",
                ptxas.display()
            )
        })?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        bail!("ptxas failed on {} for {sm}:\n{log}", ptx.display());
    }
    Ok(log)
}

/// Reads ptxas -v lines: `Compiling entry function 'f' for 'sm_87'`, `N bytes stack frame,
/// N bytes spill stores, N bytes spill loads`, `Used N registers, ... N bytes smem ...`.
fn parse_ptxas(kernel: &str, sm: &str, log: &str) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let entry = rest.split('\'').next().unwrap_or_default().to_string();
            rows.push(Row {
                kernel: kernel.to_string(),
                entry,
                arch: sm.to_string(),
                registers: 0,
                shared_bytes: 0,
                spill_stores: 0,
                spill_loads: 0,
                stack_bytes: 0,
            });
        } else if let Some(row) = rows.last_mut() {
            if line.contains("stack frame") {
                row.stack_bytes = number_before(line, "bytes stack frame");
                row.spill_stores = number_before(line, "bytes spill stores");
                row.spill_loads = number_before(line, "bytes spill loads");
            } else if line.contains("Used") {
                row.registers = number_before(line, "registers");
                row.shared_bytes = number_before(line, "bytes smem");
            }
        }
    }
    rows
}

/// The integer right before `what` in `line` (0 when absent).
fn number_before(line: &str, what: &str) -> u32 {
    line.split(what)
        .next()
        .filter(|head| head.len() < line.len())
        .and_then(|head| {
            head.split(|c: char| !c.is_ascii_digit())
                .rfind(|s| !s.is_empty())
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| kernel | entry | arch | registers | shared memory (B) | stack (B) | spills (B) |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} | {} |\n",
            r.kernel,
            r.entry,
            r.arch,
            r.registers,
            r.shared_bytes,
            r.stack_bytes,
            r.spill_stores + r.spill_loads
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_verbose_output_is_read_per_entry() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'q8_gemv_f32' for 'sm_87'\n\
ptxas info    : Function properties for q8_gemv_f32\n\
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 40 registers, 1024 bytes smem, 400 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'add_f32' for 'sm_87'\n\
ptxas info    : Function properties for add_f32\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 8 registers, 372 bytes cmem[0]\n";
        let rows = parse_ptxas("k", "sm_87", log);
        assert_eq!(rows.len(), 2);
        let r = &rows[0];
        assert_eq!(
            (
                r.entry.as_str(),
                r.registers,
                r.shared_bytes,
                r.spill_stores,
                r.spill_loads,
                r.stack_bytes
            ),
            ("q8_gemv_f32", 40, 1024, 4, 4, 8)
        );
        assert_eq!((rows[1].registers, rows[1].shared_bytes), (8, 0));
    }
}
