//! What `golden` reports: agreement, KL and logit difference over every position, with
//! llama.cpp's own noise floor and the worst position.

use serde::Serialize;

/// The comparison over every position of every prompt.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Positions compared (prompt tokens plus continuation tokens, all prompts), each
    /// distinct token prefix once.
    pub positions: usize,
    /// Fraction of positions where both put the same token first.
    pub top1_agreement: f64,
    /// What llama.cpp was compared with: the native pass, or llama.cpp with
    /// quantized KV cells (`--kv-type`). The `native_*` fields are the candidate's.
    pub candidate: String,
    /// KL(p_llama ‖ p_candidate) in nats, averaged over positions.
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_abs_logit_diff: f64,
    pub prompts: usize,
    /// Positions where the top-1 tokens differ.
    pub top1_disagreements: usize,
    /// Positions not counted because an earlier prompt began with the same tokens up to
    /// them (their logits are the same computation).
    pub repeated_positions: usize,
    /// Where the largest KL was: prompt index (0-based, among the prompts read) and position.
    pub worst: Option<Worst>,
    pub llama_seconds: f64,
    pub native_seconds: f64,
    /// With `--noise-floor`: llama.cpp without flash attention against llama.cpp with it,
    /// over the same positions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llama_noise_floor: Option<NoiseFloor>,
}

/// llama.cpp against itself: the same comparison between its two attention paths.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct NoiseFloor {
    pub top1_agreement: f64,
    pub top1_disagreements: usize,
    pub mean_kl: f64,
    pub max_kl: f64,
    pub max_abs_logit_diff: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Worst {
    pub prompt: usize,
    pub pos: usize,
    pub kl: f64,
}

impl Report {
    /// One line for people: `612 positions over 20 prompts: top-1 agreement 99.84% …`.
    pub fn summary(&self) -> String {
        format!(
            "{}: {} positions over {} prompts: top-1 agreement {:.2}% ({} differ), mean KL \
             {:.2e}, max KL {:.2e}, max |logit diff| {:.4} (llama.cpp {:.1} s, candidate {:.1} s)",
            self.candidate,
            self.positions,
            self.prompts,
            100.0 * self.top1_agreement,
            self.top1_disagreements,
            self.mean_kl,
            self.max_kl,
            self.max_abs_logit_diff,
            self.llama_seconds,
            self.native_seconds
        ) + &self.llama_noise_floor.map_or_else(String::new, |f| {
            format!(
                "; llama.cpp against itself (flash attention off vs on): top-1 agreement \
                 {:.2}% ({} differ), mean KL {:.2e}",
                100.0 * f.top1_agreement,
                f.top1_disagreements,
                f.mean_kl
            )
        })
    }
}
