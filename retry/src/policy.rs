//! Retry policy: validated parameters of one route/upstream (docs/retry-policy.md).

use std::{fmt, str::FromStr, time::Duration};

/// Default first backoff window (docs/retry-policy.md).
pub(crate) const DEFAULT_BASE: Duration = Duration::from_secs(1);
/// Default backoff cap (docs/retry-policy.md).
pub(crate) const DEFAULT_CAP: Duration = Duration::from_secs(30);
/// Default number of retries after the first attempt (docs/retry-policy.md, synchronous calls).
pub(crate) const DEFAULT_MAX_RETRIES: u32 = 3;
/// Upper bound of `max_retries` (docs/retry-policy.md; 0 disables retries).
pub(crate) const MAX_RETRIES_LIMIT: u32 = 5;
/// Default and maximum total duration of a synchronous call (docs/retry-policy.md).
pub(crate) const DEFAULT_TOTAL: Duration = Duration::from_secs(30);
/// Maximum total duration of a synchronous call (docs/retry-policy.md).
pub(crate) const MAX_TOTAL: Duration = Duration::from_secs(30);
/// Default size up to which request bodies are buffered for replay.
pub(crate) const DEFAULT_BODY_REPLAY_LIMIT: usize = 64 * 1024;
/// Largest allowed replay buffer per request.
pub(crate) const MAX_BODY_REPLAY_LIMIT: usize = 16 * 1024 * 1024;
/// Default time to wait for response headers of one attempt.
pub(crate) const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Randomisation of the backoff (docs/retry-policy.md). Equal jitter and fixed intervals do not
/// exist here on purpose: they are refused when parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// `sleep = random(0, min(cap, base · 2^n))` for the n-th retry (n from 0). Default.
    #[default]
    Full,
    /// `sleep = min(cap, random(base, prev · 3))`, `prev` starting at `base`.
    Decorrelated,
}

/// When a hedged request sends its second copy (`hedge = { after = … }` on a route).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeAfter {
    /// Once the first attempt has taken longer than this quantile of the upstream's measured
    /// attempt latency (`"p95"` is 0.95); no hedge until enough attempts are measured.
    Quantile(f64),
    /// After a fixed delay.
    Fixed(Duration),
}

impl FromStr for HedgeAfter {
    type Err = InvalidRetryConfig;

    /// `"p50"` … `"p99.9"`; durations are parsed by the configuration loader.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim()
            .strip_prefix('p')
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|n| (50.0..100.0).contains(n))
            .map(|n| Self::Quantile(n / 100.0))
            .ok_or_else(|| InvalidRetryConfig {
                field: "after",
                value: format!("{s:?}"),
                allowed: "a percentile \"p50\" to \"p99.9\", or a duration".to_owned(),
            })
    }
}

/// A configuration value outside its allowed range; names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: allowed {allowed}")]
pub struct InvalidRetryConfig {
    /// Field name as written in the configuration (`max_retries`, `jitter`, …).
    pub field: &'static str,
    /// The refused value, rendered for the message.
    pub value: String,
    /// The allowed range or set.
    pub allowed: String,
}

/// Unvalidated retry parameters, as the config loader reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryParams {
    /// Retries after the first attempt; 0..=5.
    pub max_retries: u32,
    /// First backoff window; > 0.
    pub base: Duration,
    /// Largest backoff window; ≥ base.
    pub cap: Duration,
    /// Total duration of the call including all attempts and waits; (0, 30 s].
    pub total: Duration,
    /// Backoff randomisation.
    pub jitter: Jitter,
    /// Request bodies up to this size are buffered so they can be replayed; 0..=16 MiB.
    pub body_replay_limit: usize,
    /// Time to wait for response headers of one attempt; > 0. Always further limited by
    /// the remaining deadline. With `auto_attempt_timeout_floor`, the ceiling of the
    /// learned timeout.
    pub attempt_timeout: Duration,
    /// `attempt_timeout = "auto"`: the timeout is 3 × the upstream's measured p99, within
    /// `[floor, attempt_timeout]` (the ceiling until enough attempts are measured).
    pub auto_attempt_timeout_floor: Option<Duration>,
    /// Hedging: for an idempotent request, a second copy of the first attempt is sent to
    /// another endpoint once the first has taken this long; the first answer wins.
    pub hedge_after: Option<HedgeAfter>,
}

