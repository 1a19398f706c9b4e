//! The sampler task under paused tokio time: cadence, bounded history, failures, admission.

use std::time::Duration;

use inferloop_thermal::{
    AdmissionConfig, Clock, FakeSource, FakeStep, Reading, Sampler, SamplerConfig, Snapshot,
    ThermalError, ThermalState, ThrottleCause, Zone,
};
use tokio::time::Instant;

fn temps_of(history: &[Reading]) -> Vec<f64> {
    history
        .iter()
        .map(|r| r.snapshot.zones[0].celsius)
        .collect()
}

fn spawn(source: FakeSource, config: SamplerConfig) -> Sampler {
    match Sampler::spawn(Box::new(source), config) {
        Ok(sampler) => sampler,
        Err(e) => panic!("sampler did not start: {e}"),
    }
}

#[tokio::test(start_paused = true)]
async fn first_sample_is_taken_at_once() {
    let fake = FakeSource::temperatures("gpu", [50.0]);
    let handle = fake.handle();
    let start = Instant::now();
    let sampler = spawn(fake, SamplerConfig::default());
    assert!(sampler.latest().is_none());
    sampler.subscribe().changed().await.expect("first snapshot");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(handle.samples(), 1);
    let latest = sampler.latest().expect("latest");
    assert_eq!(latest.snapshot.zones[0].celsius, 50.0);
    assert_eq!(latest.state, None, "no admission configured");
    assert_eq!(sampler.thermal_state(), ThermalState::Normal);
}

#[tokio::test(start_paused = true)]
async fn samples_follow_the_configured_interval() {
    let fake = FakeSource::temperatures("gpu", [50.0, 51.0, 52.0, 53.0]);
    let config = SamplerConfig {
        interval: Duration::from_millis(250),
        ..SamplerConfig::default()
    };
    let start = Instant::now();
    let sampler = spawn(fake, config);
    let mut rx = sampler.subscribe();
    for _ in 0..4 {
        rx.changed().await.expect("snapshot");
    }
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(750),
        "ticks at 0, 250, 500, 750 ms"
    );
    assert_eq!(temps_of(&sampler.history()), [50.0, 51.0, 52.0, 53.0]);
}

#[tokio::test(start_paused = true)]
async fn default_interval_is_one_second_and_history_ten_minutes() {
    let config = SamplerConfig::default();
    assert_eq!(
        (config.interval, config.history),
        (Duration::from_secs(1), 600)
    );
}

#[tokio::test(start_paused = true)]
async fn history_keeps_only_the_newest_entries() {
    let fake = FakeSource::temperatures("gpu", [1.0, 2.0, 3.0, 4.0, 5.0]);
    let config = SamplerConfig {
        history: 3,
        ..SamplerConfig::default()
    };
    let sampler = spawn(fake, config);
    let mut rx = sampler.subscribe();
    for _ in 0..5 {
        rx.changed().await.expect("snapshot");
    }
    assert_eq!(temps_of(&sampler.history()), [3.0, 4.0, 5.0]);
}

