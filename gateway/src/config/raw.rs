//! Stage one: the TOML file as serde structs, with documented defaults and unknown fields
//! refused. Nothing here is trusted yet; `validate` turns it into [`super::Config`].

use serde::{Deserialize, Serialize};

pub use super::balance::{
    RawDiscovery, RawEndpoint, RawHealthCheck, RawOutlier, RawWeightedEndpoint,
};
use super::duration::{AttemptTimeout, HumanDuration};

/// Default proxy listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin/operations listener.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";
/// Default request body limit (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// Default limit on the total size of request headers (16 KiB, nginx's large buffer size × 2).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Default global in-flight cap before load shedding.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;
/// Default share of `server.max_in_flight` kept for `priority = "critical"` routes.
pub const DEFAULT_CRITICAL_RESERVE: f64 = 0.1;
/// Default time in-flight requests get to finish after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: HumanDuration = HumanDuration::secs(30);
/// Default time a client has to send its request head (slowloris defence).
pub const DEFAULT_HEADER_READ_TIMEOUT: HumanDuration = HumanDuration::secs(10);
/// Default `server.keep_alive_timeout`: nginx's `keepalive_timeout`.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT: HumanDuration = HumanDuration::secs(75);
/// Default `server.send_timeout`: nginx's `send_timeout`.
pub const DEFAULT_SEND_TIMEOUT: HumanDuration = HumanDuration::secs(60);
/// Default `server.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// The whole file.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Listeners and request limits.
    #[serde(default)]
    pub server: RawServer,
    /// Where state and configuration data live.
    #[serde(default)]
    pub storage: RawStorage,
    /// Rate-limit policies that are not per tenant.
    #[serde(default)]
    pub rate_limit: RawRateLimit,
    /// Tenants upserted into the database at start-up.
    #[serde(default)]
    pub tenants: Vec<RawTenant>,
    /// Backends.
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    /// Requests (by host, method, headers and path) mapped to upstreams.
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    /// The built-in demo upstream.
    #[serde(default)]
    pub demo: RawDemo,
    /// Caller authentication besides API keys.
    #[serde(default)]
    pub auth: super::auth::RawAuth,
    /// How endpoint host names are resolved.
    #[serde(default)]
    pub discovery: RawDiscovery,
    /// Tracing export, access log, per-tenant metric labels.
    #[serde(default)]
    pub telemetry: super::telemetry::RawTelemetry,
}

/// `[server]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    /// Proxy listener address.
    pub listen: String,
    /// Admin/operations listener address (`/metrics`, `/healthz`, `/readyz`, admin API).
    pub admin_listen: String,
    /// Largest accepted request body; larger → 413.
    pub max_body_bytes: u64,
    /// Largest accepted request head (request line + headers); larger → 431.
    pub max_header_bytes: usize,
    /// Global concurrent-request cap; above it → 503 + Retry-After at once.
    pub max_in_flight: usize,
    /// Share of `max_in_flight` (0.0..=0.9) only `priority = "critical"` routes may use:
    /// other requests are shed once `max_in_flight × (1 − critical_reserve)` are in flight.
    pub critical_reserve: f64,
    /// CIDRs whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<String>,
    /// Bound on graceful shutdown.
    pub shutdown_grace: HumanDuration,
    /// Bound on receiving a request head (and a fresh connection's first request).
    pub header_read_timeout: HumanDuration,
    /// Idle keep-alive connections are closed after this; advertised as `Keep-Alive`.
    pub keep_alive_timeout: HumanDuration,
    /// A client that takes none of a pending write for this long is disconnected.
    pub send_timeout: HumanDuration,
    /// Open client connections on the proxy listener at most.
    pub max_connections: usize,
    /// Bound on receiving a whole request body.
    pub body_read_timeout: HumanDuration,
    /// `"human"` or `"json"` logs.
    pub log_format: String,
    /// Tokio worker threads (0 = one per core).
    pub worker_threads: usize,
    /// Serve HTTP/2 with prior knowledge (h2c) on the plain listener, besides HTTP/1.1.
    pub h2c: bool,
    /// HTTP/2 limits toward clients.
    pub http2: RawHttp2,
    /// TLS on the proxy listener; absent → plain HTTP.
    pub tls: Option<RawListenerTls>,
    /// TLS on the admin listener, with its own certificate; absent → plain HTTP.
    pub admin_tls: Option<RawListenerTls>,
}

impl Default for RawServer {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.into(),
            admin_listen: DEFAULT_ADMIN_LISTEN.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            critical_reserve: DEFAULT_CRITICAL_RESERVE,
            trusted_proxies: Vec::new(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            keep_alive_timeout: DEFAULT_KEEP_ALIVE_TIMEOUT,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            body_read_timeout: HumanDuration::secs(30),
            log_format: "human".into(),
            worker_threads: 0,
            h2c: true,
            http2: RawHttp2::default(),
            tls: None,
            admin_tls: None,
        }
    }
}

