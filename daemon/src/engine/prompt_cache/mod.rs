//! The prompt cache beyond the KV cells: prefixes saved when they leave a slot (or when the
//! box goes idle) into a RAM tier and a disk tier, found by the same longest-prefix rule
//! as resident ones, and restored into a slot when that beats recomputing them.
//!
//! The scheduler owns the policy (what to save, when to restore: `schedule/reuse.rs`); the
//! backend only saves and restores bytes ([`Backend::save_prefix`]); this module keeps the
//! tiers.
//!
//! [`Backend::save_prefix`]: crate::engine::backend::seam::Backend::save_prefix

pub mod cost;
pub mod disk;
pub mod entry;
pub mod ram;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::metrics::Metrics;
use cost::Costs;
use disk::DiskTier;
use ram::RamTier;

/// A saved prefix: its tokens and the backend's bytes.
pub type Saved = (Arc<[i32]>, Arc<Vec<u8>>);

/// Fewer saved tokens than this are not worth an entry.
pub const MIN_SAVE: usize = 64;

/// Where a saved prefix lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Ram = 0,
    Disk = 1,
}

impl Tier {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ram => "ram",
            Self::Disk => "disk",
        }
    }
}

/// The tiers' sizes, part of the engine plan (the ledger counts the RAM tier).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TiersPlan {
    /// Bytes the RAM tier may hold; 0 disables it.
    pub ram_bytes: u64,
    /// The disk tier's directory and byte budget, when a state directory is set.
    pub disk: Option<DiskPlan>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskPlan {
    pub dir: PathBuf,
    pub bytes: u64,
}

/// One tier's series, labelled `tier`.
#[derive(Debug, Clone)]
pub struct TierMetrics {
    metrics: Arc<Metrics>,
    tier: Tier,
}

impl TierMetrics {
    pub fn new(metrics: Arc<Metrics>, tier: Tier) -> Self {
        Self { metrics, tier }
    }

    pub fn dropped(&self, reason: &'static str) {
        self.metrics.prompt_cache.dropped(self.tier.label(), reason);
    }

    pub fn saved(&self) {
        self.metrics.prompt_cache.saved(self.tier.label());
    }

    pub fn hit(&self, tokens: usize) {
        self.metrics.prompt_cache.hit(self.tier.label(), tokens);
    }

    pub fn set_ready(&self) {
        self.metrics.prompt_cache.set_disk_ready();
    }

    pub fn set_size(&self, bytes: u64, entries: usize) {
        self.metrics
            .prompt_cache
            .set_size(self.tier.label(), bytes, entries);
    }
}

/// A saved prefix sharing `shared` tokens with a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub tier: Tier,
    /// The RAM entry's index, or the disk entry's file name.
    pub at: Found,
    pub shared: usize,
    /// Tokens the entry holds (a restore places all of them before cutting back).
    pub tokens: usize,
    /// Bytes a restore moves.
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Ram(usize),
    Disk(String),
}

/// The RAM and disk tiers together.
#[derive(Debug)]
pub struct PromptStore {
    ram: RamTier,
    disk: Option<DiskTier>,
    ram_metrics: Option<TierMetrics>,
    disk_metrics: Option<TierMetrics>,
    pub costs: Costs,
    /// With `--kv-events`: the RAM tier's prefixes, told to a router.
    events: Option<crate::kv_events::TierEvents>,
}

impl PromptStore {
    pub fn disabled() -> Self {
        Self {
            ram: RamTier::new(0),
            disk: None,
            ram_metrics: None,
            disk_metrics: None,
            costs: Costs::default(),
            events: None,
        }
    }

    /// The tiers of `plan` for a backend whose saved prefixes have `kv_layout` (`None`: it
    /// cannot save, and both tiers stay off). A disk tier that cannot start is logged and
    /// left off: the box serves without it.
    pub fn start(
        plan: &TiersPlan,
        kv_layout: Option<String>,
        weights_sha256: Arc<OnceLock<String>>,
        metrics: &Arc<Metrics>,
    ) -> Self {
        let Some(layout) = kv_layout else {
            if plan.ram_bytes > 0 || plan.disk.is_some() {
                tracing::info!("this backend cannot save prefixes: prompt cache tiers off");
            }
            return Self::disabled();
        };
        let ram_metrics = TierMetrics::new(metrics.clone(), Tier::Ram);
        let disk_metrics = TierMetrics::new(metrics.clone(), Tier::Disk);
        let disk = plan.disk.as_ref().filter(|d| d.bytes > 0).and_then(|d| {
            DiskTier::start(
                d.dir.clone(),
                d.bytes,
                weights_sha256,
                layout,
                disk_metrics.clone(),
            )
            .map_err(|e| {
                tracing::warn!(dir = %d.dir.display(), error = %e, "prompt cache disk tier off");
            })
            .ok()
        });
        metrics.prompt_cache.announce(Tier::Ram.label());
        if disk.is_some() {
            metrics.prompt_cache.announce(Tier::Disk.label());
        }
        Self {
            ram: RamTier::new(plan.ram_bytes),
            disk,
            ram_metrics: Some(ram_metrics),
            disk_metrics: Some(disk_metrics),
            costs: Costs::default(),
            events: None,
        }
    }

    pub fn enabled(&self) -> bool {
        self.ram.enabled() || self.disk.is_some()
    }

    /// From now on the RAM tier's prefixes are published; what it holds already at once.
    pub fn publish(&mut self, events: crate::kv_events::TierEvents) {
        self.events = Some(events);
        self.ram_changed();
    }

