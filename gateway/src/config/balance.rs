//! How an upstream spreads load over its endpoints, checks them, ejects outliers and
//! discovers them: the `endpoints` entries (plain URLs or `{ url, weight }`), `load_balancer`,
//! `health_check`, `outlier`, `panic_threshold`, `endpoints_file`, `resolve_interval`, and the
//! top-level `[discovery]` table. Raw (serde) types first, then the validated ones.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;
use super::error::Issues;

/// Default `load_balancer`.
pub const DEFAULT_LOAD_BALANCER: &str = "round_robin";
/// Default `panic_threshold` (percent): Envoy's `healthy_panic_threshold`.
pub const DEFAULT_PANIC_THRESHOLD: u8 = 50;
/// Default `resolve_interval` for host-name endpoints and the `endpoints_file` poll.
pub const DEFAULT_RESOLVE_INTERVAL: HumanDuration = HumanDuration::secs(30);
/// Largest endpoint weight: keeps the smooth weighted round-robin schedule (sum of weights
/// divided by their gcd) small.
pub const MAX_WEIGHT: u32 = 1000;

// === raw ===

/// One `endpoints` entry: `"http://host:port"` or `{ url = "http://host:port", weight = 3 }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawEndpoint {
    /// A URL with weight 1.
    Url(String),
    /// A URL with a weight.
    Weighted(RawWeightedEndpoint),
}

/// `{ url, weight }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedEndpoint {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    /// Relative share of requests (1–1000).
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

// === impl RawEndpoint ===

impl RawEndpoint {
    /// The URL text.
    pub fn url(&self) -> &str {
        match self {
            Self::Url(url) => url,
            Self::Weighted(w) => &w.url,
        }
    }

    /// The weight (1 for a plain URL).
    pub fn weight(&self) -> u32 {
        match self {
            Self::Url(_) => 1,
            Self::Weighted(w) => w.weight,
        }
    }
}

/// `health_check = { path, interval, timeout, healthy, unhealthy }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHealthCheck {
    /// Path of the GET sent to every endpoint; a 2xx answer is a pass.
    pub path: String,
    /// Time between checks of an endpoint.
    pub interval: HumanDuration,
    /// Bound on one check (connect + answer).
    pub timeout: HumanDuration,
    /// Consecutive passes that mark an unhealthy endpoint healthy.
    pub healthy: u32,
    /// Consecutive failures that mark a healthy endpoint unhealthy.
    pub unhealthy: u32,
}

impl Default for RawHealthCheck {
    fn default() -> Self {
        Self {
            path: "/healthz".into(),
            interval: HumanDuration::secs(5),
            timeout: HumanDuration::secs(1),
            healthy: 2,
            unhealthy: 3,
        }
    }
}

/// `outlier = { consecutive_failures, base_ejection, max_ejection, max_ejected_percent }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawOutlier {
    /// Consecutive gateway failures (connect errors, resets, 502/503/504) that eject an
    /// endpoint; 0 turns passive ejection off.
    pub consecutive_failures: u32,
    /// First ejection time; the n-th ejection in a row lasts n times this.
    pub base_ejection: HumanDuration,
    /// Cap on one ejection.
    pub max_ejection: HumanDuration,
    /// At most this percentage of the endpoints is ejected at once.
    pub max_ejected_percent: u8,
}

impl Default for RawOutlier {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: HumanDuration::secs(30),
            max_ejection: HumanDuration::secs(300),
            max_ejected_percent: 50,
        }
    }
}

/// `[discovery]`: how host names in endpoints are resolved.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDiscovery {
    /// A hosts-style file (`IP name…` per line) consulted before the system resolver, and
    /// re-read at every resolution: names it lists resolve to its addresses only.
    pub hosts_file: Option<String>,
}

// === validated ===

/// How an upstream picks the endpoint of the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadBalancer {
    /// Smooth weighted round robin (nginx's).
    RoundRobin,
    /// Power of two random choices by in-flight requests per weight.
    LeastRequest,
    /// Peak-sensitive EWMA of latency × (in-flight + 1), per weight (linkerd, Finagle).
    PeakEwma,
}

impl LoadBalancer {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::LeastRequest => "least_request",
            Self::PeakEwma => "peak_ewma",
        }
    }
}

