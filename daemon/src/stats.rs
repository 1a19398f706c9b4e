//! Pearson's chi-square tests, for checking that sampling keeps a distribution: the unit
//! tests of the speculative verification rule compare emitted tokens with a known law
//! (goodness of fit), and the real-model test compares continuations sampled with and
//! without speculation (homogeneity of two samples).
//!
//! Cells whose expected count is under [`MIN_EXPECTED`] are pooled into one before the
//! statistic is computed: the chi-square approximation of the statistic's law needs them
//! large enough.

use std::fmt;

/// Fewest expected observations a cell may have before it is pooled (the usual rule).
pub const MIN_EXPECTED: f64 = 5.0;

/// A test's outcome: the statistic, its degrees of freedom and the probability of a
/// statistic at least this large if the hypothesis holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChiSquare {
    pub statistic: f64,
    pub df: usize,
    pub p_value: f64,
}

impl ChiSquare {
    fn new(statistic: f64, df: usize) -> Self {
        Self {
            statistic,
            df,
            p_value: upper_tail(df, statistic),
        }
    }
}

impl fmt::Display for ChiSquare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "chi2 = {:.3}, df = {}, p = {:.4} (critical value at 0.001: {:.3})",
            self.statistic,
            self.df,
            self.p_value,
            critical_value(self.df, 0.001)
        )
    }
}

/// Goodness of fit of `observed` counts to the law `probs` (summing to 1, one per cell).
/// A cell observed although its probability is 0 makes the statistic infinite.
pub fn goodness_of_fit(observed: &[u64], probs: &[f64]) -> ChiSquare {
    assert_eq!(observed.len(), probs.len(), "one probability per cell");
    let n: u64 = observed.iter().sum();
    // Checked before pooling, which would hide such a cell among small ones.
    let impossible = observed.iter().zip(probs).any(|(&o, &p)| o > 0 && p <= 0.0);
    let cells: Vec<(f64, f64)> = observed
        .iter()
        .zip(probs)
        .map(|(&o, &p)| (o as f64, p * n as f64))
        .collect();
    let cells = pool(cells, |&(_, e)| e);
    let statistic = if impossible {
        f64::INFINITY
    } else {
        (cells.iter())
            .filter(|&&(_, e)| e > 0.0)
            .map(|&(o, e)| (o - e).powi(2) / e)
            .sum()
    };
    ChiSquare::new(statistic, cells.len().saturating_sub(1))
}

/// Whether two samples, `a[i]` and `b[i]` observations of category `i`, come from one law.
pub fn homogeneity(a: &[u64], b: &[u64]) -> ChiSquare {
    assert_eq!(a.len(), b.len(), "the same categories in both samples");
    let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
    let total = na + nb;
    // A category's expected count in the smaller sample decides whether it is pooled.
    let smaller = na.min(nb) / total.max(1.0);
    let cells: Vec<(f64, f64)> = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64, y as f64))
        .collect();
    let cells = pool(cells, |&(x, y)| (x + y) * smaller);
    let statistic = cells
        .iter()
        .flat_map(|&(x, y)| {
            let row = x + y;
            [(x, row * na / total), (y, row * nb / total)]
        })
        .filter(|&(_, e)| e > 0.0)
        .map(|(o, e)| (o - e).powi(2) / e)
        .sum();
    ChiSquare::new(statistic, cells.len().saturating_sub(1))
}

/// Adds the cells whose `expected` is under [`MIN_EXPECTED`] into one; if that cell is
/// still too small, into the smallest of the others too.
fn pool(cells: Vec<(f64, f64)>, expected: impl Fn(&(f64, f64)) -> f64) -> Vec<(f64, f64)> {
    let add = |a: (f64, f64), b: (f64, f64)| (a.0 + b.0, a.1 + b.1);
    let (mut kept, small): (Vec<_>, Vec<_>) =
        cells.into_iter().partition(|c| expected(c) >= MIN_EXPECTED);
    if small.is_empty() {
        return kept;
    }
    let pooled = small.into_iter().fold((0.0, 0.0), add);
    if expected(&pooled) < MIN_EXPECTED {
        let smallest = kept
            .iter()
            .enumerate()
            .min_by(|a, b| expected(a.1).total_cmp(&expected(b.1)))
            .map(|(i, _)| i);
        if let Some(i) = smallest {
            kept[i] = add(kept[i], pooled);
            return kept;
        }
    }
    kept.push(pooled);
    kept
}

/// P(X ≥ x) for X chi-square with `df` degrees of freedom: the regularized upper
/// incomplete gamma function Q(df/2, x/2).
pub fn upper_tail(df: usize, x: f64) -> f64 {
    if df == 0 {
        return if x > 0.0 { 0.0 } else { 1.0 };
    }
    if x.is_nan() || x == f64::INFINITY {
        return 0.0;
    }
    let (a, x) = (df as f64 / 2.0, x / 2.0);
    if x <= 0.0 {
        return 1.0;
    }
    // x^a e^-x / Γ(a), the factor both expansions share.
    let front = (a * x.ln() - x - ln_gamma_half(df)).exp();
    if x < a + 1.0 {
        // Series for the lower part P(a, x); it converges fast here.
        let (mut term, mut sum, mut k) = (1.0 / a, 1.0 / a, a);
        while term.abs() > sum.abs() * 1e-15 {
            k += 1.0;
            term *= x / k;
            sum += term;
        }
        (1.0 - front * sum).max(0.0)
    } else {
        // Continued fraction for Q(a, x), evaluated by the modified Lentz method.
        const TINY: f64 = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / TINY;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < TINY {
                d = TINY;
            }
            c = b + an / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            let step = d * c;
            h *= step;
            if (step - 1.0).abs() < 1e-15 {
                break;
            }
        }
        front * h
    }
}

