//! The bounds of one upstream's controller (`adaptive = { … }`), validated.

use std::time::Duration;

use crate::policy::InvalidRetryConfig;

/// Default lowest rate the controller backs off to, in requests per second.
pub const DEFAULT_MIN_RATE: f64 = 1.0;
/// Default latency gradient read as congestion.
pub const DEFAULT_LATENCY_TOLERANCE: f64 = 2.0;
/// Default longest wait at the edge for a token before a request is refused.
///
/// One second because a refused client honouring `Retry-After` (whole seconds in HTTP)
/// stays away at least that long: a request that can be sent within it is better held
/// than sent away, or the clients return in waves and the backend idles between them
/// (BENCHMARKS.md, "Adaptive throttling").
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(1);
/// Longest `max_wait` accepted: beyond it a client's own timeout is the likelier end.
const MAX_MAX_WAIT: Duration = Duration::from_secs(30);

/// Bounds of the adaptive controller of one upstream (`adaptive = { … }`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    pub(super) min_rate: f64,
    pub(super) max_rate: Option<f64>,
    pub(super) latency_tolerance: f64,
    pub(super) max_wait: Duration,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            min_rate: DEFAULT_MIN_RATE,
            max_rate: None,
            latency_tolerance: DEFAULT_LATENCY_TOLERANCE,
            max_wait: DEFAULT_MAX_WAIT,
        }
    }
}

impl AdaptiveConfig {
    /// `min_rate` (0.1..=1e6 req/s) is the floor of every decrease; `max_rate` (≥ min_rate)
    /// caps the learned rate; `latency_tolerance` (0 = latency ignored, else 1.5..=100) is
    /// the latency gradient read as congestion. `max_wait` is [`DEFAULT_MAX_WAIT`] (see
    /// [`Self::with_max_wait`]).
    pub fn try_new(
        min_rate: f64,
        max_rate: Option<f64>,
        latency_tolerance: f64,
    ) -> Result<Self, InvalidRetryConfig> {
        if !(0.1..=1e6).contains(&min_rate) {
            return Err(InvalidRetryConfig {
                field: "min_rate",
                value: min_rate.to_string(),
                allowed: "0.1..=1000000 requests per second".to_owned(),
            });
        }
        if let Some(max) = max_rate {
            if !(min_rate..=1e9).contains(&max) {
                return Err(InvalidRetryConfig {
                    field: "max_rate",
                    value: max.to_string(),
                    allowed: format!("{min_rate}..=1000000000 requests per second (≥ min_rate)"),
                });
            }
        }
        if latency_tolerance != 0.0 && !(1.5..=100.0).contains(&latency_tolerance) {
            return Err(InvalidRetryConfig {
                field: "latency_tolerance",
                value: latency_tolerance.to_string(),
                allowed: "0 (latency ignored) or 1.5..=100".to_owned(),
            });
        }
        Ok(Self {
            min_rate,
            max_rate,
            latency_tolerance,
            max_wait: DEFAULT_MAX_WAIT,
        })
    }

    /// The longest a request waits at the edge for its token (0..=30 s); one whose token
    /// comes later, or after its deadline, is refused. Zero refuses every request over the
    /// rate at once.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Result<Self, InvalidRetryConfig> {
        if max_wait > MAX_MAX_WAIT {
            return Err(InvalidRetryConfig {
                field: "max_wait",
                value: format!("{max_wait:?}"),
                allowed: "0s..=30s".to_owned(),
            });
        }
        self.max_wait = max_wait;
        Ok(self)
    }

    /// The longest a request waits at the edge for its token.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    pub(super) fn clamp(&self, rate: f64) -> f64 {
        let rate = rate.max(self.min_rate);
        self.max_rate.map_or(rate, |max| rate.min(max))
    }
}
