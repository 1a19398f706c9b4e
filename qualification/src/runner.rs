//! Runs the selected cases: shared-resource cases on `jobs` workers (one case per fixture at
//! a time), then the cases that need the machine to themselves one by one. Each case runs on
//! its own thread under its timeout; a panic or a timeout is a failure, never a pass.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::case::{Case, CaseResult, Evidence, Resource, Status, Stop};
use crate::ctx::Ctx;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub jobs: usize,
    /// Replaces every case's own timeout when set.
    pub timeout: Option<Duration>,
    /// Progress lines on stderr.
    pub progress: bool,
}

struct Sched {
    pending: VecDeque<usize>,
    busy: HashSet<&'static str>,
    heavy_running: bool,
    done: usize,
}

/// Runs `cases` and returns their results in the given order.
pub fn run(ctx: &Arc<Ctx>, cases: Vec<Arc<Case>>, opts: &RunOptions) -> Vec<CaseResult> {
    let total = cases.len();
    let mut remaining: HashMap<&'static str, usize> = HashMap::new();
    for c in &cases {
        if let Resource::Fixture(name) = c.resource {
            *remaining.entry(name).or_default() += 1;
        }
    }
    let remaining = Arc::new(Mutex::new(remaining));
    let results: Arc<Mutex<Vec<Option<CaseResult>>>> = Arc::new(Mutex::new(vec![None; total]));
    let counter = Arc::new(Mutex::new(0usize));

    let report = {
        let results = results.clone();
        let counter = counter.clone();
        let remaining = remaining.clone();
        let ctx = ctx.clone();
        let progress = opts.progress;
        move |i: usize, case: &Case, r: CaseResult| {
            let n = {
                let mut c = counter.lock().unwrap_or_else(|e| e.into_inner());
                *c += 1;
                *c
            };
            if progress {
                print_progress(n, total, &r);
            }
            if let Resource::Fixture(name) = case.resource {
                let left = {
                    let mut m = remaining.lock().unwrap_or_else(|e| e.into_inner());
                    let e = m.entry(name).or_default();
                    *e = e.saturating_sub(1);
                    *e
                };
                if left == 0 {
                    ctx.release(name);
                }
            }
            results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
        }
    };

    // Phase 1: everything but the exclusive cases, on the worker pool.
    let shared: VecDeque<usize> = (0..total)
        .filter(|&i| cases[i].resource != Resource::Exclusive)
        .collect();
    let sched = Arc::new((
        Mutex::new(Sched {
            pending: shared,
            busy: HashSet::new(),
            heavy_running: false,
            done: 0,
        }),
        Condvar::new(),
    ));
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.max(1) {
            let sched = sched.clone();
            let cases = &cases;
            let report = &report;
            s.spawn(move || loop {
                let (lock, cv) = &*sched;
                let next = {
                    let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        if st.pending.is_empty() {
                            break None;
                        }
                        let pick = st.pending.iter().position(|&i| {
                            let free = match cases[i].resource {
                                Resource::Fixture(name) => !st.busy.contains(name),
                                _ => true,
                            };
                            free && !(cases[i].heavy && st.heavy_running)
                        });
                        match pick {
                            Some(p) => {
                                let i = st.pending.remove(p).unwrap_or_default();
                                if let Resource::Fixture(name) = cases[i].resource {
                                    st.busy.insert(name);
                                }
                                st.heavy_running |= cases[i].heavy;
                                break Some(i);
                            }
                            None => st = cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                        }
                    }
                };
                let Some(i) = next else { break };
                let r = run_one(ctx, &cases[i], opts.timeout);
                report(i, &cases[i], r);
                let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                if let Resource::Fixture(name) = cases[i].resource {
                    st.busy.remove(name);
                }
                if cases[i].heavy {
                    st.heavy_running = false;
                }
                st.done += 1;
                cv.notify_all();
            });
        }
    });

    // Phase 2: the exclusive cases, alone, in order.
    for i in (0..total).filter(|&i| cases[i].resource == Resource::Exclusive) {
        let r = run_one(ctx, &cases[i], opts.timeout);
        report(i, &cases[i], r);
    }

    let mut out = results.lock().unwrap_or_else(|e| e.into_inner());
    out.iter_mut().filter_map(Option::take).collect()
}

/// Runs one case on its own thread under its timeout.
pub fn run_one(ctx: &Arc<Ctx>, case: &Arc<Case>, timeout: Option<Duration>) -> CaseResult {
    let limit = timeout.unwrap_or(case.timeout);
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    if let Some(what) = case.inferloopd_only.filter(|_| !ctx.server.inferloopd) {
        let _ = tx.send((
            Err(Stop::skip(crate::server::only_reason(what))),
            Evidence::default(),
        ));
    } else {
        let ctx = ctx.clone();
        let case = case.clone();
        std::thread::Builder::new()
            .name(format!("case {}", case.id))
            .spawn(move || {
                let mut ev = Evidence::default();
                let verdict =
                    std::panic::catch_unwind(AssertUnwindSafe(|| (case.check)(&ctx, &mut ev)))
                        .unwrap_or_else(|p| {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "unknown panic".into());
                            Err(Stop::fail(
                                "the check to run to its end",
                                format!("it panicked: {msg}"),
                            ))
                        });
                // The runner may have given up on this case already.
                let _ = tx.send((verdict, ev));
            })
            .ok();
    }
    let (verdict, evidence) = match rx.recv_timeout(limit) {
        Ok(x) => x,
        Err(mpsc::RecvTimeoutError::Timeout) => (
            Err(Stop::fail(
                format!("finish within {limit:?}"),
                format!("still running after {limit:?}"),
            )),
            Evidence::default(),
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => (
            Err(Stop::fail("a verdict", "the case thread ended without one")),
            Evidence::default(),
        ),
    };
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (status, observation, expected, skip_reason) = match verdict {
        Ok(obs) => (Status::Passed, obs, None, None),
        Err(Stop::Fail { expected, observed }) => (Status::Failed, observed, Some(expected), None),
        Err(Stop::Skip(reason)) => (Status::Skipped, String::new(), None, Some(reason)),
    };
    CaseResult {
        id: case.id.clone(),
        group: case.group,
        title: case.title.clone(),
        status,
        duration_ms,
        expectation: case.expect.clone(),
        observation,
        expected,
        skip_reason,
        evidence,
    }
}

fn print_progress(n: usize, total: usize, r: &CaseResult) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "[{n:>3}/{total}] {} {:<58} {:>8.0} ms",
        r.status.label(),
        r.id,
        r.duration_ms
    );
    match r.status {
        Status::Failed => {
            let _ = writeln!(
                err,
                "          expected: {}\n          observed: {}",
                r.expected.as_deref().unwrap_or_default(),
                crate::case::snippet(&r.observation, 600).replace('\n', "\n                    ")
            );
        }
        Status::Skipped => {
            let _ = writeln!(
                err,
                "          skipped: {}",
                r.skip_reason.as_deref().unwrap_or_default()
            );
        }
        Status::Passed => {}
    }
}
