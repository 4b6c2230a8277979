use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::postgres;
use portcullis_testkit::upstream::ScriptedUpstream;
use sqlx::Connection;

use crate::common::{assert_problem, client, single_route_config, BIN};

fn tenant_config(upstream: &ScriptedUpstream, database: Option<&str>) -> String {
    let storage = database
        .map(|d| format!("[storage]\ndatabase = \"{d}\"\n\n"))
        .unwrap_or_default();
    format!(
        "{storage}[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 100\nper = \"1s\"\nburst = 100\n\n{}",
        single_route_config(&upstream.url(), "")
    )
}

#[tokio::test]
async fn api_key_resolves_the_tenant_and_never_reaches_the_backend() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &tenant_config(&upstream, None)).await;
    let bearer = client()
        .get(gateway.url() + "/a")
        .bearer_auth("acme-key-0001")
        .header("x-portcullis-tenant", "someone-else")
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    let header = client()
        .get(gateway.url() + "/b")
        .header("x-api-key", "acme-key-0001")
        .send()
        .await
        .unwrap();
    assert_eq!(header.status(), 200);
    for hit in upstream.hits() {
        assert_eq!(hit.headers["x-portcullis-tenant"], "acme");
        assert!(
            hit.headers.get("authorization").is_none() && hit.headers.get("x-api-key").is_none()
        );
    }
    let anonymous = client()
        .get(gateway.url() + "/c")
        .header("x-portcullis-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 200);
    assert!(
        upstream.hits()[2]
            .headers
            .get("x-portcullis-tenant")
            .is_none(),
        "clients cannot claim a tenant"
    );
}

#[tokio::test]
async fn unknown_key_is_401_not_anonymous() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &tenant_config(&upstream, None)).await;
    let response = client()
        .get(gateway.url() + "/a")
        .bearer_auth("not-a-key")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["www-authenticate"],
        "Bearer realm=\"portcullis\""
    );
    let body = assert_problem(response, 401).await;
    assert!(body["type"].as_str().unwrap().ends_with("invalid-api-key"));
    assert_eq!(upstream.hit_count(), 0);
}

#[tokio::test]
async fn a_key_revoked_in_the_database_stops_working_within_a_second() {
    let database = postgres::fresh_database().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &tenant_config(&upstream, Some(&database))).await;
    let ok = client()
        .get(gateway.url() + "/a")
        .bearer_auth("acme-key-0001")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);

    let mut conn = sqlx::PgConnection::connect(&database).await.unwrap();
    sqlx::query("UPDATE api_keys SET revoked_at = now()")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("UPDATE config_version SET version = version + 1")
        .execute(&mut conn)
        .await
        .unwrap();
    let revoked_at = tokio::time::Instant::now();

    // Poll every 50 ms for at most 1 s: the revocation must be enforced inside that window.
    let mut refused = false;
    while revoked_at.elapsed() < Duration::from_secs(1) {
        let response = client()
            .get(gateway.url() + "/a")
            .bearer_auth("acme-key-0001")
            .send()
            .await
            .unwrap();
        if response.status() == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "revoked key still accepted after 1 s");
}
