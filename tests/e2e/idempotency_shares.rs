//! One tenant's keyed traffic cannot take another tenant's idempotency records: the memory
//! store is split into shares, a tenant over its share gets 503 `idempotency-store-full` for
//! new keys, and every other tenant's completed records stay replayable (their retries are
//! never executed a second time). Through the real binary; the scripted upstream counts what
//! was really executed.

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{assert_problem, client, BIN};
use crate::idempotency_replay::keyed_config;

/// A 1 MiB store (the smallest allowed): two tenants and the anonymous callers share it, a
/// third each. A 64 KiB response per record fills a share in about five requests.
const STORAGE: &str = "[storage]\nmemory_max_bytes = 1048576\n";
const BIG: usize = 64 * 1024;

async fn post(gateway: &GatewayProcess, tenant_key: &str, key: &str) -> reqwest::Response {
    client()
        .post(gateway.url() + "/orders")
        .bearer_auth(tenant_key)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(format!("{{\"order\":\"{key}\"}}"))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_tenant_flooding_the_store_leaves_another_tenants_records_replayable() {
    let big = "x".repeat(BIG);
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok(&big)).await;
    let config = keyed_config(&upstream.url(), STORAGE, "", "");
    let gateway = GatewayProcess::start(BIN, &config).await;

    // The victim (globex) completes one keyed request.
    let first = post(&gateway, "globex-key-0001", "victim-order-1").await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.bytes().await.unwrap().len(), BIG);
    assert_eq!(upstream.hit_count(), 1);

    // The attacker (acme) sends 32 keyed requests with 64 KiB answers: 2 MiB, twice the
    // whole store. Its share fills and it is refused, with Retry-After, before the upstream.
    let mut stored = 0;
    let mut refused = 0;
    for n in 0..32 {
        let response = post(&gateway, "acme-key-0001", &format!("flood-{n}")).await;
        match response.status().as_u16() {
            200 => stored += 1,
            503 => {
                assert!(response.headers().contains_key("retry-after"));
                let problem = assert_problem(response, 503).await;
                assert!(
                    problem["type"]
                        .as_str()
                        .is_some_and(|t| t.ends_with("/idempotency-store-full")),
                    "{problem}"
                );
                refused += 1;
            }
            other => panic!("flood request {n}: {other}"),
        }
    }
    // The victim's retry is a replay: no second execution.
    let retry = post(&gateway, "globex-key-0001", "victim-order-1").await;
    assert_eq!(retry.status(), 200);
    assert_eq!(
        retry
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(
        upstream.hit_count(),
        1 + stored,
        "the retry was not executed"
    );

    assert!(
        stored >= 3,
        "the attacker's own share took {stored} records"
    );
    assert_eq!(stored + refused, 32);
    assert!(refused >= 20, "the attacker was refused {refused} times");
    let executed = upstream.hit_count();
    assert_eq!(
        executed,
        1 + stored,
        "refused requests never reached the upstream"
    );

    // And the victim still has room for new keys.
    let fresh = post(&gateway, "globex-key-0001", "victim-order-2").await;
    assert_eq!(fresh.status(), 200);
    assert_eq!(upstream.hit_count(), executed + 1);
    let hits = upstream.hits();
    let victim_hits = hits
        .iter()
        .filter(|h| h.headers["x-portcullis-tenant"] == "globex")
        .count();
    assert_eq!(victim_hits, 2, "victim-order-1 once, victim-order-2 once");
}

#[tokio::test]
async fn a_share_set_in_the_file_bounds_that_tenant() {
    let big = "x".repeat(BIG);
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok(&big)).await;
    // acme may hold 128 KiB: the first record fits; the second's response does not (it is
    // answered, and kept as a too-large tombstone so its key never executes twice); from
    // then on new keys are refused until a response that size fits again.
    let storage = format!("{STORAGE}memory_shares = {{ acme = 131072 }}\n");
    let config = keyed_config(&upstream.url(), &storage, "", "");
    let gateway = GatewayProcess::start(BIN, &config).await;
    let mut statuses = Vec::new();
    for n in 0..4 {
        statuses.push(
            post(&gateway, "acme-key-0001", &format!("k{n}"))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 503, 503]);
    assert_eq!(
        upstream.hit_count(),
        2,
        "refused keys never reached the upstream"
    );
    // globex keeps the fair part of the rest.
    for n in 0..4 {
        let response = post(&gateway, "globex-key-0001", &format!("g{n}")).await;
        assert_eq!(response.status(), 200, "globex request {n}");
    }
}

/// A Redis that may evict keys before their TTL would drop records under any tenant's load:
/// the gateway refuses to start on it, naming the field and the setting to change, and
/// starts once the policy is `noeviction`.
#[tokio::test]
async fn a_redis_that_evicts_is_refused_at_start_up() {
    let server = portcullis_testkit::redis::RedisServer::start().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let set = |name: &'static str, value: &'static str| {
        redis::cmd("CONFIG").arg("SET").arg(name).arg(value).clone()
    };
    set("maxmemory", "104857600")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    set("maxmemory-policy", "allkeys-lru")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evicting.toml");
    let storage = format!("[storage]\nidempotency = \"{}\"\n", server.url());
    std::fs::write(&path, keyed_config("http://127.0.0.1:9", &storage, "", "")).unwrap();
    let output = tokio::process::Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .current_dir(dir.path())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(30), output)
        .await
        .expect("the gateway refuses at once")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("storage.idempotency"), "{stderr}");
    assert!(stderr.contains("maxmemory-policy allkeys-lru"), "{stderr}");
    assert!(stderr.contains("noeviction"), "{stderr}");

    set("maxmemory-policy", "noeviction")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("done")).await;
    let config = keyed_config(&upstream.url(), &storage, "", "");
    let gateway = GatewayProcess::start(BIN, &config).await;
    assert_eq!(post(&gateway, "acme-key-0001", "k").await.status(), 200);
}
