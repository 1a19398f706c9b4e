//! The serve lifecycle: bind, load the model behind a readiness gate, serve, and on shutdown
//! stop accepting, let in-flight requests finish up to a deadline, then cancel the rest.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::boot::Passed;
use crate::config::ServeConfig;
use crate::engine::Selection;
use crate::engine::{Engine, EngineError, EnginePlan, LoadedModel};
use crate::exit::ExitCode;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::thermal::{ThermalGate, ThermalWatch, WatchError};

/// How long exit waits for the decode thread to finish its current step and free the
/// llama.cpp context.
const DECODE_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// After the drain deadline, how long cancelled requests get to send their last frame
/// before every connection still open is closed. Small: the exit must follow
/// `--shutdown-timeout` closely, and a cancelled answer is written within milliseconds.
const CANCEL_GRACE: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Thermal(#[from] WatchError),
    #[error("model loader task failed: {0}")]
    Loader(String),
    #[error(transparent)]
    Tls(#[from] crate::http::tls::TlsError),
    #[error(transparent)]
    KvEvents(#[from] crate::kv_events::BindError),
}

impl ServeError {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Bind { .. } | Self::Tls(_) | Self::KvEvents(_) => ExitCode::Usage,
            Self::Thermal(e) => e.exit_code(),
            Self::Engine(_) | Self::Loader(_) => ExitCode::ModelLoad,
        }
    }
}

