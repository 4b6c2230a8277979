//! The changes the store applies, already validated: a tenant to create, its limits, a
//! partial update, a per-route override.

use std::time::Duration;

use crate::admin::validate::Patch;

/// A token bucket plus long-period quotas, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period.
    pub(crate) per: Duration,
    /// Bucket capacity.
    pub(crate) burst: u64,
    /// Requests per UTC day.
    pub(crate) daily_quota: Option<u64>,
    /// Requests per UTC month.
    pub(crate) monthly_quota: Option<u64>,
    /// Requests in flight at once (per replica).
    pub(crate) max_in_flight: Option<u64>,
    /// Open WebSocket tunnels at once (per replica).
    pub(crate) max_websockets: Option<u64>,
    /// WebSocket idle timeout (the stricter of the route's and this applies).
    pub(crate) websocket_idle_timeout: Option<Duration>,
    /// WebSocket maximum lifetime (the stricter of the route's and this applies).
    pub(crate) websocket_max_lifetime: Option<Duration>,
}

/// A tenant to create.
#[derive(Debug, Clone)]
pub(crate) struct NewTenant {
    /// Tenant id.
    pub(crate) id: String,
    /// Display name.
    pub(crate) name: String,
    /// Its limits.
    pub(crate) limits: Limits,
}

/// A partial update of a tenant; `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub(crate) struct TenantPatch {
    /// New display name.
    pub(crate) name: Option<String>,
    /// Disable or enable.
    pub(crate) disabled: Option<bool>,
    /// New rate.
    pub(crate) rate: Option<u64>,
    /// New period.
    pub(crate) per: Option<Duration>,
    /// New burst.
    pub(crate) burst: Option<u64>,
    /// Daily quota: keep, clear (`Some(None)`) or set.
    pub(crate) daily_quota: Patch<u64>,
    /// Monthly quota: keep, clear or set.
    pub(crate) monthly_quota: Patch<u64>,
    /// Concurrency limit: keep, clear or set.
    pub(crate) max_in_flight: Patch<u64>,
    /// WebSocket cap: keep, clear or set.
    pub(crate) max_websockets: Patch<u64>,
    /// WebSocket idle timeout: keep, clear or set.
    pub(crate) websocket_idle_timeout: Patch<Duration>,
    /// WebSocket maximum lifetime: keep, clear or set.
    pub(crate) websocket_max_lifetime: Patch<Duration>,
}

/// A per-route override to set.
#[derive(Debug, Clone)]
pub(crate) struct RouteQuota {
    /// Route prefix (one of the configured routes).
    pub(crate) route: String,
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period.
    pub(crate) per: Duration,
    /// Bucket capacity.
    pub(crate) burst: u64,
}
