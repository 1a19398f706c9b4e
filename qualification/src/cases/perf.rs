//! `perf`: time to first token, decode speed, inter-token p99 and the 4-stream aggregate,
//! measured on an otherwise idle daemon and compared with the floors of the board profile.
//! A board without a floor skips the comparison and records the measured value.

use serde_json::{json, Value};

use super::percentile;
use crate::case::{Evidence, Group, Registry, Stop};
use crate::ctx::Ctx;
use crate::ensure;
use crate::sse::Capture;
use crate::target::{counting, metric_of, with};

const G: Group = Group::Perf;
const PATH: &str = "/v1/completions";
/// Single-stream runs, and tokens per run.
const RUNS: usize = 5;
const TOKENS: u32 = 32;
/// The model the board floors are written for.
pub const DEFAULT_MODEL_ID: &str = "SmolLM2-135M-Instruct.Q4_1";

/// One measured stream.
#[derive(Clone, Debug)]
struct Run {
    ttft_ms: f64,
    /// Client-side decode rate: tokens after the first over the time after the first.
    decode_tok_s: f64,
    gaps_ms: Vec<f64>,
    tokens: u64,
    timings: Value,
    /// Arrival of each content frame, on a clock shared by concurrent runs.
    arrivals: Vec<std::time::Instant>,
}

fn measure(cap: &Capture) -> Result<Run, Stop> {
    let times = cap.content_times();
    let (first, last) = match (times.first(), times.last()) {
        (Some(f), Some(l)) if times.len() >= 2 => (*f, *l),
        _ => {
            return Err(Stop::fail(
                "a stream with ≥ 2 content frames",
                cap.describe(),
            ))
        }
    };
    let gaps_ms: Vec<f64> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
        .collect();
    let span = (last - first).as_secs_f64();
    let timings = cap
        .choice_chunks()
        .last()
        .map(|c| c["timings"].clone())
        .unwrap_or_default();
    let tokens = cap
        .usage()
        .and_then(|u| u["completion_tokens"].as_u64())
        .unwrap_or(times.len() as u64);
    Ok(Run {
        ttft_ms: first.as_secs_f64() * 1000.0,
        decode_tok_s: if span > 0.0 {
            (times.len() - 1) as f64 / span
        } else {
            0.0
        },
        gaps_ms,
        tokens,
        timings,
        arrivals: cap
            .sent
            .map(|s| times.iter().map(|t| s + *t).collect())
            .unwrap_or_default(),
    })
}

fn body() -> Value {
    with(
        counting(TOKENS, true),
        "stream_options",
        json!({"include_usage": true}),
    )
}

/// Sequential single-stream runs with the metrics and RSS before and after.
#[derive(Clone)]
struct Single {
    runs: Vec<Run>,
    metrics_before: String,
    metrics_after: String,
    rss_before: Option<u64>,
    rss_after: Option<u64>,
}

fn single(c: &Ctx) -> Result<Single, Stop> {
    (*c.memo("perf single", || -> Result<Single, Stop> {
        let t = &c.target;
        // One warm-up so page faults of the first request do not count.
        t.stream_ok(PATH, &body())?;
        let rss_before = t.status()?["memory"]["rss_bytes"].as_u64();
        let metrics_before = t.metrics()?;
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            let cap = t.stream_ok(PATH, &body())?;
            let run = measure(&cap)?;
            c.samples.add(run.ttft_ms, &run.gaps_ms);
            runs.push(run);
        }
        let metrics_after = t.metrics()?;
        let rss_after = t.status()?["memory"]["rss_bytes"].as_u64();
        Ok(Single {
            runs,
            metrics_before,
            metrics_after,
            rss_before,
            rss_after,
        })
    }))
    .clone()
}

/// Four concurrent streams.
#[derive(Clone)]
struct Aggregate {
    runs: Vec<Run>,
    wall_ms: f64,
    tok_s: f64,
}

fn aggregate(c: &Ctx) -> Result<Aggregate, Stop> {
    (*c.memo("perf aggregate", || -> Result<Aggregate, Stop> {
        let t = &c.target;
        let started = std::time::Instant::now();
        let caps: Vec<Result<Capture, Stop>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| t.stream_ok(PATH, &body())))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Stop::fail("stream thread", "panicked")))
                })
                .collect()
        });
        let wall = started.elapsed().as_secs_f64();
        let mut runs = Vec::new();
        for cap in caps {
            let run = measure(&cap?)?;
            c.samples.add(run.ttft_ms, &run.gaps_ms);
            runs.push(run);
        }
        let tokens: u64 = runs.iter().map(|r| r.tokens).sum();
        Ok(Aggregate {
            runs,
            wall_ms: wall * 1000.0,
            tok_s: tokens as f64 / wall,
        })
    }))
    .clone()
}

