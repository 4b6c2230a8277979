//! Wall-clock time, injected: the one trait every crate reads `SystemTime` through, so tests
//! pin it (`clippy.toml` bans `SystemTime::now` elsewhere). Decisions that must not jump
//! with NTP (leases, buckets, timeouts) run on `tokio::time::Instant` instead; the rate
//! limiter's own `Clock` pairs the two.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// A source of wall-clock time.
pub trait WallClock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemWallClock;

/// A clock that only moves when told to, for tests.
#[derive(Debug)]
pub struct ManualWallClock(Mutex<SystemTime>);

// === impl SystemWallClock ===

impl WallClock for SystemWallClock {
    // The one place allowed to read the system clock (clippy.toml bans it elsewhere).
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

// === impl ManualWallClock ===

impl ManualWallClock {
    /// A clock frozen at `start`.
    pub fn new(start: SystemTime) -> Self {
        Self(Mutex::new(start))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *t += by;
    }
}

impl WallClock for ManualWallClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_advances() {
        let c = ManualWallClock::new(SystemTime::UNIX_EPOCH);
        c.advance(Duration::from_secs(5));
        assert_eq!(c.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(5));
        assert!(SystemWallClock.now() > SystemTime::UNIX_EPOCH);
    }
}
