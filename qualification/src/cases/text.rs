//! `text`: Unicode through the tokenizer and back: the model repeats lines in many scripts
//! exactly (detokenization round trips), echo is byte-exact, a cut character shows only at a
//! length cut, and inputs near the context limit.

use serde_json::{json, Value};

use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::target::{expect_error, finish_of, text_of, u64_at, Target};
use crate::{ensure, ensure_eq};

const G: Group = Group::Text;
const PATH: &str = "/v1/completions";

/// A few `Line: S` lines and an open `Line:`: greedy decoding repeats ` S`.
fn repeat_prompt(s: &str) -> String {
    let mut p: String = (0..4).map(|_| format!("Line: {s}\n")).collect();
    p.push_str("Line:");
    p
}

fn repeat_body(s: &str, max_tokens: u32) -> Value {
    json!({"prompt": repeat_prompt(s), "max_tokens": max_tokens, "temperature": 0, "stop": ["\n"]})
}

/// The model's repetition of `s`: generated tokens decoded back to text.
fn roundtrip(c: &Ctx, ev: &mut Evidence, s: &str) -> Result<String, Stop> {
    let v = c.target.complete(&repeat_body(s, 32))?;
    let t = text_of(&v)?;
    ev.put("input", s);
    ev.put("output", t.clone());
    ev.put(
        "input_codepoints",
        json!(s
            .chars()
            .map(|ch| format!("U+{:04X}", ch as u32))
            .collect::<Vec<_>>()),
    );
    ensure_eq!("repeated line", t, format!(" {s}"));
    Ok(format!("{t:?} round-tripped"))
}

/// The `small` daemon (ctx 128), or the reason there is none.
fn small(c: &Ctx) -> Result<(Target, u64, std::sync::Arc<crate::ctx::Fixture>), Stop> {
    let fx = c.fixture("small")?;
    Ok((fx.target(), 128, fx))
}

/// A prompt of about 100 tokens and its exact token count on `t`.
fn near_limit_prompt(t: &Target) -> Result<(String, u64), Stop> {
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(9);
    let v = t.complete(&json!({"prompt": prompt, "max_tokens": 1, "temperature": 0}))?;
    Ok((prompt, u64_at(&v, "/usage/prompt_tokens")?))
}

