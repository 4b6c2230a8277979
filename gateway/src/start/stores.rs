//! What the gateway keeps state in, opened together at start-up and closed together after
//! the drain.

use std::sync::Arc;

use portcullis_control::{Database, Directory, TenantSeed};

use super::error::StartError;
use crate::config::{self, Config};
use crate::pipeline;

/// What the gateway keeps state in: the database (tenants, keys, quotas, audit), the tenant
/// directory read on the request path, the idempotency store and the rate limiter. Clones
/// share them (the reloader keeps one).
#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) db: Database,
    pub(crate) directory: Arc<Directory>,
    pub(crate) idempotency: Arc<dyn portcullis_idempotency::Store>,
    pub(crate) limiter: Arc<dyn portcullis_ratelimit::Limiter>,
}

impl Stores {
    /// Opens the database (seeding the file's tenants), the directory and both stores.
    pub(crate) async fn open(config: &Config) -> Result<Self, StartError> {
        let db = match &config.storage.database {
            config::DatabaseBackend::Sqlite(path) => Database::sqlite(path).await,
            config::DatabaseBackend::Postgres(url) => Database::postgres(url).await,
        }
        .map_err(|source| StartError::OpenDatabase {
            url: format!("{:?}", config.storage.database),
            source,
        })?;
        db.upsert_tenants(&tenant_seeds(&config.tenants)).await?;
        let directory = Arc::new(Directory::open(&db).await?);
        Ok(Self {
            idempotency: pipeline::idempotency::build_store(config, &directory).await?,
            directory,
            limiter: pipeline::ratelimit::build_limiter(config)?,
            db,
        })
    }

    /// After the listeners have drained.
    pub(crate) async fn close(self) {
        // Batched rate limiting: unspent leases go back to the shared store, bounded so a
        // dead store cannot hold the exit (unreturned tokens lapse; see the ratelimit crate).
        let release = self.limiter.release();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), release).await;
        self.db.close().await;
    }
}

/// The file's tenants as the control plane seeds them (keys borrowed, never copied).
pub(crate) fn tenant_seeds(tenants: &[config::TenantSettings]) -> Vec<TenantSeed<'_>> {
    tenants
        .iter()
        .map(|t| TenantSeed {
            id: &t.id,
            api_keys: t.api_keys.iter().map(config::Secret::expose).collect(),
            rate: t.bucket.rate,
            per: t.bucket.per,
            burst: t.bucket.burst,
            daily_quota: t.daily_quota,
            monthly_quota: t.monthly_quota,
            max_in_flight: t.concurrency_limit,
            max_websockets: t.max_websockets,
            websocket_idle_timeout: t.websocket_idle_timeout,
            websocket_max_lifetime: t.websocket_max_lifetime,
        })
        .collect()
}
