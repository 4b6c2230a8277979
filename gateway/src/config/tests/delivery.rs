//! `delivery`, `verify` and `storage.queue`: defaults, short test schedules, and refusals that
//! name their field.

use std::collections::HashMap;
use std::time::Duration;

use super::{env, invalid_paths};
use crate::config::{Config, DedupeSource, QueueBackend, SignatureScheme};

const UPSTREAM: &str = "[[upstreams]]\nname = \"hooks\"\nendpoints = [\"http://127.0.0.1:9001\"]\n";

fn route(extra: &str) -> String {
    format!("{UPSTREAM}\n[[routes]]\nprefix = \"/hooks\"\nupstream = \"hooks\"\n{extra}\n")
}

#[test]
fn async_delivery_defaults_are_the_policy_table() {
    let config = Config::parse(&route("delivery = { mode = \"async\" }"), &env()).unwrap();
    let d = config.routes[0].delivery.as_ref().unwrap();
    assert_eq!(d.schedule, portcullis_retry::DeliverySchedule::default());
    assert_eq!(d.schedule.max_retries(), 5);
    assert_eq!(d.dedupe, DedupeSource::IdempotencyKey);
    assert_eq!(d.dedupe_window, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(d.max_in_flight, 16);
    assert_eq!(d.max_rate, None);
    assert!(config.routes[0].verify.is_none());
}

#[test]
fn short_schedules_and_dedupe_sources_are_accepted() {
    let text = route(
        r#"delivery = { mode = "async", max_retries = 3, schedule = ["50ms", "50ms", "100ms"], max_age = "1m", dedupe = "header:X-GitHub-Delivery", dedupe_window = "8d", max_rate = 2.5, max_in_flight = 4 }"#,
    );
    let config = Config::parse(&text, &env()).unwrap();
    let d = config.routes[0].delivery.as_ref().unwrap();
    assert_eq!(
        d.schedule.band(1),
        (Duration::from_millis(50), Duration::from_millis(50))
    );
    assert_eq!(d.schedule.max_age(), Duration::from_secs(60));
    assert_eq!(
        d.dedupe,
        DedupeSource::Header(http::HeaderName::from_static("x-github-delivery"))
    );
    assert_eq!(d.max_rate, Some(2.5));
    let int_rate = route(r#"delivery = { mode = "async", max_rate = 50 }"#);
    let config = Config::parse(&int_rate, &env()).unwrap();
    assert_eq!(
        config.routes[0].delivery.as_ref().unwrap().max_rate,
        Some(50.0)
    );
    let json = route(r#"delivery = { mode = "async", dedupe = "json:/data/id" }"#);
    let config = Config::parse(&json, &env()).unwrap();
    assert_eq!(
        config.routes[0].delivery.as_ref().unwrap().dedupe,
        DedupeSource::Json("/data/id".into())
    );
    let sync = route(r#"delivery = { mode = "sync" }"#);
    assert!(Config::parse(&sync, &env()).unwrap().routes[0]
        .delivery
        .is_none());
}

#[test]
fn delivery_refusals_name_their_field() {
    for (extra, field) in [
        (r#"mode = "later""#, "routes[0].delivery.mode"),
        (
            r#"mode = "async", max_retries = 2"#,
            "routes[0].delivery.max_retries",
        ),
        (
            r#"mode = "async", max_retries = 9"#,
            "routes[0].delivery.max_retries",
        ),
        (
            r#"mode = "async", schedule = ["5s", "1s"]"#,
            "routes[0].delivery.schedule",
        ),
        (
            r#"mode = "async", schedule = []"#,
            "routes[0].delivery.schedule",
        ),
        (
            r#"mode = "async", max_age = "25h""#,
            "routes[0].delivery.max_age",
        ),
        (
            r#"mode = "async", dedupe_window = "6d""#,
            "routes[0].delivery.dedupe_window",
        ),
        (
            r#"mode = "async", dedupe = "body""#,
            "routes[0].delivery.dedupe",
        ),
        (
            r#"mode = "async", dedupe = "json:id""#,
            "routes[0].delivery.dedupe",
        ),
        (
            r#"mode = "async", dedupe = "header:bad name""#,
            "routes[0].delivery.dedupe",
        ),
        (
            r#"mode = "async", max_rate = 0.0"#,
            "routes[0].delivery.max_rate",
        ),
        (
            r#"mode = "async", max_in_flight = 0"#,
            "routes[0].delivery.max_in_flight",
        ),
        (
            r#"mode = "sync", max_retries = 5"#,
            "routes[0].delivery.max_retries",
        ),
        (
            r#"mode = "async", alert_webhook = "ftp://alerts.example/x""#,
            "routes[0].delivery.alert_webhook",
        ),
        (
            r#"mode = "async", alert_webhook = "/relative""#,
            "routes[0].delivery.alert_webhook",
        ),
        (
            r#"mode = "async", alert_timeout = "1s""#,
            "routes[0].delivery.alert_timeout",
        ),
        (
            r#"mode = "async", alert_webhook = "http://127.0.0.1:9/a", alert_timeout = "2m""#,
            "routes[0].delivery.alert_timeout",
        ),
        (
            r#"mode = "sync", alert_webhook = "http://127.0.0.1:9/a""#,
            "routes[0].delivery.alert_webhook",
        ),
    ] {
        let paths = invalid_paths(&route(&format!("delivery = {{ {extra} }}")));
        assert_eq!(paths, [field], "{extra}");
    }
}

#[test]
fn an_async_route_dedupes_with_delivery_not_idempotency() {
    let text = route("delivery = { mode = \"async\" }\nidempotency = { require_key = true }");
    assert_eq!(invalid_paths(&text), ["routes[0].idempotency"]);
    let text = route("delivery = { mode = \"async\" }\nwebsocket = true");
    assert_eq!(invalid_paths(&text), ["routes[0].delivery.mode"]);
}

fn secret_env() -> HashMap<String, String> {
    HashMap::from([
        (
            "HOOK_SECRET".to_owned(),
            "It's a Secret to Everybody".to_owned(),
        ),
        (
            "SW_SECRET".to_owned(),
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(),
        ),
    ])
}

#[test]
fn verify_reads_its_secret_from_the_environment() {
    let text = route(r#"verify = { scheme = "hmac-sha256", secret_env = "HOOK_SECRET" }"#);
    let config = Config::parse(&text, &secret_env()).unwrap();
    let v = config.routes[0].verify.as_ref().unwrap();
    assert_eq!(v.scheme, SignatureScheme::HmacSha256);
    assert_eq!(v.header, "x-hub-signature-256");
    assert_eq!(v.key.expose(), b"It's a Secret to Everybody");
    assert!(
        !format!("{config:?}").contains("Secret to Everybody"),
        "key in Debug"
    );
    let text = route(
        r#"verify = { scheme = "standard-webhooks", secret_env = "SW_SECRET", tolerance = "1m" }"#,
    );
    let config = Config::parse(&text, &secret_env()).unwrap();
    let v = config.routes[0].verify.as_ref().unwrap();
    assert_eq!(v.header, "webhook-signature");
    assert_eq!(v.key.expose().len(), 24, "whsec_ base64 decoded");
    assert_eq!(v.tolerance, Duration::from_secs(60));
}

#[test]
fn verify_refusals_name_their_field() {
    for (extra, field) in [
        (
            r#"scheme = "md5", secret_env = "HOOK_SECRET""#,
            "routes[0].verify.scheme",
        ),
        (
            r#"scheme = "stripe", secret_env = "NOT_SET""#,
            "routes[0].verify.secret_env",
        ),
        (
            r#"scheme = "standard-webhooks", secret_env = "HOOK_SECRET""#,
            "routes[0].verify.secret_env",
        ),
        (
            r#"scheme = "hmac-sha256", secret_env = "HOOK_SECRET", tolerance = "5m""#,
            "routes[0].verify.tolerance",
        ),
        (
            r#"scheme = "stripe", secret_env = "HOOK_SECRET", tolerance = "2h""#,
            "routes[0].verify.tolerance",
        ),
        (
            r#"scheme = "stripe", secret_env = "HOOK_SECRET", header = "bad header""#,
            "routes[0].verify.header",
        ),
    ] {
        let text = route(&format!("verify = {{ {extra} }}"));
        match Config::parse(&text, &secret_env()) {
            Ok(_) => panic!("accepted {extra}"),
            Err(e) => {
                assert_eq!(e.paths(), [field], "{extra}");
                assert!(
                    !e.to_string().contains("Secret to Everybody"),
                    "secret in message"
                );
            }
        }
    }
}

#[test]
fn the_queue_defaults_beside_the_database() {
    let config = Config::parse(&route(""), &env()).unwrap();
    assert_eq!(
        config.storage.queue,
        QueueBackend::Sqlite("portcullis-queue.db".into())
    );
    let text = format!(
        "[storage]\ndatabase = \"sqlite:///var/lib/p/gw.db\"\n{}",
        route("")
    );
    assert_eq!(
        Config::parse(&text, &env()).unwrap().storage.queue,
        QueueBackend::Sqlite("/var/lib/p/gw-queue.db".into())
    );
    let text = format!(
        "[storage]\nqueue = \"redis://127.0.0.1:6379\"\n{}",
        route("")
    );
    assert_eq!(
        Config::parse(&text, &env()).unwrap().storage.queue,
        QueueBackend::Redis("redis://127.0.0.1:6379".into())
    );
    let text = format!("[storage]\nqueue = \"memory\"\n{}", route(""));
    assert_eq!(invalid_paths(&text), ["storage.queue"]);
}

#[test]
fn an_alert_webhook_takes_a_default_timeout_and_check_config_hides_its_path() {
    let text = route(
        r#"delivery = { mode = "async", alert_webhook = "http://127.0.0.1:9/hooks/T0/secret-path" }"#,
    );
    let config = Config::parse(&text, &env()).unwrap();
    let alert = config.routes[0]
        .delivery
        .as_ref()
        .unwrap()
        .alert
        .as_ref()
        .unwrap();
    assert_eq!(alert.timeout, Duration::from_secs(5));
    assert_eq!(alert.uri.path(), "/hooks/T0/secret-path");
    assert!(alert.tls.is_none());
    let printed = crate::config::effective_toml(&text).unwrap();
    assert!(!printed.contains("secret-path"), "{printed}");
    assert!(printed.contains("http://127.0.0.1:9/***"), "{printed}");
    let none = Config::parse(&route(r#"delivery = { mode = "async" }"#), &env()).unwrap();
    assert!(none.routes[0].delivery.as_ref().unwrap().alert.is_none());
}

#[test]
fn check_config_hides_the_queue_password() {
    let text = format!(
        "[storage]\nqueue = \"postgres://gw:hunter2pw@127.0.0.1:5432/q\"\n{}",
        route("")
    );
    let printed = crate::config::effective_toml(&text).unwrap();
    assert!(!printed.contains("hunter2pw"), "{printed}");
    assert!(
        printed.contains("postgres://gw:***@127.0.0.1:5432/q"),
        "{printed}"
    );
}

#[test]
fn a_file_tenant_may_carry_its_own_signature_secret_per_route() {
    let tenant = |secrets: &str| {
        format!(
            "[[tenants]]\nid = \"acme\"\napi_keys = [\"key-acme-0001\"]\nrate = 1\nper = \"1s\"\nburst = 1\nsignature_secrets = {{ {secrets} }}\n"
        )
    };
    let verified =
        "name = \"hooks\"\nverify = { scheme = \"standard-webhooks\", secret_env = \"SW_SECRET\" }";
    let text = format!("{}{}", tenant("hooks = \"HOOK_SECRET\""), route(verified));
    // HOOK_SECRET is not whsec_<base64>: refused on the tenant's entry, not the route's.
    match Config::parse(&text, &secret_env()) {
        Ok(_) => panic!("a malformed tenant secret was accepted"),
        Err(e) => {
            assert_eq!(e.paths(), ["tenants[0].signature_secrets.hooks"]);
            assert!(!e.to_string().contains("Secret to Everybody"));
        }
    }
    let text = format!("{}{}", tenant("hooks = \"SW_SECRET\""), route(verified));
    let config = Config::parse(&text, &secret_env()).unwrap();
    let verify = config.routes[0].verify.as_ref().unwrap();
    assert_eq!(
        verify.key_for(Some("acme")).expose(),
        verify.tenant_keys["acme"].expose()
    );
    assert_eq!(verify.key_for(Some("beta")).expose(), verify.key.expose());
    assert_eq!(verify.key_for(None).expose(), verify.key.expose());
    for (secrets, field) in [
        (
            "hooks = \"UNSET_VAR\"",
            "tenants[0].signature_secrets.hooks",
        ),
        (
            "other = \"SW_SECRET\"",
            "tenants[0].signature_secrets.other",
        ),
    ] {
        let text = format!("{}{}", tenant(secrets), route(verified));
        let paths = match Config::parse(&text, &secret_env()) {
            Ok(_) => panic!("accepted {secrets}"),
            Err(e) => e.paths(),
        };
        assert_eq!(paths, [field], "{secrets}");
    }
    // A route without verify takes no tenant secret.
    let text = format!(
        "{}{}",
        tenant("hooks = \"SW_SECRET\""),
        route("name = \"hooks\"")
    );
    let paths = match Config::parse(&text, &secret_env()) {
        Ok(_) => panic!("accepted a secret for a route without verify"),
        Err(e) => e.paths(),
    };
    assert_eq!(paths, ["tenants[0].signature_secrets.hooks"]);
}
