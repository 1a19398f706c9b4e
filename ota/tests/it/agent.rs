//! The agent's policy against the fake server and a fake RAUC: maintenance windows,
//! cancels, a busy or refusing RAUC, a server answering garbage, and the verdict after
//! the reboot. (The real RAUC and goosebit are in tests/fleet/test_fleet.py.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inferloop_ota::agent::Agent;
use inferloop_ota::config::{ConfigFile, Overrides, Settings};
use inferloop_ota::download::digest_file;
use inferloop_ota::state::{Pending, State, StateFile};
use inferloop_ota::OtaError;
use serde_json::{json, Value};

use crate::fake::{Fake, FakeRauc, Script};

pub(crate) struct Setup {
    pub fake: Fake,
    pub rauc: FakeRauc,
    pub agent: Agent<FakeRauc>,
    pub dir: tempfile::TempDir,
}

impl Setup {
    fn download_dir(&self) -> PathBuf {
        self.dir.path().join("ota")
    }

    pub fn downloads(&self) -> Vec<String> {
        std::fs::read_dir(self.download_dir())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("action-"))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn state(&self) -> State {
        StateFile::new(self.dir.path().join("ota/state.json"))
            .load()
            .expect("state")
    }
}

fn deployment(fake_url: &str, bundle: &[u8], window: Option<&str>) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("b");
    std::fs::write(&p, bundle).expect("write");
    let d = digest_file(&p).expect("digest");
    let mut dep = json!({
        "download": "forced", "update": "forced",
        "chunks": [{"part": "os", "version": "1.1.0", "name": "inferloop", "artifacts": [{
            "filename": "inferloop-1.1.0.raucb",
            "hashes": {"sha1": d.sha1, "md5": d.md5, "sha256": d.sha256},
            "size": bundle.len(),
            "_links": {"download-http": {"href": format!("{fake_url}/artifact")}}
        }]}]
    });
    if let Some(w) = window {
        dep["maintenanceWindow"] = json!(w);
    }
    json!({"id": "5", "deployment": dep})
}

pub(crate) fn base_with(fake_url: &str, link: &str, id: &str) -> Value {
    json!({"config": {"polling": {"sleep": "00:00:01"}},
           "_links": {link: {"href": format!("{fake_url}/DEFAULT/controller/v1/box/{link}/{id}")}}})
}

async fn setup(window: Option<&str>, health_ok: bool) -> Setup {
    let fake = Fake::start(Script::default()).await;
    agent_on(fake, window, health_ok, |_| {}).expect("agent")
}

/// The bundle every fake deployment offers.
pub(crate) fn bundle() -> Vec<u8> {
    vec![7u8; 50_000]
}

