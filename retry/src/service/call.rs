//! One request under a retry policy: what every attempt of it needs, decided once when it
//! is admitted, and the decision, after a retryable failure, whether another attempt may go.

use std::{sync::Arc, time::Duration};

use axum::body::Body;
use bytes::Bytes;
use http::{request::Parts, HeaderValue, Request};
use portcullis_problem::grpc::{self, Pushback, GRPC_TIMEOUT};
use tokio::time::{timeout_at, Instant};

use super::{deadline::Deadline, grpc_call::incoming_deadline};
use crate::{
    body::Prepared,
    classify::{RequestSafety, DNS_MAX_ATTEMPTS},
    error::RetryError,
    handoff::Handoff,
    headers::{
        attempt_value, format_deadline, IDEMPOTENCY_KEY, X_REQUEST_DEADLINE, X_RETRY_ATTEMPT,
    },
    layer::Shared,
    metrics::Stop,
    policy::RetryPolicy,
    upstream::breaker::BreakerPermit,
    upstream::latency::Latency,
    upstream::UpstreamState,
    AttemptInfo, RetryTarget,
};

/// One admitted request: its head (copied into every attempt), its body kept for replay,
/// and what the policy and the client's deadline allow it.
pub(super) struct Call {
    pub(super) policy: Arc<RetryPolicy>,
    pub(super) dep: Arc<UpstreamState>,
    pub(super) route_latency: Option<Arc<Latency>>,
    pub(super) parts: Parts,
    pub(super) body: Prepared,
    pub(super) deadline: Deadline,
    deadline_header: HeaderValue,
    /// A gRPC call: its deadline also goes out in `grpc-timeout`, rewritten per attempt.
    pub(super) grpc: bool,
    pub(super) safety: RequestSafety,
    pub(super) caller: u64,
    /// A client retrying an operation this layer already gave up on: one attempt only.
    pub(super) repeat: bool,
    pub(super) max_attempts: u32,
    /// One breaker permit per request, not per attempt: retries must not multiply one
    /// caller's weight in the breaker's window.
    pub(super) permit: BreakerPermit,
    /// Where an attempt that times out may be left running (`handoff`); taken once used.
    pub(super) handoff: Option<Handoff>,
}

/// Where the attempt loop stands after a retryable failure.
pub(super) struct Progress {
    pub(super) attempt: u32,
    pub(super) dns_failures: u32,
    pub(super) pushback: Option<Pushback>,
    /// The delay before the next attempt (backoff, at least the upstream's `Retry-After`).
    pub(super) wait: Duration,
}

// === impl Call ===

impl Call {
    /// Admits a request: its deadline, a breaker permit and the adaptive throttle's pace
    /// (the delay to wait before [`Call::prepare`]); `arrived` is when the layer received
    /// it. Synchronous, so that the request's future holds no state of it.
    pub(super) fn admit<E>(
        shared: &Shared,
        target: RetryTarget,
        req: Request<Body>,
        arrived: Instant,
    ) -> Result<(Self, Duration), RetryError<E>> {
        let RetryTarget {
            policy,
            upstream: dep,
            idempotent_route,
            route_latency,
        } = target;
        let wall_now = shared.clock.now();
        let incoming = incoming_deadline(req.headers(), wall_now);
        let Some(deadline) = Deadline::new(arrived, wall_now, policy.total(), incoming) else {
            tracing::debug!(dependency = %dep.name(), "request deadline passed before the first attempt");
            return Err(RetryError::DeadlineExceeded);
        };
        let caller = (shared.caller_key)(req.extensions());
        let permit = dep
            .breaker()
            .try_acquire_at(caller, arrived)
            .map_err(|retry_after| RetryError::BreakerOpen { retry_after })?;
        // Over the rate the upstream was learned to accept: answered here, never sent.
        let pace = match dep.adaptive() {
            Some(throttle) => throttle
                .admit(true, deadline.at.saturating_duration_since(arrived))
                .map_err(|retry_after| RetryError::Throttled {
                    retry_after,
                    rate: throttle.rate().unwrap_or_default(),
                })?,
            None => Duration::ZERO,
        };
        let (parts, body) = req.into_parts();
        let handoff = shared.handoff.and_then(|find| find(&parts.extensions));
        let safety = RequestSafety::new(
            &parts.method,
            idempotent_route,
            (shared.is_protected)(&parts.extensions),
            dep.dedupes_idempotency_keys(),
        );
        let call = Self {
            deadline_header: format_deadline(deadline.wall),
            grpc: grpc::is_grpc(&parts.headers),
            policy,
            dep,
            route_latency,
            parts,
            body: Prepared::Once(Some(body)),
            deadline,
            safety,
            caller,
            repeat: false,
            max_attempts: 1,
            permit,
            handoff,
        };
        Ok((call, pace))
    }

