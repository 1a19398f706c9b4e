//! Downloads against the fake server: resume with Range, checks, and what is kept.

use inferloop_ota::ddi::Hashes;
use inferloop_ota::download::{digest_file, fetch, partial_path, Request};
use inferloop_ota::OtaError;

use crate::fake::{Fake, Script};

fn payload() -> Vec<u8> {
    (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn hashes_of(bytes: &[u8], dir: &std::path::Path) -> Hashes {
    let p = dir.join("reference");
    std::fs::write(&p, bytes).expect("write");
    let d = digest_file(&p).expect("digest");
    Hashes {
        sha1: Some(d.sha1),
        md5: Some(d.md5),
        sha256: Some(d.sha256),
    }
}

/// The fake server serving `payload()` (shaped by `script`), a scratch directory, and the
/// hashes and URL a deployment would name.
struct Setup {
    data: Vec<u8>,
    fake: Fake,
    dir: tempfile::TempDir,
    hashes: Hashes,
    url: String,
}

impl Setup {
    async fn start(script: Script) -> Self {
        let data = payload();
        let fake = Fake::start(Script {
            artifact: data.clone(),
            ..script
        })
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let hashes = hashes_of(&data, dir.path());
        let url = format!("{}/artifact", fake.url);
        Self {
            data,
            fake,
            dir,
            hashes,
            url,
        }
    }

    fn request(&self) -> Request<'_> {
        Request {
            url: &self.url,
            size: Some(self.data.len() as u64),
            hashes: &self.hashes,
            dest: self.dir.path().join("b.raucb"),
        }
    }
}

#[tokio::test]
async fn an_interrupted_download_resumes_from_the_partial_file_with_range() {
    let t = Setup::start(Script {
        cut_after: Some(100_000),
        ..Script::default()
    })
    .await;
    let (data, fake, req) = (&t.data, &t.fake, t.request());
    let http = reqwest::Client::new();
    let err = fetch(&http, &req, |_, _| {}).await.expect_err("cut");
    assert!(matches!(err, OtaError::Interrupted { .. }), "{err:?}");
    let kept = std::fs::metadata(partial_path(&req.dest))
        .expect("partial kept")
        .len();
    assert!(kept > 0 && kept <= 100_000, "{kept}");

    let path = fetch(&http, &req, |_, _| {}).await.expect("resumed");
    assert_eq!(&std::fs::read(&path).expect("read"), data);
    assert!(!partial_path(&req.dest).exists());
    let ranges: Vec<Option<String>> = fake.log().into_iter().map(|r| r.range).collect();
    assert_eq!(ranges, [None, Some(format!("bytes={kept}-"))]);

    // Finished and verified: a second fetch reads the file, not the network.
    fetch(&http, &req, |_, _| {}).await.expect("again");
    assert_eq!(fake.with(|s| s.log.len()), 2);
}

#[tokio::test]
async fn a_hash_mismatch_deletes_the_file_and_names_the_algorithm() {
    let mut t = Setup::start(Script::default()).await;
    t.hashes.sha256 = Some("00".repeat(32));
    let req = t.request();
    let err = fetch(&reqwest::Client::new(), &req, |_, _| {})
        .await
        .expect_err("mismatch");
    match &err {
        OtaError::HashMismatch {
            algorithm, file, ..
        } => assert_eq!((*algorithm, file.as_str()), ("sha256", "b.raucb")),
        other => panic!("expected HashMismatch, got {other:?}"),
    }
    assert!(!req.dest.exists() && !partial_path(&req.dest).exists());
}

#[tokio::test]
async fn a_partial_file_longer_than_the_artifact_starts_over() {
    let t = Setup::start(Script::default()).await;
    let (data, fake, req) = (&t.data, &t.fake, t.request());
    std::fs::write(partial_path(&req.dest), vec![0u8; data.len() + 10]).expect("write");
    fetch(&reqwest::Client::new(), &req, |_, _| {})
        .await
        .expect("fresh download");
    assert_eq!(
        fake.log()[0].range.clone(),
        None,
        "no Range on a fresh start"
    );
}

#[tokio::test]
async fn a_stale_partial_that_is_no_prefix_fails_the_hash_and_is_removed() {
    // The server's file changed between two tries: the resumed bytes do not add up.
    let t = Setup::start(Script::default()).await;
    let req = t.request();
    std::fs::write(partial_path(&req.dest), vec![0xAAu8; 1000]).expect("write");
    let err = fetch(&reqwest::Client::new(), &req, |_, _| {})
        .await
        .expect_err("bad prefix");
    assert!(matches!(err, OtaError::HashMismatch { .. }), "{err:?}");
    assert!(!partial_path(&req.dest).exists());
    // And the next try starts clean and succeeds.
    fetch(&reqwest::Client::new(), &req, |_, _| {})
        .await
        .expect("clean retry");
}
