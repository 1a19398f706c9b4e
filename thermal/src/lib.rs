//! `inferloop-thermal`: temperatures, clocks, power rails and throttling, and the thermal
//! admission state the scheduler obeys.
//!
//! # Layout
//! - [`source`]: the [`Source`] trait and its implementations: [`JetsonSysfs`] (zones, GPU
//!   devfreq, cpufreq, EMC, INA3221 rails, `nvpmodel`), [`NvmlSource`] (libnvidia-ml loaded
//!   at run time), [`LinuxSysfs`] (zones and hwmon anywhere), [`FakeSource`] (scripted, for
//!   tests), [`Merged`], and [`open_auto`] which picks one.
//! - [`sysfs`]: the tolerant file readers those sources share, all under an injectable root.
//! - [`snapshot`]: [`Snapshot`], one reading of everything.
//! - [`reading`]: [`Reading`], a snapshot with the admission state after it; what the
//!   sampler publishes, serialized for the HTTP API.
//! - [`throttle`]: throttling inferred from a snapshot, and a tracker that logs each start
//!   and stop once.
//! - [`admission`]: the `normal → hot → critical` state machine with hysteresis
//!   ([`Admission`]): `max_active(slots)` and `admit_new()`; the cap for a state is
//!   [`AdmissionConfig::max_active`], the one place it is computed.
//! - [`sampler`]: the tokio task that samples every interval and keeps the latest reading
//!   (a `watch` channel) and a bounded history.
//! - [`render`]: a reading as a text table.
//! - [`error`]: the one error type, [`ThermalError`].

pub mod admission;
pub mod error;
pub mod reading;
pub mod render;
pub mod sampler;
pub mod snapshot;
pub mod source;
pub mod sysfs;
pub mod throttle;

pub use admission::{Admission, AdmissionConfig, StateChange, ThermalState};
pub use error::ThermalError;
pub use reading::Reading;
pub use render::render_table;
pub use sampler::{Sampler, SamplerConfig};
pub use snapshot::{ActivePowerMode, Clock, Rail, Snapshot, Zone};
pub use source::fake::{FakeHandle, FakeSource, FakeStep};
pub use source::jetson::JetsonSysfs;
pub use source::linux::LinuxSysfs;
pub use source::nvml::NvmlSource;
pub use source::nvpmodel::{CommandRunner, SystemRunner};
pub use source::{open_auto, Merged, Source};
pub use throttle::{Throttle, ThrottleCause, ThrottleTracker, ThrottleTransition};
