//! Saved prefixes on a synthetic model: a prefix saved from one sequence and restored into
//! another (of another model, on another device) continues with the logits of computing
//! it again, bit for bit; what cannot be restored is refused and leaves the sequence empty.

use super::backend::NativeBackend;
use super::synth::{synth, Spec, Synth};
use super::*;
use crate::engine::backend::seam::{Backend, BackendError, StepPlan, Work};
use crate::engine::types::SamplingParams;

const N_CTX: usize = 40;
/// Longer than two micro-batches, so that saving cuts inside a pass's tokens.
const PROMPT: [i32; 21] = [
    1, 17, 4, 42, 9, 33, 0, 49, 3, 3, 21, 8, 12, 5, 5, 40, 2, 27, 31, 7, 11,
];
const SAVED: usize = 13;

fn model(s: &Synth, n_seq: usize, n_ctx: usize) -> Model<'_> {
    let hp = HParams::from_metadata(s).unwrap();
    let w = Weights::load(&hp, s).unwrap();
    Model::new(hp, w, n_seq, n_ctx, 2).unwrap()
}

fn toks(seq: usize, tokens: &[i32], pos0: u32) -> Vec<BatchToken> {
    (tokens.iter().enumerate())
        .map(|(i, &token)| BatchToken {
            seq,
            token,
            pos: pos0 + i as u32,
        })
        .collect()
}

/// Every token's logits, fed to `seq` from `pos0`.
fn logits(m: &mut Model<'_>, seq: usize, tokens: &[i32], pos0: u32) -> Vec<u32> {
    let out = m.forward(&toks(seq, tokens, pos0), &vec![true; tokens.len()]);
    out.unwrap().iter().map(|x| x.to_bits()).collect()
}

/// The logits of the prompt's rest after its first [`SAVED`] positions, computed whole.
fn recomputed(s: &Synth) -> Vec<u32> {
    let mut m = model(s, 1, N_CTX);
    m.forward(&toks(0, &PROMPT[..SAVED], 0), &[false; SAVED])
        .unwrap();
    logits(&mut m, 0, &PROMPT[SAVED..], SAVED as u32)
}

/// Equal logits bits, or the first that differs.
fn assert_same(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: logits");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let f = |b: u32| f32::from_bits(b);
        panic!(
            "{what}: logit {i} is {} where recomputing gives {}",
            f(got[i]),
            f(want[i])
        );
    }
}

fn assert_refused<T: std::fmt::Debug>(r: Result<T, NativeError>, says: &str) {
    match r {
        Err(NativeError::Kv(m)) => assert!(m.contains(says), "{m:?} lacks {says:?}"),
        other => panic!("not refused as a KV error: {other:?}"),
    }
}

#[test]
fn a_restored_prefix_continues_with_the_recomputed_logits_bit_for_bit() {
    for (spec, seed) in [(Spec::llama(), 41), (Spec::qwen2(), 42)] {
        let s = synth(spec, seed);
        let want = recomputed(&s);
        let mut saver = model(&s, 3, N_CTX);
        // Other sequences' cells around it must neither leak in nor be overwritten.
        saver.forward(&toks(0, &[7; 9], 0), &[false; 9]).unwrap();
        saver
            .forward(&toks(1, &PROMPT, 0), &[false; PROMPT.len()])
            .unwrap();
        let saved = saver.kv_mut().save_prefix(1, SAVED).unwrap();
        assert_eq!(saver.kv().seq_len(1), SAVED, "saving drops the rest");
        assert_eq!(saver.kv().seq_len(0), 9);

        let mut restorer = model(&s, 3, N_CTX);
        restorer
            .forward(&toks(2, &[5; 18], 0), &[false; 18])
            .unwrap();
        assert_eq!(restorer.kv_mut().restore_prefix(2, &saved), Ok(SAVED));
        assert_eq!(restorer.kv().seq_len(2), SAVED);
        assert_eq!(
            restorer.kv_mut().save_prefix(2, SAVED).as_ref(),
            Ok(&saved),
            "saving what was restored gives the same bytes"
        );
        let got = logits(&mut restorer, 2, &PROMPT[SAVED..], SAVED as u32);
        assert_same(
            &got,
            &want,
            &format!("{spec:?}: restored into another model"),
        );
        let again = logits(&mut saver, 1, &PROMPT[SAVED..], SAVED as u32);
        assert_same(
            &again,
            &want,
            &format!("{spec:?}: the saved sequence, continued"),
        );
    }
}

