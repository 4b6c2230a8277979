//! Metric handles of one dependency, registered once and then reused: recording is an
//! atomic add, with no label `String` built and no registry lookup per request (as the
//! gateway's route metrics). Each handle is registered on its first use rather than at
//! start-up, so a series appears in the exposition exactly when it did before (a counter
//! with nothing to count yet is not shown as 0).

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, SharedString};

use super::policy::MAX_RETRIES_LIMIT;

/// A handle registered on first use.
type Lazy<T> = OnceLock<T>;

/// `retry_attempts_total` slots: attempt numbers 2 ..= `MAX_RETRIES_LIMIT + 1`.
const RETRY_SLOTS: usize = MAX_RETRIES_LIMIT as usize;

/// Why a retryable failure was returned without another attempt (the `reason` label of
/// `retry_suppressed_total`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stop {
    Attempts,
    Dns,
    Deadline,
    Body,
    Budget,
    Breaker,
    Probe,
    Pushback,
    ClientRetry,
    Throttled,
}

/// The request-path metrics of one dependency (see the crate docs' "Observability").
#[derive(Debug)]
pub(crate) struct UpstreamMetrics {
    label: SharedString,
    requests: Lazy<Counter>,
    attempts: Lazy<Counter>,
    retries: [Lazy<Counter>; RETRY_SLOTS],
    exhausted: Lazy<Counter>,
    suppressed: [Lazy<Counter>; Stop::COUNT],
}

/// The budget's metrics.
#[derive(Debug)]
pub(crate) struct BudgetMetrics {
    label: SharedString,
    exhausted: Lazy<Counter>,
    utilization: Lazy<Gauge>,
}

/// The breaker's metrics.
#[derive(Debug)]
pub(crate) struct BreakerMetrics {
    label: SharedString,
    rejected: Lazy<Counter>,
    state: Lazy<Gauge>,
}

// === impl Stop ===

impl Stop {
    const COUNT: usize = 10;

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Attempts => "attempts_exhausted",
            Self::Dns => "dns_attempts_exhausted",
            Self::Deadline => "deadline",
            Self::Body => "body_not_replayable",
            Self::Budget => "budget_exhausted",
            Self::Breaker => "breaker_open",
            Self::Probe => "half_open_probe",
            Self::Pushback => "grpc_pushback",
            Self::ClientRetry => "client_retry",
            Self::Throttled => "adaptive_throttled",
        }
    }
}

// === impl UpstreamMetrics ===

impl UpstreamMetrics {
    pub(crate) fn new(name: &Arc<str>) -> Self {
        Self {
            label: SharedString::from(name.clone()),
            requests: Lazy::new(),
            attempts: Lazy::new(),
            retries: Default::default(),
            exhausted: Lazy::new(),
            suppressed: Default::default(),
        }
    }

    /// `upstream_requests_total{dependency}`: one per request with a retry target.
    pub(crate) fn request(&self) {
        let label = &self.label;
        self.requests
            .get_or_init(
                || metrics::counter!("upstream_requests_total", "dependency" => label.clone()),
            )
            .increment(1);
    }

    /// `upstream_attempts_total{dependency}`: one per attempt, the first included.
    pub(crate) fn attempt(&self) {
        let label = &self.label;
        self.attempts
            .get_or_init(
                || metrics::counter!("upstream_attempts_total", "dependency" => label.clone()),
            )
            .increment(1);
    }

    /// `retry_attempts_total{dependency,attempt_number}` for attempt `number` (2 and later).
    pub(crate) fn retry(&self, number: u32) {
        let register = || {
            metrics::counter!(
                "retry_attempts_total",
                "dependency" => self.label.clone(),
                "attempt_number" => number.to_string()
            )
        };
        let slot = usize::try_from(number)
            .ok()
            .and_then(|n| n.checked_sub(2))
            .and_then(|i| self.retries.get(i));
        match slot {
            Some(slot) => slot.get_or_init(register).increment(1),
            // Beyond the policy's range (cannot happen with a validated policy): still counted.
            None => register().increment(1),
        }
    }

    /// `retry_suppressed_total{dependency,reason}`, and `retry_exhausted_total{dependency}`
    /// when the policy's own limits (attempts, DNS attempts, deadline) stopped the request.
    pub(crate) fn suppressed(&self, stop: Stop) {
        let label = &self.label;
        if matches!(stop, Stop::Attempts | Stop::Dns | Stop::Deadline) {
            self.exhausted
                .get_or_init(
                    || metrics::counter!("retry_exhausted_total", "dependency" => label.clone()),
                )
                .increment(1);
        }
        self.suppressed[stop as usize]
            .get_or_init(|| {
                metrics::counter!(
                    "retry_suppressed_total",
                    "dependency" => label.clone(),
                    "reason" => stop.as_str()
                )
            })
            .increment(1);
    }
}

// === impl BudgetMetrics ===

impl BudgetMetrics {
    pub(crate) fn new(name: &Arc<str>) -> Self {
        Self {
            label: SharedString::from(name.clone()),
            exhausted: Lazy::new(),
            utilization: Lazy::new(),
        }
    }

    /// `retry_budget_exhausted_total{dependency}`.
    pub(crate) fn exhausted(&self) {
        let label = &self.label;
        self.exhausted
            .get_or_init(
                || metrics::counter!("retry_budget_exhausted_total", "dependency" => label.clone()),
            )
            .increment(1);
    }

    /// `retry_budget_utilization_ratio{dependency}`.
    pub(crate) fn utilization(&self, ratio: f64) {
        let label = &self.label;
        self.utilization
            .get_or_init(
                || metrics::gauge!("retry_budget_utilization_ratio", "dependency" => label.clone()),
            )
            .set(ratio);
    }
}

// === impl BreakerMetrics ===

impl BreakerMetrics {
    pub(crate) fn new(name: &Arc<str>) -> Self {
        Self {
            label: SharedString::from(name.clone()),
            rejected: Lazy::new(),
            state: Lazy::new(),
        }
    }

    /// `circuit_breaker_rejected_total{dependency}`.
    pub(crate) fn rejected(&self) {
        let label = &self.label;
        self.rejected
            .get_or_init(|| metrics::counter!("circuit_breaker_rejected_total", "dependency" => label.clone()))
            .increment(1);
    }

    /// `circuit_breaker_state{dependency}`: 0 closed, 1 half-open, 2 open.
    pub(crate) fn state(&self, value: u8) {
        let label = &self.label;
        self.state
            .get_or_init(|| metrics::gauge!("circuit_breaker_state", "dependency" => label.clone()))
            .set(f64::from(value));
    }
}
