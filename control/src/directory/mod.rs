//! The tenant directory: an immutable snapshot of tenants, their API key hashes and quotas,
//! swapped atomically when the database changes. Request handling only ever reads a snapshot
//! (one atomic load), never the database.
//!
//! The snapshot is built here from the database's rows ([`ConfigRows`]); the data-access
//! layer knows nothing of tenants or policies.

pub(crate) mod notify;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;

use portcullis_ratelimit::{LimitKey, Period, Policy, Principal};

use crate::db::{ConfigRows, Database, DbError, RouteQuotaRow, TenantRow};

/// How often the configuration version is polled. Changes reach every replica within this
/// (plus one query), which keeps the "within 1 s" promise with room to spare.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(250);

/// A tenant as the request path sees it: its rate-limit policies, built once per snapshot
/// (not per request).
#[derive(Debug)]
pub struct Tenant {
    /// Tenant id.
    pub id: Arc<str>,
    /// Disabled tenants are refused like unknown keys.
    pub disabled: bool,
    /// The tenant's bucket as a rate-limit policy.
    pub policy: Option<Arc<Policy>>,
    /// The key of that bucket, encoded once per snapshot (requests clone an `Arc`, they
    /// format no string).
    pub key: LimitKey,
    /// The per-route overrides, by route name (its prefix unless named): each bucket's key and policy.
    pub route_policies: HashMap<String, (LimitKey, Arc<Policy>)>,
    /// The daily and monthly request quotas as calendar policies, with their keys.
    pub period_policies: Vec<(Period, LimitKey, Arc<Policy>)>,
    /// At most this many requests of the tenant in flight at once on this replica
    /// (`max_in_flight`, Stripe's concurrent-requests limiter); `None` = unlimited.
    pub max_in_flight: Option<u64>,
    /// Requests of this tenant in flight on this replica now. Carried across snapshot
    /// reloads like `rate_limited`, so a reload neither forgets requests still running nor
    /// lets a burst in beside them; the request path increments it on the tenant it already
    /// holds (no map, no lock).
    in_flight: Arc<AtomicU64>,
    /// At most this many open WebSocket tunnels of the tenant on this replica
    /// (`max_websockets`); `None` = no cap of its own.
    pub max_websockets: Option<u32>,
    /// The tenant's WebSocket idle timeout; the stricter of it and the route's applies.
    pub websocket_idle_timeout: Option<Duration>,
    /// The tenant's WebSocket maximum lifetime; the stricter of it and the route's applies.
    pub websocket_max_lifetime: Option<Duration>,
    /// Open WebSocket tunnels of this tenant on this replica, carried across reloads like
    /// `in_flight`.
    websockets_open: Arc<AtomicU32>,
    /// Rate-limit rejections (429) of this tenant by this replica. Shared with the same
    /// tenant in later snapshots, so a reload does not reset it; counting is one relaxed
    /// atomic add on a tenant the request already holds (no map, no lock).
    rate_limited: Arc<AtomicU64>,
}

// === impl Tenant ===

