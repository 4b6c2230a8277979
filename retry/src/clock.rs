//! Wall-clock time ([`WallClock`], shared by the crates). The retry layer needs it only at
//! the edges: to read an incoming `X-Request-Deadline`, to forward the deadline, and to turn
//! a `Retry-After` HTTP-date into a wait. Everything else runs on `tokio::time::Instant`.

pub use portcullis_problem::clock::{SystemWallClock, WallClock};

#[cfg(test)]
pub(crate) use self::manual::ManualWallClock;

/// The test clock: tests pin the wall clock to a known instant.
#[cfg(test)]
mod manual {
    use std::time::SystemTime;

    use tokio::time::Instant;

    use super::WallClock;

    /// A clock for tests: starts at a chosen time and follows tokio's (pausable) clock.
    #[derive(Debug)]
    pub(crate) struct ManualWallClock {
        start: SystemTime,
        anchor: Instant,
    }

    // === impl ManualWallClock ===

    impl ManualWallClock {
        /// A clock reading `start` now; it then advances with `tokio::time`.
        pub(crate) fn new(start: SystemTime) -> Self {
            Self {
                start,
                anchor: Instant::now(),
            }
        }
    }

    impl WallClock for ManualWallClock {
        fn now(&self) -> SystemTime {
            self.start + Instant::now().saturating_duration_since(self.anchor)
        }
    }
}
