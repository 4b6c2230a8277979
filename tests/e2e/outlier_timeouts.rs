//! Attempt timeouts count as gateway failures for outlier ejection (Envoy's
//! `consecutive_gateway_failure`): an endpoint that accepts connections and never answers
//! is ejected after `consecutive_failures` timeouts in a row, and gets no attempt after.
//! Both endpoints are scripted listeners on loopback; counts are what they received.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::upstream_health::{endpoint, get, proxied, start, upstreams};

/// Two endpoints A and B, outlier ejection after 2 failures in a row, one retry.
fn config(
    a: &ScriptedUpstream,
    b: &ScriptedUpstream,
    attempt_timeout: &str,
    extra: &str,
) -> String {
    format!(
        r#"[[upstreams]]
name = "orders"
endpoints = ["{}", "{}"]
attempt_timeout = "{attempt_timeout}"
retry = {{ max_retries = 1, base = "10ms", cap = "20ms", budget_percent = 50, budget_min_retries_per_second = 100{extra} }}
outlier = {{ consecutive_failures = 2, base_ejection = "300s", max_ejection = "300s" }}

[[routes]]
prefix = "/"
upstream = "orders"
"#,
        a.url(),
        b.url()
    )
}

#[tokio::test]
async fn an_endpoint_that_stalls_is_ejected_after_its_timeouts() {
    let _trace = portcullis_testkit::trace_init();
    // A answers nothing for a minute (far past the 300 ms attempt timeout); B answers 200.
    let stalled = Step::stall(Duration::from_secs(60), Step::status(200));
    let a = ScriptedUpstream::start_with_fallback(vec![], stalled).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let config = config(&a, &b, "300ms", "");
    let gw = start(&config).await;
    // Round robin: every other first attempt goes to A, times out, and is retried on B.
    for i in 0..12 {
        assert_eq!(get(&gw, "/orders").await, Some(200), "request {i}");
    }
    let view = upstreams(&gw).await;
    let a_view = endpoint(&view, "orders", &a.url()).expect("A in the admin view");
    assert_eq!(a_view["state"], "ejected", "{view}\n{}", gw.logs());
    assert_eq!(a_view["ejections"], 1, "{view}");
    assert_eq!(
        proxied(&a),
        2,
        "two timeouts in a row eject A; no attempt after: {view}"
    );
    assert_eq!(proxied(&b), 12, "every request answered by B");
}

/// A client that sets a deadline shorter than the attempt timeout cuts its own attempts
/// short: a hurry of its own, not a failure of the endpoint. However often one caller does
/// it, the endpoint stays in (failures one caller provokes alone never hurt
/// the others).
#[tokio::test]
async fn a_clients_short_deadline_never_ejects_an_endpoint() {
    let _trace = portcullis_testkit::trace_init();
    // A holds each request for 2 s before answering 200: slower than this client's deadline,
    // well inside the upstream's 5 s attempt timeout.
    let slow = Step::stall(Duration::from_secs(2), Step::status(200));
    let a = ScriptedUpstream::start_with_fallback(vec![], slow).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let config = config(&a, &b, "5s", "");
    let gw = start(&config).await;
    let mut answers = Vec::new();
    for _ in 0..8 {
        // 200 ms from now: an attempt on A is cut by the deadline, never by its timeout.
        #[allow(clippy::disallowed_methods)] // the header is a real wall time for the real gateway
        let deadline = std::time::SystemTime::now() + Duration::from_millis(200);
        let request = format!(
            "GET /orders HTTP/1.1\r\nHost: localhost\r\nX-Request-Deadline: {}\r\nConnection: close\r\n\r\n",
            humantime::format_rfc3339_millis(deadline)
        );
        let response = portcullis_testkit::gateway::raw_request(gw.addr, request.as_bytes())
            .await
            .expect("the gateway answers");
        answers.push(String::from_utf8_lossy(&response[..12.min(response.len())]).into_owned());
    }
    assert!(
        proxied(&a) >= 2,
        "A got its share of first attempts: {answers:?}"
    );
    let view = upstreams(&gw).await;
    let a_view = endpoint(&view, "orders", &a.url()).expect("A in the admin view");
    assert_eq!(a_view["state"], "healthy", "{view}\n{answers:?}");
    assert_eq!(a_view["ejections"], 0, "{view}");
}

/// A client that sends its body slower than the attempt timeout keeps the attempt waiting
/// for itself: the timeout is the client's doing, not the endpoint's. The body is larger
/// than `body_replay_limit` and `server.request_buffer_bytes`, so it is streamed to the
/// upstream while it arrives, and every attempt times out with the body half sent; neither
/// endpoint is ejected. (Within the buffer the upstream would see nothing at all:
/// `edge_request_buffering`.)
#[tokio::test]
async fn a_client_trickling_its_body_never_ejects_an_endpoint() {
    let _trace = portcullis_testkit::trace_init();
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nrequest_buffer_bytes = 16\n\n{}",
        config(&a, &b, "300ms", ", body_replay_limit = 16")
    );
    let gw = start(&config).await;
    for i in 0..4 {
        let mut stream = tokio::net::TcpStream::connect(gw.addr)
            .await
            .expect("connect");
        let head = "POST /orders HTTP/1.1\r\nHost: localhost\r\nContent-Length: 64\r\nConnection: close\r\n\r\n";
        stream.write_all(head.as_bytes()).await.expect("head");
        stream.write_all(&[b'x'; 32]).await.expect("half the body");
        // The rest never comes: the gateway's attempt timeout (300 ms) answers first.
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "request {i}: the gateway answers");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 504"), "request {i}: {text}");
    }
    // Round robin: each endpoint got two attempts (the head, then half a body that never
    // completed), and no retry: a streamed body cannot be replayed.
    // (A hit is recorded once the upstream gives up on the body: wait for the last, bounded.)
    for _ in 0..100 {
        if proxied(&a) + proxied(&b) == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((proxied(&a), proxied(&b)), (2, 2));
    for hit in a.hits().iter().chain(b.hits().iter()) {
        assert!(
            hit.body.len() < 64,
            "the body never arrived whole: {} bytes",
            hit.body.len()
        );
    }
    let view = upstreams(&gw).await;
    for upstream in [&a, &b] {
        let state = endpoint(&view, "orders", &upstream.url()).expect("endpoint in the view");
        assert_eq!(state["state"], "healthy", "{view}\n{}", gw.logs());
        assert_eq!(state["ejections"], 0, "{view}");
    }
}
