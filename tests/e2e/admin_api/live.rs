//! The admin API changing live traffic: issued keys used then revoked, the plaintext never
//! stored or logged, a quota change reaching another replica, idempotency records, the CLI.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::postgres;
use portcullis_testkit::upstream::ScriptedUpstream;
use reqwest::Method;
use serde_json::json;
use sqlx::Connection;

use super::{
    actions, admin, config, proxied_status, send, start, wait_status, with_token, TOKEN, WITHIN,
};
use crate::common::{assert_problem, client, BIN};

/// Everything the database holds, as text: PostgreSQL rows as JSON, SQLite's files as bytes
/// (including the write-ahead log, where fresh writes sit).
async fn database_dump(gw: &GatewayProcess, database: Option<&str>) -> Vec<u8> {
    let Some(url) = database else {
        let mut bytes = Vec::new();
        for file in ["portcullis.db", "portcullis.db-wal", "portcullis.db-shm"] {
            bytes.extend(std::fs::read(gw.dir().join(file)).unwrap_or_default());
        }
        assert!(bytes.len() > 4096, "the SQLite database was found");
        return bytes;
    };
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(tables.contains(&"api_keys".to_owned()) && tables.contains(&"audit_log".to_owned()));
    let mut dump = String::new();
    for table in tables {
        let rows: Vec<String> =
            sqlx::query_scalar(&format!("SELECT row_to_json(t)::text FROM \"{table}\" t"))
                .fetch_all(&mut conn)
                .await
                .unwrap();
        dump.push_str(&rows.join("\n"));
    }
    dump.into_bytes()
}

