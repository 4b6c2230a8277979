//! `Retry<S>`: the attempt loop around the upstream client.

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{header::RETRY_AFTER, HeaderMap, Request, Response};
use portcullis_problem::grpc::{self, GrpcCode, Pushback, GRPC_TIMEOUT};
use tokio::time::{sleep, timeout, timeout_at, Instant};
use tower::{Service, ServiceExt};

use super::{
    backoff::Backoff,
    body::Prepared,
    classify::{self, AttemptOutcome, RequestSafety, DNS_MAX_ATTEMPTS},
    dependency::Dependency,
    error::{FailureKind, RetryError, UpstreamFailure},
    headers::{
        attempt_value, format_deadline, parse_retry_after, IDEMPOTENCY_KEY, X_REQUEST_DEADLINE,
        X_REQUEST_ID, X_RETRY_ATTEMPT, X_RETRY_EXHAUSTED,
    },
    layer::Shared,
    metrics::Stop,
    AttemptInfo, PickedEndpoint, RetryTarget, ServedBy,
};

mod grpc_call;
mod hedge;

use grpc_call::{incoming_deadline, response_outcome};

/// The retry middleware built by [`RetryLayer`](super::RetryLayer).
#[derive(Clone)]
pub struct Retry<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The effective deadline of one request, on both clocks.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    wall: SystemTime,
}

/// The result of the latest attempt, kept until the layer decides whether to retry.
enum Last<E> {
    Response(Response<Body>),
    Error(RetryError<E>),
}

// === impl Retry ===

impl<S> Retry<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}

impl<S> std::fmt::Debug for Retry<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retry").finish_non_exhaustive()
    }
}

impl<S> Service<Request<Body>> for Retry<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: UpstreamFailure,
{
    type Response = Response<Body>;
    type Error = RetryError<S::Error>;
    type Future = BoxFuture<'static, Result<Response<Body>, RetryError<S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(RetryError::Upstream)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // Keep the instance that was driven ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        Box::pin(run(self.shared.clone(), ready, req))
    }
}