/// `[storage]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStorage {
    /// Rate-limit and idempotency state: `"memory"` or `"redis://host:port"`.
    pub state: String,
    /// Idempotency records only, overriding `state`: `"memory"`, `"redis://…"`, `"postgres://…"`.
    pub idempotency: Option<String>,
    /// Tenants, keys, quotas, audit: `"sqlite://path"` or `"postgres://…"`.
    pub database: String,
    /// Bound on the memory idempotency store, in bytes.
    pub memory_max_bytes: u64,
    /// Timeout of one state-store round trip (Redis).
    pub state_timeout: HumanDuration,
    /// Connections of the PostgreSQL idempotency store; unset: eight per core, 16–64.
    pub postgres_pool_size: Option<u32>,
}

impl Default for RawStorage {
    fn default() -> Self {
        Self {
            state: "memory".into(),
            idempotency: None,
            database: "sqlite://portcullis.db".into(),
            memory_max_bytes: 256 * 1024 * 1024,
            state_timeout: HumanDuration::millis(50),
            postgres_pool_size: None,
        }
    }
}

/// `[rate_limit]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRateLimit {
    /// `"fail_open"` or `"fail_closed"` when the state store fails.
    pub on_store_error: String,
    /// Gateway replicas sharing the state store; the fail-open local share is limit / replicas.
    pub replicas: u32,
    /// `"exact"` (one store round trip per decision) or `"batched"` (leased batches).
    pub sync: String,
    /// Batched: the fraction of a policy's limit the fleet may over-admit.
    pub max_overshoot: f64,
    /// Per client IP, for requests without an API key.
    pub anonymous: Option<RawBucket>,
    /// Ceiling over all traffic.
    pub global: Option<RawBucket>,
}

impl Default for RawRateLimit {
    fn default() -> Self {
        Self {
            on_store_error: "fail_open".into(),
            replicas: 1,
            sync: "exact".into(),
            max_overshoot: 0.05,
            anonymous: None,
            global: None,
        }
    }
}

/// A token bucket: `rate` tokens every `per`, holding at most `burst`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBucket {
    /// Tokens added per period.
    pub rate: u64,
    /// The period.
    pub per: HumanDuration,
    /// Bucket capacity.
    pub burst: u64,
    /// Evaluate and emit headers but never reject.
    #[serde(default)]
    pub shadow: bool,
}

/// `[[tenants]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    /// Stable tenant id.
    pub id: String,
    /// API keys (plaintext here; stored hashed).
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// Tokens per period.
    pub rate: u64,
    /// The period.
    pub per: HumanDuration,
    /// Bucket capacity.
    pub burst: u64,
    /// Requests allowed per UTC day.
    #[serde(default)]
    pub daily_quota: Option<u64>,
    /// Requests allowed per UTC calendar month.
    #[serde(default)]
    pub monthly_quota: Option<u64>,
    /// Requests of this tenant in flight at once (per replica); over it → 429.
    #[serde(default)]
    pub max_in_flight: Option<u64>,
}

