//! One layer of serve settings (flags, environment or file), every field optional.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::choices::{BackendChoice, DeviceChoice, KvTypes, PrefixCache, Spec, SpecGate};

/// One layer of settings; every field optional so layers can be merged.
/// The same keys are accepted in the TOML file (snake_case) and as flags (kebab-case).
#[derive(Debug, Default, Clone, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ServeLayer {
    /// GGUF model file.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Model id reported by the API (default: the file stem).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Jinja chat template file used instead of the model's own (GGUF
    /// `tokenizer.chat_template`).
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Address to bind.
    #[arg(long)]
    pub host: Option<IpAddr>,
    /// Port to bind (0 picks a free one; the log line `listening on` names it).
    #[arg(long)]
    pub port: Option<u16>,
    /// Sequences decoded concurrently.
    #[arg(long)]
    pub slots: Option<usize>,
    /// The most choices one request may ask for (`n`), each decoded in a slot of its own;
    /// at most `--slots`. Default 8, or the slots when fewer.
    #[arg(long, value_name = "N")]
    pub max_n: Option<usize>,
    /// Requests that may wait for a slot; more get 429.
    #[arg(long)]
    pub queue: Option<usize>,
    /// Context length of each slot, in tokens (the KV cache holds slots × ctx).
    #[arg(long)]
    pub ctx: Option<u32>,
    /// CPU threads for llama.cpp.
    #[arg(long)]
    pub threads: Option<i32>,
    /// Engine: `llama` (llama.cpp), `native` (Q8_0 weights only) or `auto` (default: native
    /// on a CUDA GPU with Q8_0 weights, llama.cpp otherwise).
    #[arg(long, value_name = "auto|llama|native")]
    pub backend: Option<BackendChoice>,
    /// Where the engine computes: `cpu`, `cuda` or `auto` (default: CUDA when a CUDA GPU is
    /// found).
    #[arg(long, value_name = "auto|cpu|cuda")]
    pub device: Option<DeviceChoice>,
    /// When the CUDA GPU cannot be opened, serve on the CPU instead of refusing to start
    /// (exit 4). Default: true with `--device auto`, false with `--device cuda`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "true|false")]
    pub cpu_fallback: Option<bool>,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// A browser origin (`http://host:port`, or `*` for any) allowed to call the API:
    /// answered with CORS headers. Repeatable; default none. Env `INFERLOOP_CORS_ORIGIN`
    /// takes a comma-separated list; the file key `cors_origin` an array.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    #[serde(alias = "cors_origins")]
    pub cors_origin: Option<Vec<String>>,
    /// Allow binding a non-loopback address without an API key.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub insecure_no_auth: Option<bool>,
    /// Longest wait in the queue before a 503, in milliseconds.
    #[arg(long)]
    pub queue_timeout_ms: Option<u64>,
    /// Grace period for in-flight requests on SIGTERM, SIGINT or SIGQUIT, in seconds.
    #[arg(long = "shutdown-timeout")]
    #[serde(alias = "shutdown_timeout")]
    pub shutdown_timeout_secs: Option<u64>,
    /// Largest accepted request body, in bytes.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Time allowed to receive request headers and body, in seconds, from a request's
    /// first byte.
    #[arg(long)]
    pub read_timeout_secs: Option<u64>,
    /// Serve HTTPS with this PEM certificate chain (with `--tls-key`); read again on SIGHUP.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Time a keep-alive connection may wait for its next request's first byte, in seconds.
    #[arg(long)]
    pub idle_timeout_secs: Option<u64>,
    /// Most connections open at once. At the cap a new connection closes the oldest one
    /// that holds no answer, or is refused with a 503 when every one holds an answer.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Publish the slots' KV blocks on a ZeroMQ PUB socket at this address (`IP:PORT`), for
    /// vllm-router's `kv_aware` policy; routers find it through `GET /kv_event_sources`.
    /// The events carry prompt token ids in the clear: keep the port on a private network.
    #[arg(long, value_name = "IP:PORT")]
    pub kv_events: Option<std::net::SocketAddr>,
    /// Tokens per published KV block (default 16, vLLM's).
    #[arg(long)]
    pub kv_events_block_size: Option<u32>,
    /// Manifest pinning the weights' SHA-256 and size; mismatches refuse to start (exit 3).
    /// Default: /etc/inferloop/manifest.json when that file exists (what images bake in).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Writable directory for state such as the verified-weights cache.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Memory the daemon may use, in MiB (the tightest of this, the cgroup limit and
    /// MemAvailable applies).
    #[arg(long)]
    pub memory_budget_mb: Option<u64>,
    /// Safety margin added to the ledger, in MiB (default: 5%, at least 16 MiB).
    #[arg(long)]
    pub memory_margin_mb: Option<u64>,
    /// KV cells shared by all slots (default slots × ctx). Fewer oversubscribes the slots:
    /// requests then also wait for free cells.
    #[arg(long)]
    pub kv_cells: Option<u32>,
    /// KV cache element types: `f16` (default), `q8_0` or `q4_0` for K and V alike, or
    /// `K,V` for each (e.g. `q8_0,f16`). q8_0 takes 53% of f16's bytes, q4_0 28%. A
    /// quantized V needs llama.cpp's flash attention, which the daemon then turns on; the
    /// native backend keeps f16 only and refuses the others (exit 2).
    #[arg(long, value_name = "f16|q8_0|q4_0[,V]")]
    pub kv_type: Option<KvTypes>,
    /// Reuse the KV cells of a prompt prefix already computed for another request
    /// (`on`, `exact` or `off`; default on). `on` reuses every resident row, decoded ones
    /// included, as llama-server does; temperature-0 output may differ from `off`. `exact`
    /// reuses only rows computed as without reuse, so output is identical to `off`, and
    /// recomputes more. `relaxed` is a deprecated name of `on`.
    #[arg(long, value_name = "on|exact|off")]
    pub prefix_cache: Option<PrefixCache>,
    /// Backend sequences beyond the slots: idle ones keep earlier prompts' prefixes, so
    /// that more distinct prompts stay reusable than there are slots. A request starts in
    /// the idle sequence holding its longest prefix; no more than `slots` run at once.
    /// Default: twice the slots with a shared pool (`--kv-cells`), where they cost no
    /// memory; 0 with a KV stream per sequence, where each costs `ctx` cells (the ledger
    /// counts them).
    #[arg(long)]
    pub prefix_slots: Option<usize>,
    /// Host memory for the prompt cache's RAM tier, in MiB: prefixes that leave the KV
    /// cells are kept there and restored on a hit. 0 disables it. Default: room for twice
    /// the slots' prompts at full context, at most 8192, shrunk to a quarter of the
    /// headroom when that does not fit the memory limit (the ledger counts it).
    #[arg(long, value_name = "MIB")]
    pub prompt_cache_ram_mb: Option<u64>,
    /// Disk for the prompt cache's disk tier under `<state-dir>/prompt-cache`, in MiB:
    /// prefixes survive restarts and updates with the same weights. 0 disables it; it is
    /// on only with a state directory. Default 1024.
    #[arg(long, value_name = "MIB")]
    pub prompt_cache_disk_mb: Option<u64>,
    /// Speculative decoding (`ngram`, `draft` or `off`; default `draft` with a draft
    /// model, else `ngram`). `ngram` drafts the next tokens from the request's own prompt
    /// and output, `draft` with the smaller `--draft-model`; either way one step verifies
    /// them, keeping the model's own output: faster where drafts hit, and drafting pauses
    /// itself where they keep missing. A request opts out with `"speculative": false`.
    #[arg(long, value_name = "ngram|draft|off")]
    pub spec: Option<Spec>,
    /// Which drafts a step verifies: `cost` (default) only those the measured cost of a
    /// step's rows says will raise throughput, `always` every draft at the length its
    /// acceptance rate allows.
    #[arg(long, value_name = "cost|always")]
    pub spec_gate: Option<SpecGate>,
    /// A smaller model with the same vocabulary that drafts for `--spec draft` (checked at
    /// load; pinned by the manifest's `draft_model` when a manifest is used; counted by
    /// the memory ledger).
    #[arg(long, value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// Board profile to use instead of detecting one (`inferloopd board` shows what
    /// detection picks and why).
    #[arg(long)]
    pub board: Option<String>,
    /// Root of sysfs for board detection, the thermal watch and the cgroup memory limits
    /// (tests point it at fixtures).
    #[arg(long)]
    pub sysfs_root: Option<PathBuf>,
    /// Root of procfs for board detection and the memory ledger (the device tree, meminfo,
    /// the own cgroup and mountinfo).
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
    /// How often the thermal watch samples the sensors, in milliseconds.
    #[arg(long)]
    pub thermal_interval_ms: Option<u64>,
    /// At or above this temperature (°C) the board is `hot` and fewer sequences decode at
    /// once (default: the lowest passive trip point, else the board profile).
    #[arg(long)]
    pub hot_celsius: Option<f64>,
    /// At or above this temperature (°C) the board is `critical` and new requests get 503
    /// (default: the lowest critical trip point, else the board profile).
    #[arg(long)]
    pub critical_celsius: Option<f64>,
    /// A thermal state is left only below its threshold minus this many °C (default 5).
    #[arg(long)]
    pub hysteresis_celsius: Option<f64>,
    /// Fraction of the slots that may decode at once while hot (rounded down, at least 1).
    #[arg(long)]
    pub hot_fraction: Option<f64>,
    /// Test-only fault hook, set by `INFERLOOP_DEBUG_STALL_FILE` alone (no flag, no file
    /// key): while this file exists the decode loop blocks (the VM's systemd watchdog test).
    #[arg(skip)]
    #[serde(skip)]
    pub debug_stall_file: Option<PathBuf>,
}
