//! Endpoint health through the real binary: a killed endpoint is ejected passively and
//! costs clients nothing once detected (retries never go to it); active checks take an
//! endpoint out and bring it back; `/readyz` and `/admin/v1/upstreams` show the state.
//! Every upstream is a real listener on loopback; counts are what the upstreams received.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_testkit::gateway::{raw_get_status, raw_request, GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use serde_json::Value;

use crate::common::BIN;

pub(crate) const TOKEN: &str = "e2e-upstreams-token-0123456789";
/// Poll bound for state changes (× `POLL`).
pub(crate) const POLLS: usize = 200;
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// Starts the gateway with the admin API on.
pub(crate) async fn start(config: &str) -> GatewayProcess {
    let options = GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".to_owned(), TOKEN.to_owned())],
        ..GatewayOptions::default()
    };
    GatewayProcess::start_with(BIN, config, options).await
}

/// `GET path` through the proxy listener over a raw connection; the status.
pub(crate) async fn get(gw: &GatewayProcess, path: &str) -> Option<u16> {
    raw_get_status(gw.addr, path).await
}

/// `GET /admin/v1/upstreams` over a raw connection; the parsed JSON.
pub(crate) async fn upstreams(gw: &GatewayProcess) -> Value {
    let request = format!(
        "GET /admin/v1/upstreams HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    let response = raw_request(gw.admin_addr, request.as_bytes())
        .await
        .expect("admin answers");
    let text = String::from_utf8_lossy(&response).into_owned();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The admin view of one endpoint (`url` as `http://127.0.0.1:PORT`).
pub(crate) fn endpoint<'a>(view: &'a Value, upstream: &str, url: &str) -> Option<&'a Value> {
    view["upstreams"]
        .as_array()?
        .iter()
        .find(|u| u["name"] == upstream)?["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["url"] == url)
}

/// Waits (bounded) until `upstream`'s endpoint `url` is in `state`.
pub(crate) async fn wait_state(gw: &GatewayProcess, upstream: &str, url: &str, state: &str) {
    for _ in 0..POLLS {
        let view = upstreams(gw).await;
        if endpoint(&view, upstream, url).is_some_and(|e| e["state"] == state) {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!(
        "{url} never became {state}: {}\n{}",
        upstreams(gw).await,
        gw.logs()
    );
}

/// Requests the upstream saw, health checks excluded.
pub(crate) fn proxied(upstream: &ScriptedUpstream) -> usize {
    upstream
        .hits()
        .iter()
        .filter(|h| h.uri.path() != "/healthz")
        .count()
}

/// A listener on `addr` that accepts and at once closes every connection, counting them:
/// a dead endpoint whose attempts can still be counted.
async fn black_hole(addr: SocketAddr) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let mut listener = None;
    for _ in 0..POLLS {
        if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
            listener = Some(l);
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let listener = listener.expect("rebind the killed endpoint's port");
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (count, task)
}

#[tokio::test]
async fn a_killed_endpoint_is_ejected_and_costs_clients_nothing() {
    let _trace = portcullis_testkit::trace_init();
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let c = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        r#"[[upstreams]]
name = "orders"
endpoints = ["{}", "{}", "{}"]
retry = {{ max_retries = 2, base = "10ms", cap = "20ms", budget_percent = 50, budget_min_retries_per_second = 100 }}
outlier = {{ consecutive_failures = 3, base_ejection = "300s", max_ejection = "300s" }}

[[routes]]
prefix = "/"
upstream = "orders"
"#,
        a.url(),
        b.url(),
        c.url()
    );
    let gw = start(&config).await;
    for _ in 0..30 {
        assert_eq!(get(&gw, "/orders").await, Some(200));
    }
    assert_eq!((proxied(&a), proxied(&b), proxied(&c)), (10, 10, 10));

    // Kill C mid-load: its listener and connections go; a counting listener takes its port.
    let c_url = c.url();
    let c_addr = c.addr();
    drop(c);
    let (attempts_to_c, hole) = black_hole(c_addr).await;

    // Detection: keep the load on until the admin API shows C ejected. Retries (a dead
    // connection is provably unprocessed) already keep clients whole meanwhile.
    let mut detected = false;
    for i in 0..POLLS {
        assert_eq!(
            get(&gw, "/orders").await,
            Some(200),
            "request {i} during detection"
        );
        let view = upstreams(&gw).await;
        if endpoint(&view, "orders", &c_url).is_some_and(|e| e["state"] == "ejected") {
            detected = true;
            break;
        }
    }
    assert!(
        detected,
        "never ejected: {}\n{}",
        upstreams(&gw).await,
        gw.logs()
    );
    let view = upstreams(&gw).await;
    let c_view = endpoint(&view, "orders", &c_url).unwrap();
    assert_eq!(c_view["ejections"], 1, "{view}");
    assert!(
        c_view["ejected_for_ms"].as_u64().unwrap() > 200_000,
        "{view}"
    );
    assert_eq!(view["upstreams"][0]["healthy_endpoints"], 2, "{view}");
    // Attempt latency, per upstream and per route (timeouts from data): measured once 100
    // attempts were made, with the timeout in force and a recommended one.
    assert_eq!(view["upstreams"][0]["routes"][0]["route"], "/", "{view}");
    assert!(
        view["upstreams"][0]["attempt_timeout_ms"].as_u64().unwrap() > 0,
        "{view}"
    );

    // After detection: zero client errors, no attempt reaches C, and a retry after B's
    // 503 goes to A, never to the ejected C.
    let before = (
        proxied(&a),
        proxied(&b),
        attempts_to_c.load(Ordering::SeqCst),
    );
    b.push([Step::status(503)]);
    for i in 0..60 {
        assert_eq!(
            get(&gw, "/orders").await,
            Some(200),
            "request {i} after detection"
        );
    }
    let after = (
        proxied(&a),
        proxied(&b),
        attempts_to_c.load(Ordering::SeqCst),
    );
    assert_eq!(after.2, before.2, "no attempt to the ejected endpoint");
    assert_eq!(
        (after.0 - before.0) + (after.1 - before.1),
        61,
        "60 requests + 1 retry after the 503, all on A and B"
    );
    let b_hits = b.hits();
    let failed = b_hits
        .iter()
        .rposition(|h| h.answered == Some(503))
        .expect("B answered the 503");
    assert!(failed >= before.1, "the 503 came after detection");
    // One of three down is not "no healthy endpoint": still ready.
    assert_eq!(get(&gw, "/readyz").await, Some(200));
    hole.abort();
}

#[tokio::test]
async fn active_checks_take_an_endpoint_out_and_back_and_readyz_names_dead_upstreams() {
    let _trace = portcullis_testkit::trace_init();
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    let solo = ScriptedUpstream::start(vec![]).await;
    let check = r#"health_check = { path = "/healthz", interval = "50ms", timeout = "40ms", healthy = 2, unhealthy = 2 }
retry = { max_retries = 0 }"#;
    let config = format!(
        r#"[[upstreams]]
name = "pair"
endpoints = ["{}", "{}"]
{check}

[[upstreams]]
name = "solo"
endpoints = ["{}"]
{check}

[[routes]]
prefix = "/pair"
upstream = "pair"

[[routes]]
prefix = "/solo"
upstream = "solo"
"#,
        a.url(),
        b.url(),
        solo.url()
    );
    let gw = start(&config).await;
    assert_eq!(get(&gw, "/readyz").await, Some(200));

    // B fails its checks: out of rotation, while the clients see only A's 200s.
    b.set_fallback(Step::status(503));
    wait_state(&gw, "pair", &b.url(), "unhealthy").await;
    let before = proxied(&b);
    for _ in 0..20 {
        assert_eq!(get(&gw, "/pair").await, Some(200));
    }
    assert_eq!(proxied(&b), before, "no request to an unhealthy endpoint");
    assert!(b.hits().iter().any(|h| h.uri.path() == "/healthz"));
    // One of two down: the gateway stays ready.
    assert_eq!(get(&gw, "/readyz").await, Some(200));

    // Solo's only endpoint fails: /readyz is 503 and names it.
    solo.set_fallback(Step::status(500));
    let mut named = false;
    for _ in 0..POLLS {
        let response = raw_request(
            gw.addr,
            b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap_or_default();
        let text = String::from_utf8_lossy(&response);
        if text.starts_with("HTTP/1.1 503") && text.contains("solo") {
            assert!(!text.contains("pair"), "{text}");
            named = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(named, "readyz never named solo: {}", gw.logs());
    let view = upstreams(&gw).await;
    assert_eq!(view["upstreams"][1]["healthy_endpoints"], 0, "{view}");
    assert_eq!(view["upstreams"][1]["panic"], true, "{view}");

    // Both recover: back in rotation, ready again.
    b.set_fallback(Step::ok("ok"));
    solo.set_fallback(Step::ok("ok"));
    wait_state(&gw, "pair", &b.url(), "healthy").await;
    wait_state(&gw, "solo", &solo.url(), "healthy").await;
    assert_eq!(get(&gw, "/readyz").await, Some(200));
    let before = proxied(&b);
    for _ in 0..20 {
        assert_eq!(get(&gw, "/pair").await, Some(200));
    }
    assert!(proxied(&b) > before, "B serves again");
}

#[tokio::test]
async fn a_passing_active_check_lifts_an_outlier_ejection_at_once() {
    let _trace = portcullis_testkit::trace_init();
    let a = ScriptedUpstream::start(vec![]).await;
    let b = ScriptedUpstream::start(vec![]).await;
    // Checks every 100 ms that never take an endpoint out by themselves (unhealthy = 100):
    // B leaves by passive ejection only, for 300 s.
    let config = format!(
        r#"[[upstreams]]
name = "pair"
endpoints = ["{}", "{}"]
health_check = {{ path = "/healthz", interval = "100ms", timeout = "80ms", healthy = 1, unhealthy = 100 }}
outlier = {{ consecutive_failures = 2, base_ejection = "300s", max_ejection = "300s" }}
retry = {{ max_retries = 1, base = "1ms", cap = "2ms", budget_percent = 50, budget_min_retries_per_second = 100 }}

[[routes]]
prefix = "/"
upstream = "pair"
"#,
        a.url(),
        b.url()
    );
    let gw = start(&config).await;
    let b_url = b.url();
    let b_addr = b.addr();
    drop(b);
    for _ in 0..POLLS {
        assert_eq!(get(&gw, "/orders").await, Some(200));
        let view = upstreams(&gw).await;
        if endpoint(&view, "pair", &b_url).is_some_and(|e| e["state"] == "ejected") {
            break;
        }
    }
    wait_state(&gw, "pair", &b_url, "ejected").await;

    // B comes back on its port and passes its next check: in service at once, not in 300 s.
    let mut b = None;
    for _ in 0..POLLS {
        b = ScriptedUpstream::start_at(b_addr, vec![]).await;
        if b.is_some() {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let b = b.expect("rebind B's port");
    wait_state(&gw, "pair", &b_url, "healthy").await;
    assert!(
        b.hits().iter().any(|h| h.uri.path() == "/healthz"),
        "the check reached B"
    );
    for _ in 0..20 {
        assert_eq!(get(&gw, "/orders").await, Some(200));
    }
    assert!(
        proxied(&b) >= 5,
        "B gets traffic again: {} of 20\n{}",
        proxied(&b),
        gw.logs()
    );
}
