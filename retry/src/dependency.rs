//! Per-upstream shared state: budget, breaker and the facts the safety ladder needs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{
    breaker::{BreakerConfig, CircuitBreaker},
    budget::{BudgetConfig, RetryBudget},
    metrics::DependencyMetrics,
};

/// One upstream ("dependency" in metrics and logs). Built once per upstream at start-up and
/// shared as `Arc<Dependency>` by every route that targets it, so its retry budget and
/// circuit breaker see all of the upstream's traffic through this gateway replica.
#[derive(Debug)]
pub struct Dependency {
    name: Arc<str>,
    endpoints: AtomicUsize,
    dedupes_idempotency_keys: bool,
    budget: RetryBudget,
    breaker: CircuitBreaker,
    metrics: DependencyMetrics,
}

// === impl Dependency ===

impl Dependency {
    /// State for upstream `name` with `endpoints` endpoints. `dedupes_idempotency_keys`
    /// declares that the upstream itself dedupes on the forwarded `Idempotency-Key`, which
    /// lets the layer retry keyed POST/PATCH on ambiguous failures (500/502/504/timeouts).
    pub fn new(
        name: impl Into<Arc<str>>,
        endpoints: usize,
        dedupes_idempotency_keys: bool,
        budget: BudgetConfig,
        breaker: BreakerConfig,
    ) -> Self {
        let name = name.into();
        Self {
            budget: RetryBudget::new(name.clone(), budget),
            breaker: CircuitBreaker::new(name.clone(), breaker),
            metrics: DependencyMetrics::new(&name),
            name,
            endpoints: AtomicUsize::new(endpoints),
            dedupes_idempotency_keys,
        }
    }

    /// The upstream's name (the `dependency` label).
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Number of endpoints; retries avoid the failed one only when there is more than one.
    pub(crate) fn endpoints(&self) -> usize {
        self.endpoints.load(Ordering::Relaxed)
    }

    /// Updates the endpoint count when service discovery changes the upstream's endpoints.
    pub fn set_endpoints(&self, endpoints: usize) {
        self.endpoints.store(endpoints, Ordering::Relaxed);
    }

    /// The circuit breaker's state for operators: `"closed"`, `"half_open"` or `"open"`.
    pub fn breaker_state(&self) -> &'static str {
        self.breaker.state_name()
    }

    /// Whether the upstream dedupes on `Idempotency-Key`.
    pub(crate) fn dedupes_idempotency_keys(&self) -> bool {
        self.dedupes_idempotency_keys
    }

    /// The upstream's retry budget.
    pub(crate) fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The upstream's circuit breaker.
    pub(crate) fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// The request-path metric handles, registered once for this upstream.
    pub(crate) fn metrics(&self) -> &DependencyMetrics {
        &self.metrics
    }
}