async fn issued_key_lifecycle(database: Option<&str>) {
    let upstream = ScriptedUpstream::start(vec![]).await;
    // Debug logging everywhere: the key must not appear even there.
    let options = with_token(&[("RUST_LOG", "debug")]);
    let gw = GatewayProcess::start_with(BIN, &config(&upstream, database, ""), options).await;
    admin(
        &gw,
        Method::POST,
        "/tenants",
        Some(json!({"id": "acme", "rate": 100, "burst": 100})),
        201,
    )
    .await;
    let issued = admin(&gw, Method::POST, "/tenants/acme/keys", None, 201).await;
    let key = issued["api_key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("pc_") && key.len() == 35, "{key}");
    // The replica that answered 201 has already reloaded: the key works at once.
    assert_eq!(proxied_status(&gw, &key).await, 200);
    assert_eq!(
        upstream.hits().last().unwrap().headers["x-portcullis-tenant"],
        "acme"
    );

    let id = issued["id"].as_i64().unwrap();
    admin(
        &gw,
        Method::POST,
        &format!("/tenants/acme/keys/{id}/revoke"),
        None,
        200,
    )
    .await;
    let revoked_at = tokio::time::Instant::now();
    assert!(
        wait_status(&gw, &key, 401, revoked_at).await,
        "revoked key still accepted after 1 s"
    );

    let dump = database_dump(&gw, database).await;
    assert!(
        !dump.windows(key.len()).any(|w| w == key.as_bytes()),
        "plaintext key found in the database"
    );
    let prefix = &key[..10];
    assert!(
        dump.windows(prefix.len()).any(|w| w == prefix.as_bytes()),
        "the visible prefix is stored"
    );
    let logs = gw.logs();
    assert!(
        logs.contains("admin change committed") && !logs.contains(&key),
        "plaintext key in the logs"
    );
}

#[tokio::test]
async fn issued_key_is_used_then_revoked_within_a_second_on_sqlite() {
    issued_key_lifecycle(None).await;
}

#[tokio::test]
async fn issued_key_is_used_then_revoked_within_a_second_on_postgres() {
    let database = postgres::fresh_database().await;
    issued_key_lifecycle(Some(&database)).await;
}

#[tokio::test]
async fn a_quota_lowered_on_replica_a_is_enforced_by_replica_b_within_a_second() {
    let database = postgres::fresh_database().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let a = start(&upstream, Some(&database)).await;
    let b = start(&upstream, Some(&database)).await;
    admin(
        &a,
        Method::POST,
        "/tenants",
        Some(json!({"id": "acme", "rate": 100, "burst": 100})),
        201,
    )
    .await;
    let key = admin(&a, Method::POST, "/tenants/acme/keys", None, 201).await["api_key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        wait_status(&b, &key, 200, tokio::time::Instant::now()).await,
        "B did not learn the key within 1 s"
    );

    let lowered = json!({"rate": 1, "per": "1h", "burst": 1});
    admin(&a, Method::PATCH, "/tenants/acme/quota", Some(lowered), 200).await;
    let changed_at = tokio::time::Instant::now();
    // At most one request may still pass on the new 1-token bucket; the next is refused.
    let mut refused = None;
    while changed_at.elapsed() < WITHIN {
        let response = client()
            .get(b.url() + "/x")
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        if response.status() == 429 {
            refused = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let refused = refused.expect("replica B did not enforce the lowered quota within 1 s");
    assert!(refused.headers().contains_key("retry-after"));
    let body = assert_problem(refused, 429).await;
    assert!(body.to_string().contains("tenant"), "{body}");

    // A key revoked through A stops working at B within a second too.
    let id = admin(&a, Method::GET, "/tenants/acme/keys", None, 200).await["items"][0]["id"]
        .as_i64()
        .unwrap();
    let path = format!("/tenants/acme/keys/{id}/revoke");
    admin(&a, Method::POST, &path, None, 200).await;
    let revoked_at = tokio::time::Instant::now();
    assert!(
        wait_status(&b, &key, 401, revoked_at).await,
        "B still accepts the revoked key after 1 s"
    );
}

#[tokio::test]
async fn idempotency_records_can_be_looked_up_and_deleted() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let route = "idempotency = { methods = [\"POST\"] }";
    let gw =
        GatewayProcess::start_with(BIN, &config(&upstream, None, route), with_token(&[])).await;
    admin(
        &gw,
        Method::POST,
        "/tenants",
        Some(json!({"id": "acme", "rate": 100, "burst": 100})),
        201,
    )
    .await;
    let key = admin(&gw, Method::POST, "/tenants/acme/keys", None, 201).await["api_key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(wait_status(&gw, &key, 200, tokio::time::Instant::now()).await);
    let post = || {
        client()
            .post(gw.url() + "/orders")
            .bearer_auth(&key)
            .header("idempotency-key", "order-1")
            .body("{}")
            .send()
    };
    assert_eq!(post().await.unwrap().status(), 200);
    let hits = upstream.hit_count();

    let record = admin(
        &gw,
        Method::GET,
        "/tenants/acme/idempotency?route=/&key=order-1",
        None,
        200,
    )
    .await;
    assert_eq!(
        (&record["state"], &record["status"], &record["key"]),
        (&json!("completed"), &json!(200), &json!("order-1"))
    );
    assert_eq!(record["fingerprint"].as_str().unwrap().len(), 64);
    admin(
        &gw,
        Method::GET,
        "/tenants/globex/idempotency?route=/&key=order-1",
        None,
        404,
    )
    .await;
    assert_eq!(
        send(
            &gw,
            Method::DELETE,
            "/tenants/acme/idempotency?route=/&key=order-1",
            None
        )
        .await
        .status(),
        204
    );
    admin(
        &gw,
        Method::GET,
        "/tenants/acme/idempotency?route=/&key=order-1",
        None,
        404,
    )
    .await;
    assert_eq!(post().await.unwrap().status(), 200);
    assert_eq!(upstream.hit_count(), hits + 1, "the key was usable again");
    let audit = admin(&gw, Method::GET, "/audit?tenant=acme&limit=1", None, 200).await;
    assert_eq!(actions(&audit), ["idempotency.delete"]);
    assert_eq!(audit["items"][0]["before"]["state"], "completed");
}

async fn cli(gw: &GatewayProcess, args: &[&str], token: Option<&str>) -> (bool, String) {
    let mut command = tokio::process::Command::new(BIN);
    command
        .arg("admin")
        .arg("--url")
        .arg(gw.admin_url())
        .args(args)
        .env_remove("PORTCULLIS_ADMIN_TOKEN");
    if let Some(token) = token {
        command.env("PORTCULLIS_ADMIN_TOKEN", token);
    }
    let output = tokio::time::timeout(Duration::from_secs(20), command.output())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[tokio::test]
async fn the_cli_drives_the_admin_api() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gw = start(&upstream, None).await;
    let (ok, out) = cli(
        &gw,
        &[
            "tenant", "add", "cli-t", "--rate", "10", "--burst", "10", "--daily", "100",
        ],
        Some(TOKEN),
    )
    .await;
    assert!(
        ok && out.contains("cli-t") && out.contains("BURST"),
        "{out}"
    );
    let (ok, out) = cli(&gw, &["tenant", "list"], Some(TOKEN)).await;
    assert!(
        ok && out.lines().nth(1).unwrap().starts_with("cli-t "),
        "{out}"
    );
    let (ok, out) = cli(&gw, &["key", "issue", "cli-t"], Some(TOKEN)).await;
    let key = out
        .split_whitespace()
        .find(|w| w.starts_with("pc_"))
        .unwrap_or_default()
        .to_owned();
    assert!(ok && key.len() == 35, "{out}");
    assert!(wait_status(&gw, &key, 200, tokio::time::Instant::now()).await);
    let (ok, out) = cli(
        &gw,
        &["quota", "set", "cli-t", "--burst", "5", "--daily", "none"],
        Some(TOKEN),
    )
    .await;
    assert!(ok && out.contains("(tenant)  10"), "{out}");
    let (ok, out) = cli(
        &gw,
        &[
            "quota",
            "set",
            "cli-t",
            "--max-websockets",
            "3",
            "--websocket-idle-timeout",
            "90s",
        ],
        Some(TOKEN),
    )
    .await;
    assert!(
        ok && out.contains("MAX WEBSOCKETS") && out.contains("1m 30s"),
        "{out}"
    );
    let (ok, out) = cli(
        &gw,
        &["quota", "set", "cli-t", "--websocket-max-lifetime", "0s"],
        Some(TOKEN),
    )
    .await;
    assert!(
        !ok && out.contains("websocket_max_lifetime: must be"),
        "{out}"
    );
    let (ok, out) = cli(&gw, &["usage", "cli-t"], Some(TOKEN)).await;
    assert!(ok && out.contains("REMAINING"), "{out}");
    let (ok, out) = cli(&gw, &["key", "revoke", "cli-t", "1"], Some(TOKEN)).await;
    assert!(ok && out.contains("pc_"), "{out}");
    let (ok, out) = cli(&gw, &["quota", "set", "cli-t", "--burst", "0"], Some(TOKEN)).await;
    assert!(!ok && out.contains("burst: must be ≥ 1"), "{out}");
    let (ok, out) = cli(&gw, &["tenant", "list"], None).await;
    assert!(!ok && out.contains("PORTCULLIS_ADMIN_TOKEN"), "{out}");
    let (ok, out) = cli(&gw, &["tenant", "list"], Some("wrong-token-0123456789")).await;
    assert!(!ok && out.contains("401"), "{out}");
}