/// Scripts `fake` to offer deployment 5 (the artifact on the fake itself) and builds an
/// agent against it; `adjust` edits the config first (tokens, `ca_file`).
pub(crate) fn agent_on(
    fake: Fake,
    window: Option<&str>,
    health_ok: bool,
    adjust: impl FnOnce(&mut ConfigFile),
) -> Result<Setup, OtaError> {
    let url = fake.url.clone();
    let bundle = bundle();
    fake.with(|s| {
        s.artifact = bundle.clone();
        s.base = Some(base_with(&url, "deploymentBase", "5"));
        s.deployment = deployment(&url, &bundle, window);
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let health = dir.path().join("health-passed");
    if health_ok {
        std::fs::write(&health, "unknown B\n").expect("write");
    }
    let mut file = ConfigFile {
        server: Some(fake.url.clone()),
        controller_id: Some("box".into()),
        download_dir: Some(dir.path().join("ota")),
        state_file: Some(dir.path().join("ota/state.json")),
        manifest: Some(dir.path().join("no-manifest.json")),
        reboot: Some(false),
        health_passed_file: Some(health),
        retry_min_s: Some(1.0),
        retry_max_s: Some(8.0),
        ..ConfigFile::default()
    };
    adjust(&mut file);
    let s =
        Settings::from_file(file, &Overrides::default(), Path::new("test.toml")).expect("settings");
    let rauc = FakeRauc::new();
    let agent = Agent::new(s, rauc.clone())?;
    Ok(Setup {
        fake,
        rauc,
        agent,
        dir,
    })
}

pub(crate) fn executions(fb: &[Value]) -> Vec<String> {
    fb.iter()
        .map(|f| {
            format!(
                "{}/{}",
                f["status"]["execution"].as_str().unwrap_or("?"),
                f["status"]["result"]["finished"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

#[tokio::test]
async fn unavailable_maintenance_window_downloads_but_installs_only_once_available() {
    let mut t = setup(Some("unavailable"), false).await;
    t.agent.step().await;
    t.agent.step().await;
    assert!(t.rauc.with(|r| r.installs.is_empty()));
    assert_eq!(t.downloads(), ["action-5-inferloop-1.1.0.raucb"]);
    let fb = t.fake.feedback();
    assert_eq!(
        executions(&fb)
            .iter()
            .filter(|e| *e == "downloaded/none")
            .count(),
        1,
        "{fb:#?}"
    );
    // Downloaded once, not again on the second poll.
    assert_eq!(t.fake.requests("/artifact").len(), 1);

    let url = t.fake.url.clone();
    t.fake
        .with(|s| s.deployment["deployment"]["maintenanceWindow"] = json!("available"));
    t.agent.step().await;
    assert_eq!(t.rauc.with(|r| r.installs.len()), 1);
    let p = t.state().pending.expect("pending");
    assert_eq!(
        (p.to_slot.as_str(), p.to_bootname.as_str()),
        ("rootfs.1", "B")
    );
    assert!(t.downloads().is_empty(), "the installed bundle is removed");
    assert!(url.starts_with("http://127.0.0.1:"));
}

#[tokio::test]
async fn cancel_before_install_removes_the_download_and_confirms_the_cancel() {
    let mut t = setup(Some("unavailable"), false).await;
    t.agent.step().await;
    assert_eq!(t.downloads().len(), 1);
    let url = t.fake.url.clone();
    t.fake.with(|s| {
        s.base = Some(base_with(&url, "cancelAction", "5"));
        s.cancel = json!({"id": "5", "cancelAction": {"stopId": "5"}});
    });
    t.agent.step().await;
    assert!(t.downloads().is_empty());
    assert!(t.rauc.with(|r| r.installs.is_empty()));
    let cancel = t.fake.requests("/cancelAction/5/feedback");
    assert_eq!(cancel.len(), 1, "{cancel:?}");
    assert_eq!(cancel[0].1["status"]["execution"], "closed");
    assert_eq!(cancel[0].1["status"]["result"]["finished"], "success");
}

#[tokio::test]
async fn a_busy_rauc_defers_the_install_and_a_refusal_reports_last_error() {
    let mut t = setup(None, false).await;
    t.rauc.with(|r| r.operation = "installing".into());
    t.agent.step().await;
    assert!(
        t.rauc.with(|r| r.installs.is_empty()),
        "installed while RAUC was busy"
    );
    assert!(t
        .fake
        .feedback()
        .iter()
        .any(|f| f.to_string().contains("RAUC is busy")));

    t.rauc.with(|r| {
        r.operation = "idle".into();
        r.refuse = Some("Compatible mismatch: Expected 'a' but bundle manifest has 'b'".into());
    });
    t.agent.step().await;
    let fb = t.fake.feedback();
    let last = fb.last().expect("feedback");
    assert_eq!(executions(std::slice::from_ref(last)), ["closed/failure"]);
    assert!(last.to_string().contains("Compatible mismatch"), "{last}");
    let closed = t.state().closed.expect("closed");
    assert!(closed.reported && t.state().pending.is_none());
}

#[tokio::test]
async fn garbage_from_the_server_backs_off_exponentially_and_recovers() {
    let mut t = setup(None, false).await;
    t.fake.with(|s| s.base = None);
    let waits: Vec<Duration> = [(); 4].iter().map(|_| Duration::ZERO).collect();
    let mut got = Vec::new();
    for _ in waits {
        got.push(t.agent.step().await);
    }
    // base 1 s doubling to the 8 s cap, minus up to 25 % jitter.
    for (w, plain) in got.iter().zip([1u64, 2, 4, 8]) {
        let plain = Duration::from_secs(plain);
        assert!(*w <= plain && *w >= plain * 3 / 4, "{got:?}");
    }
    t.fake.with(|s| {
        s.base = Some(json!({"config": {"polling": {"sleep": "00:00:07"}}, "_links": {}}))
    });
    assert_eq!(t.agent.step().await, Duration::from_secs(7));
}

#[tokio::test]
async fn config_data_carries_raucs_compatible_and_polls_again_at_once() {
    let mut t = setup(None, false).await;
    let url = t.fake.url.clone();
    t.fake.with(|s| {
        s.base = Some(json!({"config": {"polling": {"sleep": "00:00:10"}},
            "_links": {"configData": {"href": format!("{url}/DEFAULT/controller/v1/box/configData")}}}))
    });
    assert_eq!(t.agent.step().await, Duration::ZERO);
    let put = t.fake.requests("/configData");
    assert_eq!(put[0].0, "PUT");
    assert_eq!(put[0].1["mode"], "merge");
    assert_eq!(put[0].1["data"]["hw_boardname"], "inferloop-test-board");
    // A server that keeps asking is answered once per cycle, not in a tight loop.
    assert_eq!(t.agent.step().await, Duration::from_secs(10));
}

fn pending() -> Pending {
    Pending {
        action_id: "5".into(),
        version: None,
        from_bootname: "A".into(),
        to_slot: "rootfs.1".into(),
        to_bootname: "B".into(),
        installed_at: 1,
        booted_at: None,
        reboot_requested: true,
    }
}

#[tokio::test]
async fn after_the_reboot_a_confirmed_slot_is_success_and_a_fallback_is_failure() {
    let mut t = setup(None, true).await;
    t.fake.with(|s| s.base = Some(json!({"_links": {}})));
    let sf = StateFile::new(t.dir.path().join("ota/state.json"));
    sf.save(&State {
        pending: Some(pending()),
        closed: None,
    })
    .expect("save");
    // Not rebooted yet: nothing final.
    t.rauc.with(|r| r.primary = "rootfs.1".into());
    t.agent.step().await;
    assert!(t.fake.feedback().is_empty());
    // Booted B, health passed: success.
    t.rauc.with(|r| r.booted = "B".into());
    t.agent.step().await;
    assert_eq!(executions(&t.fake.feedback()), ["closed/success"]);

    let mut t = setup(None, false).await;
    t.fake.with(|s| s.base = Some(json!({"_links": {}})));
    StateFile::new(t.dir.path().join("ota/state.json"))
        .save(&State {
            pending: Some(pending()),
            closed: None,
        })
        .expect("save");
    // Came back on A, B marked bad by the health check.
    t.rauc.with(|r| {
        r.primary = "rootfs.0".into();
        r.b_status = "bad".into();
    });
    t.agent.step().await;
    let fb = t.fake.feedback();
    assert_eq!(executions(&fb), ["closed/failure"]);
    assert!(fb[0].to_string().contains("came back on slot A"), "{fb:?}");
}

/// No final report has gone out yet.
fn still_waiting(fake: &Fake) {
    let fb = fake.feedback();
    assert!(
        executions(&fb).iter().all(|e| !e.starts_with("closed")),
        "{fb:?}"
    );
}

/// The confirmation timeout runs on the time since boot, not the wall clock: a box that
/// booted with no RTC and had its clock stepped by NTP (here: `booted_at` ten hours "ago"
/// on the wall clock) keeps waiting for its health check, and fails the update only once
/// the time since boot has moved past the timeout (600 s) from when the agent saw the slot
/// booted.
#[tokio::test]
async fn a_stepped_wall_clock_does_not_fail_an_update_awaiting_its_health_check() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let mut t = setup(None, false).await;
    t.fake.with(|s| s.base = Some(json!({"_links": {}})));
    let uptime = Arc::new(AtomicU64::new(30));
    let seen = uptime.clone();
    t.agent.set_since_boot(Arc::new(move || {
        Duration::from_secs(seen.load(Ordering::SeqCst))
    }));
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let mut p = pending();
    p.booted_at = Some(wall_now - 10 * 3600);
    StateFile::new(t.dir.path().join("ota/state.json"))
        .save(&State {
            pending: Some(p),
            closed: None,
        })
        .expect("save");
    t.rauc.with(|r| {
        r.primary = "rootfs.1".into();
        r.booted = "B".into();
    });
    // Booted B, no health mark yet, 30 s after boot: still waiting.
    t.agent.step().await;
    still_waiting(&t.fake);
    // 500 s on: still within the timeout.
    uptime.store(530, Ordering::SeqCst);
    t.agent.step().await;
    still_waiting(&t.fake);
    // Past it: the update failed.
    uptime.store(700, Ordering::SeqCst);
    t.agent.step().await;
    let fb = t.fake.feedback();
    assert!(
        executions(&fb).iter().any(|e| e == "closed/failure"),
        "{fb:?}"
    );
    assert!(
        fb.iter()
            .any(|f| f.to_string().contains("not confirmed within")),
        "{fb:?}"
    );
}

/// A data partition that fills up during the download: the transfer stops, the partial file
/// is removed (its space back), nothing is installed, and the server gets a closed/failure
/// naming the cause. A real full filesystem: a 16 KiB tmpfs (needs root to mount; skipped
/// otherwise) against a 50,000-byte bundle.
#[tokio::test]
async fn a_full_download_directory_stops_the_download_and_reports_it() {
    let full = tempfile::tempdir().expect("tempdir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"])
        .arg(full.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(full.path());
    let fake = Fake::start(Script::default()).await;
    let downloads = full.path().join("ota");
    let mut t = agent_on(fake, None, false, |f| {
        f.download_dir = Some(downloads.clone());
    })
    .expect("agent");
    t.agent.step().await;

    let fb = t.fake.feedback();
    let last = fb.last().expect("feedback");
    assert_eq!(
        executions(std::slice::from_ref(last)),
        ["closed/failure"],
        "{fb:?}"
    );
    assert!(
        last.to_string().contains("No space left on device"),
        "{last}"
    );
    assert!(t.rauc.with(|r| r.installs.is_empty()), "nothing installed");
    let left: Vec<_> = std::fs::read_dir(&downloads)
        .expect("download dir")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| n.to_string_lossy().contains("action-"))
        .collect();
    assert!(left.is_empty(), "partial file left behind: {left:?}");
}
