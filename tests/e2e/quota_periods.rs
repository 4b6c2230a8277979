//! Daily and monthly quotas through the real binary: enforced in the rate-limit decision,
//! 429 until the next UTC midnight, and reset or topped up through the admin API. (The exact
//! midnight arithmetic runs on an injected clock in the rate-limit crate's own tests.)

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::ScriptedUpstream;

use crate::common::{assert_problem, client, single_route_config, BIN};

const TOKEN: &str = "quota-test-admin-token-0123456789";

/// A tenant id of its own per run: a day's quota in the shared Redis outlives the test.
fn tenant_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("q{:x}", hasher.finish())
}

async fn start(upstream: &ScriptedUpstream, storage: &str, tenant: &str) -> GatewayProcess {
    let config = format!(
        "{storage}\n[[tenants]]\nid = \"{tenant}\"\napi_keys = [\"{tenant}-key-0001\"]\nrate = 1000\nper = \"1s\"\nburst = 1000\ndaily_quota = 3\nmonthly_quota = 100\n\n{}",
        single_route_config(&upstream.url(), "")
    );
    let options = GatewayOptions {
        env: vec![("PORTCULLIS_ADMIN_TOKEN".into(), TOKEN.into())],
        ..GatewayOptions::default()
    };
    GatewayProcess::start_with(BIN, &config, options).await
}

async fn call(gateway: &GatewayProcess, tenant: &str) -> reqwest::Response {
    client()
        .get(gateway.url() + "/q")
        .bearer_auth(format!("{tenant}-key-0001"))
        .send()
        .await
        .unwrap()
}

async fn daily_quota_is_enforced_then_reset_and_topped_up(storage: &str) {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let tenant = tenant_id();
    let gateway = start(&upstream, storage, &tenant).await;
    for _ in 0..3 {
        assert_eq!(call(&gateway, &tenant).await.status(), 200);
    }
    let refused = call(&gateway, &tenant).await;
    let date = httpdate::parse_http_date(refused.headers()["date"].to_str().unwrap()).unwrap();
    let now = date
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let to_midnight = 86_400 - now % 86_400;
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry_after.abs_diff(to_midnight) <= 2,
        "Retry-After {retry_after} vs {to_midnight} s to UTC midnight"
    );
    let body = assert_problem(refused, 429).await;
    assert_eq!(body["policy"], "daily_quota");
    assert_eq!(upstream.hit_count(), 3);

    let admin = client();
    let usage: serde_json::Value = admin
        .get(format!(
            "{}/admin/v1/tenants/{tenant}/usage",
            gateway.admin_url()
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let day = usage["periods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["period"] == "day")
        .expect("day quota in usage");
    assert_eq!(
        (day["limit"].as_u64(), day["used"].as_u64()),
        (Some(3), Some(3)),
        "{usage}"
    );

    let reset = admin
        .post(format!(
            "{}/admin/v1/tenants/{tenant}/periods/day/reset",
            gateway.admin_url()
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 200, "{}", reset.text().await.unwrap());
    assert_eq!(
        call(&gateway, &tenant).await.status(),
        200,
        "admitted after a manual reset"
    );
    assert_eq!(call(&gateway, &tenant).await.status(), 200);
    assert_eq!(call(&gateway, &tenant).await.status(), 200);
    assert_eq!(call(&gateway, &tenant).await.status(), 429);

    let top_up = admin
        .post(format!(
            "{}/admin/v1/tenants/{tenant}/periods/day/top-up",
            gateway.admin_url()
        ))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({ "amount": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(top_up.status(), 200, "{}", top_up.text().await.unwrap());
    assert_eq!(
        call(&gateway, &tenant).await.status(),
        200,
        "one request given back"
    );
    assert_eq!(call(&gateway, &tenant).await.status(), 429);
}

#[tokio::test]
async fn daily_quota_in_local_mode() {
    daily_quota_is_enforced_then_reset_and_topped_up("").await;
}

#[tokio::test]
async fn daily_quota_in_redis_mode() {
    let storage = format!(
        "[storage]\nstate = \"{}\"\n",
        portcullis_testkit::redis::shared_url()
    );
    daily_quota_is_enforced_then_reset_and_topped_up(&storage).await;
}