/// Runs the daemon until `shutdown` resolves. The boot gates have passed already.
pub async fn run(
    config: ServeConfig,
    boot: Passed,
    shutdown: impl Future<Output = ()>,
    mut reload: watch::Receiver<u64>,
) -> Result<(), ServeError> {
    let started = Instant::now();
    // Before bind, like every other setting: a certificate that cannot be read is a usage
    // error, not a server that refuses every handshake.
    let tls = config
        .tls
        .as_ref()
        .map(|f| crate::http::tls::Tls::load(&f.cert, &f.key))
        .transpose()?;
    tokio::spawn({
        let tls = tls.clone();
        async move {
            while reload.changed().await.is_ok() {
                match &tls {
                    None => tracing::info!("SIGHUP: nothing to reload, still serving"),
                    Some(tls) => match tls.reload() {
                        Ok(()) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
                        Err(e) => tracing::error!("SIGHUP: {e}; serving the previous pair"),
                    },
                }
            }
        }
    });
    // Before bind: an unknown `--board` or an unreadable `--sysfs-root` is a usage error
    // that must stop the daemon before anyone can connect.
    let thermal = Arc::new(ThermalWatch::start(&config.thermal).await?);
    let addr = SocketAddr::new(config.host, config.port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!("listening on {scheme}://{bound}");
    if tls.is_none() && config.api_key.is_some() && !config.host.is_loopback() {
        tracing::warn!(
            "serving plain HTTP on {bound} with an API key: anyone on the network can read \
             the key off the wire; serve HTTPS with --tls-cert and --tls-key"
        );
    }
    let metrics = Arc::new(Metrics::default());
    // Bound before the model loads, like the HTTP port: a taken port is a usage error.
    let (kv_source, kv_outbox) = match config.kv_events {
        Some(at) => {
            let (source, outbox) = crate::kv_events::start(
                at.addr,
                at.block_size,
                metrics.kv_event_batches_sent.clone(),
                metrics.kv_event_batches_dropped.clone(),
            )
            .await?;
            (Some(source), Some(outbox))
        }
        None => (None, None),
    };

    let config = Arc::new(config);
    // Read now, used once the model serves: the watchdog pings only while the decode loop
    // turns, so a step must end well within the ping interval, however slow the prefill.
    let notifier = Notifier::from_env().map(Arc::new);
    let mut plan = boot.plan.clone();
    plan.step_time_limit = notifier
        .as_ref()
        .and_then(|n| n.watchdog_every)
        .map(|every| every / 3);
    let selection = boot.selection.clone();
    let boot = Arc::new(boot);
    register_boot_metrics(&metrics, boot.clone());
    thermal.register_metrics(&metrics);
    if boot.pinned_sha256.is_none() {
        hash_unpinned_weights(&config, boot.clone());
    }
    let sha = boot.observed_sha256.clone();
    let (engine_tx, engine_rx) = watch::channel(None);
    // Raised when the drain deadline passes: open streams end with an error frame at once
    // instead of waiting for the decode thread's next step.
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let app = http::router(AppState {
        config: config.clone(),
        metrics: metrics.clone(),
        engine: engine_rx,
        started,
        boot,
        thermal: thermal.clone(),
        cancel: cancel_rx,
        stopping: stop_rx.clone(),
        kv_events: kv_source,
        instance_id: instance_id(),
    });
    let server = tokio::spawn(http::serve(
        listener,
        app,
        http::ConnPolicy {
            tls,
            read_timeout: config.read_timeout,
            idle_timeout: config.idle_timeout,
            max_connections: config.max_connections,
        },
        metrics.connections.clone(),
        async move {
            // An error means the sender is gone, which also means stop.
            let _ = stop_rx.wait_for(|stop| *stop).await;
        },
    ));

    let mut shutdown = std::pin::pin!(shutdown);
    let loader = tokio::task::spawn_blocking({
        let config = config.clone();
        let metrics = metrics.clone();
        let gate = thermal.gate();
        move || load_engine(&config, plan, &selection, metrics, gate, sha)
    });
    let engine = tokio::select! {
        loaded = loader => match loaded {
            Ok(Ok(engine)) => engine,
            Ok(Err(e)) => {
                stop_tx.send_replace(true);
                return Err(e.into());
            }
            Err(e) => {
                stop_tx.send_replace(true);
                return Err(ServeError::Loader(e.to_string()));
            }
        },
        () = &mut shutdown => {
            tracing::info!("shutdown requested while loading; exiting");
            stop_tx.send_replace(true);
            return Ok(());
        }
    };
    let info = engine.model().info();
    tracing::info!(
        model = %info.id,
        params = info.n_params,
        slots = config.slots,
        ctx = config.ctx,
        threads = config.threads,
        load_ms = started.elapsed().as_millis() as u64,
        "ready"
    );
    // Before any request can reach the engine: every block it will hold is published.
    if let Some(outbox) = kv_outbox {
        engine.publish_kv_events(outbox);
    }
    engine_tx.send_replace(Some(engine.clone()));
    if let Some(n) = &notifier {
        n.notify("READY=1");
        if let Some(every) = n.watchdog_every {
            tokio::spawn(feed_watchdog(n.clone(), engine.clone(), every));
        }
    }

    shutdown.await;
    if let Some(n) = &notifier {
        n.notify("STOPPING=1");
    }
    tracing::info!(
        deadline_s = config.shutdown_timeout.as_secs(),
        "shutting down: no new connections, draining in-flight requests"
    );
    // One deadline for everything: requests, half-sent requests and idle readers alike.
    let deadline = tokio::time::Instant::now() + config.shutdown_timeout;
    stop_tx.send_replace(true);
    let connections = match server.await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "server task failed");
            engine.shutdown();
            return Ok(());
        }
    };
    let (drained, closer) = connections.drain();
    tokio::pin!(drained);
    tokio::select! {
        () = &mut drained => tracing::info!("all requests finished"),
        () = tokio::time::sleep_until(deadline) => {
            tracing::warn!("drain deadline passed; cancelling remaining requests");
            cancel_tx.send_replace(true);
            engine.shutdown();
            // Connections that hold no answer (half a request, a body that never comes)
            // would otherwise keep the process up until their read timeout.
            closer.close_unanswered();
            if tokio::time::timeout(CANCEL_GRACE, &mut drained).await.is_err() {
                tracing::warn!("closing connections still open after the cancel grace");
                closer.close_all();
                let _ = tokio::time::timeout(CANCEL_GRACE, drained).await;
            }
        }
    }
    engine.shutdown();
    let waiter = engine.clone();
    let stopped = tokio::task::spawn_blocking(move || waiter.wait_stopped(DECODE_STOP_TIMEOUT))
        .await
        .unwrap_or(false);
    if !stopped {
        tracing::warn!(
            timeout_s = DECODE_STOP_TIMEOUT.as_secs(),
            "decode thread still busy at exit"
        );
    }
    Ok(())
}

