//! The scheduler's prompt reuse: which prefix an admitted request takes and from where,
//! requests waiting for a prefix another is computing, and eviction from a shared pool.

use super::prefix::{common_prefix, Hit, MIN_COPY, TILE_ROWS};
use super::scheduler::Scheduler;
use super::sequence::{Phase, Sequence};
use crate::engine::backend::seam::Backend;

impl<B: Backend> Scheduler<'_, B> {
    /// Gives a just-admitted sequence its reusable prefix: now, from the slots' resident
    /// cells, or in a step or two, from a request already prefilling the same prompt.
    pub(super) fn place_prompt(&mut self, slot: usize, seq: &mut Sequence) {
        if !self.prefix.enabled() {
            // The slot's cells were freed when its last request ended.
            return;
        }
        self.metrics
            .prefix_lookup_tokens_total
            .inc_by(seq.prompt.len() as u64);
        seq.awaiting = self.prefix_in_flight(slot, &seq.prompt);
        let cached = match seq.awaiting {
            Some(_) => self.reuse_prefix(slot, &[]),
            None => self.reuse_prefix(slot, &seq.prompt),
        };
        seq.reuse(cached);
    }

    /// An embedding pass feeds its whole prompt (every position's hidden state is pooled):
    /// it reuses nothing, and what its slot held is dropped.
    pub(super) fn place_embedding(&mut self, slot: usize) {
        if self.prefix.enabled() {
            self.reuse_prefix(slot, &[]);
        }
    }

    /// Puts the longest resident prefix of `prompt` into `slot`'s KV cells (kept in place,
    /// or shared from another slot) and drops the rest of what the slot held. Returns the
    /// number of prompt tokens that need no prefill.
    fn reuse_prefix(&mut self, slot: usize, prompt: &[i32]) -> usize {
        let chunk = self.plan.prefill_chunk as usize;
        let hit = self
            .prefix
            .longest(prompt)
            .map(|h| Hit {
                len: self.prefix.cut(h.len, prompt.len(), chunk),
                ..h
            })
            .filter(|h| h.len > 0 && (h.slot == slot || h.len >= self.min_copy()));
        let len = match hit {
            Some(h) if h.slot != slot => {
                match self.backend.share_prefix(h.slot, slot, h.len as u32) {
                    Ok(()) => h.len,
                    Err(e) => {
                        tracing::warn!(from = h.slot, to = slot, error = %e, "prefix not shared; prefilling it");
                        self.backend.truncate(slot, 0);
                        0
                    }
                }
            }
            own => {
                let len = own.map_or(0, |h| h.len);
                self.backend.truncate(slot, len as u32);
                len
            }
        };
        self.prefix.set(slot, &prompt[..len]);
        self.metrics.prefix_hit_tokens_total.inc_by(len as u64);
        len
    }

    /// The fewest shared tokens worth taking from another slot: any in one shared pool,
    /// where the cells only gain an owner; [`MIN_COPY`] when rows are copied between
    /// streams.
    fn min_copy(&self) -> usize {
        if self.plan.shared_kv {
            1
        } else {
            MIN_COPY
        }
    }

    /// A request still prefilling the start of `prompt`, when it will hold clearly more of
    /// it than any slot does now: (its slot, the tokens to reuse once they are in). Requests
    /// that arrive together with one system prompt then compute it once, not once each.
    fn prefix_in_flight(&self, slot: usize, prompt: &[i32]) -> Option<(usize, usize)> {
        let (n, chunk) = (prompt.len(), self.plan.prefill_chunk as usize);
        let resident = self
            .prefix
            .longest(prompt)
            .map_or(0, |h| self.prefix.cut(h.len, n, chunk));
        let (src, len) = self
            .seqs
            .iter()
            .enumerate()
            .filter_map(|(s, q)| q.as_ref().map(|q| (s, q)))
            .filter(|&(s, q)| {
                s != slot
                    && matches!(q.phase, Phase::Prefill { .. })
                    && q.awaiting.is_none()
                    && q.embed.is_none()
            })
            .map(|(s, q)| {
                (
                    s,
                    self.prefix.cut(common_prefix(&q.prompt, prompt), n, chunk),
                )
            })
            .max_by_key(|&(s, len)| (len, std::cmp::Reverse(s)))?;
        (len >= resident + TILE_ROWS).then_some((src, len))
    }

    /// Sequences waiting for another's prefill take what it computed once it is in, or once
    /// that request stopped prefilling (finished, failed or decoding).
    pub(super) fn resolve_awaiting(&mut self) {
        for slot in 0..self.seqs.len() {
            let Some((src, len)) = self.seqs[slot].as_ref().and_then(|q| q.awaiting) else {
                continue;
            };
            let src_prefilling = self.seqs[src]
                .as_ref()
                .is_some_and(|q| matches!(q.phase, Phase::Prefill { .. }));
            // Out of its slot while its prefix goes in: `reuse_prefix` needs `self`.
            let Some(mut seq) = self.seqs[slot].take() else {
                continue;
            };
            if !src_prefilling || self.prefix.reusable(src, &seq.prompt) >= len {
                let cached = self.reuse_prefix(slot, &seq.prompt);
                seq.awaiting = None;
                seq.reuse(cached);
            }
            self.seqs[slot] = Some(seq);
        }
    }

    /// With one shared KV pool, cells retained by idle slots must leave room for what the
    /// running requests reserved: evict least recently used prefixes until they do, so a
    /// retained prefix never makes a request wait or a step run out of cells.
    pub(super) fn evict_for_pool(&mut self) {
        if !self.plan.shared_kv {
            // A KV stream per slot: a prefix lives in its slot's own cells and is
            // overwritten when the slot is reused.
            return;
        }
        let capacity = u64::from(self.plan.kv_cells);
        loop {
            let seqs = &self.seqs;
            let idle = |s: usize| seqs[s].is_none();
            if self.state.kv_reserved() + self.prefix.retained(idle) <= capacity {
                return;
            }
            let Some(victim) = self.prefix.least_recent(idle) else {
                return;
            };
            self.backend.truncate(victim, 0);
            self.prefix.clear(victim);
            tracing::debug!(slot = victim, "retained prefix evicted");
        }
    }
}
