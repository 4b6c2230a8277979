//! Concurrency limits and priority shedding through the real binary, over raw sockets: the
//! upstream holds requests behind a gate (no timing), so "in flight" is exact, and the
//! assertions are about what the upstream received.

use std::net::SocketAddr;
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::{Gate, ScriptedUpstream, Step};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::common::BIN;

const ADMIN_TOKEN: &str = "e2e-admin-token-concurrency-01";

/// A raw HTTP/1.1 GET, with an API key when `key` is given; the connection closes after it.
fn get(path: &str, key: Option<&str>) -> Vec<u8> {
    let key = key
        .map(|k| format!("X-API-Key: {k}\r\n"))
        .unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{key}Connection: close\r\n\r\n").into_bytes()
}

/// Sends `request` on its own connection and reads the whole answer (bounded), in a task:
/// for requests the gated upstream holds.
fn in_flight(addr: SocketAddr, request: Vec<u8>) -> JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(&request).await.unwrap();
            let mut out = Vec::new();
            let _ = stream.read_to_end(&mut out).await;
            out
        };
        tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .expect("a held request is answered once the gate opens")
    })
}

/// An answer the gateway gives at once (not held upstream).
async fn answer(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    raw_request(addr, request).await.expect("an answer")
}

/// Waits (bounded) until the upstream has received `n` requests.
async fn upstream_reached(upstream: &ScriptedUpstream, n: usize) {
    for _ in 0..500 {
        if upstream.hit_count() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "upstream saw {} requests, expected {n}",
        upstream.hit_count()
    );
}

fn head(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    text.split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

fn header(response: &[u8], name: &str) -> Option<String> {
    let prefix = format!("{name}: ");
    head(response)
        .lines()
        .find_map(|line| line.strip_prefix(&prefix).map(str::to_owned))
}

fn body_json(response: &[u8]) -> Value {
    let text = String::from_utf8_lossy(response);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    serde_json::from_str(body).unwrap_or(Value::Null)
}

/// Asserts the 429 of the concurrency limiter, with its policy `q`.
fn assert_concurrency_limited(response: &[u8], limit: u64, scope: &str) {
    assert_eq!(parse_status(response), Some(429), "{}", head(response));
    assert_eq!(header(response, "retry-after").as_deref(), Some("1"));
    assert_eq!(
        header(response, "ratelimit-policy"),
        Some(format!("\"concurrency\";q={limit}"))
    );
    assert_eq!(
        header(response, "ratelimit").as_deref(),
        Some("\"concurrency\";r=0;t=1")
    );
    assert_eq!(
        header(response, "content-type").as_deref(),
        Some("application/problem+json")
    );
    let problem = body_json(response);
    assert_eq!(
        problem["type"],
        "https://portcullis.dev/problems/concurrency-limited"
    );
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["concurrency"])
    );
    assert_eq!(
        (problem["limit"].as_u64(), problem["scope"].as_str()),
        (Some(limit), Some(scope))
    );
}

fn tenant(id: &str, extra: &str) -> String {
    format!("[[tenants]]\nid = \"{id}\"\napi_keys = [\"{id}-key-0001\"]\nrate = 1\nper = \"1h\"\nburst = 3\n{extra}\n")
}

fn config(upstream: &ScriptedUpstream, server: &str, tenants: &str, routes: &str) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\n{server}\n\n{tenants}\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nprefix = \"/\"\nupstream = \"u\"\n\n{routes}",
        upstream.url()
    )
}

fn ok(response: &[u8]) -> bool {
    parse_status(response) == Some(200)
}

#[tokio::test]
async fn a_tenant_over_its_concurrency_limit_gets_429_and_spends_no_rate_limit_token() {
    let gate = Gate::new();
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::gated(&gate, Step::ok("done"))).await;
    let tenants = tenant("acme", "concurrency_limit = 2") + &tenant("other", "");
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "", &tenants, "")).await;
    let addr = gateway.addr;

    let held: Vec<_> = (0..2)
        .map(|i| in_flight(addr, get(&format!("/held/{i}"), Some("acme-key-0001"))))
        .collect();
    upstream_reached(&upstream, 2).await;
    let refused = answer(addr, &get("/third", Some("acme-key-0001"))).await;
    assert_concurrency_limited(&refused, 2, "tenant");

    let other = in_flight(addr, get("/other", Some("other-key-0001")));
    upstream_reached(&upstream, 3).await;
    let paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    assert!(
        !paths.contains(&"/third".to_owned()),
        "the refused request never reached the upstream: {paths:?}"
    );

    gate.open();
    for task in held {
        assert!(ok(&task.await.unwrap()));
    }
    assert!(ok(&other.await.unwrap()), "another tenant is unaffected");
    // The tenant's bucket holds 3 tokens: two spent above; the 429 spent none, so the third
    // request still passes the rate limiter.
    let after = answer(addr, &get("/after", Some("acme-key-0001"))).await;
    assert!(ok(&after), "{}", head(&after));
    assert_eq!(upstream.hits().last().unwrap().uri.path(), "/after");
    assert_eq!(upstream.hit_count(), 4);
}

