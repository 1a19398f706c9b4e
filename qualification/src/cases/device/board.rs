//! `device` cases: the board: detection, profile and the reason.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- the board ----
    r.add(
        G,
        "device.board.command_exit_0",
        "`inferloopd board` answers",
        "exit 0 with board and why lines",
        |c, ev| {
            let (code, out, err) = run(c, "board", &[])?;
            ev.text("stdout", &out);
            ev.text("stderr", &err);
            ensure_eq!("exit code", code, 0);
            ensure!(
                field(&out, "board").is_some() && field(&out, "why").is_some(),
                "board: and why: lines",
                out
            );
            c.note_env("board_command", out.clone());
            Ok(field(&out, "board").unwrap_or_default())
        },
    );
    r.add(
        G,
        "device.board.names_a_profile",
        "The detected board is a known profile",
        "the board: line names a built-in profile",
        |c, ev| {
            let (_, out, _) = run(c, "board", &[])?;
            let name = board_name(&out).unwrap_or_default();
            let known = inferloop_board::profile::builtin_names();
            ev.put("board", name.clone());
            ensure!(known.contains(&name), format!("one of {known:?}"), name);
            Ok(name)
        },
    );
    r.add(
        G,
        "device.board.says_why",
        "Detection says why it chose the board",
        "a non-empty why: line (which rule or file matched)",
        |c, ev| {
            let (_, out, _) = run(c, "board", &[])?;
            let why = field(&out, "why").unwrap_or_default();
            ev.put("why", why.clone());
            ensure!(!why.is_empty(), "a reason", "empty");
            Ok(why)
        },
    );
    r.add(
        G,
        "device.board.matches_library",
        "The daemon and the board library agree",
        "`inferloopd board` names the profile inferloop-board detects in-process",
        |c, ev| {
            let (_, out, _) = run(c, "board", &[])?;
            let (cli, lib) = (board_name(&out).unwrap_or_default(), local_board()?);
            ev.put("cli", cli.clone());
            ev.put("library", lib.clone());
            ensure_eq!("board", cli, lib);
            Ok(lib)
        },
    );
    r.add(
        G,
        "device.board.override",
        "--board overrides detection",
        "`board --board jetson-orin-nx-16gb` names it, why says override",
        |c, ev| {
            let (code, out, _) = run(c, "board", &["--board", "jetson-orin-nx-16gb"])?;
            ev.text("stdout", &out);
            ensure_eq!("exit code", code, 0);
            ensure_eq!(
                "board",
                board_name(&out).unwrap_or_default(),
                "jetson-orin-nx-16gb"
            );
            ensure!(
                field(&out, "why").is_some_and(|w| w.contains("override")),
                "why: override",
                out
            );
            Ok("override honoured".into())
        },
    );
    r.add(
        G,
        "device.board.unknown_exit_2",
        "An unknown --board is a usage error",
        "exit 2",
        |c, ev| {
            let (code, out, err) = run(c, "board", &["--board", "no-such-board"])?;
            ev.text("stderr", &err);
            ev.text("stdout", &out);
            ensure_eq!("exit code", code, 2);
            Ok("exit 2".into())
        },
    );
    r.add(G, "device.board.device_tree_fixture", "A Jetson device tree is recognised", "a fake /proc/device-tree of an Orin NX 16GB is detected as jetson-orin-nx-16gb from its compatible file", |c, ev| {
        let dir = fake_board_tree(c, "jetson-orin-nx-16gb")?;
        let (proc_root, sys) = (dir.path().join("proc").to_string_lossy().into_owned(), dir.path().join("sys").to_string_lossy().into_owned());
        let (code, out, _) = run(c, "board", &["--proc-root", &proc_root, "--sysfs-root", &sys])?;
        ev.text("stdout", &out);
        ensure_eq!("exit code", code, 0);
        ensure_eq!("board", board_name(&out).unwrap_or_default(), "jetson-orin-nx-16gb");
        ensure!(field(&out, "why").is_some_and(|w| w.contains("compatible")), "why names the compatible file", out);
        Ok("device tree matched".into())
    });
    r.add(
        G,
        "device.board.status_agrees",
        "/v1/status names the same board",
        "status.board.name equals the local detection (same machine)",
        |c, ev| {
            let s = c.target.status()?;
            if s.get("board").is_none() {
                return Err(Stop::skip("this daemon's /v1/status has no board"));
            }
            if !c.target.ep.is_loopback() {
                return Err(Stop::skip(
                    "the daemon runs on another machine; its board cannot be detected from here",
                ));
            }
            if c.shared
                .as_ref()
                .is_some_and(|d| d.argv.iter().any(|a| a == "--board"))
            {
                return Err(Stop::skip("the shared daemon runs with --board"));
            }
            let lib = local_board()?;
            ev.put("status_board", s["board"].clone());
            c.note_env("board", s["board"].clone());
            ensure_eq!("status.board.name", s["board"]["name"], json!(lib));
            Ok(lib)
        },
    );
}
