//! Fleet behaviour under sustained failure: the retry budget bounds amplification, the
//! circuit breaker opens and later closes through probes.

use super::*;
use crate::classify::BreakerOutcome;
use crate::upstream::breaker::BreakerState;

#[tokio::test(start_paused = true)]
async fn budget_bounds_amplification_under_total_failure() {
    let _trace = trace_init();
    // Breaker out of the way (it cannot reach min_requests) to measure the budget alone.
    let breaker = BreakerConfig::try_new(
        1.0,
        u32::MAX,
        Duration::from_secs(30),
        Duration::from_secs(10),
        1,
        1,
    )
    .expect("valid");
    let budget = BudgetConfig::default();
    let dep = Arc::new(UpstreamState::new("orders", 1, false, budget, breaker));
    let f = fixture_with([], RetryParams::default(), dep.clone());
    f.upstream.set_fallback(st(503));

    // 10 requests/s for 100 s, every one failing.
    let rate = 10.0;
    let requests = 1000;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..requests {
        let svc = f.svc.clone();
        let req = f.request(Method::GET, Body::empty());
        tasks.spawn(async move { svc.oneshot(req).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while let Some(res) = tasks.join_next().await {
        assert_eq!(status(&res.expect("task")), 503);
    }
    let attempts = f.upstream.hits() as f64;
    let ratio = attempts / f64::from(requests);
    // Retries ≤ percent · requests + floor · window per window. The ring of 10 buckets lets
    // the window shrink to 9/10 of its length, hence the 10/9.
    let floor_share = f64::from(budget.min_retries_per_second()) / rate;
    let bound = 1.0 + (f64::from(budget.percent()) / 100.0 + floor_share) * 10.0 / 9.0;
    println!("attempts/requests = {ratio:.3} (bound {bound:.3})");
    assert!(
        ratio <= bound,
        "attempts/requests = {ratio:.3} > {bound:.3}"
    );
    assert!(ratio >= 1.15, "the budget still allows retries: {ratio:.3}");
    assert!(dep.budget().snapshot().retries > 0);
}

#[tokio::test(start_paused = true)]
async fn breaker_opens_on_sustained_failure_and_closes_after_probes() {
    let _trace = trace_init();
    let params = RetryParams {
        max_retries: 0,
        ..RetryParams::default()
    };
    let f = fixture_with([], params, dependency(1, false));
    let breaker = f.target.upstream.breaker().clone();
    f.upstream.set_fallback(st(503));

    // 20 failed attempts (min_requests) at 100 % failure open it.
    for _ in 0..20 {
        assert_eq!(
            status(&f.send(f.request(Method::GET, Body::empty())).await),
            503
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(breaker.state(), BreakerState::Open);

    // Open: fail fast, nothing reaches the upstream.
    for _ in 0..5 {
        let err = f
            .send(f.request(Method::POST, "{}"))
            .await
            .expect_err("open");
        let RetryError::BreakerOpen { retry_after } = err else {
            panic!("expected BreakerOpen, got {err:?}");
        };
        assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(10));
        assert!(err.is_provably_unprocessed());
    }
    assert_eq!(f.upstream.hits(), 20);

    // The upstream recovers; after open_for the probes get through and close the breaker.
    f.upstream.set_fallback(st(200));
    tokio::time::sleep(Duration::from_secs(10)).await;
    for i in 0..3 {
        assert_eq!(
            status(&f.send(f.request(Method::GET, Body::empty())).await),
            200
        );
        let want = if i < 2 {
            BreakerState::HalfOpen
        } else {
            BreakerState::Closed
        };
        assert_eq!(breaker.state(), want, "after probe {}", i + 1);
    }
    assert_eq!(f.upstream.hits(), 23);
}

#[tokio::test(start_paused = true)]
async fn retries_of_one_request_count_once() {
    let _trace = trace_init();
    // Opens at 4 failed requests, attribution off: only the counting is under test.
    let breaker = BreakerConfig::try_new(
        1.0,
        4,
        Duration::from_secs(30),
        Duration::from_secs(10),
        1,
        1,
    )
    .expect("valid");
    let dep = Arc::new(UpstreamState::new(
        "orders",
        1,
        false,
        BudgetConfig::default(),
        breaker,
    ));
    let f = fixture_with([], RetryParams::default(), dep);
    let breaker = f.target.upstream.breaker().clone();
    f.upstream.set_fallback(st(503));
    assert_eq!(status(&f.send(f.request_from(1, Method::GET)).await), 503);
    assert_eq!(f.upstream.hits(), 4, "one request, four attempts");
    assert_eq!(breaker.state(), BreakerState::Closed, "counted once");
    for _ in 0..3 {
        assert_eq!(status(&f.send(f.request_from(1, Method::GET)).await), 503);
    }
    assert_eq!(breaker.state(), BreakerState::Open, "four requests");
}

#[tokio::test(start_paused = true)]
async fn retries_stop_when_the_breaker_opens() {
    let _trace = trace_init();
    let f = fixture([st_with(503, "retry-after", "5")]);
    let breaker = f.target.upstream.breaker().clone();
    f.upstream.set_fallback(st(200));
    let svc = f.svc.clone();
    let waiting = tokio::spawn(svc.oneshot(f.request_from(1, Method::GET)));
    // The request waits 5 s before its retry; meanwhile 20 other callers' requests fail.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(f.upstream.hits(), 1);
    for caller in 100..120 {
        breaker
            .try_acquire(caller)
            .expect("closed")
            .record(BreakerOutcome::Failure, tokio::time::Instant::now());
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    let err = waiting
        .await
        .expect("task")
        .expect_err("the breaker opened during the backoff");
    let RetryError::BreakerOpen { retry_after } = err else {
        panic!("expected BreakerOpen, got {err:?}");
    };
    assert_eq!(
        retry_after,
        Duration::from_secs(6),
        "open 10 s from t=1 s, now t=5 s"
    );
    assert_eq!(f.upstream.hits(), 1, "no retry reached the upstream");
}

#[tokio::test(start_paused = true)]
async fn exhausted_budget_returns_the_original_response() {
    let _trace = trace_init();
    let budget = BudgetConfig::try_new(0, Duration::from_secs(30), 0).expect("valid");
    let dep = Arc::new(UpstreamState::new(
        "orders",
        1,
        false,
        budget,
        BreakerConfig::default(),
    ));
    let f = fixture_with([st(503), st(200)], RetryParams::default(), dep);
    assert_eq!(
        status(&f.send(f.request(Method::GET, Body::empty())).await),
        503
    );
    assert_eq!(f.upstream.hits(), 1);
}