/// ln Γ(df/2), exactly from Γ(1) = 1, Γ(1/2) = √π and Γ(a + 1) = a Γ(a): chi-square
/// laws only need half-integers.
fn ln_gamma_half(df: usize) -> f64 {
    let (mut a, mut ln) = if df % 2 == 0 {
        (1.0, 0.0)
    } else {
        (0.5, 0.5 * std::f64::consts::PI.ln())
    };
    while a < df as f64 / 2.0 {
        ln += a.ln();
        a += 1.0;
    }
    ln
}

/// The `x` with `upper_tail(df, x) == alpha`, by bisection (for messages: the bound a
/// statistic is compared with).
pub fn critical_value(df: usize, alpha: f64) -> f64 {
    if df == 0 {
        return 0.0;
    }
    let mut hi = df as f64 + 10.0;
    while upper_tail(df, hi) > alpha {
        hi *= 2.0;
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if upper_tail(df, mid) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-300)
    }

    #[test]
    fn the_upper_tail_matches_closed_forms_and_printed_tables() {
        // Two degrees of freedom: Q = e^(-x/2) exactly.
        for x in [0.1, 1.0, 2.0, 5.0, 13.816, 40.0] {
            assert!(close(upper_tail(2, x), (-x / 2.0).exp(), 1e-12), "{x}");
        }
        // One: Q = erfc(√(x/2)); 3.841 and 6.635 are the 0.05 and 0.01 points.
        assert!(close(upper_tail(1, 3.841_459), 0.05, 1e-5));
        assert!(close(upper_tail(1, 6.634_897), 0.01, 1e-5));
        // The 0.001 points printed in every table, both branches of the evaluation.
        for (df, x) in [
            (1, 10.828),
            (3, 16.266),
            (4, 18.467),
            (5, 20.515),
            (10, 29.588),
            (20, 45.315),
            (50, 86.661),
        ] {
            let p = upper_tail(df, x);
            assert!(close(p, 0.001, 1e-3), "df {df}: Q({x}) = {p}");
            assert!(close(critical_value(df, 0.001), x, 1e-4), "df {df}");
        }
        assert_eq!(upper_tail(3, 0.0), 1.0);
        assert_eq!(upper_tail(3, f64::INFINITY), 0.0);
        // Large df, statistic at the mean: about one half.
        assert!((upper_tail(100, 100.0) - 0.48).abs() < 0.01);
    }

    #[test]
    fn goodness_of_fit_pools_small_cells_and_flags_impossible_ones() {
        // Exactly the expected counts: nothing to see.
        let fit = goodness_of_fit(&[50, 30, 20], &[0.5, 0.3, 0.2]);
        assert_eq!((fit.statistic, fit.df, fit.p_value), (0.0, 2, 1.0));
        // (60-50)²/50 + (20-30)²/30 + (20-20)²/20 = 2 + 10/3.
        let fit = goodness_of_fit(&[60, 20, 20], &[0.5, 0.3, 0.2]);
        assert!(close(fit.statistic, 2.0 + 10.0 / 3.0, 1e-12), "{fit}");
        // Two cells expected 2 and 3 times are pooled into one expected 5 times.
        let fit = goodness_of_fit(&[45, 50, 2, 3], &[0.45, 0.5, 0.02, 0.03]);
        assert_eq!((fit.statistic, fit.df), (0.0, 2));
        // A pooled cell still too small joins the smallest other.
        let fit = goodness_of_fit(&[90, 8, 2], &[0.9, 0.08, 0.02]);
        assert_eq!((fit.statistic, fit.df), (0.0, 1));
        // A token the law never emits.
        let fit = goodness_of_fit(&[10, 1], &[1.0, 0.0]);
        assert_eq!(fit.p_value, 0.0);
    }

    #[test]
    fn homogeneity_is_zero_for_proportional_samples_and_grows_with_difference() {
        let same = homogeneity(&[40, 30, 30], &[80, 60, 60]);
        assert!(same.statistic.abs() < 1e-12 && same.df == 2, "{same}");
        // 2×2: [[30, 20], [20, 30]], expected 25 everywhere: 4 × 25/25 = 4.
        let two = homogeneity(&[30, 20], &[20, 30]);
        assert!(close(two.statistic, 4.0, 1e-12) && two.df == 1, "{two}");
        assert!(two.p_value < 0.05 && two.p_value > 0.04, "{two}");
        // Rare categories (expected under 5 in the smaller sample) are pooled.
        let pooled = homogeneity(&[50, 45, 1, 2, 2], &[50, 45, 2, 1, 2]);
        assert_eq!(pooled.df, 2, "{pooled}");
        assert!(pooled.statistic.abs() < 1e-12, "{pooled}");
    }
}
