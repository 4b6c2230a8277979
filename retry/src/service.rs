//! `Retry<S>`: the attempt loop around the upstream client. A request is admitted once
//! ([`call`]: deadline, breaker permit, body kept for replay), each attempt is sent and
//! classified ([`attempt`]), and after a retryable failure the loop decides whether another
//! may go ([`Call::stop`]), waits, and sends it.

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::body::Body;
use futures_util::future::{BoxFuture, Either, TryFutureExt};
use http::{HeaderMap, Request, Response};
use portcullis_problem::grpc::Pushback;
use tokio::time::{sleep, Instant};
use tower::{Service, ServiceExt};

use super::{
    backoff::Backoff,
    classify::{self, AttemptOutcome},
    error::{FailureKind, RetryError, UpstreamFailure},
    headers::{IDEMPOTENCY_KEY, X_REQUEST_ID},
    layer::Shared,
    metrics::Stop,
    upstream::UpstreamState,
};

mod attempt;
mod call;
mod deadline;
mod grpc_call;
mod hedge;
mod last;

use attempt::Attempted;
use call::{Call, Progress};

/// The retry middleware built by [`RetryLayer`].
#[derive(Clone)]
pub struct Retry<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Retry<S> {
    /// Wraps `inner`; built by [`RetryLayer`](crate::RetryLayer).
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}

// === impl Retry ===

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
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let Some(target) = (self.shared.target)(req.extensions()).cloned() else {
            // No policy: one attempt, no buffering, no timeout, no headers.
            return Box::pin(ready.call(req).map_err(RetryError::Upstream));
        };
        // Admitted here rather than in the future: the request goes into the `Call`, and
        // the future (copied into its box) holds that once instead of the request too.
        let arrived = Instant::now();
        match Call::admit(&self.shared, target, req, arrived) {
            Ok((call, pace)) => Box::pin(run(self.shared.clone(), ready, call, pace, arrived)),
            Err(refused) => Box::pin(std::future::ready(Err(refused))),
        }
    }
}

/// The attempt loop of an admitted request; `arrived` as in [`Call::admit`].
async fn run<S>(
    shared: Arc<Shared>,
    mut svc: S,
    mut call: Call,
    pace: Duration,
    arrived: Instant,
) -> Result<Response<Body>, RetryError<S::Error>>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: UpstreamFailure,
{
    if let Some(throttle) = call.dep.adaptive().filter(|_| !pace.is_zero()) {
        // Rare (adaptive throttling near its rate): boxed so that its timer does not widen
        // every request's future. Re-timed if the rate is cut meanwhile.
        Box::pin(throttle.wait_turn(pace)).await;
    }
    call.prepare(arrived).await?;
    // Seeded only when a retry is considered: most requests never need a random draw; boxed,
    // as the generator is a few hundred bytes every request's future would carry.
    let mut backoff: Option<Box<Backoff<_>>> = None;
    let mut attempt: u32 = 1;
    let mut avoid_endpoint = None;
    let mut dns_failures = 0;
    let mut waited = Duration::ZERO;
    loop {
        let Attempted {
            outcome,
            last,
            pushback,
            ended,
        } = call
            .attempt(&mut svc, &mut attempt, avoid_endpoint, waited)
            .await;
        let health = classify::breaker_outcome(outcome);
        let Some(rung) = classify::retry_rung(outcome, call.safety) else {
            call.permit.record(health, ended);
            return last.into_result();
        };
        if call.body.is_unsettled() {
            // A gRPC body still streaming: is it one whole message? Rare, so boxed.
            Box::pin(call.body.settle(call.deadline.at)).await;
        }
        let error_type = classify::error_type(outcome);
        if outcome == AttemptOutcome::Failure(FailureKind::Dns) {
            dns_failures += 1;
        }

        // Retryable and safe. Is another attempt possible?
        let retry_after = match pushback {
            Some(Pushback::After(wait)) => Some(wait),
            _ => last.retry_after(shared.clock.now()),
        };
        let policy = &call.policy;
        let backoff_delay = backoff
            .get_or_insert_with(|| {
                Box::new(Backoff::new(
                    policy.jitter(),
                    policy.base(),
                    policy.cap(),
                    shared.rng(),
                ))
            })
            .next_delay();
        let mut progress = Progress {
            attempt,
            dns_failures,
            pushback,
            wait: backoff_delay.max(retry_after.unwrap_or_default()),
        };
        let stop = call.stop(&mut progress);
        let wait = progress.wait;
        if let Some(stop) = stop {
            let correlation_id = header_str(&call.parts.headers, &X_REQUEST_ID);
            report(stop, &call.dep, attempt, &error_type, correlation_id);
            if let Some(op) = call.operation() {
                call.dep.exhausted().remember(op, Instant::now());
            }
            call.permit.record(health, ended);
            return last.exhausted(attempt, stop).into_result();
        }

        attempt += 1;
        let backoff_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            correlation_id = header_str(&call.parts.headers, &X_REQUEST_ID),
            dependency = %call.dep.name(),
            attempt,
            max_attempts = call.max_attempts,
            backoff_ms,
            error_type = %error_type,
            idempotency_key = header_str(&call.parts.headers, &IDEMPOTENCY_KEY),
            retry_after_ms = retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            rung = ?rung,
            "retrying upstream request"
        );
        call.dep.metrics().retry(attempt);
        metrics::histogram!("retry_backoff_duration_seconds").record(wait.as_secs_f64());

        let endpoint = last.endpoint();
        // Free the upstream connection before waiting.
        drop(last);
        sleep(wait).await;
        waited = wait;
        if !call.permit.is_current() {
            // The breaker changed state while this request waited: ask again, as a new
            // request would (it may be open now, or this may become a probe).
            call.permit = call
                .dep
                .breaker()
                .try_acquire(call.caller)
                .map_err(|retry_after| RetryError::BreakerOpen { retry_after })?;
        }
        avoid_endpoint = endpoint.filter(|_| call.dep.endpoints() > 1);
    }
}

/// What [`send`] returns: the inner service's future, or a boxed wait for readiness and it.
type Sent<'a, S> = Either<
    <S as Service<Request<Body>>>::Future,
    BoxFuture<'a, Result<Response<Body>, <S as Service<Request<Body>>>::Error>>,
>;

/// Sends one attempt; later attempts wait for readiness again first. The first is the
/// inner service's own future (the layer's caller drove it ready); a later one is boxed, so
/// that the request it holds while waiting does not widen every attempt's future.
fn send<'a, S>(svc: &'a mut S, first: bool, req: Request<Body>) -> Sent<'a, S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send,
    S::Future: Send,
    S::Error: Send,
{
    if first {
        return Either::Left(svc.call(req));
    }
    Either::Right(Box::pin(async move { svc.ready().await?.call(req).await }))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &http::HeaderName) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

// === fn report ===

/// Logs and counts a retryable failure returned without another attempt.
/// `retry_exhausted_total` counts the ones the policy's limits stopped (attempts,
/// DNS attempts, deadline); the budget counts its own (`retry_budget_exhausted_total`)
/// and every reason is in `retry_suppressed_total{dependency,reason}`.
fn report(stop: Stop, dep: &UpstreamState, attempt: u32, error_type: &str, correlation_id: &str) {
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
