//! Adaptive throttling through the layer: a request over the learned rate is answered with
//! `RetryError::Throttled` and never reaches the upstream; a retry over it is not sent.

use super::*;

/// An upstream whose throttle refuses at once (`max_wait = 0`) what is over its rate.
fn adaptive_dependency() -> Arc<UpstreamState> {
    let config = AdaptiveConfig::default()
        .with_max_wait(Duration::ZERO)
        .expect("valid");
    adaptive_dependency_with(config)
}

fn adaptive_dependency_with(config: AdaptiveConfig) -> Arc<UpstreamState> {
    Arc::new(
        UpstreamState::new(
            "orders",
            1,
            false,
            BudgetConfig::default(),
            BreakerConfig::default(),
        )
        .with_adaptive(config),
    )
}

fn no_retries() -> RetryParams {
    RetryParams {
        max_retries: 0,
        ..RetryParams::default()
    }
}

#[tokio::test(start_paused = true)]
async fn over_the_learned_rate_requests_are_refused_at_the_edge() {
    let _trace = trace_init();
    let f = fixture_with([st(429)], no_retries(), adaptive_dependency());
    // The upstream's 429 reaches the client and teaches the throttle a rate.
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        429
    );
    assert_eq!(f.upstream.hits(), 1);
    let rate = f.target.upstream.adaptive().and_then(|t| t.rate());
    assert!(rate.is_some_and(|r| r > 0.0), "{rate:?}");

    // Right after it, the bucket is empty: refused, nothing sent, told when to come back.
    match f.send(f.request(Method::GET, Body::empty())).await {
        Err(RetryError::Throttled { retry_after, rate }) => {
            assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(1));
            assert!(rate > 0.0);
            assert!(RetryError::<TestFailure>::Throttled { retry_after, rate }
                .is_provably_unprocessed());
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(f.upstream.hits(), 1, "a refused request is never sent");

    // A token later, the next request goes through (and succeeds: the fallback is 200).
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert_eq!(f.upstream.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_over_the_learned_rate_is_not_sent() {
    let _trace = trace_init();
    let f = fixture_with([], RetryParams::default(), adaptive_dependency());
    f.upstream.set_fallback(st_with(429, "retry-after", "0"));
    let rsp = f
        .send(f.request(Method::GET, Body::empty()))
        .await
        .expect("the upstream's answer");
    assert_eq!(rsp.status(), 429);
    assert_eq!(
        rsp.headers()["x-retry-exhausted"],
        "attempts=1, reason=adaptive_throttled"
    );
    assert_eq!(f.upstream.hits(), 1);
}

#[tokio::test(start_paused = true)]
async fn without_adaptive_nothing_is_refused() {
    let _trace = trace_init();
    let f = fixture_with([], no_retries(), dependency(1, false));
    f.upstream.set_fallback(st(429));
    for _ in 0..50 {
        assert_eq!(
            status(&f.send(f.request(Method::GET, Body::empty())).await),
            429
        );
    }
    assert_eq!(f.upstream.hits(), 50);
    assert!(f.target.upstream.adaptive().is_none());
}

#[tokio::test(start_paused = true)]
async fn connect_failures_do_not_teach_a_rate() {
    let _trace = trace_init();
    let f = fixture_with([], no_retries(), adaptive_dependency());
    f.upstream
        .set_fallback(Step::Fail(FailureKind::ConnectRefused, Some(0)));
    for _ in 0..20 {
        let res = f.send(f.request(Method::GET, Body::empty())).await;
        assert!(matches!(res, Err(RetryError::Upstream(_))), "{res:?}");
    }
    assert_eq!(f.upstream.hits(), 20);
    assert_eq!(f.target.upstream.adaptive().and_then(|t| t.rate()), None);
}

#[tokio::test(start_paused = true)]
async fn over_the_rate_a_request_waits_for_its_token_within_max_wait() {
    let _trace = trace_init();
    let f = fixture_with(
        [st(429)],
        no_retries(),
        adaptive_dependency_with(AdaptiveConfig::default()),
    );
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        429
    );
    let rate = f
        .target
        .upstream
        .adaptive()
        .and_then(|t| t.rate())
        .expect("learned");
    // The bucket is empty: the next request waits for its token (well within the default
    // max_wait of 1 s), then goes out, instead of being sent away for a whole second.
    let arrived = Instant::now();
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 2);
    let waited = seen[1].at - arrived;
    let token = Duration::from_secs_f64(1.0 / rate);
    assert!(
        waited > Duration::ZERO && waited <= token,
        "waited {waited:?}, a token every {token:?}"
    );
}
