//! Asynchronous routes on the embedded SQLite queue, against the real binary: the 202 comes
//! before the upstream is reached; a duplicate is answered from the dedupe record and
//! delivered once; a failing upstream is retried on the configured schedule (gaps read from
//! the upstream's own timestamps) with the same Idempotency-Key every time; a 400 is
//! dead-lettered at once and `dlq_messages_total` rises; a gateway killed with SIGKILL after
//! the 202 delivers the message once restarted.

use std::time::Duration;

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::{Gate, Hit, ScriptedUpstream, Step};

use crate::common::{client, BIN};

/// One asynchronous route `/hooks` (name `hooks`) toward `upstream`, with `delivery` extra
/// fields, a tenant `acme` (key `key-acme-0001`), and `extra` at the top of the file.
pub(crate) fn config(upstream: &ScriptedUpstream, delivery: &str, extra: &str) -> String {
    format!(
        "{extra}\n[[tenants]]\nid = \"acme\"\napi_keys = [\"key-acme-0001\"]\nrate = 1000\nper = \"1s\"\nburst = 1000\n\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nname = \"hooks\"\nprefix = \"/hooks\"\nupstream = \"u\"\ntimeout = \"2s\"\n\
         delivery = {{ mode = \"async\"{delivery} }}\n",
        upstream.url()
    )
}

/// Polls `done` every 50 ms, at most 30 s in all; panics with `what` when it never holds.
pub(crate) async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

pub(crate) fn header<'a>(hit: &'a Hit, name: &str) -> &'a str {
    hit.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// POSTs `body` to `/hooks/event` with `headers`; the 202's delivery id (asserted to be a
/// complete 202: header, Location, problem-style body).
pub(crate) async fn accept(
    gateway: &GatewayProcess,
    headers: &[(&str, &str)],
    body: &str,
) -> (String, reqwest::Response) {
    let mut request = client()
        .post(gateway.url() + "/hooks/event?x=1")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 202, "{:?}", response.headers());
    let id = response
        .headers()
        .get("portcullis-delivery-id")
        .and_then(|v| v.to_str().ok())
        .expect("Portcullis-Delivery-Id")
        .to_owned();
    let location = response
        .headers()
        .get("location")
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(location, format!("/_portcullis/deliveries/{id}"));
    (id, response)
}

