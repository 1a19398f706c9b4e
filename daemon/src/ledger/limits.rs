//! Where the memory limit comes from: the process's own cgroup (v2 `memory.max` or v1
//! `memory.limit_in_bytes`, including every ancestor's), `MemAvailable`, and a configured
//! budget. The `/proc` and `/sys` roots are injectable so fixture trees stand in for a real
//! box.

use std::path::{Path, PathBuf};

use inferloop_board::Roots;
use serde::Serialize;

/// Values at or above this mean "no limit" (cgroup v1 reports unlimited as ~2^63 rounded to
/// a page).
const UNLIMITED: u64 = 1 << 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitSource {
    CgroupV2,
    CgroupV1,
    MemAvailable,
    MemoryBudget,
}

impl LimitSource {
    /// The `reason=` word of the refusal line and the metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::CgroupV2 => "cgroup-v2",
            Self::CgroupV1 => "cgroup-v1",
            Self::MemAvailable => "mem-available",
            Self::MemoryBudget => "memory-budget",
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Self::CgroupV2 | Self::CgroupV1 => "cgroup-limit",
            Self::MemAvailable => "mem-available",
            Self::MemoryBudget => "memory-budget",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub source: LimitSource,
    pub bytes: u64,
    /// The file or flag it was read from.
    pub from: String,
}

/// Reads every limit that applies: `/proc/self/cgroup`, `/proc/self/mountinfo` and
/// `/proc/meminfo` under `roots.proc_root`; the cgroup files of the mount points that
/// mountinfo names, mapped under `roots.sys_root`. The roots are `/proc` and `/sys` on a real
/// system.
pub fn read_limits(roots: &Roots, budget_bytes: Option<u64>) -> Vec<Limit> {
    let mut limits = Vec::new();
    let proc_root = &roots.proc_root;
    let cgroups = read_to_string(&proc_root.join("self/cgroup")).unwrap_or_default();
    let mounts = read_to_string(&proc_root.join("self/mountinfo")).unwrap_or_default();
    for (version, cg_path) in own_cgroups(&cgroups) {
        let hierarchy = hierarchy(&mounts, version, &cg_path);
        if let Some(limit) = tightest_in_ancestors(&hierarchy, &roots.sys_root, version) {
            limits.push(limit);
        }
    }
    if let Some(avail) = mem_available(&proc_root.join("meminfo")) {
        limits.push(Limit {
            source: LimitSource::MemAvailable,
            bytes: avail,
            from: "/proc/meminfo MemAvailable".into(),
        });
    }
    if let Some(bytes) = budget_bytes {
        limits.push(Limit {
            source: LimitSource::MemoryBudget,
            bytes,
            from: "--memory-budget".into(),
        });
    }
    limits
}

fn read_to_string(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CgVersion {
    V1,
    V2,
}

/// The process's cgroup path per hierarchy: `0::/path` (v2) and `N:...memory...:/path` (v1).
fn own_cgroups(proc_cgroup: &str) -> Vec<(CgVersion, String)> {
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.push((CgVersion::V2, path.to_string()));
        } else if controllers.split(',').any(|c| c == "memory") {
            out.push((CgVersion::V1, path.to_string()));
        }
    }
    out
}

/// The process's cgroup in one hierarchy, as the running system names it.
#[derive(Debug, PartialEq, Eq)]
struct Hierarchy {
    /// Where the hierarchy is mounted, e.g. `/sys/fs/cgroup`.
    mount_point: String,
    /// The cgroup's directory below the mount point, without a leading `/`.
    rel: PathBuf,
}

/// Finds where the hierarchy is mounted (mountinfo), mapping the cgroup path through the
/// mount's root (containers mount a sub-tree). Falls back to the usual locations.
fn hierarchy(mountinfo: &str, version: CgVersion, cg_path: &str) -> Hierarchy {
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.len() < 3 {
            continue;
        }
        let (mount_root, mount_point, fstype, super_opts) = (left[3], left[4], right[0], right[2]);
        let matches = match version {
            CgVersion::V2 => fstype == "cgroup2",
            CgVersion::V1 => fstype == "cgroup" && super_opts.split(',').any(|o| o == "memory"),
        };
        if !matches {
            continue;
        }
        let rel = if mount_root == "/" {
            cg_path
        } else {
            cg_path.strip_prefix(mount_root).unwrap_or(cg_path)
        };
        return Hierarchy {
            mount_point: mount_point.to_string(),
            rel: PathBuf::from(rel.trim_start_matches('/')),
        };
    }
    let fallback = match version {
        CgVersion::V2 => "/sys/fs/cgroup",
        CgVersion::V1 => "/sys/fs/cgroup/memory",
    };
    Hierarchy {
        mount_point: fallback.to_string(),
        rel: PathBuf::from(cg_path.trim_start_matches('/')),
    }
}