    fn ram_changed(&mut self) {
        if let Some(events) = &mut self.events {
            events.sync(self.ram.entries().map(|(tokens, _)| tokens));
        }
    }

    /// The saved prefix sharing the most tokens with `prompt` (RAM first on a tie).
    pub fn longest(&self, prompt: &[i32]) -> Option<Candidate> {
        let ram = self
            .ram
            .longest(prompt)
            .map(|(i, shared, tokens, bytes)| Candidate {
                tier: Tier::Ram,
                at: Found::Ram(i),
                shared,
                tokens,
                bytes,
            });
        let disk = self.disk.as_ref().and_then(|d| d.longest(prompt)).map(
            |(name, shared, tokens, bytes)| Candidate {
                tier: Tier::Disk,
                at: Found::Disk(name),
                shared,
                tokens,
                bytes,
            },
        );
        match (ram, disk) {
            (Some(r), Some(d)) if d.shared > r.shared => Some(d),
            (Some(r), _) => Some(r),
            (None, d) => d,
        }
    }

    /// A candidate's tokens and payload; a disk entry is verified and kept in RAM too.
    /// `None` when a disk entry turned out bad (dropped and counted).
    pub fn fetch(&mut self, c: &Candidate) -> Option<Saved> {
        match &c.at {
            // A restore copies the entry; the tier still holds it.
            Found::Ram(i) => self.ram.take(*i),
            Found::Disk(name) => {
                let (tokens, payload) = self.disk.as_ref()?.load(name)?;
                let payload = Arc::new(payload);
                self.put_ram(tokens.clone(), payload.clone());
                Some((tokens, payload))
            }
        }
    }

    /// Counts a restore from `c` that gave `tokens` prompt tokens and took `elapsed`, and
    /// learns its cost.
    pub fn restored(&mut self, c: &Candidate, tokens: usize, elapsed: std::time::Duration) {
        self.costs.observe_restore(c.tier, c.bytes, elapsed);
        let m = match c.tier {
            Tier::Ram => &self.ram_metrics,
            Tier::Disk => &self.disk_metrics,
        };
        if let Some(m) = m {
            m.hit(tokens);
        }
    }

    /// A candidate whose restore the backend refused: it must not be offered again.
    pub fn forget(&mut self, c: &Candidate) {
        match &c.at {
            Found::Ram(i) => {
                self.ram.remove(*i);
                self.ram_changed();
                if let Some(m) = &self.ram_metrics {
                    m.dropped("restore_failed");
                    m.set_size(self.ram.bytes(), self.ram.len());
                }
            }
            Found::Disk(name) => {
                if let Some(d) = &self.disk {
                    d.forget(name, "restore_failed");
                }
            }
        }
    }

    /// Some tier would store `tokens` (none holds them yet): worth asking the backend to
    /// save them.
    pub fn wants(&self, tokens: &[i32]) -> bool {
        tokens.len() >= MIN_SAVE
            && ((self.ram.enabled() && !self.ram.covers(tokens))
                || self.disk.as_ref().is_some_and(|d| !d.covers(tokens)))
    }

    /// Stores a saved prefix in every tier that lacks it.
    pub fn save(&mut self, tokens: &[i32], payload: Vec<u8>) {
        let tokens: Arc<[i32]> = tokens.into();
        let payload = Arc::new(payload);
        if let Some(d) = &self.disk {
            if !d.covers(&tokens) {
                d.save(tokens.clone(), payload.clone());
            }
        }
        if !self.ram.covers(&tokens) {
            self.put_ram(tokens, payload);
        }
    }

    /// The disk tier would store `tokens` (it lacks them).
    pub fn disk_wants(&self, tokens: &[i32]) -> bool {
        tokens.len() >= MIN_SAVE && self.disk.as_ref().is_some_and(|d| !d.covers(tokens))
    }

    /// Stores a saved prefix on disk only (an idle slot still holds it in its cells).
    pub fn save_disk(&mut self, tokens: &[i32], payload: Vec<u8>) {
        if let Some(d) = &self.disk {
            d.save(tokens.into(), Arc::new(payload));
        }
    }

    /// While idle: queues one RAM entry the disk tier lacks (its write was skipped while
    /// the writer was busy). Returns whether one was queued.
    pub fn sync_idle(&mut self) -> bool {
        let Some(d) = &self.disk else {
            return false;
        };
        self.ram
            .entries()
            .find(|(tokens, _)| !d.covers(tokens))
            .is_some_and(|(tokens, payload)| d.save(tokens.clone(), payload.clone()))
    }

    fn put_ram(&mut self, tokens: Arc<[i32]>, payload: Arc<Vec<u8>>) {
        if !self.ram.enabled() {
            return;
        }
        let done = self.ram.insert(tokens, payload);
        self.ram_changed();
        if let Some(m) = &self.ram_metrics {
            if done.stored {
                m.saved();
            }
            for _ in 0..done.evicted {
                m.dropped("evicted");
            }
            m.set_size(self.ram.bytes(), self.ram.len());
        }
    }

    /// Waits for queued disk writes (shutdown).
    pub fn flush(&mut self) {
        if let Some(d) = &mut self.disk {
            d.flush();
        }
    }

    /// The disk tier has indexed its directory (or there is none).
    pub fn disk_ready(&self) -> bool {
        self.disk.as_ref().is_none_or(DiskTier::ready)
    }
}

#[cfg(test)]
mod tests;
