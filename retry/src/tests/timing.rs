//! Deadlines, per-attempt timeouts and Retry-After, on paused time.

use super::*;

fn fast_backoff() -> RetryParams {
    RetryParams {
        base: Duration::from_millis(10),
        cap: Duration::from_millis(10),
        ..RetryParams::default()
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_is_a_floor_on_the_next_wait() {
    let _trace = trace_init();
    let f = fixture_with(
        [st_with(503, "retry-after", "2"), st(200)],
        fast_backoff(),
        dependency(1, false),
    );
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    let seen = f.upstream.seen();
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_secs(2), "{gap:?}");
    assert!(
        gap <= Duration::from_millis(2_010),
        "{gap:?}: the floor, not more"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_is_a_floor_too() {
    let _trace = trace_init();
    let f = fixture_with([], fast_backoff(), dependency(1, false));
    let date = httpdate::fmt_http_date(f.clock.now() + Duration::from_secs(3));
    f.upstream.push(st_with(429, "retry-after", date));
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    let seen = f.upstream.seen();
    assert!(seen[1].at - seen[0].at >= Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn retry_after_beyond_the_deadline_returns_that_response_at_once() {
    let _trace = trace_init();
    let f = fixture([st_with(503, "retry-after", "120"), st(200)]);
    let start = Instant::now();
    let res = f
        .send(f.request(Method::GET, Body::empty()))
        .await
        .expect("response");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.headers()["retry-after"],
        "120",
        "the upstream's own answer"
    );
    assert_eq!(Instant::now() - start, Duration::ZERO, "no sleep");
    assert_eq!(f.upstream.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn invalid_retry_after_is_ignored() {
    let _trace = trace_init();
    let f = fixture_with(
        [st_with(503, "retry-after", "soon"), st(200)],
        fast_backoff(),
        dependency(1, false),
    );
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    let seen = f.upstream.seen();
    assert!(seen[1].at - seen[0].at <= Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn earlier_incoming_deadline_wins_and_is_forwarded() {
    let _trace = trace_init();
    let cases = [
        ("2026-03-06T12:00:05.250Z", "2026-03-06T12:00:05.250Z"),
        ("2026-03-06T13:00:05+01:00", "2026-03-06T12:00:05.000Z"),
        ("2026-03-06T12:01:00Z", "2026-03-06T12:00:30.000Z"),
        ("not a date", "2026-03-06T12:00:30.000Z"),
    ];
    for (incoming, forwarded) in cases {
        let f = fixture([st(200)]);
        let mut req = f.request(Method::GET, Body::empty());
        req.headers_mut()
            .insert("x-request-deadline", HeaderValue::from_static(incoming));
        assert_eq!(status(&f.send(req).await), 200);
        assert_eq!(
            header(&f.upstream.seen()[0], "x-request-deadline"),
            forwarded,
            "{incoming}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn passed_deadline_fails_without_calling_upstream() {
    let _trace = trace_init();
    let f = fixture([st(200)]);
    let mut req = f.request(Method::POST, "{}");
    req.headers_mut().insert(
        "x-request-deadline",
        HeaderValue::from_static("2026-03-06T11:59:59.000Z"),
    );
    let err = f.send(req).await.expect_err("deadline");
    assert!(matches!(err, RetryError::DeadlineExceeded));
    assert!(err.is_provably_unprocessed());
    assert_eq!(f.upstream.hits(), 0);
}

#[tokio::test(start_paused = true)]
async fn short_incoming_deadline_stops_retries() {
    let _trace = trace_init();
    // 1.5 s left: the layer retries while the drawn wait fits, then returns the
    // upstream's 503 instead of sleeping past the deadline.
    let f = fixture([]);
    f.upstream.set_fallback(st(503));
    let mut req = f.request(Method::GET, Body::empty());
    req.headers_mut().insert(
        "x-request-deadline",
        HeaderValue::from_static("2026-03-06T12:00:01.500Z"),
    );
    let start = Instant::now();
    assert_eq!(status(&f.send(req).await), 503);
    assert!(Instant::now() - start < Duration::from_millis(1_500));
    assert!(
        f.upstream.hits() < 4,
        "stopped by the deadline, not by max_retries"
    );
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_is_retried_for_get() {
    let _trace = trace_init();
    let params = RetryParams {
        attempt_timeout: Duration::from_secs(2),
        ..fast_backoff()
    };
    let f = fixture_with([Step::Stall, st(200)], params, dependency(1, false));
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    let seen = f.upstream.seen();
    assert!(seen[1].at - seen[0].at >= Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_on_a_bare_post_is_returned_as_ambiguous() {
    let _trace = trace_init();
    let params = RetryParams {
        attempt_timeout: Duration::from_secs(2),
        ..RetryParams::default()
    };
    let f = fixture_with([Step::Stall, st(200)], params, dependency(1, false));
    let err = f
        .send(f.request(Method::POST, "{}"))
        .await
        .expect_err("timeout");
    assert!(matches!(err, RetryError::AttemptTimeout { after } if after == Duration::from_secs(2)));
    assert!(!err.is_provably_unprocessed());
    assert_eq!(f.upstream.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_every_attempt() {
    let _trace = trace_init();
    let params = RetryParams {
        total: Duration::from_secs(3),
        attempt_timeout: Duration::from_secs(10),
        ..fast_backoff()
    };
    let f = fixture_with([], params, dependency(1, false));
    f.upstream.set_fallback(Step::Stall);
    let start = Instant::now();
    let err = f
        .send(f.request(Method::GET, Body::empty()))
        .await
        .expect_err("timeout");
    assert!(matches!(err, RetryError::AttemptTimeout { after } if after <= Duration::from_secs(3)));
    assert!(Instant::now() - start <= Duration::from_secs(3));
    assert_eq!(
        f.upstream.hits(),
        1,
        "the first attempt used the whole budget"
    );
}

#[tokio::test(start_paused = true)]
async fn backoff_waits_are_full_jitter_within_the_window() {
    let _trace = trace_init();
    let f = fixture([]);
    f.upstream.set_fallback(st(503));
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        503
    );
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 4);
    for (n, pair) in seen.windows(2).enumerate() {
        let gap = pair[1].at - pair[0].at;
        let ceiling = Duration::from_secs(1 << n);
        assert!(gap <= ceiling, "retry {n}: {gap:?} > {ceiling:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_auto_attempt_timeout_is_the_ceiling_until_measured_then_three_p99s_within_bounds() {
    let _trace = trace_init();
    let params = RetryParams {
        max_retries: 0,
        attempt_timeout: Duration::from_secs(4),
        auto_attempt_timeout_floor: Some(Duration::from_millis(20)),
        ..RetryParams::default()
    };
    let f = fixture_with([Step::Stall], params, dependency(1, false));
    let res = f.send(f.request(Method::GET, Body::empty())).await;
    assert!(
        matches!(res, Err(RetryError::AttemptTimeout { after }) if after == Duration::from_secs(4)),
        "nothing measured yet: the ceiling, {res:?}"
    );
    // 200 attempts answered at once: p99 is tiny, so the floor applies.
    for _ in 0..200 {
        assert_eq!(
            status(&f.send(f.request(Method::GET, Body::empty())).await),
            200
        );
    }
    assert!(f.target.upstream.latency().is_some());
    f.upstream.push(Step::Stall);
    let res = f.send(f.request(Method::GET, Body::empty())).await;
    assert!(
        matches!(res, Err(RetryError::AttemptTimeout { after }) if after == Duration::from_millis(20)),
        "learned: {res:?}"
    );
}
