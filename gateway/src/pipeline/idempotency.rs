//! Wiring of the `portcullis-idempotency` crate: the store chosen by `storage.idempotency`
//! (the only `match` on it) and the extractor that turns the matched route and caller into
//! the layer's per-request settings.
//!
//! Records are scoped by tenant and route name (its prefix unless named). Anonymous callers are scoped by client IP
//! (`ip:203.0.113.9`), so one anonymous client can neither read nor block another's keys.
//! Several users may share an address, so responses stored in that scope keep no
//! `Set-Cookie`: a replay must not hand one user the cookie set for another.
//!
//! The memory store's bound is split into shares ([`TenantShares`]): one per tenant and one
//! for all anonymous callers together, so no caller's load can take another's room.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use portcullis_control::Directory;
use portcullis_idempotency::store::postgres::default_pool_size;
use portcullis_idempotency::{
    ExtractSettings, IdempotencySettings as LayerSettings, MemoryStore, OnInFlight,
    PostgresSettings, PostgresStore, RedisStore, Shares, Store, StoreError,
};

use crate::config::{Config, IdempotencyBackend, InFlightMode};
use crate::plumbing::context::Caller;
use crate::plumbing::context::RequestContext;

/// How often the memory store drops expired records.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How often, and how many at a time, PostgreSQL expired records are reaped.
const REAP_EVERY: Duration = Duration::from_secs(30);
const REAP_BATCH: i64 = 1000;

/// The record scope of an anonymous caller is this prefix and its address.
const ANONYMOUS_SCOPE: &str = "ip:";
/// The share every anonymous scope is charged to (no tenant id has this form).
const ANONYMOUS_SHARE: &str = "ip:*";
/// How `storage.memory_shares` names the anonymous share.
const ANONYMOUS_SHARE_KEY: &str = "anonymous";

/// Why the idempotency store could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyStoreError {
    /// Redis or PostgreSQL could not be reached, or the URL is unusable.
    #[error("storage.idempotency: {0}")]
    Store(#[from] StoreError),
    /// PostgreSQL could not be reached or migrated.
    #[error("storage.idempotency: {0}")]
    Database(#[from] portcullis_control::DbError),
}

/// Builds the configured store and starts its background expiry. `directory` tells the
/// memory store's shares how many tenants there are.
pub async fn build_store(
    config: &Config,
    directory: &Arc<Directory>,
) -> Result<Arc<dyn Store>, IdempotencyStoreError> {
    let store: Arc<dyn Store> = match &config.storage.idempotency {
        IdempotencyBackend::Memory => {
            let capacity = usize::try_from(config.storage.memory_max_bytes).unwrap_or(usize::MAX);
            let shares = TenantShares::new(directory.clone(), &config.storage.memory_shares);
            let store = Arc::new(MemoryStore::new(capacity).with_shares(Arc::new(shares)));
            store.spawn_sweeper(SWEEP_EVERY);
            store
        }
        IdempotencyBackend::Redis(url) => {
            // Redis keeps time on the server; a round trip gets the same budget as rate limiting.
            Arc::new(
                RedisStore::connect(
                    url,
                    config.storage.state_timeout.max(Duration::from_millis(100)),
                )
                .await?,
            )
        }
        IdempotencyBackend::RedisCluster(nodes) => Arc::new(
            RedisStore::connect_cluster(
                nodes,
                config.storage.state_timeout.max(Duration::from_millis(100)),
            )
            .await?,
        ),
        IdempotencyBackend::Postgres(url) => {
            // The control crate's pool only applies the migrations: the store keeps its own
            // connections, which answer each statement in one exchange (no release ping).
            portcullis_control::db::connect_postgres(url)
                .await?
                .close()
                .await;
            let settings = PostgresSettings {
                pool_size: config
                    .storage
                    .postgres_pool_size
                    .map_or_else(default_pool_size, |n| n as usize),
                ..PostgresSettings::default()
            };
            let store = PostgresStore::connect(url, settings).await?;
            store.spawn_reaper(REAP_EVERY, REAP_BATCH);
            Arc::new(store)
        }
    };
    Ok(store)
}

/// The memory store's shares: a tenant, and all anonymous callers together, each hold at most
/// their share of the bound. A share set in `storage.memory_shares` is that many bytes; every
/// other one is an equal part of what the set ones leave, among the tenants the directory
/// holds now plus the anonymous share. A tenant added at run time shrinks the others' parts
/// for new keys; records already stored stay until they expire.
struct TenantShares {
    directory: Arc<Directory>,
    /// Set shares by share name (the anonymous one under [`ANONYMOUS_SHARE`]).
    fixed: BTreeMap<String, usize>,
    fixed_total: usize,
}

impl TenantShares {
    fn new(directory: Arc<Directory>, configured: &BTreeMap<String, u64>) -> Self {
        let fixed: BTreeMap<String, usize> = configured
            .iter()
            .map(|(name, &bytes)| {
                let share = match name.as_str() {
                    ANONYMOUS_SHARE_KEY => ANONYMOUS_SHARE.to_owned(),
                    tenant => tenant.to_owned(),
                };
                (share, usize::try_from(bytes).unwrap_or(usize::MAX))
            })
            .collect();
        let fixed_total = fixed.values().fold(0usize, |a, b| a.saturating_add(*b));
        Self {
            directory,
            fixed,
            fixed_total,
        }
    }
}

impl Shares for TenantShares {
    fn share_of<'t>(&self, tenant: &'t str) -> Cow<'t, str> {
        if tenant.starts_with(ANONYMOUS_SCOPE) {
            Cow::Borrowed(ANONYMOUS_SHARE)
        } else {
            Cow::Borrowed(tenant)
        }
    }

    fn bytes(&self, share: &str, capacity: usize) -> usize {
        if let Some(&bytes) = self.fixed.get(share) {
            return bytes;
        }
        let tenants = self.directory.load();
        let set = self
            .fixed
            .keys()
            .filter(|name| *name == ANONYMOUS_SHARE || tenants.by_id(name).is_some())
            .count();
        let sharing = (tenants.len() + 1).saturating_sub(set).max(1);
        capacity.saturating_sub(self.fixed_total) / sharing
    }
}

