//! A snapshot with the admission state after it: what the sampler publishes and keeps.

use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::admission::ThermalState;
use crate::snapshot::Snapshot;

/// One snapshot and the admission state the sampler reached after it.
///
/// Serializes as the snapshot's fields plus `thermal_state` (`null` when no admission runs):
/// the shape `/v1/status` and `/v1/thermal` have always shown.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub snapshot: Arc<Snapshot>,
    /// `None` when the sampler runs no admission.
    pub state: Option<ThermalState>,
}

impl Reading {
    pub fn new(snapshot: impl Into<Arc<Snapshot>>, state: Option<ThermalState>) -> Self {
        Reading {
            snapshot: snapshot.into(),
            state,
        }
    }

    /// The admission state, `normal` when no admission runs.
    pub fn state_or_normal(&self) -> ThermalState {
        self.state.unwrap_or(ThermalState::Normal)
    }
}

impl Serialize for Reading {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Flat<'a> {
            #[serde(flatten)]
            snapshot: &'a Snapshot,
            thermal_state: Option<ThermalState>,
        }
        Flat {
            snapshot: &self.snapshot,
            thermal_state: self.state,
        }
        .serialize(serializer)
    }
}
