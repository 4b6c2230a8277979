//! Idempotency-Key through the real binary: one execution, byte-exact replays, the outcome
//! table, key validation and tenant scoping.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{assert_problem, client, BIN};

pub const TENANTS: &str = "[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 1000\nper = \"1s\"\nburst = 1000\n\n[[tenants]]\nid = \"globex\"\napi_keys = [\"globex-key-0001\"]\nrate = 1000\nper = \"1s\"\nburst = 1000\n";

/// Gateway with idempotency on `/`, no retries unless `retry` says otherwise.
pub fn keyed_config(
    upstream: &str,
    storage: &str,
    upstream_extra: &str,
    idempotency: &str,
) -> String {
    format!(
        "{storage}\n{TENANTS}\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0, base = \"10ms\", cap = \"50ms\" }}\n{upstream_extra}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\nidempotency = {{ {idempotency} }}\n\n[[routes]]\nprefix = \"/strict\"\nupstream = \"u\"\nidempotency = {{ require_key = true }}\n"
    )
}

async fn post(
    gateway: &GatewayProcess,
    key: Option<&str>,
    tenant_key: &str,
    body: &str,
) -> reqwest::Response {
    let mut request = client()
        .post(gateway.url() + "/orders")
        .bearer_auth(tenant_key)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn fifty_concurrent_duplicates_execute_once() {
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::stall(
            Duration::from_millis(300),
            Step::respond(201, &[("x-order", "42")], "{\"id\":42}"),
        ),
    )
    .await;
    let gateway = GatewayProcess::start(BIN, &keyed_config(&upstream.url(), "", "", "")).await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let url = gateway.url();
        tasks.push(tokio::spawn(async move {
            let response = client()
                .post(url + "/orders")
                .bearer_auth("acme-key-0001")
                .header("idempotency-key", "order-concurrent-1")
                .header("content-type", "application/json")
                .body("{\"item\":1}")
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let replayed = response
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.to_str().unwrap().to_owned());
            let order = response
                .headers()
                .get("x-order")
                .map(|v| v.to_str().unwrap().to_owned());
            (status, replayed, order, response.bytes().await.unwrap())
        }));
    }
    let mut originals = 0;
    for task in tasks {
        let (status, replayed, order, body) = task.await.unwrap();
        match status {
            201 => {
                assert_eq!(&body[..], b"{\"id\":42}");
                assert_eq!(order.as_deref(), Some("42"));
                if replayed.as_deref() != Some("true") {
                    originals += 1;
                }
            }
            409 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(upstream.hit_count(), 1, "the backend executed exactly once");
    assert_eq!(originals, 1);
    // Afterwards every duplicate is a byte-identical replay.
    let replay = post(
        &gateway,
        Some("order-concurrent-1"),
        "acme-key-0001",
        "{\"item\":1}",
    )
    .await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["x-order"], "42");
    assert_eq!(&replay.bytes().await.unwrap()[..], b"{\"id\":42}");
    assert_eq!(upstream.hit_count(), 1);
}

#[tokio::test]
async fn key_misuse_is_refused_and_tenants_are_isolated() {
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![], Step::respond(201, &[], "created")).await;
    let gateway = GatewayProcess::start(BIN, &keyed_config(&upstream.url(), "", "", "")).await;
    assert_eq!(
        post(&gateway, Some("k-1"), "acme-key-0001", "{\"a\":1}")
            .await
            .status(),
        201
    );

    let mismatch = post(&gateway, Some("k-1"), "acme-key-0001", "{\"a\":2}").await;
    assert_problem(mismatch, 422).await;

    let other_tenant = post(&gateway, Some("k-1"), "globex-key-0001", "{\"a\":1}").await;
    assert_eq!(other_tenant.status(), 201);
    assert!(
        other_tenant.headers().get("idempotent-replayed").is_none(),
        "globex executes its own request"
    );
    assert_eq!(upstream.hit_count(), 2);

    let long_key = "k".repeat(65);
    assert_problem(
        post(&gateway, Some(&long_key), "acme-key-0001", "{}").await,
        400,
    )
    .await;

    let strict = client()
        .post(gateway.url() + "/strict/x")
        .bearer_auth("acme-key-0001")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_problem(strict, 400).await;
    let quoted = client()
        .post(gateway.url() + "/orders")
        .bearer_auth("acme-key-0001")
        .header("idempotency-key", "\"k-1\"")
        .header("content-type", "application/json")
        .body("{\"a\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        quoted.headers()["idempotent-replayed"],
        "true",
        "a quoted sf-string is the same key"
    );
    assert_eq!(upstream.hit_count(), 2);
}

