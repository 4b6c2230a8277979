//! `portcullis-retry`: the single retry layer toward backends, as a tower `Layer`.
//!
//! [`RetryLayer`] wraps the pooled upstream client. For each request that the router
//! tagged with a [`RetryTarget`] it classifies every attempt's outcome, decides with the
//! safety ladder whether repeating it is safe, waits with jittered exponential backoff
//! (at least the upstream's `Retry-After`), and stops at the request's deadline, the
//! upstream's retry budget or its open circuit breaker. A request without a `RetryTarget`
//! is forwarded exactly once, untouched.
//!
//! # Usage
//!
//! ```
//! use std::sync::Arc;
//!
//! use portcullis_retry::{
//!     BreakerConfig, BudgetConfig, UpstreamState, RetryLayer, RetryParams, RetryPolicy,
//!     RetryTarget, SystemWallClock,
//! };
//! use tower::Layer;
//!
//! /// Stands in for the idempotency layer's marker on a request holding its key's lock.
//! struct Locked;
//! # let upstream_client = ();
//!
//! // Start-up: one `UpstreamState` per upstream (its budget and breaker), a policy per route.
//! let orders = Arc::new(UpstreamState::new(
//!     "orders", 2, false, BudgetConfig::default(), BreakerConfig::default(),
//! ));
//! let policy = Arc::new(RetryPolicy::try_new(RetryParams::default())?);
//! // The innermost request layer, right above the pooled upstream client.
//! let retry = RetryLayer::new(
//!     |ext| ext.get::<Locked>().is_some(), // holds the idempotency lock (rung 3)
//!     |_ext| 0,                             // the caller, for the breaker (tenant or client IP)
//!     Arc::new(SystemWallClock),
//! );
//! let client = retry.layer(upstream_client);
//! // The router tags each routed request; an untagged one is forwarded once, unbuffered.
//! let mut request = http::Request::new(axum::body::Body::empty());
//! let target = RetryTarget { policy, upstream: orders, idempotent_route: false, route_latency: None };
//! request.extensions_mut().insert(target);
//! # let _ = client;
//! # Ok::<(), portcullis_retry::InvalidRetryConfig>(())
//! ```
//!
//! # Where it sits
//!
//! Last of the request layers, first on the way back from the backend:
//!
//! ```text
//! listener → … → rate limit → idempotency → router (inserts RetryTarget)
//!          → retry (this crate) → pooled upstream client
//! ```
//!
//! It must sit below the idempotency layer (a keyed POST is retried only while it holds the
//! key's lock, and the key is released only when nothing reached the backend) and right
//! above the client, where a failure is seen first-hand and every attempt is counted.
//!
//! # The safety ladder
//!
//! Whether a failure is *transient* (408, 429, 500, 502, 503, 504, connection refused or
//! reset, timeouts, DNS, TLS handshake timeout) is one question; whether *repeating the
//! request* is safe is another, decided per failure:
//!
//! 1. **Provably not processed** (connect refused/timeout, DNS, reset before a byte was
//!    written, TLS handshake timeout): nothing reached the backend, so any method may be
//!    retried — even a bare POST.
//! 2. **Idempotent** — GET, HEAD, OPTIONS, PUT, DELETE, or a route declared idempotent —
//!    every transient failure may be retried: doing it twice equals doing it once.
//! 3. **Protected** — a request holding the gateway's idempotency lock (the same
//!    `Idempotency-Key` goes out on every attempt): retried on 408/429/503, which say the
//!    backend did not process it, and on 500/502/504/resets/timeouts only when the upstream
//!    declares `dedupes_idempotency_keys`; otherwise such an ambiguous failure may have
//!    charged the card, and the idempotency layer stores it instead.
//! 4. **Anything else** is never retried once a byte may have reached the backend.
//!
//! TLS certificate errors are never retried (docs/retry-policy.md: a possible interception must surface).
//! DNS failures get at most 2 attempts. Retries prefer a different endpoint: each attempt
//! carries an [`AttemptInfo`] naming the endpoint that just failed.
//!
//! # Why one retry layer
//!
//! Retries multiply across layers: a client that tries 3 times in front of a gateway that
//! tries 3 times in front of a service that tries 3 times turns one failing call into 27.
//! So exactly one layer owns retries, and it is this one: it sits where the failure is
//! seen first-hand (the connection to the backend) and where all traffic to a backend
//! passes, so its budget and breaker see the whole picture. Every attempt carries
//! `X-Retry-Attempt: n` so backends and sidecars can tell that the gateway retries and
//! must not retry again themselves.
//!
//! # Why budgets and not only max retries
//!
//! `max_retries` bounds the cost of *one* request; it does nothing for the fleet. When a
//! backend fails outright, every request uses all its retries and the backend receives
//! `1 + max_retries` times its normal load exactly when it can least take it. A budget
//! bounds the *ratio*: retries may be at most 20 % (docs/retry-policy.md) of the requests sent to
//! one dependency over a rolling 30 s window, plus a small floor (1 retry/s by default) so a
//! quiet upstream can still get a retry for a rare blip. During an outage amplification
//! stays near 1.2 instead of 4, and during normal operation — where retries are rare — the
//! budget never bites. The circuit breaker is the next step: when gateway failures are
//! sustained (≥ 50 % of ≥ 20 requests over 30 s, still so without the 2 callers with the
//! most failures) it stops traffic altogether for `open_for`, answers 503 with
//! `Retry-After`, and lets a few probes decide when to resume. The `budget` and `breaker`
//! modules state their accuracy and costs.
//!
//! # Deadlines and Retry-After
//!
//! Each request gets one deadline: `now + total` (≤ 30 s, docs/retry-policy.md), or the client's
//! `X-Request-Deadline` (RFC 3339) when that is earlier. An unparsable incoming deadline is
//! ignored; one already past fails with [`RetryError::DeadlineExceeded`] before anything
//! is sent. Every attempt forwards the effective deadline in `X-Request-Deadline` (UTC,
//! milliseconds, truncated) and waits for response headers at most
//! `min(attempt_timeout, remaining)`.
//!
//! Between attempts the layer waits `max(backoff, Retry-After)`: the upstream's
//! `Retry-After` (delta-seconds or HTTP-date, parsed leniently) is a floor, never shortened
//! by jitter (docs/retry-policy.md). If that wait would reach the deadline, waiting is pointless:
//! the layer returns the upstream's response at once, so the client sees the real 429/503
//! and its `Retry-After` instead of a synthetic timeout 30 s later.
//!
//! # Bodies and what is never retried
//!
//! Request bodies up to `body_replay_limit` (64 KiB by default) are buffered so they can
//! be replayed; larger bodies are streamed once, intact, and such a request is not retried.
//! The decision to retry is taken on response headers only: once a response is returned,
//! its body streams to the client and nothing is retried after that.
//!
//! # Wiring
//!
//! The router inserts a [`RetryTarget`] into the request extensions; the upstream client
//! reads [`AttemptInfo`], sets [`ServedBy`] on responses, and its error type implements
//! [`UpstreamFailure`]. Errors come back as [`RetryError`]; the gateway turns them into
//! problem+json in one place (only it knows what its upstream client's failures mean to a
//! client), and asks [`RetryError::is_provably_unprocessed`] whether an idempotency key may
//! be released.
//!
//! # Observability
//!
//! Each retry is logged (`info`) with `correlation_id` (`X-Request-Id`), `dependency`,
//! `attempt`, `max_attempts`, `backoff_ms`, `error_type` and `idempotency_key`; never
//! bodies or other headers. Metrics: `upstream_requests_total{dependency}`,
//! `upstream_attempts_total{dependency}` (their ratio is the amplification),
//! `retry_attempts_total{dependency,attempt_number}` (attempt 2 and later),
//! `retry_exhausted_total{dependency}`, `retry_suppressed_total{dependency,reason}`,
//! `retry_backoff_duration_seconds`, `retry_budget_utilization_ratio{dependency}`,
//! `retry_budget_exhausted_total{dependency}`, `circuit_breaker_state{dependency}`
//! (0 closed, 1 half-open, 2 open) and `circuit_breaker_rejected_total{dependency}`.

