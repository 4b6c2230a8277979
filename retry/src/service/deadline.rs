//! A request's effective deadline: the policy's total time, or the client's own deadline when
//! that comes first.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// The effective deadline of one request, on both clocks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    pub(super) at: Instant,
    pub(super) wall: SystemTime,
}

// === impl Deadline ===

impl Deadline {
    /// `min(now + total, incoming)`; `None` when the incoming deadline has passed.
    pub(super) fn new(
        now: Instant,
        wall_now: SystemTime,
        total: Duration,
        incoming: Option<SystemTime>,
    ) -> Option<Self> {
        let own = Self {
            at: now + total,
            wall: wall_now + total,
        };
        let Some(incoming) = incoming else {
            return Some(own);
        };
        match incoming.duration_since(wall_now) {
            Ok(left) if left.is_zero() => None,
            Ok(left) if left < total => Some(Self {
                at: now + left,
                wall: incoming,
            }),
            Ok(_) => Some(own),
            Err(_) => None,
        }
    }

    /// Time left from `now`.
    pub(super) fn left(&self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }
}
