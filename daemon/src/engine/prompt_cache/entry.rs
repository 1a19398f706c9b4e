//! One disk entry's bytes: a header naming what the saved KV depends on, the tokens it
//! holds, the backend's saved bytes, and a SHA-256 over all of it.
//!
//! ```text
//! "ILPCACHE"  u32 version  u32 header length  header (JSON)  tokens (i32 LE)  payload  sha256
//! ```
//!
//! The header is read alone when the tier indexes its directory (the tokens are the lookup
//! key); the whole file is read and its checksum verified before a payload is handed to the
//! backend, so a torn write or a flipped bit is never restored.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"ILPCACHE";
const VERSION: u32 = 1;
/// Magic, version and header length.
const PREAMBLE: usize = 16;
const CHECKSUM: usize = 32;
/// A header is a few hundred bytes; anything much larger is not one of ours.
const MAX_HEADER: usize = 64 << 10;

/// What an entry's payload is valid for: restored only where all of it matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// SHA-256 of the weights the KV was computed with.
    pub weights_sha256: String,
    /// The backend's [`kv_layout`](crate::engine::backend::seam::Backend::kv_layout).
    pub kv_layout: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    #[serde(flatten)]
    pub key: Key,
    pub n_tokens: u32,
    pub payload_bytes: u64,
}

/// Why bytes are not a usable entry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    #[error("not a prompt cache entry (bad magic or version)")]
    Foreign,
    #[error("truncated: {0}")]
    Truncated(&'static str),
    #[error("header is not valid: {0}")]
    Header(String),
    #[error("checksum mismatch")]
    Checksum,
    #[error("saved for other weights or another KV layout")]
    Mismatch,
}

/// Writes the entry for `tokens` and `payload` under `key`, hashing as it goes (the payload
/// is not copied); returns the bytes written.
pub fn write_to<W: std::io::Write>(
    w: &mut W,
    key: &Key,
    tokens: &[i32],
    payload: &[u8],
) -> std::io::Result<u64> {
    let header = Header {
        key: key.clone(),
        n_tokens: tokens.len() as u32,
        payload_bytes: payload.len() as u64,
    };
    let header = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    let token_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut sum = Sha256::new();
    let mut n = 0u64;
    for part in [
        MAGIC.as_slice(),
        &VERSION.to_le_bytes(),
        &(header.len() as u32).to_le_bytes(),
        &header,
        &token_bytes,
        payload,
    ] {
        sum.update(part);
        w.write_all(part)?;
        n += part.len() as u64;
    }
    w.write_all(&sum.finalize())?;
    Ok(n + CHECKSUM as u64)
}

/// [`write_to`] into memory.
#[cfg(test)]
pub fn encode(key: &Key, tokens: &[i32], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_to(&mut out, key, tokens, payload).expect("writing to memory");
    out
}

/// How many leading bytes [`read_head`] needs, from the first 16.
pub fn head_len(preamble: &[u8]) -> Result<usize, EntryError> {
    if preamble.len() < PREAMBLE {
        return Err(EntryError::Truncated("preamble"));
    }
    if &preamble[..8] != MAGIC || u32_at(preamble, 8) != VERSION {
        return Err(EntryError::Foreign);
    }
    let header = u32_at(preamble, 12) as usize;
    if header > MAX_HEADER {
        return Err(EntryError::Header(format!("{header} bytes long")));
    }
    Ok(PREAMBLE + header)
}

/// The header and tokens at the start of an entry (`bytes` holds at least them): what the
/// index keeps. `file_len` is checked against what the header says follows.
pub fn read_head(bytes: &[u8], file_len: u64) -> Result<(Header, Vec<i32>), EntryError> {
    let head = head_len(bytes)?;
    let header: Header = serde_json::from_slice(
        bytes
            .get(PREAMBLE..head)
            .ok_or(EntryError::Truncated("header"))?,
    )
    .map_err(|e| EntryError::Header(e.to_string()))?;
    let tokens_end = head + 4 * header.n_tokens as usize;
    let want = tokens_end as u64 + header.payload_bytes + CHECKSUM as u64;
    if file_len != want {
        return Err(EntryError::Truncated(
            "file length does not match its header",
        ));
    }
    let tokens = bytes
        .get(head..tokens_end)
        .ok_or(EntryError::Truncated("tokens"))?
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((header, tokens))
}

/// Checks a whole entry against its checksum and the expected key and tokens; returns the
/// payload's range in `bytes`.
pub fn verify(
    bytes: &[u8],
    key: &Key,
    tokens: &[i32],
) -> Result<std::ops::Range<usize>, EntryError> {
    let body = bytes
        .len()
        .checked_sub(CHECKSUM)
        .ok_or(EntryError::Truncated("checksum"))?;
    if Sha256::digest(&bytes[..body]).as_slice() != &bytes[body..] {
        return Err(EntryError::Checksum);
    }
    let (header, saved) = read_head(bytes, bytes.len() as u64)?;
    if header.key != *key || saved != tokens {
        return Err(EntryError::Mismatch);
    }
    let start = body - header.payload_bytes as usize;
    Ok(start..body)
}

/// The entry's file name: a digest of what it is valid for and the tokens it holds.
pub fn file_name(key: &Key, tokens: &[i32]) -> String {
    let mut h = Sha256::new();
    h.update(key.weights_sha256.as_bytes());
    h.update([0]);
    h.update(key.kv_layout.as_bytes());
    h.update([0]);
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.kv")
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key {
            weights_sha256: "ab".repeat(32),
            kv_layout: "test f16".into(),
        }
    }

    #[test]
    fn an_entry_reads_back_and_names_its_payload() {
        let bytes = encode(&key(), &[5, -1, 7], b"payload!");
        let (header, tokens) = read_head(&bytes, bytes.len() as u64).unwrap();
        assert_eq!(tokens, vec![5, -1, 7]);
        assert_eq!((header.n_tokens, header.payload_bytes), (3, 8));
        let range = verify(&bytes, &key(), &tokens).unwrap();
        assert_eq!(&bytes[range], b"payload!");
    }

    #[test]
    fn every_flipped_byte_is_caught_and_a_short_file_too() {
        let bytes = encode(&key(), &[1, 2], b"kv rows");
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(verify(&bad, &key(), &[1, 2]).is_err(), "byte {i}");
        }
        assert_eq!(
            read_head(&bytes[..bytes.len() - 1], bytes.len() as u64 - 1),
            Err(EntryError::Truncated(
                "file length does not match its header"
            ))
        );
        assert_eq!(
            verify(&bytes[..10], &key(), &[1, 2]),
            Err(EntryError::Truncated("checksum"))
        );
    }

    #[test]
    fn an_entry_for_other_weights_layout_or_tokens_is_a_mismatch() {
        let bytes = encode(&key(), &[1, 2], b"kv");
        let other = Key {
            weights_sha256: "cd".repeat(32),
            ..key()
        };
        assert_eq!(verify(&bytes, &other, &[1, 2]), Err(EntryError::Mismatch));
        assert_eq!(verify(&bytes, &key(), &[1, 3]), Err(EntryError::Mismatch));
        assert_ne!(file_name(&key(), &[1, 2]), file_name(&other, &[1, 2]));
        assert_ne!(file_name(&key(), &[1, 2]), file_name(&key(), &[1, 2, 3]));
        assert_eq!(
            head_len(b"NOTOURS!\x01\0\0\0\0\0\0\0"),
            Err(EntryError::Foreign)
        );
    }
}
