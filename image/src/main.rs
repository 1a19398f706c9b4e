//! `inferloop-image`: parse arguments, set up logging, run, map the result to an exit code.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use inferloop_image::{inspect, BuildOptions, Progress, Spec, Subject};
use inferloop_manifest::Manifest;

/// Exit codes: 0 success, 1 verify found mismatches, 2 any error.
#[derive(Parser)]
#[command(
    name = "inferloop-image",
    version,
    about = "Build and check InferLoop root filesystem images"
)]
struct Cli {
    /// No progress bars, warnings and errors only.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the image, tarball and manifest described by a spec.
    Build {
        /// The image spec (TOML).
        #[arg(long)]
        spec: PathBuf,
        /// Output directory (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Timestamp of every file and of the image; without it the build uses the current
        /// time and is not reproducible.
        #[arg(long, env = "SOURCE_DATE_EPOCH")]
        source_date_epoch: Option<u64>,
    },
    /// Check an image (or a mounted root) against its manifest; exit 1 on any mismatch.
    Verify {
        /// The image file (manifest.json beside it is the default manifest). Without
        /// --image or --root, the image that --manifest names beside itself.
        #[arg(long, conflicts_with = "root")]
        image: Option<PathBuf>,
        /// A mounted or unpacked root instead of an image (default manifest: the baked one).
        #[arg(long)]
        root: Option<PathBuf>,
        /// The manifest to check against.
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// Also require the manifest's `compatible` to be this board.
        #[arg(long)]
        board: Option<String>,
    },
    /// Print a manifest (or the one beside an image) as a table.
    Inspect {
        /// A manifest.json, or an image with manifest.json beside it.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default = if cli.quiet { "warn" } else { "info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("inferloop-image: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let progress = Progress::new(cli.quiet);
    match cli.command {
        Command::Build {
            spec,
            out,
            source_date_epoch,
        } => {
            let source_date_epoch = match source_date_epoch {
                Some(epoch) => epoch,
                None => {
                    tracing::warn!("SOURCE_DATE_EPOCH is not set: using the current time, so this build is not reproducible");
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .context("the clock is before 1970")?
                        .as_secs()
                }
            };
            let spec = Spec::load(&spec)?;
            let built = inferloop_image::build(
                &spec,
                &out,
                &BuildOptions {
                    source_date_epoch,
                    progress,
                },
            )?;
            if let Some(a) = &built.manifest.artifacts {
                println!("{}  {}", a.image.sha256, built.image.display());
                if let Some(t) = &a.tarball {
                    println!("{}  {}", t.sha256, built.tarball.display());
                }
            }
            println!("manifest: {}", built.manifest_path.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify {
            image,
            root,
            manifest,
            board,
        } => {
            let subject = match (image, root, &manifest) {
                (Some(image), _, _) => Subject::Image(image),
                (None, Some(root), _) => Subject::Root(root),
                // The manifest beside an image names the image.
                (None, None, Some(path)) => {
                    let loaded = Manifest::load(path)?;
                    let artifacts = loaded.manifest.artifacts.with_context(|| {
                        format!(
                            "{} has no artifacts section: give --image FILE",
                            path.display()
                        )
                    })?;
                    Subject::Image(
                        path.parent()
                            .unwrap_or_else(|| Path::new("."))
                            .join(artifacts.image.file),
                    )
                }
                (None, None, None) => {
                    anyhow::bail!("give --image FILE, --root DIR or --manifest FILE")
                }
            };
            let report = inferloop_image::verify(
                &subject,
                manifest.as_deref(),
                board.as_deref(),
                &progress,
            )?;
            for m in &report.mismatches {
                println!("MISMATCH {m}");
            }
            let hash = if report.image_hash_checked {
                "image hash and "
            } else {
                ""
            };
            if report.ok() {
                println!(
                    "ok: {hash}{} entries match {}",
                    report.entries_checked,
                    report.manifest.display()
                );
                Ok(ExitCode::SUCCESS)
            } else {
                println!(
                    "FAILED: {} mismatch(es) against {}",
                    report.mismatches.len(),
                    report.manifest.display()
                );
                Ok(ExitCode::from(1))
            }
        }
        Command::Inspect { file } => {
            let loaded = inspect::load(&file)?;
            print!("{}", inspect::render(&loaded));
            Ok(ExitCode::SUCCESS)
        }
    }
}
