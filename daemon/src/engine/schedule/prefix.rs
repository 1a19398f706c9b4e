//! Prompt reuse: which tokens each slot's KV cells hold, and where a new prompt's longest
//! resident prefix is.
//!
//! A slot's cells keep what its last sequence fed after that sequence ends, until the slot
//! is reused or evicted. At admission the scheduler places a prompt in the free slot that
//! holds its longest prefix, takes a longer one from any other slot (running or not) when
//! there is one, and prefills only the rest. The index mirrors the backend exactly: tokens
//! enter it only once a step that fed them succeeded.
//!
//! In the default mode (`--prefix-cache on`) every resident row is reusable at any point,
//! decoded tokens included, as llama-server reuses them: a shared system prompt or a resent
//! chat history costs only what is new, and temperature-0 output may differ from reuse off.
//!
//! In exact mode (`--prefix-cache exact`) reuse must not change a single output token, and
//! llama.cpp's CPU attention computes a row differently by how it was batched: prompt chunks of 64 rows or more take a tiled
//! kernel, shorter chunks and decoded tokens a per-row one, and the two round differently.
//! So a reused row must have been computed the way the same prompt without reuse would
//! compute it: only prompt rows of tiled chunks are reusable (decoded tokens never are),
//! prompt chunks end at fixed multiples of the prefill chunk, and a reuse point is chosen
//! so that the rows after it fall into chunks of the same kind as without reuse
//! ([`exact_cut`]).

use crate::config::PrefixCache;
use crate::kv_events::KvEvents;

/// Fewer shared tokens than this are recomputed rather than copied from another slot's KV
/// stream (a copy costs about what prefilling a few dozen tokens does), and a free slot
/// holding fewer is not kept for the prompt. In one shared pool a copy is free.
pub const MIN_COPY: usize = 32;

/// Prompt rows at or above this per chunk take llama.cpp's tiled attention kernel
/// (`GGML_FA_TILE_Q`).
pub const TILE_ROWS: usize = 64;

/// The last rows of a prompt are fed as a run of their own, after its tiled runs: a
/// request reusing another's prompt up to its own last few tokens then computes those
/// exactly as it would without reuse, instead of a whole tile.
pub const TAIL_ROWS: usize = 16;

#[derive(Debug)]
pub struct PrefixIndex {
    enabled: bool,
    /// `on` mode: every resident row is reusable, wherever a prompt diverges.
    every_row: bool,
    /// The tokens at positions `0..len` of each slot's KV cells.
    resident: Vec<Vec<i32>>,
    /// How many leading resident rows were computed as tiled prompt rows: the reusable ones.
    reusable_rows: Vec<usize>,
    /// When each slot was last taken or released, for least-recently-used choices.
    used: Vec<u64>,
    tick: u64,
    /// With `--kv-events`: every change to the reusable rows, told to a router.
    events: Option<KvEvents>,
}

/// Where a prompt's reusable prefix lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub slot: usize,
    pub len: usize,
}

impl PrefixIndex {
    pub fn new(slots: usize, mode: PrefixCache) -> Self {
        Self {
            enabled: mode.enabled(),
            every_row: mode.enabled() && !mode.exact(),
            resident: vec![Vec::new(); slots],
            reusable_rows: vec![0; slots],
            used: vec![0; slots],
            tick: 0,
            events: None,
        }
    }

    /// From now on every change to the slots' reusable rows is published; what they hold
    /// already is published at once.
    pub fn publish(&mut self, mut events: KvEvents) {
        for slot in 0..self.resident.len() {
            events.replace(slot, &self.resident[slot][..self.reusable_rows[slot]]);
        }
        self.events = Some(events);
    }

