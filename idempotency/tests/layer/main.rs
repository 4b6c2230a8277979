//! The layer as a service, without sockets: a counting inner service behind
//! `IdempotencyLayer` over a `MemoryStore`, on paused time.
//!
//! `support` holds the harness; `outcomes` covers the outcome table; this file the request
//! path (keys, concurrency, replay, waiting, failures).

// Test code: a failed unwrap is a failed test (clippy only exempts `#[test]` fns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod outcomes;
mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use portcullis_idempotency::{
    IdempotencyLayer, IdempotencyLock, IdempotencySettings, OnInFlight, StoreError,
};
use support::*;
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn fifty_concurrent_identical_requests_execute_once() {
    let _trace = trace_init();
    let up = Upstream::new(Duration::from_millis(100), |_| reply(201, "order-1"));
    let svc = stack(&up, settings());
    let tasks: Vec<_> = (0..50u64)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                // Spread arrivals over 250 ms: some while in flight, some after completion.
                tokio::time::sleep(Duration::from_millis(i * 5)).await;
                collect(svc.oneshot(post("k-50", "{}")).await.unwrap()).await
            })
        })
        .collect();
    let (mut executed, mut conflicts, mut replays) = (0, 0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match (r.status, r.replayed()) {
            (StatusCode::CREATED, false) => executed += 1,
            (StatusCode::CREATED, true) => {
                assert_eq!(r.body, "order-1");
                assert_eq!(r.headers["x-upstream"], "1");
                replays += 1;
            }
            (StatusCode::CONFLICT, _) => {
                assert_eq!(r.headers["retry-after"], "1");
                assert_eq!(r.problem_type(), "idempotency-request-in-flight");
                conflicts += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(up.hits(), 1, "the upstream must execute exactly once");
    assert_eq!(executed, 1);
    assert!(
        conflicts > 0 && replays > 0,
        "{conflicts} conflicts, {replays} replays"
    );
}

#[tokio::test(start_paused = true)]
async fn replay_is_byte_for_byte_with_marker() {
    let _trace = trace_init();
    let up = Upstream::new(Duration::ZERO, |_| {
        let mut r = reply(201, "\u{0}binary\u{ff}");
        r.headers_mut()
            .insert("connection", "close".parse().unwrap());
        r.headers_mut().append("set-cookie", "a=1".parse().unwrap());
        r.headers_mut().append("set-cookie", "b=2".parse().unwrap());
        r
    });
    let svc = stack(&up, settings());
    let first = send(&svc, post("k-replay", "{\"amount\":100}")).await;
    let second = send(&svc, post("k-replay", "{\"amount\":100}")).await;
    assert_eq!(up.hits(), 1);
    assert!(!first.replayed());
    assert!(second.replayed());
    assert_eq!(second.status, first.status);
    assert_eq!(second.body, first.body);
    assert_eq!(second.headers.get_all("set-cookie").iter().count(), 2);
    assert!(
        second.headers.get("connection").is_none(),
        "hop-by-hop headers are not replayed"
    );
}

#[tokio::test(start_paused = true)]
async fn same_key_other_body_is_422() {
    let up = Upstream::new(Duration::ZERO, |_| reply(201, "ok"));
    let svc = stack(&up, settings());
    send(&svc, post("k-mm", "{\"amount\":100}")).await;
    let r = send(&svc, post("k-mm", "{\"amount\":999}")).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.problem_type(), "idempotency-key-reused");
    assert_eq!(up.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn other_tenant_executes_separately() {
    let up = Upstream::new(Duration::ZERO, |_| reply(201, "ok"));
    let store = memory_store();
    let per_tenant = IdempotencyLayer::new(
        store,
        Arc::new(|parts: &http::request::Parts| {
            let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
            Some(IdempotencySettings::new(tenant, "/orders"))
        }),
    );
    let svc = per_tenant.layer(up.service());
    for tenant in ["acme", "globex", "acme"] {
        let mut req = post("shared", "{}");
        req.headers_mut()
            .insert("x-tenant", tenant.parse().unwrap());
        send(&svc, req).await;
    }
    assert_eq!(up.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn key_validation() {
    let up = Upstream::new(Duration::ZERO, |_| reply(201, "ok"));
    let svc = stack(&up, settings());
    let r = send(&svc, post(&"a".repeat(65), "{}")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert_eq!(r.problem_type(), "idempotency-key-invalid");
    assert_eq!(send(&svc, post("has space", "{}")).await.status, 400);
    assert_eq!(send(&svc, post("\"unterminated", "{}")).await.status, 400);
    assert_eq!(up.hits(), 0);
    assert_eq!(send(&svc, post(&"a".repeat(64), "{}")).await.status, 201);
    assert_eq!(send(&svc, post("\"quoted-key\"", "{}")).await.status, 201);
    assert_eq!(up.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn require_key_and_pass_through() {
    let up = Upstream::new(Duration::ZERO, |_| reply(201, "ok"));
    let mut s = settings();
    s.require_key = true;
    let strict = stack(&up, s);
    let r = send(&strict, unkeyed_post("{}")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.problem_type(), "idempotency-key-missing");
    assert_eq!(up.hits(), 0);

    // Optional key: unkeyed requests flow, every time.
    let lax = stack(&up, settings());
    send(&lax, unkeyed_post("{}")).await;
    send(&lax, unkeyed_post("{}")).await;
    assert_eq!(up.hits(), 2);
    // Methods outside the set pass through even with a key.
    let mut get = post("k-get", "");
    *get.method_mut() = http::Method::GET;
    send(&lax, get).await;
    let mut get = post("k-get", "");
    *get.method_mut() = http::Method::GET;
    send(&lax, get).await;
    assert_eq!(up.hits(), 4);
}

#[tokio::test(start_paused = true)]
async fn forwards_key_header_and_lock_marker() {
    let up = Upstream::new(Duration::ZERO, |req| {
        let lock = req.extensions().get::<IdempotencyLock>().cloned();
        let header = req.headers().get("idempotency-key").cloned();
        match (lock, header) {
            (Some(l), Some(h)) if l.key.as_str() == "k-marker" && h == "\"k-marker\"" => {
                reply(201, "marked")
            }
            _ => reply(500, "no marker"),
        }
    });
    let svc = stack(&up, settings());
    let r = send(&svc, post("\"k-marker\"", "{}")).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::CREATED, "marked"));
}

#[tokio::test(start_paused = true)]
async fn wait_mode_replays_the_first_result() {
    let up = Upstream::new(Duration::from_millis(300), |_| reply(201, "slow"));
    let mut s = settings();
    s.on_in_flight = OnInFlight::Wait(Duration::from_secs(5));
    let svc = stack(&up, s);
    let first = tokio::spawn(svc.clone().oneshot(post("k-wait", "{}")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = send(&svc, post("k-wait", "{}")).await;
    assert_eq!(second.status, 201);
    assert!(second.replayed());
    assert_eq!(second.body, "slow");
    assert_eq!(first.await.unwrap().unwrap().status(), 201);
    assert_eq!(up.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn wait_mode_gives_up_with_409_after_the_bound() {
    let up = Upstream::new(Duration::from_secs(20), |_| reply(201, "very slow"));
    let mut s = settings();
    s.on_in_flight = OnInFlight::Wait(Duration::from_secs(2));
    let svc = stack(&up, s);
    let _first = tokio::spawn(svc.clone().oneshot(post("k-wait2", "{}")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = tokio::time::Instant::now();
    let second = send(&svc, post("k-wait2", "{}")).await;
    assert_eq!(second.status, 409);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn oversized_request_body_is_413() {
    let up = Upstream::new(Duration::ZERO, |_| reply(201, "ok"));
    let mut s = settings();
    s.max_body_bytes = 8;
    let svc = stack(&up, s);
    let r = send(&svc, post("k-413", "0123456789")).await;
    assert_eq!(r.status, 413);
    assert_eq!(up.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn store_unavailable_is_503_and_never_forwarded() {
    let up = Upstream::new(Duration::ZERO, |_| reply(201, "ok"));
    let failing = FailingStore(|| StoreError::Timeout(Duration::from_millis(250)));
    let layer = IdempotencyLayer::new(Arc::new(failing), Arc::new(|_| Some(settings())));
    let svc = layer.layer(up.service());
    let r = send(&svc, post("k-503", "{}")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.problem_type(), "idempotency-store-unavailable");
    assert_eq!(up.hits(), 0, "never forwarded unprotected");
    // Unkeyed requests still flow.
    assert_eq!(send(&svc, unkeyed_post("{}")).await.status, 201);
}

#[tokio::test(start_paused = true)]
async fn client_disconnect_does_not_cancel_the_request() {
    let up = Upstream::new(Duration::from_millis(200), |_| reply(201, "done"));
    let svc = stack(&up, settings());
    // The client gives up after 50 ms: its response future is dropped mid-flight.
    let gone = tokio::time::timeout(
        Duration::from_millis(50),
        svc.clone().oneshot(post("k-dc", "{}")),
    );
    assert!(gone.await.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = send(&svc, post("k-dc", "{}")).await;
    assert!(retry.replayed(), "the first execution's result is replayed");
    assert_eq!(retry.body, "done");
    assert_eq!(up.hits.load(Ordering::SeqCst), 1);
}
