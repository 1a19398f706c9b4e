//! The overlay's `usr/lib/sysusers.d/*.conf` applied at build time: a read-only root cannot
//! run systemd-sysusers at boot. `u` and `g` lines with fixed ids, `g NAME -` for a group
//! that owns nothing on the data partition, and `m USER GROUP` memberships.

use std::path::{Path, PathBuf};

use crate::error::ImageError;
use crate::tree;

/// Adds the users and groups of the overlay's `usr/lib/sysusers.d/*.conf` to `etc/passwd`,
/// `etc/group` (and the shadow files when the base has them). A read-only root cannot run
/// systemd-sysusers at boot, so the builder does it, and so a user needs a fixed id: files on
/// the data partition outlive the image and must keep their owner. A group that owns no
/// such files may say `-` (`g video -`): the base's group is kept, or the highest free
/// system id is taken, as systemd-sysusers does. `m USER GROUP` adds a member.
pub fn apply(overlay: &Path, root: &Path) -> Result<(), ImageError> {
    let dir = overlay.join("usr/lib/sysusers.d");
    let Ok(listing) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let mut files: Vec<PathBuf> = listing
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(ImageError::io(&file))?;
        for (i, line) in text.lines().enumerate() {
            let fail = |message: String| ImageError::SysUsers {
                path: file.clone(),
                line: i + 1,
                message,
            };
            let words = split_sysusers(line).map_err(fail)?;
            let Some(kind) = words.first() else { continue };
            match (kind.as_str(), words.len()) {
                ("u", 2..) => {
                    let name = &words[1];
                    let id = words.get(2).map(String::as_str).unwrap_or("-");
                    let (uid, gid) = match id.split_once(':') {
                        Some((u, g)) => (u, g),
                        None => (id, id),
                    };
                    let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) else {
                        return Err(fail(format!(
                            "user `{name}` needs a fixed numeric UID[:GID], not {id:?}: a \
                             read-only image cannot allocate one at boot"
                        )));
                    };
                    let gecos = words
                        .get(3)
                        .filter(|w| *w != "-")
                        .cloned()
                        .unwrap_or_default();
                    let home = words
                        .get(4)
                        .filter(|w| *w != "-")
                        .cloned()
                        .unwrap_or("/".into());
                    let shell = words
                        .get(5)
                        .filter(|w| *w != "-")
                        .cloned()
                        .unwrap_or("/usr/sbin/nologin".into());
                    add_group(root, name, gid).map_err(fail)?;
                    add_line(
                        root,
                        "etc/passwd",
                        name,
                        Some(uid),
                        &format!("{name}:x:{uid}:{gid}:{gecos}:{home}:{shell}"),
                    )
                    .map_err(fail)?;
                    add_line(root, "etc/shadow", name, None, &format!("{name}:!*:::::::"))
                        .map_err(fail)?;
                }
                ("g", 3) if words[2] == "-" => {
                    if group_id(root, &words[1]).is_none() {
                        let gid = free_system_gid(root).ok_or_else(|| {
                            fail("no free system group id (100 to 999) is left".into())
                        })?;
                        add_group(root, &words[1], gid).map_err(fail)?;
                    }
                }
                ("g", 3) => {
                    let gid = words[2].parse::<u32>().map_err(|_| {
                        fail(format!(
                            "group `{}` needs a numeric GID or `-`, not {:?}",
                            words[1], words[2]
                        ))
                    })?;
                    add_group(root, &words[1], gid).map_err(fail)?;
                }
                ("m", 3) => add_member(root, &words[1], &words[2]).map_err(fail)?,
                (other, _) => {
                    return Err(fail(format!(
                        "`{other}` lines are not supported by the image builder (only `u`, `g` \
                         and `m USER GROUP`)"
                    )))
                }
            }
        }
    }
    Ok(())
}

/// The id of group `name` in the staged `etc/group`.
fn group_id(root: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(root.join("etc/group")).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next() == Some(name)).then(|| f.nth(1)?.parse().ok())?
    })
}

/// The highest system group id (100 to 999) that the staged `etc/group` does not use.
fn free_system_gid(root: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(root.join("etc/group")).unwrap_or_default();
    let used: Vec<u32> = text
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect();
    (100..=999).rev().find(|id| !used.contains(id))
}

