//! `integrity`: weights pinned by a manifest are served; a flipped byte, a wrong size,
//! missing weights, unknown fields or a broken manifest stop the daemon with exit 3 before
//! anything listens.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::daemon::{Exit, SpawnCfg};
use crate::target::{chat_body, text_of};
use crate::{ensure, ensure_eq};

const G: Group = Group::Integrity;
const EXIT_WAIT: Duration = Duration::from_secs(120);

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The model's SHA-256 and size, computed once.
pub fn model_pin(c: &Ctx) -> Result<(String, u64), Stop> {
    let cfg = c.need_spawn("copies and pins the model file")?;
    let model = cfg.model.clone();
    (*c.memo("model sha256", move || -> Result<(String, u64), Stop> {
        let size = std::fs::metadata(&model)
            .map_err(|e| Stop::fail("the model file is readable", e.to_string()))?
            .len();
        let sha = sha256_file(&model).map_err(|e| Stop::fail("the model hashes", e))?;
        Ok((sha, size))
    }))
    .clone()
}

/// A directory holding `model.gguf` (a copy, tampered when asked) and `manifest.json`
/// pinning the original.
struct Pinned {
    dir: tempfile::TempDir,
    manifest: PathBuf,
    copy: PathBuf,
    manifest_bytes: Vec<u8>,
}

fn pinned(
    c: &Ctx,
    tamper: bool,
    manifest: impl FnOnce(&str, u64) -> Value,
) -> Result<Pinned, Stop> {
    let cfg = c.need_spawn("starts the daemon with a manifest")?;
    let (sha, size) = model_pin(c)?;
    let dir = tempfile::Builder::new()
        .prefix("integrity-")
        .tempdir_in(&c.work)
        .map_err(|e| Stop::fail("a temp dir", e.to_string()))?;
    let copy = dir.path().join("model.gguf");
    std::fs::copy(&cfg.model, &copy).map_err(|e| Stop::fail("the model copies", e.to_string()))?;
    if tamper {
        let mut bytes =
            std::fs::read(&copy).map_err(|e| Stop::fail("read the copy", e.to_string()))?;
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x01;
        std::fs::write(&copy, &bytes)
            .map_err(|e| Stop::fail("write the tampered copy", e.to_string()))?;
    }
    let manifest_bytes = serde_json::to_vec_pretty(&manifest(&sha, size)).unwrap_or_default();
    let path = dir.path().join("manifest.json");
    std::fs::write(&path, &manifest_bytes)
        .map_err(|e| Stop::fail("write the manifest", e.to_string()))?;
    Ok(Pinned {
        dir,
        manifest: path,
        copy,
        manifest_bytes,
    })
}

fn good_manifest(sha: &str, size: u64) -> Value {
    json!({"schema": 1, "model": {"path": "model.gguf", "sha256": sha, "size": size}})
}

/// Runs `serve --manifest M ARGS` to its exit.
fn run_exit(cfg: &SpawnCfg, manifest: &Path, extra: &[&str]) -> Result<Exit, Stop> {
    let m = manifest.to_string_lossy().into_owned();
    let mut args = vec!["--manifest", m.as_str(), "--slots", "1", "--ctx", "256"];
    args.extend_from_slice(extra);
    let mut argv = cfg.serve_argv(&args);
    // Without --model the manifest's own path is served; drop the default the harness adds.
    if !extra.contains(&"--model") {
        if let Some(i) = argv.iter().position(|a| a == "--model") {
            argv.drain(i..i + 2);
        }
    }
    let d = cfg
        .spawn(argv, None)
        .map_err(|e| Stop::fail("the daemon starts", e))?;
    cfg.exit_of(d, EXIT_WAIT)
        .map_err(|e| Stop::fail("the daemon exits on its own", e))
}

/// A manifest that must be refused with exit 3 and a log naming `needle`.
fn refused(
    c: &Ctx,
    ev: &mut Evidence,
    manifest: impl FnOnce(&str, u64) -> Value,
    raw: Option<&[u8]>,
    needle: &str,
) -> Result<String, Stop> {
    let cfg = c
        .need_spawn("starts the daemon with a broken manifest")?
        .clone();
    let p = pinned(c, false, manifest)?;
    if let Some(raw) = raw {
        std::fs::write(&p.manifest, raw)
            .map_err(|e| Stop::fail("write the manifest", e.to_string()))?;
    }
    ev.text(
        "manifest",
        &String::from_utf8_lossy(&std::fs::read(&p.manifest).unwrap_or_default()),
    );
    let e = run_exit(&cfg, &p.manifest, &[])?;
    ev.text("log", &e.log);
    ensure_eq!("exit code", e.code, Some(3));
    ensure!(
        e.log.contains(needle),
        format!("the error names {needle:?}"),
        crate::case::snippet(&e.log, 1500)
    );
    ensure!(
        !e.log.contains("listening on"),
        "nothing listening",
        "it bound a port"
    );
    Ok(format!("exit 3 naming {needle:?}"))
}

/// The pinned copy served without --model.
#[derive(Clone)]
struct Served {
    status: Value,
    reply: String,
    log: String,
    sha: String,
    manifest_sha: String,
}

