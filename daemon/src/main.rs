//! `inferloopd`: parses arguments, sets up logging, runs, and maps the result to an exit code.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode as ProcessExit;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use inferloop_board::{render_detection, Detector, Roots};
use inferloop_thermal::render_table;
use inferloopd::config::{ConfigError, ServeConfig, ServeLayer, ThermalSettings};
use inferloopd::engine::{Device, EnginePlan};
use inferloopd::exit::ExitCode;
use inferloopd::golden;
use inferloopd::heap;
use inferloopd::quantize::{self, QuantType};
use inferloopd::thermal::Probe;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "inferloopd",
    version,
    about = "OpenAI-compatible LLM server for edge boxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the model and serve the HTTP API.
    Serve(ServeArgs),
    /// Print the memory ledger and the admission decision without loading the weights
    /// (exit 0 fits, 1 refused).
    Check(CheckArgs),
    /// Print the detected board, why it was chosen (which file matched) and its profile
    /// (exit 0; unknown --board: 2).
    Board(BoardArgs),
    /// Print temperatures, clocks, power rails, throttling and the thermal admission state.
    Thermal(ThermalArgs),
    /// Rewrite a GGUF model at another weight type with llama.cpp's quantizer (exit 0; bad
    /// paths: 2; llama.cpp failed: 4, and no output is left).
    Quantize(QuantizeArgs),
    /// Run llama.cpp and the native forward pass on the same tokens (each prompt plus a
    /// greedy continuation) and compare them at every position (exit 0; bad prompts file: 2;
    /// a model either side cannot run, e.g. not Q8_0: 4).
    Golden(GoldenArgs),
}

#[derive(clap::Args)]
struct GoldenArgs {
    /// The GGUF model both engines read (Q8_0 for the native one).
    #[arg(long, value_name = "GGUF")]
    model: PathBuf,
    /// One prompt per line; blank lines and lines starting with `#` are skipped.
    #[arg(long, value_name = "FILE")]
    prompts: PathBuf,
    /// Most tokens of llama.cpp's greedy continuation fed to both after each prompt.
    #[arg(long = "continue", value_name = "N", default_value_t = 16)]
    continue_tokens: usize,
    /// Tokenize each line as plain text instead of a user message in the chat template.
    #[arg(long)]
    raw: bool,
    /// The GGUF llama.cpp reads instead of --model (same vocabulary), e.g. the same weights
    /// dequantized to F32.
    #[arg(long, value_name = "GGUF")]
    reference: Option<PathBuf>,
    /// What the native linear layers multiply with: `q8` quantizes the inputs as llama.cpp
    /// does for Q8_0 weights; `f32` keeps them, as llama.cpp does for f32 weights (use it
    /// with an F32 --reference).
    #[arg(long, value_enum, default_value_t = GoldenActivations::Q8)]
    activations: GoldenActivations,
    /// Also report llama.cpp against itself (flash attention off vs on) on the same tokens:
    /// the agreement a reimplementation can be judged by.
    #[arg(long)]
    noise_floor: bool,
    /// Where the native forward runs: the CPU twins, or the CUDA kernels on the first GPU
    /// (Q8 activations only).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Threads for llama.cpp and the native matmuls (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// Compare llama.cpp with its KV cache in these types (`q8_0`, `q4_0`, or `K,V`) against
    /// llama.cpp with f16 KV, instead of the native pass against llama.cpp (any weights).
    /// No native pass runs then, so its --device and --activations are refused, not ignored.
    #[arg(long, value_name = "f16|q8_0|q4_0[,V]", conflicts_with_all = ["device", "activations"])]
    kv_type: Option<inferloopd::config::KvTypes>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum GoldenActivations {
    Q8,
    F32,
}

#[derive(clap::Args)]
struct QuantizeArgs {
    /// The GGUF model to read (already-quantized input is requantized).
    #[arg(long = "in", value_name = "GGUF")]
    input: PathBuf,
    /// The GGUF file to write; replaced only when quantization succeeds.
    #[arg(long = "out", value_name = "GGUF")]
    output: PathBuf,
    /// Weight type of the output.
    #[arg(long = "type", value_enum, value_name = "TYPE")]
    to: QuantType,
    /// llama.cpp worker threads (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
}

#[derive(clap::Args)]
struct BoardArgs {
    /// Use this profile instead of detecting one.
    #[arg(long)]
    board: Option<String>,
    /// Root of procfs (the device tree, meminfo).
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// Root of sysfs (online CPUs).
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
}

#[derive(clap::Args)]
struct ThermalArgs {
    /// Root of sysfs to read the sensors from.
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Root of procfs, for board detection.
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// Use this board profile instead of detecting one.
    #[arg(long)]
    board: Option<String>,
    /// Print a new table every interval until interrupted.
    #[arg(long)]
    watch: bool,
    /// Interval between tables with --watch, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    interval_ms: u64,
}

#[derive(clap::Args)]
struct CheckArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML file with the same keys as the flags (snake_case). A flag beats its
    /// INFERLOOP_* variable, which beats the file.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    layer: ServeLayer,
}

