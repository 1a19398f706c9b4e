//! The RAM tier: saved prefixes in host memory, bounded in bytes (the ledger's
//! `prompt_cache` term), least recently used evicted first.

use std::sync::Arc;

use crate::engine::schedule::prefix::common_prefix;

/// Bytes an entry is charged beyond its payload: its tokens and bookkeeping.
pub fn charge(tokens: usize, payload: usize) -> u64 {
    (payload + 4 * tokens + 64) as u64
}

/// The share of an entry's tokens (as a fraction num/den) another must share with it,
/// from the start, for the two to be siblings (see [`RamTier::insert`]).
const SIBLING_SHARE: (usize, usize) = (3, 4);

fn siblings(shared: usize, len: usize) -> bool {
    shared * SIBLING_SHARE.1 >= len * SIBLING_SHARE.0
}

#[derive(Debug)]
struct Entry {
    tokens: Arc<[i32]>,
    payload: Arc<Vec<u8>>,
    used: u64,
}

#[derive(Debug)]
pub struct RamTier {
    entries: Vec<Entry>,
    bytes: u64,
    budget: u64,
    tick: u64,
}

/// What an insert did, for the metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Inserted {
    pub stored: bool,
    /// Entries evicted to make room (not those the new one subsumes or replaces as their
    /// sibling).
    pub evicted: u64,
}

impl RamTier {
    pub fn new(budget: u64) -> Self {
        Self {
            entries: Vec::new(),
            bytes: 0,
            budget,
            tick: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry sharing the longest prefix with `prompt`: (index, shared tokens, its
    /// tokens, payload bytes).
    pub fn longest(&self, prompt: &[i32]) -> Option<(usize, usize, usize, u64)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let n = common_prefix(&e.tokens, prompt);
                (i, n, e.tokens.len(), e.payload.len() as u64)
            })
            .filter(|&(_, n, _, _)| n > 0)
            .max_by_key(|&(i, n, _, _)| (n, std::cmp::Reverse(i)))
    }

    /// An entry holding every one of `tokens` (and maybe more) exists.
    pub fn covers(&self, tokens: &[i32]) -> bool {
        self.entries
            .iter()
            .any(|e| common_prefix(&e.tokens, tokens) == tokens.len())
    }

    /// Every entry's tokens and payload.
    pub fn entries(&self) -> impl Iterator<Item = (&Arc<[i32]>, &Arc<Vec<u8>>)> {
        self.entries.iter().map(|e| (&e.tokens, &e.payload))
    }

    /// Takes entry `i` for a restore: its tokens and payload, marked as just used.
    pub fn take(&mut self, i: usize) -> Option<super::Saved> {
        self.tick += 1;
        let e = self.entries.get_mut(i)?;
        e.used = self.tick;
        Some((e.tokens.clone(), e.payload.clone()))
    }

