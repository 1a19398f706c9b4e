//! `chat`: the non-streamed chat route: shape, roles and the chat template, temperature-0
//! determinism, seeds, sampling filters, penalties, stop sequences, length limits, usage and
//! timings.

use std::time::Instant;

use serde_json::{json, Value};

use super::{pick_stop, reference, EXPLAIN};
use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::target::{chat_body, f64_at, finish_of, text_of, u64_at, with};
use crate::{ensure, ensure_eq};

const G: Group = Group::Chat;
const CHAT: &str = "/v1/chat/completions";
/// A prompt whose greedy answer repeats itself, so penalties show.
const REPETITIVE: &str = "Count from 1 to 20, separated by commas.";

/// Tokens of the shared greedy answer: enough words to stop on, few enough for a slow box.
const N: u32 = 16;

/// The greedy answer to [`EXPLAIN`] with [`N`] tokens, shared by many cases.
fn explain(c: &Ctx) -> Result<(Value, String), Stop> {
    let v = reference(c, CHAT, &chat_body(EXPLAIN, N))?;
    let t = text_of(&v)?;
    Ok((v, t))
}

fn messages(msgs: Value, max_tokens: u32) -> Value {
    json!({"messages": msgs, "max_tokens": max_tokens, "temperature": 0})
}

fn sampled(seed: Value) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell me a short story about a cat."}],
        "max_tokens": 8,
        "temperature": 0.9,
        "seed": seed,
    })
}

/// The same text as the greedy reference, for settings that must not change it.
fn same_as_greedy(
    c: &Ctx,
    ev: &mut crate::case::Evidence,
    body: Value,
    what: &str,
) -> Result<String, Stop> {
    let (_, greedy) = explain(c)?;
    let v = c.target.chat(&body)?;
    let got = text_of(&v)?;
    ev.put("greedy", greedy.clone());
    ev.put("observed", got.clone());
    ensure!(
        got == greedy,
        format!("{what}: the greedy (temperature 0) text {greedy:?}"),
        got
    );
    Ok(format!("{what}: same text as greedy"))
}

/// `field` at 2 must change the greedy answer to [`REPETITIVE`].
fn penalty_changes_answer(c: &Ctx, ev: &mut Evidence, field: &str) -> Result<String, Stop> {
    let plain = text_of(&reference(c, CHAT, &chat_body(REPETITIVE, 12))?)?;
    let pen = text_of(
        &c.target
            .chat(&with(chat_body(REPETITIVE, 12), field, json!(2)))?,
    )?;
    ev.put("plain", plain.clone());
    ev.put("penalised", pen.clone());
    ensure!(
        plain != pen,
        "a different answer",
        format!("both {plain:?}")
    );
    Ok(format!("{plain:?} → {pen:?}"))
}