pub(crate) async fn metric(gateway: &GatewayProcess, line_start: &str) -> f64 {
    let text = client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) async fn status_of(
    gateway: &GatewayProcess,
    id: &str,
    key: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut request = client().get(format!("{}/_portcullis/deliveries/{id}", gateway.url()));
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test]
async fn the_202_comes_before_the_upstream_answers_and_the_delivery_carries_the_derived_key() {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![Step::gated(&gate, Step::ok("done"))],
        Step::ok("done"),
    )
    .await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream, "", "")).await;
    let body = "{\"event\":\"paid\",\"amount\":12}";
    // The upstream holds its answer until the client has its 202.
    let (id, response) = accept(
        &gateway,
        &[
            ("x-api-key", "key-acme-0001"),
            ("authorization", "Bearer secret-token"),
            ("cookie", "s=1"),
            ("x-custom", "kept"),
        ],
        body,
    )
    .await;
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["status"], 202);
    assert_eq!(json["delivery_id"], id.as_str());
    assert_eq!(json["status_url"], format!("/_portcullis/deliveries/{id}"));
    assert!(json["type"]
        .as_str()
        .unwrap()
        .ends_with("delivery-accepted"));
    gate.open();
    until("the upstream answered the delivery", || {
        upstream.hits().iter().any(|h| h.answered == Some(200))
    })
    .await;
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    let hit = &hits[0];
    assert_eq!(hit.method, "POST");
    assert_eq!(hit.uri.to_string(), "/hooks/event?x=1");
    assert_eq!(&hit.body[..], body.as_bytes(), "payload byte for byte");
    assert_eq!(header(hit, "idempotency-key"), format!("delivery-{id}"));
    assert_eq!(header(hit, "portcullis-delivery-id"), id);
    assert_eq!(header(hit, "x-custom"), "kept");
    for credential in [
        "x-api-key",
        "authorization",
        "cookie",
        "portcullis-stored-client",
    ] {
        assert!(
            !hit.headers.contains_key(credential),
            "{credential} delivered: {:?}",
            hit.headers
        );
    }
    // The sender reads its status; nobody else does.
    let mut delivered = false;
    for _ in 0..100 {
        let (code, json) = status_of(&gateway, &id, Some("key-acme-0001")).await;
        assert_eq!(code, 200, "{json}");
        if json["state"] == "delivered" {
            delivered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(delivered, "never delivered per the status URL");
    assert_eq!(
        status_of(&gateway, &id, None).await.0,
        404,
        "anonymous reads another's status"
    );
    assert_eq!(
        status_of(&gateway, "no-such-id", Some("key-acme-0001"))
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn a_duplicate_gets_the_original_202_and_the_upstream_sees_one_request() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("done")).await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(&upstream, ", dedupe = \"header:X-Event-Id\"", ""),
    )
    .await;
    let (first, _) = accept(&gateway, &[("x-event-id", "evt_1")], "one").await;
    let (second, response) = accept(&gateway, &[("x-event-id", "evt_1")], "one again").await;
    assert_eq!(first, second, "the duplicate names the original delivery");
    assert_eq!(
        response
            .headers()
            .get("portcullis-duplicate")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    // A different event, accepted after: once it is delivered, the duplicate would have been
    // too had it been queued (one FIFO queue).
    let (other, _) = accept(&gateway, &[("x-event-id", "evt_2")], "two").await;
    until("both events delivered", || upstream.hit_count() >= 2).await;
    until("the later event delivered", || {
        upstream
            .hits()
            .iter()
            .any(|h| header(h, "portcullis-delivery-id") == other)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hits = upstream.hits();
    let bodies: Vec<_> = hits
        .iter()
        .map(|h| String::from_utf8_lossy(&h.body).into_owned())
        .collect();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(
        bodies.contains(&"one".to_owned()) && bodies.contains(&"two".to_owned()),
        "{bodies:?}"
    );
}

#[tokio::test]
async fn a_paced_route_delivers_each_message_once_even_when_its_turn_outlasts_a_lease() {
    // 4 s between starts; a lease lasts the route's 2 s deadline plus a margin. Three
    // messages accepted together: the third starts 8 s after the first, well past any lease
    // taken when the first started, so had it been leased then it would be due again and
    // delivered twice.
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("done")).await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(&upstream, ", max_rate = 0.25, max_in_flight = 4", ""),
    )
    .await;
    let mut ids = Vec::new();
    for body in ["one", "two", "three"] {
        ids.push(accept(&gateway, &[], body).await.0);
    }
    for _ in 0..300 {
        if upstream.hit_count() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One more spacing: a message leased twice would arrive again by then.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let delivered: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| header(h, "portcullis-delivery-id").to_owned())
        .collect();
    let mut sorted = delivered.clone();
    sorted.sort();
    ids.sort();
    assert_eq!(sorted, ids, "each message once: {delivered:?}");
    drop(gateway);
}

#[tokio::test]
async fn a_failing_upstream_is_retried_on_the_schedule_with_one_idempotency_key() {
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![Step::status(503), Step::status(500), Step::status(502)],
        Step::ok("done"),
    )
    .await;
    let delivery = ", max_retries = 3, schedule = [\"200ms\", \"400ms\", \"800ms\"]";
    let gateway = GatewayProcess::start(BIN, &config(&upstream, delivery, "")).await;
    let (id, _) = accept(&gateway, &[], "retry me").await;
    until("delivered on the fourth attempt", || {
        upstream.hits().iter().any(|h| h.answered == Some(200))
    })
    .await;
    let hits = upstream.hits();
    assert_eq!(hits.len(), 4, "{hits:?}");
    for hit in &hits {
        assert_eq!(header(hit, "idempotency-key"), format!("delivery-{id}"));
        assert_eq!(&hit.body[..], b"retry me");
    }
    for (i, step) in [200u64, 400, 800].iter().enumerate() {
        let gap = hits[i + 1].at.duration_since(hits[i].at);
        assert!(
            gap >= Duration::from_millis(*step),
            "retry {} after {gap:?} < {step} ms",
            i + 1
        );
    }
    assert!(metric(&gateway, "deliveries_succeeded_total{queue=\"hooks\"}").await >= 1.0);
}