    /// Stores a prefix, replacing entries it subsumes (their tokens are a prefix of its
    /// own) or that are its siblings, and evicting the least recently used until it fits.
    /// One larger than the whole budget is not stored.
    ///
    /// Siblings share at least [`SIBLING_SHARE`] of both their tokens: one application's
    /// system prompt followed by two short questions. Keeping both would hold the shared
    /// prompt's KV twice, so the newer (the likelier to continue) replaces the older, and
    /// the tier holds more distinct prompts; a reuse of the older then recomputes only its
    /// short tail. Entries whose own tails are long (two chats on one system prompt) are
    /// not siblings and are both kept.
    pub fn insert(&mut self, tokens: Arc<[i32]>, payload: Arc<Vec<u8>>) -> Inserted {
        let cost = charge(tokens.len(), payload.len());
        if cost > self.budget {
            return Inserted::default();
        }
        self.entries.retain(|e| {
            let shared = common_prefix(&e.tokens, &tokens);
            let replaced = shared == e.tokens.len()
                || (siblings(shared, e.tokens.len()) && siblings(shared, tokens.len()));
            if replaced {
                self.bytes -= charge(e.tokens.len(), e.payload.len());
            }
            !replaced
        });
        let mut evicted = 0;
        while self.bytes + cost > self.budget {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) else {
                break;
            };
            let e = self.entries.swap_remove(oldest);
            self.bytes -= charge(e.tokens.len(), e.payload.len());
            evicted += 1;
        }
        self.tick += 1;
        self.bytes += cost;
        self.entries.push(Entry {
            tokens,
            payload,
            used: self.tick,
        });
        Inserted {
            stored: true,
            evicted,
        }
    }

    /// Drops entry `i` (its restore failed: it must not be tried again).
    pub fn remove(&mut self, i: usize) {
        if i < self.entries.len() {
            let e = self.entries.swap_remove(i);
            self.bytes -= charge(e.tokens.len(), e.payload.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tokens: &[i32], bytes: usize) -> (Arc<[i32]>, Arc<Vec<u8>>) {
        (tokens.into(), Arc::new(vec![0; bytes]))
    }

    #[test]
    fn the_longest_shared_prefix_is_found_and_a_longer_prefix_subsumes_a_shorter() {
        let mut ram = RamTier::new(10_000);
        let (t, p) = entry(&[1, 2, 3], 100);
        ram.insert(t, p);
        let (t, p) = entry(&[7, 8], 100);
        ram.insert(t, p);
        assert_eq!(ram.longest(&[1, 2, 9]), Some((0, 2, 3, 100)));
        assert!(ram.covers(&[1, 2]) && !ram.covers(&[1, 2, 3, 4]));
        let (t, p) = entry(&[1, 2, 3, 4], 200);
        ram.insert(t, p);
        assert_eq!(ram.len(), 2, "[1, 2, 3] is inside [1, 2, 3, 4]");
        assert_eq!(ram.bytes(), charge(2, 100) + charge(4, 200));
        assert_eq!(ram.longest(&[1, 2, 3, 4, 5]).map(|h| h.1), Some(4));
    }

    #[test]
    fn a_sibling_replaces_the_entry_it_mostly_duplicates_and_long_tails_are_kept() {
        let mut ram = RamTier::new(1_000_000);
        let system: Vec<i32> = (100..190).collect();
        let with = |tail: &[i32]| -> Vec<i32> { system.iter().chain(tail).copied().collect() };
        let (t, p) = entry(&with(&[1; 10]), 1000);
        ram.insert(t, p);
        // The same 90-token prompt, another 10-token question: 90 of 100 shared.
        let (t, p) = entry(&with(&[3; 10]), 1000);
        assert_eq!(
            ram.insert(t, p),
            Inserted {
                stored: true,
                evicted: 0
            }
        );
        assert_eq!(ram.len(), 1, "the older sibling was replaced");
        assert!(ram.covers(&with(&[3; 10])) && !ram.covers(&with(&[1; 10])));
        assert_eq!(ram.bytes(), charge(100, 1000));
        // A chat on the same prompt with a 60-token history: 90 of 150 shared, kept beside.
        let (t, p) = entry(&with(&[4; 60]), 1000);
        ram.insert(t, p);
        assert_eq!(ram.len(), 2);
        // A second such chat: its tail is long too, so both chats stay.
        let (t, p) = entry(&with(&[5; 60]), 1000);
        ram.insert(t, p);
        assert_eq!(ram.len(), 3);
        assert_eq!(ram.longest(&with(&[4; 61])).map(|h| h.1), Some(150));
    }

    #[test]
    fn the_budget_holds_and_the_least_recently_used_goes_first() {
        let budget = 3 * charge(1, 1000);
        let mut ram = RamTier::new(budget);
        for t in 0..3 {
            let (tk, p) = entry(&[t], 1000);
            assert!(ram.insert(tk, p).stored);
        }
        // Entry [0] was used last, so [1] is the oldest now.
        let (i, _, _, _) = ram.longest(&[0]).unwrap();
        ram.take(i);
        let (tk, p) = entry(&[9], 1000);
        assert_eq!(
            ram.insert(tk, p),
            Inserted {
                stored: true,
                evicted: 1
            }
        );
        assert!(ram.bytes() <= budget);
        assert!(ram.covers(&[0]) && !ram.covers(&[1]) && ram.covers(&[2]));
        let (tk, p) = entry(&[5], 10_000);
        assert!(!ram.insert(tk, p).stored, "larger than the whole budget");
        assert!(!RamTier::new(0).enabled());
    }
}
