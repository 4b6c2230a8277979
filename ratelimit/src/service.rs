//! [`RateLimit`]: the service. Decides in `call`, answers 429/503 itself, never queues.
//!
//! Per request, on the limited path: the extractor's closure call, one limiter decision
//! (local: a hash and a lock per shard touched, no allocation for up to four checks; Redis:
//! one round trip), then a few header inserts on the response. Requests the extractor
//! returns `None` for go straight to the inner service, boxed and otherwise untouched.
//! `poll_ready` only delegates: waiting for tokens would turn a rate limit into a queue
//! (what tower's own `RateLimit` does in `poll_ready`); clients are told when to return
//! instead.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower::{Layer, Service};

use crate::decision::Verdict;
use crate::headers::write_verdict_headers;
use crate::layer::RateLimitLayer;
use crate::limiter::{Check, LimitRequest};
use crate::outcome::RateLimitOutcome;
use crate::rejection::Rejection;

/// Rate-limits requests to `S`. Built by [`RateLimitLayer`].
#[derive(Clone, Debug)]
pub struct RateLimit<S> {
    inner: S,
    // One Arc: axum clones the service per request, so this is one refcount increment.
    shared: Arc<RateLimitLayer>,
}

// The layer's `Layer` impl lives here, with the service it builds, so that `layer.rs` (the
// configuration) does not import the service that imports it.
impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.clone())
    }
}

// === impl RateLimit ===

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, layer: RateLimitLayer) -> Self {
        Self {
            inner,
            shared: Arc::new(layer),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> Service<Request<Body>> for RateLimit<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let limits = (self.shared.extract)(&parts).filter(|r| !r.is_empty());
        let req = Request::from_parts(parts, body);
        let Some(limits) = limits else {
            return Box::pin(self.inner.call(req));
        };
        // The instance that was polled ready is the one that must be called; keep it and
        // leave a fresh clone behind (tower's "clone and swap").
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let checks = limits.checks();
            let verdict = match shared.limiter.check(checks).await {
                Ok(verdict) => verdict,
                Err(err) => {
                    for check in checks {
                        check.policy.metrics().error.increment(1);
                    }
                    tracing::warn!(error = %err, "rate-limit decision failed; answering 503");
                    let retry_after = err.retry_after().unwrap_or(shared.unavailable_retry_after);
                    return Ok(answer(
                        &shared,
                        &req,
                        Rejection::StoreUnavailable { retry_after },
                    ));
                }
            };
            let unix_now = shared.clock.unix_now();
            record(checks, &verdict);
            if !verdict.is_allowed() {
                return Ok(answer(
                    &shared,
                    &req,
                    rejection(&limits, &verdict, unix_now),
                ));
            }
            let mut response = inner.call(req).await?;
            write_verdict_headers(response.headers_mut(), checks, &verdict, unix_now);
            let shadow_limited = verdict.decisions().iter().any(|d| !d.allowed && d.shadow);
            response.extensions_mut().insert(if shadow_limited {
                RateLimitOutcome::ShadowLimited
            } else {
                RateLimitOutcome::Allowed
            });
            Ok(response)
        })
    }
}

/// The layer's own answer, after telling the observer.
fn answer(shared: &RateLimitLayer, req: &Request<Body>, rejection: Rejection) -> Response<Body> {
    if let Some(observe) = &shared.observe {
        observe(req.extensions(), &rejection);
    }
    let outcome = match rejection {
        Rejection::RateLimited { .. } => RateLimitOutcome::Limited,
        _ => RateLimitOutcome::Unavailable,
    };
    let mut response = rejection.to_response();
    response.extensions_mut().insert(outcome);
    response
}

fn rejection(limits: &LimitRequest, verdict: &Verdict, unix_now: std::time::Duration) -> Rejection {
    let index = verdict.reported().unwrap_or(0);
    match (limits.checks().get(index), verdict.decisions().get(index)) {
        (Some(check), Some(decision)) => {
            tracing::debug!(
                policy = check.policy.name(),
                retry_after_s = decision.retry_after_secs(),
                "rate limited"
            );
            Rejection::RateLimited {
                policy: check.policy.clone(),
                decision: *decision,
                violated_policies: violated_policies(limits.checks(), verdict),
                unix_now,
            }
        }
        // A verdict always has one decision per check; a limiter breaking that is a bug,
        // answered as "cannot decide" rather than a panic.
        _ => Rejection::StoreUnavailable {
            retry_after: verdict.retry_after(),
        },
    }
}

/// The names of the enforced policies that refused the request, in check order, each once
/// (two checks may share a policy name, e.g. a tenant's bucket on two keys). Shadow policies
/// are left out: they did not refuse anything.
fn violated_policies(checks: &[Check], verdict: &Verdict) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (check, _) in checks
        .iter()
        .zip(verdict.decisions())
        .filter(|(_, d)| d.blocks())
    {
        if !names.iter().any(|n| n == check.policy.name()) {
            names.push(check.policy.name().to_owned());
        }
    }
    names
}

fn record(checks: &[Check], verdict: &Verdict) {
    for (check, decision) in checks.iter().zip(verdict.decisions()) {
        let m = check.policy.metrics();
        if decision.allowed {
            m.allowed.increment(1);
        } else if decision.shadow {
            m.shadow_rejected.increment(1);
            m.shadow_rejections.increment(1);
        } else {
            m.rejected.increment(1);
        }
    }
}