fn main() -> ProcessExit {
    let cli = Cli::parse();
    // The inspection commands print their answer on stdout; info logs would only repeat it.
    let default_filter = match cli.command {
        Command::Board(_) | Command::Thermal(_) => "warn",
        Command::Serve(_) | Command::Check(_) | Command::Quantize(_) | Command::Golden(_) => {
            "info,llama-cpp-2=warn"
        }
    };
    init_logging(default_filter);
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Check(args) => check(args),
        Command::Board(args) => board(args),
        Command::Thermal(args) => thermal(args),
        Command::Quantize(args) => quantize(args),
        Command::Golden(args) => golden(args),
    }
    .into()
}

fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
}

fn serve(args: ServeArgs) -> ExitCode {
    let config = match resolve(args) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e:#}");
            return ExitCode::Usage;
        }
    };
    // Before the runtime and the model allocate anything large.
    match heap::fix_mmap_threshold() {
        heap::Threshold::Fixed => tracing::debug!(
            bytes = heap::MMAP_THRESHOLD_BYTES,
            "malloc: mmap threshold fixed"
        ),
        heap::Threshold::FromEnvironment => {
            tracing::info!("malloc: mmap threshold from MALLOC_MMAP_THRESHOLD_")
        }
        heap::Threshold::Unchanged => {
            tracing::debug!("malloc: mmap threshold left to the allocator")
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("inferloop-io")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::Usage;
        }
    };
    // Before the gates: a SIGHUP while the weights are hashed must not kill the daemon.
    let mut signals = match runtime.block_on(async { Signals::listen() }) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot listen for signals: {e}");
            return ExitCode::Usage;
        }
    };
    // SIGHUP bumps it; the server reloads what it can (a SIGHUP during the gates, once up).
    let (reload_tx, reload_rx) = tokio::sync::watch::channel(0u64);
    // The gates block (hashing gigabytes); a stop signal meanwhile exits at once, without
    // waiting for the hash (`shutdown_background` leaves that thread to the exit).
    let gates = runtime.block_on(async {
        let config = config.clone();
        let gates = tokio::task::spawn_blocking(move || inferloopd::boot::run_gates(&config));
        tokio::select! {
            passed = gates => Some(passed),
            () = signals.stop_requested(&reload_tx) => None,
        }
    });
    let boot = match gates {
        Some(Ok(Ok(passed))) => passed,
        Some(Ok(Err(e))) => {
            let code = e.exit_code();
            tracing::error!("{:#}", anyhow::Error::from(e));
            return code;
        }
        Some(Err(e)) => {
            tracing::error!("boot checks failed: {e}");
            return ExitCode::ModelLoad;
        }
        None => {
            tracing::info!("shutdown requested during the boot checks; exiting");
            runtime.shutdown_background();
            return ExitCode::Clean;
        }
    };
    let shutdown = async move { signals.stop_requested(&reload_tx).await };
    let served = runtime.block_on(inferloopd::server::run(config, boot, shutdown, reload_rx));
    // A stop during the model load leaves the loader's thread running; dropping the runtime
    // would wait for it (minutes, for a large model on slow storage).
    runtime.shutdown_background();
    match served {
        Ok(()) => ExitCode::Clean,
        Err(e) => {
            let code = e.exit_code();
            tracing::error!("{:#}", anyhow::Error::from(e));
            code
        }
    }
}

fn check(args: CheckArgs) -> ExitCode {
    let config = match resolve(args.serve) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e:#}");
            return ExitCode::Usage;
        }
    };
    let mut plan = match EnginePlan::from_config(&config) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::Usage;
        }
    };
    let selection = match inferloopd::boot::select_backend(&config, &plan) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return e.exit_code();
        }
    };
    let decision = match inferloopd::boot::check_memory(&config, &mut plan, &selection) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::ModelLoad;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&decision) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                tracing::error!("cannot serialize the ledger: {e}");
                return ExitCode::Usage;
            }
        }
    } else {
        print!("{}", decision.table());
    }
    if decision.fits {
        ExitCode::Clean
    } else {
        ExitCode::MemoryRefused
    }
}

fn board(args: BoardArgs) -> ExitCode {
    let roots = Roots {
        proc_root: args.proc_root,
        sys_root: args.sysfs_root,
    };
    match Detector::new(roots).with_override(args.board).detect() {
        Ok(detection) => match print(&render_detection(&detection)) {
            Printed::Yes | Printed::PipeClosed => ExitCode::Clean,
            Printed::Failed => ExitCode::Usage,
        },
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::Usage
        }
    }
}

