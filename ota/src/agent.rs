//! The loop: poll, report `configData`, follow a deployment through download, RAUC and the
//! reboot, and report what happened. Server trouble is retried with backoff; a verdict on
//! the update (bad hashes, a bundle RAUC refuses, a slot that did not confirm) is reported
//! as `closed` + `failure` with the reason in `details`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use crate::backoff::Backoff;
use crate::client::DdiClient;
use crate::config::{self, Settings};
use crate::ddi::{
    CancelActionBase, ConfigData, DeploymentBase, Execution, Feedback, Finished, Handling,
    MaintenanceWindow,
};
use crate::download;
use crate::rauc::{InstallProgress, Installer};
use crate::state::{Closed, Pending, State, StateFile};
use crate::OtaError;

/// While an installed update waits for its reboot and health check, the box looks this
/// often (and polls the server no less often than it asks).
const PENDING_CHECK: Duration = Duration::from_secs(2);
/// While waiting for a reboot or a health check, the full slot check (GetPrimary and
/// GetSlotStatus, which run the bootloader backend for every slot) runs at most this often.
const FULL_CHECK_EVERY: Duration = Duration::from_secs(30);
/// Progress feedback during a download: at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Reads the time since this boot; a seam so that tests can move it.
pub type SinceBoot = Arc<dyn Fn() -> Duration + Send + Sync>;

/// Time since this boot from `/proc/uptime` (CLOCK_BOOTTIME: monotonic, counts suspend,
/// never stepped). The confirmation timeout runs on it: a box without an RTC boots in 1970
/// and NTP steps its wall clock by decades, which would fail an update at once (or never)
/// if the timeout ran on the wall clock.
pub fn since_boot() -> Duration {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64)
}

pub struct Agent<I> {
    s: Settings,
    since_boot: SinceBoot,
    /// The pending action whose new slot this process first saw booted, and the time since
    /// boot then: the confirmation timeout counts from it.
    booted_seen: Option<(String, Duration)>,
    client: DdiClient,
    installer: I,
    state: StateFile,
    backoff: Backoff,
    /// configData went out on the last cycle: do not re-poll at once again.
    config_sent: bool,
    /// A finished, verified download (action id, path): not hashed again every poll.
    verified: Option<(String, PathBuf)>,
    /// The action whose deferral (maintenance window, `update: skip`, RAUC busy) was
    /// already reported.
    deferred: Option<String>,
    /// When this process last ran the full slot check (`None`: not yet since it started,
    /// so after every reboot).
    last_full_check: Option<tokio::time::Instant>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `action-7-inferloop-1.1.0.raucb`: only characters safe in a file name, whatever the
/// server sent (public for the `ddi` fuzz target).
pub fn download_name(action_id: &str, filename: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let name = clean(filename);
    let name = name.trim_start_matches('.');
    format!(
        "action-{}-{}",
        clean(action_id),
        if name.is_empty() { "bundle" } else { name }
    )
}

impl<I: Installer + Sync> Agent<I> {
    pub fn new(s: Settings, installer: I) -> Result<Self, OtaError> {
        let client = DdiClient::new(&s)?;
        let backoff = Backoff::new(s.retry_min, s.retry_max, &s.controller_id);
        let state = StateFile::new(s.state_file.clone());
        Ok(Self {
            s,
            since_boot: Arc::new(since_boot),
            booted_seen: None,
            client,
            installer,
            state,
            backoff,
            config_sent: false,
            verified: None,
            deferred: None,
            last_full_check: None,
        })
    }

    /// Reads the time since boot from `f` instead of `/proc/uptime` (tests).
    pub fn set_since_boot(&mut self, f: SinceBoot) {
        self.since_boot = f;
    }

