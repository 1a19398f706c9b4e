//! Builds the CUDA emulator (see `inferloop_cuda_sim`): every kernel compiled for this
//! CPU and a stand-in `libcuda.so.1`. Prints the two environment variables that make the
//! kernel crate's GPU tests, `q8-bench --device cuda` and `inferloopd --device cuda` use it.

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;

use inferloop_kernels::cuda::PTX_DIR_ENV;

#[derive(Parser)]
#[command(about = "Build the CUDA emulator: the kernels on the host CPU behind a stand-in libcuda")]
struct Args {
    /// Output directory (lib/ holds libcuda.so.1, modules/ the kernel modules).
    #[arg(long, default_value = "out/cuda-sim")]
    out: PathBuf,
    /// The C++ compiler.
    #[arg(long, env = "CXX", default_value = "c++")]
    cxx: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let out = std::path::absolute(&args.out)?;
    let built = inferloop_cuda_sim::build(&out, &args.cxx)?;
    if !built.warnings.is_empty() {
        eprint!("{}", built.warnings);
    }
    eprintln!(
        "cuda-sim: {} kernels emulated: {}",
        built.entries.len(),
        built.entries.join(", ")
    );
    println!("LD_LIBRARY_PATH={}", built.lib_dir.display());
    println!("{PTX_DIR_ENV}={}", built.modules_dir.display());
    Ok(())
}
