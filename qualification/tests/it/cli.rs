//! The binary's own contract: 385 listed cases, usage errors exit 2.

use std::process::Command;

fn qual() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inferloop-qual"))
}

#[test]
fn list_prints_385_cases_one_per_line_with_group_and_description() {
    let out = qual().arg("--list").output().expect("run --list");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 385);
    for line in &lines {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert!(cols.len() >= 3, "id, group, description: {line:?}");
        assert!(cols[0].starts_with(&format!("{}.", cols[1])), "{line:?}");
    }
}

#[test]
fn list_honours_the_filter() {
    let out = qual()
        .args(["--list", "--filter", "stream.done_*"])
        .output()
        .expect("run --list");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(ids, ["stream.done_last", "stream.done_once"]);
}

#[test]
fn no_target_is_a_usage_error_with_exit_2() {
    let out = qual().output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--base-url"));
}

#[test]
fn a_missing_daemon_binary_is_exit_2_naming_it() {
    let out = qual()
        .args([
            "--spawn",
            "/nonexistent/inferloopd",
            "--model",
            "/nonexistent/m.gguf",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/inferloopd"));
}
