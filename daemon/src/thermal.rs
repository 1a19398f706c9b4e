//! The board and the thermal watch at serve time: detect the board, open the sensors, run the
//! sampler, and hand the decode thread a cheap view of the admission state.
//!
//! The `normal → hot → critical` state machine and its hysteresis live in the sampler
//! (`inferloop-thermal`); this module only configures it and reads what it publishes.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use inferloop_board::{BoardError, BoardProfile, Detection, Detector};
use inferloop_thermal::{
    open_auto, throttle, Admission, AdmissionConfig, Sampler, SamplerConfig, Snapshot, Source,
    ThermalError, ThermalState, ThrottleCause,
};
use tokio::sync::watch;

use crate::config::{ConfigError, ThermalSettings};
use crate::engine::EngineError;
use crate::exit::ExitCode;
use crate::metrics::{escape_label, Metrics};

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

/// How many of `slots` may decode at once in `state`: all when normal; `hot_fraction` of
/// them (rounded down, at least 1) when hot or critical, as [`Admission::max_active`] says.
pub fn max_active_for(state: ThermalState, slots: usize, hot_fraction: f64) -> usize {
    match state {
        ThermalState::Normal => slots,
        ThermalState::Hot | ThermalState::Critical => {
            let cut = (slots as f64 * hot_fraction).floor() as usize;
            cut.clamp(1.min(slots), slots)
        }
    }
}

/// What the decode thread consults every loop iteration: a `watch` borrow, no lock held
/// across anything, no allocation.
#[derive(Debug, Clone)]
pub struct ThermalGate {
    latest: watch::Receiver<Option<Arc<Snapshot>>>,
    zones: Arc<[String]>,
    critical_c: f64,
    hot_fraction: f64,
}

impl ThermalGate {
    /// The admission state of the newest reading; `normal` before the first one.
    pub fn state(&self) -> ThermalState {
        self.latest
            .borrow()
            .as_ref()
            .and_then(|s| s.thermal_state)
            .unwrap_or(ThermalState::Normal)
    }

    /// The admission cap for `state` out of `slots`.
    pub fn max_active(&self, state: ThermalState, slots: usize) -> usize {
        max_active_for(state, slots, self.hot_fraction)
    }

