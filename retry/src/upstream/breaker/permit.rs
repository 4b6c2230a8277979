//! The admission to send one request, and how its outcome gets back to the breaker.

use std::sync::Arc;

use tokio::time::Instant;

use super::Shared;
use crate::classify::BreakerOutcome;

/// Admission to send one request; record its outcome with [`BreakerPermit::record`].
#[derive(Debug)]
#[must_use = "record the request's outcome"]
pub(crate) struct BreakerPermit {
    pub(super) shared: Arc<Shared>,
    pub(super) generation: u64,
    pub(super) caller: u64,
    pub(super) probe: bool,
    pub(super) done: bool,
}

// === impl BreakerPermit ===

impl BreakerPermit {
    /// Whether this permit is a half-open probe (its request gets one attempt).
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
    }

    /// Whether the breaker is still in the state that admitted this permit. A request
    /// whose breaker opened (or turned half-open) meanwhile stops retrying.
    pub(crate) fn is_current(&self) -> bool {
        self.shared.lock().generation == self.generation
    }

    /// Records the outcome of the request this permit admitted (of its last attempt, which
    /// ended at `now`).
    pub(crate) fn record(mut self, outcome: BreakerOutcome, now: Instant) {
        self.done = true;
        self.shared
            .on_outcome(self.generation, self.probe, self.caller, Some(outcome), now);
    }
}

impl Drop for BreakerPermit {
    fn drop(&mut self) {
        if !self.done && self.probe {
            self.shared
                .on_outcome(self.generation, true, self.caller, None, Instant::now());
        }
    }
}
