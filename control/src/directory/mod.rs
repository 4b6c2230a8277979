//! The tenant directory: an immutable snapshot of tenants, their API key hashes and quotas,
//! swapped atomically when the database changes. Request handling only ever reads a snapshot
//! (one atomic load), never the database.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use portcullis_ratelimit::{Period, Policy};

use crate::config::Bucket;
use crate::db::{Database, DbError};

/// How often the configuration version is polled. Changes reach every replica within this
/// (plus one query), which keeps the "within 1 s" promise with room to spare.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(250);

/// A tenant as the request path sees it.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Tenant id.
    pub id: Arc<str>,
    /// The tenant's token bucket.
    pub bucket: Bucket,
    /// Per-route overrides of the bucket, by route prefix.
    pub route_limits: HashMap<String, Bucket>,
    /// Requests per UTC day.
    pub daily_quota: Option<u64>,
    /// Requests per UTC month.
    pub monthly_quota: Option<u64>,
    /// Disabled tenants are refused like unknown keys.
    pub disabled: bool,
    /// The bucket as a rate-limit policy, built once per snapshot (not per request).
    pub policy: Option<Arc<Policy>>,
    /// The per-route overrides as policies, by route prefix.
    pub route_policies: HashMap<String, Arc<Policy>>,
    /// The daily and monthly request quotas as calendar policies.
    pub period_policies: Vec<(Period, Arc<Policy>)>,
}

// === impl Tenant ===

impl Tenant {
    /// A tenant with its rate-limit policies built from its buckets.
    pub fn new(
        id: &str,
        bucket: Bucket,
        route_limits: HashMap<String, Bucket>,
        daily_quota: Option<u64>,
        monthly_quota: Option<u64>,
        disabled: bool,
    ) -> Self {
        let policy = build_policy("tenant", &bucket, id);
        let route_policies = route_limits
            .iter()
            .filter_map(|(prefix, b)| Some((prefix.clone(), build_policy("route", b, id)?)))
            .collect();
        let period_policies = [(Period::Day, "daily_quota", daily_quota), (Period::Month, "monthly_quota", monthly_quota)]
            .into_iter()
            .filter_map(|(period, name, quota)| {
                let policy = match Policy::calendar(name, quota?, period) {
                    Ok(policy) => policy,
                    Err(err) => {
                        tracing::warn!(tenant = id, policy = name, %err, "invalid stored quota ignored");
                        return None;
                    }
                };
                Some((period, Arc::new(policy)))
            })
            .collect();
        Self {
            id: Arc::from(id),
            bucket,
            route_limits,
            daily_quota,
            monthly_quota,
            disabled,
            policy,
            route_policies,
            period_policies,
        }
    }
}

/// A policy from a stored bucket; values the database constraints let through but the
/// limiter refuses are logged and leave the tenant unlimited on that policy rather than
/// unable to call at all.
pub fn build_policy(name: &str, bucket: &Bucket, tenant: &str) -> Option<Arc<Policy>> {
    match Policy::try_new(name, bucket.rate, bucket.per, bucket.burst) {
        Ok(policy) => Some(Arc::new(policy.with_shadow(bucket.shadow))),
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
    pub version: i64,
    by_key_hash: HashMap<[u8; 32], Arc<Tenant>>,
    by_id: HashMap<Arc<str>, Arc<Tenant>>,
}

// === impl Snapshot ===

impl Snapshot {
    /// Builds a snapshot from tenants and `(key hash, tenant id)` pairs of active keys.
    pub fn new(version: i64, tenants: Vec<Tenant>, keys: Vec<(Vec<u8>, String)>) -> Self {
        let by_id: HashMap<Arc<str>, Arc<Tenant>> = tenants
            .into_iter()
            .map(|t| (t.id.clone(), Arc::new(t)))
            .collect();
        let by_key_hash = keys
            .into_iter()
            .filter_map(|(hash, tenant)| {
                let hash: [u8; 32] = hash.try_into().ok()?;
                Some((hash, by_id.get(tenant.as_str())?.clone()))
            })
            .collect();
        Self {
            version,
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

    /// Number of tenants.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are no tenants.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// The live directory: the current snapshot, replaceable at any time.
#[derive(Debug)]
pub struct Directory {
    current: ArcSwap<Snapshot>,
}

// === impl Directory ===

impl Directory {
    /// A directory starting at `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        Self {
            current: ArcSwap::from_pointee(snapshot),
        }
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Replaces the snapshot.
    pub fn replace(&self, snapshot: Snapshot) {
        self.current.store(Arc::new(snapshot));
    }

    /// Loads a fresh snapshot from the database.
    pub async fn load(db: &Database) -> Result<Snapshot, DbError> {
        db.load_snapshot().await
    }

    /// Keeps the snapshot fresh until `stop` resolves: reloads when the database's
    /// configuration version changes, checked every [`REFRESH_INTERVAL`] and, on PostgreSQL,
    /// at once when a change notification arrives ([`super::notify`]). A database outage
    /// keeps the last snapshot serving (logged, retried).
    pub async fn keep_fresh(
        self: Arc<Self>,
        db: Database,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let wake = tokio::sync::Notify::new();
        let notifications = async {
            super::notify::forward_changes(&db, &wake).await;
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
                    Ok(_) => match db.load_snapshot().await {
                        Ok(snapshot) => {
                            tracing::info!(
                                version = snapshot.version,
                                tenants = snapshot.len(),
                                "tenant directory reloaded"
                            );
                            // The admin API may have installed a newer snapshot meanwhile
                            // (it reloads after each change); never go back to an older one.
                            let fresh = Arc::new(snapshot);
                            self.current.rcu(|current| {
                                if current.version > fresh.version {
                                    Arc::clone(current)
                                } else {
                                    Arc::clone(&fresh)
                                }
                            });
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