#[tokio::test]
async fn a_route_limit_counts_each_caller_apart() {
    let gate = Gate::new();
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::gated(&gate, Step::ok("done"))).await;
    let routes = "[[routes]]\nprefix = \"/export\"\nupstream = \"u\"\nconcurrency_per_caller = 1\n";
    let gateway =
        GatewayProcess::start(BIN, &config(&upstream, "", &tenant("acme", ""), routes)).await;
    let addr = gateway.addr;

    let anonymous = in_flight(addr, get("/export/1", None));
    upstream_reached(&upstream, 1).await;
    let refused = answer(addr, &get("/export/2", None)).await;
    assert_concurrency_limited(&refused, 1, "route");
    let tenant = in_flight(addr, get("/export/3", Some("acme-key-0001")));
    let elsewhere = in_flight(addr, get("/other", None));
    upstream_reached(&upstream, 3).await;

    gate.open();
    for task in [anonymous, tenant, elsewhere] {
        assert!(ok(&task.await.unwrap()));
    }
    let mut paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    paths.sort();
    assert_eq!(paths, ["/export/1", "/export/3", "/other"]);
    assert!(
        ok(&answer(addr, &get("/export/4", None)).await),
        "the slot came back"
    );
}

#[tokio::test]
async fn a_limit_set_through_the_admin_api_applies_without_restart() {
    let gate = Gate::new();
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::gated(&gate, Step::ok("done"))).await;
    let options = GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".to_owned(), ADMIN_TOKEN.to_owned())],
        ..GatewayOptions::default()
    };
    let gateway = GatewayProcess::start_with(
        BIN,
        &config(&upstream, "", &tenant("acme", ""), ""),
        options,
    )
    .await;
    let addr = gateway.addr;

    // One request in flight before the limit exists: it still counts after the reload.
    let first = in_flight(addr, get("/first", Some("acme-key-0001")));
    upstream_reached(&upstream, 1).await;
    let patched = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .patch(format!(
            "{}/admin/v1/tenants/acme/quota",
            gateway.admin_url()
        ))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({ "max_in_flight": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    let view: Value = patched.json().await.unwrap();
    assert_eq!(view["max_in_flight"], 1);

    let refused = answer(addr, &get("/second", Some("acme-key-0001"))).await;
    assert_concurrency_limited(&refused, 1, "tenant");
    gate.open();
    assert!(ok(&first.await.unwrap()));
    assert!(ok(
        &answer(addr, &get("/third", Some("acme-key-0001"))).await
    ));
    let paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    assert_eq!(paths, ["/first", "/third"]);
}

#[tokio::test]
async fn critical_routes_are_served_from_the_reserve_when_normal_ones_are_shed() {
    let gate = Gate::new();
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::gated(&gate, Step::ok("done"))).await;
    // One anonymous caller fills the server-wide cap here: no per-caller share.
    let server = "load_shed_limit = 2\ncritical_reserve = 0.5\ncaller_share = 1.0";
    let routes = "[[routes]]\nprefix = \"/critical\"\nupstream = \"u\"\npriority = \"critical\"\n";
    let gateway = GatewayProcess::start(BIN, &config(&upstream, server, "", routes)).await;
    let addr = gateway.addr;

    let normal = in_flight(addr, get("/normal", None));
    upstream_reached(&upstream, 1).await;
    let shed = answer(addr, &get("/normal/shed", None)).await;
    assert_eq!(parse_status(&shed), Some(503), "{}", head(&shed));
    assert_eq!(header(&shed, "retry-after").as_deref(), Some("1"));

    let critical = in_flight(addr, get("/critical/1", None));
    upstream_reached(&upstream, 2).await;
    let over = answer(addr, &get("/critical/2", None)).await;
    assert_eq!(
        parse_status(&over),
        Some(503),
        "the cap itself holds for critical routes"
    );

    gate.open();
    assert!(ok(&normal.await.unwrap()));
    assert!(ok(&critical.await.unwrap()));
    let paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    assert_eq!(paths, ["/normal", "/critical/1"]);
}