pub fn register(r: &mut Registry) {
    // ---- shape ----
    r.add(
        G,
        "chat.shape.one_choice",
        "An answer holds exactly one choice",
        "choices has one element with index 0",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("choices", v["choices"].clone());
            ensure_eq!(
                "choices length",
                v["choices"].as_array().map(Vec::len),
                Some(1)
            );
            ensure_eq!("choices[0].index", v["choices"][0]["index"], json!(0));
            Ok("one choice, index 0".into())
        },
    );
    r.add(
        G,
        "chat.shape.assistant_role",
        "The answer's message comes from the assistant",
        "message.role \"assistant\"",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("message", v["choices"][0]["message"].clone());
            ensure_eq!(
                "message.role",
                v["choices"][0]["message"]["role"],
                json!("assistant")
            );
            Ok("role assistant".into())
        },
    );
    r.add(
        G,
        "chat.shape.content_nonempty",
        "The answer has text",
        "message.content is a non-empty string",
        |c, ev| {
            let (_, t) = explain(c)?;
            ev.put("content", t.clone());
            ensure!(!t.is_empty(), "non-empty content", "empty");
            Ok(format!("{} chars", t.chars().count()))
        },
    );
    r.add(
        G,
        "chat.shape.finish_reason_valid",
        "finish_reason is stop or length",
        "finish_reason ∈ {stop, length}",
        |c, ev| {
            let (v, _) = explain(c)?;
            let f = finish_of(&v);
            ev.put("finish_reason", f.clone());
            ensure!(f == "stop" || f == "length", "stop or length", f);
            Ok(format!("finish_reason {f}"))
        },
    );
    r.add(
        G,
        "chat.shape.logprobs_null",
        "logprobs is present and null",
        "choices[0].logprobs == null (key present)",
        |c, ev| {
            let (v, _) = explain(c)?;
            let choice = &v["choices"][0];
            ev.put(
                "choice_keys",
                json!(choice
                    .as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>())),
            );
            ensure!(
                choice
                    .as_object()
                    .is_some_and(|o| o.get("logprobs") == Some(&Value::Null)),
                "logprobs: null",
                choice.to_string()
            );
            Ok("logprobs null".into())
        },
    );

    // ---- roles ----
    r.add(G, "chat.role.system_accepted", "A system message before the user's is served", "200 with text", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok(format!("served: {:?}", text_of(&v)?))
    });
    r.add(G, "chat.role.developer_is_system", "The developer role is the system role", "developer and system messages give the same greedy text", |c, ev| {
        let sys = c.target.chat(&messages(json!([{"role": "system", "content": "Always answer in French."}, {"role": "user", "content": "What is the capital of Italy?"}]), 12))?;
        let dev = c.target.chat(&messages(json!([{"role": "developer", "content": "Always answer in French."}, {"role": "user", "content": "What is the capital of Italy?"}]), 12))?;
        let (a, b) = (text_of(&sys)?, text_of(&dev)?);
        ev.put("system", a.clone());
        ev.put("developer", b.clone());
        ensure!(a == b, format!("developer text equal to system text {a:?}"), b);
        Ok("same text".into())
    });
    r.add(G, "chat.role.assistant_history", "A conversation with an assistant turn is served", "user/assistant/user → 200", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
    r.add(G, "chat.role.tool_accepted", "A tool message is accepted", "a tool turn after the user's → 200", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "What is 6 x 7?"}, {"role": "tool", "content": "42"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
    r.add(G, "chat.role.content_parts_joined", "Text parts are joined into one message", "[{type:text},{type:text}] gives the same greedy text as the joined string", |c, ev| {
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "Explain in three sentences"}, {"type": "text", "text": " why the sky is blue."}]}]);
        let r = same_as_greedy(c, ev, messages(parts, N), "text parts")?;
        Ok(r)
    });
    r.add(G, "chat.role.assistant_null_content", "An assistant turn with null content is accepted", "200", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": null}, {"role": "user", "content": "Hello?"}]), 2))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
    r.add(
        G,
        "chat.role.empty_user_content",
        "An empty user message is served",
        "200, prompt_tokens > 0 (the template's own tokens)",
        |c, ev| {
            let v = c.target.chat(&chat_body("", 2))?;
            let p = u64_at(&v, "/usage/prompt_tokens")?;
            ev.put("usage", v["usage"].clone());
            ensure!(p > 0, "prompt_tokens > 0", p.to_string());
            Ok(format!("prompt_tokens {p}"))
        },
    );

    // ---- the chat template ----
    r.add(G, "chat.template.system_steers", "A system prompt reaches the model", "a French-only system prompt changes the greedy answer", |c, ev| {
        let q = "What is the capital of Italy?";
        let plain = text_of(&c.target.chat(&chat_body(q, 12))?)?;
        let steered = text_of(&c.target.chat(&messages(json!([{"role": "system", "content": "Always answer in French."}, {"role": "user", "content": q}]), 12))?)?;
        ev.put("without_system", plain.clone());
        ev.put("with_system", steered.clone());
        ensure!(plain != steered, "a different answer with the system prompt", format!("both {plain:?}"));
        Ok(format!("{plain:?} → {steered:?}"))
    });
    r.add(
        G,
        "chat.template.history_reaches_model",
        "Earlier turns reach the model",
        "the answer after a history differs from the answer without it",
        |c, ev| {
            let single = text_of(&c.target.chat(&chat_body("What is my name?", 12))?)?;
            let multi = text_of(&c.target.chat(&messages(
                json!([
            {"role": "user", "content": "My name is Zorblax."},
            {"role": "assistant", "content": "Nice to meet you, Zorblax!"},
            {"role": "user", "content": "What is my name?"}]),
                12,
            ))?)?;
            ev.put("without_history", single.clone());
            ev.put("with_history", multi.clone());
            ensure!(
                single != multi,
                "different answers",
                format!("both {single:?}")
            );
            Ok(format!(
                "history used (mentions Zorblax: {})",
                multi.contains("Zorblax")
            ))
        },
    );
    r.add(
        G,
        "chat.template.history_costs_tokens",
        "Every turn is rendered into the prompt",
        "prompt_tokens with two more turns ≥ single-turn prompt_tokens + 10",
        |c, ev| {
            let single = c.target.chat(&chat_body("What is my name?", 1))?;
            let multi = c.target.chat(&messages(
                json!([
            {"role": "user", "content": "My name is Zorblax."},
            {"role": "assistant", "content": "Nice to meet you, Zorblax!"},
            {"role": "user", "content": "What is my name?"}]),
                1,
            ))?;
            let (a, b) = (
                u64_at(&single, "/usage/prompt_tokens")?,
                u64_at(&multi, "/usage/prompt_tokens")?,
            );
            ev.put("single", a);
            ev.put("multi", b);
            ensure!(b >= a + 10, format!("≥ {}", a + 10), b.to_string());
            Ok(format!("{a} → {b} prompt tokens"))
        },
    );
    r.add(
        G,
        "chat.template.longer_prompt_more_tokens",
        "A longer message costs more prompt tokens",
        "prompt_tokens(\"Hi\") < prompt_tokens(a sentence)",
        |c, ev| {
            let a = u64_at(&c.target.chat(&chat_body("Hi", 1))?, "/usage/prompt_tokens")?;
            let b = u64_at(
                &c.target.chat(&chat_body(
                    "Hi there, how are you doing on this fine day?",
                    1,
                ))?,
                "/usage/prompt_tokens",
            )?;
            ev.put("short", a);
            ev.put("long", b);
            ensure!(b > a, format!("> {a}"), b.to_string());
            Ok(format!("{a} < {b}"))
        },
    );
    r.add(G, "chat.template.trailing_assistant_turn", "A conversation ending with an assistant turn is served", "200 with text", |c, ev| {
        let v = c.target.chat(&messages(json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! The weather"}]), 4))?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });

    // ---- determinism ----
    r.add(
        G,
        "chat.determinism.temp0_repeat",
        "Temperature 0 repeats itself",
        "two identical requests give the same text",
        |c, ev| {
            let (_, a) = explain(c)?;
            let b = text_of(&c.target.chat(&chat_body(EXPLAIN, N))?)?;
            ev.put("first", a.clone());
            ev.put("second", b.clone());
            ensure!(a == b, format!("{a:?}"), b);
            Ok("identical".into())
        },
    );
    r.add(
        G,
        "chat.determinism.temp0_ignores_seed",
        "Temperature 0 does not depend on the seed",
        "seeds 1 and 2 give the greedy text",
        |c, ev| {
            let (_, greedy) = explain(c)?;
            for seed in [1, 2] {
                let got = text_of(&c.target.chat(&with(
                    chat_body(EXPLAIN, N),
                    "seed",
                    json!(seed),
                ))?)?;
                ev.put(&format!("seed_{seed}"), got.clone());
                ensure!(got == greedy, format!("seed {seed}: {greedy:?}"), got);
            }
            Ok("seed-independent".into())
        },
    );
    r.add(
        G,
        "chat.determinism.batch_invariant",
        "Concurrent identical requests match the solo answer",
        "3 parallel requests each give the greedy text",
        |c, ev| {
            let (_, greedy) = explain(c)?;
            let texts: Vec<Result<String, Stop>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..3)
                    .map(|_| s.spawn(|| text_of(&c.target.chat(&chat_body(EXPLAIN, N))?)))
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(Stop::fail("request thread", "panicked")))
                    })
                    .collect()
            });
            for (i, t) in texts.into_iter().enumerate() {
                let t = t?;
                ev.put(&format!("parallel_{i}"), t.clone());
                ensure!(t == greedy, format!("parallel {i}: {greedy:?}"), t);
            }
            Ok("3/3 identical".into())
        },
    );
    r.add(
        G,
        "chat.determinism.prefix_consistent",
        "A shorter limit gives a prefix of the longer answer",
        "text(max_tokens 6) is a prefix of text(max_tokens 16)",
        |c, ev| {
            let (_, long) = explain(c)?;
            let short = text_of(&c.target.chat(&chat_body(EXPLAIN, 6))?)?;
            ev.put("short", short.clone());
            ev.put("long", long.clone());
            ensure!(
                long.starts_with(&short),
                format!("a prefix of {long:?}"),
                short
            );
            Ok(format!("{short:?} ⊑ long"))
        },
    );

    // ---- seeds ----
    r.add(
        G,
        "chat.seed.same_seed_same_text",
        "A seed reproduces sampled text",
        "temperature 0.9, seed 42 twice → same text",
        |c, ev| {
            let a = text_of(&c.target.chat(&sampled(json!(42)))?)?;
            let b = text_of(&c.target.chat(&sampled(json!(42)))?)?;
            ev.put("texts", json!([a, b]));
            ensure!(a == b, format!("{a:?}"), b);
            Ok("reproduced".into())
        },
    );
    r.add(
        G,
        "chat.seed.seeds_differ",
        "Different seeds sample different texts",
        "seeds 1–4 at temperature 0.9 do not all agree",
        |c, ev| {
            let mut texts = Vec::new();
            for seed in 1..=4 {
                texts.push(text_of(&c.target.chat(&sampled(json!(seed)))?)?);
            }
            ev.put("texts", json!(texts));
            ensure!(
                texts.iter().any(|t| *t != texts[0]),
                "at least two different texts",
                format!("all {:?}", texts[0])
            );
            Ok("seeds vary the sample".into())
        },
    );
    r.add(
        G,
        "chat.seed.negative_seed",
        "A negative seed is accepted and reproducible",
        "seed -7 twice → 200, same text",
        |c, ev| {
            let a = text_of(&c.target.chat(&sampled(json!(-7)))?)?;
            let b = text_of(&c.target.chat(&sampled(json!(-7)))?)?;
            ev.put("texts", json!([a, b]));
            ensure!(a == b, format!("{a:?}"), b);
            Ok("reproduced".into())
        },
    );
    r.add(
        G,
        "chat.seed.large_seed",
        "A seed beyond 32 bits is accepted and reproducible",
        "seed 2^40+3 twice → 200, same text",
        |c, ev| {
            let seed = json!((1u64 << 40) + 3);
            let a = text_of(&c.target.chat(&sampled(seed.clone()))?)?;
            let b = text_of(&c.target.chat(&sampled(seed))?)?;
            ev.put("texts", json!([a, b]));
            ensure!(a == b, format!("{a:?}"), b);
            Ok("reproduced".into())
        },
    );

    // ---- sampling filters ----
    r.add(G, "chat.sampling.top_k_one_is_greedy", "top_k 1 keeps only the best token", "temperature 1, top_k 1 → the greedy text", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": EXPLAIN}], "max_tokens": N, "temperature": 1, "top_k": 1, "seed": 5});
        same_as_greedy(c, ev, body, "top_k 1")
    });
    r.add(G, "chat.sampling.top_p_tiny_is_greedy", "A tiny top_p keeps only the best token", "temperature 1, top_p 0.0001 → the greedy text", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": EXPLAIN}], "max_tokens": N, "temperature": 1, "top_p": 0.0001, "seed": 5});
        same_as_greedy(c, ev, body, "top_p 0.0001")
    });
    r.add(G, "chat.sampling.min_p_one_is_greedy", "min_p 1 keeps only the best token", "temperature 1, min_p 1 → the greedy text", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": EXPLAIN}], "max_tokens": N, "temperature": 1, "min_p": 1.0, "seed": 5});
        same_as_greedy(c, ev, body, "min_p 1")
    });
    r.add(
        G,
        "chat.sampling.top_p_one_accepted",
        "top_p 1 is accepted and changes nothing at temperature 0",
        "200, the greedy text",
        |c, ev| {
            same_as_greedy(
                c,
                ev,
                with(chat_body(EXPLAIN, N), "top_p", json!(1)),
                "top_p 1",
            )
        },
    );
    r.add(
        G,
        "chat.sampling.top_k_zero_disabled",
        "top_k 0 means no top-k filter",
        "200, the greedy text at temperature 0",
        |c, ev| {
            same_as_greedy(
                c,
                ev,
                with(chat_body(EXPLAIN, N), "top_k", json!(0)),
                "top_k 0",
            )
        },
    );
    r.add(G, "chat.sampling.temperature_two_accepted", "Temperature 2 (the maximum) is accepted", "200 with completion_tokens ≥ 1", |c, ev| {
        let v = c.target.chat(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 2, "seed": 3}))?;
        ev.put("usage", v["usage"].clone());
        ensure!(u64_at(&v, "/usage/completion_tokens")? >= 1, "≥ 1 token", v["usage"].to_string());
        Ok("served at temperature 2".into())
    });
    r.add(
        G,
        "chat.sampling.null_temperature_default",
        "A null temperature means the default",
        "temperature null → 200",
        |c, ev| {
            let v = c
                .target
                .chat(&with(chat_body("Hi", 2), "temperature", Value::Null))?;
            ev.put("content", text_of(&v)?);
            Ok("served".into())
        },
    );

    // ---- penalties ----
    r.add(
        G,
        "chat.penalty.frequency_changes_repetition",
        "frequency_penalty discourages repeats",
        "frequency_penalty 2 changes the greedy answer to a repetitive prompt",
        |c, ev| penalty_changes_answer(c, ev, "frequency_penalty"),
    );
    r.add(
        G,
        "chat.penalty.presence_changes_repetition",
        "presence_penalty discourages repeats",
        "presence_penalty 2 changes the greedy answer to a repetitive prompt",
        |c, ev| penalty_changes_answer(c, ev, "presence_penalty"),
    );
    r.add(G, "chat.penalty.negative_accepted", "Negative penalties (−2) are accepted", "200", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": REPETITIVE}], "max_tokens": 4, "temperature": 0, "frequency_penalty": -2, "presence_penalty": -2});
        let v = c.target.chat(&body)?;
        ev.put("content", text_of(&v)?);
        Ok("served".into())
    });
    r.add(G, "chat.penalty.zero_is_default", "Explicit zero penalties change nothing", "the greedy text", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": EXPLAIN}], "max_tokens": N, "temperature": 0, "frequency_penalty": 0, "presence_penalty": 0});
        same_as_greedy(c, ev, body, "zero penalties")
    });

    // ---- stop sequences ----
    r.add(
        G,
        "chat.stop.single_string",
        "A stop string ends the answer just before it",
        "text = the greedy text up to the stop, finish_reason stop",
        |c, ev| {
            let (_, free) = explain(c)?;
            let (stop, before) = pick_stop(&free)?;
            let v = c
                .target
                .chat(&with(chat_body(EXPLAIN, N), "stop", json!(stop)))?;
            let t = text_of(&v)?;
            ev.put("stop", stop.clone());
            ev.put("text", t.clone());
            ensure_eq!("text", t, before);
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            Ok(format!("stopped before {stop:?}"))
        },
    );
    r.add(
        G,
        "chat.stop.list_of_one",
        "A one-element stop list works like a string",
        "text = the greedy text up to the stop",
        |c, ev| {
            let (_, free) = explain(c)?;
            let (stop, before) = pick_stop(&free)?;
            let v = c
                .target
                .chat(&with(chat_body(EXPLAIN, N), "stop", json!([stop])))?;
            let t = text_of(&v)?;
            ev.put("text", t.clone());
            ensure_eq!("text", t, before);
            Ok(format!("stopped before {stop:?}"))
        },
    );
    r.add(
        G,
        "chat.stop.earliest_of_many",
        "Of several stops, the earliest in the text wins",
        "stops [later, earlier] cut before the earlier one",
        |c, ev| {
            let (_, free) = explain(c)?;
            let (early, before) = pick_stop(&free)?;
            let rest = &free[before.len() + early.len()..];
            let (late, _) =
                pick_stop(rest).or_else(|_| Ok::<_, Stop>((" zzqx".to_string(), String::new())))?;
            let cut = [&late, &early]
                .iter()
                .filter_map(|s| free.find(s.as_str()))
                .min()
                .unwrap_or(before.len());
            let v = c
                .target
                .chat(&with(chat_body(EXPLAIN, N), "stop", json!([late, early])))?;
            let t = text_of(&v)?;
            ev.put("stops", json!([late, early]));
            ev.put("text", t.clone());
            ensure_eq!("text", t, free[..cut].to_string());
            Ok("cut at the earliest stop".into())
        },
    );
    r.add(
        G,
        "chat.stop.never_leaks",
        "The stop text never appears in the answer",
        "content does not contain the stop",
        |c, ev| {
            let (_, free) = explain(c)?;
            let (stop, _) = pick_stop(&free)?;
            let t = text_of(
                &c.target
                    .chat(&with(chat_body(EXPLAIN, N), "stop", json!(stop)))?,
            )?;
            ev.put("text", t.clone());
            ensure!(!t.contains(&stop), format!("no {stop:?} in the text"), t);
            Ok("no leak".into())
        },
    );
    r.add(
        G,
        "chat.stop.across_tokens",
        "A stop spanning a token boundary is caught",
        "a stop made of the end of one word, a space and the start of the next cuts there",
        |c, ev| {
            let (_, free) = explain(c)?;
            let words: Vec<&str> = free.split(' ').collect();
            let i = (2..words.len().saturating_sub(1))
                .find(|&i| {
                    words[i].len() >= 4
                        && words[i].chars().all(char::is_alphabetic)
                        && words[i + 1].len() >= 3
                        && words[i + 1].is_ascii()
                })
                .ok_or_else(|| Stop::fail("two long words in the reference", free.clone()))?;
            let w = words[i];
            let stop = format!("{} {}", &w[w.len() - 2..], &words[i + 1][..2]);
            let at = free
                .find(&stop)
                .ok_or_else(|| Stop::fail(format!("{stop:?} in the reference"), free.clone()))?;
            let v = c
                .target
                .chat(&with(chat_body(EXPLAIN, N), "stop", json!(stop)))?;
            let t = text_of(&v)?;
            ev.put("stop", stop.clone());
            ev.put("text", t.clone());
            ensure_eq!("text", t, free[..at].to_string());
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            Ok(format!("cut before {stop:?}"))
        },
    );
    r.add(
        G,
        "chat.stop.absent_changes_nothing",
        "A stop that never occurs changes nothing",
        "the greedy text and finish_reason",
        |c, ev| {
            let (v0, _) = explain(c)?;
            let r = same_as_greedy(
                c,
                ev,
                with(chat_body(EXPLAIN, N), "stop", json!("<<never-occurs>>")),
                "absent stop",
            )?;
            let v = c.target.chat(&with(
                chat_body(EXPLAIN, N),
                "stop",
                json!("<<never-occurs>>"),
            ))?;
            ensure_eq!("finish_reason", finish_of(&v), finish_of(&v0));
            Ok(r)
        },
    );
    r.add(
        G,
        "chat.stop.at_first_char",
        "A stop matching the first character gives an empty answer",
        "content \"\", finish_reason stop",
        |c, ev| {
            let (_, free) = explain(c)?;
            let first = free
                .chars()
                .next()
                .ok_or_else(|| Stop::fail("a non-empty reference", "empty"))?
                .to_string();
            let v = c
                .target
                .chat(&with(chat_body(EXPLAIN, N), "stop", json!(first)))?;
            ev.put("stop", first.clone());
            ev.put("response", v["choices"].clone());
            ensure_eq!("content", text_of(&v)?, "");
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            Ok("empty answer".into())
        },
    );
    r.add(
        G,
        "chat.stop.sixteen_accepted",
        "Sixteen stop sequences (the maximum) are accepted",
        "200, the greedy text when none occurs",
        |c, ev| {
            let stops: Vec<String> = (0..16).map(|i| format!("<<never-{i}>>")).collect();
            same_as_greedy(
                c,
                ev,
                with(chat_body(EXPLAIN, N), "stop", json!(stops)),
                "16 stops",
            )
        },
    );
    r.add(
        G,
        "chat.stop.usage_counts_fewer",
        "A stopped answer counts fewer completion tokens",
        "completion_tokens below the unstopped answer's",
        |c, ev| {
            let (v0, free) = explain(c)?;
            let (stop, _) = pick_stop(&free)?;
            let v = c
                .target
                .chat(&with(chat_body(EXPLAIN, N), "stop", json!(stop)))?;
            let (a, b) = (
                u64_at(&v0, "/usage/completion_tokens")?,
                u64_at(&v, "/usage/completion_tokens")?,
            );
            ev.put("unstopped", a);
            ev.put("stopped", b);
            ensure!(b < a, format!("< {a}"), b.to_string());
            Ok(format!("{b} < {a}"))
        },
    );

    // ---- length ----
    r.add(
        G,
        "chat.max_tokens.length_finish",
        "max_tokens ends a long answer with length",
        "max_tokens 5 → 5 completion tokens, finish_reason length",
        |c, ev| {
            let v = c
                .target
                .chat(&chat_body("Write a long story about a dragon.", 5))?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                u64_at(&v, "/usage/completion_tokens")?,
                5
            );
            ensure_eq!("finish_reason", finish_of(&v), "length");
            Ok("5 tokens, length".into())
        },
    );
    r.add(
        G,
        "chat.max_tokens.one",
        "max_tokens 1 gives one token",
        "1 completion token, finish_reason length",
        |c, ev| {
            let v = c
                .target
                .chat(&chat_body("Write a long story about a dragon.", 1))?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                u64_at(&v, "/usage/completion_tokens")?,
                1
            );
            ensure_eq!("finish_reason", finish_of(&v), "length");
            Ok("1 token".into())
        },
    );
    r.add(G, "chat.max_completion_tokens.honoured", "max_completion_tokens limits the answer", "max_completion_tokens 3 → 3 tokens, length", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_completion_tokens": 3, "temperature": 0});
        let v = c.target.chat(&body)?;
        ev.put("usage", v["usage"].clone());
        ensure_eq!("completion_tokens", u64_at(&v, "/usage/completion_tokens")?, 3);
        ensure_eq!("finish_reason", finish_of(&v), "length");
        Ok("3 tokens".into())
    });
    r.add(G, "chat.max_completion_tokens.wins", "max_completion_tokens wins over max_tokens", "max_tokens 6 with max_completion_tokens 3 → 3 tokens", |c, ev| {
        let body = json!({"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 6, "max_completion_tokens": 3, "temperature": 0});
        let v = c.target.chat(&body)?;
        ev.put("usage", v["usage"].clone());
        ensure_eq!("completion_tokens", u64_at(&v, "/usage/completion_tokens")?, 3);
        Ok("3 tokens".into())
    });
    r.add(
        G,
        "chat.max_tokens.absent_runs_to_eos",
        "Without max_tokens the answer runs to end-of-text",
        "a short-answer prompt finishes with stop, well inside the context",
        |c, ev| {
            let v = c.target.chat(
                &json!({"messages": [{"role": "user", "content": "Say OK."}], "temperature": 0}),
            )?;
            ev.put("usage", v["usage"].clone());
            ev.put("content", text_of(&v)?);
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            Ok(format!("{} tokens, stop", v["usage"]["completion_tokens"]))
        },
    );
    r.add(
        G,
        "chat.max_tokens.stop_before_limit",
        "An answer that ends early says stop, not length",
        "max_tokens 64 on a short-answer prompt → stop with fewer than 64 tokens",
        |c, ev| {
            let v = c.target.chat(&chat_body("Say OK.", 64))?;
            let n = u64_at(&v, "/usage/completion_tokens")?;
            ev.put("usage", v["usage"].clone());
            ensure_eq!("finish_reason", finish_of(&v), "stop");
            ensure!(n < 64, "< 64 tokens", n.to_string());
            Ok(format!("{n} tokens, stop"))
        },
    );

    // ---- usage ----
    r.add(
        G,
        "chat.usage.total_adds_up",
        "total_tokens = prompt_tokens + completion_tokens",
        "the sum holds",
        |c, ev| {
            let (v, _) = explain(c)?;
            let u = &v["usage"];
            ev.put("usage", u.clone());
            let (p, q, t) = (
                u64_at(&v, "/usage/prompt_tokens")?,
                u64_at(&v, "/usage/completion_tokens")?,
                u64_at(&v, "/usage/total_tokens")?,
            );
            ensure_eq!("total_tokens", t, p + q);
            Ok(format!("{p} + {q} = {t}"))
        },
    );
    r.add(
        G,
        "chat.usage.completion_within_max",
        "completion_tokens never exceeds max_tokens",
        "1 ≤ completion_tokens ≤ max_tokens (16)",
        |c, ev| {
            let (v, _) = explain(c)?;
            let q = u64_at(&v, "/usage/completion_tokens")?;
            ev.put("completion_tokens", q);
            ensure!(
                (1..=N as u64).contains(&q),
                format!("1..={N}"),
                q.to_string()
            );
            Ok(format!("{q} ≤ {N}"))
        },
    );
    r.add(
        G,
        "chat.usage.prompt_stable",
        "The same messages cost the same prompt tokens",
        "prompt_tokens equal across two requests",
        |c, ev| {
            let a = u64_at(
                &c.target.chat(&chat_body(EXPLAIN, 1))?,
                "/usage/prompt_tokens",
            )?;
            let b = u64_at(
                &c.target.chat(&chat_body(EXPLAIN, 1))?,
                "/usage/prompt_tokens",
            )?;
            ev.put("prompt_tokens", json!([a, b]));
            ensure_eq!("prompt_tokens", b, a);
            Ok(format!("{a} both times"))
        },
    );
    r.add(
        G,
        "chat.usage.completion_is_predicted_n",
        "usage and timings agree on generated tokens",
        "timings.predicted_n == usage.completion_tokens",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("usage", v["usage"].clone());
            ev.put("timings", v["timings"].clone());
            ensure_eq!(
                "predicted_n",
                u64_at(&v, "/timings/predicted_n")?,
                u64_at(&v, "/usage/completion_tokens")?
            );
            Ok("agree".into())
        },
    );
    r.add(
        G,
        "chat.usage.prompt_is_prompt_n",
        "usage and timings agree on prompt tokens",
        "timings.prompt_n == usage.prompt_tokens",
        |c, ev| {
            let (v, _) = explain(c)?;
            ev.put("timings", v["timings"].clone());
            ensure_eq!(
                "prompt_n",
                u64_at(&v, "/timings/prompt_n")?,
                u64_at(&v, "/usage/prompt_tokens")?
            );
            Ok("agree".into())
        },
    );

    // ---- timings ----
    r.add(G, "chat.timings.present", "Every answer carries llama-server style timings", "timings has queue_ms, prompt_n, prompt_ms, prompt_per_second, predicted_n, predicted_ms, predicted_per_second as numbers", |c, ev| {
        let (v, _) = explain(c)?;
        ev.put("timings", v["timings"].clone());
        for k in ["queue_ms", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"] {
            f64_at(&v, &format!("/timings/{k}"))?;
        }
        Ok("all present".into())
    });
    r.add(
        G,
        "chat.timings.nonnegative",
        "Timings are finite and not negative",
        "every timings value ≥ 0; prompt_ms > 0",
        |c, ev| {
            let (v, _) = explain(c)?;
            let t = v["timings"].as_object().cloned().unwrap_or_default();
            ev.put("timings", v["timings"].clone());
            for (k, x) in &t {
                let x = x
                    .as_f64()
                    .ok_or_else(|| Stop::fail(format!("timings.{k} a number"), x.to_string()))?;
                ensure!(
                    x.is_finite() && x >= 0.0,
                    format!("timings.{k} ≥ 0"),
                    x.to_string()
                );
            }
            ensure!(
                f64_at(&v, "/timings/prompt_ms")? > 0.0,
                "prompt_ms > 0",
                v["timings"].to_string()
            );
            Ok(format!("{} values ≥ 0", t.len()))
        },
    );
    r.add(
        G,
        "chat.timings.rate_formula",
        "Decode rate matches tokens over time",
        "predicted_per_second = (predicted_n − 1 or predicted_n) / predicted_ms × 1000 within 2%",
        |c, ev| {
            let v = c
                .target
                .chat(&chat_body("Write a long story about a dragon.", 12))?;
            ev.put("timings", v["timings"].clone());
            let n = f64_at(&v, "/timings/predicted_n")?;
            let ms = f64_at(&v, "/timings/predicted_ms")?;
            let rate = f64_at(&v, "/timings/predicted_per_second")?;
            ensure!(
                n >= 2.0 && ms > 0.0,
                "≥ 2 tokens over > 0 ms",
                v["timings"].to_string()
            );
            let fits = |k: f64| (rate - k / ms * 1000.0).abs() <= 0.02 * rate.max(1e-9);
            ensure!(
                fits(n - 1.0) || fits(n),
                format!(
                    "{:.2} or {:.2} tok/s",
                    (n - 1.0) / ms * 1000.0,
                    n / ms * 1000.0
                ),
                format!("{rate:.2} tok/s")
            );
            Ok(format!("{rate:.1} tok/s consistent"))
        },
    );
    r.add(
        G,
        "chat.timings.ttft_consistent",
        "Time to first token covers the queue and the prompt and fits the wall time",
        "queue_ms ≤ ttft_ms, prompt_ms ≤ ttft_ms, ttft_ms ≤ the client's wall time",
        |c, ev| {
            let t0 = Instant::now();
            let v = c.target.chat(&chat_body(EXPLAIN, 4))?;
            let wall = t0.elapsed().as_secs_f64() * 1000.0;
            ev.put("timings", v["timings"].clone());
            ev.put("client_wall_ms", wall);
            let ttft = match v["timings"]["ttft_ms"].as_f64() {
                Some(x) => x,
                None => return Err(Stop::skip("this daemon's timings have no ttft_ms")),
            };
            let (q, p) = (
                f64_at(&v, "/timings/queue_ms")?,
                f64_at(&v, "/timings/prompt_ms")?,
            );
            ensure!(
                q <= ttft + 0.01 && p <= ttft + 0.01,
                format!("queue_ms {q:.1} and prompt_ms {p:.1} ≤ ttft_ms"),
                format!("ttft_ms {ttft:.1}")
            );
            ensure!(
                ttft <= wall + 1.0,
                format!("ttft_ms ≤ wall {wall:.1} ms"),
                format!("{ttft:.1}")
            );
            Ok(format!("ttft {ttft:.1} ms of {wall:.1} ms wall"))
        },
    );
}
