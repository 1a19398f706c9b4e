//! `inferloop-image`: parse arguments, set up logging, run, map the result to an exit code.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use inferloop_image::bundle::{self, BundleFormat, BundleRequest, Trust};
use inferloop_image::ota::{self, ConfOverrides};
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
        /// Where Debian bases (`base = { debian = ... }`) are built and kept
        /// [default: debian-cache beside --out].
        #[arg(long)]
        base_cache: Option<PathBuf>,
        /// Skip rootfs.tar.zst (the manifest then lists only the image).
        #[arg(long)]
        no_tarball: bool,
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
    /// Print a manifest (or the one beside an image), or a RAUC bundle, as a table.
    Inspect {
        /// A manifest.json, an image with manifest.json beside it, or a .raucb bundle.
        file: PathBuf,
        /// Bundles: the CA certificate(s) the signature must chain to.
        #[arg(long)]
        keyring: Option<PathBuf>,
        /// Bundles: read without checking the signature.
        #[arg(long, conflicts_with = "keyring")]
        no_verify: bool,
    },
    /// Write RAUC's /etc/rauc/system.conf for a board with an [ota] table.
    RaucConf {
        /// A compiled-in board profile.
        #[arg(long)]
        board: String,
        /// Replace a slot's device, e.g. rootfs.1=/dev/loop3 (repeatable; for tests).
        #[arg(long, value_name = "SLOT=DEVICE", value_parser = ota::parse_slot_device)]
        slot_device: Vec<(String, String)>,
        /// Keyring path on the box [default: /etc/rauc/keyring.pem].
        #[arg(long)]
        keyring: Option<String>,
        /// RAUC's data directory on the box [default: /data/rauc].
        #[arg(long)]
        data_dir: Option<String>,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Sign a built image into a RAUC bundle and verify it with `rauc info`.
    Bundle {
        /// The spec the image was built from (checked against its manifest).
        #[arg(long)]
        spec: Option<PathBuf>,
        /// The `build --out` directory: the image and manifest.json.
        #[arg(long)]
        image: PathBuf,
        /// Signing certificate (PEM, extendedKeyUsage codeSigning).
        #[arg(long)]
        cert: PathBuf,
        /// Its private key (PEM).
        #[arg(long)]
        key: PathBuf,
        /// CA certificate(s) the signature must verify against (the devices' keyring);
        /// without it the bundle is checked against --cert only.
        #[arg(long)]
        keyring: Option<PathBuf>,
        /// verity (dm-verity, the default) or plain.
        #[arg(long, default_value = "verity")]
        format: BundleFormat,
        /// The bundle to write (.raucb).
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing --out.
        #[arg(long)]
        force: bool,
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
            base_cache,
            no_tarball,
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
                    base_cache,
                    tarball: !no_tarball,
                },
            )?;
            if let Some(a) = &built.manifest.artifacts {
                println!("{}  {}", a.image.sha256, built.image.display());
                if let (Some(t), Some(path)) = (&a.tarball, &built.tarball) {
                    println!("{}  {}", t.sha256, path.display());
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
        Command::Inspect {
            file,
            keyring,
            no_verify,
        } => {
            if bundle::is_bundle(&file)? {
                let trust = match (&keyring, no_verify) {
                    (Some(k), _) => Trust::Keyring(k),
                    (None, true) => Trust::NoVerify,
                    (None, false) => anyhow::bail!(
                        "{} is a RAUC bundle: pass --keyring CA.pem (the CA its signer chains to) \
                         to verify it, or --no-verify to read it unchecked",
                        file.display()
                    ),
                };
                let info = bundle::info(&file, trust)?;
                print!("{}", bundle::render_info(&file, &info));
                return Ok(ExitCode::SUCCESS);
            }
            if keyring.is_some() || no_verify {
                anyhow::bail!(
                    "--keyring and --no-verify apply to RAUC bundles; {} is not one",
                    file.display()
                );
            }
            let loaded = inspect::load(&file)?;
            print!("{}", inspect::render(&loaded));
            Ok(ExitCode::SUCCESS)
        }
        Command::RaucConf {
            board,
            slot_device,
            keyring,
            data_dir,
            out,
        } => {
            let profile = inferloop_board::profile::find(&board)?;
            let overrides = ConfOverrides {
                slot_devices: slot_device.into_iter().collect(),
                keyring,
                data_dir,
            };
            let conf = ota::system_conf(profile, &overrides)?;
            match out {
                Some(path) => std::fs::write(&path, conf)
                    .with_context(|| format!("cannot write {}", path.display()))?,
                None => print!("{conf}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bundle {
            spec,
            image,
            cert,
            key,
            keyring,
            format,
            out,
            force,
        } => {
            let spec = spec.as_deref().map(Spec::load).transpose()?;
            let started = std::time::Instant::now();
            let bundled = bundle::create(
                &BundleRequest {
                    image_dir: &image,
                    spec: spec.as_ref(),
                    cert: &cert,
                    key: &key,
                    keyring: keyring.as_deref(),
                    format,
                    out: &out,
                    force,
                },
                &progress,
            )?;
            if keyring.is_none() {
                tracing::warn!("no --keyring: the bundle was checked against --cert only, not against the CA devices trust");
            }
            println!("{}  {}", bundled.sha256, bundled.path.display());
            println!(
                "bundle: {} bytes, {} {} version {}, signed by {}, {:.1} s",
                bundled.size,
                bundled.info.format,
                bundled.info.compatible,
                bundled.info.version,
                bundled.info.signer.as_deref().unwrap_or("?"),
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
