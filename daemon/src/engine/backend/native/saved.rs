//! The bytes of a saved KV prefix (the prompt cache's RAM and disk tiers): a header, then
//! per layer the K and then the V of positions `0..n`, each `n * kv_dim` f16 bits,
//! little-endian, in the cells' own order (`[pos][n_head_kv][head_dim]`).
//!
//! The CPU and the CUDA pass write the same bytes (their cells hold the same f16 bits,
//! since every CUDA kernel gives its CPU twin's bits), so both share one [`layout`] and
//! read each other's entries. The header repeats what restoring needs to check the bytes
//! against the cache; the disk tier's key and checksum guard the rest.

use super::batch::Activations;
use super::error::NativeError;

/// The first bytes of a saved prefix.
pub const MAGIC: [u8; 4] = *b"ILKV";
/// Bumped whenever the bytes change meaning; part of [`layout`].
pub const VERSION: u32 = 1;
/// Magic, then four little-endian `u32`: version, layers, values per cell, positions.
pub const HEADER_BYTES: usize = 20;

/// The geometry the bytes are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub n_layer: usize,
    /// Values per cell: `n_head_kv * head_dim`.
    pub kv_dim: usize,
}

impl Geometry {
    /// Bytes of K and V of `n_pos` positions in every layer, `None` past `usize`.
    pub fn payload_bytes(&self, n_pos: usize) -> Option<usize> {
        (2 * std::mem::size_of::<u16>())
            .checked_mul(self.n_layer)?
            .checked_mul(self.kv_dim)?
            .checked_mul(n_pos)
    }
}

/// What saved bytes depend on besides the weights: the format, the cells' element type
/// and geometry, and the activations that computed K and V (the F32 mode gives other
/// bits). The device is left out on purpose: CPU and CUDA cells hold the same bits.
pub fn layout(n_layer: usize, n_head_kv: usize, head_dim: usize, act: Activations) -> String {
    let act = match act {
        Activations::Q8 => "q8",
        Activations::F32 => "f32",
    };
    format!(
        "native kv v{VERSION}: f16 cells, {n_layer} layers x {n_head_kv} kv heads x \
         {head_dim}, {act} activations"
    )
}

/// A buffer sized for `n_pos` positions, its header written and its payload zeroed.
pub fn buffer(g: Geometry, n_pos: usize) -> Result<Vec<u8>, NativeError> {
    let too_big = || NativeError::Kv(format!("{n_pos} positions do not fit a saved prefix"));
    let payload = g.payload_bytes(n_pos).ok_or_else(too_big)?;
    let mut out = Vec::with_capacity(HEADER_BYTES + payload);
    out.extend_from_slice(&MAGIC);
    for v in [VERSION as usize, g.n_layer, g.kv_dim, n_pos] {
        out.extend_from_slice(&u32::try_from(v).map_err(|_| too_big())?.to_le_bytes());
    }
    out.resize(HEADER_BYTES + payload, 0);
    Ok(out)
}

/// Checks `saved` against a cache of geometry `g` and `n_ctx` positions per sequence;
/// returns its positions and its payload.
pub fn parse(saved: &[u8], g: Geometry, n_ctx: usize) -> Result<(usize, &[u8]), NativeError> {
    let bad = |why: String| Err(NativeError::Kv(format!("saved prefix refused: {why}")));
    if saved.len() < HEADER_BYTES {
        return bad(format!(
            "{} bytes, shorter than its {HEADER_BYTES}-byte header",
            saved.len()
        ));
    }
    if saved[..4] != MAGIC {
        return bad(format!("magic {:02x?}, not {MAGIC:02x?}", &saved[..4]));
    }
    let field = |i: usize| {
        let b = &saved[4 + 4 * i..8 + 4 * i];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
    };
    let (version, n_layer, kv_dim, n_pos) = (field(0), field(1), field(2), field(3));
    if version != VERSION as usize {
        return bad(format!(
            "format version {version}, this build reads {VERSION}"
        ));
    }
    if (n_layer, kv_dim) != (g.n_layer, g.kv_dim) {
        return bad(format!(
            "{n_layer} layers of {kv_dim} values per cell, the cache has {} of {}",
            g.n_layer, g.kv_dim
        ));
    }
    if n_pos > n_ctx {
        return bad(format!(
            "{n_pos} positions, more than the context of {n_ctx}"
        ));
    }
    let payload = &saved[HEADER_BYTES..];
    match g.payload_bytes(n_pos) {
        Some(need) if need == payload.len() => Ok((n_pos, payload)),
        need => bad(format!(
            "{} payload bytes, {} expected for {n_pos} positions",
            payload.len(),
            need.map_or_else(|| "more than fit".to_string(), |n| n.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Geometry = Geometry {
        n_layer: 2,
        kv_dim: 8,
    };

    fn refused(saved: &[u8], n_ctx: usize, says: &str) {
        match parse(saved, G, n_ctx) {
            Err(NativeError::Kv(m)) => assert!(m.contains(says), "{m:?} lacks {says:?}"),
            other => panic!("accepted or wrong error: {other:?}"),
        }
    }

    #[test]
    fn a_buffer_parses_back_to_its_positions_and_payload() {
        let b = buffer(G, 3).unwrap();
        assert_eq!(b.len(), HEADER_BYTES + 2 * 2 * 2 * 8 * 3);
        let (n, payload) = parse(&b, G, 3).unwrap();
        assert_eq!((n, payload.len()), (3, b.len() - HEADER_BYTES));
        assert_eq!(parse(&buffer(G, 0).unwrap(), G, 1).unwrap().0, 0);
    }

    #[test]
    fn malformed_bytes_are_refused_naming_the_fault() {
        let good = buffer(G, 3).unwrap();
        refused(&good[..HEADER_BYTES - 1], 8, "shorter than its");
        refused(&good[..good.len() - 1], 8, "payload bytes");
        let mut longer = good.clone();
        longer.push(0);
        refused(&longer, 8, "payload bytes");
        let mut magic = good.clone();
        magic[0] = b'X';
        refused(&magic, 8, "magic");
        let mut version = good.clone();
        version[4] = 2;
        refused(&version, 8, "format version 2");
        let other = Geometry { n_layer: 3, ..G };
        refused(&buffer(other, 3).unwrap(), 8, "3 layers of 8");
        let other = Geometry { kv_dim: 4, ..G };
        refused(&buffer(other, 3).unwrap(), 8, "2 layers of 4");
        refused(&good, 2, "more than the context of 2");
        // A header claiming more positions than any buffer holds.
        let mut huge = good.clone();
        huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        refused(&huge, usize::MAX, "payload bytes");
    }

    #[test]
    fn the_layout_names_geometry_and_activations_not_the_device() {
        let l = layout(30, 3, 64, Activations::Q8);
        assert!(l.contains("30 layers x 3 kv heads x 64"), "{l}");
        assert!(
            l.contains("f16") && l.contains("q8") && l.contains("v1"),
            "{l}"
        );
        assert_ne!(l, layout(30, 3, 64, Activations::F32));
        assert_ne!(l, layout(30, 3, 32, Activations::Q8));
    }
}