async fn run<S>(
    shared: Arc<Shared>,
    mut svc: S,
    req: Request<Body>,
) -> Result<Response<Body>, RetryError<S::Error>>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send,
    S::Error: UpstreamFailure,
{
    let Some(RetryTarget {
        policy,
        dependency: dep,
        idempotent_route,
        route_latency,
    }) = (shared.target)(req.extensions()).cloned()
    else {
        // No policy: one attempt, no buffering, no timeout, no headers.
        return svc.call(req).await.map_err(RetryError::Upstream);
    };
    let name = dep.name().clone();
    let wall_now = shared.clock.now();
    let incoming = incoming_deadline(req.headers(), wall_now);
    let arrived = Instant::now();
    let Some(deadline) = Deadline::new(arrived, wall_now, policy.total(), incoming) else {
        tracing::debug!(dependency = %name, "request deadline passed before the first attempt");
        return Err(RetryError::DeadlineExceeded);
    };
    // One breaker permit per request, not per attempt: retries must not multiply one
    // caller's weight in the breaker's window.
    let caller = (shared.caller_key)(req.extensions());
    let mut permit = dep
        .breaker()
        .try_acquire(caller)
        .map_err(|retry_after| RetryError::BreakerOpen { retry_after })?;
    // Over the rate the upstream was learned to accept: answered here, never sent.
    if let Some(throttle) = dep.adaptive() {
        let pace = throttle
            .admit(true, deadline.at.saturating_duration_since(arrived))
            .map_err(|retry_after| RetryError::Throttled {
                retry_after,
                rate: throttle.rate().unwrap_or_default(),
            })?;
        if !pace.is_zero() {
            sleep(pace).await;
        }
    }

    let (parts, body) = req.into_parts();
    let mut body = if policy.max_retries() > 0 {
        let limit = policy.body_replay_limit();
        match timeout_at(deadline.at, Prepared::read(body, limit)).await {
            Ok(prepared) => prepared.map_err(RetryError::RequestBody)?,
            Err(_) => return Err(RetryError::DeadlineExceeded),
        }
    } else {
        Prepared::Once(Some(body))
    };
    let safety = RequestSafety::new(
        &parts.method,
        idempotent_route,
        (shared.is_protected)(&parts.extensions),
        dep.dedupes_idempotency_keys(),
    );
    let deadline_header = format_deadline(deadline.wall);
    // gRPC calls carry their deadline in `grpc-timeout` too, rewritten on every attempt.
    let grpc = grpc::is_grpc(&parts.headers);
    // A client retrying an operation this layer already gave up on gets one attempt, not a
    // new round (see `exhausted`): retries must not multiply across layers.
    let operation = |body: &Prepared| {
        let key = parts.headers.get(IDEMPOTENCY_KEY).map(|v| v.as_bytes());
        dep.exhausted()
            .fingerprint(caller, &parts, key, body.bytes())
    };
    let repeat = dep.exhausted().is_live(arrived)
        && operation(&body).is_some_and(|op| dep.exhausted().contains(op, arrived));
    let max_attempts = if repeat { 1 } else { policy.max_attempts() };
    // Seeded only when a retry is considered: most requests never need a random draw.
    let mut backoff = None;

    dep.budget().deposit();
    dep.metrics().request();

    let mut attempt: u32 = 1;
    let mut avoid_endpoint = None;
    let mut dns_failures = 0;
    let mut waited = Duration::ZERO;
    loop {
        let started = Instant::now();
        let limit = policy
            .attempt_timeout_for(&dep)
            .min(deadline.at.saturating_duration_since(started));
        let grpc_timeout = grpc.then(|| grpc::format_timeout(limit));
        let request = |number, body| {
            let mut req = Request::from_parts(parts.clone(), body);
            let headers = req.headers_mut();
            headers.insert(X_RETRY_ATTEMPT, attempt_value(number));
            headers.insert(X_REQUEST_DEADLINE, deadline_header.clone());
            if let Some(value) = &grpc_timeout {
                headers.insert(GRPC_TIMEOUT, value.clone());
            }
            req.extensions_mut().insert(AttemptInfo {
                number,
                avoid_endpoint,
                backoff: waited,
                timeout_at: started + limit,
            });
            req
        };
        let mut req = request(attempt, body.take());
        dep.metrics().attempt();
        // Only the first attempt of an idempotent request is hedged, to another endpoint.
        let hedge_after = (attempt == 1
            && safety.idempotent
            && max_attempts > 1
            && body.is_replayable()
            && dep.endpoints() > 1)
            .then(|| policy.hedge_delay(&dep))
            .flatten()
            .filter(|after| *after < limit);
        // A gRPC error can hide in trailers behind a 200; worth a look only when it could
        // be retried.
        let peek_until = (grpc
            && attempt < max_attempts
            && classify::retry_rung(AttemptOutcome::Grpc(GrpcCode::Unavailable), safety).is_some())
        .then_some(started + limit);

        let mut pushback = None;
        let sent = timeout(limit, async {
            let Some(after) = hedge_after else {
                return send(&mut svc, attempt == 1, req).await;
            };
            // The client records the first attempt's endpoint; the copy avoids it.
            let picked = PickedEndpoint::new();
            req.extensions_mut().insert(picked.clone());
            let second = || {
                // The copy is an attempt: it needs a token of the adaptive rate now (a
                // copy that waited would no longer be early), then the retry budget's.
                let admitted = dep
                    .adaptive()
                    .is_none_or(|t| t.admit(false, Duration::ZERO).is_ok());
                (admitted && dep.budget().try_withdraw()).then(|| {
                    dep.metrics().attempt();
                    dep.metrics().retry(2);
                    let mut copy = request(2, body.take());
                    copy.extensions_mut().insert(AttemptInfo {
                        number: 2,
                        avoid_endpoint: picked.get(),
                        backoff: after,
                        timeout_at: started + limit,
                    });
                    copy
                })
            };
            let retryable = |answer: &Result<Response<Body>, S::Error>| {
                let outcome = match answer {
                    Ok(rsp) => AttemptOutcome::Status(rsp.status()),
                    Err(e) => AttemptOutcome::Failure(e.kind()),
                };
                classify::retry_rung(outcome, safety).is_some()
            };
            let raced = hedge::race(&mut svc, req, after, second, retryable).await;
            if raced.hedged {
                tracing::debug!(dependency = %name, after_ms = after.as_millis() as u64, "hedged the first attempt");
                attempt = 2;
            }
            raced.answer
        });
        let (outcome, last) = match sent.await {
            Ok(Ok(rsp)) => {
                let (outcome, rsp, sent_pushback) = response_outcome(rsp, peek_until).await;
                pushback = sent_pushback;
                (outcome, Last::Response(rsp))
            }
            Ok(Err(e)) => (
                AttemptOutcome::Failure(e.kind()),
                Last::Error(RetryError::Upstream(e)),
            ),
            Err(_) => (
                AttemptOutcome::Timeout,
                Last::Error(RetryError::AttemptTimeout { after: limit }),
            ),
        };
        let now = Instant::now();
        dep.record_attempt(now.saturating_duration_since(started), now);
        if let Some(route) = &route_latency {
            route.record(now.saturating_duration_since(started), now);
        }
        if let Some(throttle) = dep.adaptive() {
            throttle.observe(outcome, started);
        }
        let health = classify::breaker_outcome(outcome);
        let Some(rung) = classify::retry_rung(outcome, safety) else {
            permit.record(health);
            return last.into_result();
        };
        let error_type = classify::error_type(outcome);
        if outcome == AttemptOutcome::Failure(FailureKind::Dns) {
            dns_failures += 1;
        }

        // Retryable and safe. Is another attempt possible?
        let retry_after = match pushback {
            Some(Pushback::After(wait)) => Some(wait),
            _ => last.retry_after(shared.clock.now()),
        };
        let backoff_delay = backoff
            .get_or_insert_with(|| {
                Backoff::new(policy.jitter(), policy.base(), policy.cap(), shared.rng())
            })
            .next_delay();
        let mut wait = backoff_delay.max(retry_after.unwrap_or_default());
        let stop = if repeat {
            Some(Stop::ClientRetry)
        } else if attempt >= max_attempts {
            Some(Stop::Attempts)
        } else if pushback == Some(Pushback::DoNotRetry) {
            Some(Stop::Pushback)
        } else if dns_failures >= DNS_MAX_ATTEMPTS {
            Some(Stop::Dns)
        } else if !body.is_replayable() {
            Some(Stop::Body)
        } else if wait >= deadline.at.saturating_duration_since(Instant::now()) {
            Some(Stop::Deadline)
        } else if permit.is_probe() {
            // A half-open probe tests the upstream with one attempt; retrying it would add
            // load exactly while the upstream may be recovering.
            Some(Stop::Probe)
        } else if !permit.is_current() {
            Some(Stop::Breaker)
        } else if !dep.budget().try_withdraw() {
            Some(Stop::Budget)
        } else {
            // A retry is an attempt like any other: over the learned rate it is not sent.
            // Its token is taken now, before the backoff, which it may lengthen.
            let left = deadline.at.saturating_duration_since(Instant::now());
            match dep.adaptive().map(|t| t.admit(false, left)) {
                Some(Err(_)) => Some(Stop::Throttled),
                Some(Ok(pace)) => {
                    wait = wait.max(pace);
                    None
                }
                None => None,
            }
        };
        if let Some(stop) = stop {
            let correlation_id = header_str(&parts.headers, &X_REQUEST_ID);
            report(stop, &dep, attempt, &error_type, correlation_id);
            permit.record(health);
            if let Some(op) = operation(&body) {
                dep.exhausted().remember(op, Instant::now());
            }
            return last.exhausted(attempt, stop).into_result();
        }

        attempt += 1;
        let backoff_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            correlation_id = header_str(&parts.headers, &X_REQUEST_ID),
            dependency = %name,
            attempt,
            max_attempts,
            backoff_ms,
            error_type = %error_type,
            idempotency_key = header_str(&parts.headers, &IDEMPOTENCY_KEY),
            retry_after_ms = retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            rung = ?rung,
            "retrying upstream request"
        );
        dep.metrics().retry(attempt);
        metrics::histogram!("retry_backoff_duration_seconds").record(wait.as_secs_f64());

        let endpoint = last.endpoint();
        // Free the upstream connection before waiting.
        drop(last);
        sleep(wait).await;
        waited = wait;
        if !permit.is_current() {
            // The breaker changed state while this request waited: ask again, as a new
            // request would (it may be open now, or this may become a probe).
            permit = dep
                .breaker()
                .try_acquire(caller)
                .map_err(|retry_after| RetryError::BreakerOpen { retry_after })?;
        }
        avoid_endpoint = endpoint.filter(|_| dep.endpoints() > 1);
    }
}

