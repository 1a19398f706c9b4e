//! `inferloop-ota agent --config /etc/inferloop/ota.toml`: the fleet agent.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use inferloop_ota::agent::Agent;
use inferloop_ota::config::{Overrides, Settings};
use inferloop_ota::rauc::DbusInstaller;

#[derive(Parser)]
#[command(
    name = "inferloop-ota",
    version,
    about = "InferLoop fleet agent: hawkBit DDI → RAUC"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Poll the rollout server and install what it assigns, until SIGTERM.
    Agent {
        /// The agent's TOML config (rendered into images as /etc/inferloop/ota.toml).
        #[arg(long, default_value = "/etc/inferloop/ota.toml")]
        config: PathBuf,
        /// Server URL, e.g. https://updates.example.com (overrides `server`).
        #[arg(long)]
        server: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        controller_id: Option<String>,
        #[arg(long)]
        download_dir: Option<PathBuf>,
        #[arg(long)]
        state_file: Option<PathBuf>,
        /// The running image's manifest (default /etc/inferloop/manifest.json).
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// Run one poll cycle and exit.
        #[arg(long)]
        once: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferloop-ota: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let Command::Agent {
        config,
        server,
        tenant,
        controller_id,
        download_dir,
        state_file,
        manifest,
        once,
    } = cli.command;
    let over = Overrides {
        server,
        tenant,
        controller_id,
        download_dir,
        state_file,
        manifest,
        reboot_command: None,
    };
    let settings = Settings::load(&config, &over)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let mut agent = Agent::new(settings, DbusInstaller)?;
        if once {
            agent.step().await;
            return Ok(());
        }
        agent.run(shutdown()).await;
        Ok(())
    })
}

/// SIGTERM (systemd stop) or Ctrl-C.
async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
