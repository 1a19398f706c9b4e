//! When restoring a saved prefix beats recomputing it: both costs are learnt from what the
//! box itself measures (prompt steps, restores per tier), starting from priors that favour
//! recomputing a few tokens over a restore's fixed cost.

use std::time::Duration;

use super::Tier;

/// Weight of the newest observation in the running averages.
const ALPHA: f64 = 0.2;
/// Before the first prompt step (the first request after a restart, when the disk tier
/// matters most): below the default model's ~1.6 ms a token on two CPU threads and an 8B
/// model's on an Orin's GPU, so that a restore of a long prefix is made and a few tokens
/// are still recomputed.
const PRIOR_PREFILL_NS_PER_TOKEN: f64 = 500_000.0;
/// Before the first restore from each tier: host memory at ~2 GB/s; a disk read plus
/// SHA-256 at ~500 MB/s.
const PRIOR_NS_PER_BYTE: [f64; 2] = [0.5, 2.0];
/// A restore's cost beyond its bytes (a file opened, llama.cpp's state parsed).
const FIXED_NS: [f64; 2] = [200_000.0, 1_000_000.0];

#[derive(Debug, Clone, Default)]
pub struct Costs {
    prefill_ns_per_token: Option<f64>,
    restore_ns_per_byte: [Option<f64>; 2],
}

fn blend(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| o + ALPHA * (new - o))
}

impl Costs {
    /// A step that fed `tokens` (mostly prompt) took `elapsed`.
    pub fn observe_prefill(&mut self, tokens: usize, elapsed: Duration) {
        if tokens > 0 {
            let ns = elapsed.as_nanos() as f64 / tokens as f64;
            self.prefill_ns_per_token = Some(blend(self.prefill_ns_per_token, ns));
        }
    }

    /// A restore of `bytes` from `tier` (read, verified and handed to the backend) took
    /// `elapsed`.
    pub fn observe_restore(&mut self, tier: Tier, bytes: u64, elapsed: Duration) {
        if bytes > 0 {
            let i = tier as usize;
            let ns = (elapsed.as_nanos() as f64 - FIXED_NS[i]).max(0.0) / bytes as f64;
            self.restore_ns_per_byte[i] = Some(blend(self.restore_ns_per_byte[i], ns));
        }
    }

    /// Expected time to restore `bytes` from `tier`.
    pub fn restore_ns(&self, tier: Tier, bytes: u64) -> f64 {
        let i = tier as usize;
        FIXED_NS[i] + bytes as f64 * self.restore_ns_per_byte[i].unwrap_or(PRIOR_NS_PER_BYTE[i])
    }

    /// The measured prefill cost of a token, once a prompt step has been timed.
    pub fn measured_prefill_ns_per_token(&self) -> Option<f64> {
        self.prefill_ns_per_token
    }

    /// Expected time to prefill `tokens` prompt tokens.
    pub fn prefill_ns(&self, tokens: usize) -> f64 {
        tokens as f64
            * self
                .prefill_ns_per_token
                .unwrap_or(PRIOR_PREFILL_NS_PER_TOKEN)
    }

    /// Restoring `bytes` from `tier` saves more time than prefilling the `gained` tokens it
    /// adds.
    pub fn worth(&self, tier: Tier, bytes: u64, gained: usize) -> bool {
        self.restore_ns(tier, bytes) < self.prefill_ns(gained)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crossover_follows_what_the_box_measures() {
        let row = 23 * 1024;
        // The default model on two CPU threads: ~1.6 ms a prompt token, 23 KiB of KV a
        // row. Restoring beats recomputing from a handful of tokens on, from either tier.
        let mut cpu = Costs::default();
        cpu.observe_prefill(512, Duration::from_millis(820));
        assert!(cpu.worth(Tier::Ram, 8 * row, 8));
        assert!(cpu.worth(Tier::Disk, 600 * row, 600));
        // A fast GPU (20 µs a token): a short gain is recomputed, and a long one read from
        // RAM but not from a slow disk.
        let mut gpu = Costs::default();
        gpu.observe_prefill(512, Duration::from_micros(10_240));
        assert!(!gpu.worth(Tier::Ram, 4 * row, 4));
        assert!(gpu.worth(Tier::Ram, 600 * row, 600));
        for _ in 0..20 {
            gpu.observe_restore(Tier::Disk, 600 * row, Duration::from_millis(40));
        }
        assert!(
            !gpu.worth(Tier::Disk, 600 * row, 600),
            "the disk learnt slow"
        );
        assert!(gpu.worth(Tier::Ram, 600 * row, 600), "tiers learn apart");
    }
}