/// Sends one attempt; later attempts wait for readiness again first.
async fn send<S>(svc: &mut S, first: bool, req: Request<Body>) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>>,
{
    if !first {
        svc.ready().await?;
    }
    svc.call(req).await
}

fn header_str<'a>(headers: &'a HeaderMap, name: &http::HeaderName) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

// === impl Deadline ===

impl Deadline {
    /// `min(now + total, incoming)`; `None` when the incoming deadline has passed.
    fn new(
        now: Instant,
        wall_now: SystemTime,
        total: Duration,
        incoming: Option<SystemTime>,
    ) -> Option<Self> {
        let own = Self {
            at: now + total,
            wall: wall_now + total,
        };
        let Some(incoming) = incoming else {
            return Some(own);
        };
        match incoming.duration_since(wall_now) {
            Ok(left) if left.is_zero() => None,
            Ok(left) if left < total => Some(Self {
                at: now + left,
                wall: incoming,
            }),
            Ok(_) => Some(own),
            Err(_) => None,
        }
    }
}

// === impl Last ===

impl<E: UpstreamFailure> Last<E> {
    fn into_result(self) -> Result<Response<Body>, RetryError<E>> {
        match self {
            Self::Response(rsp) => Ok(rsp),
            Self::Error(e) => Err(e),
        }
    }

