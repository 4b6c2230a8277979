//! `docs/configuration.md` against the configuration parser: every field the parser accepts
//! is documented there, and the page documents no field the parser does not know.
//!
//! How the accepted fields are found: `FULL` below is a configuration file that sets every
//! optional table and field (only the serde stage parses it, so values need not be valid
//! together). It is parsed into the raw structs (`RawConfig`, which refuses unknown fields,
//! so `FULL` cannot hold a typo) and serialised back to JSON; every key path of that JSON
//! is a field. A field added to a raw struct appears here by itself (a `None` table as a
//! `null` leaf until `FULL` sets it), so it must be documented before this test passes.
//! Arrays add nothing to a path (`upstreams[].retry.max_retries` is
//! `upstreams.retry.max_retries`), and an empty table is a leaf (`memory_shares`,
//! `claims_to_headers`, whose keys are the operator's).
//!
//! How the page is read: a heading holding `` `[section]`s `` (`[server]`, `[[upstreams]]`,
//! `[upstreams.retry]`) sets the sections; each table row that starts with a backticked
//! name documents `section.name` for each of them (every backticked name of the first
//! cell). Rows under headings without a section (the environment table) are not fields.

use std::collections::BTreeSet;

use portcullis_gateway::config::raw::RawConfig;

const PAGE: &str = include_str!("../../docs/configuration.md");

/// Every optional table and field set at least once.
const FULL: &str = r#"
[server]
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:8081"
max_body_bytes = 1048576
max_header_bytes = 16384
load_shed_limit = 10000
max_in_flight = 10000
critical_reserve = 0.1
caller_share = 0.5
response_buffer_bytes = 65536
trusted_proxies = ["127.0.0.1/32"]
shutdown_grace = "30s"
header_read_timeout = "10s"
keep_alive_timeout = "75s"
send_timeout = "60s"
max_connections = 10000
body_read_timeout = "30s"
request_buffer_bytes = 1048576
log_format = "human"
worker_threads = 0
h2c = true
watch_config = false
http2 = { max_concurrent_streams = 256, max_header_list_size = 32768, initial_stream_window_size = 1048576, initial_connection_window_size = 1048576 }
tls = { cert = "cert.pem", key = "key.pem" }
admin_tls = { cert = "cert.pem", key = "key.pem" }

[storage]
state = "memory"
idempotency = "memory"
database = "sqlite://portcullis.db"
memory_max_bytes = 268435456
memory_shares = {}
state_timeout = "50ms"
postgres_pool_size = 16
queue = "sqlite://portcullis-queue.db"

[rate_limit]
on_store_error = "fail_open"
replicas = 1
sync = "exact"
max_overshoot = 0.05
anonymous = { rate = 10, per = "1s", burst = 20, shadow = false }
global = { rate = 10, per = "1s", burst = 20, shadow = false }

[[tenants]]
id = "acme"
api_keys = ["k"]
rate = 1
per = "1s"
burst = 1
daily_quota = 1
monthly_quota = 1
concurrency_limit = 1
max_in_flight = 1
max_websockets = 1
websocket_idle_timeout = "1m"
websocket_max_lifetime = "1h"
signature_secrets = {}

[auth]
failure_limit = 20
failure_window = "1m"

[auth.jwt]
issuer = "i"
audiences = ["a"]
jwks_url = "http://127.0.0.1:1/jwks"
jwks_file = "jwks.json"
tenant_claim = "org"
algorithms = ["RS256"]
clock_skew = "60s"
claims_to_headers = {}
forward_token = false
jwks_refresh_interval = "5m"
jwks_refresh_cooldown = "30s"
jwks_timeout = "5s"

[[upstreams]]
name = "u"
endpoints = ["http://127.0.0.1:9000", { url = "http://127.0.0.1:9001", weight = 2 }]
load_balancer = "round_robin"
health_check = { path = "/healthz", interval = "5s", timeout = "1s", healthy = 2, unhealthy = 3 }
outlier = { consecutive_failures = 5, base_ejection = "30s", max_ejection = "300s", max_ejected_percent = 50 }
panic_threshold = 50
endpoints_file = "endpoints.txt"
resolve_interval = "30s"
connect_timeout = "1s"
attempt_timeout = "5s"
attempt_timeout_floor = "50ms"
attempt_timeout_max = "10s"
dedupes_idempotency_keys = false
pool_max_idle = 256
tls = { ca = "ca.pem", client_cert = "c.pem", client_key = "k.pem", server_name = "n" }
tls_handshake_timeout = "3s"
http2 = false
adaptive = { min_rate = 1.0, max_rate = 100.0, latency_tolerance = 2.0, max_wait = "1s" }

[upstreams.retry]
max_retries = 3
base = "1s"
cap = "30s"
total = "30s"
jitter = "full"
budget_percent = 20
budget_window = "30s"
budget_min_retries_per_second = 1
body_replay_limit = 65536
client_retry_window = "30s"

[upstreams.circuit_breaker]
failure_rate = 0.5
min_requests = 20
window = "30s"
open_for = "10s"
half_open_probes = 3
min_callers = 3