impl Tenant {
    /// A tenant from its row and its route overrides, keeping the rejection count of
    /// `previous` (the same tenant in the snapshot being replaced).
    fn from_rows(row: &TenantRow, routes: &[&RouteQuotaRow], previous: Option<&Tenant>) -> Self {
        let id = row.id.as_str();
        let policy = stored_policy("tenant", row.rate, row.per_ms, row.burst, id);
        let route_policies = routes
            .iter()
            .filter_map(|r| {
                let policy = stored_policy("route", r.rate, r.per_ms, r.burst, id)?;
                let key = LimitKey::route(Principal::Tenant(id), &r.route_prefix);
                Some((r.route_prefix.clone(), (key, policy)))
            })
            .collect();
        let quota = |q: &Option<i64>| q.and_then(|q| u64::try_from(q).ok());
        let period_policies = [(Period::Day, "daily_quota", quota(&row.daily_quota)), (Period::Month, "monthly_quota", quota(&row.monthly_quota))]
            .into_iter()
            .filter_map(|(period, name, quota)| {
                let policy = match Policy::calendar(name, quota?, period) {
                    Ok(policy) => policy,
                    Err(err) => {
                        tracing::warn!(tenant = id, policy = name, %err, "invalid stored quota ignored");
                        return None;
                    }
                };
                let key = LimitKey::period(Principal::Tenant(id), period);
                Some((period, key, Arc::new(policy)))
            })
            .collect();
        Self {
            id: Arc::from(id),
            disabled: row.disabled != 0,
            policy,
            key: LimitKey::tenant(id),
            route_policies,
            period_policies,
            // The database's constraint keeps it in 1..=MAX_TENANT_IN_FLIGHT; anything else
            // (a hand-edited row) leaves the tenant unlimited rather than unable to call.
            max_in_flight: row
                .max_in_flight
                .and_then(|n| u64::try_from(n).ok())
                .filter(|n| (1..=MAX_TENANT_IN_FLIGHT).contains(n)),
            in_flight: previous.map_or_else(Arc::default, |t| t.in_flight.clone()),
            // As for max_in_flight: outside the database's constraint means no limit.
            max_websockets: row
                .max_websockets
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=MAX_TENANT_WEBSOCKETS).contains(n)),
            websocket_idle_timeout: stored_websocket_duration(row.websocket_idle_timeout_ms),
            websocket_max_lifetime: stored_websocket_duration(row.websocket_max_lifetime_ms),
            websockets_open: previous.map_or_else(Arc::default, |t| t.websockets_open.clone()),
            rate_limited: previous.map_or_else(Arc::default, |t| t.rate_limited.clone()),
        }
    }

    /// Counts one rejection (429) of this tenant by the gateway itself. Called by the
    /// rate-limit layer's observer and by the concurrency limiter, never inferred from a
    /// response status (an upstream's own 429 is not one).
    pub fn record_rate_limited(&self) {
        self.rate_limited.fetch_add(1, Ordering::Relaxed);
    }

    /// The tenant's in-flight counter on this replica (see `max_in_flight`): the gateway's
    /// concurrency limiter increments it on admission and its permit decrements it.
    pub fn in_flight(&self) -> &Arc<AtomicU64> {
        &self.in_flight
    }

    /// The tenant's open WebSocket tunnels on this replica (see `max_websockets`): the
    /// gateway's cap takes a place on admission and gives it back when the tunnel ends.
    pub fn websockets_open(&self) -> &Arc<AtomicU32> {
        &self.websockets_open
    }

    /// Rate-limit rejections of this tenant by this replica since it started.
    pub fn rate_limited_total(&self) -> u64 {
        self.rate_limited.load(Ordering::Relaxed)
    }
}

/// Largest per-tenant `max_in_flight` (the database, the admin API and the configuration
/// file all accept 1..=this).
pub const MAX_TENANT_IN_FLIGHT: u64 = 100_000;

/// Largest per-tenant `max_websockets` (the database, the admin API and the configuration
/// file all accept 1..=this).
pub const MAX_TENANT_WEBSOCKETS: u32 = 1_000_000;

/// Longest per-tenant `websocket_idle_timeout` and `websocket_max_lifetime` (the database,
/// the admin API and the configuration file all accept 1 ms..=this).
pub const MAX_TENANT_WEBSOCKET_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A stored WebSocket bound in milliseconds; outside the database's constraint → none.
fn stored_websocket_duration(ms: Option<i64>) -> Option<Duration> {
    let ms = u64::try_from(ms?).ok().filter(|&ms| ms > 0)?;
    Some(Duration::from_millis(ms)).filter(|d| *d <= MAX_TENANT_WEBSOCKET_DURATION)
}

/// A policy from stored columns (the database's constraints keep them positive; anything
/// else is clamped to 1 and left to the limiter's validation).
fn stored_policy(
    name: &str,
    rate: i64,
    per_ms: i64,
    burst: i64,
    tenant: &str,
) -> Option<Arc<Policy>> {
    let positive = |v: i64| u64::try_from(v).unwrap_or(1).max(1);
    build_policy(
        name,
        positive(rate),
        Duration::from_millis(positive(per_ms)),
        positive(burst),
        false,
        tenant,
    )
}

/// A token-bucket policy from a stored or configured limit; values the database constraints
/// let through but the limiter refuses are logged and leave the tenant unlimited on that
/// policy rather than unable to call at all.
pub fn build_policy(
    name: &str,
    rate: u64,
    per: Duration,
    burst: u64,
    shadow: bool,
    tenant: &str,
) -> Option<Arc<Policy>> {
    match Policy::try_new(name, rate, per, burst) {
        Ok(policy) => Some(Arc::new(policy.with_shadow(shadow))),
        Err(err) => {
            tracing::warn!(tenant, policy = name, %err, "invalid stored limit ignored");
            None
        }
    }
}

/// One consistent view of all tenants.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Configuration version the snapshot was read at.
    pub(crate) version: i64,
    /// Keyed by SHA-256 digests: uniformly spread already, so a cheap hasher (the stored
    /// keys are the administrators', a caller cannot choose what collides with them).
    by_key_hash: FxHashMap<[u8; 32], Arc<Tenant>>,
    by_id: HashMap<Arc<str>, Arc<Tenant>>,
}