/// Where a directory the running system names by its absolute path lies under the roots:
/// `/sys/...` maps into `sys_root`. A cgroup mounted elsewhere (rare: `/run/...`, `/cgroup`)
/// maps beside it, under `sys_root`'s parent, so a fixture tree `T/sys` keeps the rest under
/// `T/`, and the real `/sys` maps every path to itself.
fn on_host(sys_root: &Path, abs: &str) -> PathBuf {
    let rel = Path::new(abs.trim_start_matches('/'));
    match rel.strip_prefix("sys") {
        Ok(inside) => sys_root.join(inside),
        Err(_) => sys_root.parent().unwrap_or(sys_root).join(rel),
    }
}

/// The smallest limit set on the cgroup or any ancestor inside the mount. `from` names the
/// file as the running system does, wherever the roots point.
fn tightest_in_ancestors(h: &Hierarchy, sys_root: &Path, version: CgVersion) -> Option<Limit> {
    let (file, source) = match version {
        CgVersion::V2 => ("memory.max", LimitSource::CgroupV2),
        CgVersion::V1 => ("memory.limit_in_bytes", LimitSource::CgroupV1),
    };
    let base = on_host(sys_root, &h.mount_point);
    let mut best: Option<Limit> = None;
    // `a/b`, then `a`, then `` (the mount point itself), then `None`.
    let mut cur = Some(h.rel.as_path());
    while let Some(rel) = cur {
        let f = base.join(rel).join(file);
        if let Some(bytes) = read_to_string(&f).and_then(|s| parse_limit(&s)) {
            if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                let shown = Path::new(&h.mount_point).join(rel).join(file);
                best = Some(Limit {
                    source,
                    bytes,
                    from: shown.display().to_string(),
                });
            }
        }
        cur = rel.parent();
    }
    best
}

/// `max` or a byte count; "no limit" yields `None`.
fn parse_limit(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "max" {
        return None;
    }
    s.parse::<u64>().ok().filter(|v| *v < UNLIMITED)
}

