//! `--kv-events`: the blocks a box's slots hold, published on ZeroMQ in the shape
//! vllm-router's `kv_aware` policy decodes, and found through `/kv_event_sources`.

use std::time::Duration;

use rmpv::Value as Mp;
use serde_json::{json, Value};
use zeromq::{Socket, SocketRecv};

use crate::harness::Daemon;

const BLOCK: usize = 16;

fn field<'a>(m: &'a Mp, key: &str) -> &'a Mp {
    m.as_map()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} in {m}"))
}

/// One event as the test reads it: kind, block hashes, parent, token ids.
#[derive(Debug)]
struct Event {
    kind: String,
    /// "GPU" (the slots' cells) or "CPU" (the prompt cache's RAM tier); empty for a clear.
    medium: String,
    hashes: Vec<Vec<u8>>,
    parent: Option<Vec<u8>>,
    tokens: Vec<u64>,
}

fn events(payload: &[u8]) -> Vec<Event> {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let batch = batch.as_array().expect("a batch is an array");
    assert!(batch[0].as_f64().is_some_and(|ts| ts > 0.0), "{batch:?}");
    let list = batch[1].as_array().expect("events");
    list.iter()
        .map(|e| {
            let kind = field(e, "type").as_str().expect("type").to_string();
            let get = |k: &str| {
                e.as_map()
                    .and_then(|m| m.iter().find(|(key, _)| key.as_str() == Some(k)))
            };
            let hashes: Vec<Vec<u8>> = get("block_hashes")
                .and_then(|(_, v)| v.as_array())
                .map(|a| {
                    a.iter()
                        .map(|h| h.as_slice().expect("binary hash").to_vec())
                        .collect()
                })
                .unwrap_or_default();
            assert!(
                hashes.iter().all(|h| h.len() == 32),
                "vllm-router takes 32-byte hashes"
            );
            let medium = match kind.as_str() {
                "AllBlocksCleared" => String::new(),
                _ => field(e, "medium").as_str().expect("medium").to_string(),
            };
            Event {
                medium,
                parent: get("parent_block_hash")
                    .and_then(|(_, v)| v.as_slice())
                    .map(<[u8]>::to_vec),
                tokens: get("token_ids")
                    .and_then(|(_, v)| v.as_array())
                    .map(|a| a.iter().filter_map(Mp::as_u64).collect())
                    .unwrap_or_default(),
                kind,
                hashes,
            }
        })
        .collect()
}

/// Batches until none comes for `quiet`, with their sequence numbers.
async fn drain(sub: &mut zeromq::SubSocket, quiet: Duration) -> Vec<(i64, Vec<Event>)> {
    let mut out = Vec::new();
    while let Ok(msg) = tokio::time::timeout(quiet, sub.recv()).await {
        let msg = msg.expect("recv");
        let frames: Vec<Vec<u8>> = msg.into_vec().into_iter().map(|b| b.to_vec()).collect();
        assert_eq!(frames.len(), 3, "topic, sequence, payload");
        assert!(frames[0].is_empty(), "the topic is empty");
        let seq = i64::from_be_bytes(frames[1].as_slice().try_into().expect("8-byte seq"));
        out.push((seq, events(&frames[2])));
    }
    out
}

/// A subscriber to the box's events, once its subscription has reached the publisher.
async fn subscribe(endpoint: &str) -> zeromq::SubSocket {
    let mut sub = zeromq::SubSocket::new();
    sub.connect(endpoint).await.expect("connect");
    sub.subscribe("").await.expect("subscribe");
    // A subscription reaches the publisher a moment after the connect.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sub
}

/// The token ids the render route gives `body`: what vllm-router hashes.
async fn rendered(d: &Daemon, body: &Value) -> Vec<u64> {
    d.post_ok("/v1/chat/completions/render", body).await["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect()
}

fn chat(system: &str) -> Value {
    json!({
        "model": crate::harness::model_id(),
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Say hello."}
        ],
        "max_tokens": 1,
        "temperature": 0
    })
}