fn load_engine(
    config: &ServeConfig,
    plan: EnginePlan,
    selection: &Selection,
    metrics: Arc<Metrics>,
    thermal: ThermalGate,
    weights_sha256: Arc<std::sync::OnceLock<String>>,
) -> Result<Engine, EngineError> {
    plan.debug_stall_load();
    let t0 = Instant::now();
    // The tokenizer and chat template always come from llama.cpp; the weights too, unless
    // the backend maps them itself.
    let vocab_only = selection.capabilities().own_weights;
    let model = Arc::new(LoadedModel::load_with(
        &config.model,
        config.model_id.clone(),
        config.chat_template.as_deref(),
        vocab_only,
    )?);
    tracing::info!(
        path = %config.model.display(),
        size_bytes = model.info().size_bytes,
        ms = t0.elapsed().as_millis() as u64,
        vocab_only,
        "model loaded"
    );
    if !vocab_only {
        tracing::info!(system_info = %crate::engine::llama_system_info(), "llama.cpp build");
    }
    // The draft model always runs on llama.cpp: its weights are mapped in full.
    let draft = match &config.draft_model {
        None => None,
        Some(path) => {
            let t0 = Instant::now();
            let id = format!("{}-draft", config.model_id);
            let draft = LoadedModel::load_with(path, id, None, false)?;
            tracing::info!(
                path = %path.display(),
                size_bytes = draft.info().size_bytes,
                ms = t0.elapsed().as_millis() as u64,
                "draft model loaded"
            );
            Some(Arc::new(draft))
        }
    };
    Engine::start(
        model,
        draft,
        selection.clone(),
        plan,
        metrics,
        thermal,
        weights_sha256,
    )
}

/// Pings systemd's watchdog while the decode loop keeps turning. A decode thread stuck for
/// longer than the ping interval stops the pings, so systemd restarts the daemon.
async fn feed_watchdog(notifier: Arc<Notifier>, engine: Engine, every: Duration) {
    let mut tick = tokio::time::interval(every);
    let mut stalled = false;
    loop {
        tick.tick().await;
        let fresh = engine.since_heartbeat().is_some_and(|age| age < every);
        if fresh {
            notifier.notify("WATCHDOG=1");
        } else if !stalled {
            tracing::error!(
                interval_ms = every.as_millis() as u64,
                "decode loop has not turned within the watchdog interval; withholding WATCHDOG=1"
            );
        }
        stalled = !fresh;
    }
}

fn register_boot_metrics(metrics: &Metrics, boot: Arc<Passed>) {
    metrics.add_source(move |w| {
        boot.plan.render_metrics(w);
        boot.selection.render_metrics(w);
        boot.decision.render_metrics(w);
        if let Some(rss) = crate::ledger::rss_bytes() {
            w.gauge(
                "inferloop_memory_rss_bytes",
                "Resident set size of the daemon.",
                rss,
            );
        }
    });
}

/// This run of the daemon, for a router to tell a restarted box from the one it knew: the
/// boot time and the process id.
fn instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("inferloopd-{}-{nanos:x}", std::process::id())
}

/// Without a manifest nothing vouches for the weights; hash them off the serving path, log
/// the SHA-256 so the user can pin it, and report it in `/v1/status`.
fn hash_unpinned_weights(config: &ServeConfig, boot: Arc<Passed>) {
    let path = config.model.clone();
    std::thread::spawn(
        move || match inferloop_manifest::verify::hash_with_progress(&path) {
            Ok(sha) => {
                tracing::info!(
                    path = %path.display(),
                    sha256 = %sha,
                    "weights are not pinned by a manifest; pin this SHA-256 with --manifest"
                );
                // Only this thread sets it when nothing was pinned.
                boot.observed_sha256.get_or_init(|| sha);
            }
            Err(e) => tracing::warn!(error = %e, "cannot hash the weights"),
        },
    );
}
