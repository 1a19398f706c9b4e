//! What a decode or verification step costs, fitted from the steps run, and how much of a
//! draft is worth verifying at that cost ([`worth_verifying`]).
//!
//! Speculation is only worth its rows where they are cheap. Reading the weights dominates a
//! GPU's step and extra rows are nearly free; on a CPU with a few cores each row costs a
//! good part of a step, so a draft pays only when it is very likely accepted.
//!
//! A step's cost is fitted as `c0 + c_row × rows + c_seq × sequences`: a sequence in the
//! step costs more than a row of it. Measured on the 2-core CPU, 4 grounded streams of
//! 300–1000 tokens: 4 sequences of one row took ~75 ms, the same 4 with 32 drafted rows
//! more ~430 ms (~11 ms a row), while one sequence alone took ~15 ms. A fit by rows alone
//! priced every drafted row like a whole extra stream and, beside other streams, dropped
//! drafts that raised throughput.

/// How fast old steps fade from the fit.
const COST_DECAY: f64 = 0.98;
/// Steps observed before the fit is trusted.
const COST_MIN_STEPS: f64 = 16.0;

/// A fitted step cost, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub base: f64,
    pub row: f64,
    pub seq: f64,
}

impl Cost {
    /// A step of `rows` rows over `seqs` sequences.
    pub fn of(&self, rows: usize, seqs: usize) -> f64 {
        self.base + self.row * rows as f64 + self.seq * seqs as f64
    }
}

/// Least squares over steps that fed no prompt chunk (every row of a decode or a
/// verification has its logits computed, so those rows cost alike), recent steps weighing
/// more: decayed sums of the regressors (rows `r`, sequences `s`), the time `y` and their
/// products.
#[derive(Debug, Clone, Default)]
pub struct StepCost {
    n: f64,
    r: f64,
    s: f64,
    y: f64,
    rr: f64,
    ss: f64,
    rs: f64,
    ry: f64,
    sy: f64,
}

impl StepCost {
    /// A step without prompt chunks computed `rows` rows of `seqs` sequences in `secs`.
    pub fn observe(&mut self, rows: usize, seqs: usize, secs: f64) {
        let (r, s) = (rows as f64, seqs as f64);
        let d = COST_DECAY;
        self.n = self.n * d + 1.0;
        self.r = self.r * d + r;
        self.s = self.s * d + s;
        self.y = self.y * d + secs;
        self.rr = self.rr * d + r * r;
        self.ss = self.ss * d + s * s;
        self.rs = self.rs * d + r * s;
        self.ry = self.ry * d + r * secs;
        self.sy = self.sy * d + s * secs;
    }

    /// The cost, once enough steps of different widths were seen. The sequence term only
    /// where the steps tell it apart from the rows (several stream counts, and rows not
    /// always one per sequence) and it comes out positive; else rows alone.
    pub fn fit(&self) -> Option<Cost> {
        if self.n < COST_MIN_STEPS {
            return None;
        }
        let cost = self.by_rows_and_seqs().or_else(|| self.by_rows())?;
        (cost.base + cost.row + cost.seq > 0.0).then_some(cost)
    }

    /// `c0 + c_row × rows`.
    fn by_rows(&self) -> Option<Cost> {
        let var = self.n * self.rr - self.r * self.r;
        if var <= 1e-9 * self.n * self.n {
            return None;
        }
        let row = ((self.n * self.ry - self.r * self.y) / var).max(0.0);
        let base = ((self.y - row * self.r) / self.n).max(0.0);
        Some(Cost {
            base,
            row,
            seq: 0.0,
        })
    }

    /// All three terms, from the centred normal equations; `None` where they cannot be
    /// told apart or a term comes out negative (its intercept alone may, then dropped).
    fn by_rows_and_seqs(&self) -> Option<Cost> {
        let n = self.n;
        // Centred sums of squares and products.
        let vrr = self.rr - self.r * self.r / n;
        let vss = self.ss - self.s * self.s / n;
        let vrs = self.rs - self.r * self.s / n;
        let vry = self.ry - self.r * self.y / n;
        let vsy = self.sy - self.s * self.y / n;
        let det = vrr * vss - vrs * vrs;
        if vss <= 1e-9 * n || det <= 1e-6 * vrr.max(1.0) * vss {
            return None;
        }
        let row = (vry * vss - vsy * vrs) / det;
        let seq = (vsy * vrr - vry * vrs) / det;
        if row < 0.0 || seq <= 0.0 {
            return None;
        }
        let base = (self.y - row * self.r - seq * self.s) / n;
        if base >= 0.0 {
            return Some(Cost { base, row, seq });
        }
        // A negative intercept: the same two terms through the origin.
        let det0 = self.rr * self.ss - self.rs * self.rs;
        if det0 <= 0.0 {
            return None;
        }
        let row = (self.ry * self.ss - self.sy * self.rs) / det0;
        let seq = (self.sy * self.rr - self.ry * self.rs) / det0;
        (row >= 0.0 && seq > 0.0).then_some(Cost {
            base: 0.0,
            row,
            seq,
        })
    }
}