fn quantize(args: QuantizeArgs) -> ExitCode {
    let request = quantize::Request {
        input: args.input,
        output: args.output,
        to: args.to,
        threads: args.threads,
    };
    match quantize::run(&request) {
        Ok(_) => ExitCode::Clean,
        Err(e) => {
            let code = e.exit_code();
            tracing::error!("{:#}", anyhow::Error::from(e));
            code
        }
    }
}

fn golden(args: GoldenArgs) -> ExitCode {
    let threads = args.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |t| t as usize,
    );
    let request = golden::Request {
        model: args.model,
        reference: args.reference,
        prompts: args.prompts,
        continue_tokens: args.continue_tokens,
        raw: args.raw,
        threads,
        activations: match args.activations {
            GoldenActivations::Q8 => inferloopd::engine::native::Activations::Q8,
            GoldenActivations::F32 => inferloopd::engine::native::Activations::F32,
        },
        noise_floor: args.noise_floor,
        device: args.device,
        kv_type: args.kv_type,
    };
    let report = match golden::run(&request) {
        Ok(r) => r,
        Err(e) => {
            let code = e.exit_code();
            tracing::error!("{:#}", anyhow::Error::from(e));
            return code;
        }
    };
    let text = if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => format!("{j}\n"),
            Err(e) => {
                tracing::error!("cannot serialize the report: {e}");
                return ExitCode::Usage;
            }
        }
    } else {
        format!("golden: {}\n", report.summary())
    };
    match print(&text) {
        Printed::Yes | Printed::PipeClosed => ExitCode::Clean,
        Printed::Failed => ExitCode::Usage,
    }
}

fn thermal(args: ThermalArgs) -> ExitCode {
    let settings = ThermalSettings {
        board: args.board,
        roots: Roots {
            proc_root: args.proc_root,
            sys_root: args.sysfs_root,
        },
        ..ThermalSettings::default()
    };
    let mut probe = match Probe::open(&settings) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{:#}", anyhow::Error::from(e));
            return ExitCode::Usage;
        }
    };
    let interval = Duration::from_millis(args.interval_ms);
    let clear = args.watch && std::io::stdout().is_terminal();
    loop {
        let table = match probe.sample() {
            Ok(snapshot) => render_table(&snapshot),
            Err(e) => {
                tracing::error!("{:#}", anyhow::Error::from(e));
                return ExitCode::Usage;
            }
        };
        let page = if clear {
            // Clear the screen and home the cursor: a live view, like `watch`.
            format!("\x1b[2J\x1b[H{table}")
        } else if args.watch {
            format!("{table}\n")
        } else {
            table
        };
        match print(&page) {
            Printed::Yes if args.watch => std::thread::sleep(interval),
            Printed::Yes | Printed::PipeClosed => return ExitCode::Clean,
            Printed::Failed => return ExitCode::Usage,
        }
    }
}

/// What became of a write to stdout.
enum Printed {
    Yes,
    /// The reader left (`| head`): stop quietly.
    PipeClosed,
    Failed,
}

fn print(text: &str) -> Printed {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Printed::Yes,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Printed::PipeClosed,
        Err(e) => {
            tracing::error!("cannot write to stdout: {e}");
            Printed::Failed
        }
    }
}

fn resolve(args: ServeArgs) -> anyhow::Result<ServeConfig> {
    // Before the config: the default connection cap follows the limit in force.
    if let Err(e) = inferloopd::http::limits::raise_fd_limit() {
        tracing::warn!("cannot read or raise the open-file limit: {e}");
    }
    let file = args
        .config
        .as_deref()
        .map(ServeLayer::from_file)
        .transpose()?;
    let env = ServeLayer::from_env(|k| std::env::var(k).ok())?;
    ServeConfig::resolve(file, args.layer, env)
        .map_err(|e: ConfigError| anyhow::Error::from(e))
        .context("invalid configuration")
}

/// The signals `serve` answers; only `main` knows about them. Listening starts when this
/// is built, which replaces the default action (die at once) for all four.
struct Signals {
    term: Signal,
    int: Signal,
    quit: Signal,
    hup: Signal,
}

impl Signals {
    /// Must run inside the runtime.
    fn listen() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves on SIGTERM, SIGINT or SIGQUIT: all three drain gracefully. SIGHUP asks a
    /// daemon to reload: the TLS certificate and key are read again (`reload` is bumped);
    /// nothing else can be reloaded safely while serving (the model, the ledger and the
    /// bind address are fixed at start), and serving goes on.
    async fn stop_requested(&mut self, reload: &tokio::sync::watch::Sender<u64>) {
        loop {
            tokio::select! {
                _ = self.term.recv() => return tracing::info!("SIGTERM received"),
                _ = self.int.recv() => return tracing::info!("SIGINT received"),
                _ = self.quit.recv() => return tracing::info!("SIGQUIT received"),
                _ = self.hup.recv() => {
                    reload.send_modify(|n| *n += 1);
                }
            }
        }
    }
}
