//! `inferloop-board`: what device am I on, and what does its data sheet say.
//!
//! # Layout
//! - [`profile`]: [`BoardProfile`] and the compiled-in TOML files under `board/profiles/`
//!   (strict parsing, value checks, [`profile::builtin`], [`profile::find`]).
//! - [`detect`]: [`Detector`] runs the rules in order: `--board` override, the device tree
//!   under an injectable [`Roots`], a CUDA GPU via NVML, the CPU architecture; and the
//!   resulting [`Detection`] says why.
//! - [`gpu`]: the NVML probe (libnvidia-ml loaded at run time) behind the [`GpuProbe`] trait.
//! - [`render`]: the detection as text for `inferloopd board`.
//! - [`error`]: the one error type, [`BoardError`].

pub mod detect;
pub mod error;
pub mod gpu;
pub mod profile;
pub mod render;

pub use detect::{Detection, Detector, HostFacts, Reason, Roots};
pub use error::BoardError;
pub use gpu::{GpuInfo, GpuProbe, NoGpu, NoGpuProbe, NvmlProbe};
pub use profile::{
    BoardProfile, ComputeCapability, GpuSpec, OtaSlot, OtaSpec, PerfFloors, PowerMode,
    ThermalZoneSpec,
};
pub use render::render_detection;