    /// `action` has waited for its confirmation longer than the timeout, counted on the
    /// time since boot from when this process first saw its new slot booted. The state
    /// file's `booted_at` (Unix seconds) is kept for people and older agents but decides
    /// nothing; an agent restarted meanwhile counts again from its restart (it may wait
    /// longer, never fail early).
    fn confirm_overdue(&mut self, action: &str) -> bool {
        let now = (self.since_boot)();
        match &self.booted_seen {
            Some((id, at)) if id == action => now.saturating_sub(*at) > self.s.confirm_timeout,
            _ => {
                self.booted_seen = Some((action.to_string(), now));
                false
            }
        }
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        tracing::info!(
            server = %self.client.base_url(),
            download_dir = %self.s.download_dir.display(),
            state_file = %self.s.state_file.display(),
            "inferloop-ota agent started"
        );
        loop {
            let wait = self.step().await;
            tracing::debug!(?wait, "next poll");
            tokio::select! {
                _ = &mut shutdown => {
                    tracing::info!("shutting down");
                    return;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One cycle; returns how long to wait before the next.
    pub async fn step(&mut self) -> Duration {
        match self.cycle().await {
            Ok(wait) => {
                if self.backoff.failures() > 0 {
                    tracing::info!(failures = self.backoff.failures(), "server reachable again");
                }
                self.backoff.reset();
                wait
            }
            Err(e) => {
                let wait = self.backoff.next_delay();
                if e.needs_operator() {
                    // A token or a certificate: logged as an error, since waiting alone
                    // does not fix it; still retried, the fix may be on the server.
                    tracing::error!(
                        kind = e.kind(),
                        error = %e,
                        failures = self.backoff.failures(),
                        retry_in = ?wait,
                        "cycle failed; retrying"
                    );
                } else {
                    tracing::warn!(
                        kind = e.kind(),
                        error = %e,
                        failures = self.backoff.failures(),
                        retry_in = ?wait,
                        "cycle failed; retrying"
                    );
                }
                wait
            }
        }
    }

    async fn cycle(&mut self) -> Result<Duration, OtaError> {
        let mut state = self.state.load()?;
        // A verdict that did not reach the server goes out before anything else.
        if let Some(c) = state.closed.clone().filter(|c| !c.reported) {
            self.client
                .deployment_feedback(&Feedback::closed(
                    &c.action_id,
                    c.finished,
                    c.details.clone(),
                ))
                .await?;
            tracing::info!(action = %c.action_id, finished = ?c.finished, "re-sent the final report");
            state.closed = Some(Closed {
                reported: true,
                ..c
            });
            self.state.save(&state)?;
        }
        if state.pending.is_some() {
            self.confirm(&mut state).await?;
        }

        let base = self.client.poll().await?;
        let mut wait = base
            .sleep()
            .unwrap_or(self.s.poll_default)
            .clamp(Duration::from_secs(1), self.s.poll_max);

        if let Some(link) = &base.links.config_data {
            if !self.config_sent {
                let compatible = match self.installer.compatible().await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(error = %e, "RAUC's compatible unknown; deriving hw_boardname from the manifest");
                        None
                    }
                };
                let data =
                    config::attributes(&self.s.manifest, compatible.as_deref(), &self.s.attributes);
                self.client
                    .put_config_data(&link.href, &ConfigData::merge(data.clone()))
                    .await?;
                tracing::info!(?data, "sent configData");
                self.config_sent = true;
                // The server files the box under its board now and may have an update for
                // it (goosebit would otherwise make a fresh box wait 10 s).
                return Ok(Duration::ZERO);
            }
        }
        self.config_sent = false;

        if let Some(link) = &base.links.cancel_action {
            let cancel: CancelActionBase = self.client.get_json(&link.href).await?;
            self.cancel(&cancel, &state).await?;
        } else if let Some(link) = &base.links.deployment_base {
            let d: DeploymentBase = self.client.get_json(&link.href).await?;
            self.deploy(&d, &mut state).await?;
        }
        if state.pending.is_some() {
            wait = wait.min(PENDING_CHECK);
        }
        Ok(wait)
    }

    /// Records and sends a final verdict. Saved first: if the server is down the next
    /// cycle sends it again rather than redoing the update.
    async fn close(
        &mut self,
        state: &mut State,
        action_id: &str,
        finished: Finished,
        details: Vec<String>,
    ) -> Result<(), OtaError> {
        match finished {
            Finished::Failure => tracing::error!(action = %action_id, ?details, "update failed"),
            _ => tracing::info!(action = %action_id, ?details, "update finished"),
        }
        state.pending = None;
        state.closed = Some(Closed {
            action_id: action_id.to_string(),
            finished,
            details: details.clone(),
            reported: false,
        });
        self.state.save(state)?;
        self.verified = None;
        self.deferred = None;
        self.client
            .deployment_feedback(&Feedback::closed(action_id, finished, details))
            .await?;
        if let Some(c) = state.closed.as_mut() {
            c.reported = true;
        }
        self.state.save(state)
    }

    /// Progress that may be lost: a failed send is logged, not fatal.
    async fn proceeding(&self, fb: Feedback) {
        if let Err(e) = self.client.deployment_feedback(&fb).await {
            tracing::warn!(error = %e, "progress feedback not delivered");
        }
    }

    /// After an install: has the box rebooted into the new slot, and has it been
    /// confirmed there? Reports the verdict once there is one.
    async fn confirm(&mut self, state: &mut State) -> Result<(), OtaError> {
        let Some(mut p) = state.pending.clone() else {
            return Ok(());
        };
        // Between reboots nothing changes but the health mark: look at the cheap things
        // first, and run the full check on the first look of every start, once the mark
        // is there, at the confirmation deadline and every FULL_CHECK_EVERY.
        let booted = self.installer.booted().await?;
        let due = self
            .last_full_check
            .is_none_or(|t| t.elapsed() >= FULL_CHECK_EVERY);
        let overdue =
            p.booted_at.is_some() && booted == p.to_bootname && self.confirm_overdue(&p.action_id);
        if !due && !overdue {
            if booted == p.from_bootname {
                return Ok(());
            }
            if booted == p.to_bootname
                && self.s.health_passed_file.is_some()
                && !self.health_mark(&p.to_bootname)
            {
                return Ok(());
            }
        }
        self.last_full_check = Some(tokio::time::Instant::now());
        let slots = self.installer.slots().await?;
        let target = slots
            .by_bootname(&p.to_bootname)
            .cloned()
            .unwrap_or_default();
        let target_status = target
            .boot_status
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let version = p.version.clone().unwrap_or_else(|| "the update".into());

        if slots.booted == p.to_bootname {
            if target_status == "bad" {
                let details = vec![format!(
                    "booted {version} from slot {} ({}) but the slot is marked bad (health check failed); the box falls back to slot {}",
                    p.to_bootname, p.to_slot, p.from_bootname
                )];
                return self
                    .close(state, &p.action_id, Finished::Failure, details)
                    .await;
            }
            let running = config::running_version(&self.s.manifest);
            if let (Some(want), Some(have)) = (&p.version, &running) {
                if want != have {
                    let details = vec![format!(
                        "slot {} booted but runs image {have}, not {want}",
                        p.to_bootname
                    )];
                    return self
                        .close(state, &p.action_id, Finished::Failure, details)
                        .await;
                }
            }
            let confirmed = target_status == "good"
                && (self.s.health_passed_file.is_none() || self.health_mark(&p.to_bootname));
            if confirmed {
                let details = vec![format!(
                    "running {version} from slot {} ({}), marked good by the health check",
                    p.to_bootname, p.to_slot
                )];
                return self
                    .close(state, &p.action_id, Finished::Success, details)
                    .await;
            }
            if p.booted_at.is_none() {
                p.booted_at = Some(now());
                state.pending = Some(p.clone());
                self.state.save(state)?;
                tracing::info!(slot = %p.to_bootname, "booted the new slot; waiting for the health check");
                self.proceeding(Feedback::progress(
                    &p.action_id,
                    95,
                    100,
                    vec![format!(
                        "booted {version} from slot {}; waiting for the health check",
                        p.to_bootname
                    )],
                ))
                .await;
            }
            if self.confirm_overdue(&p.action_id) {
                let details = vec![format!(
                    "slot {} was not confirmed within {} s of booting (health check did not pass)",
                    p.to_bootname,
                    self.s.confirm_timeout.as_secs()
                )];
                return self
                    .close(state, &p.action_id, Finished::Failure, details)
                    .await;
            }
            return Ok(());
        }

        if slots.booted == p.from_bootname
            && slots.primary.as_deref() == Some(p.to_slot.as_str())
            && target_status != "bad"
        {
            // Installed, not yet rebooted (or the agent restarted before the reboot).
            if self.s.reboot && !p.reboot_requested {
                p.reboot_requested = true;
                state.pending = Some(p.clone());
                self.state.save(state)?;
                self.reboot().await;
            }
            return Ok(());
        }

        let details = vec![format!(
            "the box came back on slot {} instead of {} ({}, now {}): {version} did not boot or was rolled back",
            slots.booted, p.to_bootname, p.to_slot, target_status
        )];
        self.close(state, &p.action_id, Finished::Failure, details)
            .await
    }

    /// `inferloop-health` wrote "<running image version> <bootname>" after it marked the
    /// slot good.
    fn health_mark(&self, bootname: &str) -> bool {
        let Some(f) = &self.s.health_passed_file else {
            return false;
        };
        let mark = std::fs::read_to_string(f).unwrap_or_default();
        let running = config::running_version(&self.s.manifest);
        mark.trim() == format!("{} {bootname}", running.as_deref().unwrap_or("unknown"))
    }

    async fn reboot(&self) {
        let cmd = &self.s.reboot_command;
        tracing::info!(command = ?cmd, "requesting a reboot into the new slot");
        let status = tokio::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .status()
            .await;
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                tracing::error!(command = ?cmd, status = %s, "reboot command failed; the update boots on the next reboot")
            }
            Err(e) => {
                tracing::error!(command = ?cmd, error = %e, "reboot command did not start; the update boots on the next reboot")
            }
        }
    }

