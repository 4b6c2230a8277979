//! The single retry layer, end to end: scripted upstreams count and timestamp every attempt.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::ports::closed_addr;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{client, BIN};

/// One upstream `u` routed from `/`, fast backoff so tests stay short.
fn config(endpoints: &[String], retry: &str, extra: &str) -> String {
    let list = endpoints
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "[[upstreams]]\nname = \"u\"\nendpoints = [{list}]\nretry = {{ base = \"10ms\", cap = \"50ms\", {retry} }}\n{extra}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n"
    )
}

async fn start(upstream: &ScriptedUpstream, retry: &str) -> GatewayProcess {
    GatewayProcess::start(BIN, &config(&[upstream.url()], retry, "")).await
}

#[tokio::test]
async fn transient_503s_are_retried_with_the_same_request_id_and_attempt_numbers() {
    let upstream = ScriptedUpstream::start(vec![
        Step::status(503),
        Step::status(503),
        Step::ok("third time"),
    ])
    .await;
    let gateway = start(&upstream, "max_retries = 3").await;
    let response = client().get(gateway.url() + "/r").send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "third time");
    let hits = upstream.hits();
    assert_eq!(hits.len(), 3);
    let id = &hits[0].headers["x-request-id"];
    for (i, hit) in hits.iter().enumerate() {
        assert_eq!(
            &hit.headers["x-request-id"], id,
            "same correlation id on every attempt"
        );
        assert_eq!(hit.headers["x-retry-attempt"], (i + 1).to_string().as_str());
        assert!(
            hit.headers.contains_key("x-request-deadline"),
            "deadline forwarded"
        );
    }
}

#[tokio::test]
async fn non_retryable_statuses_hit_the_upstream_once() {
    for status in [400u16, 401, 403, 404, 409, 422] {
        let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(status)).await;
        let gateway = start(&upstream, "max_retries = 3").await;
        let response = client().get(gateway.url() + "/n").send().await.unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(
            upstream.hit_count(),
            1,
            "status {status} must not be retried"
        );
    }
}

#[tokio::test]
async fn post_without_idempotency_protection_is_not_retried_on_503() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(503)).await;
    let gateway = start(&upstream, "max_retries = 3").await;
    let response = client()
        .post(gateway.url() + "/pay")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(upstream.hit_count(), 1);
}

#[tokio::test]
async fn retry_after_is_a_floor_on_the_next_attempt() {
    let upstream =
        ScriptedUpstream::start(vec![Step::with_retry_after(503, 2), Step::ok("later")]).await;
    let gateway = start(&upstream, "max_retries = 2").await;
    let response = client().get(gateway.url() + "/ra").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let hits = upstream.hits();
    assert_eq!(hits.len(), 2);
    let gap = hits[1].at.duration_since(hits[0].at);
    assert!(
        gap >= Duration::from_secs(2),
        "next attempt only {gap:?} after a Retry-After: 2"
    );
}

#[tokio::test]
async fn retry_after_beyond_the_deadline_returns_the_upstream_answer_at_once() {
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::with_retry_after(503, 120)).await;
    let gateway = start(&upstream, "max_retries = 3, total = \"30s\"").await;
    let response = client().get(gateway.url() + "/late").send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers()["retry-after"],
        "120",
        "the client sees the upstream's own Retry-After"
    );
    assert_eq!(upstream.hit_count(), 1);
}

#[tokio::test]
async fn connect_refused_moves_to_another_endpoint_even_for_a_bare_post() {
    let live = ScriptedUpstream::start(vec![]).await;
    let dead = format!("http://{}", closed_addr());
    let gateway =
        GatewayProcess::start(BIN, &config(&[dead, live.url()], "max_retries = 2", "")).await;
    for _ in 0..4 {
        let response = client()
            .post(gateway.url() + "/create")
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            200,
            "connect refused is provably unprocessed: safe to retry"
        );
    }
    assert_eq!(
        live.hit_count(),
        4,
        "every POST executed exactly once on the live endpoint"
    );
}

/// The proxy names the endpoint that answered only when the upstream has several; this is
/// the case where it matters. Weights 9:1 make smooth round robin give the failing endpoint
/// nine picks in ten, so a retry that did not avoid it would usually land on it again and,
/// with one retry allowed, reach the client as a 503.
#[tokio::test]
async fn a_503_sends_the_retry_to_the_other_endpoint() {
    let failing = ScriptedUpstream::start_with_fallback(vec![], Step::status(503)).await;
    let healthy = ScriptedUpstream::start(vec![]).await;
    let endpoints = format!(
        "[{{ url = \"{}\", weight = 9 }}, \"{}\"]",
        failing.url(),
        healthy.url()
    );
    let config = format!(
        "[[upstreams]]\nname = \"u\"\nendpoints = {endpoints}\n\
         retry = {{ max_retries = 1, base = \"10ms\", cap = \"20ms\", budget_percent = 50, budget_min_retries_per_second = 100 }}\n\
         outlier = {{ consecutive_failures = 0 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n"
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let requests = 6;
    for i in 0..requests {
        let response = client()
            .get(format!("{}/avoid/{i}", gateway.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            200,
            "request {i}: the retry went back to the endpoint that answered 503"
        );
    }
    let failed = failing.hits();
    let served = healthy.hits();
    assert_eq!(
        served.len(),
        requests,
        "the healthy endpoint served every request"
    );
    assert!(
        failed.len() >= requests / 2,
        "most first attempts went to the weighted endpoint: {}",
        failed.len()
    );
    for hit in &failed {
        assert_eq!(
            hit.headers["x-retry-attempt"], "1",
            "the failing endpoint saw only first attempts"
        );
    }
    let retried = served
        .iter()
        .filter(|hit| hit.headers["x-retry-attempt"] == "2")
        .count();
    assert_eq!(
        retried,
        failed.len(),
        "each 503 was followed by one attempt on the other endpoint"
    );
}

#[tokio::test]
async fn stalled_attempt_times_out_and_get_is_retried() {
    let upstream = ScriptedUpstream::start(vec![
        Step::stall(Duration::from_secs(3), Step::ok("late")),
        Step::ok("fresh"),
    ])
    .await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(
            &[upstream.url()],
            "max_retries = 1",
            "attempt_timeout = \"300ms\"",
        ),
    )
    .await;
    let response = client().get(gateway.url() + "/t").send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "fresh");
    assert_eq!(upstream.hit_count(), 2);
}

