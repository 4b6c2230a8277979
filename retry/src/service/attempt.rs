//! One attempt of an admitted request (with its hedged copy, when hedging applies): sent
//! under the attempt timeout, its outcome classified and recorded.

use std::time::Duration;

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::Response;
use portcullis_problem::grpc::{self, GrpcCode, Pushback};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use super::{call::Call, grpc_call, hedge, last::Last, send};
use crate::{
    classify::{self, AttemptOutcome},
    error::{RetryError, UpstreamFailure},
    AttemptInfo, PickedEndpoint,
};

/// What an attempt came back with.
pub(super) struct Attempted<E> {
    pub(super) outcome: AttemptOutcome,
    pub(super) last: Last<E>,
    pub(super) pushback: Option<Pushback>,
    /// When the answer (or the timeout) came.
    pub(super) ended: Instant,
}

// === impl Call ===

impl Call {
    /// Sends attempt `*attempt` (`info` says which endpoint to avoid and how long it waited);
    /// a hedged first attempt whose copy went out counts as attempt 2.
    pub(super) async fn attempt<S>(
        &mut self,
        svc: &mut S,
        attempt: &mut u32,
        avoid_endpoint: Option<usize>,
        waited: Duration,
    ) -> Attempted<S::Error>
    where
        S: Service<http::Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: UpstreamFailure,
    {
        let dep = self.dep.clone();
        let started = Instant::now();
        let own_timeout = self.policy.attempt_timeout_for(&dep);
        let limit = own_timeout.min(self.deadline.left(started));
        // Only the upstream's own timeout judges it (passive health, adaptive congestion):
        // a deadline the client cut shorter is the client's hurry.
        let timeout_at = (limit == own_timeout).then_some(started + limit);
        let grpc_timeout = self.grpc.then(|| grpc::format_timeout(limit));
        let info = AttemptInfo {
            number: *attempt,
            avoid_endpoint,
            backoff: waited,
            timeout_at,
            started,
        };
        dep.metrics().attempt();
        // Only the first attempt of an idempotent request is hedged, to another endpoint.
        let hedge_after = (*attempt == 1
            && self.safety.idempotent
            && self.max_attempts > 1
            && self.body.is_replayable()
            && dep.endpoints() > 1)
            .then(|| self.policy.hedge_delay(&dep))
            .flatten()
            .filter(|after| *after < limit);
        // A gRPC error can hide in trailers behind a 200; worth a look only when it could
        // be retried.
        let peek_until = (self.grpc
            && *attempt < self.max_attempts
            && classify::retry_rung(AttemptOutcome::Grpc(GrpcCode::Unavailable), self.safety)
                .is_some())
        .then_some(started + limit);

        // The request is built into the future that sends it, not held beside it.
        // A request whose caller keeps its outcome, on an attempt whose timeout ends it: a
        // timed-out exchange is left running (`handoff`). Rare (keyed requests), so boxed.
        let hand_off = self.handoff.is_some()
            && classify::retry_rung(AttemptOutcome::Timeout, self.safety).is_none();
        let sent = match hedge_after {
            None if hand_off => {
                let req = self.request(info, grpc_timeout.as_ref());
                Box::pin(self.handing_off(svc, *attempt == 1, req, started + limit)).await
            }
            None => {
                let first = *attempt == 1;
                tokio::time::timeout_at(
                    started + limit,
                    send(svc, first, self.request(info, grpc_timeout.as_ref())),
                )
                .await
            }
            // Rare (configured per route): boxed so that the race's state does not widen
            // every request's future.
            Some(after) => {
                let req = self.request(info, grpc_timeout.as_ref());
                let hedge = self.hedged(svc, req, after, grpc_timeout, timeout_at);
                Box::pin(tokio::time::timeout_at(started + limit, hedge))
                    .await
                    .map(|(answer, hedged)| {
                        if hedged {
                            *attempt = 2;
                        }
                        answer
                    })
            }
        };
        let mut pushback = None;
        let (outcome, last) = match sent {
            Ok(Ok(rsp)) => {
                let (outcome, rsp, sent_pushback) =
                    match (grpc_call::head_outcome(&rsp), peek_until) {
                        (Some((outcome, pushback)), _) => (outcome, rsp, pushback),
                        (None, None) => (AttemptOutcome::Status(rsp.status()), rsp, None),
                        // Only a gRPC call that could be retried waits for a frame here; rare,
                        // so boxed rather than widening every request's future.
                        (None, Some(until)) => Box::pin(grpc_call::peek(rsp, until)).await,
                    };
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
        if let Some(route) = &self.route_latency {
            route.record(now.saturating_duration_since(started), now);
        }
        if let Some(throttle) = dep.adaptive() {
            if outcome != AttemptOutcome::Timeout || timeout_at.is_some() {
                throttle.observe(outcome, started);
            }
        }
        Attempted {
            outcome,
            last,
            pushback,
            ended: now,
        }
    }

    /// Sends `req` under the timeout `at`; if that passes first, the exchange is handed to
    /// the request's [`Handoff`](crate::Handoff) instead of being dropped.
    async fn handing_off<S>(
        &mut self,
        svc: &mut S,
        first: bool,
        req: http::Request<Body>,
        at: Instant,
    ) -> Result<Result<Response<Body>, S::Error>, tokio::time::error::Elapsed>
    where
        S: Service<http::Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: UpstreamFailure,
    {
        let mut exchange: BoxFuture<'static, Result<Response<Body>, S::Error>> = if first {
            Box::pin(svc.call(req))
        } else {
            let mut svc = svc.clone();
            Box::pin(async move { svc.ready().await?.call(req).await })
        };
        match tokio::time::timeout_at(at, &mut exchange).await {
            Ok(answer) => Ok(answer),
            Err(elapsed) => {
                if let Some(handoff) = self.handoff.take() {
                    tracing::debug!(dependency = %self.dep.name(), "attempt timed out; its exchange is left running for the caller");
                    handoff.spawn(exchange);
                }
                Err(elapsed)
            }
        }
    }

    /// The first attempt `req`, raced against a copy sent after `after`; whether the copy
    /// went out.
    async fn hedged<S>(
        &mut self,
        svc: &mut S,
        mut req: http::Request<Body>,
        after: Duration,
        grpc_timeout: Option<http::HeaderValue>,
        timeout_at: Option<Instant>,
    ) -> (Result<Response<Body>, S::Error>, bool)
    where
        S: Service<http::Request<Body>, Response = Response<Body>> + Clone + Send,
        S::Error: UpstreamFailure,
    {
        let dep = self.dep.clone();
        let safety = self.safety;
        // The client records the first attempt's endpoint; the copy avoids it.
        let picked = PickedEndpoint::new();
        req.extensions_mut().insert(picked.clone());
        let second = || {
            // The copy is an attempt: it needs the retry budget's token, then a token of the
            // adaptive rate now (a copy that waited would no longer be early); the same
            // order as a retry's, so a refused copy never holds an adaptive token.
            let admitted = dep.budget().try_withdraw()
                && dep
                    .adaptive()
                    .is_none_or(|t| t.admit(false, Duration::ZERO).is_ok());
            admitted.then(|| {
                dep.metrics().attempt();
                dep.metrics().retry(2);
                let info = AttemptInfo {
                    number: 2,
                    avoid_endpoint: picked.get(),
                    backoff: after,
                    timeout_at,
                    started: Instant::now(),
                };
                self.request(info, grpc_timeout.as_ref())
            })
        };
        let retryable = |answer: &Result<Response<Body>, S::Error>| {
            let outcome = match answer {
                Ok(rsp) => AttemptOutcome::Status(rsp.status()),
                Err(e) => AttemptOutcome::Failure(e.kind()),
            };
            classify::retry_rung(outcome, safety).is_some()
        };
        let raced = hedge::race(svc, req, after, second, retryable).await;
        if raced.hedged {
            tracing::debug!(dependency = %dep.name(), after_ms = after.as_millis() as u64, "hedged the first attempt");
        }
        (raced.answer, raced.hedged)
    }
}
