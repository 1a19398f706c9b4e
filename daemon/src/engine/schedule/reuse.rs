//! The scheduler's prompt reuse: which prefix an admitted request takes and from where (a
//! slot's resident cells, another slot's, or the prompt cache's RAM and disk tiers),
//! requests waiting for a prefix another is computing, saving prefixes that leave the
//! cells, and eviction from a shared pool.

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
        seq.awaiting = self.prefix_in_flight(slot, &seq.prompt, seq.sibling);
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

    /// Puts the longest reusable prefix of `prompt` into `slot`'s KV cells (kept in place,
    /// shared from another slot, or restored from the prompt cache's tiers) and drops the
    /// rest of what the slot held, saving it first when a tier wants it. Returns the number
    /// of prompt tokens that need no prefill.
    fn reuse_prefix(&mut self, slot: usize, prompt: &[i32]) -> usize {
        let resident = self.resident_hit(slot, prompt).map_or(0, |h| h.len);
        if let Some(len) = self.restore_saved(slot, prompt, resident) {
            self.prefix.set(slot, &prompt[..len]);
            self.metrics.prefix_hit_tokens_total.inc_by(len as u64);
            return len;
        }
        // Again: a failed restore leaves the slot empty.
        let hit = self.resident_hit(slot, prompt);
        let len = match hit {
            Some(h) if h.slot != slot => {
                self.save_leaving(slot, 0);
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
                self.save_leaving(slot, len);
                self.backend.truncate(slot, len as u32);
                len
            }
        };
        self.prefix.set(slot, &prompt[..len]);
        self.metrics.prefix_hit_tokens_total.inc_by(len as u64);
        len
    }

    /// The resident prefix `slot` may take: in place, or from another slot when it is long
    /// enough to be worth a copy.
    fn resident_hit(&self, slot: usize, prompt: &[i32]) -> Option<Hit> {
        let chunk = self.plan.prefill_chunk as usize;
        self.prefix
            .longest(prompt)
            .map(|h| Hit {
                len: self.prefix.cut(h.len, prompt.len(), chunk),
                ..h
            })
            .filter(|h| h.len > 0 && (h.slot == slot || h.len >= self.min_copy()))
    }

    /// Restores a saved prefix of `prompt` into `slot` when it holds more than the `resident`
    /// tokens the slots offer and restoring it beats prefilling the difference. Returns the
    /// tokens now reusable, or `None` (nothing restored, the slot as it was or empty).
    fn restore_saved(&mut self, slot: usize, prompt: &[i32], resident: usize) -> Option<usize> {
        if !self.store.enabled() || prompt.is_empty() {
            return None;
        }
        let chunk = self.plan.prefill_chunk as usize;
        let c = self.store.longest(prompt)?;
        let len = self.prefix.cut(c.shared, prompt.len(), chunk);
        let gained = len.checked_sub(resident).filter(|&g| g > 0)?;
        if !self.store.costs.worth(c.tier, c.bytes, gained) || !self.pool_holds(slot, c.tokens) {
            return None;
        }
        self.save_leaving(slot, 0);
        // Saving what the slot leaves changes the RAM tier (the new entry drops those it
        // covers and evicts the least recently used, which moves entries): the candidate is
        // looked up again. Taking it by its old place restored another prompt's cells
        // under this prompt's length (found by the soak: llama.cpp then refused the next
        // step's positions, and a longer wrong entry would have answered from the wrong
        // context).
        let c = self.store.longest(prompt)?;
        let len = self.prefix.cut(c.shared, prompt.len(), chunk);
        if len <= resident {
            return None;
        }
        let started = self.clock.now();
        let (tokens, payload) = self.store.fetch(&c)?;
        let shares = common_prefix(&tokens, prompt) >= len;
        match self.backend.restore_prefix(slot, &payload) {
            Ok(held) if shares && held as usize == tokens.len() => {
                self.backend.truncate(slot, len as u32);
                let took = self.clock.now().saturating_duration_since(started);
                self.store.restored(&c, len, took);
                tracing::debug!(
                    slot,
                    tier = c.tier.label(),
                    len,
                    resident,
                    bytes = c.bytes,
                    us = took.as_micros() as u64,
                    "prefix restored"
                );
                Some(len)
            }
            outcome => {
                tracing::warn!(
                    slot,
                    tier = c.tier.label(),
                    ?outcome,
                    "saved prefix not restored; dropped"
                );
                self.backend.truncate(slot, 0);
                self.prefix.clear(slot);
                self.store.forget(&c);
                None
            }
        }
    }

    /// Whether `tokens` restored into `slot` fit: always with a stream per slot; in one
    /// shared pool, only in cells neither running requests nor other retained prefixes
    /// hold (a restore places the whole entry before cutting it back).
    fn pool_holds(&self, slot: usize, tokens: usize) -> bool {
        if !self.plan.shared_kv {
            return true;
        }
        let seqs = &self.seqs;
        let retained = self.prefix.retained(|s| s != slot && seqs[s].is_none());
        let used = self.state.kv_reserved() + retained;
        used + tokens as u64 <= u64::from(self.plan.kv_cells)
    }

    /// Before `slot` drops what it holds past `keep` rows: saves its reusable rows into the
    /// prompt cache's tiers when they are long enough and no tier has them yet.
    pub(super) fn save_leaving(&mut self, slot: usize, keep: usize) {
        let rows = self.prefix.reusable_tokens(slot);
        if rows.len() <= keep || !self.store.wants(rows) {
            return;
        }
        let tokens = rows.to_vec();
        let saved = self.backend.save_prefix(slot, tokens.len() as u32);
        // Either way the slot now holds exactly these rows.
        self.prefix.set(slot, &tokens);
        match saved {
            Ok(bytes) => self.store.save(&tokens, bytes),
            Err(e) => tracing::warn!(slot, error = %e, "prefix not saved"),
        }
    }

    /// While idle: writes one idle slot's prefix that the disk tier lacks to disk (so the
    /// box's prompts survive a restart; RAM keeps only what left the cells), else queues one
    /// RAM entry the disk lacks. Returns whether it did either; more may wait.
    pub(super) fn save_idle(&mut self) -> bool {
        if !self.store.enabled() {
            return false;
        }
        let seqs = &self.seqs;
        let prefix = &self.prefix;
        let store = &self.store;
        let Some(slot) = (0..seqs.len())
            .find(|&s| seqs[s].is_none() && store.disk_wants(prefix.reusable_tokens(s)))
        else {
            return self.store.sync_idle();
        };
        let tokens = self.prefix.reusable_tokens(slot).to_vec();
        let saved = self.backend.save_prefix(slot, tokens.len() as u32);
        self.prefix.set(slot, &tokens);
        match saved {
            Ok(bytes) => self.store.save_disk(&tokens, bytes),
            Err(e) => tracing::warn!(slot, error = %e, "idle prefix not saved"),
        }
        true
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
    /// A `sibling` (a later choice of a request with `n` > 1, admitted right after the
    /// choice before it) waits for any prefix worth a copy: its whole prompt is being
    /// computed beside it.
    fn prefix_in_flight(
        &self,
        slot: usize,
        prompt: &[i32],
        sibling: bool,
    ) -> Option<(usize, usize)> {
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
        // A sibling's whole prompt is coming: worth waiting for whatever a copy beats.
        let worth = if sibling { self.min_copy() } else { TILE_ROWS };
        (len >= resident + worth).then_some((src, len))
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
            self.save_leaving(victim, 0);
            self.backend.truncate(victim, 0);
            self.prefix.clear(victim);
            tracing::debug!(slot = victim, "retained prefix evicted");
        }
    }
}
