//! hawkBit's Direct Device Integration API on the wire.
//!
//! Replies are parsed leniently (unknown fields ignored, optional ones defaulted): the
//! servers differ (hawkBit sends md5/sha256, `download-http`, `actionHistory`,
//! `maintenanceWindow`; goosebit only a sha1 and a `download` link) and a newer server may
//! add fields. What the agent needs is required; a reply without it is garbage.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

/// `GET {tenant}/controller/v1/{controllerId}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Base {
    #[serde(default)]
    pub config: Option<BaseConfig>,
    #[serde(default, rename = "_links")]
    pub links: BaseLinks,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BaseConfig {
    #[serde(default)]
    pub polling: Option<Polling>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Polling {
    pub sleep: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BaseLinks {
    #[serde(default, rename = "deploymentBase")]
    pub deployment_base: Option<Link>,
    #[serde(default, rename = "configData")]
    pub config_data: Option<Link>,
    #[serde(default, rename = "cancelAction")]
    pub cancel_action: Option<Link>,
    #[serde(default, rename = "installedBase")]
    pub installed_base: Option<Link>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Link {
    pub href: String,
}

impl Base {
    /// The server's polling interval; `None` when it gave none or an unreadable one.
    pub fn sleep(&self) -> Option<Duration> {
        let p = self.config.as_ref()?.polling.as_ref()?;
        parse_sleep(&p.sleep).ok()
    }
}

/// `HH:MM:SS` (hours may exceed 23) → a duration.
pub fn parse_sleep(s: &str) -> Result<Duration, String> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let [h, m, sec] = parts.as_slice() else {
        return Err(format!("polling sleep {s:?} is not HH:MM:SS"));
    };
    let num = |field: &str, what: &str, max: u64| -> Result<u64, String> {
        if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "polling sleep {s:?}: {what} {field:?} is not a number"
            ));
        }
        let v: u64 = field
            .parse()
            .map_err(|_| format!("polling sleep {s:?}: {what} {field:?} is too large"))?;
        if v > max {
            return Err(format!("polling sleep {s:?}: {what} must be at most {max}"));
        }
        Ok(v)
    };
    let h = num(h, "hours", 10_000)?;
    let m = num(m, "minutes", 59)?;
    let sec = num(sec, "seconds", 59)?;
    Ok(Duration::from_secs(h * 3600 + m * 60 + sec))
}

/// hawkBit sends action ids as strings, some servers as numbers.
fn id_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        S(String),
        N(i64),
    }
    Ok(match Id::deserialize(d)? {
        Id::S(s) => s,
        Id::N(n) => n.to_string(),
    })
}

/// `GET .../deploymentBase/{actionId}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeploymentBase {
    #[serde(deserialize_with = "id_string")]
    pub id: String,
    pub deployment: Deployment,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Deployment {
    #[serde(default)]
    pub download: Handling,
    #[serde(default)]
    pub update: Handling,
    #[serde(default, rename = "maintenanceWindow")]
    pub maintenance_window: Option<MaintenanceWindow>,
    #[serde(default)]
    pub chunks: Vec<Chunk>,
}

/// `skip | attempt | forced`. The box has no user to ask, so `attempt` acts as `forced`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Handling {
    Skip,
    Attempt,
    #[default]
    Forced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaintenanceWindow {
    Available,
    Unavailable,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub part: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Artifact {
    pub filename: String,
    #[serde(default)]
    pub hashes: Hashes,
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default, rename = "_links")]
    pub links: BTreeMap<String, Link>,
}

/// Hex digests as the server gave them (compared case-insensitively).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Hashes {
    #[serde(default)]
    pub sha1: Option<String>,
    #[serde(default)]
    pub md5: Option<String>,
    #[serde(default)]
    pub sha256: Option<String>,
}

impl Hashes {
    pub fn is_empty(&self) -> bool {
        self.sha1.is_none() && self.md5.is_none() && self.sha256.is_none()
    }
}

impl Artifact {
    /// The plain-HTTP(S) link: `download-http` first, then `download` (hawkBit's `download`
    /// is HTTPS-only on some installs; goosebit sends only `download`).
    pub fn download_url(&self) -> Option<&str> {
        ["download-http", "download"]
            .iter()
            .find_map(|k| self.links.get(*k))
            .map(|l| l.href.as_str())
    }
}

impl DeploymentBase {
    /// The bundle to install and the version its chunk names: the first artifact ending
    /// in `.raucb`, else the only artifact. Several artifacts without a bundle among them
    /// are refused rather than guessed at.
    pub fn bundle(&self) -> Result<(&Chunk, &Artifact), String> {
        let all: Vec<(&Chunk, &Artifact)> = self
            .deployment
            .chunks
            .iter()
            .flat_map(|c| c.artifacts.iter().map(move |a| (c, a)))
            .collect();
        if let Some(found) = all.iter().find(|(_, a)| a.filename.ends_with(".raucb")) {
            return Ok(*found);
        }
        match all.as_slice() {
            [one] => Ok(*one),
            [] => Err("no chunk carries an artifact".into()),
            many => Err(format!(
                "{} artifacts and none is a .raucb: {}",
                many.len(),
                many.iter()
                    .map(|(_, a)| a.filename.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// `GET .../cancelAction/{actionId}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CancelActionBase {
    #[serde(deserialize_with = "id_string")]
    pub id: String,
    #[serde(rename = "cancelAction")]
    pub cancel_action: CancelAction,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CancelAction {
    #[serde(rename = "stopId", deserialize_with = "id_string")]
    pub stop_id: String,
}

/// `status.execution` of a feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Execution {
    Proceeding,
    Downloaded,
    Closed,
    Canceled,
    Rejected,
}

/// `status.result.finished`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Finished {
    Success,
    Failure,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Progress {
    pub cnt: u32,
    pub of: u32,
}

/// The body of `POST .../deploymentBase/{id}/feedback` (and the cancel feedback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Feedback {
    /// Older hawkBit versions require the action id in the body; newer ones ignore it.
    pub id: String,
    pub status: FeedbackStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FeedbackStatus {
    pub execution: Execution,
    pub result: FeedbackResult,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FeedbackResult {
    pub finished: Finished,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

impl Feedback {
    pub fn new(id: &str, execution: Execution, finished: Finished, details: Vec<String>) -> Self {
        Self {
            id: id.to_string(),
            status: FeedbackStatus {
                execution,
                result: FeedbackResult {
                    finished,
                    progress: None,
                },
                details,
            },
        }
    }

    /// `proceeding` with `cnt` of `of` steps done.
    pub fn progress(id: &str, cnt: u32, of: u32, details: Vec<String>) -> Self {
        let mut f = Self::new(id, Execution::Proceeding, Finished::None, details);
        f.status.result.progress = Some(Progress { cnt, of });
        f
    }

    pub fn closed(id: &str, finished: Finished, details: Vec<String>) -> Self {
        Self::new(id, Execution::Closed, finished, details)
    }
}

/// The body of `PUT .../configData`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigData {
    pub mode: &'static str,
    pub data: BTreeMap<String, String>,
    /// Required by hawkBit before 0.3.0M7, ignored by newer servers and goosebit.
    pub status: ConfigDataStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigDataStatus {
    pub execution: Execution,
    pub result: FeedbackResult,
}

impl ConfigData {
    pub fn merge(data: BTreeMap<String, String>) -> Self {
        Self {
            mode: "merge",
            data,
            status: ConfigDataStatus {
                execution: Execution::Closed,
                result: FeedbackResult {
                    finished: Finished::Success,
                    progress: None,
                },
            },
        }
    }
}
