//! The wire types against hawkBit's documented replies and goosebit's minimal ones.

use std::time::Duration;

use inferloop_ota::ddi::{
    parse_sleep, Base, CancelActionBase, DeploymentBase, Feedback, Finished, Handling,
    MaintenanceWindow,
};

/// hawkBit's poll reply, as in its DDI documentation.
const HAWKBIT_BASE: &str = r#"{
  "config": {"polling": {"sleep": "12:00:00"}},
  "_links": {
    "deploymentBase": {"href": "https://hb/DEFAULT/controller/v1/box/deploymentBase/5?c=-2129030598"},
    "installedBase": {"href": "https://hb/DEFAULT/controller/v1/box/installedBase/4"},
    "configData": {"href": "https://hb/DEFAULT/controller/v1/box/configData"}
  }
}"#;

const HAWKBIT_DEPLOYMENT: &str = r#"{
  "id": "5",
  "deployment": {
    "download": "forced", "update": "attempt", "maintenanceWindow": "unavailable",
    "chunks": [{
      "part": "os", "version": "1.1.0", "name": "inferloop",
      "artifacts": [
        {"filename": "notes.txt", "hashes": {"sha1": "aa", "md5": "bb", "sha256": "cc"}, "size": 3,
         "_links": {"download": {"href": "https://hb/notes"}}},
        {"filename": "inferloop-1.1.0.raucb",
         "hashes": {"sha1": "2b1f", "md5": "0d1b", "sha256": "a0b1"},
         "size": 91234,
         "_links": {
           "download": {"href": "https://hb/dl/5"},
           "download-http": {"href": "http://hb/dl/5"},
           "md5sum-http": {"href": "http://hb/dl/5.MD5SUM"}
         }}
      ],
      "metadata": [{"key": "k", "value": "v"}]
    }]
  },
  "actionHistory": {"status": "SCHEDULED", "messages": ["Reboot"]}
}"#;

/// goosebit 0.2.12: a sha1 and a `download` link, numbers where hawkBit has strings.
const GOOSEBIT_DEPLOYMENT: &str = r#"{"id": "3", "deployment": {"download": "forced", "update": "forced",
  "chunks": [{"part": "os", "version": "1.1.0", "name": "good-1.1.0.raucb",
    "artifacts": [{"filename": "good-1.1.0.raucb", "hashes": {"sha1": "7313627acf2d015e06bfc60905b7517b24d7291f"},
      "size": 17285, "_links": {"download": {"href": "http://127.0.0.1:1/DEFAULT/controller/v1/box/download"}}}]}]}}"#;

#[test]
fn hawkbit_base_gives_links_and_a_twelve_hour_sleep() {
    let b: Base = serde_json::from_str(HAWKBIT_BASE).expect("parses");
    assert_eq!(b.sleep(), Some(Duration::from_secs(12 * 3600)));
    assert!(b
        .links
        .deployment_base
        .expect("deploymentBase")
        .href
        .ends_with("/5?c=-2129030598"));
    assert!(b.links.config_data.is_some() && b.links.installed_base.is_some());
    assert!(b.links.cancel_action.is_none());
}

#[test]
fn goosebit_registration_reply_and_an_empty_reply_parse() {
    let b: Base = serde_json::from_str(
        r#"{"config":{"polling":{"sleep":"00:00:10"}},"_links":{"configData":{"href":"http://g/DEFAULT/controller/v1/x/configData"}}}"#,
    )
    .expect("parses");
    assert_eq!(b.sleep(), Some(Duration::from_secs(10)));
    let empty: Base = serde_json::from_str("{}").expect("parses");
    assert_eq!(empty.sleep(), None);
    assert!(serde_json::from_str::<Base>("<html>").is_err());
}

#[test]
fn hawkbit_deployment_picks_the_bundle_and_prefers_download_http() {
    let d: DeploymentBase = serde_json::from_str(HAWKBIT_DEPLOYMENT).expect("parses");
    assert_eq!(d.id, "5");
    assert_eq!(d.deployment.update, Handling::Attempt);
    assert_eq!(
        d.deployment.maintenance_window,
        Some(MaintenanceWindow::Unavailable)
    );
    let (chunk, a) = d.bundle().expect("bundle");
    assert_eq!(chunk.version.as_deref(), Some("1.1.0"));
    assert_eq!(a.filename, "inferloop-1.1.0.raucb");
    assert_eq!(a.download_url(), Some("http://hb/dl/5"));
    assert_eq!(a.hashes.sha256.as_deref(), Some("a0b1"));
    assert_eq!(a.size, Some(91234));
}

#[test]
fn goosebit_deployment_has_only_sha1_and_download() {
    let d: DeploymentBase = serde_json::from_str(GOOSEBIT_DEPLOYMENT).expect("parses");
    let (_, a) = d.bundle().expect("bundle");
    assert_eq!(
        a.download_url(),
        Some("http://127.0.0.1:1/DEFAULT/controller/v1/box/download")
    );
    assert!(a.hashes.sha256.is_none() && a.hashes.md5.is_none() && a.hashes.sha1.is_some());
    assert_eq!(d.deployment.maintenance_window, None);
    // Numeric ids are accepted too.
    let n: DeploymentBase =
        serde_json::from_str(r#"{"id": 7, "deployment": {"chunks": []}}"#).expect("numeric id");
    assert_eq!(n.id, "7");
    assert_eq!(n.deployment.download, Handling::Forced);
    assert!(n.bundle().is_err());
}

#[test]
fn cancel_action_and_feedback_bodies() {
    let c: CancelActionBase =
        serde_json::from_str(r#"{"id":"11","cancelAction":{"stopId":"11"}}"#).expect("parses");
    assert_eq!(c.cancel_action.stop_id, "11");
    let fb = Feedback::progress("5", 40, 100, vec!["RAUC: 40% Checking bundle done.".into()]);
    assert_eq!(
        serde_json::to_value(&fb).expect("json"),
        serde_json::json!({"id": "5", "status": {"execution": "proceeding",
            "result": {"finished": "none", "progress": {"cnt": 40, "of": 100}},
            "details": ["RAUC: 40% Checking bundle done."]}})
    );
    let closed = Feedback::closed("5", Finished::Failure, vec![]);
    assert_eq!(
        serde_json::to_value(&closed).expect("json"),
        serde_json::json!({"id": "5", "status": {"execution": "closed", "result": {"finished": "failure"}}})
    );
}

#[test]
fn polling_sleep_is_hh_mm_ss() {
    assert_eq!(parse_sleep("00:00:01"), Ok(Duration::from_secs(1)));
    assert_eq!(parse_sleep("00:05:00"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_sleep("36:00:00"), Ok(Duration::from_secs(36 * 3600)));
    for bad in [
        "", "10", "00:60:00", "00:00:60", "a:b:c", "-1:00:00", "00:00", "1:2:3:4", "00: 1:00",
    ] {
        assert!(parse_sleep(bad).is_err(), "{bad:?} accepted");
    }
}
