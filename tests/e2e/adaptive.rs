//! Adaptive throttling through the binary: an upstream that answers 429 teaches the gateway
//! a rate, requests over it are answered at the edge (503 `upstream-throttled`, Retry-After)
//! and never reach the upstream, or wait for their token within `max_wait`; it recovers when
//! the upstream does; with Redis as the state
//! store a replica that never saw a 429 itself holds back on what another one learned.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};

use crate::common::BIN;

/// An upstream that counts what it receives: 429 on paths under `/a` (and everywhere while
/// `throttling` is set), 200 otherwise.
#[derive(Default)]
struct Upstream {
    throttling: AtomicBool,
    hits_a: AtomicUsize,
    hits_b: AtomicUsize,
    throttled: AtomicUsize,
}

async fn start_upstream(throttling: bool) -> (Arc<Upstream>, SocketAddr) {
    let state = Arc::new(Upstream::default());
    state.throttling.store(throttling, Ordering::SeqCst);
    let counts = state.clone();
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let counts = counts.clone();
        async move {
            let a = uri.path().starts_with("/a");
            if a {
                counts.hits_a.fetch_add(1, Ordering::SeqCst);
            } else {
                counts.hits_b.fetch_add(1, Ordering::SeqCst);
            }
            if a || counts.throttling.load(Ordering::SeqCst) {
                counts.throttled.fetch_add(1, Ordering::SeqCst);
                (StatusCode::TOO_MANY_REQUESTS, "slow down")
            } else {
                (StatusCode::OK, "ok")
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (state, addr)
}

fn config(upstream: SocketAddr, adaptive: &str, state: &str) -> String {
    format!(
        "[storage]\nstate = \"{state}\"\n\n[[upstreams]]\nname = \"u{}\"\nendpoints = [\"http://{upstream}\"]\nretry = {{ max_retries = 0 }}\n{adaptive}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u{}\"\n",
        upstream.port(),
        upstream.port(),
    )
}

/// One answer as the client saw it.
struct Answer {
    status: u16,
    text: String,
}

impl Answer {
    fn is_throttled_at_the_edge(&self) -> bool {
        self.status == 503
            && self.text.contains("application/problem+json")
            && self.text.contains("/problems/upstream-throttled")
    }

    fn retry_after(&self) -> Option<u64> {
        self.text
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("retry-after: ")
                    .map(str::to_owned)
            })
            .and_then(|v| v.trim().parse().ok())
    }
}