/// `[[upstreams]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Name routes refer to; also the `dependency` label in metrics.
    pub name: String,
    /// `http://host:port` base URLs or `{ url, weight }`; host names are re-resolved.
    #[serde(default)]
    pub endpoints: Vec<RawEndpoint>,
    /// `"round_robin"` (default), `"least_request"` or `"peak_ewma"`.
    #[serde(default = "default_load_balancer")]
    pub load_balancer: String,
    /// Active health checks; absent → none.
    #[serde(default)]
    pub health_check: Option<RawHealthCheck>,
    /// Passive outlier ejection.
    #[serde(default)]
    pub outlier: RawOutlier,
    /// Below this percentage of usable endpoints, balance over all of them (Envoy's panic).
    #[serde(default = "default_panic_threshold")]
    pub panic_threshold: u8,
    /// A file of endpoint URLs (one per line, optional weight), watched for changes.
    #[serde(default)]
    pub endpoints_file: Option<String>,
    /// How often host names are re-resolved and `endpoints_file` is checked.
    #[serde(default = "default_resolve_interval")]
    pub resolve_interval: HumanDuration,
    /// TCP connect timeout.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// Time one attempt may wait for response headers, or `"auto"`.
    #[serde(default = "default_attempt_timeout")]
    pub attempt_timeout: AttemptTimeout,
    /// With `attempt_timeout = "auto"`: the learned timeout never goes below this.
    #[serde(default = "default_attempt_timeout_floor")]
    pub attempt_timeout_floor: HumanDuration,
    /// With `attempt_timeout = "auto"`: the learned timeout never goes above this, and is
    /// this until enough attempts are measured.
    #[serde(default = "default_attempt_timeout_max")]
    pub attempt_timeout_max: HumanDuration,
    /// The backend deduplicates on the forwarded `Idempotency-Key`.
    #[serde(default)]
    pub dedupes_idempotency_keys: bool,
    /// Retry policy (seed 002 defaults).
    #[serde(default)]
    pub retry: RawRetry,
    /// Circuit breaker.
    #[serde(default)]
    pub circuit_breaker: RawBreaker,
    /// Idle keep-alive connections kept per endpoint.
    #[serde(default = "default_pool_idle")]
    pub pool_max_idle: usize,
    /// Verification and client certificate for `https://` endpoints.
    #[serde(default)]
    pub tls: Option<RawUpstreamTls>,
    /// Bound on the TLS handshake after TCP connect; retryable when it fires.
    #[serde(default = "default_tls_handshake_timeout")]
    pub tls_handshake_timeout: HumanDuration,
    /// Speak HTTP/2 to the upstream: prior knowledge (h2c) on http://, ALPN h2 on https://.
    #[serde(default)]
    pub http2: bool,
    /// Adaptive throttling: `true`, or a table with its bounds. Off by default.
    #[serde(default)]
    pub adaptive: RawAdaptive,
}

/// `adaptive = true | false | { min_rate, max_rate, latency_tolerance, max_wait }` on an
/// upstream.
#[derive(Debug, Clone, Default)]
pub enum RawAdaptive {
    /// `adaptive = false` or absent.
    #[default]
    Off,
    /// `adaptive = true` or a table: on, with these bounds.
    On(RawAdaptiveBounds),
}

/// The bounds of `adaptive = { … }`; every field has a default, so `adaptive = true` is
/// the same as `adaptive = {}`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdaptiveBounds {
    /// The lowest rate the controller backs off to, requests per second.
    pub min_rate: f64,
    /// A ceiling on the learned rate, requests per second (none by default).
    pub max_rate: Option<f64>,
    /// Latency gradient (short average over long average) read as congestion; 0 ignores
    /// latency.
    pub latency_tolerance: f64,
    /// The longest a request over the rate waits at the edge for its token before it is
    /// refused (bounded by its deadline too).
    pub max_wait: HumanDuration,
}

impl Default for RawAdaptiveBounds {
    fn default() -> Self {
        Self {
            min_rate: portcullis_retry::DEFAULT_MIN_RATE,
            max_rate: None,
            latency_tolerance: portcullis_retry::DEFAULT_LATENCY_TOLERANCE,
            max_wait: HumanDuration(portcullis_retry::DEFAULT_MAX_WAIT),
        }
    }
}

