//! Rate limiting shared through real Redis: replicas together admit the configured rate, and
//! a Redis outage degrades as configured and recovers by itself.

use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::redis::RedisServer;
use portcullis_testkit::upstream::ScriptedUpstream;

use crate::common::{client, BIN};

fn config(upstream: &str, redis: &str, rate_limit: &str, tenant: &str) -> String {
    format!(
        "[storage]\nstate = \"{redis}\"\nstate_timeout = \"100ms\"\n\n[rate_limit]\n{rate_limit}\n\n{tenant}\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\n"
    )
}

async fn admitted(gateway: &GatewayProcess, key: &str) -> u16 {
    client()
        .get(gateway.url() + "/d")
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn two_replicas_on_one_redis_admit_the_rate_once_not_twice() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let tenant_id = format!("shared{}", std::process::id());
    let tenant = format!("[[tenants]]\nid = \"{tenant_id}\"\napi_keys = [\"{tenant_id}-key\"]\nrate = 100\nper = \"1s\"\nburst = 100\n");
    let text = config(
        &upstream.url(),
        &portcullis_testkit::redis::shared_url(),
        "",
        &tenant,
    );
    let a = GatewayProcess::start(BIN, &text).await;
    let b = GatewayProcess::start(BIN, &text).await;
    let key = format!("{tenant_id}-key");
    let started = tokio::time::Instant::now();
    let run = Duration::from_secs(2);
    let mut loops = Vec::new();
    for gateway in [a.url(), b.url()] {
        for _ in 0..2 {
            let (url, key) = (gateway.clone(), key.clone());
            loops.push(tokio::spawn(async move {
                let http = client();
                let (mut ok, mut limited) = (0u64, 0u64);
                // Bounded by time and by count.
                for _ in 0..20_000 {
                    if started.elapsed() >= run {
                        break;
                    }
                    match http
                        .get(format!("{url}/d"))
                        .bearer_auth(&key)
                        .send()
                        .await
                        .unwrap()
                        .status()
                        .as_u16()
                    {
                        200 => ok += 1,
                        429 => limited += 1,
                        other => panic!("unexpected {other}"),
                    }
                }
                (ok, limited)
            }));
        }
    }
    let (mut ok, mut limited) = (0, 0);
    for task in loops {
        let (o, l) = task.await.unwrap();
        ok += o;
        limited += l;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let expected = 100.0 + 100.0 * elapsed;
    let error = (ok as f64 - expected).abs() / expected;
    assert!(limited > 0, "the load exceeded the rate ({ok} admitted)");
    assert!(
        error <= 0.05,
        "admitted {ok}, expected {expected:.0} (±5 %) over {elapsed:.2}s; twice would be {:.0}",
        2.0 * expected
    );
}

#[tokio::test]
async fn redis_outage_fails_open_or_closed_as_configured_then_recovers() {
    let mut redis = RedisServer::start().await;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let tenant = "[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 1\nper = \"60s\"\nburst = 10\n";
    let open = GatewayProcess::start(
        BIN,
        &config(
            &upstream.url(),
            &redis.url(),
            "on_store_error = \"fail_open\"\nreplicas = 2",
            tenant,
        ),
    )
    .await;
    let closed = GatewayProcess::start(
        BIN,
        &config(
            &upstream.url(),
            &redis.url(),
            "on_store_error = \"fail_closed\"\nreplicas = 2",
            tenant,
        ),
    )
    .await;
    assert_eq!(admitted(&open, "acme-key-0001").await, 200);

    redis.kill();
    let mut open_ok = 0;
    for _ in 0..10 {
        match admitted(&open, "acme-key-0001").await {
            200 => open_ok += 1,
            429 => {}
            other => panic!("fail_open answered {other}"),
        }
    }
    assert_eq!(
        open_ok, 5,
        "fail_open admits this replica's share: burst 10 / 2 replicas"
    );
    let refused = client()
        .get(closed.url() + "/d")
        .bearer_auth("acme-key-0001")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));

    redis.restart().await;
    // Shared limiting resumes without restarting the gateways: a fresh Redis bucket holds 10,
    // spent across both replicas together. The fallback re-probes Redis after its cool-down.
    let mut resumed = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if admitted(&closed, "acme-key-0001").await == 200 {
            resumed = true;
            break;
        }
    }
    assert!(resumed, "fail_closed replica recovered once Redis was back");
    tokio::time::sleep(Duration::from_millis(1200)).await; // let the fail_open replica's cool-down pass
    let mut shared_ok = 1; // the request that proved recovery
    for i in 0..20 {
        let gateway = if i % 2 == 0 { &open } else { &closed };
        if admitted(gateway, "acme-key-0001").await == 200 {
            shared_ok += 1;
        }
    }
    assert_eq!(
        shared_ok, 10,
        "both replicas draw from one shared bucket again"
    );
}