/// The stored blocks of a prompt are its rendered tokens, block by block, chained from the
/// start; a prompt that replaces it in the only slot removes them; sequence numbers have no
/// gap. What vllm-router hashes (the render route's ids) is what the box announces.
#[tokio::test]
async fn the_slots_blocks_are_announced_as_the_render_route_tokenizes_them() {
    let d = Daemon::start(&[
        "--slots",
        "1",
        "--prefix-slots",
        "0",
        "--ctx",
        "1024",
        "--prompt-cache-ram-mb",
        "0",
        "--kv-events",
        "127.0.0.1:0",
    ]);
    let sources = d.get_ok("/kv_event_sources").await;
    let rank = &sources["0"];
    assert_eq!(
        (
            &rank["publisher"],
            &rank["encoding"],
            &rank["schema_version"]
        ),
        (&json!("zmq"), &json!("msgpack"), &json!(1)),
        "{sources}"
    );
    let endpoint = rank["endpoint"].as_str().expect("endpoint").to_string();
    assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
    assert!(
        !endpoint.ends_with(":0"),
        "the port the socket got: {endpoint}"
    );
    let info = d.get_ok("/get_server_info").await;
    assert_eq!(info["kv_block_size"], BLOCK, "{info}");
    assert_eq!(
        info["model_id"],
        json!(crate::harness::model_id()),
        "{info}"
    );

    let mut sub = subscribe(&endpoint).await;

    let first = chat(&"You answer questions about tide pools. ".repeat(20));
    let ids = rendered(&d, &first).await;
    d.chat(&first).await;
    let batches = drain(&mut sub, Duration::from_secs(2)).await;
    let stored: Vec<&Event> = batches
        .iter()
        .flat_map(|(_, e)| e)
        .filter(|e| e.kind == "BlockStored")
        .collect();
    assert!(
        stored.iter().all(|e| e.medium == "GPU"),
        "the RAM tier is off"
    );
    assert!(!stored.is_empty(), "no block stored: {batches:?}");
    assert_eq!(stored[0].parent, None, "the first chain starts the prompt");
    let announced: Vec<u64> = stored.iter().flat_map(|e| e.tokens.clone()).collect();
    let whole = ids.len() / BLOCK * BLOCK;
    assert!(
        announced.len() >= whole,
        "{} of {} tokens",
        announced.len(),
        ids.len()
    );
    assert_eq!(
        announced[..whole],
        ids[..whole],
        "announced tokens are the rendered ones"
    );
    for pair in stored.windows(2) {
        assert_eq!(
            pair[1].parent.as_ref(),
            pair[0].hashes.last(),
            "a later store names the block before it"
        );
    }
    let first_hashes: Vec<Vec<u8>> = stored.iter().flat_map(|e| e.hashes.clone()).collect();

    d.chat(&chat(
        &"You answer questions about volcanoes only. ".repeat(20),
    ))
    .await;
    let later = drain(&mut sub, Duration::from_secs(2)).await;
    let removed: Vec<Vec<u8>> = later
        .iter()
        .flat_map(|(_, e)| e)
        .filter(|e| e.kind == "BlockRemoved")
        .flat_map(|e| e.hashes.clone())
        .collect();
    // The chat template's opening may be shared; everything after it goes.
    assert!(
        removed.len() + 2 >= first_hashes.len() && removed.iter().all(|h| first_hashes.contains(h)),
        "removed {} of {} blocks",
        removed.len(),
        first_hashes.len()
    );
    let metrics = d.metrics().await;
    let sent = metrics
        .lines()
        .find_map(|l| l.strip_prefix("inferloop_kv_event_batches_sent_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("the sent counter");
    assert!(
        sent >= (batches.len() + later.len()) as f64,
        "{sent} sent, {} received",
        batches.len() + later.len()
    );
    assert!(metrics.contains("inferloop_kv_event_batches_dropped_total 0"));
    let seqs: Vec<i64> = batches.iter().chain(&later).map(|(s, _)| *s).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap in the sequence: {seqs:?}"
    );
}

/// With the RAM tier on, the prefix a new prompt evicts from the only slot is saved there and
/// announced as host memory ("CPU"), whole from its first block, with the same hashes as
/// when the slot held it ("GPU").
#[tokio::test]
async fn a_prefix_saved_to_the_ram_tier_is_announced_as_host_blocks() {
    let d = Daemon::start(&[
        "--slots",
        "1",
        "--prefix-slots",
        "0",
        "--ctx",
        "1024",
        "--kv-events",
        "127.0.0.1:0",
    ]);
    let endpoint = d.get_ok("/kv_event_sources").await["0"]["endpoint"]
        .as_str()
        .expect("endpoint")
        .to_string();
    let mut sub = subscribe(&endpoint).await;
    let body = chat(&"You answer questions about lighthouses and their keepers. ".repeat(20));
    let ids = rendered(&d, &body).await;
    d.chat(&body).await;
    // While its cells hold a prefix it is not copied to RAM; a new prompt in the only slot
    // moves it there.
    d.chat(&chat(
        &"You answer questions about canal locks only. ".repeat(20),
    ))
    .await;
    let batches = drain(&mut sub, Duration::from_secs(3)).await;
    let host: Vec<&Event> = batches
        .iter()
        .flat_map(|(_, e)| e)
        .filter(|e| e.kind == "BlockStored" && e.medium == "CPU")
        .collect();
    assert!(!host.is_empty(), "no host block: {batches:?}");
    let whole = ids.len() / BLOCK * BLOCK;
    assert_eq!(host[0].parent, None);
    assert!(
        host[0].tokens.len() >= whole,
        "{} of {}",
        host[0].tokens.len(),
        ids.len()
    );
    assert_eq!(host[0].tokens[..whole], ids[..whole]);
    let device: Vec<Vec<u8>> = batches
        .iter()
        .flat_map(|(_, e)| e)
        .filter(|e| e.kind == "BlockStored" && e.medium == "GPU")
        .flat_map(|e| e.hashes.clone())
        .collect();
    assert_eq!(
        host[0].hashes[..whole / BLOCK],
        device[..whole / BLOCK],
        "one prefix, one set of hashes, whichever tier holds it"
    );
}

#[test]
fn kv_events_need_prompt_reuse_and_the_block_size_needs_kv_events() {
    let (status, log) = Daemon::run_to_exit(
        &["--kv-events", "127.0.0.1:0", "--prefix-cache", "off"],
        Duration::from_secs(20),
    );
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("kv_events"), "{log}");
    let (status, log) =
        Daemon::run_to_exit(&["--kv-events-block-size", "32"], Duration::from_secs(20));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("kv_events_block_size"), "{log}");
}

#[tokio::test]
async fn without_kv_events_there_is_no_source_and_no_block_size() {
    let d = crate::harness::shared();
    assert_eq!(d.get_ok("/kv_event_sources").await, json!({}));
    let info = d.get_ok("/get_server_info").await;
    assert!(info.get("kv_block_size").is_none(), "{info}");
    assert!(info["instance_id"].is_string(), "{info}");
}
