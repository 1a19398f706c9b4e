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
use inferloopd::exit::ExitCode;
use inferloopd::thermal::Probe;
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
    /// TOML file with the same keys as the flags (snake_case); flags override it.
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
        Command::Serve(_) | Command::Check(_) => "info,llama-cpp-2=warn",
    };
    init_logging(default_filter);
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Check(args) => check(args),
        Command::Board(args) => board(args),
        Command::Thermal(args) => thermal(args),
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
    let boot = match inferloopd::boot::run_gates(&config) {
        Ok(passed) => passed,
        Err(e) => {
            let code = e.exit_code();
            tracing::error!("{:#}", anyhow::Error::from(e));
            return code;
        }
    };
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
    match runtime.block_on(inferloopd::server::run(config, boot, shutdown_signal())) {
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
    let decision = match inferloopd::boot::check_memory(&config, std::path::Path::new("/")) {
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

/// Resolves on SIGTERM or SIGINT; only `main` knows about signals.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