    async fn cancel(&mut self, c: &CancelActionBase, state: &State) -> Result<(), OtaError> {
        let stop = &c.cancel_action.stop_id;
        if state.pending.as_ref().is_some_and(|p| &p.action_id == stop) {
            tracing::warn!(action = %stop, "cancel refused: the update is installed and waits for its reboot");
            let fb = Feedback::new(
                &c.id,
                Execution::Rejected,
                Finished::None,
                vec!["already installed into the other slot; it boots on the next reboot".into()],
            );
            return self.client.cancel_feedback(&fb).await;
        }
        self.forget_downloads(None)?;
        self.verified = None;
        self.deferred = None;
        tracing::info!(action = %stop, "update canceled by the server; download removed");
        let fb = Feedback::new(
            &c.id,
            Execution::Closed,
            Finished::Success,
            vec![format!("canceled action {stop}; nothing was installed")],
        );
        self.client.cancel_feedback(&fb).await
    }

    /// Removes every file in the download directory except `keep` and its partial file.
    fn forget_downloads(&self, keep: Option<&Path>) -> Result<(), OtaError> {
        let dir = &self.s.download_dir;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        let keep_part = keep.map(download::partial_path);
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            if !name.to_string_lossy().starts_with("action-") {
                continue;
            }
            if Some(path.as_path()) == keep || Some(&path) == keep_part.as_ref() {
                continue;
            }
            tracing::info!(file = %path.display(), "removing a stale download");
            std::fs::remove_file(&path).map_err(OtaError::io("removing", &path))?;
        }
        Ok(())
    }

