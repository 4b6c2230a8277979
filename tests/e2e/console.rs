//! The admin console through the real binary: its assets' security headers over raw
//! sockets, not served on the proxy port, the API still 401 without the token; and a real
//! headless Chromium (Debian's package, through chromedriver) logging in, creating a tenant,
//! setting a quota (with the API's field messages shown), issuing and revoking keys, and
//! watching the 429 count rise on the usage chart while the tenant is driven over its limit
//! through the proxy; setting and clearing a tenant's WebSocket limits; and the dead
//! letters of an asynchronous route listed, inspected, replayed (the upstream receives the
//! message again) and purged.
//!
//! With `PORTCULLIS_CONSOLE_SCREENSHOTS=<dir>` the browser test also saves a PNG of every
//! page there (`scripts/console-screenshots.sh` refreshes `docs/console/`).

pub(crate) mod webdriver;

use std::path::PathBuf;

use portcullis_testkit::gateway::{raw_request, GatewayOptions, GatewayProcess};
use portcullis_testkit::redis::RedisServer;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use serde_json::{json, Value};

use crate::async_delivery::{accept, config as async_config, header};
use crate::common::{client, single_route_config, BIN};
use webdriver::Browser;

const TOKEN: &str = "e2e-console-token-0123456789";
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn with_token() -> GatewayOptions {
    GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".to_owned(), TOKEN.to_owned())],
        ..GatewayOptions::default()
    }
}

async fn start(upstream: &ScriptedUpstream) -> GatewayProcess {
    GatewayProcess::start_with(BIN, &single_route_config(&upstream.url(), ""), with_token()).await
}

/// A raw `GET path` to `addr`; the response head (lowercased) and body.
async fn raw_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    let bytes = raw_request(addr, request.as_bytes())
        .await
        .expect("an answer");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.to_ascii_lowercase(), body.to_owned())
}

