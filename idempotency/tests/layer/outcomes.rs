//! The outcome table through the layer: which upstream answers are stored (and replayed)
//! and which release the key (the retry executes again).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use portcullis_idempotency::{IdempotencyLayer, NotForwarded};
use tower::Layer;

use super::support::*;

type MakeResponse = fn() -> Response<Body>;

/// Sends the same keyed request twice; returns (upstream hits, second response).
async fn twice(
    settings_fn: impl Fn() -> portcullis_idempotency::IdempotencySettings,
    resp: MakeResponse,
) -> (usize, Collected) {
    let up = Upstream::new(Duration::ZERO, move |_| resp());
    let svc = stack(&up, settings_fn());
    let first = send(&svc, post("k-outcome", "{}")).await;
    assert!(!first.replayed());
    let second = send(&svc, post("k-outcome", "{}")).await;
    (up.hits(), second)
}

fn with_retry_after(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut().insert("retry-after", "2".parse().unwrap());
    r
}

#[tokio::test(start_paused = true)]
async fn definitive_answers_are_replayed() {
    for status in [201, 200, 302, 400, 404, 409, 422] {
        let resp = match status {
            201 => || reply(201, "x"),
            200 => || reply(200, "x"),
            302 => || reply(302, "x"),
            400 => || reply(400, "x"),
            404 => || reply(404, "x"),
            409 => || reply(409, "x"),
            _ => || reply(422, "x"),
        };
        let (hits, second) = twice(settings, resp).await;
        assert_eq!(hits, 1, "status {status} must be stored");
        assert_eq!(second.status.as_u16(), status);
        assert!(second.replayed());
    }
}

#[tokio::test(start_paused = true)]
async fn provably_unprocessed_answers_release_the_key() {
    let cases: [(&str, MakeResponse); 5] = [
        ("429", || reply(429, "slow down")),
        ("408", || reply(408, "timeout")),
        ("503+Retry-After", || with_retry_after(reply(503, "busy"))),
        ("NotForwarded 502", || {
            let mut r = reply(502, "connect refused");
            r.extensions_mut().insert(NotForwarded);
            r
        }),
        ("NotForwarded 503", || {
            let mut r = reply(503, "breaker open");
            r.extensions_mut().insert(NotForwarded);
            r
        }),
    ];
    for (name, resp) in cases {
        let (hits, second) = twice(settings, resp).await;
        assert_eq!(hits, 2, "{name} must release the key");
        assert!(!second.replayed());
    }
}

#[tokio::test(start_paused = true)]
async fn ambiguous_answers_are_stored_unless_upstream_dedupes() {
    let dedupes = || {
        let mut s = settings();
        s.upstream_dedupes_keys = true;
        s
    };
    let cases: [MakeResponse; 4] = [
        || reply(500, "boom"),
        || reply(502, "bad gateway"),
        || reply(504, "timeout"),
        || reply(503, "no retry-after"),
    ];
    for resp in cases {
        let (hits, second) = twice(settings, resp).await;
        assert_eq!(
            hits, 1,
            "{} from a non-deduping upstream is stored",
            second.status
        );
        assert!(second.replayed());
        let (hits, second) = twice(dedupes, resp).await;
        assert_eq!(
            hits, 2,
            "{} from a deduping upstream releases",
            second.status
        );
    }
}

#[tokio::test(start_paused = true)]
async fn too_large_response_is_streamed_and_never_reexecuted() {
    let up = Upstream::new(Duration::ZERO, |_| reply(200, &"x".repeat(100)));
    let mut s = settings();
    s.max_stored_response_bytes = 10;
    let svc = stack(&up, s);
    let first = send(&svc, post("k-big", "{}")).await;
    assert_eq!(
        first.body.len(),
        100,
        "the client still gets the whole response"
    );
    let second = send(&svc, post("k-big", "{}")).await;
    assert_eq!(second.status, 409);
    assert_eq!(second.problem_type(), "idempotency-response-not-stored");
    assert!(second.body.contains("status 200"));
    assert_eq!(up.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn inner_error_is_ambiguous_and_stored_as_outcome_unknown() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let failing = tower::service_fn(move |_req: Request<Body>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Err::<Response<Body>, std::io::Error>(std::io::ErrorKind::ConnectionReset.into()) }
    });
    let layer = IdempotencyLayer::new(memory_store(), Arc::new(|_| Some(settings())));
    let svc = layer.layer(failing);
    let err = tower::ServiceExt::oneshot(svc.clone(), post("k-err", "{}")).await;
    assert!(err.is_err(), "the inner error is passed through unchanged");
    let second = send(&svc, post("k-err", "{}")).await;
    assert_eq!(second.status, 502);
    assert!(second.replayed());
    assert_eq!(second.problem_type(), "idempotency-outcome-unknown");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}