/// How many of `drafted` tokens to verify for a sequence whose drafted positions are each
/// accepted with probability `a`, in a step that already computes `rows` rows for
/// `streams` sequences: the `k` that maximises tokens produced per second over the whole
/// step, 0 when drafting would lower it. With `k` drafts the sequence yields
/// `1 + a + … + a^k` tokens on average and the step costs `cost.of(rows + k, streams)`.
pub fn worth_verifying(cost: Cost, a: f64, drafted: usize, rows: usize, streams: usize) -> usize {
    let others = streams.saturating_sub(1) as f64;
    let rate = |k: usize| {
        let produced: f64 = (0..=k).map(|i| a.powi(i as i32)).sum();
        (others + produced) / cost.of(rows + k, streams)
    };
    (0..=drafted)
        .max_by(|&i, &j| rate(i).total_cmp(&rate(j)).then(j.cmp(&i)))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn one_stream_is_fitted_by_rows_alone() {
        let mut c = StepCost::default();
        for i in 0..40 {
            c.observe(1 + i % 5, 1, 0.010 + 0.002 * (1 + i % 5) as f64);
        }
        let cost = c.fit().expect("fitted");
        assert!(
            close(cost.base, 0.010) && close(cost.row, 0.002),
            "{cost:?}"
        );
        assert_eq!(cost.seq, 0.0);
        let mut flat = StepCost::default();
        for _ in 0..40 {
            flat.observe(1, 1, 0.01);
        }
        assert_eq!(
            flat.fit(),
            None,
            "one width says nothing about a row's cost"
        );
    }

    #[test]
    fn several_streams_separate_a_sequence_from_a_row() {
        let truth = Cost {
            base: 0.004,
            row: 0.011,
            seq: 0.008,
        };
        let mut c = StepCost::default();
        for i in 0..60 {
            let seqs = 1 + i % 4;
            let rows = seqs + (i * 7) % 9;
            c.observe(rows, seqs, truth.of(rows, seqs));
        }
        let cost = c.fit().expect("fitted");
        assert!(
            close(cost.base, truth.base)
                && close(cost.row, truth.row)
                && close(cost.seq, truth.seq),
            "{cost:?}"
        );
        // Without drafts every row is its own sequence: rows and sequences cannot be told
        // apart, and rows alone carry the cost.
        let mut plain = StepCost::default();
        for i in 0..60 {
            let n = 1 + i % 4;
            plain.observe(n, n, truth.of(n, n));
        }
        let cost = plain.fit().expect("fitted");
        assert_eq!(cost.seq, 0.0);
        assert!(close(cost.row, truth.row + truth.seq), "{cost:?}");
    }

    #[test]
    fn a_negative_intercept_is_dropped_not_kept() {
        // The measured shape: one stream ~15 ms, 4 streams ~75 ms, 4 streams with 32
        // drafted rows ~430 ms. An exact fit needs a negative base.
        let mut c = StepCost::default();
        for i in 0..48 {
            let (rows, seqs, ms) = [(1, 1, 15.0), (4, 4, 75.0), (36, 4, 430.0)][i % 3];
            c.observe(rows, seqs, ms / 1000.0);
        }
        let cost = c.fit().expect("fitted");
        assert_eq!(cost.base, 0.0);
        assert!(cost.row > 0.009 && cost.row < 0.013, "{cost:?}");
        assert!(cost.seq > 0.004, "{cost:?}");
    }

    #[test]
    fn drafts_are_verified_only_where_they_raise_throughput() {
        let rows_only = |base, row| Cost {
            base,
            row,
            seq: 0.0,
        };
        // Rows nearly free (a GPU): a doubtful draft is worth several rows.
        let gpu = rows_only(0.010, 0.0001);
        assert!(worth_verifying(gpu, 0.4, 8, 1, 1) >= 4);
        assert_eq!(worth_verifying(gpu, 0.9, 8, 1, 1), 8);
        // A row costs half a step (a CPU): only likely drafts, and fewer of them.
        let cpu = rows_only(0.010, 0.005);
        assert_eq!(worth_verifying(cpu, 0.3, 8, 1, 1), 0);
        let k = worth_verifying(cpu, 0.9, 8, 1, 1);
        assert!((3..=8).contains(&k), "{k}");
        // Beside three other streams, the same draft slows all four: fewer rows pay.
        assert!(worth_verifying(cpu, 0.9, 8, 4, 4) < k);
        assert_eq!(worth_verifying(cpu, 0.6, 8, 4, 4), 0);
        // Where a stream costs more than a row, a likely draft pays beside the others.
        let measured = Cost {
            base: 0.0,
            row: 0.011,
            seq: 0.008,
        };
        assert!(worth_verifying(measured, 0.95, 8, 4, 4) >= 4);
        assert_eq!(worth_verifying(measured, 0.5, 8, 4, 4), 0);
    }
}
