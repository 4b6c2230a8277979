//! What the layer keeps per upstream, shared by every route that targets it: the retry
//! budget, the circuit breaker, the adaptive rate, the latency window and the client-retry
//! memory, each in its module here, and the facts the safety ladder needs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(crate) mod adaptive;
pub(crate) mod breaker;
pub(crate) mod budget;
pub(crate) mod exhausted;
pub(crate) mod latency;

use self::{
    adaptive::{AdaptiveConfig, AdaptiveThrottle},
    breaker::{BreakerConfig, CircuitBreaker},
    budget::{BudgetConfig, RetryBudget},
    exhausted::{Exhausted, DEFAULT_WINDOW},
    latency::{Latency, Percentiles},
};
use crate::metrics::UpstreamMetrics;

/// One upstream ("dependency" in metrics and logs). Built once per upstream at start-up and
/// shared as `Arc<UpstreamState>` by every route that targets it, so its retry budget and
/// circuit breaker see all of the upstream's traffic through this gateway replica.
#[derive(Debug)]
pub struct UpstreamState {
    name: Arc<str>,
    endpoints: AtomicUsize,
    dedupes_idempotency_keys: bool,
    budget: RetryBudget,
    breaker: CircuitBreaker,
    exhausted: Exhausted,
    latency: Latency,
    /// Per-route histograms: registered at start-up, read by the admin API; requests hold
    /// their route's `Arc` (in `RetryTarget`) and never take this lock.
    route_latencies: std::sync::Mutex<Vec<(Arc<str>, Arc<Latency>)>>,
    /// `None` unless `adaptive = true`: then the request path touches nothing of it.
    adaptive: Option<AdaptiveThrottle>,
    metrics: UpstreamMetrics,
}

// === impl UpstreamState ===

impl UpstreamState {
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
            metrics: UpstreamMetrics::new(&name),
            exhausted: Exhausted::new(DEFAULT_WINDOW),
            latency: Latency::new(),
            route_latencies: std::sync::Mutex::default(),
            adaptive: None,
            name,
            endpoints: AtomicUsize::new(endpoints),
            dedupes_idempotency_keys,
        }
    }

    /// Remember operations the layer gave up retrying for `window` (default 30 s; zero:
    /// never), so that a client's retry of one gets a single attempt instead of a new round.
    pub fn with_client_retry_window(mut self, window: Duration) -> Self {
        self.exhausted = Exhausted::new(window);
        self
    }

    /// Learns the rate the upstream accepts from its 429/503 answers and latency, and
    /// refuses requests over it at the edge (see the crate docs' "Adaptive throttling").
    pub fn with_adaptive(mut self, config: AdaptiveConfig) -> Self {
        self.adaptive = Some(AdaptiveThrottle::new(&self.name, config));
        self
    }

    /// The upstream's adaptive throttle, when it has one.
    pub fn adaptive(&self) -> Option<&AdaptiveThrottle> {
        self.adaptive.as_ref()
    }

    /// The upstream's name (the `dependency` label), as configured.
    pub fn upstream_name(&self) -> &str {
        &self.name
    }

    /// Operations the layer recently gave up retrying.
    pub(crate) fn exhausted(&self) -> &Exhausted {
        &self.exhausted
    }

    /// Attempt latency percentiles over the last one to two minutes (`None` below 100
    /// attempts), for the admin API.
    pub fn latency(&self) -> Option<Percentiles> {
        self.latency.percentiles(tokio::time::Instant::now())
    }

    /// The attempt timeout the measured latency suggests: 3 × p99 within `[floor,
    /// ceiling]`, the ceiling until enough attempts are measured.
    pub fn recommended_attempt_timeout(&self, floor: Duration, ceiling: Duration) -> Duration {
        self.latency
            .recommended_timeout(tokio::time::Instant::now(), floor, ceiling)
    }

    /// The upstream's attempt-latency histogram.
    pub fn latency_histogram(&self) -> &Latency {
        &self.latency
    }

    /// The `q`-quantile of attempt latency, once at least 100 attempts are in view.
    pub(crate) fn latency_quantile(&self, q: f64) -> Option<Duration> {
        self.latency.quantile(tokio::time::Instant::now(), q)
    }

    /// The attempt-latency histogram of route `name` toward this upstream, created on first
    /// use (the route table asks once per route at start-up; the same name gets the same one).
    pub fn route_latency(&self, name: &str) -> Arc<Latency> {
        let mut routes = self
            .route_latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, latency)) = routes.iter().find(|(route, _)| &**route == name) {
            return latency.clone();
        }
        let latency = Arc::new(Latency::new());
        routes.push((Arc::from(name), latency.clone()));
        latency
    }

    /// Every route's histogram toward this upstream, by route name (for the admin API).
    pub fn route_latencies(&self) -> Vec<(Arc<str>, Arc<Latency>)> {
        self.route_latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Counts one attempt's time to response headers (or to its failure or timeout).
    pub(crate) fn record_attempt(&self, took: Duration, now: tokio::time::Instant) {
        self.latency.record(took, now);
    }

    /// The upstream's name (the `dependency` label).
    pub fn name(&self) -> &Arc<str> {
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

    /// Attempts per original request over the retry budget's window (1.0 = no retries);
    /// `None` before any request in the window. Read by the admin API, never per request.
    pub fn retry_amplification(&self) -> Option<f64> {
        let window = self.budget.snapshot();
        (window.requests > 0)
            .then(|| (window.requests + window.retries) as f64 / window.requests as f64)
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
    pub(crate) fn metrics(&self) -> &UpstreamMetrics {
        &self.metrics
    }
}
