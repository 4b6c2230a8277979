//! Stage one of `[[routes]]`: matching, the upstream, and the route's own overrides of
//! retry, idempotency and hedging, as written in the file.

use serde::{Deserialize, Serialize};

use crate::config::bucket::RawBucket;
use crate::config::duration::HumanDuration;

/// `retry = { … }` on a route: overrides of the upstream's policy.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteRetry {
    /// Retries after the first attempt (0–5).
    pub max_retries: Option<u32>,
    /// Backoff base.
    pub base: Option<HumanDuration>,
    /// Backoff cap.
    pub cap: Option<HumanDuration>,
    /// Total time for all attempts (≤ 30 s).
    pub total: Option<HumanDuration>,
    /// `"full"` or `"decorrelated"`.
    pub jitter: Option<String>,
    /// Largest request body kept for replay.
    pub body_replay_limit: Option<usize>,
}

/// `[[routes]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// The route's identity (metrics label, per-route quota overrides, rate-limit keys,
    /// idempotency scope); default: its `prefix`, `exact` or `pattern` text. Unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Path prefix, on a segment boundary. Exactly one of `prefix`, `exact`, `pattern`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Exact path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// Segment pattern: `/orders/{id}/items`, `/files/{*rest}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Hosts (`api.example.com`, `*.example.com`); empty: any host.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Methods; empty: any method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Header conditions, all of which must hold.
    #[serde(default)]
    pub headers: Vec<RawHeaderMatch>,
    /// Replaces the matched prefix (or the exact path) before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<String>,
    /// Whole-request deadline on this route (the retry policy's `total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// Upstream name.
    pub upstream: String,
    /// Tokens one request costs.
    #[serde(default = "default_cost")]
    pub cost: u32,
    /// Own per-tenant limit on this route.
    #[serde(default)]
    pub limit: Option<RawBucket>,
    /// Treat every method on this route as idempotent for retries.
    #[serde(default)]
    pub idempotent: bool,
    /// Remove the prefix before forwarding.
    #[serde(default)]
    pub strip_prefix: bool,
    /// Retry policy override; unset fields inherit the upstream's. The budget stays per
    /// upstream, so budget fields are refused here.
    #[serde(default)]
    pub retry: Option<RawRouteRetry>,
    /// Idempotency-Key handling.
    #[serde(default)]
    pub idempotency: Option<RawIdempotency>,
    /// Requests of one caller (tenant, else client address) in flight at once on this
    /// route; over it → 429.
    #[serde(default)]
    pub concurrency_per_caller: Option<u32>,
    /// Deprecated name of `concurrency_per_caller`, accepted with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// `"normal"` (default) or `"critical"`: critical routes may use the share of
    /// `server.load_shed_limit` kept by `server.critical_reserve`.
    #[serde(default)]
    pub priority: Option<String>,
    /// Hedged first attempts for idempotent requests.
    #[serde(default)]
    pub hedge: Option<RawHedge>,
    /// Browser origins that may call the route (preflights answered at the edge).
    #[serde(default)]
    pub cors: Option<RawCors>,
    /// Header rules on the request sent upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<RawHeaderRules>,
    /// Header rules on the upstream's response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<RawHeaderRules>,
    /// Forward WebSocket handshakes (`Upgrade: websocket`) and tunnel the connection after
    /// the upstream's 101; otherwise `Upgrade` is removed like any hop-by-hop field.
    #[serde(default)]
    pub websocket: bool,
    /// A tunnel with no byte either way for this long is closed (1001); default 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket_idle_timeout: Option<HumanDuration>,
    /// A tunnel open this long is closed (1001); default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket_max_lifetime: Option<HumanDuration>,
    /// Open WebSocket tunnels on this route (per replica); a handshake over it → 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_websockets: Option<u32>,
    /// `delivery = { mode = "async", … }`: accept, store and deliver later
    /// (docs/async-delivery.md); default synchronous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<RawDelivery>,
    /// `verify = { scheme = …, secret_env = … }`: inbound signature check on the raw body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<RawVerify>,
}

/// `delivery = { … }` on a route; unset fields take the defaults of
/// `portcullis_retry::DeliverySchedule` and the dedupe defaults.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawDelivery {
    /// `"sync"` (the default: proxied) or `"async"` (stored, answered 202, delivered later).
    pub mode: String,
    /// Retries after the first delivery attempt (3–8, default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// Waits before each retry, non-decreasing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<HumanDuration>>,
    /// A message undelivered this long after acceptance is dead (≤ 24 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<HumanDuration>,
    /// `"idempotency-key"`, `"header:NAME"` or `"json:/pointer"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe: Option<String>,
    /// How long a dedupe record is kept (≥ 7 d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_window: Option<HumanDuration>,
    /// Deliveries started per second on this route's queue, at most (`50` or `2.5`).
    #[serde(
        default,
        deserialize_with = "number",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_rate: Option<f64>,
    /// Deliveries of this route's queue in flight at once, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// `http://` or `https://` URL POSTed a small JSON on each dead letter of this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_webhook: Option<String>,
    /// How long one alert POST may take, all of it (default 5 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_timeout: Option<HumanDuration>,
}

