//! Which outcomes are retried for which requests (the safety ladder, end to end).

use super::*;

#[tokio::test(start_paused = true)]
async fn retries_503_503_then_200_with_same_request_id() {
    let _trace = trace_init();
    let f = fixture([st(503), st(503), st(200)]);
    let res = f.send(f.request(Method::GET, Body::empty())).await;
    assert_eq!(status(&res), 200);
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 3);
    for (i, s) in seen.iter().enumerate() {
        let n = i as u32 + 1;
        assert_eq!(header(s, "x-request-id"), "req-1");
        assert_eq!(header(s, "x-retry-attempt"), n.to_string());
        assert_eq!(header(s, "x-request-deadline"), "2026-03-06T12:00:30.000Z");
        assert_eq!(s.info.map(|i| i.number), Some(n));
    }
}

#[tokio::test(start_paused = true)]
async fn non_retryable_client_errors_get_one_attempt() {
    let _trace = trace_init();
    for code in [400, 401, 403, 404, 409, 422] {
        for method in [Method::GET, Method::PUT, Method::DELETE] {
            let f = fixture([st(code), st(200)]);
            let res = f.send(f.request(method.clone(), Body::empty())).await;
            assert_eq!(status(&res), code);
            assert_eq!(f.upstream.hits(), 1, "{method} {code}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn gives_up_after_max_retries_with_the_last_response() {
    let _trace = trace_init();
    let f = fixture([]);
    f.upstream.set_fallback(st(502));
    let res = f.send(f.request(Method::GET, Body::empty())).await;
    assert_eq!(status(&res), 502);
    assert_eq!(f.upstream.hits(), 4, "1 + max_retries (3)");
}

#[tokio::test(start_paused = true)]
async fn max_retries_zero_means_one_attempt() {
    let _trace = trace_init();
    let params = RetryParams {
        max_retries: 0,
        ..RetryParams::default()
    };
    let f = fixture_with([st(503), st(200)], params, dependency(1, false));
    assert_eq!(status(&f.send(f.request(Method::GET, "x")).await), 503);
    assert_eq!(f.upstream.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn post_without_lock_is_not_retried_on_503() {
    let _trace = trace_init();
    for method in [Method::POST, Method::PATCH] {
        let f = fixture([st(503), st(201)]);
        let res = f.send(f.request(method, "{}")).await;
        assert_eq!(status(&res), 503);
        assert_eq!(f.upstream.hits(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn post_with_lock_is_retried_on_503_with_the_same_key() {
    let _trace = trace_init();
    let f = fixture([st(503), st(429), st(201)]);
    let res = f.send(f.locked(Method::POST, r#"{"amount":100}"#)).await;
    assert_eq!(status(&res), 201);
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.method, Method::POST);
        assert_eq!(header(s, "idempotency-key"), "key-1");
        assert_eq!(s.body, r#"{"amount":100}"#, "body replayed intact");
    }
}

#[tokio::test(start_paused = true)]
async fn post_with_lock_and_500_depends_on_upstream_dedupe() {
    let _trace = trace_init();
    for code in [500, 502, 504] {
        let f = fixture_with(
            [st(code), st(201)],
            RetryParams::default(),
            dependency(1, false),
        );
        assert_eq!(status(&f.send(f.locked(Method::POST, "{}")).await), code);
        assert_eq!(f.upstream.hits(), 1, "non-deduping upstream, {code}");

        let f = fixture_with(
            [st(code), st(201)],
            RetryParams::default(),
            dependency(1, true),
        );
        assert_eq!(status(&f.send(f.locked(Method::PATCH, "{}")).await), 201);
        assert_eq!(f.upstream.hits(), 2, "deduping upstream, {code}");
    }
}

#[tokio::test(start_paused = true)]
async fn idempotent_route_retries_post_on_500() {
    let _trace = trace_init();
    let mut f = fixture([st(500), st(200)]);
    f.target.idempotent_route = true;
    assert_eq!(status(&f.send(f.request(Method::POST, "{}")).await), 200);
    assert_eq!(f.upstream.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn connect_refused_is_retried_on_another_endpoint_even_for_a_bare_post() {
    let _trace = trace_init();
    let f = fixture_with(
        [
            Step::Fail(FailureKind::ConnectRefused, Some(0)),
            Step::Status(201, vec![], 1),
        ],
        RetryParams::default(),
        dependency(2, false),
    );
    let res = f.send(f.request(Method::POST, "payload")).await;
    assert_eq!(status(&res), 201);
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 2);
    let numbered = |info: Option<AttemptInfo>| info.map(|i| (i.number, i.avoid_endpoint));
    assert_eq!(numbered(seen[0].info), Some((1, None)));
    assert_eq!(numbered(seen[1].info), Some((2, Some(0))));
    assert_eq!(seen[0].info.map(|i| i.backoff), Some(Duration::ZERO));
    assert_eq!(seen[1].body, "payload");
}

#[tokio::test(start_paused = true)]
async fn a_failed_status_names_the_endpoint_to_avoid() {
    let _trace = trace_init();
    let f = fixture_with(
        [Step::Status(503, vec![], 1), st(200)],
        RetryParams::default(),
        dependency(3, false),
    );
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert_eq!(
        f.upstream.seen()[1].info.and_then(|i| i.avoid_endpoint),
        Some(1)
    );

    // With a single endpoint there is nothing to avoid.
    let f = fixture([Step::Fail(FailureKind::ConnectRefused, Some(0)), st(200)]);
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert_eq!(
        f.upstream.seen()[1].info.and_then(|i| i.avoid_endpoint),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn reset_after_sent_is_not_retried_for_a_bare_post() {
    let _trace = trace_init();
    let f = fixture([Step::Fail(FailureKind::ResetAfterSent, None), st(201)]);
    let err = f
        .send(f.request(Method::POST, "{}"))
        .await
        .expect_err("error");
    assert!(matches!(err, RetryError::Upstream(ref e) if e.kind == FailureKind::ResetAfterSent));
    assert!(!err.is_provably_unprocessed());
    assert_eq!(f.upstream.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn dns_failures_get_at_most_two_attempts() {
    let _trace = trace_init();
    let f = fixture([
        Step::Fail(FailureKind::Dns, None),
        Step::Fail(FailureKind::Dns, None),
        st(200),
    ]);
    let err = f
        .send(f.request(Method::GET, Body::empty()))
        .await
        .expect_err("dns");
    assert!(err.is_provably_unprocessed());
    assert!(matches!(err, RetryError::Upstream(ref e) if e.kind == FailureKind::Dns));
    assert_eq!(f.upstream.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn tls_certificate_errors_are_never_retried() {
    let _trace = trace_init();
    let f = fixture([Step::Fail(FailureKind::TlsCertificate, None), st(200)]);
    let err = f
        .send(f.request(Method::GET, Body::empty()))
        .await
        .expect_err("tls");
    // Never retried, yet nothing was sent: the idempotency layer may release the key.
    assert!(err.is_provably_unprocessed());
    assert_eq!(f.upstream.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn request_without_target_is_forwarded_once_untouched() {
    let _trace = trace_init();
    let f = fixture([st(503), st(200)]);
    let req = Request::builder()
        .uri("http://orders.internal/")
        .body(Body::from("abc"))
        .expect("request");
    assert_eq!(status(&f.send(req).await), 503);
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].info.is_none());
    assert!(seen[0].headers.get("x-retry-attempt").is_none());
    assert!(seen[0].headers.get("x-request-deadline").is_none());
    assert_eq!(seen[0].body, "abc");
}

#[tokio::test(start_paused = true)]
async fn body_over_the_replay_limit_is_sent_once_intact() {
    let _trace = trace_init();
    let params = RetryParams {
        body_replay_limit: 16,
        ..RetryParams::default()
    };
    let big: Vec<u8> = (0..100u8).collect();

    // Chunked (no Content-Length): the prefix read while looking is put back.
    let f = fixture_with([st(503), st(201)], params.clone(), dependency(1, false));
    let chunks: Vec<Result<Bytes, std::io::Error>> = big
        .chunks(10)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    assert_eq!(status(&f.send(f.locked(Method::POST, body)).await), 503);
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 1, "not replayable, so not retried");
    assert_eq!(seen[0].body, big);

    // Declared Content-Length over the limit: not even read before sending.
    let f = fixture_with([st(503), st(201)], params, dependency(1, false));
    let mut req = f.request(Method::PUT, big.clone());
    req.headers_mut()
        .insert("content-length", HeaderValue::from_static("100"));
    assert_eq!(status(&f.send(req).await), 503);
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, big);
}

#[tokio::test(start_paused = true)]
async fn body_within_the_limit_is_replayed_on_every_attempt() {
    let _trace = trace_init();
    let f = fixture([st(503), st(502), st(200)]);
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        vec![Ok(Bytes::from_static(b"ab")), Ok(Bytes::from_static(b"cd"))];
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    assert_eq!(status(&f.send(f.request(Method::PUT, body)).await), 200);
    let bodies: Vec<Bytes> = f.upstream.seen().into_iter().map(|s| s.body).collect();
    assert_eq!(bodies, ["abcd", "abcd", "abcd"]);
}

#[tokio::test(start_paused = true)]
async fn unreadable_body_is_an_error_and_nothing_is_sent() {
    let _trace = trace_init();
    let f = fixture([st(200)]);
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"ab")),
        Err(std::io::Error::other("client went away")),
    ];
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    let err = f
        .send(f.request(Method::PUT, body))
        .await
        .expect_err("body");
    assert!(matches!(err, RetryError::RequestBody(_)));
    assert!(err.is_provably_unprocessed());
    assert_eq!(f.upstream.hits(), 0);
}
