//! Stage two's output: the validated configuration the rest of the gateway runs on, and the
//! environment it was read with. Built only by [`super::validate`]; frozen once built.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use portcullis_retry::{BreakerConfig, BudgetConfig, RetryPolicy};

use super::auth::AuthSettings;
use super::backend::{DatabaseBackend, IdempotencyBackend, StateBackend};
use super::balance::{DiscoverySettings, HealthCheckSettings, LoadBalancer, OutlierSettings};
use super::telemetry::TelemetrySettings;
use super::tls::{Http2Settings, UpstreamTls};
use crate::config::routes::header_rules::HeaderRules;
use crate::config::routes::pattern::PathRule;
use crate::config::routes::rules::{HeaderRule, HostRule};

/// Reads environment variables; tests pass a map instead of mutating the process environment.
pub trait Env {
    /// The variable's value, if set.
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for std::collections::HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// A secret string whose `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: &str) -> Self {
        Self(Arc::from(value))
    }

    /// The secret itself; call only where it is compared or hashed.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listeners and request limits.
    pub server: ServerSettings,
    /// Storage backends.
    pub storage: StorageSettings,
    /// Non-tenant rate-limit policies.
    pub rate_limit: RateLimitSettings,
    /// Tenants from the file.
    pub tenants: Vec<TenantSettings>,
    /// Backends, by index.
    pub upstreams: Vec<UpstreamSettings>,
    /// Routes, in file order.
    pub routes: Vec<RouteSettings>,
    /// Demo upstream.
    pub demo: DemoSettings,
    /// Tracing export, access log, per-tenant metric labels.
    pub telemetry: TelemetrySettings,
    /// Admin API token from the environment; `None` → admin API endpoints are disabled.
    pub admin_token: Option<Secret>,
    /// Caller authentication besides API keys (`[auth.jwt]`).
    pub auth: AuthSettings,
    /// How endpoint host names are resolved.
    pub discovery: DiscoverySettings,
    /// Fields given by a deprecated name (logged as warnings at start-up and by
    /// `check-config`).
    pub renamed: Vec<super::raw::renamed::Renamed>,
}

/// Validated `[server]`.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin_listen: SocketAddr,
    /// Request body limit.
    pub max_body_bytes: u64,
    /// Request head limit.
    pub max_header_bytes: usize,
    /// Requests in flight above which new ones are shed (503).
    pub load_shed_limit: usize,
    /// Share of the cap only critical routes may use; not held back when no route is
    /// critical (`pipeline::shed`).
    pub critical_reserve: f64,
    /// Most of the cap one caller may hold (`pipeline::fair_share`); 1.0: no limit.
    pub caller_share: f64,
    /// Bytes of one response buffered toward a slow client.
    pub response_buffer_bytes: usize,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Graceful shutdown bound.
    pub shutdown_grace: Duration,
    /// Request head read bound.
    pub header_read_timeout: Duration,
    /// Idle keep-alive bound.
    pub keep_alive_timeout: Duration,
    /// Bound on a write the client does not take.
    pub send_timeout: Duration,
    /// Connection cap of the proxy listener.
    pub max_connections: usize,
    /// Request body read bound.
    pub body_read_timeout: Duration,
    /// Bodies up to this size are read whole before the upstream is contacted
    /// (`pipeline::buffer`); 0 = off.
    pub request_buffer_bytes: u64,
    /// Log format.
    pub log_format: LogFormat,
    /// Runtime worker threads (0 = per core).
    pub worker_threads: usize,
    /// HTTP/2 prior knowledge on the plain listener.
    pub h2c: bool,
    /// Reload the configuration when its file changes (`start::reload`).
    pub watch_config: bool,
    /// HTTP/2 limits toward clients.
    pub http2: Http2Settings,
    /// Proxy listener certificate; `None` → plain HTTP.
    pub tls: Option<Arc<crate::tls::ReloadableCert>>,
    /// Admin listener certificate; `None` → plain HTTP.
    pub admin_tls: Option<Arc<crate::tls::ReloadableCert>>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// Validated `[storage]`.