#[tokio::test(start_paused = true)]
async fn failed_samples_keep_the_last_snapshot_and_sampling_goes_on() {
    let reading = |c| FakeStep::Reading(Snapshot::new("fake").with_zone(Zone::new("gpu", c)));
    let fake = FakeSource::with_steps([
        reading(50.0),
        FakeStep::Fail("i2c timeout".into()),
        FakeStep::Fail("i2c timeout".into()),
        reading(60.0),
    ]);
    let handle = fake.handle();
    let sampler = spawn(fake, SamplerConfig::default());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(handle.samples(), 2);
    assert_eq!(
        sampler.latest().map(|r| r.snapshot.zones[0].celsius),
        Some(50.0)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(handle.samples(), 4);
    assert_eq!(temps_of(&sampler.history()), [50.0, 60.0]);
}

#[tokio::test(start_paused = true)]
async fn admission_state_rides_beside_every_snapshot() {
    let fake = FakeSource::temperatures("gpu", [50.0, 90.0, 100.0, 92.0, 70.0]);
    let handle = fake.handle();
    let config = SamplerConfig {
        admission: Some(AdmissionConfig::new(85.0, 95.0)),
        ..SamplerConfig::default()
    };
    let sampler = spawn(fake, config);
    let mut rx = sampler.subscribe();
    let mut seen = Vec::new();
    for _ in 0..5 {
        rx.changed().await.expect("snapshot");
        seen.push(sampler.thermal_state());
    }
    use ThermalState::{Critical, Hot, Normal};
    assert_eq!(seen, [Normal, Hot, Critical, Critical, Normal]);
    let states: Vec<_> = sampler.history().iter().map(|r| r.state).collect();
    assert_eq!(
        states,
        [Normal, Hot, Critical, Critical, Normal].map(Some),
        "history keeps each reading's state"
    );
    // The daemon's tests heat the board up through the handle.
    handle.push_temperature("gpu", 99.0);
    rx.changed().await.expect("snapshot");
    assert_eq!(sampler.thermal_state(), Critical);
}

#[tokio::test(start_paused = true)]
async fn throttling_is_detected_into_the_snapshot() {
    let hot = Snapshot::new("fake")
        .with_zone(Zone::new("gpu-thermal", 100.0).passive(99.0))
        .with_clock(Clock::new("gpu", 612_000_000, Some(918_000_000)));
    let sampler = spawn(FakeSource::new([hot]), SamplerConfig::default());
    sampler.subscribe().changed().await.expect("snapshot");
    let latest = sampler.latest().expect("latest").snapshot;
    assert_eq!(latest.throttle.len(), 1);
    assert_eq!(latest.throttle[0].cause, ThrottleCause::Thermal);
    assert!(latest.throttled(ThrottleCause::Thermal));
    assert!(!latest.throttled(ThrottleCause::Power));
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_sampling() {
    let fake = FakeSource::temperatures("gpu", [50.0]);
    let handle = fake.handle();
    let sampler = spawn(fake, SamplerConfig::default());
    sampler.subscribe().changed().await.expect("snapshot");
    sampler.shutdown().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(handle.samples(), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_sampler_stops_sampling() {
    let fake = FakeSource::temperatures("gpu", [50.0]);
    let handle = fake.handle();
    let sampler = spawn(fake, SamplerConfig::default());
    let mut rx = sampler.subscribe();
    rx.changed().await.expect("snapshot");
    drop(sampler);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(handle.samples(), 1);
    assert!(
        rx.changed().await.is_err(),
        "the task ended and dropped its sender"
    );
}

#[tokio::test]
async fn zero_interval_is_rejected_naming_the_field() {
    let config = SamplerConfig {
        interval: Duration::ZERO,
        ..SamplerConfig::default()
    };
    match Sampler::spawn(Box::new(FakeSource::new([])), config) {
        Err(ThermalError::InvalidConfig { field, .. }) => assert_eq!(field, "interval"),
        Err(other) => panic!("expected InvalidConfig, got {other:?}"),
        Ok(_) => panic!("zero interval accepted"),
    }
}

#[tokio::test]
async fn invalid_admission_config_is_rejected_before_starting() {
    let config = SamplerConfig {
        admission: Some(AdmissionConfig::new(95.0, 85.0)),
        ..SamplerConfig::default()
    };
    match Sampler::spawn(Box::new(FakeSource::new([])), config) {
        Err(ThermalError::InvalidConfig { field, .. }) => assert_eq!(field, "critical_c"),
        Err(other) => panic!("expected InvalidConfig, got {other:?}"),
        Ok(_) => panic!("bad admission config accepted"),
    }
}

#[test]
fn reading_serializes_as_the_snapshot_plus_its_thermal_state() {
    let snapshot = Snapshot::new("fake").with_zone(Zone::new("gpu", 71.5));
    let hot = serde_json::to_value(Reading::new(snapshot.clone(), Some(ThermalState::Hot)))
        .expect("serializes");
    let mut expected = serde_json::to_value(&snapshot).expect("serializes");
    expected["thermal_state"] = "hot".into();
    assert_eq!(hot, expected);
    let bare = serde_json::to_value(Reading::new(snapshot, None)).expect("serializes");
    assert_eq!(bare["thermal_state"], serde_json::Value::Null, "{bare}");
    assert_eq!(bare["zones"][0]["celsius"], 71.5, "{bare}");
}

/// On its own thread the sampler runs on real time: it samples, publishes, and stops.
#[tokio::test]
async fn a_sampler_on_its_own_thread_samples_and_stops() {
    let fake = FakeSource::temperatures("gpu", [40.0, 41.0, 42.0]);
    let handle = fake.handle();
    let config = SamplerConfig {
        interval: Duration::from_millis(20),
        ..SamplerConfig::default()
    };
    let sampler = match Sampler::spawn_on_own_thread(Box::new(fake), config) {
        Ok(sampler) => sampler,
        Err(e) => panic!("sampler did not start: {e}"),
    };
    let mut rx = sampler.subscribe();
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .expect("a snapshot within 10 s")
            .expect("the sampler is running");
    }
    assert_eq!(temps_of(&sampler.history())[..3], [40.0, 41.0, 42.0]);
    tokio::time::timeout(Duration::from_secs(10), sampler.shutdown())
        .await
        .expect("stopped within 10 s");
    let taken = handle.samples();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(handle.samples(), taken, "no sample after the stop");
}