[[routes]]
name = "r"
prefix = "/a"
exact = "/a"
pattern = "/a/{id}"
hosts = ["example.com"]
methods = ["GET"]
headers = [{ name = "x", value = "1", regex = "^1" }]
rewrite = "/b"
timeout = "5s"
upstream = "u"
cost = 1
limit = { rate = 1, per = "1s", burst = 1, shadow = false }
idempotent = false
strip_prefix = false
retry = { max_retries = 1, base = "1s", cap = "2s", total = "5s", jitter = "full", body_replay_limit = 1 }
idempotency = { methods = ["POST"], require_key = false, ttl = "24h", on_in_flight = "reject", wait_timeout = "10s", lease = "60s", max_key_length = 64, max_response_bytes = 1 }
concurrency_per_caller = 1
max_in_flight = 1
priority = "normal"
hedge = { after = "p95" }
cors = { allow_origins = ["https://app.example.com"], allow_methods = ["GET"], allow_headers = ["x-a"], expose_headers = ["x-b"], allow_credentials = true, max_age = "1m" }
request_headers = { set = {}, add = {}, remove = ["x-internal"] }
response_headers = { set = {}, add = {}, remove = ["server"] }
websocket = true
websocket_idle_timeout = "60s"
websocket_max_lifetime = "1h"
max_websockets = 1
delivery = { mode = "async", max_retries = 5, schedule = ["0s", "1s"], max_age = "24h", dedupe = "idempotency-key", dedupe_window = "7d", max_rate = 10.0, max_in_flight = 16, alert_webhook = "https://alerts.example/hook", alert_timeout = "5s" }
verify = { scheme = "stripe", header = "stripe-signature", secret_env = "S", tolerance = "5m" }

[demo]
enabled = false
listen = "127.0.0.1:9000"

[discovery]
hosts_file = "hosts"

[telemetry]
otlp_endpoint = "http://127.0.0.1:4318"
sampling_ratio = 0.1
service_name = "portcullis"
tenant_labels = []
access_log = true
access_log_query = false
"#;

/// Every key path of `value` (tables and leaves alike) and the leaves alone.
fn paths(
    value: &serde_json::Value,
    prefix: &str,
    all: &mut BTreeSet<String>,
    leaves: &mut BTreeSet<String>,
) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (key, inner) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                all.insert(path.clone());
                paths(inner, &path, all, leaves);
            }
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            for item in items {
                paths(item, prefix, all, leaves);
            }
        }
        _ => {
            leaves.insert(prefix.to_owned());
        }
    }
}

/// The accepted fields: (all paths, leaf paths).
fn accepted() -> (BTreeSet<String>, BTreeSet<String>) {
    let raw: RawConfig = toml::from_str(FULL).unwrap_or_else(|err| panic!("FULL: {err}"));
    let json = serde_json::to_value(&raw).unwrap();
    let (mut all, mut leaves) = (BTreeSet::new(), BTreeSet::new());
    paths(&json, "", &mut all, &mut leaves);
    (all, leaves)
}

/// The backticked tokens of `text`, in order.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The fields `page` documents, as `section.field` with `[]` and brackets removed.
fn documented(page: &str) -> BTreeSet<String> {
    let mut sections: Vec<String> = Vec::new();
    let mut fields = BTreeSet::new();
    for line in page.lines() {
        if line.starts_with('#') {
            sections = backticked(line)
                .into_iter()
                .filter(|token| token.starts_with('['))
                .map(|token| token.trim_matches(|c| c == '[' || c == ']').to_owned())
                .collect();
        } else if let Some(row) = line.strip_prefix("| `") {
            let first_cell = row.split(" |").next().unwrap_or_default();
            for field in backticked(&format!("`{first_cell}")) {
                for section in &sections {
                    fields.insert(format!("{section}.{field}").replace("[]", ""));
                }
            }
        }
    }
    fields
}

#[test]
fn every_accepted_field_is_documented_and_nothing_else() {
    let (all, leaves) = accepted();
    let documented = documented(PAGE);
    let missing: Vec<_> = leaves.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&all).collect();
    assert!(
        missing.is_empty(),
        "fields the parser accepts but docs/configuration.md does not document: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "fields docs/configuration.md documents but the parser does not accept: {unknown:?}"
    );
}

#[test]
fn the_page_reader_finds_sections_and_rows() {
    let page = "## `[server]`\n| field | x |\n|---|---|\n| `listen` | a |\n\
                ## Env\n| `RUST_LOG` | b |\n\
                ### `[upstreams.retry]`, `[routes.retry]`\n| `base`, `cap` | c `not_me` |\n";
    let found: Vec<_> = documented(page).into_iter().collect();
    assert_eq!(
        found,
        [
            "routes.retry.base",
            "routes.retry.cap",
            "server.listen",
            "upstreams.retry.base",
            "upstreams.retry.cap"
        ]
    );
}

#[test]
fn the_field_walk_sees_tables_leaves_and_arrays() {
    let json = serde_json::json!({
        "a": { "b": 1, "m": {} },
        "list": [{ "x": 1 }, "plain"],
        "none": null
    });
    let (mut all, mut leaves) = (BTreeSet::new(), BTreeSet::new());
    paths(&json, "", &mut all, &mut leaves);
    assert_eq!(
        leaves.into_iter().collect::<Vec<_>>(),
        ["a.b", "a.m", "list", "list.x", "none"]
    );
    assert!(all.contains("a") && all.contains("list"));
}
