//! Unit tests of the comparison.

use super::compare::*;
use super::{read_prompts, GoldenError};

#[test]
fn equal_rows_agree_with_zero_kl_and_zero_difference() {
    let row = [0.5, -1.0, 3.0, 2.0];
    let mut s = Stats::default();
    s.add(&row, &row, 0, 0);
    let r = s.report(1, 0.0, 0.0);
    assert_eq!((r.positions, r.top1_disagreements), (1, 0));
    assert_eq!(r.top1_agreement, 1.0);
    assert!(r.mean_kl < 1e-15, "{}", r.mean_kl);
    assert_eq!(r.max_abs_logit_diff, 0.0);
}

#[test]
fn a_constant_shift_changes_no_probability_but_shows_in_the_logit_difference() {
    let a = [0.5f32, -1.0, 3.0, 2.0];
    let b = a.map(|v| v + 0.25);
    assert!(kl_divergence(&a, &b) < 1e-12);
    let mut s = Stats::default();
    s.add(&a, &b, 0, 0);
    assert_eq!(s.report(1, 0.0, 0.0).max_abs_logit_diff, 0.25);
}

#[test]
fn kl_matches_the_closed_form_and_a_swapped_top1_counts_as_disagreement() {
    // p = softmax([ln 3, 0]) = (3/4, 1/4); q = (1/4, 3/4).
    let p = [3f32.ln(), 0.0];
    let q = [0.0, 3f32.ln()];
    let want = 0.75 * (3.0f64).ln() + 0.25 * (1.0f64 / 3.0).ln();
    assert!((kl_divergence(&p, &q) - want).abs() < 1e-6);
    let mut s = Stats::default();
    s.add(&p, &p, 0, 0);
    s.add(&p, &q, 2, 7);
    let r = s.report(3, 0.0, 0.0);
    assert_eq!(r.top1_agreement, 0.5);
    assert_eq!(r.top1_disagreements, 1);
    let w = r.worst.expect("a worst position");
    assert_eq!((w.prompt, w.pos), (2, 7));
    assert!((r.mean_kl - want / 2.0).abs() < 1e-6);
}

#[test]
fn argmax_keeps_the_first_of_equal_maxima() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
}

#[test]
fn blank_and_comment_lines_are_skipped_and_line_numbers_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.txt");
    std::fs::write(&path, "# prompts\n\nFirst one\n  \nSecond\n").unwrap();
    let lines = read_prompts(&path).unwrap();
    let got: Vec<(usize, &str)> = lines.iter().map(|l| (l.number, l.text.as_str())).collect();
    assert_eq!(got, [(3, "First one"), (5, "Second")]);
    std::fs::write(&path, "# only a comment\n\n").unwrap();
    assert!(matches!(
        read_prompts(&path),
        Err(GoldenError::NoPrompts(_))
    ));
}