    /// Reads the body for replay when the policy allows retries, then counts the request
    /// (`arrived` as in [`Call::admit`]).
    pub(super) async fn prepare<E>(&mut self, arrived: Instant) -> Result<(), RetryError<E>> {
        if self.policy.max_retries() > 0 {
            let body = self.body.take();
            self.body = if http_body::Body::is_end_stream(&body) {
                // Most GETs: nothing to read, and nothing to wait for.
                Prepared::Replayable(Bytes::new())
            } else if self.grpc {
                // A streaming call's client may wait for answers before it sends more: sent
                // at once, replayed only if it proves to be one whole message.
                Prepared::teed(body, self.policy.body_replay_limit())
            } else {
                let limit = self.policy.body_replay_limit();
                match timeout_at(self.deadline.at, Prepared::read(body, limit)).await {
                    Ok(prepared) => prepared.map_err(RetryError::RequestBody)?,
                    Err(_) => return Err(RetryError::DeadlineExceeded),
                }
            };
        }
        // Retries must not multiply across layers (see `exhausted`).
        self.repeat = self.dep.exhausted().is_live(arrived)
            && self
                .operation()
                .is_some_and(|op| self.dep.exhausted().contains(op, arrived));
        self.max_attempts = if self.repeat {
            1
        } else {
            self.policy.max_attempts()
        };
        // Counted when it arrived: the clock was read then (each read costs ~40 ns here).
        self.dep.budget().deposit_at(arrived);
        self.dep.metrics().request();
        Ok(())
    }

    /// The operation's fingerprint for the client-retry memory (`exhausted`).
    pub(super) fn operation(&self) -> Option<u64> {
        let key = self
            .parts
            .headers
            .get(IDEMPOTENCY_KEY)
            .map(|v| v.as_bytes());
        self.dep
            .exhausted()
            .fingerprint(self.caller, &self.parts, key, self.body.bytes())
    }

    /// The request of attempt `number`: the client's head with this layer's headers, and
    /// the body (the replayed copy, or the only one).
    pub(super) fn request(
        &mut self,
        info: AttemptInfo,
        grpc_timeout: Option<&HeaderValue>,
    ) -> Request<Body> {
        let mut req = Request::from_parts(self.parts.clone(), self.body.take());
        let headers = req.headers_mut();
        headers.insert(X_RETRY_ATTEMPT, attempt_value(info.number));
        headers.insert(X_REQUEST_DEADLINE, self.deadline_header.clone());
        if let Some(value) = grpc_timeout {
            headers.insert(GRPC_TIMEOUT, value.clone());
        }
        req.extensions_mut().insert(info);
        req
    }

    /// Why no further attempt may go after a retryable failure, if one may not.
    /// An adaptive throttle's pace for the retry lengthens `progress.wait`.
    pub(super) fn stop(&self, progress: &mut Progress) -> Option<Stop> {
        let dep = &self.dep;
        if self.repeat {
            Some(Stop::ClientRetry)
        } else if progress.attempt >= self.max_attempts {
            Some(Stop::Attempts)
        } else if progress.pushback == Some(Pushback::DoNotRetry) {
            Some(Stop::Pushback)
        } else if progress.dns_failures >= DNS_MAX_ATTEMPTS {
            Some(Stop::Dns)
        } else if !self.body.is_replayable() {
            Some(Stop::Body)
        } else if progress.wait >= self.deadline.left(Instant::now()) {
            Some(Stop::Deadline)
        } else if self.permit.is_probe() {
            // A half-open probe tests the upstream with one attempt; retrying it would add
            // load exactly while the upstream may be recovering.
            Some(Stop::Probe)
        } else if !self.permit.is_current() {
            Some(Stop::Breaker)
        } else if !dep.budget().try_withdraw() {
            Some(Stop::Budget)
        } else {
            // A retry is an attempt like any other: over the learned rate it is not sent.
            // Its token is taken now, before the backoff, which its pace may lengthen.
            let left = self.deadline.left(Instant::now());
            match dep.adaptive().map(|t| t.admit(false, left)) {
                Some(Err(_)) => Some(Stop::Throttled),
                Some(Ok(pace)) => {
                    progress.wait = progress.wait.max(pace);
                    None
                }
                None => None,
            }
        }
    }
}