/// A validated retry policy. Built once at start-up, shared as `Arc<RetryPolicy>`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    params: RetryParams,
}

// === impl Jitter ===

const JITTER_ALLOWED: &str =
    "\"full\" | \"decorrelated\" (equal jitter and fixed-interval retry are not allowed: docs/retry-policy.md)";

impl FromStr for Jitter {
    type Err = InvalidRetryConfig;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(Self::Full),
            "decorrelated" => Ok(Self::Decorrelated),
            _ => Err(InvalidRetryConfig {
                field: "jitter",
                value: format!("{s:?}"),
                allowed: JITTER_ALLOWED.to_owned(),
            }),
        }
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full => "full",
            Self::Decorrelated => "decorrelated",
        })
    }
}

// === impl RetryParams ===

impl Default for RetryParams {
    fn default() -> Self {
        Self {
            max_retries: DEFAULT_MAX_RETRIES,
            base: DEFAULT_BASE,
            cap: DEFAULT_CAP,
            total: DEFAULT_TOTAL,
            jitter: Jitter::Full,
            body_replay_limit: DEFAULT_BODY_REPLAY_LIMIT,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            auto_attempt_timeout_floor: None,
            hedge_after: None,
        }
    }
}

// === impl RetryPolicy ===

impl RetryPolicy {
    /// Validates `params`; the error names the first offending field.
    pub fn try_new(params: RetryParams) -> Result<Self, InvalidRetryConfig> {
        let bad = |field, value: String, allowed: &str| InvalidRetryConfig {
            field,
            value,
            allowed: allowed.to_owned(),
        };
        if params.max_retries > MAX_RETRIES_LIMIT {
            return Err(bad("max_retries", params.max_retries.to_string(), "0..=5"));
        }
        if params.base.is_zero() {
            return Err(bad("base", format!("{:?}", params.base), "> 0s"));
        }
        if params.cap < params.base {
            return Err(bad(
                "cap",
                format!("{:?}", params.cap),
                &format!(">= base ({:?})", params.base),
            ));
        }
        if params.total.is_zero() || params.total > MAX_TOTAL {
            return Err(bad(
                "total",
                format!("{:?}", params.total),
                "(0s, 30s] for synchronous calls (docs/retry-policy.md)",
            ));
        }
        if params.body_replay_limit > MAX_BODY_REPLAY_LIMIT {
            return Err(bad(
                "body_replay_limit",
                params.body_replay_limit.to_string(),
                "0..=16777216 bytes",
            ));
        }
        if params.attempt_timeout.is_zero() {
            return Err(bad(
                "attempt_timeout",
                format!("{:?}", params.attempt_timeout),
                "> 0s",
            ));
        }
        if let Some(floor) = params.auto_attempt_timeout_floor {
            if floor.is_zero() || floor > params.attempt_timeout {
                return Err(bad(
                    "attempt_timeout_floor",
                    format!("{floor:?}"),
                    &format!("(0s, attempt_timeout_max ({:?})]", params.attempt_timeout),
                ));
            }
        }
        Ok(Self { params })
    }

    /// Retries after the first attempt.
    pub fn max_retries(&self) -> u32 {
        self.params.max_retries
    }

    /// Attempts in total (`max_retries + 1`).
    pub(crate) fn max_attempts(&self) -> u32 {
        self.params.max_retries + 1
    }

    /// First backoff window.
    pub fn base(&self) -> Duration {
        self.params.base
    }

    /// Largest backoff window.
    pub fn cap(&self) -> Duration {
        self.params.cap
    }

    /// Total duration of a call.
    pub fn total(&self) -> Duration {
        self.params.total
    }

    /// Backoff randomisation.
    pub fn jitter(&self) -> Jitter {
        self.params.jitter
    }

    /// Bodies up to this size are buffered for replay.
    pub(crate) fn body_replay_limit(&self) -> usize {
        self.params.body_replay_limit
    }

