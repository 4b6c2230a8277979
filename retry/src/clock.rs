//! Wall-clock time, injected. The retry layer needs it only at the edges: to read an
//! incoming `X-Request-Deadline`, to forward the deadline, and to turn a `Retry-After`
//! HTTP-date into a wait. Everything else runs on `tokio::time::Instant`.

use std::{
    sync::Mutex,
    time::{Duration, SystemTime},
};

use tokio::time::Instant;

/// A source of wall-clock time.
pub trait WallClock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemWallClock;

/// A clock for tests: starts at a chosen time, follows tokio's (pausable) clock, and can
/// be moved by hand.
#[derive(Debug)]
pub struct ManualWallClock {
    start: SystemTime,
    anchor: Instant,
    offset: Mutex<Duration>,
}

// === impl SystemWallClock ===

impl WallClock for SystemWallClock {
    // The one place in this module that reads the system clock (clippy.toml bans it
    // elsewhere).
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

// === impl ManualWallClock ===

impl ManualWallClock {
    /// A clock reading `start` now; it then advances with `tokio::time`.
    pub fn new(start: SystemTime) -> Self {
        Self {
            start,
            anchor: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        }
    }

    /// Moves the clock forward by `by` without moving tokio's clock.
    pub fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().unwrap_or_else(|e| e.into_inner());
        *offset += by;
    }
}

impl WallClock for ManualWallClock {
    fn now(&self) -> SystemTime {
        let offset = *self.offset.lock().unwrap_or_else(|e| e.into_inner());
        self.start + Instant::now().saturating_duration_since(self.anchor) + offset
    }
}