fn served(c: &Ctx) -> Result<Served, Stop> {
    let cfg = c.need_spawn("starts the daemon with a manifest")?.clone();
    (*c.memo("integrity served", || -> Result<Served, Stop> {
        let p = pinned(c, false, good_manifest)?;
        let (sha, _) = model_pin(c)?;
        let m = p.manifest.to_string_lossy().into_owned();
        let mut argv = cfg.serve_argv(&["--manifest", &m, "--slots", "1", "--ctx", "256"]);
        if let Some(i) = argv.iter().position(|a| a == "--model") {
            argv.drain(i..i + 2);
        }
        let d = cfg
            .spawn(argv, None)
            .map_err(|e| Stop::fail("the daemon starts", e))?;
        d.wait_address(crate::daemon::READY_TIMEOUT)
            .map_err(|e| Stop::fail("the daemon binds", e))?;
        d.wait_ready(crate::daemon::READY_TIMEOUT)
            .map_err(|e| Stop::fail("the daemon gets ready", e))?;
        let t = d.target();
        let status = t.status()?;
        let reply = text_of(&t.chat(&chat_body("Say hi", 4))?)?;
        let log = d.log();
        let manifest_sha = crate::cases::integrity::sha256_bytes(&p.manifest_bytes);
        drop(d);
        drop(p);
        Ok(Served {
            status,
            reply,
            log,
            sha,
            manifest_sha,
        })
    }))
    .clone()
}

/// A tampered copy refused.
#[derive(Clone)]
struct Tampered {
    exit: Exit,
    sha: String,
    actual: String,
}

fn tampered(c: &Ctx) -> Result<Tampered, Stop> {
    let cfg = c
        .need_spawn("starts the daemon on tampered weights")?
        .clone();
    (*c.memo("integrity tampered", || -> Result<Tampered, Stop> {
        let p = pinned(c, true, good_manifest)?;
        let (sha, _) = model_pin(c)?;
        let actual = sha256_file(&p.copy).map_err(|e| Stop::fail("hash the tampered copy", e))?;
        let copy = p.copy.to_string_lossy().into_owned();
        let exit = run_exit(&cfg, &p.manifest, &["--model", &copy])?;
        drop(p);
        Ok(Tampered { exit, sha, actual })
    }))
    .clone()
}