mod backoff;
mod body;
mod classify;
mod clock;
mod error;
mod handoff;
mod headers;
mod layer;
mod metrics;
mod policy;
mod schedule;
mod service;
mod upstream;
mod window;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use self::{
    body::PrefixedBody,
    clock::{SystemWallClock, WallClock},
    error::{FailureKind, RetryError, UpstreamFailure},
    handoff::{FindHandoff, Handoff},
    headers::{
        parse_retry_after, IDEMPOTENCY_KEY, X_REQUEST_DEADLINE, X_REQUEST_ID, X_RETRY_ATTEMPT,
        X_RETRY_EXHAUSTED,
    },
    layer::{CallerKey, FindTarget, IsProtected, RetryLayer},
    policy::{HedgeAfter, InvalidRetryConfig, Jitter, RetryParams, RetryPolicy},
    schedule::{
        DeadReason, DeliverySchedule, NextDelivery, ScheduleError, DEFAULT_MAX_RETRIES,
        DEFAULT_SCHEDULE, MAX_AGE_CAP, MAX_RETRIES_RANGE,
    },
    service::Retry,
    upstream::{
        adaptive::{
            fleet_share, AdaptiveConfig, AdaptiveThrottle, FleetReport, DEFAULT_LATENCY_TOLERANCE,
            DEFAULT_MAX_WAIT, DEFAULT_MIN_RATE,
        },
        breaker::{BreakerConfig, DEFAULT_MIN_CALLERS},
        budget::BudgetConfig,
        latency::{
            Latency, Percentiles, MIN_SAMPLES as LATENCY_MIN_SAMPLES, P99_MULTIPLIER,
            WINDOW as LATENCY_WINDOW,
        },
        UpstreamState,
    },
};

