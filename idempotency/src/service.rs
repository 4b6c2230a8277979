//! [`Idempotency`]: the service. Validates the key, fingerprints, locks, then hands the
//! request to [`forward`](crate::forward) which executes it and settles the record.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{header, Request, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use portcullis_problem::is_caused_by;
use rand::Rng;
use tokio::time::Instant;
use tower::Service;
use tracing::Instrument;

use crate::detach::{Detached, Panicked};
use crate::extensions::{IdempotencyLock, IdempotencyOutcome as Marked};
use crate::fingerprint::{Fingerprint, FingerprintInput};
use crate::forward::{self, Held};
use crate::key::{IdempotencyKey, KeyError};
use crate::late::LateAnswer;
use crate::rejection::Rejection;
use crate::settings::ExtractSettings;
use crate::settings::{IdempotencySettings, OnInFlight};
use crate::store::{LockOutcome, RecordKey, Store, StoreError};

/// `Retry-After` for a duplicate in flight. Most requests finish well within a second; the
/// lease (the worst case) is often 30 s and would send clients away for far too long.
const IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `Retry-After` when the store is unreachable: long enough for a Redis failover to start
/// showing, short enough that a blip costs one second.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `Retry-After` when the tenant's share of a bounded store is full: room comes back only as
/// its records expire, so a client retrying every second would only add load.
const STORE_FULL_RETRY_AFTER: Duration = Duration::from_secs(10);

const WAIT_BACKOFF_START: Duration = Duration::from_millis(25);
const WAIT_BACKOFF_CAP: Duration = Duration::from_secs(1);

/// Tower service deduplicating keyed requests; see the crate docs for the lifecycle.
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    store: Arc<dyn Store>,
    extract: ExtractSettings,
}

// === impl Idempotency ===

impl<S> Idempotency<S> {
    /// Wraps `inner`; usually built through [`IdempotencyLayer`](crate::IdempotencyLayer).
    pub fn new(inner: S, store: Arc<dyn Store>, extract: ExtractSettings) -> Self {
        Self {
            inner,
            store,
            extract,
        }
    }
}

impl<S> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

impl<S> Service<Request<Body>> for Idempotency<S>
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
        let settings = (self.extract)(&parts)
            .filter(|s| s.methods.contains(&parts.method))
            .map(IdempotencySettings::effective);
        let Some(settings) = settings else {
            return Box::pin(self.inner.call(Request::from_parts(parts, body)));
        };
        // The service that was polled ready is the one that must be called; keep it and
        // leave a fresh clone behind (tower's "clone in call" pattern).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(handle(inner, self.store.clone(), settings, parts, body))
    }
}

async fn handle<S>(
    mut inner: S,
    store: Arc<dyn Store>,
    settings: IdempotencySettings,
    mut parts: http::request::Parts,
    body: Body,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    let key = match IdempotencyKey::from_headers(&parts.headers, settings.max_key_len) {
        Ok(Some(key)) => key,
        Ok(None) if settings.require_key => {
            return Ok(
                Marked::InvalidKey.mark(Rejection::InvalidKey(KeyError::Missing).into_response())
            )
        }
        // No key on an optional route: nothing to deduplicate, forward untouched.
        Ok(None) => return inner.call(Request::from_parts(parts, body)).await,
        Err(e) => return Ok(Marked::InvalidKey.mark(Rejection::InvalidKey(e).into_response())),
    };

    let bytes = match Limited::new(body, settings.max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            let limit = settings.max_body_bytes;
            return Ok(Marked::BodyRejected.mark(Rejection::BodyTooLarge { limit }.into_response()));
        }
        // The server's own body limit, below this layer, arrives wrapped in the body's
        // error chain: the client's 413, not an unreadable body.
        Err(e) if is_caused_by::<LengthLimitError>(&*e) => {
            return Ok(Marked::BodyRejected.mark(Rejection::BodyLimitExceeded.into_response()));
        }
        Err(_) => return Ok(Marked::BodyRejected.mark(Rejection::BodyUnreadable.into_response())),
    };

    let fingerprint = Fingerprint::compute(&FingerprintInput {
        method: parts.method.as_str(),
        path_and_query: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        tenant: &settings.tenant,
        content_type: parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.as_bytes()),
        body: &bytes,
    });
    let record = RecordKey::new(&*settings.tenant, &*settings.route, key.clone());

    let (fencing, took_over, asked) =
        match acquire(store.as_ref(), &record, &fingerprint, &settings).await {
            Ok(acquired) => acquired,
            Err(answer) => return Ok(answer),
        };
    if took_over && !settings.upstream_dedupes_keys {
        let held = Held {
            store,
            record,
            fencing,
            settings,
        };
        return Ok(Marked::TakenOver.mark(forward::interrupted(held).await));
    }

    // From here the request runs to completion even if the client hangs up: inline while the
    // client waits, in a task of its own once it stops waiting (see `detach`), so nothing can
    // cancel it between "sent upstream" and "outcome recorded".
    parts.extensions.insert(IdempotencyLock { key, fencing });
    // An attempt that times out may be left running until the lease ends (see `late`); an
    // upstream that dedupes on keys is simply asked again instead.
    let late = (!settings.upstream_dedupes_keys).then(|| {
        let (answer, pending) = LateAnswer::new(asked + settings.lease);
        parts.extensions.insert(answer);
        pending
    });
    let req = Request::from_parts(parts, Body::from(bytes));
    let held = Held {
        store,
        record,
        fencing,
        settings,
    };
    let task = forward::execute(inner, req, held, late).instrument(tracing::Span::current());
    match Detached::new(task).await {
        Ok(result) => result.map(|response| Marked::First.mark(response)),
        Err(Panicked) => {
            // A panic below us: the outcome is unknown, so the lease is left to expire
            // rather than released (see the crate docs, "Failures and cancellation").
            tracing::error!("idempotent request panicked below the idempotency layer");
            Ok(Marked::First.mark(Rejection::Internal.into_response()))
        }
    }
}