pub fn register(r: &mut Registry) {
    r.add(
        G,
        "integrity.manifest.match_serves",
        "Weights matching the manifest are served",
        "--manifest without --model serves the pinned copy: ready, a chat answered",
        |c, ev| {
            let s = served(c)?;
            ev.put("reply", s.reply.clone());
            ensure!(!s.reply.is_empty(), "a non-empty answer", "empty");
            Ok(format!("served {:?}", s.reply))
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.manifest.status_weights_sha",
        "/v1/status reports the pinned weights' SHA-256",
        "integrity.weights_sha256 == the model's SHA-256",
        |c, ev| {
            let s = served(c)?;
            ev.put("integrity", s.status["integrity"].clone());
            ensure_eq!(
                "weights_sha256",
                s.status["integrity"]["weights_sha256"],
                json!(s.sha)
            );
            Ok(s.sha.clone())
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.manifest.status_manifest_sha",
        "/v1/status reports the manifest's own SHA-256",
        "integrity.manifest_sha256 == SHA-256 of the manifest file",
        |c, ev| {
            let s = served(c)?;
            ev.put("integrity", s.status["integrity"].clone());
            ensure_eq!(
                "manifest_sha256",
                s.status["integrity"]["manifest_sha256"],
                json!(s.manifest_sha)
            );
            Ok(s.manifest_sha.clone())
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.manifest.logs_the_match",
        "The daemon says the weights matched",
        "a `weights match the manifest` log line",
        |c, ev| {
            let s = served(c)?;
            let line = s
                .log
                .lines()
                .find(|l| l.contains("weights match the manifest"))
                .map(str::to_string);
            ev.text("log", &s.log);
            ensure!(
                line.is_some(),
                "`weights match the manifest` in the log",
                crate::case::snippet(&s.log, 1500)
            );
            Ok(line.unwrap_or_default())
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.cache.second_boot_hit",
        "A verified result is reused on the next boot",
        "with --state-dir, the second boot logs a verified-cache hit and serves",
        |c, ev| {
            let cfg = c
                .need_spawn("boots the daemon twice with a state dir")?
                .clone();
            c.need_flag("--state-dir")?;
            let p = pinned(c, false, good_manifest)?;
            let state = p.dir.path().join("state");
            std::fs::create_dir(&state).map_err(|e| Stop::fail("state dir", e.to_string()))?;
            let (m, s) = (
                p.manifest.to_string_lossy().into_owned(),
                state.to_string_lossy().into_owned(),
            );
            let mut logs = Vec::new();
            for _ in 0..2 {
                let d = cfg
                    .start(&[
                        "--manifest",
                        &m,
                        "--state-dir",
                        &s,
                        "--slots",
                        "1",
                        "--ctx",
                        "256",
                    ])
                    .map_err(|e| Stop::fail("the daemon boots", e))?;
                logs.push(d.log());
            }
            ev.text("second_boot_log", &logs[1]);
            ensure!(
                logs[1].contains("verified-cache hit"),
                "`verified-cache hit` on the second boot",
                crate::case::snippet(&logs[1], 1500)
            );
            Ok("cache hit on boot 2".into())
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.tamper.exit_3",
        "One flipped byte in the weights stops the daemon",
        "exit 3",
        |c, ev| {
            let t = tampered(c)?;
            ev.text("log", &t.exit.log);
            ensure_eq!("exit code", t.exit.code, Some(3));
            Ok("exit 3".into())
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.tamper.names_expected_and_actual",
        "The error names the expected and the actual hash",
        "the log holds `wrong SHA-256`, the pinned hash and the tampered copy's hash",
        |c, ev| {
            let t = tampered(c)?;
            ev.text("log", &t.exit.log);
            ev.put("expected", t.sha.clone());
            ev.put("actual", t.actual.clone());
            ensure!(
                t.exit.log.contains("wrong SHA-256"),
                "`wrong SHA-256`",
                crate::case::snippet(&t.exit.log, 1500)
            );
            ensure!(
                t.exit.log.contains(&t.sha) && t.exit.log.contains(&t.actual),
                "both hashes in the log",
                crate::case::snippet(&t.exit.log, 1500)
            );
            Ok("expected and actual named".into())
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.tamper.nothing_listening",
        "Tampered weights are never served",
        "no `listening on` line before the exit",
        |c, ev| {
            let t = tampered(c)?;
            ev.text("log", &t.exit.log);
            ensure!(
                !t.exit.log.contains("listening on"),
                "nothing listening",
                "it bound a port"
            );
            Ok("never bound".into())
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(G, "integrity.size.mismatch_exit_3", "A wrong size in the manifest stops the daemon", "exit 3, `wrong size`", |c, ev| {
        refused(c, ev, |sha, size| json!({"schema": 1, "model": {"path": "model.gguf", "sha256": sha, "size": size + 1}}), None, "wrong size")
    }).fixture("integrity").timeout_s(240);
    r.add(G, "integrity.missing_weights.exit_3", "Missing weights stop the daemon", "exit 3, the error names the missing path", |c, ev| {
        refused(c, ev, |sha, size| json!({"schema": 1, "model": {"path": "absent.gguf", "sha256": sha, "size": size}}), None, "absent.gguf")
    }).fixture("integrity").timeout_s(240);
    r.add(G, "integrity.unknown_field.top_level_exit_3", "An unknown top-level manifest field is refused", "exit 3 naming the field `extra`", |c, ev| {
        refused(c, ev, |sha, size| json!({"schema": 1, "model": {"path": "model.gguf", "sha256": sha, "size": size}, "extra": true}), None, "unknown field `extra`")
    }).fixture("integrity").timeout_s(240);
    r.add(G, "integrity.unknown_field.model_level_exit_3", "An unknown field inside `model` is refused", "exit 3 naming the field `url`", |c, ev| {
        refused(c, ev, |sha, size| json!({"schema": 1, "model": {"path": "model.gguf", "sha256": sha, "size": size, "url": "http://x"}}), None, "unknown field `url`")
    }).fixture("integrity").timeout_s(240);
    r.add(G, "integrity.schema.unsupported_exit_3", "An unsupported manifest schema is refused", "exit 3 naming the schema", |c, ev| {
        refused(c, ev, |sha, size| json!({"schema": 99, "model": {"path": "model.gguf", "sha256": sha, "size": size}}), None, "schema")
    }).fixture("integrity").timeout_s(240);
    r.add(
        G,
        "integrity.manifest.malformed_exit_3",
        "A manifest that is not JSON is refused",
        "exit 3, `is invalid`",
        |c, ev| {
            refused(
                c,
                ev,
                good_manifest,
                Some(b"{\"schema\": 1, \"model\": "),
                "invalid",
            )
        },
    )
    .fixture("integrity")
    .timeout_s(240);
    r.add(
        G,
        "integrity.unpinned.logs_sha",
        "Without a manifest the daemon logs the weights' SHA-256",
        "the shared daemon's log holds the model's SHA-256, ready to pin",
        |c, ev| {
            let shared = c.shared.as_ref().ok_or_else(|| {
                Stop::skip("needs --spawn: reads the log of a daemon this suite started")
            })?;
            if shared.argv.iter().any(|a| a == "--manifest") {
                return Err(Stop::skip(
                    "the shared daemon runs with --manifest, so it logs no unpinned hash",
                ));
            }
            let (sha, _) = model_pin(c)?;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !shared.log().contains(&sha) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let line = shared
                .log()
                .lines()
                .find(|l| l.contains(&sha))
                .map(str::to_string);
            ev.put("line", json!(line));
            ensure!(
                line.is_some(),
                format!("a log line with {sha}"),
                crate::case::snippet(&shared.log(), 1500)
            );
            Ok(line.unwrap_or_default())
        },
    );
}
