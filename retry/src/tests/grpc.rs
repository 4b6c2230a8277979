//! gRPC calls: statuses behind HTTP 200, in headers (Trailers-Only) or trailers, the
//! ladder applied to them, pushback, and `grpc-timeout` as the deadline.

use super::*;

const GRPC: (&str, &str) = ("content-type", "application/grpc");

/// A Trailers-Only answer with `grpc-status: code` (and more headers).
fn grpc_status(code: u16, more: &[(&'static str, &str)]) -> Step {
    let mut headers = vec![
        (GRPC.0, GRPC.1.to_owned()),
        ("grpc-status", code.to_string()),
    ];
    headers.extend(more.iter().map(|(n, v)| (*n, (*v).to_owned())));
    Step::Status(200, headers, 0)
}

/// A call on a route declared idempotent (gRPC calls are all POSTs).
fn call(f: &Fixture, timeout: Option<&'static str>) -> Request<Body> {
    let mut req = f.request(Method::POST, "message");
    req.headers_mut()
        .insert("content-type", HeaderValue::from_static(GRPC.1));
    if let Some(t) = timeout {
        req.headers_mut()
            .insert("grpc-timeout", HeaderValue::from_static(t));
    }
    req
}

fn idempotent_route(script: impl IntoIterator<Item = Step>) -> Fixture {
    let mut f = fixture(script);
    f.target.idempotent_route = true;
    f
}

fn grpc_status_of(res: &Res) -> String {
    match res {
        Ok(rsp) => header_of(rsp.headers(), "grpc-status"),
        Err(e) => panic!("expected a response, got {e:?}"),
    }
}

fn header_of(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn unavailable_and_resource_exhausted_are_retried_on_an_idempotent_route() {
    let _trace = trace_init();
    let f = idempotent_route([
        grpc_status(14, &[]),
        grpc_status(8, &[]),
        grpc_status(0, &[]),
    ]);
    let res = f.send(call(&f, None)).await;
    assert_eq!(grpc_status_of(&res), "0");
    assert_eq!(f.upstream.hits(), 3);
    // Every attempt tells the backend how long the gateway will wait for it.
    for seen in f.upstream.seen() {
        let sent = header(&seen, "grpc-timeout");
        assert!(sent.ends_with('m'), "{sent}");
    }
}

#[tokio::test(start_paused = true)]
async fn final_codes_and_unsafe_calls_get_one_attempt() {
    let _trace = trace_init();
    for code in [3, 5, 7, 12, 16, 0, 2] {
        let f = idempotent_route([grpc_status(code, &[]), grpc_status(0, &[])]);
        let res = f.send(call(&f, None)).await;
        assert_eq!(grpc_status_of(&res), code.to_string());
        assert_eq!(f.upstream.hits(), 1, "grpc-status {code}");
    }
    // A plain POST call without a key: DEADLINE_EXCEEDED may have been acted on.
    let f = fixture([grpc_status(4, &[]), grpc_status(0, &[])]);
    let res = f.send(call(&f, None)).await;
    assert_eq!(grpc_status_of(&res), "4");
    assert_eq!(f.upstream.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn pushback_sets_the_wait_or_forbids_the_retry() {
    let _trace = trace_init();
    let f = idempotent_route([
        grpc_status(8, &[("grpc-retry-pushback-ms", "4000")]),
        grpc_status(0, &[]),
    ]);
    let res = f.send(call(&f, None)).await;
    assert_eq!(grpc_status_of(&res), "0");
    let seen = f.upstream.seen();
    assert!(seen[1].at - seen[0].at >= Duration::from_secs(4));

    let f = idempotent_route([
        grpc_status(14, &[("grpc-retry-pushback-ms", "-1")]),
        grpc_status(0, &[]),
    ]);
    let res = f.send(call(&f, None)).await;
    assert_eq!(grpc_status_of(&res), "14");
    assert_eq!(
        f.upstream.hits(),
        1,
        "a negative pushback means: do not retry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_status_in_trailers_before_any_message_is_classified_and_kept() {
    let _trace = trace_init();
    let unavailable = || {
        Step::Trailers(
            vec![(GRPC.0, GRPC.1.to_owned())],
            vec![("grpc-status", "14".to_owned())],
        )
    };
    let f = idempotent_route([unavailable(), grpc_status(0, &[])]);
    assert_eq!(grpc_status_of(&f.send(call(&f, None)).await), "0");
    assert_eq!(f.upstream.hits(), 2);

    // Given up on: the client receives the trailers exactly as the backend sent them.
    let f = idempotent_route([]);
    f.upstream.set_fallback(unavailable());
    let rsp = f.send(call(&f, None)).await.expect("response");
    assert_eq!(f.upstream.hits(), 4);
    let collected = rsp.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers["grpc-status"], "14");
}

#[tokio::test(start_paused = true)]
async fn grpc_timeout_is_the_deadline_and_is_rewritten_per_attempt() {
    let _trace = trace_init();
    let f = idempotent_route([Step::Stall]);
    let started = Instant::now();
    let res = f.send(call(&f, Some("1500m"))).await;
    assert!(res.is_err(), "the deadline ends the call");
    assert!(Instant::now() - started <= Duration::from_millis(1500));
    let seen = f.upstream.seen();
    assert_eq!(header(&seen[0], "grpc-timeout"), "1500m");
    assert_eq!(
        header(&seen[0], "x-request-deadline"),
        "2026-03-06T12:00:01.500Z"
    );

    // A malformed grpc-timeout leaves the gateway's own deadline.
    let f = idempotent_route([]);
    let res = f.send(call(&f, Some("soon"))).await;
    assert_eq!(grpc_status_of(&res), "");
    let seen = f.upstream.seen();
    assert_eq!(
        header(&seen[0], "x-request-deadline"),
        "2026-03-06T12:00:30.000Z"
    );
}
