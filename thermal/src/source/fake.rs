//! A scripted source for tests (public so the daemon's tests can heat a board up on cue).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::snapshot::{now_ms, Snapshot, Zone};
use crate::source::Source;
use crate::ThermalError;

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub enum FakeStep {
    Reading(Snapshot),
    /// `sample` returns [`ThermalError::SourceFailed`] with this message.
    Fail(String),
}

#[derive(Debug, Default)]
struct Script {
    steps: VecDeque<FakeStep>,
    last: Option<Snapshot>,
    samples: u64,
}

/// Answers `sample` from a script, one step per call. When the script runs out it repeats
/// the last reading (so a board "stays hot"); with no reading ever given it fails.
/// Timestamps are set at sampling time.
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    script: Arc<Mutex<Script>>,
}

/// Pushes more steps into a [`FakeSource`] that has been moved into a sampler.
#[derive(Debug, Clone)]
pub struct FakeHandle {
    script: Arc<Mutex<Script>>,
}

fn lock(script: &Mutex<Script>) -> MutexGuard<'_, Script> {
    // A panic while holding this lock can only come from a test that already failed; the
    // script itself stays consistent, so keep using it.
    script
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FakeSource {
    /// A source that answers with `readings` in order, then repeats the last one.
    pub fn new(readings: impl IntoIterator<Item = Snapshot>) -> Self {
        Self::with_steps(readings.into_iter().map(FakeStep::Reading))
    }

    /// A source that answers with `steps` in order.
    pub fn with_steps(steps: impl IntoIterator<Item = FakeStep>) -> Self {
        FakeSource {
            script: Arc::new(Mutex::new(Script {
                steps: steps.into_iter().collect(),
                ..Script::default()
            })),
        }
    }

    /// Readings with one zone `zone` at each of `temps` (°C), no trip points.
    pub fn temperatures(zone: &str, temps: impl IntoIterator<Item = f64>) -> Self {
        Self::new(temps.into_iter().map(|c| fake_reading(zone, c)))
    }

    /// A handle that can extend the script after the source has been moved away.
    pub fn handle(&self) -> FakeHandle {
        FakeHandle {
            script: Arc::clone(&self.script),
        }
    }
}

/// A `fake` snapshot with one zone.
pub fn fake_reading(zone: &str, celsius: f64) -> Snapshot {
    Snapshot::new("fake").with_zone(Zone::new(zone, celsius))
}

impl FakeHandle {
    /// Appends a reading.
    pub fn push(&self, reading: Snapshot) {
        lock(&self.script)
            .steps
            .push_back(FakeStep::Reading(reading));
    }

    /// Appends a reading with one zone at `celsius`.
    pub fn push_temperature(&self, zone: &str, celsius: f64) {
        self.push(fake_reading(zone, celsius));
    }

    /// Appends a failure.
    pub fn push_failure(&self, message: impl Into<String>) {
        lock(&self.script)
            .steps
            .push_back(FakeStep::Fail(message.into()));
    }

    /// How many times `sample` has been called.
    pub fn samples(&self) -> u64 {
        lock(&self.script).samples
    }

    /// Steps not yet consumed.
    pub fn pending(&self) -> usize {
        lock(&self.script).steps.len()
    }
}

impl Source for FakeSource {
    fn name(&self) -> &str {
        "fake"
    }

    fn sample(&mut self) -> Result<Snapshot, ThermalError> {
        let mut script = lock(&self.script);
        script.samples += 1;
        let step = match script.steps.pop_front() {
            Some(step) => step,
            None => match &script.last {
                Some(last) => FakeStep::Reading(last.clone()),
                None => FakeStep::Fail("script is empty".into()),
            },
        };
        match step {
            FakeStep::Reading(mut reading) => {
                reading.timestamp_ms = now_ms();
                script.last = Some(reading.clone());
                Ok(reading)
            }
            FakeStep::Fail(message) => Err(ThermalError::SourceFailed {
                source_name: "fake".into(),
                message,
            }),
        }
    }
}
