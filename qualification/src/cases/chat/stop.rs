//! `chat` cases: stop sequences.

use super::*;

pub(super) fn register(r: &mut Registry) {
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
}