#[test]
fn saving_more_than_a_sequence_holds_is_refused_and_changes_nothing() {
    let s = synth(Spec::llama(), 43);
    let mut m = model(&s, 2, N_CTX);
    m.forward(&toks(0, &PROMPT[..5], 0), &[false; 5]).unwrap();
    assert_refused(m.kv_mut().save_prefix(0, 6), "which holds 5");
    assert_eq!(m.kv().seq_len(0), 5);
    assert_refused(m.kv_mut().save_prefix(2, 0), "outside the cache");
    let empty = m.kv_mut().save_prefix(1, 0).unwrap();
    assert_eq!(m.kv_mut().restore_prefix(0, &empty), Ok(0));
    assert_eq!(m.kv().seq_len(0), 0);
}

#[test]
fn malformed_bytes_are_refused_and_leave_the_sequence_empty() {
    let s = synth(Spec::llama(), 44);
    let mut m = model(&s, 2, N_CTX);
    m.forward(&toks(0, &PROMPT, 0), &[false; PROMPT.len()])
        .unwrap();
    let good = m.kv_mut().save_prefix(0, SAVED).unwrap();
    let mut bad_magic = good.clone();
    bad_magic[1] ^= 0xff;
    let mut bad_layers = good.clone();
    bad_layers[8] += 1;
    let mut longer = good.clone();
    longer.extend_from_slice(&[0, 0]);
    let other = synth(
        Spec {
            n_layer: 3,
            ..Spec::llama()
        },
        44,
    );
    let other_geometry = {
        let mut o = model(&other, 1, N_CTX);
        o.forward(&toks(0, &PROMPT[..3], 0), &[false; 3]).unwrap();
        o.kv_mut().save_prefix(0, 3).unwrap()
    };
    let cases: [(&[u8], &str); 6] = [
        (&good[..10], "shorter than its"),
        (&good[..good.len() - 2], "payload bytes"),
        (&longer, "payload bytes"),
        (&bad_magic, "magic"),
        (&bad_layers, "layers of"),
        (&other_geometry, "3 layers of"),
    ];
    for (bytes, says) in cases {
        m.forward(&toks(1, &PROMPT[..4], 0), &[false; 4]).unwrap();
        assert_refused(m.kv_mut().restore_prefix(1, bytes), says);
        assert_eq!(m.kv().seq_len(1), 0, "{says}: the sequence holds nothing");
    }
    // A cache of shorter sequences refuses a prefix it cannot hold.
    let mut short = model(&s, 1, SAVED - 1);
    assert_refused(
        short.kv_mut().restore_prefix(0, &good),
        "more than the context",
    );
    assert_eq!(short.kv().seq_len(0), 0);
    assert_refused(m.kv_mut().restore_prefix(2, &good), "outside the cache");
    // The good bytes still restore after all that.
    assert_eq!(m.kv_mut().restore_prefix(1, &good), Ok(SAVED));
}

