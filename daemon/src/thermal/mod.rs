//! The board and the thermal watch at serve time: detect the board, open the sensors, run the
//! sampler, and hand the decode thread a cheap view of the admission state.
//!
//! The `normal → hot → critical` state machine, its hysteresis and the cap while hot live in
//! `inferloop-thermal`; this module only configures it and reads what the sampler publishes.
//!
//! - `gate`: [`ThermalGate`], the decode thread's view.
//! - `metrics`: [`render_metrics`], the thermal series on `/metrics`.

mod gate;
mod metrics;
#[cfg(test)]
mod tests;

use std::time::Duration;

use inferloop_board::{BoardError, BoardProfile, Detection, Detector};
use inferloop_thermal::{
    open_auto, throttle, Admission, AdmissionConfig, Reading, Sampler, SamplerConfig, Snapshot,
    Source, ThermalError,
};

use crate::config::{ConfigError, ThermalSettings};
use crate::exit::ExitCode;
use crate::metrics::Metrics;

#[cfg(test)]
pub(crate) use gate::GateFeed;
pub use gate::{Overheat, ThermalGate};
pub use metrics::render_metrics;

/// Snapshots kept for `GET /v1/thermal`: ten minutes at the default 1 s interval.
pub const HISTORY: usize = 600;

/// Why the watch could not start. All but `Task` (a panicked start-up task, which should not
/// happen) are configuration problems; all exit 2.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// `--board` named no profile.
    #[error(transparent)]
    Board(#[from] BoardError),
    /// The sysfs root is not a readable directory. Displayed, not chained: the thermal
    /// errors already carry their cause in the message.
    #[error("{0}")]
    Thermal(ThermalError),
    /// A threshold contradicts the defaults it is combined with.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("thermal start-up task failed: {0}")]
    Task(String),
}

impl From<ThermalError> for WatchError {
    fn from(e: ThermalError) -> Self {
        WatchError::Thermal(e)
    }
}

impl WatchError {
    /// Stable label for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Board(e) => e.kind(),
            Self::Thermal(e) => e.kind(),
            Self::Config(_) => "invalid_config",
            Self::Task(_) => "task_failed",
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::Usage
    }
}

/// Detects the board. An unknown `--board` is an error; any other miss (an architecture
/// without a fallback profile) is logged and leaves the daemon without a profile, so the
/// thermal thresholds fall back to trip points or built-in numbers.
pub fn detect_board(settings: &ThermalSettings) -> Result<Option<Detection>, BoardError> {
    let detector = Detector::new(settings.roots.clone()).with_override(settings.board.clone());
    match detector.detect() {
        Ok(detection) => Ok(Some(detection)),
        Err(e @ BoardError::UnknownBoard { .. }) => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, kind = e.kind(), "no board profile; thermal defaults apply");
            Ok(None)
        }
    }
}

/// The admission thresholds: the defaults ([`AdmissionConfig::defaults_for`]: trip points of
/// the first reading, then the profile, then built-in numbers) with the configured values on
/// top. Returns the config and where the defaults came from, for the log.
pub fn admission_config(
    settings: &ThermalSettings,
    profile: Option<&BoardProfile>,
    first: Option<&Snapshot>,
) -> Result<(AdmissionConfig, &'static str), ConfigError> {
    let from_profile = profile.and_then(AdmissionConfig::from_profile);
    let zones = from_profile
        .as_ref()
        .map(|c| c.zones.clone())
        .unwrap_or_default();
    let origin = if first
        .and_then(|s| AdmissionConfig::from_trip_points(s, &zones))
        .is_some()
    {
        "the sensors' trip points"
    } else if from_profile.is_some() {
        "the board profile"
    } else {
        "the built-in fallback"
    };
    let mut config = AdmissionConfig::defaults_for(profile, first);
    if let Some(hot) = settings.hot_c {
        config.hot_c = hot;
    }
    if let Some(critical) = settings.critical_c {
        config.critical_c = critical;
    }
    if let Some(h) = settings.hysteresis_c {
        config.hysteresis_c = h;
    }
    config.hot_fraction = settings.hot_fraction;
    if config.critical_c <= config.hot_c {
        // Config validation already rejects both set and out of order, so one side is a
        // default here: say which, and what to set.
        let (hot, critical) = (config.hot_c, config.critical_c);
        return Err(match (settings.hot_c, settings.critical_c) {
            (Some(_), None) => ConfigError::Invalid {
                field: "hot_celsius",
                message: format!(
                    "({hot}) must be below the critical threshold {critical} °C from {origin}; \
                     set `critical_celsius` too"
                ),
            },
            _ => ConfigError::Invalid {
                field: "critical_celsius",
                message: format!(
                    "({critical}) must be above the hot threshold {hot} °C from {origin}; \
                     set `hot_celsius` too"
                ),
            },
        });
    }
    config.validate().map_err(|e| match e {
        ThermalError::InvalidConfig { field, message } => ConfigError::Invalid {
            field: match field {
                "hot_c" => "hot_celsius",
                "critical_c" => "critical_celsius",
                "hysteresis_c" => "hysteresis_celsius",
                other => other,
            },
            message,
        },
        other => ConfigError::Invalid {
            field: "thermal",
            message: other.to_string(),
        },
    })?;
    Ok((config, origin))
}

