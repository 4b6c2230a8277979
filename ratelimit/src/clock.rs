//! Time, injected.
//!
//! The limiter needs two kinds of time and keeps them apart on purpose:
//!
//! - **monotonic** time ([`tokio::time::Instant`]) for bucket arithmetic in the local
//!   backend and for the fallback circuit. It never jumps when NTP steps the wall clock, and
//!   tokio's paused test clock (`#[tokio::test(start_paused = true)]`, `time::advance`)
//!   drives it, so refill is tested without sleeping;
//! - **wall-clock** Unix time to print `X-RateLimit-Reset` as absolute epoch seconds, and to
//!   place calendar quotas' windows (which UTC day or month it is, and how long is left).
//!
//! [`SystemClock`] is the only code in the crate allowed to read the real wall clock;
//! [`ManualClock`] lets tests move both clocks by hand. The Redis backend ignores both for
//! its bucket decisions: it runs on Redis server time (`TIME`), the one clock every replica
//! shares. Calendar windows are the exception, taken from this clock in every backend (see
//! the trade-off in [`policy`](crate::policy)).

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A source of monotonic and wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Monotonic now, for bucket arithmetic.
    fn now(&self) -> Instant;

    /// Time since the Unix epoch, for `X-RateLimit-Reset` and calendar quota windows.
    fn unix_now(&self) -> Duration;
}

/// The real clock: tokio's monotonic clock (pausable in tests) and the system wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// A clock that only moves when told to; for tests.
///
/// Both readings advance together through [`ManualClock::advance`].
#[derive(Debug)]
pub struct ManualClock {
    state: Mutex<ManualState>,
}

#[derive(Debug, Clone, Copy)]
struct ManualState {
    now: Instant,
    unix: Duration,
}

// === impl SystemClock ===

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    // The one sanctioned read of the wall clock in this crate (see clippy.toml).
    #[allow(clippy::disallowed_methods)]
    fn unix_now(&self) -> Duration {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            // A wall clock before 1970 is a broken host; report the epoch rather than panic.
            .unwrap_or_default()
    }
}

// === impl ManualClock ===

impl ManualClock {
    /// A clock starting at tokio's current instant and at `unix` seconds past the epoch.
    pub fn new(unix: Duration) -> Self {
        Self {
            state: Mutex::new(ManualState {
                now: Instant::now(),
                unix,
            }),
        }
    }

    /// Moves both readings forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut state = self.lock();
        state.now += by;
        state.unix += by;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ManualState> {
        // The state is two plain values; a panic elsewhere cannot leave it half-written.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Default for ManualClock {
    /// Starts at 2023-11-14T22:13:20Z (epoch second 1 700 000 000), a readable constant.
    fn default() -> Self {
        Self::new(Duration::from_secs(1_700_000_000))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.lock().now
    }

    fn unix_now(&self) -> Duration {
        self.lock().unix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_readings() {
        let clock = ManualClock::default();
        let (t0, u0) = (clock.now(), clock.unix_now());
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now() - t0, Duration::from_millis(1500));
        assert_eq!(clock.unix_now() - u0, Duration::from_millis(1500));
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.unix_now() > Duration::from_secs(1_577_836_800));
    }
}
