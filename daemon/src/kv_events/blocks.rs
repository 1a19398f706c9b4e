//! Which complete KV blocks this box's cells hold, as the events a router indexes.
//!
//! Each slot's reusable tokens are cut into blocks of `block_size`; a block's hash chains
//! its parent's hash with its tokens, so the same prefix in two slots is the same blocks.
//! A block is announced when the first slot comes to hold it and withdrawn when the last
//! one lets it go: the router's view is a set per box, not a count.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A block's identity: SHA-256 of its parent's hash and its tokens (little-endian u32).
pub type BlockHash = [u8; 32];

/// One change to the set of blocks the box holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// A chain of blocks, each the child of the one before; the first is the child of
    /// `parent` (`None`: it starts the prompt). `tokens` holds every block's tokens.
    Stored {
        hashes: Vec<BlockHash>,
        parent: Option<BlockHash>,
        tokens: Vec<u32>,
    },
    Removed {
        hashes: Vec<BlockHash>,
    },
    /// Nothing is held any more (the box starts, or its cells were all dropped).
    AllCleared,
}

/// Blocks `from..n` of `tokens` (`block_size` tokens each), chained from `parent`.
fn chain(
    block_size: usize,
    tokens: &[i32],
    from: usize,
    mut parent: Option<BlockHash>,
    n: usize,
) -> Vec<BlockHash> {
    (from..n)
        .map(|b| {
            let mut h = Sha256::new();
            h.update(parent.unwrap_or([0; 32]));
            for t in &tokens[b * block_size..(b + 1) * block_size] {
                h.update((*t as u32).to_le_bytes());
            }
            let hash: BlockHash = h.finalize().into();
            parent = Some(hash);
            hash
        })
        .collect()
}

#[derive(Debug)]
pub struct BlockLedger {
    block_size: usize,
    /// Each slot's chain of block hashes, from the prompt's start.
    chains: Vec<Vec<BlockHash>>,
    /// How many slots hold each block.
    holders: HashMap<BlockHash, usize>,
}

