//! `load` cases: cancellation: a client that leaves gives its slot back.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- cancellation ----
    r.add(
        G,
        "load.cancel.stream_frees_slot",
        "A dropped stream gives its slot to the next request",
        "the follow-up's queue_ms < 2000",
        |c, ev| {
            let k = cancelled(c, true)?;
            let q = k.follow_up["timings"]["queue_ms"]
                .as_f64()
                .unwrap_or(f64::MAX);
            ev.put("follow_up_timings", k.follow_up["timings"].clone());
            ensure!(q < 2000.0, "< 2000 ms in the queue", format!("{q} ms"));
            Ok(format!("follow-up waited {q:.1} ms"))
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.stream_counted",
        "A dropped stream is counted as cancelled",
        "inferloop_cancelled_total grows by 1",
        |c, ev| {
            let k = cancelled(c, true)?;
            let after = metric_of(&k.metrics_after, "inferloop_cancelled_total")?;
            ev.put("before", k.cancelled_before);
            ev.put("after", after);
            ensure_eq!("cancelled_total", after, k.cancelled_before + 1.0);
            Ok(format!("{} → {after}", k.cancelled_before))
        },
    )
    .fixture("cancel");
    r.add(G, "load.cancel.stream_stops_promptly", "A dropped stream stops within a few decode steps", "≤ 8 more tokens generated after the client disconnects (counted by inferloop_generated_tokens_total), then the slot is free", |c, ev| {
        let k = cancelled(c, true)?;
        ev.put("tokens_after_leaving", k.tokens_after_leaving);
        ev.put("freed_after_ms", k.freed_after.as_secs_f64() * 1000.0);
        ensure!(k.tokens_after_leaving <= 8.0, "≤ 8 tokens after the disconnect", format!("{} tokens over {:?}", k.tokens_after_leaving, k.freed_after));
        Ok(format!("{} tokens after the disconnect, slot free after {:?}", k.tokens_after_leaving, k.freed_after))
    }).fixture("cancel");
    r.add(
        G,
        "load.cancel.kv_released",
        "A dropped stream's KV cells are released",
        "kv.reserved 0 and no slot active afterwards",
        |c, ev| {
            let k = cancelled(c, true)?;
            ev.put("kv", k.status_after["kv"].clone());
            ensure_eq!("kv.reserved", k.status_after["kv"]["reserved"], json!(0));
            ensure_eq!("slots.active", k.status_after["slots"]["active"], json!(0));
            Ok("released".into())
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.plain_frees_slot",
        "A non-stream client that leaves gives its slot back",
        "after the client disconnects mid-generation, the follow-up's queue_ms < 2000",
        |c, ev| {
            let k = cancelled(c, false)?;
            let q = k.follow_up["timings"]["queue_ms"]
                .as_f64()
                .unwrap_or(f64::MAX);
            ev.put("follow_up_timings", k.follow_up["timings"].clone());
            ev.put("freed_after_ms", k.freed_after.as_secs_f64() * 1000.0);
            ensure!(q < 2000.0, "< 2000 ms", format!("{q} ms"));
            Ok(format!("follow-up waited {q:.1} ms"))
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.plain_counted",
        "A non-stream client that leaves is counted",
        "inferloop_cancelled_total grows by 1",
        |c, ev| {
            let k = cancelled(c, false)?;
            let after = metric_of(&k.metrics_after, "inferloop_cancelled_total")?;
            ev.put("before", k.cancelled_before);
            ev.put("after", after);
            ensure_eq!("cancelled_total", after, k.cancelled_before + 1.0);
            Ok(format!("{} → {after}", k.cancelled_before))
        },
    )
    .fixture("cancel");
    r.add(
        G,
        "load.cancel.waiter_leaves_queue",
        "A queued client that leaves is dropped from the queue",
        "queue.depth back to 0 after it disconnects",
        |c, ev| {
            let l = waiter_left(c)?;
            ev.put("queue", l.depth_after_leaving.clone());
            ensure_eq!("queue.depth", l.depth_after_leaving["depth"], json!(0));
            Ok("dropped".into())
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.cancel.queue_place_reusable",
        "The place it left is usable",
        "the next request waits (not 429) and is served 200",
        |c, ev| {
            let l = waiter_left(c)?;
            ev.put("next_status", json!(l.next_status));
            ensure!(
                l.next_was_queued,
                "the next request queued",
                "answered while the slot was busy"
            );
            ensure_eq!("next status", l.next_status, Some(200));
            Ok("queued, then 200".into())
        },
    )
    .fixture("queue1");
    r.add(
        G,
        "load.cancel.gauges_zero",
        "After cancellations the gauges read zero",
        "inferloop_active_slots 0 and inferloop_queue_depth 0",
        |c, ev| {
            let k = cancelled(c, false)?;
            let (a, q) = (
                metric_of(&k.metrics_after, "inferloop_active_slots")?,
                metric_of(&k.metrics_after, "inferloop_queue_depth")?,
            );
            ev.put("active_slots", a);
            ev.put("queue_depth", q);
            ensure!(a == 0.0 && q == 0.0, "0 and 0", format!("{a} and {q}"));
            Ok("0 and 0".into())
        },
    )
    .fixture("cancel");
}
