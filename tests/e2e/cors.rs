//! CORS at the edge, tried from a real browser: headless Chromium opens a page on one
//! loopback origin and calls a gateway route on another. An allowed origin's preflighted PUT
//! reaches the upstream once (the preflight never does) and the page can read the rate-limit
//! guidance; a refused origin's preflighted call never leaves the browser, and its simple
//! GET's answer cannot be read. The scripted upstream records what reached it.

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use serde_json::{json, Value};

use crate::common::{client, BIN};
use crate::console::webdriver::Browser;

const KEY: &str = "cors-key-0001";

/// A page served from its own origin (the scripted server's address).
async fn page() -> ScriptedUpstream {
    ScriptedUpstream::start_with_fallback(
        vec![],
        Step::respond(
            200,
            &[("content-type", "text/html")],
            "<!doctype html><title>app</title><p>app</p>",
        ),
    )
    .await
}

fn config(upstream: &str, allowed_origin: &str) -> String {
    format!(
        r#"[[tenants]]
id = "web"
api_keys = ["{KEY}"]
rate = 100
per = "1s"
burst = 100

[[upstreams]]
name = "u"
endpoints = ["{upstream}"]
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/api"
upstream = "u"
cors = {{ allow_origins = ["{allowed_origin}"], max_age = "1m" }}
"#
    )
}

/// Runs `fetch(url, init)` in the page; returns `{status, remaining, allow_origin, body}` or
/// `{failed}`.
async fn fetch(browser: &Browser, url: &str, init: Value) -> Value {
    browser
        .eval(
            "window.__r = null; \
             fetch(arguments[0], arguments[1]) \
               .then(async r => { window.__r = { status: r.status, \
                   remaining: r.headers.get('x-ratelimit-remaining'), \
                   request_id: r.headers.get('x-request-id'), body: await r.text() }; }) \
               .catch(e => { window.__r = { failed: String(e) }; }); \
             return true;",
            json!([url, init]),
        )
        .await;
    browser
        .wait_until("the fetch to settle", "return window.__r;", json!([]))
        .await
}

#[tokio::test]
async fn a_browser_on_an_allowed_origin_calls_the_route_and_a_refused_one_cannot() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("{\"ok\":true}")).await;
    let allowed_page = page().await;
    let refused_page = page().await;
    let allowed_origin = allowed_page.url();
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), &allowed_origin)).await;
    // Another host name than the pages': a cross-origin call.
    let api = format!("http://localhost:{}/api/orders", gateway.addr.port());
    let put = json!({
        "method": "PUT",
        "headers": { "content-type": "application/json", "x-api-key": KEY },
        "body": "{\"item\":1}",
    });
    let browser = Browser::start().await;

    // Allowed: the preflight is answered at the edge, the PUT goes through, and the page
    // reads the exposed rate-limit field.
    browser.goto(&allowed_origin).await;
    let result = fetch(&browser, &api, put.clone()).await;
    assert_eq!(result["status"], 200, "{result}");
    assert_eq!(result["body"], "{\"ok\":true}");
    assert!(
        result["remaining"].as_str().is_some(),
        "X-RateLimit-Remaining exposed: {result}"
    );
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1, "only the PUT reached the upstream");
    assert_eq!(hits[0].method, http::Method::PUT);
    assert_eq!(hits[0].headers["origin"], allowed_origin.as_str());

    // Refused: the preflight gets no CORS fields, so the browser never sends the PUT.
    browser.goto(&refused_page.url()).await;
    let result = fetch(&browser, &api, put).await;
    assert!(
        result["failed"].as_str().is_some(),
        "the browser blocked it: {result}"
    );
    assert_eq!(upstream.hit_count(), 1, "nothing more reached the upstream");
    // A simple GET is sent (CORS does not stop sending it) but its answer stays unreadable.
    browser.goto(&refused_page.url()).await;
    let result = fetch(&browser, &api, json!({})).await;
    assert!(result["failed"].as_str().is_some(), "unreadable: {result}");
}

#[tokio::test]
async fn preflights_are_answered_at_the_edge_and_charge_no_one() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("ok")).await;
    let origin = "https://app.example.com";
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), origin)).await;
    let url = gateway.url() + "/api/orders";
    let preflight = |origin: &str, method: &str, headers: &str| {
        client()
            .request(reqwest::Method::OPTIONS, &url)
            .header("origin", origin)
            .header("access-control-request-method", method)
            .header("access-control-request-headers", headers)
            .send()
    };
    // Far more preflights than the tenant's burst: none is charged, none is sent upstream.
    for _ in 0..150 {
        let response = preflight(origin, "PUT", "content-type, x-api-key")
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
        let fields = response.headers();
        assert_eq!(fields["access-control-allow-origin"], origin);
        assert!(fields["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("PUT"));
        assert_eq!(fields["access-control-max-age"], "60");
        assert!(fields["vary"].to_str().unwrap().contains("Origin"));
    }
    assert_eq!(upstream.hit_count(), 0);
    let refused = preflight("https://evil.example.net", "PUT", "content-type")
        .await
        .unwrap();
    assert_eq!(refused.status(), 204);
    assert!(!refused
        .headers()
        .contains_key("access-control-allow-origin"));
    let odd_header = preflight(origin, "PUT", "x-secret-debug").await.unwrap();
    assert!(!odd_header
        .headers()
        .contains_key("access-control-allow-origin"));
    // The tenant's whole burst is still there.
    let response = client()
        .get(&url)
        .header("x-api-key", KEY)
        .header("origin", origin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ratelimit-remaining"], "99");
    assert_eq!(response.headers()["access-control-allow-origin"], origin);
    assert_eq!(upstream.hit_count(), 1);
}