impl Serialize for RawAdaptive {
    // `check-config` prints the effective file: `adaptive = false` or the table.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Off => serializer.serialize_bool(false),
            Self::On(bounds) => bounds.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for RawAdaptive {
    // By hand rather than `untagged`, so a wrong table says which field is wrong instead
    // of "did not match any variant".
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawAdaptive;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or a table { min_rate, max_rate, latency_tolerance }")
            }
            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<RawAdaptive, E> {
                Ok(if on {
                    RawAdaptive::On(RawAdaptiveBounds::default())
                } else {
                    RawAdaptive::Off
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawAdaptive, A::Error> {
                RawAdaptiveBounds::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawAdaptive::On)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

fn default_load_balancer() -> String {
    super::balance::DEFAULT_LOAD_BALANCER.into()
}
fn default_panic_threshold() -> u8 {
    super::balance::DEFAULT_PANIC_THRESHOLD
}
fn default_resolve_interval() -> HumanDuration {
    super::balance::DEFAULT_RESOLVE_INTERVAL
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::secs(1)
}
fn default_attempt_timeout() -> AttemptTimeout {
    AttemptTimeout::Fixed(HumanDuration::secs(5))
}
fn default_attempt_timeout_floor() -> HumanDuration {
    HumanDuration::millis(50)
}
fn default_attempt_timeout_max() -> HumanDuration {
    HumanDuration::secs(10)
}
fn default_pool_idle() -> usize {
    256
}
fn default_tls_handshake_timeout() -> HumanDuration {
    DEFAULT_TLS_HANDSHAKE_TIMEOUT
}

/// `retry = { … }` on an upstream or route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetry {
    /// Retries after the first attempt (0–5).
    pub max_retries: u32,
    /// Backoff base.
    pub base: HumanDuration,
    /// Backoff cap.
    pub cap: HumanDuration,
    /// Total time for all attempts (≤ 30 s).
    pub total: HumanDuration,
    /// `"full"` or `"decorrelated"`.
    pub jitter: String,
    /// Retries allowed as a percentage of requests (0–50).
    pub budget_percent: u32,
    /// Rolling window of the budget.
    pub budget_window: HumanDuration,
    /// Retries per second always allowed, so low traffic can retry.
    pub budget_min_retries_per_second: u32,
    /// Largest request body kept for replay.
    pub body_replay_limit: usize,
    /// How long an operation the gateway gave up retrying is remembered, so a client's
    /// retry of it gets one attempt, not a new round (0s: never).
    pub client_retry_window: HumanDuration,
}

impl Default for RawRetry {
    fn default() -> Self {
        Self {
            max_retries: 3,
            base: HumanDuration::secs(1),
            cap: HumanDuration::secs(30),
            total: HumanDuration::secs(30),
            jitter: "full".into(),
            budget_percent: 20,
            budget_window: HumanDuration::secs(30),
            budget_min_retries_per_second: 1,
            body_replay_limit: 64 * 1024,
            client_retry_window: HumanDuration::secs(30),
        }
    }
}

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

/// `circuit_breaker = { … }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawBreaker {
    /// Failure ratio that opens the breaker (0 < r ≤ 1).
    pub failure_rate: f64,
    /// Requests in the window before the ratio counts.
    pub min_requests: u32,
    /// Observation window.
    pub window: HumanDuration,
    /// Time open before half-open probes.
    pub open_for: HumanDuration,
    /// Concurrent probes while half-open.
    pub half_open_probes: u32,
    /// Distinct failing callers (tenants, anonymous client addresses) needed to open.
    pub min_callers: u32,
}

impl Default for RawBreaker {
    fn default() -> Self {
        Self {
            failure_rate: 0.5,
            min_requests: 20,
            window: HumanDuration::secs(30),
            open_for: HumanDuration::secs(10),
            half_open_probes: 3,
            min_callers: portcullis_retry::DEFAULT_MIN_CALLERS,
        }
    }
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
    pub max_in_flight: Option<u32>,
    /// `"normal"` (default) or `"critical"`: critical routes may use the share of
    /// `server.max_in_flight` kept by `server.critical_reserve`.
    #[serde(default)]
    pub priority: Option<String>,
    /// Hedged first attempts for idempotent requests.
    #[serde(default)]
    pub hedge: Option<RawHedge>,
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

/// `[demo]`: the built-in demo upstream.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDemo {
    /// Start the demo upstream.
    pub enabled: bool,
    /// Its listen address.
    pub listen: String,
}

impl Default for RawDemo {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: "127.0.0.1:9000".into(),
        }
    }
}

/// Default bound on an upstream TLS handshake (after TCP connect, which `connect_timeout`
/// bounds). Retryable when it fires: no request byte was sent.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: HumanDuration = HumanDuration::secs(3);

/// `[server.tls]` or `[server.admin_tls]`: a PEM certificate chain (leaf first) and its key.
/// Relative paths are relative to the working directory.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTls {
    /// Certificate chain file (PEM).
    pub cert: String,
    /// Private key file (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: String,
}

/// `[server.http2]`: limits of HTTP/2 connections from clients (h2 over TLS and h2c).
/// The names are the HTTP/2 SETTINGS they are advertised as (and Envoy's).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHttp2 {
    /// SETTINGS_MAX_CONCURRENT_STREAMS: streams one connection may have open (1–10000).
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE in bytes (name + value + 32 per field; 1 KiB–1 MiB).
    /// Keep it above `server.max_header_bytes` so the gateway's own 431 problem answers first.
    pub max_header_list_size: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: per-stream receive window in bytes (65535–2^31-1).
    pub initial_stream_window_size: u32,
    /// Connection-level receive window in bytes (65535–2^31-1).
    pub initial_connection_window_size: u32,
}

impl Default for RawHttp2 {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 256,
            max_header_list_size: (2 * DEFAULT_MAX_HEADER_BYTES) as u32,
            initial_stream_window_size: 1024 * 1024,
            initial_connection_window_size: 1024 * 1024,
        }
    }
}

/// `tls = { … }` on an upstream with `https://` endpoints.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    /// CA bundle (PEM) to verify the upstream against, instead of the system roots.
    pub ca: Option<String>,
    /// Client certificate chain (PEM) for upstreams that require mTLS.
    pub client_cert: Option<String>,
    /// Key of `client_cert` (PEM).
    pub client_key: Option<String>,
    /// Name to send as SNI and verify the certificate against, instead of the endpoint host.
    pub server_name: Option<String>,
}
