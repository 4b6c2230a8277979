//! Client retries after the gateway's: one attempt each, not a new round (the bound:
//! attempts per client operation ≤ 1 + max_retries + the client's retries).

use super::*;

/// The same operation sent `1 + client_retries` times by caller 1, as a client library
/// would after each failure; returns the upstream's attempt count.
async fn client_loop(
    f: &Fixture,
    method: Method,
    body: &'static str,
    client_retries: u32,
) -> usize {
    for _ in 0..=client_retries {
        let mut req = f.request(method.clone(), body);
        req.extensions_mut().insert(CallerId(1));
        let _ = f.send(req).await;
        // A client's own backoff: well within the window.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    f.upstream.hits()
}

#[tokio::test(start_paused = true)]
async fn a_client_retrying_an_exhausted_request_gets_one_attempt_each_time() {
    let _trace = trace_init();
    let f = fixture([]);
    f.upstream.set_fallback(st(503));
    // 1 + 3 gateway retries, then one attempt per client retry: 4 + 3, not 16.
    assert_eq!(client_loop(&f, Method::GET, "", 3).await, 7);

    let mut req = f.request(Method::GET, Body::empty());
    req.extensions_mut().insert(CallerId(1));
    let rsp = f.send(req).await.expect("response");
    assert_eq!(
        rsp.headers()["x-retry-exhausted"],
        "attempts=1, reason=client_retry"
    );
}

#[tokio::test(start_paused = true)]
async fn the_first_round_says_why_it_stopped() {
    let _trace = trace_init();
    let f = fixture([]);
    f.upstream.set_fallback(st(503));
    let rsp = f
        .send(f.request(Method::GET, Body::empty()))
        .await
        .expect("response");
    assert_eq!(
        rsp.headers()["x-retry-exhausted"],
        "attempts=4, reason=attempts_exhausted"
    );
}

#[tokio::test(start_paused = true)]
async fn other_operations_and_later_retries_get_a_full_round() {
    let _trace = trace_init();
    let f = fixture([]);
    f.upstream.set_fallback(st(503));
    let mut first = f.request(Method::PUT, "a");
    first.extensions_mut().insert(CallerId(1));
    let _ = f.send(first).await;
    assert_eq!(f.upstream.hits(), 4);
    // Another body, another caller: other operations.
    let mut other_body = f.request(Method::PUT, "b");
    other_body.extensions_mut().insert(CallerId(1));
    let _ = f.send(other_body).await;
    let mut other_caller = f.request(Method::PUT, "a");
    other_caller.extensions_mut().insert(CallerId(2));
    let _ = f.send(other_caller).await;
    assert_eq!(f.upstream.hits(), 12);
    // Past the 30 s window the same operation is new again.
    tokio::time::sleep(Duration::from_secs(31)).await;
    let mut again = f.request(Method::PUT, "a");
    again.extensions_mut().insert(CallerId(1));
    let _ = f.send(again).await;
    assert_eq!(f.upstream.hits(), 16);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_retry_is_the_same_operation_whatever_its_body() {
    let _trace = trace_init();
    let f = fixture([]);
    f.upstream.set_fallback(st(503));
    for body in ["one", "two"] {
        let mut req = f.locked(Method::POST, body);
        req.extensions_mut().insert(CallerId(1));
        let _ = f.send(req).await;
    }
    assert_eq!(
        f.upstream.hits(),
        5,
        "4 for the first, 1 for the client's retry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_window_keeps_todays_behaviour() {
    let _trace = trace_init();
    let dep = Arc::new(
        UpstreamState::new(
            "orders",
            1,
            false,
            BudgetConfig::default(),
            BreakerConfig::default(),
        )
        .with_client_retry_window(Duration::ZERO),
    );
    let f = fixture_with([], RetryParams::default(), dep);
    f.upstream.set_fallback(st(503));
    assert_eq!(client_loop(&f, Method::GET, "", 1).await, 8);
}