/// An optional number written as an integer or a float.
fn number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Int(i64),
        Float(f64),
    }
    Ok(
        Option::<Number>::deserialize(deserializer)?.map(|n| match n {
            // Rates are far below 2^53: the conversion is exact.
            #[allow(clippy::cast_precision_loss)]
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }),
    )
}

/// `verify = { … }` on a route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    /// `"hmac-sha256"`, `"stripe"` or `"standard-webhooks"`.
    pub scheme: String,
    /// The signature header (default per scheme).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Environment variable holding the secret, read at start-up.
    pub secret_env: String,
    /// Largest clock difference accepted on a signed timestamp (stripe, standard-webhooks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<HumanDuration>,
}

/// `cors = { allow_origins = [...], ... }` on a route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCors {
    /// `"https://app.example.com"`, `"https://*.example.com"` or `"*"`.
    pub allow_origins: Vec<String>,
    /// Methods a preflight may ask for (default GET, HEAD, POST, PUT, PATCH, DELETE).
    #[serde(default)]
    pub allow_methods: Option<Vec<String>>,
    /// Request headers a preflight may ask for (default: the gateway's client headers).
    #[serde(default)]
    pub allow_headers: Option<Vec<String>>,
    /// Response headers a page may read (default: the rate-limit fields and request id).
    #[serde(default)]
    pub expose_headers: Option<Vec<String>>,
    /// Cookies and credentials allowed (not with `"*"`).
    #[serde(default)]
    pub allow_credentials: bool,
    /// How long a browser may cache a preflight answer.
    #[serde(default = "RawCors::default_max_age")]
    pub max_age: HumanDuration,
}

impl RawCors {
    fn default_max_age() -> HumanDuration {
        HumanDuration::secs(600)
    }
}

impl Default for RawCors {
    fn default() -> Self {
        Self {
            allow_origins: Vec::new(),
            allow_methods: None,
            allow_headers: None,
            expose_headers: None,
            allow_credentials: false,
            max_age: Self::default_max_age(),
        }
    }
}

/// `request_headers = { set = { … }, add = { … }, remove = [ … ] }` (and
/// `response_headers`) on a route; values may name `${request_id}`, `${tenant}`,
/// `${client_ip}` and `${route}`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderRules {
    /// Fields replaced (or created) with these values.
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
    /// Fields appended with these values, beside any already there.
    #[serde(default)]
    pub add: std::collections::BTreeMap<String, String>,
    /// Fields removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// `hedge = { after = "p95" }` on a route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHedge {
    /// `"p50"`…`"p99.9"` of the upstream's measured attempt latency, or a duration.
    pub after: String,
}

/// `headers = [{ name = "x-version", value = "2" }, { name = "x-tenant", regex = "^eu-" }]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    /// Field name (case-insensitive).
    pub name: String,
    /// Exact value (case-sensitive). Exactly one of `value`, `regex`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Regex searched in the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

fn default_cost() -> u32 {
    1
}

/// `idempotency = { … }` on a route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawIdempotency {
    /// Methods the key applies to.
    pub methods: Vec<String>,
    /// A request without a key → 400.
    pub require_key: bool,
    /// Retention of completed records (≥ 24 h).
    pub ttl: HumanDuration,
    /// `"reject"` (409) or `"wait"` for a duplicate in flight.
    pub on_in_flight: String,
    /// Longest wait in `"wait"` mode.
    pub wait_timeout: HumanDuration,
    /// In-flight lease; must exceed the route's total retry time.
    pub lease: HumanDuration,
    /// Longest accepted key (1–255).
    pub max_key_length: usize,
    /// Largest response stored for replay.
    pub max_response_bytes: usize,
}

impl Default for RawIdempotency {
    fn default() -> Self {
        Self {
            methods: vec!["POST".into(), "PATCH".into()],
            require_key: false,
            ttl: HumanDuration::secs(24 * 3600),
            on_in_flight: "reject".into(),
            wait_timeout: HumanDuration::secs(10),
            lease: HumanDuration::secs(60),
            max_key_length: 64,
            max_response_bytes: 1024 * 1024,
        }
    }
}
