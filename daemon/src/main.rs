//! `inferloopd`: parses arguments, sets up logging, runs, and maps the result to an exit code.

use std::path::PathBuf;
use std::process::ExitCode as ProcessExit;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use inferloopd::config::{ConfigError, ServeConfig, ServeLayer};
use inferloopd::exit::ExitCode;
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
    init_logging();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Check(args) => check(args),
    }
    .into()
}

fn init_logging() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,llama-cpp-2=warn"));
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