/// The policy and upstream of a request: a request extension, or found by the layer's
/// [`FindTarget`].
/// Without it the layer forwards the request once, with no buffering and no timeout.
#[derive(Debug, Clone)]
pub struct RetryTarget {
    /// Retry policy of the route/upstream.
    pub policy: Arc<RetryPolicy>,
    /// The upstream's shared state (budget, breaker, endpoint count).
    pub upstream: Arc<UpstreamState>,
    /// The route declares this request idempotent whatever its method (rung 2).
    pub idempotent_route: bool,
    /// The route's own attempt latency ([`UpstreamState::route_latency`]), besides the
    /// upstream's; `None` keeps only the upstream's.
    pub route_latency: Option<Arc<Latency>>,
}

/// Request extension set by the retry layer before each attempt, for the upstream client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptInfo {
    /// Attempt number, 1-based (also sent as `X-Retry-Attempt`).
    pub number: u32,
    /// Endpoint index to avoid: the one the previous attempt failed on, when the upstream
    /// has more than one endpoint.
    pub avoid_endpoint: Option<usize>,
    /// How long the retry layer waited before this attempt (zero for the first), for the
    /// attempt's trace span.
    pub backoff: std::time::Duration,
    /// When the retry layer stops waiting for this attempt, if that is the upstream's own
    /// attempt timeout: an attempt dropped at or after it timed out, which passive health
    /// counts against the endpoint. `None` when the request's deadline (which a client can
    /// shorten with `X-Request-Deadline` or `grpc-timeout`) cut the attempt shorter: a
    /// caller's own hurry says nothing about the endpoint.
    pub timeout_at: Option<tokio::time::Instant>,
    /// When the retry layer sent this attempt: the attempt's telemetry starts from it
    /// rather than reading the clock again.
    pub started: tokio::time::Instant,
}

/// Request extension on a hedged first attempt: the upstream client records in it the
/// endpoint it picked, so that the copy sent later avoids that endpoint.
#[derive(Debug, Clone)]
pub struct PickedEndpoint(Arc<std::sync::atomic::AtomicUsize>);

impl PickedEndpoint {
    const NONE: usize = usize::MAX;

    pub(crate) fn new() -> Self {
        Self(Arc::new(std::sync::atomic::AtomicUsize::new(Self::NONE)))
    }

    /// Records the endpoint picked for the attempt carrying this extension.
    pub fn record(&self, endpoint: usize) {
        self.0.store(endpoint, std::sync::atomic::Ordering::Relaxed);
    }

    /// The endpoint recorded, if the client has picked one.
    pub(crate) fn get(&self) -> Option<usize> {
        let endpoint = self.0.load(std::sync::atomic::Ordering::Relaxed);
        (endpoint != Self::NONE).then_some(endpoint)
    }
}

/// Response extension set by the upstream client: index of the endpoint that answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedBy(pub usize);