async fn get(gateway: &GatewayProcess, path: &str) -> Answer {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let bytes = raw_request(gateway.addr, request.as_bytes())
        .await
        .expect("an answer");
    Answer {
        status: parse_status(&bytes).expect("a status line"),
        text: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

#[tokio::test]
async fn over_the_learned_rate_requests_are_answered_at_the_edge_and_recover() {
    let (upstream, addr) = start_upstream(true).await;
    // max_wait = 0s: everything over the rate is refused at once (the default queues).
    let adaptive = "adaptive = { max_wait = \"0s\" }";
    let gateway = GatewayProcess::start(BIN, &config(addr, adaptive, "memory")).await;

    const REQUESTS: usize = 200;
    let mut edge = 0;
    let mut from_upstream = 0;
    for _ in 0..REQUESTS {
        let answer = get(&gateway, "/b").await;
        if answer.is_throttled_at_the_edge() {
            edge += 1;
            let secs = answer.retry_after().expect("Retry-After on a refusal");
            assert!(secs >= 1, "{}", answer.text);
        } else {
            assert_eq!(answer.status, 429, "{}", answer.text);
            from_upstream += 1;
        }
    }
    let received = upstream.hits_b.load(Ordering::SeqCst);
    assert_eq!(
        received, from_upstream,
        "every 429 the client saw came from the upstream"
    );
    assert_eq!(edge + from_upstream, REQUESTS);
    // Without the throttle the upstream receives all 200; with it, after the first 429s the
    // rate falls to its floor (1 req/s) and the rest are answered at the edge.
    assert!(received <= 60, "upstream received {received} of {REQUESTS}");
    assert!(edge >= REQUESTS - 60, "{edge} answered at the edge");
    // The admin /metrics says which signal cut the rate: the upstream's 429s, not latency.
    let metrics = crate::common::client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let decreases = |cause: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with("adaptive_decreases_total{") && l.contains(cause))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(
        decreases("cause=\"throttled\"") >= 1.0,
        "decreases by cause on /metrics: {metrics}"
    );
    assert_eq!(decreases("cause=\"latency\""), 0.0, "{metrics}");

    // The upstream recovers: within a bounded number of tries a request goes through again.
    upstream.throttling.store(false, Ordering::SeqCst);
    let mut recovered = false;
    for _ in 0..100 {
        if get(&gateway, "/b").await.status == 200 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "no request reached the recovered upstream");
    assert!(upstream.hits_b.load(Ordering::SeqCst) > received);
}

#[tokio::test]
async fn without_adaptive_every_request_reaches_the_upstream() {
    let (upstream, addr) = start_upstream(true).await;
    let gateway = GatewayProcess::start(BIN, &config(addr, "", "memory")).await;
    for _ in 0..50 {
        assert_eq!(get(&gateway, "/b").await.status, 429);
    }
    assert_eq!(upstream.hits_b.load(Ordering::SeqCst), 50);
}

/// Replica A learns the rate from 429s on `/a`; replica B only ever sees 200s on `/b` from
/// the same upstream, so when B refuses at the edge it is on what A published in Redis.
#[tokio::test]
async fn a_replica_holds_back_on_the_rate_another_learned_through_redis() {
    let (upstream, addr) = start_upstream(false).await;
    let redis = portcullis_testkit::redis::shared_url();
    let text = config(addr, "adaptive = { max_wait = \"0s\" }", &redis);
    let a = GatewayProcess::start(BIN, &text).await;
    let b = GatewayProcess::start(BIN, &text).await;

    // A learns: the upstream throttles everything it sends.
    for _ in 0..100 {
        let answer = get(&a, "/a").await;
        assert!(
            answer.status == 429 || answer.is_throttled_at_the_edge(),
            "{}",
            answer.text
        );
    }
    assert!(
        upstream.hits_a.load(Ordering::SeqCst) < 100,
        "A throttles itself"
    );

    // B has never seen a 429; within a bounded number of tries (its next syncs) it holds
    // back on A's rate.
    let mut refused = 0;
    for _ in 0..200 {
        let answer = get(&b, "/b").await;
        if answer.is_throttled_at_the_edge() {
            refused += 1;
            break;
        }
        assert_eq!(answer.status, 200, "{}", answer.text);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(refused, 1, "B never used the rate A learned");
    // From then on a burst through B mostly stays at the edge.
    let before = upstream.hits_b.load(Ordering::SeqCst);
    for _ in 0..50 {
        let answer = get(&b, "/b").await;
        if answer.is_throttled_at_the_edge() {
            refused += 1;
        } else {
            assert_eq!(answer.status, 200, "{}", answer.text);
        }
    }
    let sent = upstream.hits_b.load(Ordering::SeqCst) - before;
    assert!(sent <= 20, "B sent {sent} of 50 with A's rate published");
    assert!(refused > 30, "{refused}");
    assert_eq!(
        upstream.throttled.load(Ordering::SeqCst),
        upstream.hits_a.load(Ordering::SeqCst)
    );
}

/// With the default `max_wait` (1 s) a request over the learned rate waits for its token
/// instead of being refused: after the upstream throttled, sequential requests are all
/// sent (spaced by the rate) and answered by it. With `max_wait = "0s"` the first one is
/// refused at the edge.
#[tokio::test]
async fn over_the_rate_a_request_waits_for_its_token_within_max_wait() {
    for (adaptive, queued) in [
        ("adaptive = true", true),
        ("adaptive = { max_wait = \"0s\" }", false),
    ] {
        let (upstream, addr) = start_upstream(false).await;
        let gateway = GatewayProcess::start(BIN, &config(addr, adaptive, "memory")).await;
        // Teach a rate: a burst of 429s (only the first decreases it, once per window).
        for _ in 0..3 {
            let answer = get(&gateway, "/a").await;
            assert!(answer.status == 429 || answer.is_throttled_at_the_edge());
        }
        let before = upstream.hits_b.load(Ordering::SeqCst);
        let mut refused = 0;
        for _ in 0..5 {
            let answer = get(&gateway, "/b").await;
            if answer.is_throttled_at_the_edge() {
                refused += 1;
            } else {
                assert_eq!(answer.status, 200, "{}", answer.text);
            }
        }
        let sent = upstream.hits_b.load(Ordering::SeqCst) - before;
        if queued {
            assert_eq!(
                (sent, refused),
                (5, 0),
                "{adaptive}: all waited and were sent"
            );
        } else {
            assert!(refused >= 1, "{adaptive}: refused at once");
            assert_eq!(sent + refused, 5);
        }
    }
}
