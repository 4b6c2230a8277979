//! Stage one: the TOML file as serde structs, with documented defaults and unknown fields
//! refused. Nothing here is trusted yet; `validate` turns it into [`Config`](super::settings::Config).

use serde::{Deserialize, Serialize};

pub use super::balance::{
    RawDiscovery, RawEndpoint, RawHealthCheck, RawOutlier, RawWeightedEndpoint,
};
use super::duration::HumanDuration;

pub mod renamed;
mod route;
mod upstream;

pub use super::bucket::RawBucket;
pub use route::{
    RawCors, RawDelivery, RawHeaderMatch, RawHeaderRules, RawHedge, RawIdempotency, RawRoute,
    RawRouteRetry, RawVerify,
};
pub use upstream::{
    RawAdaptive, RawAdaptiveBounds, RawBreaker, RawRetry, RawUpstream, RawUpstreamTls,
    DEFAULT_TLS_HANDSHAKE_TIMEOUT,
};

/// Default proxy listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin/operations listener.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";
/// Default request body limit (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// Request bodies up to this size are buffered before the upstream is contacted (1 MiB,
/// the default body limit: every accepted body is buffered unless the limit is raised).
pub const DEFAULT_REQUEST_BUFFER_BYTES: u64 = 1024 * 1024;
/// Default limit on the total size of request headers (16 KiB, nginx's large buffer size × 2).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Default global in-flight cap before load shedding.
pub const DEFAULT_LOAD_SHED_LIMIT: usize = 10_000;
/// Default share of `server.load_shed_limit` kept for `priority = "critical"` routes.
pub const DEFAULT_CRITICAL_RESERVE: f64 = 0.1;
/// Default `server.caller_share`: one caller may hold at most half of `load_shed_limit`.
pub const DEFAULT_CALLER_SHARE: f64 = 0.5;
/// Default `server.response_buffer_bytes`: what one response may have buffered toward a
/// slow client (64 KiB: about one HTTP/2 stream window, 65 535 bytes by default).
pub const DEFAULT_RESPONSE_BUFFER_BYTES: usize = 64 * 1024;
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
    /// Requests in flight on this replica above which new ones are shed: 503 + Retry-After
    /// at once.
    pub load_shed_limit: usize,
    /// Deprecated name of `load_shed_limit`, accepted with a warning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<usize>,
    /// Share of `load_shed_limit` (0.0..=0.9) only `priority = "critical"` routes may use:
    /// other requests are shed once `load_shed_limit × (1 − critical_reserve)` are in flight.
    pub critical_reserve: f64,
    /// Most of `load_shed_limit` (0.0..=1.0) one caller (tenant, else client address, IPv6
    /// by /64) may hold; past half of `load_shed_limit` no more than its fair share. 1.0: off.
    pub caller_share: f64,
    /// Bytes of one response held toward a client that reads slowly (HTTP/2 send buffer
    /// per stream, upstream read buffer); the rest waits in the upstream's flow control.
    pub response_buffer_bytes: usize,
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
    /// Request bodies up to this size are read completely before the upstream is contacted
    /// (0 = stream every body as it arrives).
    pub request_buffer_bytes: u64,
    /// `"human"` or `"json"` logs.
    pub log_format: String,
    /// Tokio worker threads (0 = one per core).
    pub worker_threads: usize,
    /// Serve HTTP/2 with prior knowledge (h2c) on the plain listener, besides HTTP/1.1.
    pub h2c: bool,
    /// Reload the configuration when its file changes (checked once a second).
    pub watch_config: bool,
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
            load_shed_limit: DEFAULT_LOAD_SHED_LIMIT,
            max_in_flight: None,
            critical_reserve: DEFAULT_CRITICAL_RESERVE,
            caller_share: DEFAULT_CALLER_SHARE,
            response_buffer_bytes: DEFAULT_RESPONSE_BUFFER_BYTES,
            trusted_proxies: Vec::new(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            keep_alive_timeout: DEFAULT_KEEP_ALIVE_TIMEOUT,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            body_read_timeout: HumanDuration::secs(30),
            request_buffer_bytes: DEFAULT_REQUEST_BUFFER_BYTES,
            log_format: "human".into(),
            worker_threads: 0,
            h2c: true,
            watch_config: false,
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
    /// Bytes of that bound a tenant (by id, or `anonymous`) may hold; others a fair share.
    pub memory_shares: std::collections::BTreeMap<String, u64>,
    /// Timeout of one state-store round trip (Redis).
    pub state_timeout: HumanDuration,
    /// Connections of the PostgreSQL idempotency store; unset: eight per core, 16–64.
    pub postgres_pool_size: Option<u32>,
    /// Messages of asynchronous routes: `"sqlite://path"`, `"postgres://…"`, `"redis://…"`,
    /// `"redis-cluster://…"`; unset: a SQLite file next to the SQLite `database`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

impl Default for RawStorage {
    fn default() -> Self {
        Self {
            state: "memory".into(),
            idempotency: None,
            database: "sqlite://portcullis.db".into(),
            memory_max_bytes: 256 * 1024 * 1024,
            memory_shares: std::collections::BTreeMap::new(),
            state_timeout: HumanDuration::millis(50),
            postgres_pool_size: None,
            queue: None,
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
    pub concurrency_limit: Option<u64>,
    /// Deprecated name of `concurrency_limit`, accepted with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u64>,
    /// Open WebSocket tunnels of this tenant on all routes (per replica); a handshake over
    /// it → 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_websockets: Option<u32>,
    /// This tenant's WebSocket idle timeout; the stricter of it and the route's applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket_idle_timeout: Option<HumanDuration>,
    /// This tenant's WebSocket maximum lifetime; the stricter of it and the route's applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket_max_lifetime: Option<HumanDuration>,
    /// Route name → environment variable holding this tenant's signature secret on that
    /// route (a route with `verify`); it replaces the route's `secret_env` for this tenant.
    #[serde(default)]
    pub signature_secrets: std::collections::BTreeMap<String, String>,
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
