//! Exponential backoff with a cap, for a server that is down or answers garbage.
//!
//! The jitter (up to a quarter of the delay, from the controller id and the attempt) keeps
//! a fleet that lost its server together from coming back in lockstep; it is deterministic
//! so tests can state exact bounds.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    seed: u64,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration, seed_from: &str) -> Self {
        // FNV-1a: a stable seed from the controller id, no dependency for it.
        let seed = seed_from.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Self {
            base,
            cap: cap.max(base),
            attempt: 0,
            seed,
        }
    }

    /// The delay before the next try without jitter: base · 2^failures, at most the cap.
    pub fn delay(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(30)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// Records a failure and returns how long to wait: [`Self::delay`] minus up to 25 %.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.delay();
        self.attempt = self.attempt.saturating_add(1);
        let mut x = self.seed ^ u64::from(self.attempt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        let quarter = d / 4;
        let jitter = quarter.mul_f64((x % 1000) as f64 / 1000.0);
        d - jitter
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.attempt
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_until_the_cap_and_reset_on_success() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10), "box-1");
        let mut plain = Vec::new();
        for _ in 0..6 {
            plain.push(b.delay().as_secs());
            let d = b.next_delay();
            assert!(d <= b.cap && d >= Duration::from_secs(plain[plain.len() - 1]) * 3 / 4);
        }
        assert_eq!(plain, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.failures(), 6);
        b.reset();
        assert_eq!(b.delay(), Duration::from_secs(1));
    }

    #[test]
    fn many_failures_never_overflow() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(300), "x");
        for _ in 0..1000 {
            assert!(b.next_delay() <= Duration::from_secs(300));
        }
        assert_eq!(b.delay(), Duration::from_secs(300));
    }

    #[test]
    fn boxes_with_different_ids_do_not_retry_in_lockstep() {
        let mut a = Backoff::new(Duration::from_secs(8), Duration::from_secs(60), "box-a");
        let mut b = Backoff::new(Duration::from_secs(8), Duration::from_secs(60), "box-b");
        let da: Vec<_> = (0..4).map(|_| a.next_delay()).collect();
        let db: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
        assert_ne!(da, db);
    }
}
