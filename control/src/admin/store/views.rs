//! What the admin API shows: tenants with their per-route overrides, and API keys (a
//! listing never holds the key; a freshly issued one does, once).

use serde::Serialize;

/// A tenant as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct TenantView {
    /// Tenant id.
    pub(crate) id: String,
    /// Display name.
    pub(crate) name: String,
    /// Disabled tenants' keys are refused with 401.
    pub(crate) disabled: bool,
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period (`"1s"`).
    pub(crate) per: String,
    /// Bucket capacity.
    pub(crate) burst: u64,
    /// Requests per UTC day, if limited.
    pub(crate) daily_quota: Option<u64>,
    /// Requests per UTC month, if limited.
    pub(crate) monthly_quota: Option<u64>,
    /// Requests in flight at once (per replica), if limited.
    pub(crate) max_in_flight: Option<u64>,
    /// Open WebSocket tunnels at once (per replica), if limited.
    pub(crate) max_websockets: Option<u64>,
    /// WebSocket idle timeout (`"30s"`), if the tenant has its own.
    pub(crate) websocket_idle_timeout: Option<String>,
    /// WebSocket maximum lifetime (`"1h"`), if the tenant has its own.
    pub(crate) websocket_max_lifetime: Option<String>,
    /// Per-route overrides of the bucket.
    pub(crate) route_quotas: Vec<RouteQuotaView>,
    /// Creation time (RFC 3339, UTC).
    pub(crate) created_at: String,
    /// Last change (RFC 3339, UTC).
    pub(crate) updated_at: String,
}

/// A per-route override.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RouteQuotaView {
    /// Route prefix.
    pub(crate) route: String,
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period.
    pub(crate) per: String,
    /// Bucket capacity.
    pub(crate) burst: u64,
}

/// An API key as listings show it: never the key, never its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KeyView {
    /// Key id (for revocation).
    pub(crate) id: i64,
    /// Owning tenant.
    pub(crate) tenant: String,
    /// The first characters of the key, to recognise it.
    pub(crate) prefix: String,
    /// Issue time.
    pub(crate) created_at: String,
    /// Revocation time, if revoked.
    pub(crate) revoked_at: Option<String>,
}

/// A freshly issued key: the only time the plaintext exists outside the client. Deliberately
/// without `Debug`, so it cannot end up in a log line by accident.
#[derive(Clone, Serialize)]
pub(crate) struct IssuedKey {
    /// The stored part.
    #[serde(flatten)]
    pub(crate) key: KeyView,
    /// The plaintext key, shown once.
    pub(crate) api_key: String,
}