#[tokio::test]
async fn outcome_table_on_a_non_deduping_upstream() {
    let upstream = ScriptedUpstream::start(vec![
        Step::respond(201, &[], "made"),
        Step::respond(400, &[], "bad"),
        Step::with_retry_after(503, 1),
        Step::respond(201, &[], "made after 503"),
        Step::respond(500, &[], "boom"),
    ])
    .await;
    let gateway = GatewayProcess::start(BIN, &keyed_config(&upstream.url(), "", "", "")).await;
    let key = "acme-key-0001";
    for (idem, first, replay_body) in [("o-201", 201, "made"), ("o-400", 400, "bad")] {
        assert_eq!(post(&gateway, Some(idem), key, "{}").await.status(), first);
        let replay = post(&gateway, Some(idem), key, "{}").await;
        assert_eq!(replay.status(), first);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.text().await.unwrap(), replay_body);
    }
    // 503 with Retry-After: provably not processed → key released, a retry executes.
    assert_eq!(post(&gateway, Some("o-503"), key, "{}").await.status(), 503);
    let again = post(&gateway, Some("o-503"), key, "{}").await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.text().await.unwrap(), "made after 503");
    // 500 from a backend that does not dedupe: ambiguous → stored and replayed.
    assert_eq!(post(&gateway, Some("o-500"), key, "{}").await.status(), 500);
    let replay = post(&gateway, Some("o-500"), key, "{}").await;
    assert_eq!(replay.status(), 500);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(upstream.hit_count(), 5);
}

#[tokio::test]
async fn a_500_from_a_deduping_upstream_releases_the_key() {
    let upstream = ScriptedUpstream::start(vec![
        Step::respond(500, &[], "boom"),
        Step::respond(201, &[], "ok now"),
    ])
    .await;
    let config = keyed_config(&upstream.url(), "", "dedupes_idempotency_keys = true", "");
    let gateway = GatewayProcess::start(BIN, &config).await;
    assert_eq!(
        post(&gateway, Some("d-1"), "acme-key-0001", "{}")
            .await
            .status(),
        500
    );
    let again = post(&gateway, Some("d-1"), "acme-key-0001", "{}").await;
    assert_eq!(again.status(), 201);
    assert_eq!(upstream.hit_count(), 2);
    assert_eq!(
        upstream.hits()[1].headers["idempotency-key"],
        "d-1",
        "the key is forwarded upstream"
    );
}

#[tokio::test]
async fn keyed_post_is_retried_with_the_same_key_but_a_bare_500_is_not() {
    let upstream = ScriptedUpstream::start(vec![
        Step::status(503),
        Step::status(503),
        Step::respond(201, &[], "third"),
        Step::status(500),
    ])
    .await;
    let config =
        keyed_config(&upstream.url(), "", "", "").replace("max_retries = 0", "max_retries = 3");
    let gateway = GatewayProcess::start(BIN, &config).await;
    let response = post(&gateway, Some("r-1"), "acme-key-0001", "{}").await;
    assert_eq!(response.status(), 201);
    let hits = upstream.hits();
    assert_eq!(hits.len(), 3);
    assert!(
        hits.iter().all(|h| h.headers["idempotency-key"] == "r-1"),
        "same key on every attempt"
    );
    // A 500 from a non-deduping upstream may have been processed: never retried.
    assert_eq!(
        post(&gateway, Some("r-2"), "acme-key-0001", "{}")
            .await
            .status(),
        500
    );
    assert_eq!(upstream.hit_count(), 4);
}

/// Anonymous callers share a record scope by client address (`ip:…`), and several users may
/// sit behind one address: a replay there must not carry the `Set-Cookie` the upstream set
/// for the first caller. A tenant's replay (one principal) keeps it.
#[tokio::test]
async fn an_anonymous_replay_carries_no_set_cookie() {
    let made = Step::respond(
        201,
        &[
            ("set-cookie", "session=alice-secret; HttpOnly"),
            ("set-cookie", "theme=dark"),
        ],
        "made",
    );
    let upstream = ScriptedUpstream::start(vec![made.clone(), made]).await;
    let gateway = GatewayProcess::start(BIN, &keyed_config(&upstream.url(), "", "", "")).await;
    let send = |tenant: Option<&'static str>| {
        let mut request = client()
            .post(gateway.url() + "/orders")
            .header("content-type", "application/json")
            .header("idempotency-key", "cookie-1")
            .body("{}");
        if let Some(tenant) = tenant {
            request = request.bearer_auth(tenant);
        }
        request.send()
    };
    let cookies =
        |response: &reqwest::Response| response.headers().get_all("set-cookie").iter().count();

    // Anonymous: the first caller gets its cookies, the second (same address) none.
    let first = send(None).await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(cookies(&first), 2, "the first caller's own answer");
    let second = send(None).await.unwrap();
    assert_eq!(second.status(), 201);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(cookies(&second), 0, "{:?}", second.headers());
    assert_eq!(second.text().await.unwrap(), "made");

    // A tenant's replay keeps them: the same principal asked twice.
    assert_eq!(send(Some("acme-key-0001")).await.unwrap().status(), 201);
    let replay = send(Some("acme-key-0001")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(cookies(&replay), 2);

    // What the upstream received: one execution per scope.
    assert_eq!(upstream.hit_count(), 2);
}
