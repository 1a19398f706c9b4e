//! A data partition that cannot be written: the daemon serves anyway and says so once.

use std::path::Path;

use crate::harness::{chat_body, Daemon};

/// Mounts a tmpfs of `size` at `dir` with `opts`; false when this process may not (not
/// root), and the test is skipped.
fn mount_tmpfs(dir: &Path, opts: &str) -> bool {
    std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0).status();
    }
}

/// `--state-dir` on a read-only filesystem (a `/data` remounted read-only after errors):
/// the prompt cache's disk tier is off with one warning, and requests are served.
#[tokio::test]
async fn a_read_only_state_dir_turns_the_disk_tier_off_and_serving_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    if !mount_tmpfs(dir.path(), "size=1m,ro") {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let _unmount = Unmount(dir.path());
    let d = Daemon::start(&[
        "--state-dir",
        dir.path().to_str().expect("utf-8"),
        "--slots",
        "1",
        "--ctx",
        "512",
    ]);
    for i in 0..3 {
        let v = d.chat(&chat_body(&format!("Question {i}: why?"), 2)).await;
        assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    }
    let log = d.log();
    assert_eq!(
        log.matches("prompt cache disk tier off").count(),
        1,
        "{}",
        d.log_tail()
    );
    assert!(log.contains("Read-only file system"), "{}", d.log_tail());
}
