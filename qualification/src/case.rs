//! What a case is: a stable id, its group, what it expects, what it needs to run, and the
//! check itself, which passes with an observation, fails with expected vs observed, or is
//! skipped with the reason.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::ctx::Ctx;

/// The twelve groups, in report order, with the number of cases each must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    Api,
    Chat,
    Stream,
    Completions,
    Input,
    Load,
    Memory,
    Integrity,
    Device,
    Lifecycle,
    Text,
    Perf,
}

impl Group {
    pub const ALL: [Group; 12] = [
        Group::Api,
        Group::Chat,
        Group::Stream,
        Group::Completions,
        Group::Input,
        Group::Load,
        Group::Memory,
        Group::Integrity,
        Group::Device,
        Group::Lifecycle,
        Group::Text,
        Group::Perf,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::Api => "api",
            Group::Chat => "chat",
            Group::Stream => "stream",
            Group::Completions => "completions",
            Group::Input => "input",
            Group::Load => "load",
            Group::Memory => "memory",
            Group::Integrity => "integrity",
            Group::Device => "device",
            Group::Lifecycle => "lifecycle",
            Group::Text => "text",
            Group::Perf => "perf",
        }
    }

    /// How many cases the group holds (the issue fixes these; they add to 385).
    pub fn size(self) -> usize {
        match self {
            Group::Api => 40,
            Group::Chat => 60,
            Group::Stream => 40,
            Group::Completions => 25,
            Group::Input => 70,
            Group::Load => 40,
            Group::Memory => 20,
            Group::Integrity => 15,
            Group::Device => 30,
            Group::Lifecycle => 15,
            Group::Text => 15,
            Group::Perf => 15,
        }
    }

    /// One line on what the group covers, for the report.
    pub fn covers(self) -> &'static str {
        match self {
            Group::Api => "routes, methods, headers, content types, ids, created, object fields, models list, the Responses API, CORS, unversioned aliases",
            Group::Chat => "templates, roles, determinism, seeds, sampling, penalties, stops, max_tokens, usage, timings",
            Group::Stream => "SSE framing, role first, constant id, finish_reason, usage chunk, [DONE], stream == non-stream, errors before the first chunk, the Responses API's typed events",
            Group::Completions => "the legacy endpoint: fields, echo, stops, streaming",
            Group::Input => "malformed JSON, wrong types, out-of-range values, bad UTF-8, oversized bodies, context overflow, unknown model, auth, slow clients, what a stateless Responses API refuses",
            Group::Load => "parallel streams, fan-out across slots, queue overflow 429, queue timeout 503, cancellation, metrics back to zero",
            Group::Memory => "check accounting, reverse and forward cgroup gates, runtime KV admission",
            Group::Integrity => "manifest match, mismatch exit 3, missing weights, unknown fields",
            Group::Device => "board detection, thermal zones and clocks, Prometheus text, /v1/status schema, thermal admission",
            Group::Lifecycle => "readiness, SIGTERM drain, restart, exit codes",
            Group::Text => "Unicode, CJK, emoji, combining marks, near-limit inputs, detokenization round trips",
            Group::Perf => "TTFT, decode tok/s, inter-token p99, 4-stream aggregate against the board's floors",
        }
    }

    pub fn parse(name: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == name)
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a case stopped short of passing.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    Fail { expected: String, observed: String },
    Skip(String),
}

impl Stop {
    pub fn fail(expected: impl Into<String>, observed: impl Into<String>) -> Stop {
        Stop::Fail {
            expected: expected.into(),
            observed: observed.into(),
        }
    }

    pub fn skip(reason: impl Into<String>) -> Stop {
        Stop::Skip(reason.into())
    }
}

/// `Ok(observation)`: what was seen, in one line or a few.
pub type Verdict = Result<String, Stop>;

/// Fails the case with expected vs observed unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $expected:expr, $observed:expr $(,)?) => {
        // Bound first: `!(a < b)` on floats would trip clippy's partial-order lint.
        let held: bool = $cond;
        if !held {
            return Err($crate::case::Stop::fail($expected, $observed));
        }
    };
}

/// Fails the case unless `observed == expected`, naming `what`.
#[macro_export]
macro_rules! ensure_eq {
    ($what:expr, $observed:expr, $expected:expr $(,)?) => {{
        let (o, e) = (&$observed, &$expected);
        if o != e {
            return Err($crate::case::Stop::fail(
                format!("{} = {:?}", $what, e),
                format!("{} = {:?}", $what, o),
            ));
        }
    }};
}

