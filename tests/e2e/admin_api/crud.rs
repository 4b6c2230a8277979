//! Full CRUD round trip through the binary, on SQLite and on PostgreSQL, with the audit log
//! recording before and after of every change.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::postgres;
use portcullis_testkit::upstream::ScriptedUpstream;
use reqwest::Method;
use serde_json::{json, Value};

use super::{actions, admin, send, start, WITHIN};

async fn crud_round_trip(gw: GatewayProcess) {
    let tenant = json!({"id": "acme", "name": "Acme", "rate": 100, "per": "1s", "burst": 100, "daily_quota": 1000});
    let response = send(&gw, Method::POST, "/tenants", Some(tenant.clone())).await;
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["location"], "/admin/v1/tenants/acme");
    let created: Value = response.json().await.unwrap();
    assert_eq!(
        (created["per"].as_str(), &created["daily_quota"]),
        (Some("1s"), &json!(1000))
    );
    admin(&gw, Method::POST, "/tenants", Some(tenant), 409).await;
    for id in ["beta", "gamma"] {
        admin(
            &gw,
            Method::POST,
            "/tenants",
            Some(json!({"id": id, "rate": 1, "burst": 1})),
            201,
        )
        .await;
    }
    let page = admin(&gw, Method::GET, "/tenants?limit=2", None, 200).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = admin(
        &gw,
        Method::GET,
        &format!("/tenants?limit=2&cursor={cursor}"),
        None,
        200,
    )
    .await;
    assert_eq!(
        (rest["items"][0]["id"].as_str(), &rest["next_cursor"]),
        (Some("gamma"), &json!(null))
    );
    assert_eq!(
        admin(&gw, Method::GET, "/tenants/acme", None, 200).await,
        created
    );

    let renamed = admin(
        &gw,
        Method::PATCH,
        "/tenants/acme",
        Some(json!({"name": "Acme Corp"})),
        200,
    )
    .await;
    assert_eq!(renamed["name"], "Acme Corp");
    let quota = admin(
        &gw,
        Method::PATCH,
        "/tenants/acme/quota",
        Some(json!({"burst": 50, "daily_quota": null})),
        200,
    )
    .await;
    assert_eq!(
        (&quota["burst"], &quota["daily_quota"]),
        (&json!(50), &json!(null))
    );
    let route = json!({"route": "/", "rate": 5, "per": "1s", "burst": 5});
    admin(
        &gw,
        Method::PUT,
        "/tenants/acme/route-quotas",
        Some(route),
        200,
    )
    .await;
    let routes = admin(&gw, Method::GET, "/tenants/acme/route-quotas", None, 200).await;
    assert_eq!(routes["items"][0]["burst"], 5);
    assert_eq!(
        send(
            &gw,
            Method::DELETE,
            "/tenants/acme/route-quotas?route=/",
            None
        )
        .await
        .status(),
        204
    );
    assert_eq!(
        admin(&gw, Method::POST, "/tenants/acme/disable", None, 200).await["disabled"],
        true
    );
    assert_eq!(
        admin(&gw, Method::POST, "/tenants/acme/enable", None, 200).await["disabled"],
        false
    );

    let issued = admin(&gw, Method::POST, "/tenants/acme/keys", None, 201).await;
    let plaintext = issued["api_key"].as_str().unwrap();
    let keys = admin(&gw, Method::GET, "/tenants/acme/keys", None, 200).await;
    assert!(keys["items"][0].get("api_key").is_none() && !keys.to_string().contains(plaintext));
    let key_id = issued["id"].as_i64().unwrap();
    let revoked = admin(
        &gw,
        Method::POST,
        &format!("/tenants/acme/keys/{key_id}/revoke"),
        None,
        200,
    )
    .await;
    assert!(revoked["revoked_at"].is_string());
    // The limiter learns of the tenant within a second; usage reads without consuming.
    let since = tokio::time::Instant::now();
    while send(&gw, Method::GET, "/tenants/acme/usage", None)
        .await
        .status()
        != 200
    {
        assert!(since.elapsed() < WITHIN, "usage still unavailable");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let usage = admin(&gw, Method::GET, "/tenants/acme/usage", None, 200).await;
    assert_eq!(usage["tenant"], "acme");
    admin(
        &gw,
        Method::POST,
        "/tenants/acme/periods/day/reset",
        None,
        409,
    )
    .await;

    assert_eq!(
        send(&gw, Method::DELETE, "/tenants/acme", None)
            .await
            .status(),
        204
    );
    admin(&gw, Method::GET, "/tenants/acme", None, 404).await;
    admin(&gw, Method::DELETE, "/tenants/acme", None, 404).await;

    let audit = admin(&gw, Method::GET, "/audit?tenant=acme", None, 200).await;
    assert_eq!(
        actions(&audit),
        [
            "tenant.delete",
            "key.revoke",
            "key.issue",
            "tenant.enable",
            "tenant.disable",
            "route_quota.delete",
            "route_quota.set",
            "quota.update",
            "tenant.update",
            "tenant.create"
        ]
    );
    let entries = audit["items"].as_array().unwrap();
    assert!(entries
        .iter()
        .all(|e| e["actor"] == "admin-token:e2e" && e["at"].is_string()));
    let by = |action: &str| entries.iter().find(|e| e["action"] == action).unwrap();
    assert_eq!(
        (
            &by("tenant.create")["before"],
            &by("tenant.create")["after"]["id"]
        ),
        (&json!(null), &json!("acme"))
    );
    assert_eq!(
        (
            &by("tenant.update")["before"]["name"],
            &by("tenant.update")["after"]["name"]
        ),
        (&json!("Acme"), &json!("Acme Corp"))
    );
    let q = by("quota.update");
    assert_eq!(
        (&q["before"]["burst"], &q["after"]["burst"]),
        (&json!(100), &json!(50))
    );
    assert_eq!(
        (&q["before"]["daily_quota"], &q["after"]["daily_quota"]),
        (&json!(1000), &json!(null))
    );
    assert_eq!(
        (
            &by("key.revoke")["before"]["revoked_at"],
            by("key.revoke")["after"]["revoked_at"].is_string()
        ),
        (&json!(null), true)
    );
    assert_eq!(
        (
            &by("tenant.delete")["before"]["id"],
            &by("tenant.delete")["after"]
        ),
        (&json!("acme"), &json!(null))
    );
    assert!(!audit.to_string().contains(plaintext));
    let all = admin(&gw, Method::GET, "/audit?limit=500", None, 200).await;
    assert_eq!(
        all["items"].as_array().unwrap().len(),
        12,
        "two more tenants created"
    );
}

#[tokio::test]
async fn crud_round_trip_on_sqlite() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    crud_round_trip(start(&upstream, None).await).await;
}

#[tokio::test]
async fn crud_round_trip_on_postgres() {
    let database = postgres::fresh_database().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    crud_round_trip(start(&upstream, Some(&database)).await).await;
}
