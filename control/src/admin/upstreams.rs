//! `GET /upstreams`: every upstream's endpoints and their health as this replica sees them
//! (balancer, breaker, per-endpoint state, ejections, in-flight). The control plane cannot
//! depend on the gateway, so the gateway implements [`UpstreamsView`] and passes it in
//! [`AdminContext`](super::AdminContext).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::AdminState;

/// A read-only view of the data plane's upstreams.
pub trait UpstreamsView: Send + Sync {
    /// A snapshot of every upstream, in configuration order.
    fn upstreams(&self) -> Vec<UpstreamStatus>;
}

/// A view with no upstreams (tools and tests that run the admin API without a data plane).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoUpstreams;

impl UpstreamsView for NoUpstreams {
    fn upstreams(&self) -> Vec<UpstreamStatus> {
        Vec::new()
    }
}

/// One upstream. An object, so later fields (latency percentiles…) are additions.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamStatus {
    /// The configured name.
    pub name: String,
    /// `round_robin`, `least_request` or `peak_ewma`.
    pub load_balancer: String,
    /// The retry layer's circuit breaker: `closed`, `half_open` or `open`.
    pub circuit_breaker: String,
    /// Endpoints currently usable (not unhealthy, not ejected).
    pub healthy_endpoints: usize,
    /// Whether picks currently ignore health (too few usable endpoints: panic mode).
    pub panic: bool,
    /// The endpoints.
    pub endpoints: Vec<EndpointStatus>,
    /// The attempt timeout in force, in milliseconds: the configured one, or with
    /// `attempt_timeout = "auto"` the learned one.
    pub attempt_timeout_ms: u64,
    /// Attempt latency measured by this replica over the last one to two minutes; `null`
    /// until at least 100 attempts were made.
    pub latency: Option<LatencyStatus>,
    /// The same, for each route toward this upstream.
    pub routes: Vec<RouteLatencyStatus>,
    /// Attempts per original request over the retry budget's window on this replica (1.0 =
    /// no retries); `null` before any request in the window.
    pub retry_amplification: Option<f64>,
}

/// One route's attempt latency.
#[derive(Debug, Clone, Serialize)]
pub struct RouteLatencyStatus {
    /// The route's name.
    pub route: String,
    /// As [`UpstreamStatus::latency`], for this route's attempts only.
    pub latency: Option<LatencyStatus>,
}

/// Attempt latency percentiles of one upstream, and the timeout they suggest.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyStatus {
    /// Attempts measured.
    pub samples: u64,
    /// Median time to response headers, in milliseconds (upper bucket bound, within 19 %).
    pub p50_ms: f64,
    /// 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// 99.9th percentile, in milliseconds.
    pub p999_ms: f64,
    /// 3 × p99, bounded (the `attempt_timeout = "auto"` bounds, else 50 ms–300 s).
    pub recommended_attempt_timeout_ms: u64,
}

/// One endpoint of an upstream.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointStatus {
    /// `scheme://address` connected to (an IP for resolved host names).
    pub url: String,
    /// The `Host` header sent (the configured `host:port`).
    pub host: String,
    /// Balancing weight.
    pub weight: u32,
    /// Overall state.
    pub state: EndpointHealth,
    /// Milliseconds until the ejection ends, when ejected.
    pub ejected_for_ms: Option<u64>,
    /// Passive ejections since the gateway started.
    pub ejections: u32,
    /// Gateway failures in a row (connect errors, resets, 502/503/504).
    pub consecutive_failures: u32,
    /// Requests in flight from this replica.
    pub in_flight: usize,
}

/// An endpoint's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointHealth {
    /// Picked normally.
    Healthy,
    /// Failed by active health checks.
    Unhealthy,
    /// Ejected by passive outlier detection.
    Ejected,
}

/// The handler.
pub(super) async fn list(State(state): State<AdminState>) -> Json<serde_json::Value> {
    let view: &Arc<dyn UpstreamsView> = &state.upstreams;
    Json(serde_json::json!({ "upstreams": view.upstreams() }))
}
