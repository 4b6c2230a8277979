//! The alert webhook of an asynchronous route (`delivery.alert_webhook`): each dead letter is
//! POSTed there as a small JSON (queue, delivery id, reason, attempts, tenant) without the
//! payload or a credential; a webhook that hangs never holds up delivery; one that cannot
//! be reached is counted and logged without its path.

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::ports::closed_addr;
use portcullis_testkit::upstream::{Gate, ScriptedUpstream, Step};

use crate::async_delivery::{accept, config, until};
use crate::common::{client, BIN};

/// The value of `delivery_alerts_total{queue="hooks",outcome=…}` (0 when absent).
async fn alerts(gateway: &GatewayProcess, outcome: &str) -> f64 {
    let text = client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| {
            l.starts_with("delivery_alerts_total{")
                && l.contains("queue=\"hooks\"")
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn until_alerts(gateway: &GatewayProcess, outcome: &str, n: f64) {
    for _ in 0..300 {
        if alerts(gateway, outcome).await >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("delivery_alerts_total{{outcome={outcome}}} never reached {n}");
}

#[tokio::test]
async fn a_dead_letter_is_posted_to_the_alert_webhook_without_payload_or_credentials() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(422)).await;
    let webhook = ScriptedUpstream::start_with_fallback(vec![], Step::ok("thanks")).await;
    let delivery = format!(", alert_webhook = \"{}/alerts/T0/abc\"", webhook.url());
    let gateway = GatewayProcess::start(BIN, &config(&upstream, &delivery, "")).await;
    let (id, _) = accept(
        &gateway,
        &[
            ("x-api-key", "key-acme-0001"),
            ("authorization", "Bearer secret-token"),
        ],
        "{\"card\":\"4242-secret\"}",
    )
    .await;
    until("the alert reached the webhook", || webhook.hit_count() >= 1).await;
    let hits = webhook.hits();
    assert_eq!(hits.len(), 1, "one alert per dead letter");
    let hit = &hits[0];
    assert_eq!(hit.method, "POST");
    assert_eq!(hit.uri.path(), "/alerts/T0/abc");
    assert_eq!(
        hit.headers.get("content-type").unwrap(),
        "application/json",
        "{:?}",
        hit.headers
    );
    for name in ["authorization", "x-api-key", "cookie", "idempotency-key"] {
        assert!(
            hit.headers.get(name).is_none(),
            "{name} sent to the webhook"
        );
    }
    let text = String::from_utf8_lossy(&hit.body);
    assert!(!text.contains("4242"), "payload in the alert: {text}");
    assert!(
        !text.contains("secret-token"),
        "credential in the alert: {text}"
    );
    let json: serde_json::Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(json["event"], "delivery.dead_lettered", "{json}");
    assert_eq!(json["queue"], "hooks", "{json}");
    assert_eq!(json["delivery_id"], id.as_str(), "{json}");
    assert_eq!(json["attempts"], 1, "{json}");
    assert_eq!(json["tenant"], "acme", "{json}");
    assert!(json["reason"].as_str().unwrap().contains("422"), "{json}");
    assert!(json["dead_at_ms"].as_i64().unwrap() > 0, "{json}");
    until_alerts(&gateway, "sent", 1.0).await;
    assert_eq!(upstream.hit_count(), 1, "a 422 is not retried");
}

#[tokio::test]
async fn a_webhook_that_never_answers_does_not_hold_up_delivery() {
    // The first message dies (400); the second must be delivered while the webhook still
    // holds the alert of the first.
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![Step::status(400)], Step::ok("done")).await;
    let gate = Gate::new();
    let webhook =
        ScriptedUpstream::start_with_fallback(vec![], Step::gated(&gate, Step::ok("late"))).await;
    let delivery = format!(
        ", max_in_flight = 1, alert_webhook = \"{}/a\", alert_timeout = \"60s\"",
        webhook.url()
    );
    let gateway = GatewayProcess::start(BIN, &config(&upstream, &delivery, "")).await;
    accept(&gateway, &[], "dies").await;
    until("the alert is held by the webhook", || {
        webhook.hit_count() >= 1
    })
    .await;
    accept(&gateway, &[], "lives").await;
    until("the second message delivered", || {
        upstream.hits().iter().any(|h| h.answered == Some(200))
    })
    .await;
    assert_eq!(
        alerts(&gateway, "sent").await,
        0.0,
        "the alert is still held"
    );
    gate.open();
    until_alerts(&gateway, "sent", 1.0).await;
    assert_eq!(webhook.hit_count(), 1);
}

#[tokio::test]
async fn an_unreachable_webhook_is_counted_and_logged_without_its_path() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::status(400)).await;
    let delivery = format!(
        ", alert_webhook = \"http://{}/hooks/secret-path\", alert_timeout = \"2s\"",
        closed_addr()
    );
    let gateway = GatewayProcess::start(BIN, &config(&upstream, &delivery, "")).await;
    accept(&gateway, &[], "dies").await;
    until_alerts(&gateway, "failed", 1.0).await;
    let logs = gateway.logs();
    assert!(logs.contains("dead-letter alert not delivered"), "{logs}");
    assert!(
        !logs.contains("secret-path"),
        "the webhook's path logged: {logs}"
    );
    assert_eq!(alerts(&gateway, "sent").await, 0.0);
}