/// Takes the lock (returning its fencing token, whether an expired lease was taken over, and
/// when the successful attempt was made: the lease runs from no earlier than that),
/// or produces the answer for a request that must not run: a replay, 409, 422 or 503. In
/// `Wait` mode, polls while the first copy is in flight.
async fn acquire(
    store: &dyn Store,
    record: &RecordKey,
    fingerprint: &Fingerprint,
    settings: &IdempotencySettings,
) -> Result<(u64, bool, Instant), Response<Body>> {
    let deadline = match settings.on_in_flight {
        OnInFlight::Wait(max) => Some(Instant::now() + max),
        OnInFlight::Reject => None,
    };
    let mut backoff = WAIT_BACKOFF_START;
    loop {
        let asked = Instant::now();
        let outcome = store
            .try_lock(record, fingerprint, settings.lease, settings.ttl)
            .await;
        match outcome {
            Ok(LockOutcome::Acquired { fencing, took_over }) => {
                if took_over {
                    metrics::counter!("idempotency_lease_takeovers_total").increment(1);
                    tracing::info!(tenant = %record.tenant, route = %record.route, fencing,
                        "took over an expired idempotency lease");
                }
                return Ok((fencing, took_over, asked));
            }
            Ok(LockOutcome::Completed(stored)) => {
                metrics::counter!("idempotency_replays_total").increment(1);
                return Err(Marked::Replayed.mark(stored.to_replay()));
            }
            Ok(LockOutcome::Mismatch) => {
                metrics::counter!("idempotency_mismatches_total").increment(1);
                return Err(Marked::Mismatch.mark(Rejection::Mismatch.into_response()));
            }
            Ok(LockOutcome::TooLarge { status }) => {
                metrics::counter!("idempotency_conflicts_total", "reason" => "too_large")
                    .increment(1);
                return Err(
                    Marked::TooLarge.mark(Rejection::TooLargeToReplay { status }.into_response())
                );
            }
            Ok(LockOutcome::InFlight { lease_remaining }) => {
                let now = Instant::now();
                if let Some(deadline) = deadline.filter(|d| *d > now) {
                    // Full jitter keeps many waiters on one key from polling in lock-step.
                    let sleep = rand::thread_rng().gen_range(backoff / 2..=backoff);
                    tokio::time::sleep(sleep.min(deadline - now)).await;
                    backoff = (backoff * 2).min(WAIT_BACKOFF_CAP);
                    continue;
                }
                metrics::counter!("idempotency_conflicts_total", "reason" => "in_flight")
                    .increment(1);
                let retry_after = IN_FLIGHT_RETRY_AFTER.min(lease_remaining);
                return Err(
                    Marked::InFlight.mark(Rejection::InFlight { retry_after }.into_response())
                );
            }
            Err(e) => {
                metrics::counter!("idempotency_store_errors_total", "op" => "try_lock",
                    "kind" => e.kind())
                .increment(1);
                tracing::warn!(error = %e, transient = e.is_transient(), tenant = %record.tenant,
                    "idempotency store unavailable; refusing to forward unprotected");
                let rejection = match e {
                    StoreError::Full { .. } | StoreError::ShareFull { .. } => {
                        Rejection::StoreFull {
                            retry_after: STORE_FULL_RETRY_AFTER,
                        }
                    }
                    _ => Rejection::StoreUnavailable {
                        retry_after: STORE_RETRY_AFTER,
                    },
                };
                return Err(Marked::Unavailable.mark(rejection.into_response()));
            }
        }
    }
}