fn median(v: &[f64]) -> f64 {
    percentile(v, 50.0).unwrap_or(f64::NAN)
}

/// The board whose floors apply, and that profile's floor `key` (absent: `None`).
fn floor(c: &Ctx, key: &str) -> Result<(String, Option<f64>), Stop> {
    let name = match c.target.status()?["board"]["name"].as_str() {
        Some(n) => n.to_string(),
        None => inferloop_board::Detector::new(inferloop_board::Roots::default())
            .detect()
            .map(|d| d.profile.name)
            .map_err(|e| Stop::skip(format!("no board detected ({e}), so no floors apply")))?,
    };
    let profile = inferloop_board::profile::find(&name)
        .map_err(|e| Stop::skip(format!("board {name} has no built-in profile ({e})")))?;
    let floors = serde_json::to_value(&profile.perf_floors).unwrap_or(Value::Null);
    Ok((name, floors.get(key).and_then(Value::as_f64)))
}

/// Compares `measured` with the board floor `key`: a maximum when `max`, else a minimum.
fn against_floor(
    c: &Ctx,
    ev: &mut Evidence,
    key: &str,
    measured: f64,
    unit: &str,
    max: bool,
) -> Result<String, Stop> {
    ev.put("measured", measured);
    ev.put("unit", unit);
    c.note_env(
        &format!("perf.{key}"),
        json!({"measured": measured, "unit": unit}),
    );
    if c.facts.model_id != DEFAULT_MODEL_ID {
        return Err(Stop::skip(format!(
            "board floors are for {DEFAULT_MODEL_ID}, not {}; measured {measured:.2} {unit}",
            c.facts.model_id
        )));
    }
    let (board, floor) = floor(c, key)?;
    ev.put("board", board.clone());
    let Some(floor) = floor else {
        return Err(Stop::skip(format!(
            "board profile {board} sets no `{key}` floor; measured {measured:.2} {unit}"
        )));
    };
    ev.put("floor", floor);
    let ok = if max {
        measured <= floor
    } else {
        measured >= floor
    };
    let rel = if max { "≤" } else { "≥" };
    ensure!(
        ok,
        format!("{rel} {floor} {unit} ({board} `{key}`)"),
        format!("{measured:.2} {unit}")
    );
    Ok(format!("{measured:.2} {unit} {rel} floor {floor}"))
}