/// Raw material behind a verdict: response snippets, log lines, kernel counters.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Evidence(pub BTreeMap<String, Value>);

impl Evidence {
    /// Records a value under `key` (a later record under the same key replaces it).
    pub fn put(&mut self, key: &str, value: impl Into<Value>) {
        self.0.insert(key.to_string(), value.into());
    }

    /// Records text, bounded so one case cannot bloat the report.
    pub fn text(&mut self, key: &str, text: &str) {
        self.put(key, snippet(text, 4000));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `text` cut to about `max` bytes on a character boundary, marked when cut.
pub fn snippet(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… [{} bytes more]", &text[..cut], text.len() - cut)
}

/// What a case needs to itself while it runs, so the scheduler can keep cases that would
/// disturb each other apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// Reads or generates briefly on a shared daemon: runs alongside anything.
    Shared,
    /// Uses a named dedicated daemon (or other fixture) whose state it changes: one case
    /// per name at a time.
    Fixture(&'static str),
    /// Needs the machine to itself (exact metric deltas, timing): runs alone.
    Exclusive,
}

pub type Check = Box<dyn Fn(&Ctx, &mut Evidence) -> Verdict + Send + Sync>;

/// One qualification case.
pub struct Case {
    pub id: String,
    pub group: Group,
    /// One line: what is checked.
    pub title: String,
    /// What a passing daemon does.
    pub expect: String,
    pub resource: Resource,
    /// Keeps a slot decoding a long generation while it observes: at most one such case
    /// runs at a time, so their decoding does not starve the rest of a small box.
    pub heavy: bool,
    /// Longest run before the case fails as timed out.
    pub timeout: Duration,
    /// What the case needs beyond OpenAI's API (an inferloopd route, header or behaviour);
    /// on any other server it is skipped with that reason, without running.
    pub inferloopd_only: Option<&'static str>,
    pub check: Check,
}

impl Case {
    /// Runs alone on the machine.
    pub fn exclusive(&mut self) -> &mut Case {
        self.resource = Resource::Exclusive;
        self
    }

    /// Holds fixture `name` while it runs. The fixtures whose cases hold slots with long
    /// generations make the case heavy.
    pub fn fixture(&mut self, name: &'static str) -> &mut Case {
        self.resource = Resource::Fixture(name);
        self.heavy |= matches!(name, "queue1" | "qtimeout" | "cancel" | "kv");
        self
    }

    /// Marks the case [`heavy`](Case::heavy).
    pub fn heavy(&mut self) -> &mut Case {
        self.heavy = true;
        self
    }

    /// Marks the case as checking `what`, which only inferloopd has (see
    /// [`Case::inferloopd_only`](Case#structfield.inferloopd_only)).
    pub fn inferloopd_only(&mut self, what: &'static str) -> &mut Case {
        self.inferloopd_only = Some(what);
        self
    }

    pub fn timeout_s(&mut self, secs: u64) -> &mut Case {
        self.timeout = Duration::from_secs(secs);
        self
    }
}

/// Default time a case may take (a busy 2-core box stalls a decode for seconds).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(240);

/// Collects the cases of every group.
#[derive(Default)]
pub struct Registry {
    pub cases: Vec<Case>,
}

impl Registry {
    pub fn add(
        &mut self,
        group: Group,
        id: impl Into<String>,
        title: impl Into<String>,
        expect: impl Into<String>,
        check: impl Fn(&Ctx, &mut Evidence) -> Verdict + Send + Sync + 'static,
    ) -> &mut Case {
        self.cases.push(Case {
            id: id.into(),
            group,
            title: title.into(),
            expect: expect.into(),
            resource: Resource::Shared,
            heavy: false,
            timeout: DEFAULT_TIMEOUT,
            inferloopd_only: None,
            check: Box::new(check),
        });
        let last = self.cases.len() - 1;
        &mut self.cases[last]
    }
}

/// Outcome of one case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Passed,
    Failed,
    Skipped,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Passed => "PASS",
            Status::Failed => "FAIL",
            Status::Skipped => "SKIP",
        }
    }
}

/// A case's result, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub id: String,
    pub group: Group,
    pub title: String,
    pub status: Status,
    pub duration_ms: f64,
    pub expectation: String,
    /// What was seen (on a pass), or the observed side of a failure.
    pub observation: String,
    /// The expected side of a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Why it was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    pub evidence: Evidence,
}
