//! Hedged first attempts: a second copy after `after`, the first answer wins, the loser is
//! cancelled, the copy is paid for by the retry budget.

use super::*;

fn hedged(after: HedgeAfter, script: impl IntoIterator<Item = Step>) -> Fixture {
    let params = RetryParams {
        hedge_after: Some(after),
        ..RetryParams::default()
    };
    fixture_with(script, params, dependency(2, false))
}

const AFTER: HedgeAfter = HedgeAfter::Fixed(Duration::from_millis(100));

#[tokio::test(start_paused = true)]
async fn a_slow_first_attempt_is_overtaken_by_its_copy() {
    let _trace = trace_init();
    let f = hedged(AFTER, [Step::Stall, st(200)]);
    let started = Instant::now();
    let res = f.send(f.request(Method::GET, Body::empty())).await;
    assert_eq!(status(&res), 200);
    let seen = f.upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(header(&seen[1], "x-retry-attempt"), "2");
    assert_eq!(seen[1].at - started, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_fast_answer_sends_no_copy_and_unsafe_requests_are_never_hedged() {
    let _trace = trace_init();
    let f = hedged(AFTER, [st(200)]);
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert_eq!(f.upstream.hits(), 1);

    let f = hedged(AFTER, [Step::Stall, st(200)]);
    let slow_post = tokio::time::timeout(
        Duration::from_secs(1),
        f.send(f.request(Method::POST, "pay")),
    )
    .await;
    assert!(slow_post.is_err(), "still waiting on its only attempt");
    assert_eq!(f.upstream.hits(), 1, "a POST is never sent twice at once");
}

#[tokio::test(start_paused = true)]
async fn a_retryable_first_answer_waits_for_the_copy() {
    let _trace = trace_init();
    // The first attempt answers 503 at 150 ms, after the copy (sent at 100 ms) but before
    // the copy's 200 (at 200 ms): the 200 wins, and no third attempt is made.
    let f = hedged(
        AFTER,
        [
            Step::After(Duration::from_millis(150), 503),
            Step::After(Duration::from_millis(100), 200),
        ],
    );
    let res = f.send(f.request(Method::GET, Body::empty())).await;
    assert_eq!(status(&res), 200);
    assert_eq!(f.upstream.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn no_copy_without_retry_budget() {
    let _trace = trace_init();
    let params = RetryParams {
        hedge_after: Some(AFTER),
        ..RetryParams::default()
    };
    let budget = BudgetConfig::try_new(0, Duration::from_secs(30), 0).expect("budget");
    let dep = Arc::new(UpstreamState::new(
        "orders",
        2,
        false,
        budget,
        BreakerConfig::default(),
    ));
    let f = fixture_with(
        [Step::After(Duration::from_millis(300), 200)],
        params,
        dep.clone(),
    );
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert_eq!(
        f.upstream.hits(),
        1,
        "the budget pays for hedges as for retries"
    );
}

#[tokio::test(start_paused = true)]
async fn a_percentile_hedges_only_once_latency_is_measured() {
    let _trace = trace_init();
    let f = hedged(HedgeAfter::Quantile(0.95), [Step::Stall]);
    let unmeasured = tokio::time::timeout(
        Duration::from_secs(1),
        f.send(f.request(Method::GET, Body::empty())),
    )
    .await;
    assert!(unmeasured.is_err(), "no p95 yet: no hedge");
    assert_eq!(f.upstream.hits(), 1);
    // 200 answers at 5 ms: p95 ≈ 5 ms, so a stalled attempt gets its copy then.
    for _ in 0..200 {
        f.upstream.push(Step::After(Duration::from_millis(5), 200));
        assert_eq!(
            status(&f.send(f.request(Method::GET, Body::empty())).await),
            200
        );
    }
    f.upstream.push(Step::Stall);
    f.upstream.push(st(200));
    let started = Instant::now();
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert!(Instant::now() - started < Duration::from_millis(10));
    assert_eq!(f.upstream.hits(), 203);
}

#[tokio::test(start_paused = true)]
async fn a_copy_needs_an_adaptive_token() {
    let _trace = trace_init();
    let params = RetryParams {
        hedge_after: Some(AFTER),
        ..RetryParams::default()
    };
    let dep = Arc::new(
        UpstreamState::new(
            "orders",
            2,
            false,
            BudgetConfig::default(),
            BreakerConfig::default(),
        )
        .with_adaptive(AdaptiveConfig::default()),
    );
    // 5 req/s (a token every 200 ms): the request waits 200 ms for its token and goes out;
    // 100 ms later, when the copy is due, the next token is 100 ms away: no copy.
    let throttle = dep.adaptive().expect("adaptive");
    throttle.set_fleet_share(Some(5.0), Duration::from_secs(60));
    let f = fixture_with(
        [Step::After(Duration::from_millis(300), 200)],
        params,
        dep.clone(),
    );
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert_eq!(
        f.upstream.hits(),
        1,
        "over the adaptive rate, a hedge is not sent"
    );

    // At 10 req/s (a bucket one token deep) the request takes the token there is, and the
    // copy the one that comes 100 ms later: it goes out, and the bucket is empty after it.
    tokio::time::advance(Duration::from_secs(1)).await;
    f.upstream.push(Step::Stall);
    f.upstream.push(st(200));
    throttle.set_fleet_share(Some(10.0), Duration::from_secs(60));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        200
    );
    assert_eq!(f.upstream.hits(), 3, "the copy was sent");
    let token = throttle.admit(true, Duration::ZERO);
    assert!(token.is_err(), "the copy took a token: {token:?}");
}