// === impl Snapshot ===

impl Snapshot {
    /// Builds a snapshot from the database's rows; tenants already in `previous` keep their
    /// rejection counters.
    fn from_rows(rows: ConfigRows, previous: &Snapshot) -> Self {
        let by_id: HashMap<Arc<str>, Arc<Tenant>> = rows
            .tenants
            .iter()
            .map(|row| {
                let routes: Vec<_> = rows
                    .routes
                    .iter()
                    .filter(|r| r.tenant_id == row.id)
                    .collect();
                let tenant = Tenant::from_rows(row, &routes, previous.by_id(&row.id).map(|t| &**t));
                (tenant.id.clone(), Arc::new(tenant))
            })
            .collect();
        let by_key_hash = rows
            .keys
            .into_iter()
            .filter_map(|key| {
                let hash: [u8; 32] = key.key_hash.try_into().ok()?;
                Some((hash, by_id.get(key.tenant_id.as_str())?.clone()))
            })
            .collect();
        Self {
            version: rows.version,
            by_key_hash,
            by_id,
        }
    }

    /// The tenant owning an API key hash, if the key is active.
    pub fn by_key_hash(&self, hash: &[u8; 32]) -> Option<&Arc<Tenant>> {
        self.by_key_hash.get(hash)
    }

    /// A tenant by id.
    pub fn by_id(&self, id: &str) -> Option<&Arc<Tenant>> {
        self.by_id.get(id)
    }

    /// Every tenant, in no particular order.
    pub fn tenants(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.by_id.values()
    }

    /// Number of tenants.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.by_id.len()
    }
}

/// The live directory: the current snapshot, replaceable at any time.
#[derive(Debug)]
pub struct Directory {
    current: ArcSwap<Snapshot>,
}

// === impl Directory ===

impl Directory {
    /// A directory holding the database's current tenants.
    pub async fn open(db: &Database) -> Result<Self, DbError> {
        let directory = Self {
            current: ArcSwap::from_pointee(Snapshot::default()),
        };
        directory.reload(db).await?;
        Ok(directory)
    }

    /// The current snapshot, to keep (across awaits, or for a while).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The current snapshot for one lookup on the request path: no reference count taken.
    /// Hold it briefly and never across an await (`arc_swap::Guard`).
    pub fn load(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.current.load()
    }

    /// Loads the database's tenants and installs them, unless the admin API or the poll
    /// installed a newer snapshot meanwhile: the directory never goes back to an older one.
    pub async fn reload(&self, db: &Database) -> Result<Arc<Snapshot>, DbError> {
        let rows = db.load_rows().await?;
        let fresh = Arc::new(Snapshot::from_rows(rows, &self.current.load()));
        self.current.rcu(|current| {
            if current.version > fresh.version {
                Arc::clone(current)
            } else {
                Arc::clone(&fresh)
            }
        });
        Ok(fresh)
    }

    /// Keeps the snapshot fresh until `stop` resolves: reloads when the database's
    /// configuration version changes, checked every [`REFRESH_INTERVAL`] and, on PostgreSQL,
    /// at once when a change notification arrives (`notify.rs`). A database outage
    /// keeps the last snapshot serving (logged, retried).
    pub async fn keep_fresh(
        self: Arc<Self>,
        db: Database,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let wake = tokio::sync::Notify::new();
        let notifications = async {
            notify::forward_changes(&db, &wake).await;
            // Only a closed pool ends the listener; polling goes on regardless.
            std::future::pending::<()>().await
        };
        let refresh = async {
            let mut ticker = tokio::time::interval(REFRESH_INTERVAL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                // Both branches are cancel-safe; a notification arriving during a reload
                // leaves a permit in `wake`, so it is never lost.
                tokio::select! {
                    _ = ticker.tick() => {}
                    () = wake.notified() => {}
                }
                let known = self.current.load().version;
                match db.config_version().await {
                    Ok(version) if version == known => {}
                    Ok(_) => match self.reload(&db).await {
                        Ok(snapshot) => {
                            tracing::info!(
                                version = snapshot.version,
                                tenants = snapshot.len(),
                                "tenant directory reloaded"
                            );
                        }
                        Err(err) => {
                            tracing::warn!(%err, "tenant directory reload failed; serving the previous snapshot")
                        }
                    },
                    Err(err) => {
                        tracing::warn!(%err, "tenant directory version check failed; serving the previous snapshot")
                    }
                }
            }
        };
        // The listener and the poll run in this one task, so neither outlives `stop`.
        tokio::select! {
            () = stop => {}
            () = notifications => {}
            () = refresh => {}
        }
    }
}
