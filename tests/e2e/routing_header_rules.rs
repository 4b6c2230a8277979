//! `request_headers` / `response_headers` on a route: what the upstream received and what
//! the client got, with the variables filled in; the gateway's own fields are neither
//! removable nor forgeable by a rule (refused at start-up, naming the field) or by a client.

use std::process::Command;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::{client, BIN};
use crate::idempotency_replay::TENANTS;

fn config(upstream: &str, rules: &str) -> String {
    format!(
        "{TENANTS}\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nname = \"orders\"\nprefix = \"/orders\"\nupstream = \"u\"\n{rules}\n\n[[routes]]\nprefix = \"/plain\"\nupstream = \"u\"\n"
    )
}

#[tokio::test]
async fn rules_shape_what_the_upstream_and_the_client_see() {
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::respond(
            200,
            &[
                ("server", "backend/1.0"),
                ("x-debug", "internal"),
                ("x-cache", "hit"),
            ],
            "ok",
        ),
    )
    .await;
    let rules = r#"request_headers = { set = { "x-env" = "prod", "x-caller" = "${tenant}@${client_ip} via ${route} (${request_id})" }, add = { "x-tag" = "gw" }, remove = ["x-internal"] }
response_headers = { set = { "x-cache" = "${route}" }, add = { "x-served-by" = "portcullis" }, remove = ["server", "x-debug"] }"#;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), rules)).await;

    let response = client()
        .get(gateway.url() + "/orders/7")
        .bearer_auth("acme-key-0001")
        .header("x-request-id", "req-abc-123")
        .header("x-internal", "secret")
        .header("x-env", "dev")
        .header("x-tag", "client")
        // A client posing as a proxy and as another tenant.
        .header("x-forwarded-for", "203.0.113.66")
        .header("x-portcullis-tenant", "globex")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert!(headers.get("server").is_none(), "{headers:?}");
    assert!(headers.get("x-debug").is_none());
    assert_eq!(headers["x-cache"], "orders");
    assert_eq!(headers["x-served-by"], "portcullis");
    // The gateway's own response fields are still there.
    assert_eq!(headers["x-request-id"], "req-abc-123");
    assert!(headers.contains_key("x-ratelimit-remaining"), "{headers:?}");

    let hits = upstream.hits();
    let sent = &hits[0].headers;
    assert!(sent.get("x-internal").is_none(), "{sent:?}");
    assert_eq!(sent["x-env"], "prod");
    let tags: Vec<_> = sent.get_all("x-tag").iter().collect();
    assert_eq!(tags, ["client", "gw"]);
    assert_eq!(sent["x-caller"], "acme@127.0.0.1 via orders (req-abc-123)");
    // Neither a rule nor the client decides these.
    assert_eq!(sent["x-forwarded-for"], "127.0.0.1");
    assert_eq!(sent["x-portcullis-tenant"], "acme");
    assert_eq!(sent["x-request-id"], "req-abc-123");

    // A route without rules is untouched: the client's fields pass, the upstream's too.
    let response = client()
        .get(gateway.url() + "/plain")
        .header("x-internal", "kept")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["server"], "backend/1.0");
    let hits = upstream.hits();
    assert_eq!(hits[1].headers["x-internal"], "kept");
    assert!(hits[1].headers.get("x-caller").is_none());
}

#[test]
fn rules_naming_the_gateways_own_fields_refuse_to_start() {
    for (rules, field) in [
        (
            r#"request_headers = { remove = ["Idempotency-Key"] }"#,
            "routes[0].request_headers.remove[0]",
        ),
        (
            r#"request_headers = { set = { "X-Portcullis-Tenant" = "acme" } }"#,
            "routes[0].request_headers.set.X-Portcullis-Tenant",
        ),
        (
            r#"request_headers = { add = { "x-forwarded-for" = "10.0.0.1" } }"#,
            "routes[0].request_headers.add.x-forwarded-for",
        ),
        (
            r#"request_headers = { set = { "x-request-id" = "fixed" } }"#,
            "routes[0].request_headers.set.x-request-id",
        ),
        (
            r#"response_headers = { remove = ["x-ratelimit-remaining"] }"#,
            "routes[0].response_headers.remove[0]",
        ),
        (
            r#"response_headers = { set = { "Retry-After" = "0" } }"#,
            "routes[0].response_headers.set.Retry-After",
        ),
        (
            r#"response_headers = { add = { "x-a" = "${secret}" } }"#,
            "routes[0].response_headers.add.x-a",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.toml");
        std::fs::write(&path, config("http://127.0.0.1:9", rules)).unwrap();
        // `check-config` validates and exits: no listener, nothing left running.
        let output = Command::new(BIN)
            .arg("check-config")
            .arg(&path)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_ne!(output.status.code(), Some(0), "{rules}");
        assert!(stderr.contains(field), "{rules}: {stderr}");
    }
}