/// The per-route settings, built once; the extractor only fills in the tenant.
pub fn extractor(config: &Config) -> ExtractSettings {
    let templates: Vec<Option<LayerSettings>> = config
        .routes
        .iter()
        .map(|route| {
            let idem = route.idempotency.as_ref()?;
            let upstream = config.upstreams.get(route.upstream)?;
            let mut settings = LayerSettings::new("", route.name.as_str());
            settings.methods = idem.methods.as_slice().into();
            settings.require_key = idem.require_key;
            settings.ttl = idem.ttl;
            settings.lease = idem.lease;
            settings.on_in_flight = match idem.on_in_flight {
                InFlightMode::Reject => OnInFlight::Reject,
                InFlightMode::Wait(bound) => OnInFlight::Wait(bound),
            };
            settings.max_key_len = idem.max_key_length;
            settings.max_body_bytes =
                usize::try_from(config.server.max_body_bytes).unwrap_or(usize::MAX);
            settings.max_stored_response_bytes = idem.max_response_bytes;
            settings.upstream_dedupes_keys = upstream.dedupes_idempotency_keys;
            Some(settings)
        })
        .collect();
    Arc::new(move |parts: &Parts| {
        let context = RequestContext::of(&parts.extensions)?;
        let template = templates.get(context.route.index)?.as_ref()?;
        // The layer itself checks the method; a template copy is a few `Arc` increments and a
        // tenant's scope is its id. Only an anonymous caller's scope is formatted, and only
        // for a method the route deduplicates.
        let (tenant, replay_set_cookie) = match &context.caller {
            Caller::Tenant(tenant) => (tenant.id.clone(), template.replay_set_cookie),
            // Everyone behind one address shares this scope: a stored `Set-Cookie` would
            // hand one user's session to the next (docs/idempotency.md).
            Caller::Anonymous if template.methods.contains(&parts.method) => (
                format!("{ANONYMOUS_SCOPE}{}", context.client.ip).into(),
                false,
            ),
            Caller::Anonymous => return None,
        };
        Some(LayerSettings {
            tenant,
            replay_set_cookie,
            ..template.clone()
        })
    })
}