#[derive(Debug, Clone)]
pub struct StorageSettings {
    /// Rate-limit state.
    pub state: StateBackend,
    /// Idempotency records.
    pub idempotency: IdempotencyBackend,
    /// Tenants database.
    pub database: DatabaseBackend,
    /// Memory idempotency store bound.
    pub memory_max_bytes: u64,
    /// Shares of that bound set per tenant id (`anonymous`: every anonymous caller together).
    pub memory_shares: std::collections::BTreeMap<String, u64>,
    /// State-store round-trip timeout.
    pub state_timeout: Duration,
    /// Connections of the PostgreSQL idempotency store, and of a PostgreSQL queue (a pool
    /// each; `None`: derived from the cores).
    pub postgres_pool_size: Option<u32>,
    /// Messages of asynchronous routes.
    pub queue: super::backend::QueueBackend,
    /// `queue` as the queue crate connects to it (it may hold a password).
    pub queue_url: Secret,
}

/// What the rate limiter does when the state store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorMode {
    /// Fall back to a local limiter sized limit/replicas.
    FailOpen,
    /// Answer 503 + Retry-After.
    FailClosed,
}

/// How the rate limiter uses a shared state store (`rate_limit.sync`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SyncMode {
    /// One round trip per decision.
    Exact,
    /// Decisions from leased batches of tokens; the fleet may over-admit up to this fraction
    /// of a policy's limit.
    Batched {
        /// `rate_limit.max_overshoot`, in (0, 1].
        max_overshoot: f64,
    },
}

/// A validated token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens per period.
    pub rate: u64,
    /// Period.
    pub per: Duration,
    /// Capacity.
    pub burst: u64,
    /// Never reject.
    pub shadow: bool,
}

/// Validated `[rate_limit]`.
#[derive(Debug, Clone)]
pub struct RateLimitSettings {
    /// Store failure behaviour.
    pub on_store_error: StoreErrorMode,
    /// Replicas sharing the store.
    pub replicas: u32,
    /// How decisions reach a shared store.
    pub sync: SyncMode,
    /// Per-IP bucket for anonymous clients.
    pub anonymous: Option<Bucket>,
    /// Global ceiling.
    pub global: Option<Bucket>,
}

/// A tenant from the file.
#[derive(Debug, Clone)]
pub struct TenantSettings {
    /// Tenant id.
    pub id: String,
    /// API keys (secret).
    pub api_keys: Vec<Secret>,
    /// The tenant's bucket.
    pub bucket: Bucket,
    /// Requests per UTC day.
    pub daily_quota: Option<u64>,
    /// Requests per UTC month.
    pub monthly_quota: Option<u64>,
    /// Requests in flight at once (per replica); over it → 429.
    pub concurrency_limit: Option<u64>,
    /// Open WebSocket tunnels at once (per replica); a handshake over it → 429.
    pub max_websockets: Option<u32>,
    /// WebSocket idle timeout; the stricter of it and the route's applies.
    pub websocket_idle_timeout: Option<Duration>,
    /// WebSocket maximum lifetime; the stricter of it and the route's applies.
    pub websocket_max_lifetime: Option<Duration>,
}

/// A validated upstream.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// Name.
    pub name: String,
    /// Endpoint base URIs (`http://host:port` or `https://host:port`).
    pub endpoints: Vec<http::Uri>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Per-attempt timeout.
    pub attempt_timeout: Duration,
    /// Backend dedupes on the forwarded key.
    pub dedupes_idempotency_keys: bool,
    /// Retry policy (routes may override parts of it).
    pub retry: RetryPolicy,
    /// Retry budget of this upstream.
    pub budget: BudgetConfig,
    /// Adaptive throttling bounds; `None` when `adaptive` is off.
    pub adaptive: Option<portcullis_retry::AdaptiveConfig>,
    /// How long a request the gateway gave up retrying is remembered (a client's retry of it
    /// gets one attempt); zero disables.
    pub client_retry_window: Duration,
    /// Circuit breaker of this upstream.
    pub circuit_breaker: BreakerConfig,
    /// Idle pooled connections per endpoint.
    pub pool_max_idle: usize,
    /// TLS client configuration, when an endpoint is `https://`.
    pub tls: Option<UpstreamTls>,
    /// Bound on the TLS handshake (after TCP connect).
    pub tls_handshake_timeout: Duration,
    /// Speak HTTP/2 to this upstream.
    pub http2: bool,
    /// Weight of each of `endpoints`, alike indexed.
    pub weights: Vec<u32>,
    /// How the next attempt's endpoint is picked.
    pub load_balancer: LoadBalancer,
    /// Active health checks, when configured.
    pub health_check: Option<HealthCheckSettings>,
    /// Passive outlier ejection.
    pub outlier: OutlierSettings,
    /// Percentage of usable endpoints below which all are used (panic mode).
    pub panic_threshold: u8,
    /// Endpoint file watched for changes.
    pub endpoints_file: Option<std::path::PathBuf>,
    /// Re-resolution and file-check interval.
    pub resolve_interval: Duration,
}