    async fn deploy(&mut self, d: &DeploymentBase, state: &mut State) -> Result<(), OtaError> {
        let id = d.id.clone();
        if state.pending.as_ref().is_some_and(|p| p.action_id == id) {
            return Ok(());
        }
        if d.deployment.download == Handling::Skip {
            tracing::info!(action = %id, "deployment says download: skip; waiting");
            return Ok(());
        }
        let (chunk, artifact) = match d.bundle() {
            Ok(x) => x,
            Err(m) => {
                return self
                    .close(
                        state,
                        &id,
                        Finished::Failure,
                        vec![format!("nothing to install: {m}")],
                    )
                    .await
            }
        };
        let Some(url) = artifact.download_url().map(str::to_string) else {
            let details = vec![format!(
                "artifact {} has no download link",
                artifact.filename
            )];
            return self.close(state, &id, Finished::Failure, details).await;
        };
        let version = chunk.version.clone();
        let dest = self
            .s
            .download_dir
            .join(download_name(&id, &artifact.filename));
        std::fs::create_dir_all(&self.s.download_dir)
            .map_err(OtaError::io("creating", &self.s.download_dir))?;
        self.forget_downloads(Some(&dest))?;

        let ready =
            matches!(&self.verified, Some((a, p)) if a == &id && p == &dest && dest.exists());
        if !ready {
            if artifact.hashes.is_empty() {
                tracing::warn!(file = %artifact.filename, "the server gave no hash; relying on RAUC's signature check alone");
            }
            tracing::info!(action = %id, %url, size = ?artifact.size, file = %dest.display(), "downloading");
            self.proceeding(Feedback::progress(
                &id,
                0,
                100,
                vec![format!(
                    "downloading {} ({} bytes)",
                    artifact.filename,
                    artifact.size.map_or("?".into(), |s| s.to_string())
                )],
            ))
            .await;
            let req = download::Request {
                url: &url,
                size: artifact.size,
                hashes: &artifact.hashes,
                dest: dest.clone(),
            };
            let done = Arc::new(AtomicU64::new(0));
            let fetch = {
                let done = done.clone();
                download::fetch(self.client.http(), &req, move |n, _| {
                    done.store(n, Ordering::Relaxed)
                })
            };
            let outcome = tokio::select! {
                r = fetch => Ok(r),
                c = self.watch_download(&id, artifact.size, done) => Err(c),
            };
            match outcome {
                Ok(Ok(_)) => {}
                Ok(Err(e @ (OtaError::HashMismatch { .. } | OtaError::SizeMismatch { .. }))) => {
                    let details = vec![
                        format!("download rejected: {e}"),
                        "the file was deleted; nothing was installed".into(),
                    ];
                    return self.close(state, &id, Finished::Failure, details).await;
                }
                // The download directory cannot take the file (full, read-only, failing):
                // retrying would only fill it again. The partial file goes, so that the
                // rest of /data keeps its space, and the server hears why.
                Ok(Err(OtaError::Io { what, path, source }))
                    if path == download::partial_path(&dest) =>
                {
                    let _ = std::fs::remove_file(&path);
                    tracing::error!(action = %id, file = %path.display(), error = %source, "download stopped: {what} failed");
                    let details = vec![
                        format!("download stopped: {what} {} failed: {source}", path.display()),
                        "the partial file was deleted; nothing was installed; free space on the data partition (or make it writable) and assign the update again".into(),
                    ];
                    return self.close(state, &id, Finished::Failure, details).await;
                }
                Ok(Err(e)) => return Err(e),
                Err(cancel) => {
                    // The select dropped the transfer; the partial file goes too.
                    let cancel = cancel?;
                    return self.cancel(&cancel, state).await;
                }
            }
            tracing::info!(action = %id, file = %dest.display(), "download verified");
            self.verified = Some((id.clone(), dest.clone()));
        }

        let window = d.deployment.maintenance_window;
        if d.deployment.update == Handling::Skip || window == Some(MaintenanceWindow::Unavailable) {
            if self.deferred.as_deref() != Some(id.as_str()) {
                let why = if window == Some(MaintenanceWindow::Unavailable) {
                    "outside the maintenance window"
                } else {
                    "the server says update: skip"
                };
                tracing::info!(action = %id, why, "downloaded; install deferred");
                let fb = Feedback::new(
                    &id,
                    Execution::Downloaded,
                    Finished::None,
                    vec![format!("downloaded and verified; install deferred: {why}")],
                );
                self.proceeding(fb).await;
                self.deferred = Some(id.clone());
            }
            return Ok(());
        }

        // The server may have canceled while the download finished.
        let base = self.client.poll().await?;
        if let Some(link) = &base.links.cancel_action {
            let c: CancelActionBase = self.client.get_json(&link.href).await?;
            if c.cancel_action.stop_id == id {
                return self.cancel(&c, state).await;
            }
        }

        let op = self.installer.operation().await?;
        if op != "idle" {
            if self.deferred.as_deref() != Some(id.as_str()) {
                tracing::warn!(action = %id, operation = %op, "RAUC is busy; installing later");
                self.proceeding(Feedback::progress(
                    &id,
                    50,
                    100,
                    vec![format!("RAUC is busy ({op}); the install waits")],
                ))
                .await;
                self.deferred = Some(id.clone());
            }
            return Ok(());
        }
        let before = self.installer.slots().await?;
        tracing::info!(action = %id, bundle = %dest.display(), booted = %before.booted, "installing with RAUC");
        self.proceeding(Feedback::progress(
            &id,
            50,
            100,
            vec![format!("installing {} with RAUC", artifact.filename)],
        ))
        .await;
        let result = self.install_reporting(&id, &dest).await;
        match result {
            Ok(()) => {}
            Err(OtaError::InstallFailed { code, last_error }) => {
                let _ = std::fs::remove_file(&dest);
                let details = vec![
                    format!("RAUC refused {}: {last_error}", artifact.filename),
                    format!(
                        "Completed result {code}; the booted slot {} is unchanged",
                        before.booted
                    ),
                ];
                return self.close(state, &id, Finished::Failure, details).await;
            }
            Err(e) => return Err(e),
        }
        let after = self.installer.slots().await?;
        let to = after
            .primary
            .as_deref()
            .and_then(|name| after.by_name(name))
            .filter(|s| s.bootname.as_deref() != Some(before.booted.as_str()))
            .cloned();
        let Some(to) = to else {
            let details = vec![format!(
                "RAUC installed the bundle but the primary slot is {:?}, not the other slot; nothing to boot",
                after.primary
            )];
            return self.close(state, &id, Finished::Failure, details).await;
        };
        let to_bootname = to.bootname.clone().unwrap_or_default();
        let pending = Pending {
            action_id: id.clone(),
            version: version.clone(),
            from_bootname: before.booted.clone(),
            to_slot: to.name.clone(),
            to_bootname: to_bootname.clone(),
            installed_at: now(),
            booted_at: None,
            reboot_requested: false,
        };
        state.pending = Some(pending);
        self.state.save(state)?;
        // The bundle is in the slot now; the data partition gets its space back.
        let _ = std::fs::remove_file(&dest);
        self.verified = None;
        self.deferred = None;
        tracing::info!(action = %id, slot = %to.name, bootname = %to_bootname, "installed; reboot pending");
        self.proceeding(Feedback::progress(
            &id,
            90,
            100,
            vec![format!(
                "installed {} into slot {to_bootname} ({}); rebooting",
                version.as_deref().unwrap_or("the update"),
                to.name
            )],
        ))
        .await;
        if self.s.reboot {
            if let Some(p) = state.pending.as_mut() {
                p.reboot_requested = true;
            }
            self.state.save(state)?;
            self.reboot().await;
        }
        Ok(())
    }

