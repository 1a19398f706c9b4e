//! `chat` cases: temperature-0 determinism, seeds, sampling filters and penalties.

use super::*;

pub(super) fn register(r: &mut Registry) {
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
}