#[tokio::test]
async fn console_assets_carry_the_csp_and_are_not_on_the_proxy_port() {
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::ok("upstream says hi")).await;
    let gw = start(&upstream).await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let (head, body) = raw_get(gw.admin_addr, path).await;
        assert!(head.starts_with("http/1.1 200"), "{path}: {head}");
        assert!(
            head.contains(&format!("content-type: {kind}")),
            "{path}: {head}"
        );
        assert!(
            head.contains(&format!(
                "content-security-policy: {}",
                CSP.to_ascii_lowercase()
            )),
            "{path}: {head}"
        );
        assert!(head.contains("x-content-type-options: nosniff"), "{path}");
        assert!(head.contains("referrer-policy: no-referrer"), "{path}");
        assert!(head.contains("x-frame-options: deny"), "{path}");
        assert!(
            !head.contains("set-cookie"),
            "{path}: the console sets no cookie"
        );
        assert!(!body.is_empty());
    }
    // No inline script or style for the CSP to forbid: the page's one script is external.
    let (_, html) = raw_get(gw.admin_addr, "/console").await;
    assert!(html.contains(r#"<script type="module" src="/console/app.js"></script>"#));
    assert_eq!(html.matches("<script").count(), 1);
    assert!(!html.contains("<style") && !html.contains("style="));
    // The token field has no name: a form submitted without the script sends no token.
    assert!(html.contains(r#"<input id="token" type="password""#));
    assert!(!html.contains(r#"name="token""#));

    // The proxy port does not serve the console: /console is an ordinary path there,
    // proxied to the upstream like any other.
    let (head, body) = raw_get(gw.addr, "/console").await;
    assert!(!head.contains("content-security-policy"), "{head}");
    assert_eq!(body, "upstream says hi");
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1, "the upstream received the proxied request");
    assert_eq!(hits[0].uri.path(), "/console");

    // The API behind the console still wants the token, the new endpoints included.
    for path in [
        "/admin/v1/tenants",
        "/admin/v1/usage/throttled",
        "/admin/v1/tenants/x/usage/history",
    ] {
        let (head, body) = raw_get(gw.admin_addr, path).await;
        assert!(head.starts_with("http/1.1 401"), "{path}: {head}");
        assert!(head.contains("content-type: application/problem+json"));
        assert!(body.contains("admin-unauthorized"));
    }
}

/// Where to save screenshots, if asked.
fn screenshot_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("PORTCULLIS_CONSOLE_SCREENSHOTS")?);
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    Some(dir)
}

async fn snap(browser: &Browser, name: &str) {
    if let Some(dir) = screenshot_dir() {
        // Let the page settle (fonts, the chart's first poll) before the picture.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        browser.screenshot(&dir.join(format!("{name}.png"))).await;
    }
}

/// A proxied GET with `key`; the status.
async fn proxied(gw: &GatewayProcess, key: &str) -> u16 {
    client()
        .get(format!("{}/orders", gw.url()))
        .header("x-api-key", key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn admin_get(gw: &GatewayProcess, path: &str) -> (u16, Value) {
    let response = client()
        .get(format!("{}/admin/v1{path}", gw.admin_url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Waits for the first bucket row to read `arguments[0]` with its meter at `arguments[1]`,
/// in the region `arguments[2]` as the HTML `<meter>` rules place it (`optimum`: the
/// value is in the region holding `optimum`; `worst`: at the far end from it).
const BUCKET_METER: &str = "
    const row = document.querySelector('#bucket-table tbody tr');
    const m = row && row.querySelector('meter');
    if (!m || row.cells[2].textContent !== arguments[0] || m.value !== arguments[1]) return false;
    const region = (v) => (v < m.low ? 'low' : v > m.high ? 'high' : 'mid');
    const good = region(m.optimum), here = region(m.value);
    const state = here === good ? 'optimum' : (here === 'mid' || good === 'mid') ? 'suboptimum' : 'worst';
    return state === arguments[2];";

#[tokio::test]
async fn a_browser_administers_a_tenant_and_sees_its_429s_on_the_chart() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("ok")).await;
    let gw = start(&upstream).await;
    let browser = Browser::start().await;
    let console = format!("{}/console", gw.admin_url());

    // Sign in through the form.
    browser.goto(&console).await;
    snap(&browser, "login").await;
    browser.fill("#token", "not-the-token-at-all").await;
    browser.click("#login button[type=submit]").await;
    let refused = browser.text("#login-error").await;
    assert!(refused.contains("refused"), "{refused}");
    browser.fill("#token", TOKEN).await;
    browser.click("#login button[type=submit]").await;
    browser.find("#page-tenants").await;

    // Create a tenant; a second one to delete later.
    for (id, name) in [("acme", "Acme Corp"), ("scratch", "To delete")] {
        browser.fill("#tenant-create [data-field=id]", id).await;
        browser.fill("#tenant-create [data-field=name]", name).await;
        browser.click("#tenant-create button[type=submit]").await;
        browser
            .wait_until(
                "the new tenant in the list",
                "return !!document.querySelector(`#tenant-table tr[data-tenant='${arguments[0]}']`);",
                json!([id]),
            )
            .await;
    }
    // Search narrows the list.
    browser.fill("#tenant-search", "ACM").await;
    browser
        .wait_until(
            "search to keep only acme",
            "return document.querySelectorAll('#tenant-table tr[data-tenant]').length === 1 && !!document.querySelector(\"tr[data-tenant='acme']\");",
            json!([]),
        )
        .await;

    // Set a quota; an invalid one first, to see the API's field-by-field messages.
    browser.click("#tenant-table a[data-open=acme]").await;
    browser.fill("#quota-form [data-field=burst]", "0").await;
    browser.fill("#quota-form [data-field=per]", "soon").await;
    browser.click("#quota-form button[type=submit]").await;
    let burst_error = browser.text("#quota-form [data-error=burst]").await;
    let per_error = browser.text("#quota-form [data-error=per]").await;
    assert!(burst_error.starts_with("burst "), "{burst_error}");
    assert!(per_error.starts_with("per "), "{per_error}");
    snap(&browser, "tenants").await;
    browser.fill("#quota-form [data-field=rate]", "1").await;
    browser.fill("#quota-form [data-field=per]", "1m").await;
    browser.fill("#quota-form [data-field=burst]", "3").await;
    browser
        .fill("#quota-form [data-field=daily_quota]", "1000")
        .await;
    browser.click("#quota-form button[type=submit]").await;
    browser
        .wait_until(
            "the saved quota in the list",
            "const r = document.querySelector(\"tr[data-tenant='acme']\"); return !!r && r.cells[2].textContent === '1/1m';",
            json!([]),
        )
        .await;
    let (_, quota) = admin_get(&gw, "/tenants/acme/quota").await;
    assert_eq!(
        (
            &quota["rate"],
            &quota["per"],
            &quota["burst"],
            &quota["daily_quota"]
        ),
        (&json!(1), &json!("1m"), &json!(3), &json!(1000))
    );

    // Delete the scratch tenant, with confirmation.
    browser.fill("#tenant-search", "").await;
    browser.click("#tenant-table a[data-open=scratch]").await;
    browser
        .wait_until(
            "scratch opened",
            "return document.getElementById('detail-id').textContent === 'scratch';",
            json!([]),
        )
        .await;
    browser.click("#tenant-delete").await;
    assert!(browser.text("#delete-confirm").await.contains("scratch"));
    browser.click("#delete-yes").await;
    browser
        .wait_until(
            "scratch gone from the list",
            "return !document.querySelector(\"tr[data-tenant='scratch']\") && !!document.querySelector(\"tr[data-tenant='acme']\");",
            json!([]),
        )
        .await;
    assert_eq!(admin_get(&gw, "/tenants/scratch").await.0, 404);

    // Issue two keys (plaintext shown once), revoke the first.
    browser.goto(&format!("{console}#keys")).await;
    browser.fill("#keys-tenant", "acme").await;
    let mut keys = Vec::new();
    for n in 1..=2 {
        browser.click("#key-issue").await;
        let key = browser
            .wait_until(
                "a new key shown",
                "const t = document.getElementById('issued-key').textContent; return t && !arguments[0].includes(t) ? t : null;",
                json!([keys.clone()]),
            )
            .await;
        keys.push(key.as_str().unwrap().to_owned());
        browser
            .wait_until(
                "the key listed",
                "return document.querySelectorAll('#key-table tr[data-key]').length === arguments[0];",
                json!([n]),
            )
            .await;
    }
    browser.click("#copy-key").await;
    browser.find("#copied").await;
    snap(&browser, "keys").await;
    let first_id = browser
        .eval(
            "return document.querySelector('#key-table tr[data-key]').dataset.key;",
            json!([]),
        )
        .await;
    let (_, listed) = admin_get(&gw, "/tenants/acme/keys").await;
    let first = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"].as_u64().map(|id| id.to_string()).as_deref() == first_id.as_str())
        .unwrap()
        .clone();
    let revoked_key = keys
        .iter()
        .find(|k| k.starts_with(first["prefix"].as_str().unwrap()))
        .unwrap()
        .clone();
    let live_key = keys.iter().find(|k| **k != revoked_key).unwrap().clone();
    browser
        .click(&format!(
            "#key-table button[data-revoke='{first_id}']",
            first_id = first_id.as_str().unwrap()
        ))
        .await;
    browser
        .wait_until(
            "the key shown revoked",
            "const r = document.querySelector(`#key-table tr[data-key='${arguments[0]}']`); return !!r && r.textContent.includes('revoked');",
            json!([first_id]),
        )
        .await;
    assert_eq!(
        proxied(&gw, &revoked_key).await,
        401,
        "the revoked key is refused"
    );

    // Usage: watch the chart while the live key goes over its limit through the proxy.
    browser.goto(&format!("{console}#usage")).await;
    browser.fill("#usage-tenant", "acme").await;
    browser.click("#usage-form button[type=submit]").await;
    browser
        .wait_until(
            "the chart drawn with no 429s",
            "return document.getElementById('chart').dataset.total === '0' && !!document.querySelector('#chart svg');",
            json!([]),
        )
        .await;
    // Tokens left, the right way round: an idle tenant's full bucket (3 / 3) is a full meter
    // in its optimum (green) region, not a full bar in the worst one.
    browser
        .wait_until(
            "the idle bucket's meter full and good",
            BUCKET_METER,
            json!(["3 / 3", 1.0, "optimum"]),
        )
        .await;
    let hits_before = upstream.hit_count();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(proxied(&gw, &live_key).await);
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429, 429, 429, 429, 429],
        "burst 3, then the limiter's 429s"
    );
    assert_eq!(
        upstream.hit_count() - hits_before,
        3,
        "only admitted requests reached the upstream"
    );
    let window = browser
        .wait_until(
            "the chart to show the 7 429s",
            "const c = document.getElementById('chart'); return c.dataset.total === '7' ? c.dataset.window : null;",
            json!([]),
        )
        .await;
    assert_eq!(window, json!("7"), "the chart's bars add up to the 429s");
    let bars: Value = browser
        .eval(
            "return [...document.querySelectorAll('#chart rect.bar')].map(r => Number(r.dataset.count));",
            json!([]),
        )
        .await;
    let bars: Vec<u64> = serde_json::from_value(bars).unwrap();
    assert_eq!(bars.len(), 60);
    assert_eq!(bars.iter().sum::<u64>(), 7);
    // A log scale with the peak labelled: later small bars stay readable after a spike.
    let peak = browser
        .eval(
            "const c = document.getElementById('chart'); const p = c.querySelector('text.peak'); return c.dataset.scale + ':' + (p ? p.textContent : '');",
            json!([]),
        )
        .await;
    assert_eq!(peak, json!("log:7"));
    // The throttled tenant's bucket is empty (0 / 3): an empty meter, below its low mark.
    browser
        .wait_until(
            "the throttled bucket's meter empty and bad",
            BUCKET_METER,
            json!(["0 / 3", 0.0, "worst"]),
        )
        .await;
    browser
        .wait_until(
            "acme among the top throttled",
            "const r = document.querySelector(\"#throttled-table tr[data-tenant='acme']\"); return !!r && r.cells[1].textContent === '7';",
            json!([]),
        )
        .await;
    // The period quota counts the admitted requests.
    browser
        .wait_until(
            "the daily quota's use",
            "const r = document.querySelector('#period-table tbody tr'); return !!r && r.cells[1].textContent === '3' && r.cells[2].textContent === '1000';",
            json!([]),
        )
        .await;
    snap(&browser, "usage").await;

    // The tenant list shows who is being throttled now: acme's 7 429s, in its own column.
    browser.goto(&format!("{console}#tenants")).await;
    browser
        .wait_until(
            "acme's throttling in the tenant list",
            "const c = document.querySelector(\"#tenant-table td[data-throttled='acme']\"); return !!c && c.textContent === '7' && c.classList.contains('throttled') && document.querySelector('#tenant-table thead').textContent.includes('Throttled');",
            json!([]),
        )
        .await;

    // The other pages render from the API.
    browser.goto(&format!("{console}#upstreams")).await;
    browser
        .wait_until(
            "the upstream row",
            "const r = document.querySelector(\"#upstream-table tr[data-upstream='u']\"); return !!r && r.textContent.includes('closed');",
            json!([]),
        )
        .await;
    snap(&browser, "upstreams").await;
    browser.goto(&format!("{console}#audit")).await;
    browser
        .eval(
            "document.getElementById('audit-action').value = 'key.revoke';",
            json!([]),
        )
        .await;
    browser.click("#audit-form button[type=submit]").await;
    browser
        .wait_until(
            "one key.revoke entry by the console",
            "const rows = [...document.querySelectorAll('#audit-table tbody tr')]; return rows.length === 1 && rows[0].textContent.includes('admin-token:console');",
            json!([]),
        )
        .await;
    browser
        .eval(
            "document.getElementById('audit-action').value = '';",
            json!([]),
        )
        .await;
    browser.click("#audit-form button[type=submit]").await;
    browser
        .wait_until(
            "the whole log",
            "return document.querySelectorAll('#audit-table tbody tr').length >= 7;",
            json!([]),
        )
        .await;
    snap(&browser, "audit").await;
    browser.goto(&format!("{console}#idempotency")).await;
    browser.fill("#idem-tenant", "acme").await;
    browser.fill("#idem-route", "/").await;
    browser.fill("#idem-key", "order-123").await;
    browser.click("#idem-form button[type=submit]").await;
    browser
        .wait_until(
            "the lookup's 404 shown",
            "const f = document.getElementById('flash'); return !f.hidden && f.textContent.includes('no idempotency record');",
            json!([]),
        )
        .await;
    snap(&browser, "idempotency").await;

    // The token never went into a URL: not the page's, not any request's the page made,
    // and not the gateway's log lines (which name request paths).
    let urls = browser
        .eval(
            "return [location.href, ...performance.getEntries().map(e => e.name)].join('\\n');",
            json!([]),
        )
        .await;
    let urls = urls.as_str().unwrap();
    assert!(urls.contains("/admin/v1/tenants"), "{urls}");
    assert!(
        !urls.contains(TOKEN),
        "the token appeared in a URL:\n{urls}"
    );
    assert!(
        !gw.logs().contains(TOKEN),
        "the token appeared in the gateway log"
    );
    let cookies = browser.eval("return document.cookie;", json!([])).await;
    assert_eq!(cookies, json!(""), "the console sets no cookie");
}

#[tokio::test]
async fn top_throttled_sums_the_replicas_sharing_redis() {
    // A private Redis: other tests' replicas publish to the shared one. A generous round-trip
    // timeout: on a loaded machine a missed 50 ms would fail open to a local share.
    let redis = RedisServer::start().await;
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("ok")).await;
    let config = format!(
        "[storage]\nstate = \"{}\"\nstate_timeout = \"1s\"\n\n[[tenants]]\nid = \"fleet\"\napi_keys = [\"fleet-key-0001\"]\nrate = 1\nper = \"60s\"\nburst = 2\n\n{}",
        redis.url(),
        single_route_config(&upstream.url(), "")
    );
    let a = GatewayProcess::start_with(BIN, &config, with_token()).await;
    let b = GatewayProcess::start_with(BIN, &config, with_token()).await;
    // One bucket in Redis for both: 2 admitted in all, then 429s on either replica.
    let mut statuses = Vec::new();
    for gw in [&a, &a, &a, &a, &a, &b, &b, &b, &b] {
        statuses.push(proxied(gw, "fleet-key-0001").await);
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(upstream.hit_count(), 2);

    // Each replica publishes every 5 s; bounded wait for both to see the other's counts.
    for (gw, own) in [(&a, 3), (&b, 4)] {
        let (_, usage) = admin_get(gw, "/tenants/fleet/usage").await;
        assert_eq!(
            usage["rejected_total"], own,
            "each replica counts its own 429s"
        );
        let mut last = Value::Null;
        for _ in 0..100 {
            let (status, top) = admin_get(gw, "/usage/throttled").await;
            assert_eq!(status, 200);
            last = top;
            if last["items"] == json!([{ "tenant": "fleet", "rejected": 7 }]) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert_eq!(last["scope"], "fleet", "{last}");
        assert_eq!(last["replicas"], 2, "{last}");
        assert_eq!(
            last["items"],
            json!([{ "tenant": "fleet", "rejected": 7 }]),
            "the fleet's sum"
        );
    }
    drop(redis);
}

/// Signs in through the form with the right token; the tenants page is shown.
async fn sign_in(browser: &Browser, console: &str) {
    browser.goto(console).await;
    browser.fill("#token", TOKEN).await;
    browser.click("#login button[type=submit]").await;
    browser.find("#page-tenants").await;
}

async fn admin_send(
    gw: &GatewayProcess,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = client()
        .request(method, format!("{}/admin/v1{path}", gw.admin_url()))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_browser_sets_and_clears_a_tenants_websocket_limits() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("ok")).await;
    let gw = start(&upstream).await;
    let (code, created) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/tenants",
        Some(json!({"id": "sockets", "rate": 10, "burst": 20})),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let browser = Browser::start().await;
    let console = format!("{}/console", gw.admin_url());
    sign_in(&browser, &console).await;
    browser
        .wait_until(
            "the tenant listed without WebSocket limits",
            "const c = document.querySelector(\"#tenant-table td[data-websockets='sockets']\"); return !!c && c.textContent === '–';",
            json!([]),
        )
        .await;
    browser.click("#tenant-table a[data-open=sockets]").await;
    browser
        .wait_until(
            "sockets opened",
            "return document.getElementById('detail-id').textContent === 'sockets';",
            json!([]),
        )
        .await;

    // Invalid values: the API's 422, field by field, and nothing stored.
    browser
        .fill("#quota-form [data-field=max_websockets]", "0")
        .await;
    browser
        .fill("#quota-form [data-field=websocket_idle_timeout]", "soon")
        .await;
    browser.click("#quota-form button[type=submit]").await;
    let count_error = browser
        .wait_until(
            "the max_websockets message",
            "const t = document.querySelector('#quota-form [data-error=max_websockets]').textContent; return t || null;",
            json!([]),
        )
        .await;
    let idle_error = browser
        .text("#quota-form [data-error=websocket_idle_timeout]")
        .await;
    assert!(
        count_error.as_str().unwrap().starts_with("max_websockets "),
        "{count_error}"
    );
    assert!(
        idle_error.starts_with("websocket_idle_timeout "),
        "{idle_error}"
    );
    let (_, tenant) = admin_get(&gw, "/tenants/sockets").await;
    assert_eq!(tenant["max_websockets"], Value::Null, "{tenant}");

    // Set all three: the admin API reads what the console wrote.
    browser
        .fill("#quota-form [data-field=max_websockets]", "50")
        .await;
    browser
        .fill("#quota-form [data-field=websocket_idle_timeout]", "5m")
        .await;
    browser
        .fill("#quota-form [data-field=websocket_max_lifetime]", "2h")
        .await;
    browser.click("#quota-form button[type=submit]").await;
    browser
        .wait_until(
            "the limits in the tenant list",
            "const c = document.querySelector(\"#tenant-table td[data-websockets='sockets']\"); return !!c && c.textContent === '50 · idle 5m · max 2h';",
            json!([]),
        )
        .await;
    let (_, tenant) = admin_get(&gw, "/tenants/sockets").await;
    assert_eq!(
        (
            &tenant["max_websockets"],
            &tenant["websocket_idle_timeout"],
            &tenant["websocket_max_lifetime"]
        ),
        (&json!(50), &json!("5m"), &json!("2h")),
        "{tenant}"
    );
    // The form shows the stored values (it is re-read after the save).
    let shown = browser
        .eval(
            "return ['max_websockets', 'websocket_idle_timeout', 'websocket_max_lifetime'].map(f => document.querySelector(`#quota-form [data-field=${f}]`).value);",
            json!([]),
        )
        .await;
    assert_eq!(shown, json!(["50", "5m", "2h"]));
    snap(&browser, "tenant-websockets").await;

    // Clear one by emptying its input: null for the API, the others kept.
    browser
        .fill("#quota-form [data-field=max_websockets]", "")
        .await;
    browser.click("#quota-form button[type=submit]").await;
    browser
        .wait_until(
            "the cleared limit in the tenant list",
            "const c = document.querySelector(\"#tenant-table td[data-websockets='sockets']\"); return !!c && c.textContent === 'idle 5m · max 2h';",
            json!([]),
        )
        .await;
    let (_, tenant) = admin_get(&gw, "/tenants/sockets").await;
    assert_eq!(
        (
            &tenant["max_websockets"],
            &tenant["websocket_idle_timeout"],
            &tenant["websocket_max_lifetime"]
        ),
        (&Value::Null, &json!("5m"), &json!("2h")),
        "{tenant}"
    );
    let (_, audit) = admin_get(&gw, "/audit?tenant=sockets&action=quota.update").await;
    assert_eq!(
        audit["items"].as_array().map(Vec::len),
        Some(2),
        "two saves audited, the refused one not: {audit}"
    );
}

/// Waits (bounded) until the admin API reads delivery `id` in `state`.
async fn until_delivery(gw: &GatewayProcess, id: &str, state: &str) {
    for _ in 0..300 {
        let (_, json) = admin_get(gw, &format!("/deliveries/{id}")).await;
        if json["state"] == state {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("delivery {id} never {state}");
}

#[tokio::test]
async fn a_browser_lists_inspects_replays_and_purges_dead_letters() {
    // The upstream refuses the first two deliveries with a 400 (dead at once), then accepts.
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![Step::status(400), Step::status(400)],
        Step::ok("ok"),
    )
    .await;
    let gw = GatewayProcess::start_with(BIN, &async_config(&upstream, "", ""), with_token()).await;
    let (first, _) = accept(&gw, &[("x-api-key", "key-acme-0001")], "first-event").await;
    until_delivery(&gw, &first, "dead").await;
    let (second, _) = accept(&gw, &[("x-api-key", "key-acme-0001")], "second-event").await;
    until_delivery(&gw, &second, "dead").await;
    assert_eq!(upstream.hit_count(), 2);

    let browser = Browser::start().await;
    let console = format!("{}/console", gw.admin_url());
    sign_in(&browser, &console).await;
    browser.goto(&format!("{console}#deliveries")).await;
    // The queue filter is sent: an unknown queue lists nothing.
    browser.fill("#delivery-queue", "no-such-queue").await;
    browser.click("#delivery-form button[type=submit]").await;
    browser
        .wait_until(
            "an empty listing",
            "const b = document.querySelector('#delivery-table tbody'); return b.textContent.includes('No deliveries match') && !b.querySelector('tr[data-delivery]');",
            json!([]),
        )
        .await;
    // Both listed under "dead" (the default filter) in queue hooks.
    browser.fill("#delivery-queue", "hooks").await;
    browser.click("#delivery-form button[type=submit]").await;
    browser
        .wait_until(
            "both dead letters listed",
            "const rows = [...document.querySelectorAll('#delivery-table tr[data-delivery]')]; return rows.length === 2 && rows.every(r => r.dataset.state === 'dead') && [...arguments].every(id => rows.some(r => r.dataset.delivery === id));",
            json!([first, second]),
        )
        .await;
    assert_eq!(
        browser
            .eval(
                "return document.getElementById('delivery-state').value;",
                json!([])
            )
            .await,
        json!("dead")
    );

    // The detail: the attempt (400, with its latency), the final reason, the stored headers
    // without the credential, the small payload inline.
    browser
        .click(&format!("#delivery-table a[data-open-delivery='{first}']"))
        .await;
    let detail = browser
        .wait_until(
            "the first dead letter's detail",
            "const d = document.getElementById('delivery-detail'); if (d.hidden || d.dataset.delivery !== arguments[0]) return null;
             const rows = [...document.querySelectorAll('#attempt-table tr[data-attempt]')];
             return { attempts: rows.map(r => [r.cells[0].textContent, r.cells[2].textContent, r.cells[3].textContent.endsWith(' ms'), r.cells[1].textContent.length > 0]),
                      reason: document.querySelector(\"#delivery-fields [data-field='final reason']\").textContent,
                      headers: document.getElementById('header-table').textContent,
                      payload: document.getElementById('payload').hidden ? null : document.getElementById('payload').textContent };",
            json!([first]),
        )
        .await;
    assert_eq!(
        detail["attempts"],
        json!([["1", "HTTP 400", true, true]]),
        "{detail}"
    );
    assert!(
        detail["reason"].as_str().unwrap().contains("400"),
        "{detail}"
    );
    assert_eq!(detail["payload"], "first-event", "{detail}");
    assert!(
        !detail["headers"]
            .as_str()
            .unwrap()
            .contains("key-acme-0001"),
        "{detail}"
    );
    snap(&browser, "deliveries").await;

    // Replay, confirmed: the upstream receives it again, with the same Idempotency-Key.
    browser.click("#delivery-replay").await;
    assert!(browser
        .text("#delivery-confirm-text")
        .await
        .contains(&first));
    browser.click("#delivery-yes").await;
    crate::async_delivery::until("the upstream received the replay", || {
        upstream
            .hits()
            .iter()
            .filter(|h| &h.body[..] == b"first-event")
            .count()
            == 2
    })
    .await;
    let keys: Vec<String> = upstream
        .hits()
        .iter()
        .filter(|h| &h.body[..] == b"first-event")
        .map(|h| header(h, "idempotency-key").to_owned())
        .collect();
    assert_eq!(
        keys,
        [format!("delivery-{first}"), format!("delivery-{first}")]
    );
    browser
        .wait_until(
            "the detail shows it delivered, the dead list no longer has it",
            "const d = document.getElementById('delivery-detail'); const rows = [...document.querySelectorAll('#delivery-table tr[data-delivery]')];
             return d.dataset.state === 'delivered' && document.querySelectorAll('#attempt-table tr[data-attempt]').length === 2 && rows.length === 1 && rows[0].dataset.delivery === arguments[1];",
            json!([first, second]),
        )
        .await;

    // Purge: nothing happens until confirmed; then it is gone, never sent again.
    browser
        .click(&format!("#delivery-table a[data-open-delivery='{second}']"))
        .await;
    browser
        .wait_until(
            "the second dead letter's detail",
            "return document.getElementById('delivery-detail').dataset.delivery === arguments[0];",
            json!([second]),
        )
        .await;
    browser.click("#delivery-purge").await;
    assert!(browser
        .text("#delivery-confirm-text")
        .await
        .contains(&second));
    assert_eq!(
        admin_get(&gw, &format!("/deliveries/{second}")).await.0,
        200,
        "not purged before the confirmation"
    );
    browser.click("#delivery-yes").await;
    browser
        .wait_until(
            "the purged letter gone from the list and the detail closed",
            "return document.getElementById('delivery-detail').hidden && !document.querySelector('#delivery-table tr[data-delivery]');",
            json!([]),
        )
        .await;
    assert_eq!(
        admin_get(&gw, &format!("/deliveries/{second}")).await.0,
        404
    );
    assert_eq!(
        upstream
            .hits()
            .iter()
            .filter(|h| &h.body[..] == b"second-event")
            .count(),
        1,
        "a purged message is not delivered again"
    );

    // Bulk replay of what the filter matches (here the delivered message), confirmed.
    browser
        .eval(
            "document.getElementById('delivery-state').value = 'delivered';",
            json!([]),
        )
        .await;
    browser.click("#delivery-form button[type=submit]").await;
    browser
        .wait_until(
            "the delivered message listed",
            "const rows = [...document.querySelectorAll('#delivery-table tr[data-delivery]')]; return rows.length === 1 && rows[0].dataset.delivery === arguments[0];",
            json!([first]),
        )
        .await;
    browser.click("#delivery-replay-all").await;
    let scope = browser.text("#bulk-text").await;
    assert!(
        scope.contains("state delivered") && scope.contains("queue hooks"),
        "{scope}"
    );
    browser.click("#bulk-yes").await;
    crate::async_delivery::until("the upstream received the bulk replay", || {
        upstream
            .hits()
            .iter()
            .filter(|h| &h.body[..] == b"first-event")
            .count()
            == 3
    })
    .await;

    // Every change went through the admin API: audited as the console.
    let (_, audit) = admin_get(&gw, "/audit?actor=admin-token:console&limit=50").await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|e| e["action"].as_str()).collect())
        .unwrap_or_default();
    for action in ["delivery.replay", "delivery.purge", "delivery.replay_many"] {
        assert!(actions.contains(&action), "{action} not audited: {audit}");
    }
}