    /// Download progress to the server, and a watch for a cancel of this action. Resolves
    /// only on a cancel (or an error while fetching it).
    async fn watch_download(
        &self,
        id: &str,
        size: Option<u64>,
        done: Arc<AtomicU64>,
    ) -> Result<CancelActionBase, OtaError> {
        let poll_every = self.s.poll_default.min(Duration::from_secs(30));
        let mut last_poll = tokio::time::Instant::now();
        let mut last_pct = 0u64;
        loop {
            tokio::time::sleep(PROGRESS_EVERY).await;
            if let Some(total) = size.filter(|t| *t > 0) {
                let pct = done.load(Ordering::Relaxed).saturating_mul(100) / total;
                if pct >= last_pct + 5 && pct < 100 {
                    last_pct = pct;
                    // goosebit reads "Downloaded N%" into its progress column.
                    self.proceeding(Feedback::progress(
                        id,
                        (pct / 2) as u32,
                        100,
                        vec![format!("Downloaded {pct}%")],
                    ))
                    .await;
                }
            }
            if last_poll.elapsed() >= poll_every {
                last_poll = tokio::time::Instant::now();
                let Ok(base) = self.client.poll().await else {
                    continue;
                };
                if let Some(link) = base.links.cancel_action {
                    let c: CancelActionBase = self.client.get_json(&link.href).await?;
                    if c.cancel_action.stop_id == id {
                        return Ok(c);
                    }
                }
            }
        }
    }

