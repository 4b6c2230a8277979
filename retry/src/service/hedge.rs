//! Hedging: for an idempotent request, a second copy of the first attempt goes out once the
//! first has taken `after` (a fixed delay or a quantile of the upstream's measured latency),
//! and the first answer wins; the other is dropped, which cancels it (hyper closes that
//! connection or resets that HTTP/2 stream). The copy draws on the retry budget like a
//! retry, so hedging can never add more than the budget's share of load. A first answer
//! that is itself a retryable failure does not win while the other copy may still succeed.

use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use tokio::time::sleep;
use tower::{Service, ServiceExt};

/// The answer of a hedged attempt, and whether the second copy was sent.
pub(super) struct Raced<E> {
    pub(super) answer: Result<Response<Body>, E>,
    pub(super) hedged: bool,
}

/// Sends `primary`; after `after` without an answer, also the request `second` builds
/// (`None`: the budget refused it). `retryable` tells a failure the other copy may beat.
pub(super) async fn race<S>(
    svc: &mut S,
    primary: Request<Body>,
    after: Duration,
    second: impl FnOnce() -> Option<Request<Body>>,
    retryable: impl Fn(&Result<Response<Body>, S::Error>) -> bool,
) -> Raced<S::Error>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone,
{
    let mut other = svc.clone();
    // The first attempt: the layer's caller drove `svc` ready.
    let first = svc.call(primary);
    tokio::pin!(first);
    tokio::select! {
        answer = &mut first => return Raced { answer, hedged: false },
        () = sleep(after) => {}
    }
    let Some(copy) = second() else {
        return Raced {
            answer: first.await,
            hedged: false,
        };
    };
    let hedge = async move {
        other.ready().await?;
        other.call(copy).await
    };
    tokio::pin!(hedge);
    let answer = tokio::select! {
        answer = &mut first => if retryable(&answer) { hedge.await } else { answer },
        answer = &mut hedge => if retryable(&answer) { first.await } else { answer },
    };
    Raced {
        answer,
        hedged: true,
    }
}
