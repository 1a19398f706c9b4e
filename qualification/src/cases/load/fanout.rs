//! `load` cases: fan-out across slots.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- fan-out across slots ----
    r.add(
        G,
        "load.fanout.all_slots_busy",
        "Long requests fan out over every slot",
        "with as many long requests as slots, /v1/status shows every slot active",
        |c, ev| {
            let f = fan_out(c)?;
            ev.put("status", f.status_full.clone());
            ensure_eq!(
                "slots.active",
                f.status_full["slots"]["active"].as_u64(),
                Some(f.slots)
            );
            Ok(format!("{} of {} slots active", f.slots, f.slots))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.fanout.extra_request_queued",
        "One request more than the slots waits in the queue",
        "queue.depth 1 while every slot is busy",
        |c, ev| {
            let f = fan_out(c)?;
            ev.put("status", f.status_queued.clone());
            ensure_eq!(
                "queue.depth",
                f.status_queued["queue"]["depth"].as_u64(),
                Some(1)
            );
            ensure_eq!(
                "slots.active",
                f.status_queued["slots"]["active"].as_u64(),
                Some(f.slots)
            );
            Ok("1 waiting".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.fanout.waiter_queue_ms",
        "The waiter reports its time in the queue",
        "timings.queue_ms of the request that waited ≥ the time the client held every slot \
         after seeing it queued (≥ 150 ms)",
        |c, ev| {
            let f = fan_out(c)?;
            let q = f.waiter["timings"]["queue_ms"].as_f64().unwrap_or(-1.0);
            ev.put("timings", f.waiter["timings"].clone());
            ev.put("held_ms", f.held_ms);
            ensure!(
                q >= f.held_ms,
                format!("≥ {:.0} ms (slots held after it queued)", f.held_ms),
                format!("{q} ms")
            );
            Ok(format!("waited {q:.0} ms, slots held {:.0} ms", f.held_ms))
        },
    )
    .exclusive();
    r.add(
        G,
        "load.fanout.waiter_served_after",
        "The waiter is served in full once a slot frees",
        "200 with completion_tokens = max_tokens (8) after the slots are released",
        |c, ev| {
            let f = fan_out(c)?;
            ev.put("usage", f.waiter["usage"].clone());
            ensure_eq!(
                "completion_tokens",
                f.waiter["usage"]["completion_tokens"],
                json!(8)
            );
            Ok("served in full".into())
        },
    )
    .exclusive();
    r.add(
        G,
        "load.status.active_plus_idle",
        "Slot accounting holds under load",
        "slots.active + slots.idle == slots.total in every sample during the burst",
        |c, ev| {
            let b = burst(c)?;
            ev.put("samples", b.statuses.len());
            for s in &b.statuses {
                let (a, i, t) = (
                    s["slots"]["active"].as_u64(),
                    s["slots"]["idle"].as_u64(),
                    s["slots"]["total"].as_u64(),
                );
                ensure!(
                    a.zip(i).map(|(a, i)| a + i) == t,
                    "active + idle = total",
                    s.to_string()
                );
            }
            ensure!(
                !b.statuses.is_empty(),
                "status samples during the burst",
                "none"
            );
            Ok(format!("{} samples consistent", b.statuses.len()))
        },
    )
    .exclusive()
    .inferloopd_only("/v1/status");
    r.add(
        G,
        "load.status.queue_bounded",
        "Queue and slots stay within their limits",
        "queue.depth ≤ capacity and active ≤ total in every sample; the queue was used",
        |c, ev| {
            let b = burst(c)?;
            let mut max_depth = 0;
            for s in &b.statuses {
                let (d, cap) = (
                    s["queue"]["depth"].as_u64().unwrap_or(u64::MAX),
                    s["queue"]["capacity"].as_u64().unwrap_or(0),
                );
                ensure!(d <= cap, format!("depth ≤ {cap}"), s.to_string());
                ensure!(
                    s["slots"]["active"].as_u64() <= s["slots"]["total"].as_u64(),
                    "active ≤ total",
                    s.to_string()
                );
                max_depth = max_depth.max(d);
            }
            ev.put("max_depth", max_depth);
            Ok(format!("max depth {max_depth}"))
        },
    )
    .exclusive();
}