fn mem_available(meminfo: &Path) -> Option<u64> {
    let text = read_to_string(meminfo)?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    const MEMINFO: &str = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n";

    #[test]
    fn cgroup_v2_limit_is_read_from_the_own_cgroup() {
        let d = tempfile::tempdir().expect("tmp");
        let r = d.path();
        write(
            r,
            "proc/self/cgroup",
            "0::/system.slice/inferloopd.service\n",
        );
        write(
            r,
            "proc/self/mountinfo",
            "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
        );
        write(
            r,
            "sys/fs/cgroup/system.slice/inferloopd.service/memory.max",
            "536870912\n",
        );
        write(r, "sys/fs/cgroup/system.slice/memory.max", "max\n");
        write(r, "proc/meminfo", MEMINFO);
        let limits = read_limits(&Roots::under(r), None);
        assert_eq!(limits[0].source, LimitSource::CgroupV2);
        assert_eq!(limits[0].bytes, 536_870_912);
        assert_eq!(
            limits[0].from,
            "/sys/fs/cgroup/system.slice/inferloopd.service/memory.max"
        );
        assert_eq!(limits[1].bytes, 20_000_000 * 1024);
    }

    #[test]
    fn cgroup_v2_max_means_no_limit() {
        let d = tempfile::tempdir().expect("tmp");
        let r = d.path();
        write(r, "proc/self/cgroup", "0::/user.slice\n");
        write(r, "sys/fs/cgroup/user.slice/memory.max", "max\n");
        let limits = read_limits(&Roots::under(r), None);
        assert!(limits.is_empty(), "{limits:?}");
    }

    #[test]
    fn cgroup_v1_limit_takes_the_tightest_ancestor() {
        let d = tempfile::tempdir().expect("tmp");
        let r = d.path();
        write(
            r,
            "proc/self/cgroup",
            "12:pids:/a/b\n9:memory:/a/b\n1:name=systemd:/a/b\n",
        );
        write(
            r,
            "proc/self/mountinfo",
            "40 30 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/a/b/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/a/memory.limit_in_bytes",
            "1073741824\n",
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        let limits = read_limits(&Roots::under(r), Some(5 << 30));
        assert_eq!(limits[0].source, LimitSource::CgroupV1);
        assert_eq!(limits[0].bytes, 1 << 30);
        assert_eq!(
            limits[0].from,
            "/sys/fs/cgroup/memory/a/memory.limit_in_bytes"
        );
        assert_eq!(limits[1].source, LimitSource::MemoryBudget);
    }

    #[test]
    fn container_mount_root_is_stripped_from_the_cgroup_path() {
        let d = tempfile::tempdir().expect("tmp");
        let r = d.path();
        write(r, "proc/self/cgroup", "0::/docker/abc\n");
        write(
            r,
            "proc/self/mountinfo",
            "30 1 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
        );
        write(r, "sys/fs/cgroup/memory.max", "268435456\n");
        let limits = read_limits(&Roots::under(r), None);
        assert_eq!(limits.first().map(|l| l.bytes), Some(268_435_456));
    }

    #[test]
    fn meminfo_without_mem_available_yields_nothing() {
        let d = tempfile::tempdir().expect("tmp");
        write(d.path(), "proc/meminfo", "MemTotal: 1 kB\n");
        assert!(read_limits(&Roots::under(d.path()), None).is_empty());
    }

    #[test]
    fn the_real_system_is_read_without_error() {
        let limits = read_limits(&Roots::default(), None);
        assert!(limits.iter().any(|l| l.source == LimitSource::MemAvailable));
    }

    #[test]
    fn proc_and_sys_roots_in_unrelated_dirs_are_each_read() {
        let proc_dir = tempfile::tempdir().expect("tmp");
        let sys_dir = tempfile::tempdir().expect("tmp");
        let (p, s) = (proc_dir.path(), sys_dir.path());
        write(p, "self/cgroup", "0::/system.slice/inferloopd.service\n");
        write(
            p,
            "self/mountinfo",
            "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
        );
        write(p, "meminfo", MEMINFO);
        write(s, "fs/cgroup/system.slice/memory.max", "402653184\n");
        write(
            s,
            "fs/cgroup/system.slice/inferloopd.service/memory.max",
            "max\n",
        );
        let roots = Roots {
            proc_root: p.to_path_buf(),
            sys_root: s.to_path_buf(),
        };
        let limits = read_limits(&roots, None);
        assert_eq!(limits.len(), 2, "{limits:?}");
        assert_eq!(limits[0].source, LimitSource::CgroupV2);
        assert_eq!(limits[0].bytes, 402_653_184);
        // Named as on the box, not as in the fixture.
        assert_eq!(limits[0].from, "/sys/fs/cgroup/system.slice/memory.max");
        assert_eq!(limits[1].source, LimitSource::MemAvailable);
        assert_eq!(limits[1].bytes, 20_000_000 * 1024);
    }

    #[test]
    fn cgroup_mounted_outside_sys_is_read_beside_the_sys_root() {
        let d = tempfile::tempdir().expect("tmp");
        let r = d.path();
        write(r, "proc/self/cgroup", "0::/app\n");
        write(
            r,
            "proc/self/mountinfo",
            "30 1 0:26 / /run/cgroup2 rw - cgroup2 cgroup2 rw\n",
        );
        write(r, "run/cgroup2/app/memory.max", "134217728\n");
        let limits = read_limits(&Roots::under(r), None);
        assert_eq!(limits.first().map(|l| l.bytes), Some(134_217_728));
        assert_eq!(limits[0].from, "/run/cgroup2/app/memory.max");
    }

    #[test]
    fn limits_above_the_mount_point_are_not_read() {
        let d = tempfile::tempdir().expect("tmp");
        let r = d.path();
        write(r, "proc/self/cgroup", "0::/a\n");
        write(
            r,
            "proc/self/mountinfo",
            "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        write(r, "sys/fs/cgroup/a/memory.max", "max\n");
        write(r, "sys/fs/memory.max", "1\n");
        assert!(read_limits(&Roots::under(r), None).is_empty());
    }

    #[test]
    fn roots_map_mount_points_into_the_sys_root() {
        let sys = Path::new("/fixture/sys");
        assert_eq!(
            on_host(sys, "/sys/fs/cgroup"),
            PathBuf::from("/fixture/sys/fs/cgroup")
        );
        assert_eq!(
            on_host(sys, "/run/cgroup2"),
            PathBuf::from("/fixture/run/cgroup2")
        );
        // `/sysfoo` is not under `/sys`.
        assert_eq!(on_host(sys, "/sysfoo"), PathBuf::from("/fixture/sysfoo"));
        let real = Path::new("/sys");
        assert_eq!(
            on_host(real, "/sys/fs/cgroup"),
            PathBuf::from("/sys/fs/cgroup")
        );
        assert_eq!(on_host(real, "/run/cgroup2"), PathBuf::from("/run/cgroup2"));
    }
}