#[tokio::test]
async fn a_400_is_dead_lettered_at_once_and_counted() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(400)).await;
    let gateway =
        GatewayProcess::start(BIN, &config(&upstream, ", schedule = [\"50ms\"]", "")).await;
    let dlq = "dlq_messages_total{queue=\"hooks\"}";
    assert_eq!(metric(&gateway, dlq).await, 0.0, "registered at zero");
    let (id, _) = accept(&gateway, &[], "refused").await;
    let mut dead = false;
    for _ in 0..300 {
        if metric(&gateway, dlq).await >= 1.0 {
            dead = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(dead, "dlq_messages_total never rose");
    let (_, json) = status_of(&gateway, &id, None).await;
    assert_eq!(json["state"], "dead", "{json}");
    assert!(
        json["reason"].as_str().unwrap_or_default().contains("400"),
        "{json}"
    );
    assert_eq!(upstream.hit_count(), 1, "a 400 is not retried");
    assert!(
        gateway.logs().contains("delivery dead-lettered"),
        "no error line"
    );
}

#[tokio::test]
async fn a_gateway_killed_after_the_202_delivers_once_restarted() {
    // The first attempt is held by the upstream and never answered: the gateway dies with it.
    let gate = Gate::new();
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![Step::gated(&gate, Step::ok("late"))],
        Step::ok("done"),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let queue = format!(
        "[storage]\nqueue = \"sqlite://{}\"\n",
        dir.path().join("queue.db").display()
    );
    let text = config(&upstream, "", &queue);
    let mut gateway = GatewayProcess::start(BIN, &text).await;
    let (id, _) = accept(&gateway, &[], "survive").await;
    until("the first attempt reached the upstream", || {
        upstream.hit_count() >= 1
    })
    .await;
    gateway.guard().signal("KILL");
    assert!(
        gateway
            .guard()
            .wait_exit(Duration::from_secs(10))
            .await
            .is_some(),
        "still running"
    );
    let gateway = GatewayProcess::start_with(BIN, &text, GatewayOptions::default()).await;
    // After the dead gateway's lease ends (timeout 2 s + margin), the new one delivers.
    // (The held first attempt is recorded as the answer it would have given: count hits.)
    until("redelivered after the restart", || {
        upstream.hit_count() >= 2
    })
    .await;
    let hits = upstream.hits();
    assert!(hits.len() >= 2, "{hits:?}");
    for hit in &hits {
        assert_eq!(
            header(hit, "idempotency-key"),
            format!("delivery-{id}"),
            "one key across the crash"
        );
        assert_eq!(&hit.body[..], b"survive");
    }
    let mut delivered = false;
    for _ in 0..100 {
        if status_of(&gateway, &id, None).await.1["state"] == "delivered" {
            delivered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        delivered,
        "the restarted gateway does not report it delivered"
    );
    gate.open();
}

const ADMIN_TOKEN: &str = "e2e-admin-token-for-deliveries";

async fn admin(
    gateway: &GatewayProcess,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = client()
        .request(method, format!("{}/admin/v1{path}", gateway.admin_url()))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

async fn until_state(gateway: &GatewayProcess, id: &str, state: &str) {
    for _ in 0..300 {
        let (_, json) = admin(
            gateway,
            reqwest::Method::GET,
            &format!("/deliveries/{id}"),
            None,
        )
        .await;
        if json["state"] == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("delivery {id} never {state}");
}

#[tokio::test]
async fn dead_letters_are_listed_inspected_replayed_and_purged_with_an_audit_trail() {
    // Two 400s: both messages die at once; every later attempt succeeds.
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![Step::status(400), Step::status(400)],
        Step::ok("ok"),
    )
    .await;
    let options = GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".into(), ADMIN_TOKEN.into())],
        ..GatewayOptions::default()
    };
    let gateway = GatewayProcess::start_with(BIN, &config(&upstream, "", ""), options).await;
    let (one, _) = accept(&gateway, &[("x-api-key", "key-acme-0001")], "first").await;
    until_state(&gateway, &one, "dead").await;
    let (two, _) = accept(&gateway, &[], "second").await;
    until_state(&gateway, &two, "dead").await;

    let (code, list) = admin(
        &gateway,
        reqwest::Method::GET,
        "/deliveries?state=dead&queue=hooks",
        None,
    )
    .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");
    let (_, only_acme) = admin(
        &gateway,
        reqwest::Method::GET,
        "/deliveries?state=dead&tenant=acme",
        None,
    )
    .await;
    assert_eq!(
        only_acme["items"].as_array().map(Vec::len),
        Some(1),
        "{only_acme}"
    );
    let (_, inspected) = admin(
        &gateway,
        reqwest::Method::GET,
        &format!("/deliveries/{one}"),
        None,
    )
    .await;
    assert_eq!(inspected["body"], "first");
    assert_eq!(inspected["attempts"][0]["status"], 400, "{inspected}");
    assert!(inspected["reason"].as_str().unwrap().contains("400"));
    assert!(
        !inspected.to_string().contains("key-acme-0001"),
        "a credential was stored: {inspected}"
    );

    // The CLI reads the same listing.
    let cli = std::process::Command::new(BIN)
        .args([
            "admin",
            "--url",
            &gateway.admin_url(),
            "deliveries",
            "list",
            "--state",
            "dead",
            "--tenant",
            "acme",
        ])
        .env("PORTCULLIS_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success() && printed.contains(&one) && !printed.contains(&two),
        "{printed}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    // Replay one: delivered with the same Idempotency-Key as its first attempt.
    let (code, _) = admin(
        &gateway,
        reqwest::Method::POST,
        &format!("/deliveries/{one}/replay"),
        None,
    )
    .await;
    assert_eq!(code, 200);
    until_state(&gateway, &one, "delivered").await;
    let keys: Vec<String> = upstream
        .hits()
        .iter()
        .filter(|h| &h.body[..] == b"first")
        .map(|h| header(h, "idempotency-key").to_owned())
        .collect();
    assert_eq!(keys, [format!("delivery-{one}"), format!("delivery-{one}")]);
    // A pending or delivered message cannot be replayed twice at once… a delivered one can.
    // Bulk replay of what is left dead: the second message.
    let (code, bulk) = admin(
        &gateway,
        reqwest::Method::POST,
        "/deliveries/replay",
        Some(serde_json::json!({"state": "dead", "queue": "hooks"})),
    )
    .await;
    assert_eq!(code, 200, "{bulk}");
    assert_eq!(bulk["replayed"], 1, "{bulk}");
    until_state(&gateway, &two, "delivered").await;

    // Purge: gone.
    let (code, _) = admin(
        &gateway,
        reqwest::Method::DELETE,
        &format!("/deliveries/{two}"),
        None,
    )
    .await;
    assert_eq!(code, 204);
    let (code, _) = admin(
        &gateway,
        reqwest::Method::GET,
        &format!("/deliveries/{two}"),
        None,
    )
    .await;
    assert_eq!(code, 404);

    let (_, audit) = admin(&gateway, reqwest::Method::GET, "/audit?limit=50", None).await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .or_else(|| audit["entries"].as_array())
        .map(|items| items.iter().filter_map(|e| e["action"].as_str()).collect())
        .unwrap_or_default();
    for action in ["delivery.replay", "delivery.replay_many", "delivery.purge"] {
        assert!(actions.contains(&action), "{action} not audited: {audit}");
    }
    // Without the token, nothing.
    let response = client()
        .get(format!("{}/admin/v1/deliveries", gateway.admin_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn the_status_url_counts_bad_credentials_against_the_address() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("done")).await;
    let text = config(
        &upstream,
        "",
        "[auth]\nfailure_limit = 2\nfailure_window = \"1h\"\n",
    );
    let gateway = GatewayProcess::start(BIN, &text).await;
    let (id, _) = accept(&gateway, &[("x-api-key", "key-acme-0001")], "mine").await;
    // Guessing keys on the status URL: two wrong ones are 401s…
    for _ in 0..2 {
        assert_eq!(
            status_of(&gateway, &id, Some("key-guessed-0001")).await.0,
            401
        );
    }
    // …then the address's credentials are refused unchecked, the right one included.
    let (code, json) = status_of(&gateway, &id, Some("key-acme-0001")).await;
    assert_eq!(code, 429, "{json}");
}