impl BlockLedger {
    pub fn new(slots: usize, block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            chains: vec![Vec::new(); slots],
            holders: HashMap::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The slot now holds `tokens` and nothing else. A chain that is announced at all is
    /// announced whole from the prompt's start, so a router that joined late, or lost
    /// events and started over, learns the whole prefix from the next new prompt.
    pub fn replace(&mut self, slot: usize, tokens: &[i32]) -> Vec<KvEvent> {
        let n = tokens.len() / self.block_size;
        let new = chain(self.block_size, tokens, 0, None, n);
        let kept = self.chains[slot]
            .iter()
            .zip(&new)
            .take_while(|(old, new)| old == new)
            .count();
        let mut events = self.truncate(slot, kept);
        if n > kept && self.hold(slot, &new[kept..]) {
            events.push(self.stored(slot, tokens, 0, None));
        }
        events
    }

    /// The slot's tokens grew to `tokens` (what it held before is a prefix of them): only
    /// the new blocks are announced, as children of the last one held.
    pub fn extend(&mut self, slot: usize, tokens: &[i32]) -> Vec<KvEvent> {
        let n = tokens.len() / self.block_size;
        let have = self.chains[slot].len();
        if n <= have {
            return Vec::new();
        }
        let parent = self.chains[slot].last().copied();
        let added = chain(self.block_size, tokens, have, parent, n);
        if self.hold(slot, &added) {
            vec![self.stored(slot, tokens, have, parent)]
        } else {
            Vec::new()
        }
    }

    /// Appends `added` to the slot's chain; whether any block in it is new to the box.
    fn hold(&mut self, slot: usize, added: &[BlockHash]) -> bool {
        let mut fresh = false;
        for hash in added {
            let n = self.holders.entry(*hash).or_insert(0);
            fresh |= *n == 0;
            *n += 1;
        }
        self.chains[slot].extend_from_slice(added);
        fresh
    }

    /// Lets go of the slot's blocks past `keep`; those no slot holds any more are removed.
    fn truncate(&mut self, slot: usize, keep: usize) -> Vec<KvEvent> {
        let dropped: Vec<BlockHash> = self.chains[slot].drain(keep..).collect();
        let mut gone = Vec::new();
        for hash in dropped {
            if let Some(n) = self.holders.get_mut(&hash) {
                *n -= 1;
                if *n == 0 {
                    self.holders.remove(&hash);
                    gone.push(hash);
                }
            }
        }
        if gone.is_empty() {
            Vec::new()
        } else {
            vec![KvEvent::Removed { hashes: gone }]
        }
    }

    /// The slot's blocks from `from` on, as one event.
    fn stored(
        &self,
        slot: usize,
        tokens: &[i32],
        from: usize,
        parent: Option<BlockHash>,
    ) -> KvEvent {
        let chain = &self.chains[slot];
        KvEvent::Stored {
            hashes: chain[from..].to_vec(),
            parent,
            tokens: tokens[from * self.block_size..chain.len() * self.block_size]
                .iter()
                .map(|t| *t as u32)
                .collect(),
        }
    }

    /// Blocks held by any slot.
    pub fn held(&self) -> usize {
        self.holders.len()
    }
}

/// The blocks of a set of saved prefixes (the prompt cache's RAM tier), announced by
/// difference: whatever the set's blocks were before and are now.
#[derive(Debug)]
pub struct TierLedger {
    block_size: usize,
    held: HashSet<BlockHash>,
    /// Each entry's chain, by the address of its tokens. Holding the `Arc` keeps the address
    /// from being reused by another entry while it is cached; a sync then hashes only the
    /// entries that are new (a large tier is thousands of blocks, on the decode thread).
    chains: HashMap<usize, (Arc<[i32]>, Vec<BlockHash>)>,
}

impl TierLedger {
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            held: HashSet::new(),
            chains: HashMap::new(),
        }
    }

    /// The tier now holds `entries`: blocks no entry holds any more are removed, and each
    /// entry with a block new to the tier is announced whole (storing a block again is a
    /// no-op to the router).
    pub fn sync<'a>(&mut self, entries: impl Iterator<Item = &'a Arc<[i32]>>) -> Vec<KvEvent> {
        let mut chains = HashMap::with_capacity(self.chains.len());
        let mut now = HashSet::new();
        let mut stored = Vec::new();
        for tokens in entries {
            let key = Arc::as_ptr(tokens) as *const i32 as usize;
            let n = tokens.len() / self.block_size;
            let chain = match self.chains.remove(&key) {
                Some((_, chain)) => chain,
                None => chain(self.block_size, tokens, 0, None, n),
            };
            if chain
                .iter()
                .any(|h| !self.held.contains(h) && !now.contains(h))
            {
                stored.push(KvEvent::Stored {
                    hashes: chain.clone(),
                    parent: None,
                    tokens: tokens[..n * self.block_size]
                        .iter()
                        .map(|t| *t as u32)
                        .collect(),
                });
            }
            now.extend(chain.iter().copied());
            chains.insert(key, (tokens.clone(), chain));
        }
        self.chains = chains;
        let mut gone: Vec<BlockHash> = self.held.difference(&now).copied().collect();
        gone.sort_unstable();
        self.held = now;
        let mut events = Vec::new();
        if !gone.is_empty() {
            events.push(KvEvent::Removed { hashes: gone });
        }
        events.extend(stored);
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(e: &KvEvent) -> (usize, Option<BlockHash>, usize) {
        match e {
            KvEvent::Stored {
                hashes,
                parent,
                tokens,
            } => (hashes.len(), *parent, tokens.len()),
            other => panic!("not a store: {other:?}"),
        }
    }

    fn removed(e: &KvEvent) -> usize {
        match e {
            KvEvent::Removed { hashes } => hashes.len(),
            other => panic!("not a removal: {other:?}"),
        }
    }

    #[test]
    fn only_complete_blocks_are_announced_and_growth_names_its_parent() {
        let mut l = BlockLedger::new(2, 4);
        let t: Vec<i32> = (0..11).collect();
        let e = l.replace(0, &t[..3]);
        assert!(e.is_empty(), "no complete block yet: {e:?}");
        let e = l.extend(0, &t[..9]);
        assert_eq!(stored(&e[0]), (2, None, 8));
        let e = l.extend(0, &t[..11]);
        assert!(e.is_empty(), "the third block is not complete: {e:?}");
        let e = l.extend(0, &[&t[..11], &[11][..]].concat());
        let first_two = l.chains[0][1];
        assert_eq!(stored(&e[0]), (1, Some(first_two), 4));
        assert_eq!(l.held(), 3);
    }

    #[test]
    fn a_shared_prefix_is_one_set_of_blocks_removed_when_its_last_holder_goes() {
        let mut l = BlockLedger::new(2, 2);
        let a = [1, 2, 3, 4, 5, 6];
        let b = [1, 2, 3, 4, 9, 9];
        assert_eq!(stored(&l.replace(0, &a)[0]), (3, None, 6));
        // Slot 1 adds one block of its own: announced with the whole chain.
        let e = l.replace(1, &b);
        assert_eq!(e.len(), 1);
        assert_eq!(stored(&e[0]), (3, None, 6));
        assert_eq!(l.held(), 4);
        // Slot 0's prompt in slot 1: [9,9] goes, and no block is new.
        let e = l.replace(1, &a);
        assert_eq!(e.len(), 1);
        assert_eq!(removed(&e[0]), 1);
        assert_eq!(l.held(), 3);
        let e = l.replace(0, &[]);
        assert!(e.is_empty(), "slot 1 still holds them: {e:?}");
        let e = l.replace(1, &[7, 7]);
        assert_eq!(removed(&e[0]), 3);
        assert_eq!(stored(&e[1]), (1, None, 2));
        assert_eq!(l.held(), 1);
    }

    #[test]
    fn hashes_depend_on_the_position_not_only_the_tokens() {
        let mut l = BlockLedger::new(2, 2);
        l.replace(0, &[5, 5, 5, 5]);
        let c = &l.chains[0];
        assert_ne!(c[0], c[1], "the same tokens after a different parent");
        l.replace(1, &[5, 5]);
        assert_eq!(
            l.chains[1][0], l.chains[0][0],
            "the same tokens at the start"
        );
    }

    #[test]
    fn a_tier_announces_new_entries_whole_and_removes_what_no_entry_holds() {
        let mut t = TierLedger::new(2);
        let a: Arc<[i32]> = Arc::from(&[1, 2, 3, 4, 5][..]);
        let b: Arc<[i32]> = Arc::from(&[1, 2, 7, 7][..]);
        let (a, b) = (&a, &b);
        let e = t.sync([a].into_iter());
        assert_eq!(e.len(), 1);
        assert_eq!(stored(&e[0]), (2, None, 4));
        // b shares its first block with a: announced whole, its own block is new.
        let e = t.sync([a, b].into_iter());
        assert_eq!(e.len(), 1);
        assert_eq!(stored(&e[0]), (2, None, 4));
        assert!(t.sync([a, b].into_iter()).is_empty(), "nothing changed");
        // a evicted: its second block goes; the shared first one stays with b.
        let e = t.sync([b].into_iter());
        assert_eq!(e.len(), 1);
        assert_eq!(removed(&e[0]), 1);
        assert_eq!(t.chains.len(), 1, "an evicted entry's chain is not kept");
        let e = t.sync(std::iter::empty());
        assert_eq!(removed(&e[0]), 2);
        assert!(t.chains.is_empty());
    }

    #[test]
    fn a_replacement_keeps_the_common_blocks_and_drops_the_rest() {
        let mut l = BlockLedger::new(1, 2);
        l.replace(0, &[1, 2, 3, 4, 5, 6]);
        let e = l.replace(0, &[1, 2, 3, 4, 8, 8, 9, 9]);
        assert_eq!(removed(&e[0]), 1);
        assert_eq!(stored(&e[1]), (4, None, 8));
        assert_eq!(l.held(), 4);
    }
}