/// Adds `user` to the member list of `group` in `etc/group` (and `etc/gshadow` when the
/// base has it); the group must be defined by then.
fn add_member(root: &Path, user: &str, group: &str) -> Result<(), String> {
    if group_id(root, group).is_none() {
        return Err(format!(
            "`m {user} {group}`: group `{group}` is not defined; add `g {group} -` above"
        ));
    }
    for (file, members_at) in [("etc/group", 3), ("etc/gshadow", 3)] {
        let path = root.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let mut out = String::with_capacity(text.len() + user.len() + 1);
        for line in text.lines() {
            let mut fields: Vec<String> = line.split(':').map(String::from).collect();
            if fields.first().map(String::as_str) == Some(group) {
                fields.resize(fields.len().max(members_at + 1), String::new());
                let members = &mut fields[members_at];
                if !members.split(',').any(|m| m == user) {
                    if !members.is_empty() {
                        members.push(',');
                    }
                    members.push_str(user);
                }
            }
            out.push_str(&fields.join(":"));
            out.push('\n');
        }
        let mode = std::fs::symlink_metadata(&path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
            .map_err(|e| e.to_string())?;
        tree::write_file(&path, out.as_bytes(), mode).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn add_group(root: &Path, name: &str, gid: u32) -> Result<(), String> {
    add_line(
        root,
        "etc/group",
        name,
        Some(gid),
        &format!("{name}:x:{gid}:"),
    )?;
    add_line(root, "etc/gshadow", name, None, &format!("{name}:!::"))
}

/// Appends `line` to `root/file` unless `name` is there already (then its id must match).
/// `passwd` and `group` are created when missing; the shadow files only get lines if the
/// base has them.
fn add_line(
    root: &Path,
    file: &str,
    name: &str,
    id: Option<u32>,
    line: &str,
) -> Result<(), String> {
    let path = root.join(file);
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(_) if id.is_none() => return Ok(()),
        Err(_) => String::new(),
    };
    for l in existing.lines() {
        let mut fields = l.split(':');
        if fields.next() == Some(name) {
            let found = fields.nth(1).and_then(|f| f.parse::<u32>().ok());
            return match (id, found) {
                (Some(want), Some(have)) if want != have => Err(format!(
                    "`{name}` is already in {file} with id {have}, not {want}"
                )),
                _ => Ok(()),
            };
        }
    }
    let mut text = existing;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    text.push('\n');
    let mode = if file.contains("shadow") {
        0o640
    } else {
        0o644
    };
    let keep = std::fs::symlink_metadata(&path)
        .ok()
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777);
    tree::write_file(&path, text.as_bytes(), keep.unwrap_or(mode)).map_err(|e| e.to_string())
}

/// Splits a sysusers.d line into words, honouring double quotes; comments and blank lines
/// give no words.
fn split_sysusers(line: &str) -> Result<Vec<String>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(Vec::new());
    }
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == '"' {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some(ch) => word.push(ch),
                    None => return Err("unterminated quote".into()),
                }
            }
        } else {
            while let Some(&ch) = chars.peek() {
                if ch.is_whitespace() {
                    break;
                }
                word.push(ch);
                chars.next();
            }
        }
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysusers_lines_split_on_whitespace_outside_quotes() {
        assert_eq!(
            split_sysusers(r#"u inferloop 951:951 "InferLoop daemon" /var/lib/inferloop -"#)
                .expect("ok"),
            [
                "u",
                "inferloop",
                "951:951",
                "InferLoop daemon",
                "/var/lib/inferloop",
                "-"
            ]
        );
        assert!(split_sysusers("  # comment").expect("ok").is_empty());
    }

    #[test]
    fn sysusers_add_a_fixed_user_once_and_refuse_a_dynamic_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (overlay, root) = (dir.path().join("o"), dir.path().join("r"));
        std::fs::create_dir_all(overlay.join("usr/lib/sysusers.d")).expect("mkdir");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("w");
        std::fs::write(root.join("etc/shadow"), "root:*:19000:0:99999:7:::\n").expect("w");
        let conf = overlay.join("usr/lib/sysusers.d/inferloop.conf");
        std::fs::write(&conf, "u inferloop 951 \"InferLoop\" /var/lib/inferloop\n").expect("w");
        apply(&overlay, &root).expect("applied");
        apply(&overlay, &root).expect("idempotent");
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("read");
        assert_eq!(
            passwd,
            "root:x:0:0:root:/root:/bin/sh\ninferloop:x:951:951:InferLoop:/var/lib/inferloop:/usr/sbin/nologin\n"
        );
        let group = std::fs::read_to_string(root.join("etc/group")).expect("read");
        assert_eq!(group, "inferloop:x:951:\n");
        assert!(std::fs::read_to_string(root.join("etc/shadow"))
            .expect("read")
            .ends_with("inferloop:!*:::::::\n"));
        assert!(!root.join("etc/gshadow").exists(), "no gshadow in the base");

        std::fs::write(&conf, "u other - \"Other\"\n").expect("w");
        assert!(matches!(
            apply(&overlay, &root),
            Err(ImageError::SysUsers { line: 1, .. })
        ));
    }

    #[test]
    fn groups_without_an_id_keep_the_bases_or_take_a_free_one_and_gain_members() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (overlay, root) = (dir.path().join("o"), dir.path().join("r"));
        std::fs::create_dir_all(overlay.join("usr/lib/sysusers.d")).expect("mkdir");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        // As on Debian and L4T's Ubuntu: video has a fixed id; 999 is taken.
        std::fs::write(
            root.join("etc/group"),
            "root:x:0:\nvideo:x:44:\nsystemd-journal:x:999:\n",
        )
        .expect("w");
        std::fs::write(root.join("etc/gshadow"), "root:*::\nvideo:*::\n").expect("w");
        let conf = overlay.join("usr/lib/sysusers.d/inferloop.conf");
        std::fs::write(
            &conf,
            "u inferloop 951 \"InferLoop\"\ng video -\ng render -\nm inferloop video\nm inferloop render\n",
        )
        .expect("w");
        apply(&overlay, &root).expect("applied");
        apply(&overlay, &root).expect("idempotent");
        let group = std::fs::read_to_string(root.join("etc/group")).expect("read");
        assert_eq!(
            group,
            "root:x:0:\nvideo:x:44:inferloop\nsystemd-journal:x:999:\ninferloop:x:951:\nrender:x:998:inferloop\n"
        );
        let gshadow = std::fs::read_to_string(root.join("etc/gshadow")).expect("read");
        assert!(gshadow.contains("\nvideo:*::inferloop\n"), "{gshadow}");
        assert!(gshadow.contains("\nrender:!::inferloop\n"), "{gshadow}");

        std::fs::write(&conf, "m inferloop kvm\n").expect("w");
        match apply(&overlay, &root) {
            Err(ImageError::SysUsers {
                line: 1, message, ..
            }) => {
                assert!(message.contains("`kvm` is not defined"), "{message}")
            }
            other => panic!("expected a refusal naming the group: {other:?}"),
        }
    }
}
