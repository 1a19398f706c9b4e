//! `device`: what board this is and why, thermal zones and clocks (real and a fake sysfs
//! tree), `/metrics` as strict Prometheus text, the `/v1/status` schema, and the thermal
//! admission states driven through a fake sysfs tree.

use std::path::Path;
use std::time::Duration;

use inferloop_board::{Detector, Roots};
use serde_json::{json, Value};

use crate::case::{Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::fixtures::{self, write_fake_sysfs, THERMAL_INTERVAL_MS, THERMAL_SETTLE};
use crate::prom::{self, Kind};
use crate::target::{counting, expect_error, expect_retry_after, metric_of, Target};
use crate::{ensure, ensure_eq};

const G: Group = Group::Device;

/// A JSON pointer and the type its value must have.
type TypeCheck = (&'static str, fn(&Value) -> bool);

/// `inferloopd ARGS`: exit code and stdout.
fn run(c: &Ctx, sub: &str, args: &[&str]) -> Result<(i32, String, String), Stop> {
    let cfg = c.need_spawn(&format!("runs `inferloopd {sub}`"))?;
    c.need_subcommand(sub)?;
    let mut argv = vec![sub];
    argv.extend_from_slice(args);
    let out = cfg
        .command(&argv)
        .map_err(|e| Stop::fail(format!("inferloopd {sub} runs"), e))?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The value after `label:` in `inferloopd board` output.
fn field(text: &str, label: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{label}:")))
        .map(|v| v.trim().to_string())
}

/// The profile name at the start of the `board:` line.
fn board_name(text: &str) -> Option<String> {
    field(text, "board").and_then(|v| v.split_whitespace().next().map(str::to_string))
}

/// In-process detection on this machine, as the daemon would do it.
fn local_board() -> Result<String, Stop> {
    Detector::new(Roots::default())
        .detect()
        .map(|d| d.profile.name)
        .map_err(|e| Stop::fail("inferloop-board detects this machine", e.to_string()))
}

/// A fake `/proc` with the device tree of `profile`, and a matching `/sys`.
fn fake_board_tree(c: &Ctx, profile: &str) -> Result<tempfile::TempDir, Stop> {
    let p = inferloop_board::profile::find(profile)
        .map_err(|e| Stop::fail("a built-in profile", e.to_string()))?;
    let dir = tempfile::Builder::new()
        .prefix("board-")
        .tempdir_in(&c.work)
        .map_err(|e| Stop::fail("tempdir", e.to_string()))?;
    let dt = dir.path().join("proc/device-tree");
    std::fs::create_dir_all(&dt).map_err(|e| Stop::fail("mkdir", e.to_string()))?;
    let mut compat = Vec::new();
    for entry in p.compatible.iter().chain(p.soc_compatible.iter()) {
        compat.extend_from_slice(entry.as_bytes());
        compat.push(0);
    }
    std::fs::write(dt.join("compatible"), compat)
        .map_err(|e| Stop::fail("write", e.to_string()))?;
    std::fs::write(dt.join("model"), format!("{}\0", p.description))
        .map_err(|e| Stop::fail("write", e.to_string()))?;
    write_fake_sysfs(&dir.path().join("sys"))
        .map_err(|e| Stop::fail("fake sysfs", e.to_string()))?;
    Ok(dir)
}

/// `inferloopd thermal` on the fake tree (Orin NX profile).
fn fake_thermal(c: &Ctx) -> Result<String, Stop> {
    let dir = fake_board_tree(c, "jetson-orin-nx-16gb")?;
    let sys = dir.path().join("sys").to_string_lossy().into_owned();
    let (code, out, err) = run(
        c,
        "thermal",
        &["--sysfs-root", &sys, "--board", "jetson-orin-nx-16gb"],
    )?;
    ensure_eq!(format!("exit code (stderr: {err})"), code, 0);
    Ok(out)
}

/// A row of a table whose first column is `name`.
fn row<'a>(table: &'a str, name: &str) -> Option<Vec<&'a str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&name))
}

fn exposition(c: &Ctx) -> Result<(String, prom::Exposition), Stop> {
    let t = c.target.clone();
    (*c.memo("device exposition", move || {
        // Generate first so the histograms hold observations.
        t.complete(&counting(4, false))?;
        let text = t.metrics()?;
        let e = prom::parse(&text)
            .map_err(|e| Stop::fail("/metrics parses as strict Prometheus text", e))?;
        Ok((text, e))
    }))
    .clone()
}

/// Sets the fake GPU zone to `celsius` and waits until the daemon read it and applied the
/// slot cap for `state`.
fn drive(
    t: &Target,
    tree: &Path,
    celsius: f64,
    state: &str,
    max_active: u64,
) -> Result<Value, Stop> {
    fixtures::set_gpu_celsius(tree, celsius)
        .map_err(|e| Stop::fail("write the fake temperature", e.to_string()))?;
    let s = t.wait_status(
        THERMAL_SETTLE,
        &format!("GPU zone read at {celsius} °C, state {state}, max_active {max_active}"),
        |s| {
            let zone = s["thermal"]["snapshot"]["zones"]
                .as_array()
                .and_then(|zs| zs.iter().find(|z| z["name"] == "gpu-thermal"))
                .and_then(|z| z["celsius"].as_f64());
            zone == Some(celsius)
                && s["thermal"]["state"] == state
                && s["slots"]["max_active"].as_u64() == Some(max_active)
        },
    )?;
    Ok(s)
}

fn thermal_fixture(c: &Ctx) -> Result<(Target, std::sync::Arc<crate::ctx::Fixture>), Stop> {
    let fx = c.fixture("thermal")?;
    Ok((fx.target(), fx))
}

mod admission;
mod board;
mod metrics;
mod status;
mod thermal;

/// The group's cases, section by section, in report order.
pub fn register(r: &mut Registry) {
    board::register(r);
    thermal::register(r);
    metrics::register(r);
    status::register(r);
    admission::register(r);
}
