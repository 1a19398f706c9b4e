//! Any bytes as a hawkBit DDI server's reply, read as the agent reads each one (the poll's
//! base, a deployment, a cancel action; `client::get_json` is `serde_json::from_slice` into
//! these types), then what the agent derives from it: the polling interval, the bundle to
//! install, its download link and the file name it is saved under, which must stay one
//! safe name in the download directory whatever the server sent.

#![no_main]

use inferloop_ota::agent::download_name;
use inferloop_ota::ddi::{parse_sleep, Base, CancelActionBase, DeploymentBase};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    if let Ok(base) = serde_json::from_slice::<Base>(body) {
        if let Some(sleep) = base.sleep() {
            assert!(sleep.as_secs() <= 10_000 * 3600 + 59 * 60 + 59);
        }
    }
    if let Ok(d) = serde_json::from_slice::<DeploymentBase>(body) {
        if let Ok((_chunk, artifact)) = d.bundle() {
            let _ = artifact.download_url();
            let _ = artifact.hashes.is_empty();
            let name = download_name(&d.id, &artifact.filename);
            assert!(name.starts_with("action-"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "{name:?} is not a safe file name"
            );
        }
    }
    let _ = serde_json::from_slice::<CancelActionBase>(body);
    // The interval as any text (the poll's `config.polling.sleep`).
    if let Ok(s) = std::str::from_utf8(body) {
        let _ = parse_sleep(s);
    }
});
