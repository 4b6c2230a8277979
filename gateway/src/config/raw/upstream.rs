//! Stage one of `[[upstreams]]`: endpoints, balancing, timeouts, retry, circuit breaker,
//! adaptive throttling and upstream TLS, as written in the file.

use serde::{Deserialize, Serialize};

use crate::config::balance::{RawEndpoint, RawHealthCheck, RawOutlier};
use crate::config::duration::{AttemptTimeout, HumanDuration};

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
    /// Retry policy (defaults in docs/retry-policy.md).
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
    crate::config::balance::DEFAULT_LOAD_BALANCER.into()
}
fn default_panic_threshold() -> u8 {
    crate::config::balance::DEFAULT_PANIC_THRESHOLD
}
fn default_resolve_interval() -> HumanDuration {
    crate::config::balance::DEFAULT_RESOLVE_INTERVAL
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

/// Default bound on an upstream TLS handshake (after TCP connect, which `connect_timeout`
/// bounds). Retryable when it fires: no request byte was sent.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: HumanDuration = HumanDuration::secs(3);

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