#[tokio::test]
async fn budget_bounds_amplification_and_the_breaker_opens_then_closes() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(503)).await;
    // One anonymous caller here: attribution to callers is edge_breaker's subject, so
    // `min_callers = 1` lets this caller's failures open the breaker.
    let breaker = "circuit_breaker = { failure_rate = 0.5, min_requests = 20, window = \"30s\", open_for = \"1s\", half_open_probes = 1, min_callers = 1 }";
    let config = config(
        &[upstream.url()],
        "max_retries = 3, budget_percent = 20, budget_min_retries_per_second = 1",
        breaker,
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let requests = 60;
    let mut fast_failures = 0;
    for n in 0..requests {
        let response = client().get(gateway.url() + "/down").send().await.unwrap();
        assert_eq!(response.status(), 503, "request {n}");
        let body = response.text().await.unwrap();
        if body.contains("circuit-open") {
            fast_failures += 1;
        }
    }
    let attempts = upstream.hit_count();
    let ratio = attempts as f64 / requests as f64;
    // 20 % budget plus the 1 retry/s floor over the few seconds this loop takes.
    assert!(
        ratio <= 1.5,
        "attempts/requests = {ratio:.2} ({attempts} attempts for {requests} requests)"
    );
    assert!(fast_failures > 0, "the breaker opened and failed fast");

    // Recovery: once the upstream is healthy, a probe after open_for closes the breaker.
    upstream.set_fallback(Step::ok("back"));
    let mut recovered = false;
    for _ in 0..50 {
        let response = client().get(gateway.url() + "/down").send().await.unwrap();
        if response.status() == 200 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "the breaker closed again through a successful probe"
    );
    let metrics = client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "retry_attempts_total",
        "retry_budget_utilization_ratio",
        "circuit_breaker_state",
        "upstream_attempts_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test]
async fn a_clients_retries_of_an_exhausted_request_get_one_attempt_each() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(503)).await;
    let gateway = start(&upstream, "max_retries = 3").await;
    let mut last = None;
    // The client's own retries of one operation (as urllib3's Retry(total=3) would send).
    for _ in 0..4 {
        let response = client().get(gateway.url() + "/op/1").send().await.unwrap();
        assert_eq!(response.status(), 503);
        last = response.headers().get("x-retry-exhausted").cloned();
    }
    assert_eq!(
        upstream.hit_count(),
        4 + 3,
        "1 + max_retries + the client's retries"
    );
    assert_eq!(last.unwrap(), "attempts=1, reason=client_retry");
    // Another operation of the same client still gets the gateway's full round.
    client().get(gateway.url() + "/op/2").send().await.unwrap();
    assert_eq!(upstream.hit_count(), 7 + 4);
}

#[tokio::test]
async fn a_hedged_get_is_answered_by_the_fast_endpoint_and_a_post_is_never_hedged() {
    // Round robin sends the first attempt to the slow endpoint; its copy goes to the fast one.
    let slow = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::stall(Duration::from_secs(10), Step::ok("slow")),
    )
    .await;
    let fast = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fast")).await;
    let config = config(&[slow.url(), fast.url()], "max_retries = 2", "").replace(
        "upstream = \"u\"\n",
        "upstream = \"u\"\nhedge = { after = \"50ms\" }\n",
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    for _ in 0..4 {
        let response = client().get(gateway.url() + "/h").send().await.unwrap();
        assert_eq!(response.text().await.unwrap(), "fast");
    }
    assert!(
        slow.hit_count() >= 1,
        "a first attempt went to the slow endpoint"
    );
    assert!(
        slow.hits()
            .iter()
            .all(|h| h.headers["x-retry-attempt"] == "1"),
        "a copy never goes to the endpoint its first attempt is waiting on"
    );
    let hedges: Vec<_> = fast
        .hits()
        .into_iter()
        .filter(|h| h.uri.path() == "/h")
        .collect();
    assert!(!hedges.is_empty());
    assert!(
        hedges.iter().any(|h| h.headers["x-retry-attempt"] == "2"),
        "a hedge copy"
    );

    // A POST is sent once, even when slow: never two copies at once.
    let before = slow.hit_count() + fast.hit_count();
    let post = client().post(gateway.url() + "/p").body("x").send();
    let _ = tokio::time::timeout(Duration::from_millis(500), post).await;
    assert!(slow.hit_count() + fast.hit_count() <= before + 1);
}

#[tokio::test]
async fn a_problem_after_retries_says_how_many_attempts_were_made() {
    let dead = format!("http://{}", closed_addr());
    let gateway = GatewayProcess::start(BIN, &config(&[dead], "max_retries = 2", "")).await;
    let response = client().get(gateway.url() + "/gone").send().await.unwrap();
    assert_eq!(response.status(), 502);
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(problem["attempts"], 3, "{problem}");
}