    /// Marks an upstream answer the layer gave up retrying (`X-Retry-Exhausted`).
    fn exhausted(mut self, attempts: u32, stop: Stop) -> Self {
        if let Self::Response(rsp) = &mut self {
            let value = format!("attempts={attempts}, reason={}", stop.as_str());
            if let Ok(value) = http::HeaderValue::from_str(&value) {
                rsp.headers_mut().insert(X_RETRY_EXHAUSTED, value);
            }
        }
        self
    }

    /// The endpoint that produced this result, to avoid on the next attempt.
    fn endpoint(&self) -> Option<usize> {
        match self {
            Self::Response(rsp) => rsp.extensions().get::<ServedBy>().map(|s| s.0),
            Self::Error(RetryError::Upstream(e)) => e.endpoint(),
            Self::Error(_) => None,
        }
    }

    fn retry_after(&self, now: SystemTime) -> Option<Duration> {
        match self {
            Self::Response(rsp) => rsp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| parse_retry_after(v, now)),
            Self::Error(_) => None,
        }
    }
}

// === fn report ===

/// Logs and counts a retryable failure returned without another attempt.
/// `retry_exhausted_total` counts the ones the policy's limits stopped (attempts,
/// DNS attempts, deadline); the budget counts its own (`retry_budget_exhausted_total`)
/// and every reason is in `retry_suppressed_total{dependency,reason}`.
fn report(stop: Stop, dep: &Dependency, attempt: u32, error_type: &str, correlation_id: &str) {
    tracing::debug!(
        correlation_id,
        dependency = &**dep.name(),
        attempt,
        error_type,
        reason = stop.as_str(),
        "not retrying upstream failure"
    );
    dep.metrics().suppressed(stop);
}