/// What a duplicate in flight gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightMode {
    /// 409 + Retry-After.
    Reject,
    /// Wait up to the bound for the first to finish, then replay.
    Wait(Duration),
}

/// Validated idempotency settings of a route.
#[derive(Debug, Clone)]
pub struct IdempotencySettings {
    /// Methods the key applies to.
    pub methods: Vec<http::Method>,
    /// Key required.
    pub require_key: bool,
    /// Retention.
    pub ttl: Duration,
    /// Duplicate-in-flight behaviour.
    pub on_in_flight: InFlightMode,
    /// In-flight lease.
    pub lease: Duration,
    /// Longest key.
    pub max_key_length: usize,
    /// Largest stored response.
    pub max_response_bytes: usize,
}

/// A validated route.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Identity: metrics label, quota overrides, rate-limit keys, idempotency scope.
    pub name: String,
    /// How the path matches.
    pub path: PathRule,
    /// Hosts; empty: any.
    pub hosts: Vec<HostRule>,
    /// Methods; empty: any.
    pub methods: Vec<http::Method>,
    /// Header conditions.
    pub headers: Vec<HeaderRule>,
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    /// Token cost.
    pub cost: u32,
    /// Own limit.
    pub limit: Option<Bucket>,
    /// All methods idempotent.
    pub idempotent: bool,
    /// What replaces the matched prefix (or exact path) when forwarding; `strip_prefix` is
    /// `"/"`.
    pub rewrite: Option<String>,
    /// Effective retry policy (the upstream's, with the route's overrides).
    pub retry: Arc<RetryPolicy>,
    /// Idempotency, when enabled.
    pub idempotency: Option<IdempotencySettings>,
    /// Requests of one caller in flight at once on this route; over it → 429.
    pub concurrency_per_caller: Option<u32>,
    /// Whether the route may use the critical reserve of `server.load_shed_limit`.
    pub priority: Priority,
    /// Browser origins that may call the route.
    pub cors: Option<Arc<super::routes::cors::CorsSettings>>,
    /// `request_headers`: rules on the request sent upstream.
    pub request_headers: Option<HeaderRules>,
    /// `response_headers`: rules on the upstream's response.
    pub response_headers: Option<HeaderRules>,
    /// WebSocket tunnels, when `websocket = true`.
    pub websocket: Option<WebSocketSettings>,
    /// `delivery = { mode = "async", … }`: accepted with a 202 and delivered later; `None`:
    /// proxied synchronously.
    pub delivery: Option<Arc<super::routes::delivery::DeliverySettings>>,
    /// `verify`: the inbound signature every request must carry.
    pub verify: Option<Arc<super::routes::verify::VerifySettings>>,
}

/// A route's WebSocket settings (`websocket = true` and the `websocket_*` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebSocketSettings {
    /// No byte either way for this long closes the tunnel.
    pub idle_timeout: Duration,
    /// A tunnel is closed after this long; `None`: no limit.
    pub max_lifetime: Option<Duration>,
    /// Open tunnels on the route at most (per replica); `None`: no limit.
    pub max_open: Option<u32>,
}

/// A route's load-shedding priority (`priority` on a route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// Shed once the normal share of `server.load_shed_limit` is in flight.
    #[default]
    Normal,
    /// Shed only at `server.load_shed_limit` itself.
    Critical,
}

/// Validated `[demo]`.
#[derive(Debug, Clone)]
pub struct DemoSettings {
    /// Start the demo upstream.
    pub enabled: bool,
    /// Its address.
    pub listen: SocketAddr,
}