    fn replaced(&mut self, slot: usize) {
        if let Some(events) = &mut self.events {
            events.replace(slot, &self.resident[slot][..self.reusable_rows[slot]]);
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The longest prefix of `prompt` resident in any slot, leaving at least its last token
    /// to be fed (its logits give the first generated token).
    pub fn longest(&self, prompt: &[i32]) -> Option<Hit> {
        if !self.enabled {
            return None;
        }
        let most = prompt.len().saturating_sub(1);
        self.resident
            .iter()
            .enumerate()
            .map(|(slot, held)| Hit {
                slot,
                len: common_prefix(held, prompt)
                    .min(self.reusable_rows[slot])
                    .min(most),
            })
            .filter(|h| h.len > 0)
            // Longest first; among equals the lowest slot, so choices are reproducible.
            .max_by(|a, b| a.len.cmp(&b.len).then(b.slot.cmp(&a.slot)))
    }

    /// Which of the `free` slots (never empty) a prompt should take: the one holding its
    /// longest prefix when that is worth keeping ([`MIN_COPY`] tokens or more), else an
    /// empty one, else the least recently used. A prompt that merely starts like a kept
    /// one (the same template tokens) does not overwrite it.
    pub fn choose(&self, prompt: &[i32], free: &[usize]) -> usize {
        if !self.enabled {
            return free[0];
        }
        let best = free
            .iter()
            .map(|&slot| {
                let len = common_prefix(&self.resident[slot], prompt).min(self.reusable_rows[slot]);
                (len, slot)
            })
            .filter(|&(len, _)| len >= MIN_COPY)
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        if let Some((_, slot)) = best {
            return slot;
        }
        free.iter()
            .copied()
            .min_by_key(|&slot| (!self.resident[slot].is_empty(), self.used[slot]))
            .unwrap_or(free[0])
    }

    /// The slot now holds `tokens` (reused, so reusable) at positions `0..tokens.len()`
    /// and nothing after.
    pub fn set(&mut self, slot: usize, tokens: &[i32]) {
        if !self.enabled {
            return;
        }
        self.resident[slot].clear();
        self.resident[slot].extend_from_slice(tokens);
        self.reusable_rows[slot] = tokens.len();
        self.touch(slot);
        self.replaced(slot);
    }

    /// A successful step fed `tokens` to the slot, right after what it held: a prompt chunk
    /// when `prompt`, else a decoded token.
    pub fn fed(&mut self, slot: usize, tokens: &[i32], prompt: bool) {
        if !self.enabled {
            return;
        }
        let contiguous = self.reusable_rows[slot] == self.resident[slot].len();
        self.resident[slot].extend_from_slice(tokens);
        if self.every_row || (contiguous && prompt && tokens.len() >= TILE_ROWS) {
            self.reusable_rows[slot] = self.resident[slot].len();
            if let Some(events) = &mut self.events {
                events.extend(slot, &self.resident[slot]);
            }
        }
    }

    /// How much of `prompt` the slot holds in reusable rows now.
    pub fn reusable(&self, slot: usize, prompt: &[i32]) -> usize {
        common_prefix(&self.resident[slot], prompt).min(self.reusable_rows[slot])
    }

    /// The reusable rows' tokens the slot holds: what a save keeps.
    pub fn reusable_tokens(&self, slot: usize) -> &[i32] {
        &self.resident[slot][..self.reusable_rows[slot]]
    }

    /// The slot's cells were dropped.
    pub fn clear(&mut self, slot: usize) {
        self.resident[slot].clear();
        self.reusable_rows[slot] = 0;
        self.replaced(slot);
    }

    /// Prompts are fed in runs that end at multiples of the chunk and at [`tail_start`]:
    /// in exact mode, so that reused rows are computed as without reuse, and with reuse
    /// off, so that exact mode's output is the same as off's. `on` feeds full chunks.
    pub fn aligned_runs(&self) -> bool {
        !self.every_row
    }

    /// Where a prompt of `n` tokens may take over `len` resident rows: anywhere short of
    /// its last token, or [`exact_cut`] in exact mode.
    pub fn cut(&self, len: usize, n: usize, chunk: usize) -> usize {
        if self.every_row {
            len.min(n.saturating_sub(1))
        } else {
            exact_cut(len, n, chunk)
        }
    }

    pub fn touch(&mut self, slot: usize) {
        self.tick += 1;
        self.used[slot] = self.tick;
    }

    /// Cells held by slots for which `idle` is true: retained prefixes, not running work.
    pub fn retained(&self, idle: impl Fn(usize) -> bool) -> u64 {
        (0..self.resident.len())
            .filter(|&s| idle(s))
            .map(|s| self.resident[s].len() as u64)
            .sum()
    }

    /// The idle slot holding cells that was used least recently: the next to evict.
    pub fn least_recent(&self, idle: impl Fn(usize) -> bool) -> Option<usize> {
        (0..self.resident.len())
            .filter(|&s| idle(s) && !self.resident[s].is_empty())
            .min_by_key(|&s| self.used[s])
    }
}

/// Where the last [`TAIL_ROWS`] of a prompt of `n` tokens start, when they are fed as a run
/// of their own (so that a reused prefix ending there leaves the same run to compute).
pub fn tail_start(n: usize) -> Option<usize> {
    (n >= TILE_ROWS + TAIL_ROWS).then(|| n - TAIL_ROWS)
}

/// The longest reuse point `<= len` for a prompt of `n` tokens after which every row is
/// computed by the same kind of attention run (tiled or not) as without reuse. Without
/// reuse a prompt is fed in runs that end at multiples of `chunk` and at
/// [`tail_start`]; a run of [`TILE_ROWS`] or more is tiled.
pub fn exact_cut(len: usize, n: usize, chunk: usize) -> usize {
    let cut = len.min(n.saturating_sub(1));
    let tail = tail_start(n);
    // The run [start, end) holding `cut` when fed without reuse.
    let start = (cut / chunk * chunk).max(tail.filter(|&t| t <= cut).unwrap_or(0));
    let end = ((cut / chunk + 1) * chunk)
        .min(n)
        .min(tail.filter(|&t| t > cut).unwrap_or(n));
    // A short run before the tail is computed row by row; reused rows are tiled ones.
    if let Some(t) = tail {
        let base = t / chunk * chunk;
        if t > base && t - base < TILE_ROWS && cut > base {
            return base;
        }
    }
    if cut == start {
        cut
    } else if end - start >= TILE_ROWS {
        cut.min(end - TILE_ROWS)
    } else {
        start
    }
}

/// How many leading tokens two sequences share.
pub fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_resident_prefix_wins_and_the_last_token_is_always_fed() {
        let mut p = PrefixIndex::new(3, PrefixCache::Exact);
        p.set(0, &[1, 2, 3]);
        p.set(1, &[1, 2, 3, 4, 5]);
        p.set(2, &[9]);
        p.fed(1, &[7], false);
        assert_eq!(p.longest(&[1, 2, 3, 4, 6]), Some(Hit { slot: 1, len: 4 }));
        assert_eq!(
            p.longest(&[1, 2, 3, 4, 5]),
            Some(Hit { slot: 1, len: 4 }),
            "an identical prompt still feeds its last token"
        );
        assert_eq!(p.longest(&[7, 7]), None);
    }

    #[test]
    fn a_prompt_goes_to_the_free_slot_holding_its_prefix_else_an_empty_one_else_the_oldest() {
        let mut p = PrefixIndex::new(4, PrefixCache::Exact);
        let long = |t: i32| vec![t; MIN_COPY];
        p.set(0, &[1, 2]);
        p.set(1, &long(5));
        p.set(2, &[8]);
        assert_eq!(p.choose(&[long(5), vec![7]].concat(), &[0, 1, 2, 3]), 1);
        assert_eq!(p.choose(&[4], &[0, 1, 2, 3]), 3, "the empty slot");
        assert_eq!(
            p.choose(&[1, 2, 3], &[0, 1, 2, 3]),
            3,
            "a few shared tokens do not cost a kept prompt its place"
        );
        assert_eq!(p.choose(&[4], &[0, 1, 2]), 0, "the least recently used");
        p.touch(0);
        assert_eq!(p.choose(&[4], &[0, 1, 2]), 1);
    }

    #[test]
    fn fed_tokens_extend_what_a_slot_holds_and_idle_slots_count_as_retained() {
        let mut p = PrefixIndex::new(2, PrefixCache::Exact);
        p.set(0, &[1]);
        p.fed(0, &[2; TILE_ROWS], true);
        p.fed(0, &[3; TILE_ROWS - 1], true);
        p.fed(0, &[4], false);
        p.set(1, &[4, 5]);
        let mut prompt = vec![1];
        prompt.extend([2; TILE_ROWS]);
        prompt.extend([3; TILE_ROWS - 1]);
        prompt.extend([4, 4]);
        assert_eq!(
            p.longest(&prompt),
            Some(Hit {
                slot: 0,
                len: 1 + TILE_ROWS
            }),
            "a short chunk and a decoded token are not reusable"
        );
        assert_eq!(p.retained(|s| s == 1), 2);
        assert_eq!(p.retained(|s| s == 0), 2 * TILE_ROWS as u64 + 1);
        assert_eq!(p.least_recent(|_| true), Some(0));
        p.clear(0);
        assert_eq!(p.least_recent(|_| true), Some(1));
    }

    #[test]
    fn on_mode_reuses_short_chunks_and_decoded_tokens_and_cuts_anywhere() {
        let mut p = PrefixIndex::new(1, PrefixCache::On);
        p.set(0, &[1]);
        p.fed(0, &[2; 5], true);
        p.fed(0, &[3], false);
        p.fed(0, &[4], false);
        // A resent chat: the history with the decoded answer, then a new turn.
        let prompt = [1, 2, 2, 2, 2, 2, 3, 4, 9, 9];
        assert_eq!(p.longest(&prompt), Some(Hit { slot: 0, len: 8 }));
        assert_eq!(p.cut(8, prompt.len(), 512), 8, "no tile rule");
        assert_eq!(p.cut(10, 10, 512), 9, "the last token is still fed");
        assert_eq!(
            p.cut(590, 600, 512),
            590,
            "a long shared prompt is reused to where it diverges, not to a chunk boundary"
        );
        assert!(!p.aligned_runs());
        let exact = PrefixIndex::new(1, PrefixCache::Exact);
        assert!(exact.aligned_runs());
        assert!(PrefixIndex::new(1, PrefixCache::Off).aligned_runs());
        assert_eq!(
            exact.cut(8, prompt.len(), 512),
            0,
            "one short run without reuse"
        );
        assert_eq!(
            exact.cut(590, 600, 512),
            584,
            "exact: where its last 16 start"
        );
    }

    #[test]
    fn disabled_it_finds_nothing_and_takes_the_first_free_slot() {
        let mut p = PrefixIndex::new(2, PrefixCache::Off);
        p.set(1, &[1, 2, 3]);
        assert_eq!(p.longest(&[1, 2, 3, 4]), None);
        assert_eq!(p.choose(&[1, 2, 3, 4], &[0, 1]), 0);
        assert_eq!(p.retained(|_| true), 0);
    }

    #[test]
    fn a_reuse_point_leaves_the_rows_after_it_in_runs_of_the_same_kind() {
        // 380 tokens: a tiled run [0, 364) and the tail [364, 380).
        assert_eq!(exact_cut(375, 380, 512), 364);
        assert_eq!(exact_cut(364, 380, 512), 364);
        assert_eq!(exact_cut(300, 380, 512), 300);
        assert_eq!(exact_cut(320, 380, 512), 364 - TILE_ROWS);
        // 530 tokens: [0, 512) tiled, [512, 514) row by row, tail [514, 530).
        assert_eq!(exact_cut(525, 530, 512), 512);
        // 700 tokens: [0, 512), [512, 684) tiled, tail [684, 700).
        assert_eq!(exact_cut(500, 700, 512), 512 - TILE_ROWS);
        assert_eq!(exact_cut(600, 700, 512), 600);
        assert_eq!(exact_cut(699, 700, 512), 684);
        assert_eq!(exact_cut(10, 20, 512), 0, "a short prompt is one short run");
        assert_eq!(tail_start(79), None);
        assert_eq!(tail_start(80), Some(64));
    }
}
