//! The events on the wire, as vLLM publishes them and vllm-router's `kv_aware` policy reads
//! them: a msgpack array `[ts, events]`, each event a map tagged by `"type"`, block hashes as
//! 32-byte binaries, and a `medium` the router credits by: `"GPU"`, the engine's own cache
//! (here the slots' KV cells, on whichever device they live), in full; `"CPU"`, a host tier it
//! can restore from (the prompt cache's RAM tier), at `--kv-penalty-host`. The router refuses
//! a map with a key it does not know.

use rmpv::Value;

use super::blocks::KvEvent;

/// Where a batch's blocks are, in the router's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The slots' KV cells.
    Device,
    /// The prompt cache's RAM tier.
    Host,
}

impl Medium {
    fn label(self) -> &'static str {
        match self {
            Medium::Device => "GPU",
            Medium::Host => "CPU",
        }
    }
}

/// One batch, encoded: `ts` is the wall-clock time in seconds (the router only logs it).
pub fn encode(ts: f64, events: &[KvEvent], block_size: u32, medium: Medium) -> Vec<u8> {
    let events = events
        .iter()
        .map(|e| event(e, block_size, medium.label()))
        .collect();
    let batch = Value::Array(vec![Value::F64(ts), Value::Array(events)]);
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}

fn hashes(hashes: &[[u8; 32]]) -> Value {
    Value::Array(hashes.iter().map(|h| Value::Binary(h.to_vec())).collect())
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

fn event(e: &KvEvent, block_size: u32, medium: &str) -> Value {
    match e {
        KvEvent::Stored {
            hashes: stored,
            parent,
            tokens,
        } => map(vec![
            ("type", Value::from("BlockStored")),
            ("block_hashes", hashes(stored)),
            (
                "parent_block_hash",
                parent.map_or(Value::Nil, |p| Value::Binary(p.to_vec())),
            ),
            (
                "token_ids",
                Value::Array(tokens.iter().map(|t| Value::from(*t)).collect()),
            ),
            ("block_size", Value::from(block_size)),
            ("lora_id", Value::Nil),
            ("medium", Value::from(medium)),
            ("lora_name", Value::Nil),
        ]),
        KvEvent::Removed { hashes: removed } => map(vec![
            ("type", Value::from("BlockRemoved")),
            ("block_hashes", hashes(removed)),
            ("medium", Value::from(medium)),
        ]),
        KvEvent::AllCleared => map(vec![("type", Value::from("AllBlocksCleared"))]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<'a>(m: &'a Value, key: &str) -> &'a Value {
        m.as_map()
            .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {key} in {m}"))
    }

    #[test]
    fn a_batch_is_a_timestamp_and_tagged_maps_with_binary_hashes() {
        let events = [
            KvEvent::Stored {
                hashes: vec![[1; 32], [2; 32]],
                parent: None,
                tokens: (0..8).collect(),
            },
            KvEvent::Removed {
                hashes: vec![[3; 32]],
            },
            KvEvent::AllCleared,
        ];
        let bytes = encode(12.5, &events, 4, Medium::Device);
        let v = rmpv::decode::read_value(&mut &bytes[..]).expect("msgpack");
        let batch = v.as_array().expect("an array");
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].as_f64(), Some(12.5));
        let evs = batch[1].as_array().expect("events");
        assert_eq!(field(&evs[0], "type").as_str(), Some("BlockStored"));
        let stored = field(&evs[0], "block_hashes").as_array().expect("hashes");
        assert_eq!(stored[1], Value::Binary(vec![2; 32]));
        assert_eq!(field(&evs[0], "parent_block_hash"), &Value::Nil);
        assert_eq!(
            field(&evs[0], "token_ids").as_array().map(Vec::len),
            Some(8)
        );
        assert_eq!(field(&evs[0], "block_size").as_u64(), Some(4));
        assert_eq!(field(&evs[0], "medium").as_str(), Some("GPU"));
        assert_eq!(field(&evs[0], "lora_id"), &Value::Nil);
        assert_eq!(field(&evs[0], "lora_name"), &Value::Nil);
        assert_eq!(
            evs[0].as_map().map(Vec::len),
            Some(8),
            "no key the router refuses"
        );
        assert_eq!(field(&evs[1], "type").as_str(), Some("BlockRemoved"));
        assert_eq!(evs[1].as_map().map(Vec::len), Some(3));
        assert_eq!(evs[2].as_map().map(Vec::len), Some(1));
        let host = encode(1.0, &events[1..2], 4, Medium::Host);
        let v = rmpv::decode::read_value(&mut &host[..]).expect("msgpack");
        assert_eq!(
            field(&v.as_array().expect("batch")[1][0], "medium").as_str(),
            Some("CPU")
        );
    }
}
