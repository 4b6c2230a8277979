//! Per-tenant request series and per-upstream attempt series, registered once at start-up so
//! that recording is an atomic add (no label formatting, no registry lookup per request).
//!
//! Cardinality is bounded by configuration: only the tenants named in
//! `telemetry.tenant_labels` get their own `tenant` label; every other tenant is `other`, and
//! callers without a tenant are `anonymous`. With N named tenants that is (N + 2) × 8 series
//! (5 status classes, one 429 counter, one histogram counted once) whatever the traffic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Histogram, SharedString};

/// `tenant_requests_total{tenant,class}`: answers by status class (`1xx` … `5xx`).
pub const TENANT_REQUESTS_TOTAL: &str = "tenant_requests_total";
/// `tenant_rate_limited_total{tenant}`: the gateway's own 429s.
pub const TENANT_RATE_LIMITED_TOTAL: &str = "tenant_rate_limited_total";
/// `tenant_request_duration_seconds{tenant}`: time to the response head.
pub const TENANT_REQUEST_DURATION_SECONDS: &str = "tenant_request_duration_seconds";
/// `upstream_attempt_duration_seconds{dependency}`: one upstream attempt, to its response
/// head or failure.
pub const UPSTREAM_ATTEMPT_DURATION_SECONDS: &str = "upstream_attempt_duration_seconds";
/// `upstream_attempt_outcomes_total{dependency,outcome}`: how attempts ended.
pub const UPSTREAM_ATTEMPT_OUTCOMES_TOTAL: &str = "upstream_attempt_outcomes_total";

const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The label of callers without a tenant.
pub(crate) const ANONYMOUS: &str = "anonymous";
/// The label of tenants not named in `telemetry.tenant_labels`.
pub(crate) const OTHER: &str = "other";

/// One tenant label's series.
#[derive(Debug)]
pub(crate) struct TenantSeries {
    by_class: [Counter; 5],
    rate_limited: Counter,
    latency: Histogram,
}

impl TenantSeries {
    fn register(tenant: &str) -> Self {
        let label = SharedString::from(tenant.to_owned());
        Self {
            by_class: CLASSES.map(|class| {
                metrics::counter!(TENANT_REQUESTS_TOTAL, "tenant" => label.clone(), "class" => class)
            }),
            rate_limited: metrics::counter!(TENANT_RATE_LIMITED_TOTAL, "tenant" => label.clone()),
            latency: metrics::histogram!(TENANT_REQUEST_DURATION_SECONDS, "tenant" => label),
        }
    }

    /// Counts one answer.
    pub(crate) fn record(&self, status: u16, rate_limited: bool, elapsed: Duration) {
        let class = usize::from(status / 100).saturating_sub(1);
        if let Some(counter) = self.by_class.get(class) {
            counter.increment(1);
        }
        if rate_limited {
            self.rate_limited.increment(1);
        }
        self.latency.record(elapsed.as_secs_f64());
    }
}

/// Every tenant label's series.
#[derive(Debug)]
pub(crate) struct TenantLabels {
    named: HashMap<Arc<str>, TenantSeries>,
    other: TenantSeries,
    anonymous: TenantSeries,
}

impl TenantLabels {
    /// Registers the series of `named` tenants, `other` and `anonymous`.
    pub(crate) fn new(named: &[String]) -> Self {
        Self {
            named: named
                .iter()
                .map(|id| (Arc::from(id.as_str()), TenantSeries::register(id)))
                .collect(),
            other: TenantSeries::register(OTHER),
            anonymous: TenantSeries::register(ANONYMOUS),
        }
    }

    /// The series of tenant `id`, or of anonymous callers for `None`.
    pub(crate) fn of(&self, id: Option<&str>) -> &TenantSeries {
        match id {
            None => &self.anonymous,
            Some(id) => self.named.get(id).unwrap_or(&self.other),
        }
    }
}

/// How an upstream attempt ended, as the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    /// A response with this status.
    Status(u16),
    /// The client failed (connect, reset, TLS …).
    Error,
    /// Dropped before it ended: the retry layer's attempt timeout or the client left.
    Cancelled,
}

impl AttemptEnd {
    /// The `outcome` label and span attribute.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Status(s) if (100..600).contains(&s) => CLASSES
                .get(usize::from(s / 100 - 1))
                .copied()
                .unwrap_or("error"),
            Self::Status(_) => "error",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One upstream's attempt series.
#[derive(Debug)]
pub(crate) struct AttemptSeries {
    latency: Histogram,
    /// `1xx` … `5xx`, `error`, `cancelled`.
    outcomes: [Counter; 7],
}

impl AttemptSeries {
    /// Registers the series of upstream `name`.
    pub(crate) fn register(name: &str) -> Self {
        let label = SharedString::from(name.to_owned());
        let outcome = |o: &'static str| metrics::counter!(UPSTREAM_ATTEMPT_OUTCOMES_TOTAL, "dependency" => label.clone(), "outcome" => o);
        Self {
            latency: metrics::histogram!(UPSTREAM_ATTEMPT_DURATION_SECONDS, "dependency" => label.clone()),
            outcomes: [
                outcome("1xx"),
                outcome("2xx"),
                outcome("3xx"),
                outcome("4xx"),
                outcome("5xx"),
                outcome("error"),
                outcome("cancelled"),
            ],
        }
    }

    /// Counts one attempt.
    pub(crate) fn record(&self, end: AttemptEnd, elapsed: Duration) {
        self.latency.record(elapsed.as_secs_f64());
        let index = match end {
            AttemptEnd::Status(s) if (100..600).contains(&s) => usize::from(s / 100 - 1),
            AttemptEnd::Status(_) | AttemptEnd::Error => 5,
            AttemptEnd::Cancelled => 6,
        };
        if let Some(counter) = self.outcomes.get(index) {
            counter.increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unnamed_tenants_share_other() {
        let labels = TenantLabels::new(&["acme".to_owned()]);
        assert!(std::ptr::eq(
            labels.of(Some("acme")),
            &labels.named[&Arc::from("acme")]
        ));
        assert!(std::ptr::eq(labels.of(Some("globex")), &labels.other));
        assert!(std::ptr::eq(labels.of(None), &labels.anonymous));
    }

    #[test]
    fn attempt_outcome_labels() {
        assert_eq!(AttemptEnd::Status(503).label(), "5xx");
        assert_eq!(AttemptEnd::Status(204).label(), "2xx");
        assert_eq!(AttemptEnd::Status(0).label(), "error");
        assert_eq!(AttemptEnd::Cancelled.label(), "cancelled");
    }
}
