//! `inferloop-qual`: parses arguments, runs the suite, prints the verdict and maps it to an
//! exit code (0 nothing failed, 1 a case failed, 2 the suite could not run).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use inferloop_qual::report::compare;
use inferloop_qual::{Options, TargetSpec};

#[derive(Parser)]
#[command(
    name = "inferloop-qual",
    version,
    about = "Qualify an inferloopd (or any OpenAI-compatible server): 385 checks with stable ids and a report (JSON, Markdown, HTML)",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Test a running server at this URL (http://HOST:PORT, or https://HOST:PORT with
    /// --ca-file); cases that must restart or
    /// reconfigure it are skipped, and on a server that is not an inferloopd so are the
    /// cases that need more than OpenAI's API.
    #[arg(long, value_name = "URL", conflicts_with = "spawn")]
    base_url: Option<String>,
    /// The CA that signed the certificate of an `https://` base URL (PEM).
    #[arg(
        long,
        value_name = "PEM",
        env = "INFERLOOP_QUAL_CA_FILE",
        requires = "base_url"
    )]
    ca_file: Option<PathBuf>,
    /// API key of the running daemon (`Authorization: Bearer KEY`).
    #[arg(long, env = "INFERLOOP_QUAL_API_KEY", requires = "base_url")]
    api_key: Option<String>,
    /// Start and restart daemons from this inferloopd binary as each case needs.
    #[arg(long, value_name = "PATH_TO_INFERLOOPD", requires = "model")]
    spawn: Option<PathBuf>,
    /// GGUF model the spawned daemons serve.
    #[arg(long, value_name = "GGUF")]
    model: Option<PathBuf>,
    /// llama.cpp threads of each spawned daemon.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Flags added to every spawned `serve`, e.g. "--backend native" (a case's own flag of
    /// the same name wins).
    #[arg(
        long,
        value_name = "FLAGS",
        requires = "spawn",
        allow_hyphen_values = true
    )]
    serve_args: Option<String>,
    /// Start the shared spawned daemon with this manifest (its SHA then shows in the report).
    #[arg(long, value_name = "PATH")]
    manifest: Option<PathBuf>,
    /// Print every case id with its group and description, then exit.
    #[arg(long)]
    list: bool,
    /// Run only cases whose id matches a glob (`stream.*`) or whose group is named; repeat or
    /// separate with commas.
    #[arg(long, value_name = "GLOB")]
    filter: Vec<String>,
    /// Cases run at once (those that disturb each other are kept apart regardless).
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// Time limit for every case, in seconds (default: each case's own, 240 s for most).
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Deadline of each HTTP request that keeps the default (120 s; streams 200 s), in seconds:
    /// for a daemon known to be slow, such as one under emulation. Cases that set their own
    /// deadline keep it.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    request_timeout: Option<u64>,
    /// Write report.json, report.md and report.html into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// No progress lines, only the summary.
    #[arg(long)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Print the pass / fail / skip tallies of two or more report.json files side by side,
    /// group by group, as a Markdown table, then the cases that failed on each.
    Compare {
        /// report.json files, one column each (e.g. out/qual/report.json out/qual-peer/report.json).
        #[arg(required = true, num_args = 2..)]
        reports: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Compare { reports }) = &cli.command {
        let columns: Result<Vec<_>, _> = reports.iter().map(|p| compare::Column::load(p)).collect();
        return match columns {
            Ok(c) => {
                print!("{}", compare::render(&c));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("inferloop-qual compare: {e}");
                ExitCode::from(2)
            }
        };
    }
    if cli.list {
        for (id, group, title) in inferloop_qual::list(&cli.filter) {
            println!("{id:<52} {:<12} {title}", group.name());
        }
        return ExitCode::SUCCESS;
    }
    let target = match (cli.base_url, cli.spawn, cli.model) {
        (Some(base_url), None, _) => TargetSpec::Attach {
            base_url,
            api_key: cli.api_key,
            ca_file: cli.ca_file,
        },
        (None, Some(bin), Some(model)) => TargetSpec::Spawn {
            bin,
            model,
            threads: cli.threads,
            manifest: cli.manifest,
            serve_args: cli
                .serve_args
                .as_deref()
                .map(|a| a.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
        },
        _ => {
            eprintln!("inferloop-qual: give --base-url URL, or --spawn PATH_TO_INFERLOOPD --model GGUF (see --help)");
            return ExitCode::from(2);
        }
    };
    let opts = Options {
        target,
        filter: cli.filter,
        jobs: cli.jobs.max(1),
        timeout: cli.timeout.map(Duration::from_secs),
        request_timeout: cli.request_timeout.map(Duration::from_secs),
        report_dir: cli.report.clone(),
        progress: !cli.quiet,
    };
    match inferloop_qual::run(opts) {
        Ok(report) => {
            print!("{}", report.summary_text());
            if let Some(dir) = cli.report {
                println!("report: {}", dir.join("report.html").display());
            }
            if report.totals.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("inferloop-qual: {e}");
            ExitCode::from(2)
        }
    }
}