pub fn register(r: &mut Registry) {
    r.add(
        G,
        "perf.floor.ttft_ms",
        "Time to first token meets the board floor",
        "median client TTFT over 5 single streams ≤ perf_floors.ttft_ms_max",
        |c, ev| {
            let s = single(c)?;
            let v: Vec<f64> = s.runs.iter().map(|r| r.ttft_ms).collect();
            ev.put("ttft_ms", json!(v));
            against_floor(c, ev, "ttft_ms_max", median(&v), "ms", true)
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.floor.decode_tok_s",
        "Decode speed meets the board floor",
        "median client decode rate of a single stream ≥ perf_floors.decode_tok_s_min",
        |c, ev| {
            let s = single(c)?;
            let v: Vec<f64> = s.runs.iter().map(|r| r.decode_tok_s).collect();
            ev.put("decode_tok_s", json!(v));
            against_floor(c, ev, "decode_tok_s_min", median(&v), "tok/s", false)
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.floor.inter_token_p99_ms",
        "Inter-token latency p99 meets the board floor",
        "p99 of the gaps between tokens ≤ perf_floors.inter_token_p99_ms_max",
        |c, ev| {
            let s = single(c)?;
            let gaps: Vec<f64> = s
                .runs
                .iter()
                .flat_map(|r| r.gaps_ms.iter().copied())
                .collect();
            ev.put("gaps", gaps.len());
            let p99 =
                percentile(&gaps, 99.0).ok_or_else(|| Stop::fail("inter-token gaps", "none"))?;
            ev.put("p50_ms", median(&gaps));
            against_floor(c, ev, "inter_token_p99_ms_max", p99, "ms", true)
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.floor.aggregate_tok_s",
        "Four concurrent streams meet the board's aggregate floor",
        "Σ tokens / wall time of 4 concurrent streams ≥ perf_floors.aggregate_tok_s_min",
        |c, ev| {
            let a = aggregate(c)?;
            ev.put("wall_ms", a.wall_ms);
            against_floor(c, ev, "aggregate_tok_s_min", a.tok_s, "tok/s", false)
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.ttft.client_covers_server",
        "The server's TTFT fits inside the client's",
        "for every run: client TTFT ≥ timings.ttft_ms − 1 ms",
        |c, ev| {
            let s = single(c)?;
            let pairs: Vec<(f64, f64)> = s
                .runs
                .iter()
                .map(|r| (r.ttft_ms, r.timings["ttft_ms"].as_f64().unwrap_or(f64::NAN)))
                .collect();
            ev.put("client_server_ms", json!(pairs));
            if pairs.iter().all(|(_, s)| s.is_nan()) {
                return Err(Stop::skip("this daemon's timings have no ttft_ms"));
            }
            for (client, server) in &pairs {
                ensure!(
                    *client >= server - 1.0,
                    format!("client ≥ server {server:.1} ms"),
                    format!("client {client:.1} ms")
                );
            }
            Ok(format!("{} runs consistent", pairs.len()))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.decode.client_agrees_with_server",
        "The client sees the decode rate the server reports",
        "median client rate within 35% of median timings.predicted_per_second",
        |c, ev| {
            let s = single(c)?;
            let client = median(&s.runs.iter().map(|r| r.decode_tok_s).collect::<Vec<_>>());
            let server = median(
                &s.runs
                    .iter()
                    .map(|r| {
                        r.timings["predicted_per_second"]
                            .as_f64()
                            .unwrap_or(f64::NAN)
                    })
                    .collect::<Vec<_>>(),
            );
            ev.put("client_tok_s", client);
            ev.put("server_tok_s", server);
            ensure!(
                (client - server).abs() <= 0.35 * server,
                format!("{server:.1} ± 35%"),
                format!("{client:.1}")
            );
            Ok(format!("client {client:.1} vs server {server:.1} tok/s"))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.inter_token.histogram_count",
        "Every token after the first is observed once",
        "Δ inferloop_inter_token_seconds_count = Σ (completion_tokens − 1) over the runs",
        |c, ev| {
            let s = single(c)?;
            let d = metric_of(&s.metrics_after, "inferloop_inter_token_seconds_count")?
                - metric_of(&s.metrics_before, "inferloop_inter_token_seconds_count")?;
            let want: f64 = s.runs.iter().map(|r| r.tokens as f64 - 1.0).sum();
            ev.put("delta", d);
            ev.put("expected", want);
            ensure!(d == want, format!("{want}"), format!("{d}"));
            Ok(format!("Δ {d}"))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.ttft.histogram_count",
        "Every request observes one TTFT",
        "Δ inferloop_ttft_seconds_count = number of runs",
        |c, ev| {
            let s = single(c)?;
            let d = metric_of(&s.metrics_after, "inferloop_ttft_seconds_count")?
                - metric_of(&s.metrics_before, "inferloop_ttft_seconds_count")?;
            ev.put("delta", d);
            ensure!(d == RUNS as f64, format!("{RUNS}"), format!("{d}"));
            Ok(format!("Δ {d}"))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(G, "perf.aggregate.lockstep_batches", "Concurrent streams are decoded in one batch", "tokens of 4 concurrent streams arrive together: ≥ 80% of each stream's tokens have one of every other stream within 15% of the median gap (≥ 5 ms)", |c, ev| {
        let a = aggregate(c)?;
        let gaps: Vec<f64> = a.runs.iter().flat_map(|r| r.gaps_ms.iter().copied()).collect();
        let window = (0.15 * median(&gaps)).max(5.0);
        let mut worst = 1.0f64;
        for (i, x) in a.runs.iter().enumerate() {
            for (j, y) in a.runs.iter().enumerate() {
                if i == j || x.arrivals.is_empty() || y.arrivals.is_empty() {
                    continue;
                }
                let near = x.arrivals.iter().filter(|t| {
                    y.arrivals.iter().any(|u| {
                        let d = if **t > *u { t.duration_since(*u) } else { u.duration_since(**t) };
                        d.as_secs_f64() * 1000.0 <= window
                    })
                });
                worst = worst.min(near.count() as f64 / x.arrivals.len() as f64);
            }
        }
        ev.put("window_ms", window);
        ev.put("median_gap_ms", median(&gaps));
        ev.put("worst_pair_fraction", worst);
        ev.put("aggregate_tok_s", a.tok_s);
        ensure!(worst >= 0.8, "≥ 80% of tokens in lockstep", format!("{:.0}% for the worst pair", worst * 100.0));
        Ok(format!("{:.0}% in lockstep (window {window:.1} ms), aggregate {:.1} tok/s", worst * 100.0, a.tok_s))
    }).exclusive().timeout_s(300);
    r.add(
        G,
        "perf.aggregate.fair_share",
        "Concurrent streams progress at similar rates",
        "slowest stream's decode rate ≥ ⅓ of the fastest's",
        |c, ev| {
            let a = aggregate(c)?;
            let rates: Vec<f64> = a.runs.iter().map(|r| r.decode_tok_s).collect();
            ev.put("rates", json!(rates));
            let (lo, hi) = rates
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
            ensure!(
                lo * 3.0 >= hi,
                format!("≥ {:.1}", hi / 3.0),
                format!("{lo:.1}")
            );
            Ok(format!("{lo:.1}–{hi:.1} tok/s"))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.admission.free_slots_no_wait",
        "Requests with free slots start at once",
        "with 4 slots, each of 4 concurrent streams waits < 250 ms in the queue",
        |c, ev| {
            if c.facts.slots < 4 {
                return Err(Stop::skip(format!(
                    "the daemon has {} slots; this case needs 4",
                    c.facts.slots
                )));
            }
            let a = aggregate(c)?;
            let q: Vec<f64> = a
                .runs
                .iter()
                .map(|r| r.timings["queue_ms"].as_f64().unwrap_or(f64::MAX))
                .collect();
            ev.put("queue_ms", json!(q));
            ensure!(
                q.iter().all(|x| *x < 250.0),
                "all < 250 ms",
                format!("{q:?}")
            );
            Ok(format!(
                "max {:.1} ms",
                q.iter().cloned().fold(0.0, f64::max)
            ))
        },
    )
    .exclusive()
    .timeout_s(300)
    .inferloopd_only("timings.queue_ms (llama-server's timings have none)");
    r.add(
        G,
        "perf.single.no_stall",
        "A stream never stalls",
        "the longest gap between tokens of a single stream < 2 s",
        |c, ev| {
            let s = single(c)?;
            let worst = s
                .runs
                .iter()
                .flat_map(|r| r.gaps_ms.iter().copied())
                .fold(0.0, f64::max);
            ev.put("longest_gap_ms", worst);
            ev.put("loadavg", crate::env::loadavg());
            ensure!(
            worst < 2000.0,
            "< 2000 ms",
            format!(
                "{worst:.1} ms (host load {} on {} CPUs: other work on the box competes with the daemon)",
                crate::env::loadavg().unwrap_or_default(),
                std::thread::available_parallelism().map_or(0, |n| n.get())
            )
        );
            Ok(format!("longest gap {worst:.1} ms"))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.memory.rss_stable",
        "Serving does not grow memory",
        "RSS after the runs ≤ RSS before + 32 MiB",
        |c, ev| {
            let s = single(c)?;
            let (Some(a), Some(b)) = (s.rss_before, s.rss_after) else {
                return Err(Stop::skip("this daemon's /v1/status reports no rss_bytes"));
            };
            ev.put("rss_bytes", json!([a, b]));
            ensure!(
                b <= a + (32 << 20),
                format!("≤ {} bytes", a + (32 << 20)),
                b.to_string()
            );
            Ok(format!(
                "{:.1} → {:.1} MiB",
                a as f64 / 1048576.0,
                b as f64 / 1048576.0
            ))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.idle.queue_ms_small",
        "An idle daemon admits at once",
        "timings.queue_ms < 50 ms for every single run",
        |c, ev| {
            let s = single(c)?;
            let q: Vec<f64> = s
                .runs
                .iter()
                .map(|r| r.timings["queue_ms"].as_f64().unwrap_or(f64::MAX))
                .collect();
            ev.put("queue_ms", json!(q));
            ensure!(q.iter().all(|x| *x < 50.0), "all < 50 ms", format!("{q:?}"));
            Ok(format!(
                "max {:.2} ms",
                q.iter().cloned().fold(0.0, f64::max)
            ))
        },
    )
    .exclusive()
    .timeout_s(300);
    r.add(
        G,
        "perf.timings.prompt_rate_formula",
        "Prompt speed matches tokens over time",
        "prompt_per_second = prompt_n / prompt_ms × 1000 within 2%",
        |c, ev| {
            let s = single(c)?;
            for r in &s.runs {
                let t = &r.timings;
                let (n, ms, rate) = (
                    t["prompt_n"].as_f64().unwrap_or(0.0),
                    t["prompt_ms"].as_f64().unwrap_or(0.0),
                    t["prompt_per_second"].as_f64().unwrap_or(-1.0),
                );
                ev.put("timings", t.clone());
                ensure!(
                    ms > 0.0 && (rate - n / ms * 1000.0).abs() <= 0.02 * rate,
                    format!("{:.1} tok/s", n / ms * 1000.0),
                    format!("{rate:.1}")
                );
            }
            Ok(format!("{} runs consistent", s.runs.len()))
        },
    )
    .exclusive()
    .timeout_s(300);
}