    /// `Some` (the error to answer a new request with) while the board is critical.
    pub fn refusal(&self) -> Option<EngineError> {
        let latest = self.latest.borrow();
        let snapshot = latest.as_ref()?;
        if snapshot.thermal_state != Some(ThermalState::Critical) {
            return None;
        }
        let celsius = snapshot
            .hottest(Some(&self.zones))
            .map_or(f64::NAN, |z| z.celsius);
        Some(EngineError::Overheated {
            celsius,
            critical: self.critical_c,
        })
    }
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
        let sampler = Sampler::spawn(
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
    pub fn latest(&self) -> Option<Arc<Snapshot>> {
        self.sampler.latest()
    }

    /// The kept readings, oldest first.
    pub fn history(&self) -> Vec<Arc<Snapshot>> {
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
        ThermalGate {
            latest: self.sampler.subscribe(),
            zones: self.admission.zones.clone().into(),
            critical_c: self.admission.critical_c,
            hot_fraction: self.admission.hot_fraction,
        }
    }

    /// Adds the thermal series to `/metrics`.
    pub fn register_metrics(&self, metrics: &Metrics) {
        let latest = self.sampler.subscribe();
        metrics.add_source(move |out| {
            // Clone the `Arc` so the sampler is never blocked by a slow render.
            let snapshot = latest.borrow().clone();
            render_metrics(snapshot.as_deref(), out);
        });
    }
}

/// The thermal series in the Prometheus text format. Every family is announced even with
/// no reading, so dashboards see it exist; a label value seen twice keeps its first reading
/// (two sources may name a sensor alike, and duplicate series break scrapers).
pub fn render_metrics(snapshot: Option<&Snapshot>, out: &mut String) {
    fn family<'a>(
        out: &mut String,
        name: &str,
        help: &str,
        label: &str,
        series: impl Iterator<Item = (&'a str, String)>,
    ) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        let mut seen = HashSet::new();
        for (value, reading) in series {
            if seen.insert(value) {
                let _ = writeln!(
                    out,
                    "{name}{{{label}=\"{}\"}} {reading}",
                    escape_label(value)
                );
            }
        }
    }
    let zones = snapshot.map(|s| s.zones.as_slice()).unwrap_or_default();
    let clocks = snapshot.map(|s| s.clocks.as_slice()).unwrap_or_default();
    let rails = snapshot.map(|s| s.rails.as_slice()).unwrap_or_default();
    family(
        out,
        "inferloop_temperature_celsius",
        "Temperature of each thermal zone.",
        "zone",
        zones
            .iter()
            .map(|z| (z.name.as_str(), z.celsius.to_string())),
    );
    family(
        out,
        "inferloop_clock_hz",
        "Current clock of each domain.",
        "domain",
        clocks.iter().map(|c| (c.domain.as_str(), c.hz.to_string())),
    );
    family(
        out,
        "inferloop_power_watts",
        "Power drawn on each rail.",
        "rail",
        rails.iter().map(|r| (r.name.as_str(), r.watts.to_string())),
    );
    family(
        out,
        "inferloop_throttled",
        "1 while clocks are held down for this cause.",
        "cause",
        ThrottleCause::ALL.iter().map(|&cause| {
            let on = snapshot.is_some_and(|s| s.throttled(cause));
            (cause.as_str(), u8::from(on).to_string())
        }),
    );
    let state = snapshot
        .and_then(|s| s.thermal_state)
        .unwrap_or(ThermalState::Normal);
    let _ = writeln!(
        out,
        "# HELP inferloop_thermal_state Thermal admission state: 0 normal, 1 hot, 2 critical.\n\
         # TYPE inferloop_thermal_state gauge\n\
         inferloop_thermal_state {}",
        state.as_gauge()
    );
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
    pub fn sample(&mut self) -> Result<Snapshot, WatchError> {
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
        snapshot.thermal_state = Some(admission.state());
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferloop_thermal::{Clock, Zone};

    fn settings() -> ThermalSettings {
        ThermalSettings::default()
    }

    fn profile(name: &str) -> BoardProfile {
        inferloop_board::profile::find(name)
            .unwrap_or_else(|e| panic!("{e}"))
            .clone()
    }

    #[test]
    fn hot_admits_half_the_slots_but_never_none() {
        use ThermalState::*;
        assert_eq!(max_active_for(Normal, 4, 0.5), 4);
        assert_eq!(max_active_for(Hot, 4, 0.5), 2);
        assert_eq!(max_active_for(Hot, 2, 0.5), 1);
        assert_eq!(max_active_for(Hot, 1, 0.5), 1);
        assert_eq!(max_active_for(Critical, 3, 0.5), 1);
        assert_eq!(max_active_for(Hot, 8, 1.0), 8);
        assert_eq!(max_active_for(Hot, 8, 0.01), 1);
    }

    #[test]
    fn trip_points_win_over_the_profile_and_flags_win_over_both() {
        let first = Snapshot::new("test")
            .with_zone(Zone::new("gpu-thermal", 40.0).passive(80.0).critical(95.0));
        let orin = profile("jetson-orin-nx-16gb");
        let (config, origin) =
            admission_config(&settings(), Some(&orin), Some(&first)).expect("valid");
        assert_eq!((config.hot_c, config.critical_c), (80.0, 95.0));
        assert_eq!(origin, "the sensors' trip points");

        let flags = ThermalSettings {
            hot_c: Some(70.0),
            critical_c: Some(90.0),
            hysteresis_c: Some(2.0),
            hot_fraction: 0.25,
            ..settings()
        };
        let (config, _) = admission_config(&flags, Some(&orin), Some(&first)).expect("valid");
        assert_eq!((config.hot_c, config.critical_c), (70.0, 90.0));
        assert_eq!((config.hysteresis_c, config.hot_fraction), (2.0, 0.25));
        assert!(config.zones.contains(&"gpu-thermal".to_string()));
    }

    #[test]
    fn profile_then_fallback_supply_defaults_without_trip_points() {
        let orin = profile("jetson-orin-nx-16gb");
        let (config, origin) = admission_config(&settings(), Some(&orin), None).expect("valid");
        assert_eq!((config.hot_c, config.critical_c), (99.0, 104.5));
        assert_eq!(origin, "the board profile");
        let (config, origin) = admission_config(&settings(), None, None).expect("valid");
        assert_eq!(
            (config.hot_c, config.critical_c),
            (
                AdmissionConfig::FALLBACK_HOT_C,
                AdmissionConfig::FALLBACK_CRITICAL_C
            )
        );
        assert_eq!(origin, "the built-in fallback");
    }

    #[test]
    fn one_threshold_set_past_the_other_default_names_the_flag() {
        let orin = profile("jetson-orin-nx-16gb");
        let hot_only = ThermalSettings {
            hot_c: Some(110.0),
            ..settings()
        };
        let err = admission_config(&hot_only, Some(&orin), None).expect_err("110 > 104.5");
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    field: "hot_celsius",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("critical_celsius"), "{err}");
        let critical_only = ThermalSettings {
            critical_c: Some(90.0),
            ..settings()
        };
        let err = admission_config(&critical_only, Some(&orin), None).expect_err("90 < 99");
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    field: "critical_celsius",
                    ..
                }
            ),
            "{err}"
        );
    }

    fn critical_gate(snapshot: Snapshot) -> (watch::Sender<Option<Arc<Snapshot>>>, ThermalGate) {
        let (tx, rx) = watch::channel(Some(Arc::new(snapshot)));
        let gate = ThermalGate {
            latest: rx,
            zones: vec!["gpu-thermal".to_string()].into(),
            critical_c: 90.0,
            hot_fraction: 0.5,
        };
        (tx, gate)
    }

    #[test]
    fn gate_refuses_only_while_critical_and_reports_the_watched_zone() {
        let mut hot = Snapshot::new("test")
            .with_zone(Zone::new("cpu-thermal", 99.0))
            .with_zone(Zone::new("gpu-thermal", 93.5));
        hot.thermal_state = Some(ThermalState::Critical);
        let (tx, gate) = critical_gate(hot);
        assert_eq!(gate.state(), ThermalState::Critical);
        match gate.refusal() {
            Some(EngineError::Overheated { celsius, critical }) => {
                assert_eq!((celsius, critical), (93.5, 90.0));
            }
            other => panic!("expected Overheated, got {other:?}"),
        }
        let mut cool = Snapshot::new("test").with_zone(Zone::new("gpu-thermal", 50.0));
        cool.thermal_state = Some(ThermalState::Normal);
        tx.send_replace(Some(Arc::new(cool)));
        assert_eq!(gate.state(), ThermalState::Normal);
        assert!(gate.refusal().is_none());
        tx.send_replace(None);
        assert_eq!(gate.state(), ThermalState::Normal, "no reading yet: normal");
    }

    #[test]
    fn metrics_export_every_family_with_escaped_labels_and_no_duplicates() {
        let mut s = Snapshot::new("test")
            .with_zone(Zone::new("gpu-thermal", 45.8))
            .with_zone(Zone::new("gpu-thermal", 99.0))
            .with_zone(Zone::new("odd\"zone", 30.0))
            .with_clock(Clock::new("gpu", 306_000_000, Some(918_000_000)))
            .with_rail("VDD_IN", 5.25);
        s.throttle = vec![inferloop_thermal::Throttle {
            cause: ThrottleCause::Power,
            detail: "cap".into(),
        }];
        s.thermal_state = Some(ThermalState::Hot);
        let mut out = String::new();
        render_metrics(Some(&s), &mut out);
        for line in [
            "# TYPE inferloop_temperature_celsius gauge",
            "inferloop_temperature_celsius{zone=\"gpu-thermal\"} 45.8\n",
            "inferloop_temperature_celsius{zone=\"odd\\\"zone\"} 30\n",
            "inferloop_clock_hz{domain=\"gpu\"} 306000000\n",
            "inferloop_power_watts{rail=\"VDD_IN\"} 5.25\n",
            "inferloop_throttled{cause=\"thermal\"} 0\n",
            "inferloop_throttled{cause=\"power\"} 1\n",
            "inferloop_thermal_state 1\n",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        assert_eq!(out.matches("zone=\"gpu-thermal\"").count(), 1, "{out}");

        let mut empty = String::new();
        render_metrics(None, &mut empty);
        assert!(empty.contains("# HELP inferloop_clock_hz"), "{empty}");
        assert!(empty.contains("inferloop_thermal_state 0\n"), "{empty}");
        assert!(empty.contains("inferloop_throttled{cause=\"thermal\"} 0\n"));
    }
}