    /// Time to wait for response headers of one attempt toward `dependency` (before the
    /// deadline clamp): fixed, or learned from its latency.
    pub fn attempt_timeout_for(&self, dependency: &crate::UpstreamState) -> Duration {
        match self.params.auto_attempt_timeout_floor {
            None => self.params.attempt_timeout,
            Some(floor) => {
                dependency.recommended_attempt_timeout(floor, self.params.attempt_timeout)
            }
        }
    }

    /// When to hedge the first attempt toward `dependency`, if at all: the configured delay,
    /// or the configured quantile of its measured latency once known.
    pub(crate) fn hedge_delay(&self, dependency: &crate::UpstreamState) -> Option<Duration> {
        match self.params.hedge_after? {
            HedgeAfter::Fixed(after) => Some(after),
            HedgeAfter::Quantile(q) => dependency.latency_quantile(q),
        }
    }

    /// The validated parameters.
    pub fn params(&self) -> &RetryParams {
        &self.params
    }
}

impl Default for RetryPolicy {
    /// The shipped defaults (docs/retry-policy.md): full jitter, base 1 s, cap 30 s, 3 retries, 30 s total.
    fn default() -> Self {
        Self {
            params: RetryParams::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut RetryParams)) -> Result<RetryPolicy, InvalidRetryConfig> {
        let mut p = RetryParams::default();
        f(&mut p);
        RetryPolicy::try_new(p)
    }

    #[test]
    fn defaults_are_seed_002() {
        let p = RetryPolicy::default();
        assert_eq!(p.base(), Duration::from_secs(1));
        assert_eq!(p.cap(), Duration::from_secs(30));
        assert_eq!(p.max_retries(), 3);
        assert_eq!(p.total(), Duration::from_secs(30));
        assert_eq!(p.jitter(), Jitter::Full);
        assert_eq!(p.body_replay_limit(), 64 * 1024);
        assert_eq!(RetryPolicy::try_new(RetryParams::default()), Ok(p));
    }

    type Edit = fn(&mut RetryParams);

    #[test]
    fn out_of_range_values_name_the_field() {
        let cases: [(&str, Edit); 7] = [
            ("max_retries", |p| p.max_retries = 6),
            ("total", |p| p.total = Duration::from_secs(45)),
            ("total", |p| p.total = Duration::ZERO),
            ("base", |p| p.base = Duration::ZERO),
            ("cap", |p| p.cap = Duration::from_millis(500)),
            ("attempt_timeout", |p| p.attempt_timeout = Duration::ZERO),
            ("body_replay_limit", |p| p.body_replay_limit = 32 << 20),
        ];
        for (field, f) in cases {
            let err = with(f).expect_err(field);
            assert_eq!(err.field, field);
        }
        let err = with(|p| p.max_retries = 6).expect_err("6");
        assert_eq!(err.to_string(), "max_retries = 6: allowed 0..=5");
        assert!(with(|p| p.total = Duration::from_secs(45))
            .expect_err("45s")
            .to_string()
            .starts_with("total = 45s: allowed (0s, 30s]"));
    }

    #[test]
    fn edges_are_accepted() {
        assert!(with(|p| p.max_retries = 0).is_ok());
        assert!(with(|p| p.max_retries = 5).is_ok());
        assert!(with(|p| p.total = Duration::from_secs(30)).is_ok());
        assert!(with(|p| p.cap = p.base).is_ok());
        assert!(with(|p| p.body_replay_limit = 0).is_ok());
    }

    #[test]
    fn jitter_parses_full_and_decorrelated_only() {
        assert_eq!("full".parse::<Jitter>(), Ok(Jitter::Full));
        assert_eq!("Decorrelated".parse::<Jitter>(), Ok(Jitter::Decorrelated));
        for refused in ["equal", "fixed", "none", ""] {
            let err = refused.parse::<Jitter>().expect_err(refused);
            assert_eq!(err.field, "jitter");
            assert!(err.allowed.contains("docs/retry-policy.md"), "{err}");
        }
    }
}
