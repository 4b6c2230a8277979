//! Wall-clock time, injected.
//!
//! Only *informational* timestamps (a record's `created_at`/`expires_at` in the admin view)
//! come from here. Decisions never do: the memory store's leases and TTLs run on
//! `tokio::time::Instant` (pausable in tests) and the Redis/PostgreSQL stores decide on the
//! server's clock, so skew between gateway replicas cannot hand out a lease twice.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// A clock that only moves when told to, for tests.
#[derive(Debug)]
pub struct ManualClock(Mutex<SystemTime>);

// === impl SystemClock ===

impl Clock for SystemClock {
    // The one place allowed to read the system clock (clippy.toml bans it elsewhere).
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

// === impl ManualClock ===

impl ManualClock {
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

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_advances() {
        let c = ManualClock::new(SystemTime::UNIX_EPOCH);
        c.advance(Duration::from_secs(5));
        assert_eq!(c.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(5));
        assert!(SystemClock.now() > SystemTime::UNIX_EPOCH);
    }
}
