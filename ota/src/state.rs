//! What must survive a reboot: the installed action awaiting confirmation, and the last
//! final report (re-sent if the server still offers that action, e.g. after it missed it).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ddi::Finished;
use crate::OtaError;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// Installed, the box must reboot into `to_slot` and confirm it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
    /// The last action reported `closed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<Closed>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    pub action_id: String,
    /// The version the deployment named (the bundle's), when it named one.
    pub version: Option<String>,
    /// Bootname the box ran when it installed (`A`).
    pub from_bootname: String,
    /// RAUC's primary slot after the install: its name (`rootfs.1`) and bootname (`B`).
    pub to_slot: String,
    pub to_bootname: String,
    /// Unix seconds of the install; the confirmation timeout counts from the first boot
    /// into the new slot (`booted_at`).
    pub installed_at: u64,
    #[serde(default)]
    pub booted_at: Option<u64>,
    /// The reboot was requested (not repeated after a restart of the agent alone).
    #[serde(default)]
    pub reboot_requested: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Closed {
    pub action_id: String,
    pub finished: Finished,
    pub details: Vec<String>,
    /// The server acknowledged it; until then every cycle sends it again.
    #[serde(default)]
    pub reported: bool,
}

/// The state file; every save is a write to a temporary file, fsync, rename.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A missing file is the empty state; an unreadable one is an error (guessing could
    /// report an update that never booted as a success).
    pub fn load(&self) -> Result<State, OtaError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| OtaError::Config {
                path: self.path.clone(),
                message: format!("unreadable state file ({e}); move it away to start afresh"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(OtaError::io("reading state", &self.path)(e)),
        }
    }

    pub fn save(&self, state: &State) -> Result<(), OtaError> {
        use std::io::Write;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(OtaError::io("creating", dir))?;
        }
        let tmp = self.path.with_extension("tmp");
        let mut bytes = serde_json::to_vec_pretty(state).unwrap_or_default();
        bytes.push(b'\n');
        let mut f = std::fs::File::create(&tmp).map_err(OtaError::io("writing state", &tmp))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(OtaError::io("writing state", &tmp))?;
        std::fs::rename(&tmp, &self.path).map_err(OtaError::io("writing state", &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_the_empty_state_and_saves_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sf = StateFile::new(dir.path().join("sub/state.json"));
        assert_eq!(sf.load().expect("empty"), State::default());
        let st = State {
            pending: Some(Pending {
                action_id: "7".into(),
                version: Some("1.1.0".into()),
                from_bootname: "A".into(),
                to_slot: "rootfs.1".into(),
                to_bootname: "B".into(),
                installed_at: 1,
                booted_at: None,
                reboot_requested: true,
            }),
            closed: None,
        };
        sf.save(&st).expect("save");
        assert_eq!(sf.load().expect("load"), st);
    }

    #[test]
    fn a_corrupt_state_file_is_an_error_not_a_fresh_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("state.json");
        std::fs::write(&p, b"{\"pending\": 3").expect("write");
        let err = StateFile::new(p).load().expect_err("corrupt");
        assert!(matches!(err, OtaError::Config { .. }), "{err:?}");
    }
}