/// The detected board and the running sampler, shared by the HTTP handlers.
pub struct ThermalWatch {
    detection: Option<Detection>,
    admission: AdmissionConfig,
    interval: Duration,
    sampler: Sampler,
}

impl ThermalWatch {
    /// Detects the board, opens the sensors, takes a first reading for the default
    /// thresholds, and starts the sampler on the current runtime. Absent sensors are fine
    /// (empty readings); an unknown `--board` or an unreadable sysfs root is not.
    pub async fn start(settings: &ThermalSettings) -> Result<Self, WatchError> {
        let blocking = settings.clone();
        // Detection may load NVML and reading sensors may run `nvpmodel`: keep both off the
        // async workers.
        let (detection, source, first) = tokio::task::spawn_blocking(move || {
            let detection = detect_board(&blocking)?;
            let profile = detection.as_ref().map(|d| &d.profile);
            let mut source = open_auto(&blocking.roots.sys_root, profile)?;
            let first = match source.sample() {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "first thermal reading failed; default thresholds");
                    None
                }
            };
            Ok::<_, WatchError>((detection, source, first))
        })
        .await
        .map_err(|e| WatchError::Task(e.to_string()))??;
        let profile = detection.as_ref().map(|d| &d.profile);
        let (admission, origin) = admission_config(settings, profile, first.as_ref())?;
        let zones = first.as_ref().map_or(0, |s| s.zones.len());
        tracing::info!(
            source = source.name(),
            zones,
            hot_celsius = admission.hot_c,
            critical_celsius = admission.critical_c,
            hysteresis_celsius = admission.hysteresis_c,
            hot_fraction = admission.hot_fraction,
            defaults_from = origin,
            interval_ms = settings.interval.as_millis() as u64,
            "thermal watch started"
        );
        let sampler = Sampler::spawn_on_own_thread(
            source,
            SamplerConfig {
                interval: settings.interval,
                history: HISTORY,
                admission: Some(admission.clone()),
            },
        )?;
        Ok(ThermalWatch {
            detection,
            admission,
            interval: settings.interval,
            sampler,
        })
    }

    /// The board, when one was detected.
    pub fn detection(&self) -> Option<&Detection> {
        self.detection.as_ref()
    }

    /// The thresholds in force.
    pub fn admission(&self) -> &AdmissionConfig {
        &self.admission
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The newest reading (with its admission state), `None` before the first.
    pub fn latest(&self) -> Option<Reading> {
        self.sampler.latest()
    }

    /// The kept readings, oldest first.
    pub fn history(&self) -> Vec<Reading> {
        self.sampler.history()
    }

    /// The temperature driving the state in `snapshot`: its hottest watched zone.
    pub fn driving_celsius(&self, snapshot: &Snapshot) -> Option<f64> {
        snapshot
            .hottest(Some(&self.admission.zones))
            .map(|z| z.celsius)
    }

    /// The decode thread's view.
    pub fn gate(&self) -> ThermalGate {
        ThermalGate::new(self.sampler.subscribe(), self.admission.clone())
    }

    /// Adds the thermal series to `/metrics`.
    pub fn register_metrics(&self, metrics: &Metrics) {
        let latest = self.sampler.subscribe();
        metrics.add_source(move |w| {
            // Clone the reading (an `Arc`) so the sampler is never blocked by a slow render.
            let reading = latest.borrow().clone();
            render_metrics(reading.as_ref(), w);
        });
    }
}

/// Readings for `inferloopd thermal`: the source, throttle detection and admission the server
/// uses, without the sampler task.
pub struct Probe {
    settings: ThermalSettings,
    profile: Option<BoardProfile>,
    source: Box<dyn Source>,
    admission: Option<Admission>,
}

impl Probe {
    /// Detects the board and opens the sensors.
    pub fn open(settings: &ThermalSettings) -> Result<Self, WatchError> {
        let profile = detect_board(settings)?.map(|d| d.profile);
        let source = open_auto(&settings.roots.sys_root, profile.as_ref())?;
        Ok(Probe {
            settings: settings.clone(),
            profile,
            source,
            admission: None,
        })
    }

    /// One reading with its throttling and admission state filled in. The thresholds come
    /// from the first reading, as in the server.
    pub fn sample(&mut self) -> Result<Reading, WatchError> {
        let mut snapshot = self.source.sample()?;
        snapshot.throttle = throttle::detect(&snapshot);
        let admission = match self.admission.as_mut() {
            Some(a) => a,
            None => {
                let (config, _) =
                    admission_config(&self.settings, self.profile.as_ref(), Some(&snapshot))?;
                self.admission.insert(Admission::new(config)?)
            }
        };
        admission.observe_snapshot(&snapshot);
        Ok(Reading::new(snapshot, Some(admission.state())))
    }
}
