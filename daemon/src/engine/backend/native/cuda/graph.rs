//! The pass as CUDA graphs: the launches of a pass, captured once per [`Shape`] (token
//! count, wanted rows) into a graph that one launch replays. Every per-step value lives in
//! device memory (uploaded before the launch) and every buffer lives as long as the pass, so
//! a graph never goes stale; the logits are downloaded after it, outside.
//!
//! Graphs are on unless [`GRAPHS_ENV`] is `0` (or [`Graphs::set`] turns them off). A capture
//! the driver refuses turns them off for the pass, with a warning, and the pass goes on with
//! its launches made one by one: the same kernels with the same arguments, so the same bits.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use inferloop_kernels::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use inferloop_kernels::cuda::cudarc::driver::{CudaGraph, CudaStream};

use super::super::error::NativeError;
use super::memory::op;
use super::step::Shape;

/// Set to `0` to launch each kernel of a pass one by one instead of replaying a graph.
pub const GRAPHS_ENV: &str = "INFERLOOP_CUDA_GRAPHS";

/// The pass's graphs, one per shape met so far.
pub(super) struct Graphs {
    on: bool,
    by_shape: HashMap<Shape, OwnedGraph>,
}

/// A graph the pass owns.
struct OwnedGraph(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one are not
// concurrent (CUDA's "graph thread safety"); this one is reached only through the pass's
// `&mut self`, one call at a time. cudarc leaves `CudaGraph` !Send only for its raw handles.
unsafe impl Send for OwnedGraph {}

impl Graphs {
    /// On unless [`GRAPHS_ENV`] says `0`.
    pub(super) fn from_env() -> Self {
        let on = std::env::var(GRAPHS_ENV).map_or(true, |v| v.trim() != "0");
        Self {
            on,
            by_shape: HashMap::new(),
        }
    }

    pub(super) fn set(&mut self, on: bool) {
        self.on = on;
        if !on {
            self.by_shape.clear();
        }
    }

    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// Runs a pass of shape `sh` on `st`: replays its graph (captured from `launch` the first
    /// time), or calls `launch` itself when graphs are off.
    pub(super) fn run(
        &mut self,
        st: &Arc<CudaStream>,
        sh: Shape,
        mut launch: impl FnMut() -> Result<(), NativeError>,
    ) -> Result<(), NativeError> {
        if !self.on {
            return launch();
        }
        let graph = match self.by_shape.entry(sh) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => match capture(st, &mut launch)? {
                Some(g) => v.insert(OwnedGraph(g)),
                None => {
                    self.set(false);
                    return launch();
                }
            },
        };
        graph.0.launch().map_err(op(None, "graph launch"))
    }
}

/// Captures `launch` on `st` into a graph: `Ok(None)` when the driver refuses to capture
/// (graphs are then turned off), an error when `launch` itself fails.
fn capture(
    st: &Arc<CudaStream>,
    launch: &mut impl FnMut() -> Result<(), NativeError>,
) -> Result<Option<CudaGraph>, NativeError> {
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    if let Err(e) = st.begin_capture(mode) {
        tracing::warn!("CUDA graphs off: the stream cannot be captured ({e})");
        return Ok(None);
    }
    let launched = launch();
    // End the capture whatever happened, or the stream stays capturing.
    let graph = st.end_capture(CUgraphInstantiate_flags(0));
    launched?;
    match graph {
        Ok(Some(g)) => Ok(Some(g)),
        Ok(None) => {
            tracing::warn!("CUDA graphs off: the capture made no graph");
            Ok(None)
        }
        Err(e) => {
            tracing::warn!("CUDA graphs off: capturing the pass failed ({e})");
            Ok(None)
        }
    }
}
