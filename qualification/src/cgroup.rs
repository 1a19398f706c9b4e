//! A child memory cgroup (v1 `memory` controller or cgroup2 with `memory` enabled) to start
//! the daemon in, with its raw kernel counters for the report. Needs root.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

pub struct Cgroup {
    pub dir: PathBuf,
    pub v2: bool,
}

impl Cgroup {
    /// Creates `<hierarchy>/<name>-<pid>`, or says why it cannot.
    pub fn create(name: &str) -> Result<Cgroup, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not running as root (cgroups need root)".into());
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let (parent, is_v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.to_path_buf(), false)
        } else if std::fs::read_to_string(v2)
            .map(|c| c.split_whitespace().any(|x| x == "memory"))
            .unwrap_or(false)
        {
            (PathBuf::from("/sys/fs/cgroup"), true)
        } else {
            return Err(
                "no writable cgroup memory controller (neither /sys/fs/cgroup/memory nor cgroup2 with memory)"
                    .into(),
            );
        };
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .map_err(|e| format!("cannot create cgroup {}: {e}", dir.display()))?;
        Ok(Cgroup { dir, v2: is_v2 })
    }

    pub fn version(&self) -> &'static str {
        if self.v2 {
            "v2"
        } else {
            "v1"
        }
    }

    /// Sets the memory limit (and no swap on v2, so the kernel refuses instead of swapping).
    pub fn limit(&self, bytes: u64) -> Result<(), String> {
        let file = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(self.dir.join(file), bytes.to_string())
            .map_err(|e| format!("cannot set {file}: {e}"))?;
        if self.v2 {
            // Absent when the kernel has no swap accounting; nothing to turn off then.
            std::fs::write(self.dir.join("memory.swap.max"), "0").ok();
        }
        Ok(())
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    /// `oom_kill` from memory.events (v2) or memory.oom_control (v1), with the raw text.
    pub fn oom_kills(&self) -> (Option<u64>, String) {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = self.read(file).unwrap_or_default();
        let n = text
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok());
        (n, text)
    }

    /// Peak usage: memory.peak (v2) or memory.max_usage_in_bytes (v1).
    pub fn peak(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.read(file).and_then(|s| s.trim().parse().ok())
    }

    /// Every counter file worth keeping, raw, for the report.
    pub fn counters(&self) -> Value {
        let files: &[&str] = if self.v2 {
            &[
                "memory.max",
                "memory.peak",
                "memory.events",
                "memory.current",
            ]
        } else {
            &[
                "memory.limit_in_bytes",
                "memory.max_usage_in_bytes",
                "memory.failcnt",
                "memory.oom_control",
                "memory.usage_in_bytes",
            ]
        };
        let mut out = serde_json::Map::new();
        out.insert("cgroup".into(), json!(self.dir.display().to_string()));
        out.insert("version".into(), json!(self.version()));
        for f in files {
            out.insert(
                (*f).into(),
                json!(self.read(f).map(|s| s.trim().to_string())),
            );
        }
        Value::Object(out)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The cgroup can only go once its processes have; callers wait for them first.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("qual: could not remove cgroup {}", self.dir.display());
    }
}