/// Validated `health_check`.
#[derive(Debug, Clone)]
pub struct HealthCheckSettings {
    /// Path (and query) of the check request.
    pub path: http::uri::PathAndQuery,
    /// Time between checks.
    pub interval: Duration,
    /// Bound on one check.
    pub timeout: Duration,
    /// Passes in a row to become healthy.
    pub healthy: u32,
    /// Failures in a row to become unhealthy.
    pub unhealthy: u32,
}

/// Validated `outlier`.
#[derive(Debug, Clone, Copy)]
pub struct OutlierSettings {
    /// Failures in a row that eject; 0 = off.
    pub consecutive_failures: u32,
    /// First ejection time.
    pub base_ejection: Duration,
    /// Cap on one ejection.
    pub max_ejection: Duration,
    /// Cap on the ejected share of endpoints, percent.
    pub max_ejected_percent: u8,
}

impl Default for OutlierSettings {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
        }
    }
}

/// Validated `[discovery]`.
#[derive(Debug, Clone, Default)]
pub struct DiscoverySettings {
    /// Hosts-style file consulted before the system resolver.
    pub hosts_file: Option<PathBuf>,
}

pub(super) fn load_balancer(path: &str, text: &str, issues: &mut Issues) -> LoadBalancer {
    match text {
        "round_robin" => LoadBalancer::RoundRobin,
        "least_request" => LoadBalancer::LeastRequest,
        "peak_ewma" => LoadBalancer::PeakEwma,
        other => {
            issues.push(
                format!("{path}.load_balancer"),
                format!("= {other:?}: allowed \"round_robin\", \"least_request\", \"peak_ewma\""),
            );
            LoadBalancer::RoundRobin
        }
    }
}

pub(super) fn health_check(
    path: &str,
    raw: Option<&RawHealthCheck>,
    issues: &mut Issues,
) -> Option<HealthCheckSettings> {
    let raw = raw?;
    let path = format!("{path}.health_check");
    let check_path = match raw.path.parse::<http::uri::PathAndQuery>() {
        Ok(p) if p.as_str().starts_with('/') => p,
        _ => {
            issues.push(
                format!("{path}.path"),
                format!("= {:?}: an absolute path such as \"/healthz\"", raw.path),
            );
            http::uri::PathAndQuery::from_static("/")
        }
    };
    issues.duration_range(
        &format!("{path}.interval"),
        raw.interval.get(),
        Duration::from_millis(10),
        Duration::from_secs(3600),
    );
    issues.duration_range(
        &format!("{path}.timeout"),
        raw.timeout.get(),
        Duration::from_millis(1),
        raw.interval.get().max(Duration::from_millis(1)),
    );
    issues.range(format!("{path}.healthy"), raw.healthy, 1, 100);
    issues.range(format!("{path}.unhealthy"), raw.unhealthy, 1, 100);
    Some(HealthCheckSettings {
        path: check_path,
        interval: raw.interval.get(),
        timeout: raw.timeout.get(),
        healthy: raw.healthy,
        unhealthy: raw.unhealthy,
    })
}

pub(super) fn outlier(path: &str, raw: &RawOutlier, issues: &mut Issues) -> OutlierSettings {
    let path = format!("{path}.outlier");
    issues.range(
        format!("{path}.consecutive_failures"),
        raw.consecutive_failures,
        0,
        1000,
    );
    issues.duration_range(
        &format!("{path}.base_ejection"),
        raw.base_ejection.get(),
        Duration::from_millis(10),
        Duration::from_secs(3600),
    );
    issues.duration_range(
        &format!("{path}.max_ejection"),
        raw.max_ejection.get(),
        raw.base_ejection.get(),
        Duration::from_secs(86_400),
    );
    issues.range(
        format!("{path}.max_ejected_percent"),
        raw.max_ejected_percent,
        0,
        100,
    );
    OutlierSettings {
        consecutive_failures: raw.consecutive_failures,
        base_ejection: raw.base_ejection.get(),
        max_ejection: raw.max_ejection.get(),
        max_ejected_percent: raw.max_ejected_percent,
    }
}

pub(super) fn discovery(raw: &RawDiscovery) -> DiscoverySettings {
    DiscoverySettings {
        hosts_file: raw.hosts_file.as_ref().map(PathBuf::from),
    }
}