#[test]
fn the_backend_saves_and_restores_through_the_seam() {
    let s = synth(Spec::llama(), 45);
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let mut b = NativeBackend::new(model(&s, 2, N_CTX));
    let layout = b.kv_layout().expect("the native backend saves prefixes");
    let hp = HParams::from_metadata(&s).unwrap();
    assert!(
        layout.contains(&format!(
            "{} layers x {} kv heads x {}",
            hp.n_layer, hp.n_head_kv, hp.head_dim
        )),
        "{layout}"
    );
    b.open(0, &greedy).unwrap();
    let whole = prefill(&mut b, 0, &PROMPT, 0).unwrap();
    let saved = b.save_prefix(0, SAVED as u32).unwrap();
    assert_eq!(b.model().kv().seq_len(0), SAVED);
    assert_eq!(b.restore_prefix(1, &saved), Ok(SAVED as u32));
    b.open(1, &greedy).unwrap();
    let resumed = prefill(&mut b, 1, &PROMPT[SAVED..], SAVED as u32);
    assert_eq!(resumed, Ok(whole), "the token after the restored prefix");

    assert!(matches!(
        b.save_prefix(1, PROMPT.len() as u32 + 1),
        Err(BackendError::Sequence(m)) if m.contains("which holds")
    ));
    assert!(matches!(
        b.restore_prefix(1, &saved[..saved.len() - 1]),
        Err(BackendError::Sequence(m)) if m.contains("refused")
    ));
    assert_eq!(b.model().kv().seq_len(1), 0);
}

/// The token sampled after feeding `tokens` to `seq` from `pos`.
fn prefill(
    b: &mut NativeBackend<'_>,
    seq: usize,
    tokens: &[i32],
    pos: u32,
) -> Result<Option<i32>, BackendError> {
    let out = b.step(&StepPlan {
        work: vec![Work::Prefill {
            seq,
            tokens,
            pos,
            sample: true,
        }],
    });
    out[0].result.clone()
}

/// GPU tests live in a `gpu` module: the device check counts them from `--list`.
mod gpu {
    use super::*;

    /// The CUDA pass's cells save the CPU pass's bytes, and a prefix saved on either device
    /// restores on either and continues with the recomputed logits, bit for bit. Skipped,
    /// saying why, without a GPU; the emulator and `scripts/device-check.sh` run it.
    #[test]
    fn a_prefix_saved_on_either_device_restores_on_the_other_bit_for_bit() {
        let Some(gpu) = inferloop_kernels::cuda::test_gpu() else {
            return;
        };
        let s = synth(Spec::llama(), 46);
        let want = recomputed(&s);
        let hp = HParams::from_metadata(&s).unwrap();
        let w = Weights::load(&hp, &s).unwrap();
        let mut dev = Model::new_cuda(hp, w, 3, N_CTX, gpu).unwrap();
        let mut cpu = model(&s, 3, N_CTX);
        let mut saved = Vec::new();
        for m in [&mut dev, &mut cpu] {
            m.forward(&toks(0, &[7; 9], 0), &[false; 9]).unwrap();
            m.forward(&toks(1, &PROMPT, 0), &[false; PROMPT.len()])
                .unwrap();
            saved.push(m.kv_mut().save_prefix(1, SAVED).unwrap());
            assert_eq!(m.kv().seq_len(1), SAVED);
        }
        assert!(
            saved[0] == saved[1],
            "CUDA and CPU cells save the same bytes"
        );

        // Each device restores the other's bytes over a longer sequence, and continues.
        for (name, m, bytes) in [("cuda", &mut dev, &saved[1]), ("cpu", &mut cpu, &saved[0])] {
            m.forward(&toks(2, &[5; 18], 0), &[false; 18]).unwrap();
            assert_eq!(m.kv_mut().restore_prefix(2, bytes), Ok(SAVED), "{name}");
            let got = logits(m, 2, &PROMPT[SAVED..], SAVED as u32);
            assert_same(
                &got,
                &want,
                &format!("{name}: restored from the other device"),
            );
            let again = logits(m, 1, &PROMPT[SAVED..], SAVED as u32);
            assert_same(
                &again,
                &want,
                &format!("{name}: the saved sequence, continued"),
            );
        }
        assert_refused(
            dev.kv_mut().restore_prefix(2, &saved[0][..40]),
            "payload bytes",
        );
        assert_eq!(dev.kv().seq_len(2), 0);
        assert_refused(dev.kv_mut().save_prefix(0, 10), "which holds 9");

        let (dev, cpu) = (NativeBackend::new(dev), NativeBackend::new(cpu));
        assert_eq!(dev.kv_layout(), cpu.kv_layout(), "one layout for both");
    }
}