    /// RAUC's install with its progress forwarded as feedback.
    async fn install_reporting(&self, id: &str, bundle: &Path) -> Result<(), OtaError> {
        let (tx, mut rx) = mpsc::channel::<InstallProgress>(16);
        let install = self.installer.install(bundle, tx);
        tokio::pin!(install);
        let mut last_sent = tokio::time::Instant::now() - PROGRESS_EVERY;
        loop {
            tokio::select! {
                r = &mut install => return r,
                Some(p) = rx.recv() => {
                    tracing::info!(percentage = p.percentage, message = %p.message, "RAUC");
                    if last_sent.elapsed() >= Duration::from_millis(500) {
                        last_sent = tokio::time::Instant::now();
                        let cnt = 50 + (p.percentage.clamp(0, 100) as u32) * 40 / 100;
                        self.proceeding(Feedback::progress(
                            id,
                            cnt,
                            100,
                            vec![format!("RAUC: {}% {}", p.percentage, p.message)],
                        ))
                        .await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_names_keep_only_safe_characters() {
        assert_eq!(
            download_name("7", "inferloop-1.1.0.raucb"),
            "action-7-inferloop-1.1.0.raucb"
        );
        assert_eq!(
            download_name("7/../x", "../../etc/passwd"),
            "action-7_.._x-_.._etc_passwd"
        );
        assert_eq!(download_name("1", ".."), "action-1-bundle");
    }
}