pub fn register(r: &mut Registry) {
    for (id, what, s) in [
        (
            "text.roundtrip.accented",
            "Latin with accents",
            "Café naïve résumé",
        ),
        (
            "text.roundtrip.cjk",
            "Chinese with full-width punctuation",
            "你好，世界。",
        ),
        (
            "text.roundtrip.japanese",
            "Japanese kanji and kana",
            "日本語のテキスト",
        ),
        (
            "text.roundtrip.emoji",
            "emoji outside the BMP",
            "Hello 👋🌍🎉",
        ),
        (
            "text.roundtrip.combining_marks",
            "combining accents",
            "e\u{301} a\u{300}",
        ),
        (
            "text.roundtrip.zwj_sequence",
            "a zero-width-joiner emoji family",
            "👨\u{200d}👩\u{200d}👧",
        ),
        ("text.roundtrip.rtl", "Hebrew and Arabic", "שלום مرحبا"),
    ] {
        r.add(
            G,
            id,
            format!("{what} survive tokenization and detokenization"),
            format!("the model repeats {s:?} byte for byte"),
            move |c, ev| roundtrip(c, ev, s),
        );
    }
    r.add(
        G,
        "text.echo.escapes_exact",
        "Echo returns quotes, backslashes, newlines, tabs and control characters exactly",
        "echo text starts with the prompt byte for byte",
        |c, ev| {
            let p = "q \" b \\ n \n t \t c \u{1}\u{1f} end";
            let v = c
                .target
                .complete(&json!({"prompt": p, "max_tokens": 1, "temperature": 0, "echo": true}))?;
            let t = text_of(&v)?;
            ev.put("echo", t.clone());
            ensure!(t.starts_with(p), format!("starts with {p:?}"), t);
            Ok("exact".into())
        },
    );
    r.add(G, "text.output.replacement_only_at_cut", "A character cut by max_tokens is the only U+FFFD", "answers in emoji and CJK hold U+FFFD only as their last character, and only with finish_reason length", |c, ev| {
        for (i, prompt) in ["Reply with three emoji about the sea.", "用中文介绍一下你自己。"].into_iter().enumerate() {
            for n in [5u32, 7] {
                let v = c.target.chat(&crate::target::chat_body(prompt, n))?;
                let t = text_of(&v)?;
                ev.put(&format!("answer_{i}_{n}"), t.clone());
                let inner = t.strip_suffix('\u{FFFD}').unwrap_or(&t);
                ensure!(!inner.contains('\u{FFFD}'), "no U+FFFD before the last character", t.clone());
                if t.ends_with('\u{FFFD}') {
                    ensure_eq!("finish_reason of a cut character", finish_of(&v), "length");
                }
            }
        }
        Ok("clean text".into())
    });
    r.add(
        G,
        "text.stream.multibyte_equal",
        "Streaming never splits a character",
        "a streamed CJK repetition equals the plain one; every chunk is valid text without U+FFFD",
        |c, ev| {
            let s = "你好，世界。今天天气很好。";
            let plain = text_of(&c.target.complete(&repeat_body(s, 32))?)?;
            let mut body = repeat_body(s, 32);
            body["stream"] = json!(true);
            let cap = c.target.stream_ok(PATH, &body)?;
            ev.text("stream", &cap.describe());
            ensure_eq!("streamed text", cap.text(), plain);
            ensure!(
                !cap.raw_text().contains('\u{FFFD}'),
                "no U+FFFD in any chunk",
                cap.describe()
            );
            Ok(format!("{} chunks", cap.frames.len()))
        },
    );
    r.add(G, "text.chat.cjk_prompt_tokenized", "A CJK chat message is tokenized", "prompt_tokens for a CJK message exceed those of an empty message by ≥ its character count / 3", |c, ev| {
        let msg = "请用三句话解释为什么天空是蓝色的。";
        let empty = u64_at(&c.target.chat(&crate::target::chat_body("", 1))?, "/usage/prompt_tokens")?;
        let full = u64_at(&c.target.chat(&crate::target::chat_body(msg, 1))?, "/usage/prompt_tokens")?;
        let chars = msg.chars().count() as u64;
        ev.put("prompt_tokens", json!({"empty": empty, "cjk": full, "chars": chars}));
        ensure!(full >= empty + chars / 3, format!("≥ {}", empty + chars / 3), full.to_string());
        Ok(format!("{} tokens for {chars} characters", full - empty))
    });
    r.add(
        G,
        "text.long.near_limit_served",
        "A prompt that fills the context up to max_tokens is served",
        "ctx 128: prompt P tokens with max_tokens 128 − P → 200, finish within the room",
        |c, ev| {
            let (t, ctx, _fx) = small(c)?;
            let (prompt, p) = near_limit_prompt(&t)?;
            ensure!(
                p < ctx,
                format!("a prompt under {ctx} tokens"),
                p.to_string()
            );
            let room = ctx - p;
            let v = t.complete(&json!({"prompt": prompt, "max_tokens": room, "temperature": 0}))?;
            ev.put("prompt_tokens", p);
            ev.put("usage", v["usage"].clone());
            ensure!(
                u64_at(&v, "/usage/total_tokens")? <= ctx,
                format!("total ≤ {ctx}"),
                v["usage"].to_string()
            );
            Ok(format!("{p} + {room} tokens served"))
        },
    )
    .fixture("small");
    r.add(
        G,
        "text.long.one_over_refused",
        "One token more than the context is refused",
        "ctx 128: max_tokens 128 − P + 1 → 400 context_length_exceeded naming prompt",
        |c, ev| {
            let (t, ctx, _fx) = small(c)?;
            let (prompt, p) = near_limit_prompt(&t)?;
            let resp = t.post(
                PATH,
                &json!({"prompt": prompt, "max_tokens": ctx - p + 1, "temperature": 0}),
            )?;
            ev.text("response", &resp.describe());
            expect_error(&resp, 400, Some("prompt"), Some("context_length_exceeded"))?;
            Ok(format!("refused at {} tokens", ctx + 1))
        },
    )
    .fixture("small");
    r.add(G, "text.long.tokens_scale_linearly", "Repeating text grows the prompt linearly", "prompt_tokens for 2×, 4× and 8× a sentence grow by the same step (±2)", |c, ev| {
        let count = |k: usize| -> Result<u64, Stop> {
            let v = c.target.complete(&json!({"prompt": "The quick brown fox jumps over the lazy dog. ".repeat(k), "max_tokens": 1, "temperature": 0}))?;
            u64_at(&v, "/usage/prompt_tokens")
        };
        let (a, b, d) = (count(2)?, count(4)?, count(8)?);
        ev.put("prompt_tokens", json!([a, b, d]));
        let (s1, s2) = (b as i64 - a as i64, (d as i64 - b as i64) / 2);
        ensure!((s1 - s2).abs() <= 2 && s1 > 0, "equal steps", format!("{a}, {b}, {d}"));
        Ok(format!("{a} → {b} → {d}"))
    });
    r.add(
        G,
        "text.stop.multibyte",
        "A stop sequence in CJK cuts before it",
        "stop \"世界\" on the repeated CJK line cuts right before it, finish_reason stop",
        |c, ev| {
            let s = "你好，世界。今天天气很好。";
            let mut body = repeat_body(s, 32);
            body["stop"] = json!(["世界", "\n"]);
            let v = c.target.complete(&body)?;
            let t = text_of(&v)?;
            ev.put("text", t.clone());
            ensure_eq!("text", t, " 你好，".to_string());
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            Ok(format!("{t:?}"))
        },
    );
}
