//! The dedicated daemons a few cases share, each with the one setting they need, and the
//! fake sysfs tree the thermal cases drive.

use std::path::Path;
use std::time::Duration;

use crate::ctx::Fixture;
use crate::daemon::SpawnCfg;

/// The API key of the `strict` daemon.
pub const KEY: &str = "qual-secret-key";
/// The browser origin the `cors` daemon allows.
pub const CORS_ORIGIN: &str = "http://page.qual.lan:8000";
/// Thermal thresholds of the `thermal` daemon (°C).
pub const HOT_C: f64 = 70.0;
pub const CRITICAL_C: f64 = 90.0;
pub const HYSTERESIS_C: f64 = 5.0;
/// Sampling interval of the `thermal` daemon.
pub const THERMAL_INTERVAL_MS: u64 = 100;
/// The fake tree's zone the cases heat up, and where it lives under `sys/`.
pub const GPU_ZONE: &str = "devices/virtual/thermal/thermal_zone1";

pub struct Spec {
    pub args: Vec<&'static str>,
    /// `serve` flags this daemon needs; a build without them skips its cases.
    pub needs: &'static [&'static str],
}

/// The settings of each dedicated daemon.
pub fn spec(name: &str) -> Spec {
    let (args, needs): (Vec<&'static str>, &'static [&'static str]) = match name {
        // Auth on, a 1 s read timeout and a 4 KiB body limit: input checks that need them.
        "strict" => (
            vec![
                "--api-key",
                KEY,
                "--read-timeout-secs",
                "1",
                "--max-body-bytes",
                "4096",
                "--slots",
                "1",
                "--ctx",
                "256",
            ],
            &[],
        ),
        // Auth on and one allowed browser origin: CORS and the unversioned aliases.
        "cors" => (
            vec![
                "--api-key",
                KEY,
                "--cors-origin",
                CORS_ORIGIN,
                "--slots",
                "1",
                "--ctx",
                "512",
            ],
            &["--cors-origin"],
        ),
        // A tiny context, so inputs at the limit are cheap to generate.
        "small" => (vec!["--slots", "2", "--ctx", "128"], &[]),
        // One slot, one queue place: overflow.
        "queue1" => (vec!["--slots", "1", "--queue", "1", "--ctx", "512"], &[]),
        // One slot, a 300 ms queue timeout.
        "qtimeout" => (
            vec![
                "--slots",
                "1",
                "--queue",
                "4",
                "--queue-timeout-ms",
                "300",
                "--ctx",
                "1024",
            ],
            &["--queue-timeout-ms"],
        ),
        // One slot with room for a long generation: cancellation.
        "cancel" => (vec!["--slots", "1", "--ctx", "4096"], &[]),
        // Two slots sharing 256 KV cells: runtime KV admission.
        "kv" => (
            vec!["--slots", "2", "--ctx", "256", "--kv-cells", "256"],
            &["--kv-cells"],
        ),
        // Two slots reading the fake tree every 100 ms.
        "thermal" => (
            vec![
                "--slots",
                "2",
                "--ctx",
                "512",
                "--board",
                "jetson-orin-nx-16gb",
                "--sysfs-root",
                "<tree>/sys",
                "--thermal-interval-ms",
                "100",
                "--hot-celsius",
                "70",
                "--critical-celsius",
                "90",
                "--hysteresis-celsius",
                "5",
            ],
            &[
                "--sysfs-root",
                "--board",
                "--thermal-interval-ms",
                "--hot-celsius",
                "--critical-celsius",
                "--hysteresis-celsius",
            ],
        ),
        other => panic!("unknown fixture {other}"),
    };
    Spec { args, needs }
}

/// Starts fixture `name`.
pub fn start(name: &str, cfg: &SpawnCfg, work: &Path) -> Result<Fixture, String> {
    let spec = spec(name);
    if name != "thermal" {
        return Ok(Fixture {
            daemon: cfg.start(&spec.args)?,
            dir: None,
        });
    }
    let dir = tempfile::Builder::new()
        .prefix("thermal-")
        .tempdir_in(work)
        .map_err(|e| format!("tempdir: {e}"))?;
    write_fake_sysfs(&dir.path().join("sys")).map_err(|e| format!("fake sysfs: {e}"))?;
    let sys = dir.path().join("sys").to_string_lossy().into_owned();
    let args: Vec<&str> = spec
        .args
        .iter()
        .map(|a| if *a == "<tree>/sys" { sys.as_str() } else { a })
        .collect();
    Ok(Fixture {
        daemon: cfg.start(&args)?,
        dir: Some(dir),
    })
}

fn write(root: &Path, rel: &str, text: &str) -> std::io::Result<()> {
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, format!("{text}\n"))
}

/// A small Jetson-like sysfs: three thermal zones (one offline at −256 °C), the GPU's
/// devfreq node and two CPU clocks. Temperatures in milli-°C, clocks in Hz (devfreq) and kHz
/// (cpufreq), as the kernel writes them.
pub fn write_fake_sysfs(sys: &Path) -> std::io::Result<()> {
    write(
        sys,
        "devices/virtual/thermal/thermal_zone0/type",
        "cpu-thermal",
    )?;
    write(sys, "devices/virtual/thermal/thermal_zone0/temp", "44500")?;
    write(
        sys,
        "devices/virtual/thermal/thermal_zone1/type",
        "gpu-thermal",
    )?;
    write(sys, "devices/virtual/thermal/thermal_zone1/temp", "45800")?;
    write(
        sys,
        "devices/virtual/thermal/thermal_zone2/type",
        "offline-thermal",
    )?;
    write(sys, "devices/virtual/thermal/thermal_zone2/temp", "-256000")?;
    let gpu = "class/devfreq/17000000.gpu";
    write(sys, &format!("{gpu}/cur_freq"), "306000000")?;
    write(sys, &format!("{gpu}/max_freq"), "918000000")?;
    write(sys, &format!("{gpu}/min_freq"), "306000000")?;
    write(sys, &format!("{gpu}/device/of_node/name"), "gpu")?;
    write(sys, &format!("{gpu}/device/load"), "123")?;
    for cpu in 0..2 {
        let base = format!("devices/system/cpu/cpu{cpu}/cpufreq");
        write(sys, &format!("{base}/scaling_cur_freq"), "729600")?;
        write(sys, &format!("{base}/cpuinfo_max_freq"), "1984000")?;
        write(sys, &format!("{base}/cpuinfo_min_freq"), "115200")?;
    }
    write(sys, "devices/system/cpu/online", "0-1")?;
    Ok(())
}

/// Rewrites the GPU zone's temperature atomically (beside, then renamed over), so the sampler
/// never reads a truncated file.
pub fn set_gpu_celsius(tree: &Path, celsius: f64) -> std::io::Result<()> {
    let zone = tree.join("sys").join(GPU_ZONE);
    let tmp = zone.join("temp.new");
    std::fs::write(&tmp, format!("{}\n", (celsius * 1000.0).round() as i64))?;
    std::fs::rename(&tmp, zone.join("temp"))
}

/// How long a written temperature takes to show: a few sampling intervals.
pub const THERMAL_SETTLE: Duration = Duration::from_secs(20);
