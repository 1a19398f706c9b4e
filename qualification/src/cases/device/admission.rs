//! `device` cases: thermal admission on a fake sysfs tree.

use super::*;

pub(super) fn register(r: &mut Registry) {
    // ---- thermal admission on a fake tree ----
    r.add(
        G,
        "device.admission.normal",
        "A cool board admits every slot",
        "gpu-thermal at 45.8 °C: state normal, max_active 2, requests served",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            let s = drive(&t, fx.path(), 45.8, "normal", 2)?;
            ev.put("thermal", s["thermal"]["state"].clone());
            t.complete(&counting(4, false))?;
            Ok("normal, 2 slots".into())
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.hot_halves",
        "A hot board admits half the slots",
        "75 °C (hot at 70): state hot, max_active 1, inferloop_thermal_state 1",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            let s = drive(&t, fx.path(), 75.0, "hot", 1)?;
            let m = t.metrics()?;
            ev.put(
                "thermal_state_metric",
                metric_of(&m, "inferloop_thermal_state")?,
            );
            ev.put("slots", s["slots"].clone());
            ensure_eq!(
                "inferloop_thermal_state",
                metric_of(&m, "inferloop_thermal_state")?,
                1.0
            );
            Ok("hot, 1 slot".into())
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.hot_queues_the_second",
        "While hot, a second request waits though a slot is idle",
        "one request decoding, the next queued (active 1, depth 1), then served",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 75.0, "hot", 1)?;
            let running = crate::cases::load::occupy(&t, 400)?;
            let second = {
                let t = t.clone();
                std::thread::spawn(move || t.complete(&counting(4, false)))
            };
            let s = t.wait_status(crate::target::SETTLE, "the second request queued", |s| {
                s["queue"]["depth"] == 1
            })?;
            ev.put("slots", s["slots"].clone());
            ensure_eq!("slots.active", s["slots"]["active"], json!(1));
            drop(running);
            let v = second
                .join()
                .unwrap_or_else(|_| Err(Stop::fail("thread", "panicked")))?;
            ev.put("second_timings", v["timings"].clone());
            Ok("queued, then served".into())
        },
    )
    .fixture("thermal")
    .heavy();
    r.add(
        G,
        "device.admission.critical_503",
        "A critical board refuses new requests",
        "95 °C (critical at 90): 503 overheated with Retry-After",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 95.0, "critical", 1)?;
            let resp = t.post("/v1/completions", &counting(4, false))?;
            ev.text("response", &resp.describe());
            let err = expect_error(&resp, 503, None, Some("overheated"))?;
            let ra = expect_retry_after(&resp)?;
            drive(&t, fx.path(), 45.8, "normal", 2)?;
            Ok(format!(
                "503 overheated, Retry-After {ra}: {}",
                err["message"]
            ))
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.hysteresis",
        "Critical is left only below threshold − hysteresis",
        "95 → 87 °C stays critical (87 > 90 − 5); 80 °C leaves it (hot)",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 95.0, "critical", 1)?;
            fixtures::set_gpu_celsius(fx.path(), 87.0)
                .map_err(|e| Stop::fail("write", e.to_string()))?;
            let s = t.wait_status(THERMAL_SETTLE, "87 °C read", |s| {
                s["thermal"]["snapshot"]["zones"]
                    .as_array()
                    .is_some_and(|zs| {
                        zs.iter()
                            .any(|z| z["name"] == "gpu-thermal" && z["celsius"] == 87.0)
                    })
            })?;
            std::thread::sleep(Duration::from_millis(THERMAL_INTERVAL_MS * 5));
            let s2 = t.status()?;
            ev.put(
                "at_87",
                json!([s["thermal"]["state"], s2["thermal"]["state"]]),
            );
            ensure_eq!("state at 87 °C", s2["thermal"]["state"], json!("critical"));
            let s3 = drive(&t, fx.path(), 80.0, "hot", 1)?;
            ev.put("at_80", s3["thermal"]["state"].clone());
            drive(&t, fx.path(), 45.8, "normal", 2)?;
            Ok("critical held at 87, left at 80".into())
        },
    )
    .fixture("thermal");
    r.add(
        G,
        "device.admission.recovers",
        "A board that cools down serves fully again",
        "critical → 40 °C: normal, max_active 2, requests served",
        |c, ev| {
            let (t, fx) = thermal_fixture(c)?;
            drive(&t, fx.path(), 95.0, "critical", 1)?;
            let s = drive(&t, fx.path(), 40.0, "normal", 2)?;
            ev.put("slots", s["slots"].clone());
            let v = t.complete(&counting(4, false))?;
            ensure_eq!(
                "completion_tokens",
                v["usage"]["completion_tokens"],
                json!(4)
            );
            Ok("normal, served".into())
        },
    )
    .fixture("thermal");
}
