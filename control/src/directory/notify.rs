//! The PostgreSQL fast path of live propagation: every admin change `NOTIFY`s [`CHANNEL`] in
//! its transaction, and each replica `LISTEN`s and reloads at once instead of waiting for its
//! next version poll.
//!
//! Notifications are an optimisation, never the guarantee: they are lost while the listening
//! connection is down, and changes made by other means (the start-up upsert, a manual SQL
//! edit that bumps `config_version`) do not send one. The version poll in
//! [`Directory::keep_fresh`](super::Directory::keep_fresh) stays the safety net, so a lost
//! notification costs at most one poll interval (250 ms).

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::Notify;

use crate::db::Database;

/// The notification channel for configuration changes.
pub const CHANNEL: &str = "portcullis_config";

/// Wait before reconnecting after the listener failed; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between reconnection attempts (the poll keeps working meanwhile).
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Wakes `wake` whenever a change notification arrives, and also after the listening
/// connection was re-established (notifications sent while it was down are lost, so the
/// caller should check the version then). Runs until dropped; for SQLite it never wakes.
pub async fn forward_changes(db: &Database, wake: &Notify) {
    match db {
        Database::Postgres(pool) => listen(pool, wake).await,
        Database::Sqlite(_) => std::future::pending().await,
    }
}

async fn listen(pool: &PgPool, wake: &Notify) {
    let mut backoff = MIN_BACKOFF;
    loop {
        match subscribe(pool).await {
            Ok(mut listener) => {
                tracing::debug!(channel = CHANNEL, "listening for configuration changes");
                backoff = MIN_BACKOFF;
                // Anything sent before LISTEN took effect was missed: check now.
                wake.notify_one();
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => wake.notify_one(),
                        // Connection lost and re-established by sqlx: notifications in
                        // between are gone, so check the version.
                        Ok(None) => wake.notify_one(),
                        Err(sqlx::Error::PoolClosed) => return,
                        Err(err) => {
                            tracing::warn!(%err, "configuration change listener failed; relying on polling until it reconnects");
                            break;
                        }
                    }
                }
            }
            Err(sqlx::Error::PoolClosed) => return,
            Err(err) => {
                tracing::warn!(%err, retry_in = ?backoff, "cannot listen for configuration changes; relying on polling");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::admin::store::{AdminStore, Limits, NewTenant};

    const PATIENCE: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_committed_change_wakes_listeners_and_a_rolled_back_one_does_not() {
        let url = portcullis_testkit::postgres::fresh_database().await;
        let db = Database::postgres(&url).await.unwrap();
        let wake = Arc::new(Notify::new());
        let listener = {
            let (db, wake) = (db.clone(), wake.clone());
            tokio::spawn(async move { forward_changes(&db, &wake).await })
        };
        // The first wake-up says the subscription is live.
        tokio::time::timeout(PATIENCE, wake.notified())
            .await
            .unwrap();

        let store = AdminStore::new(db.clone(), Arc::from(Vec::new()));
        let tenant = |burst| NewTenant {
            id: "acme".into(),
            name: String::new(),
            limits: Limits {
                rate: 1,
                per: Duration::from_secs(1),
                burst,
                daily_quota: None,
                monthly_quota: None,
                max_in_flight: None,
                max_websockets: None,
                websocket_idle_timeout: None,
                websocket_max_lifetime: None,
            },
        };
        store.create_tenant("t", &tenant(1)).await.unwrap();
        tokio::time::timeout(PATIENCE, wake.notified())
            .await
            .expect("NOTIFY of a committed change reaches the listener");

        // A duplicate is refused and rolled back: nothing to announce.
        store.create_tenant("t", &tenant(1)).await.unwrap_err();
        let quiet = tokio::time::timeout(Duration::from_millis(300), wake.notified()).await;
        assert!(quiet.is_err(), "a rolled-back change must not notify");
        listener.abort();
    }

    #[tokio::test]
    async fn sqlite_never_wakes() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::sqlite(&dir.path().join("n.db")).await.unwrap();
        let wake = Notify::new();
        let waited = tokio::time::timeout(Duration::from_millis(100), async {
            tokio::join!(forward_changes(&db, &wake), wake.notified())
        })
        .await;
        assert!(waited.is_err());
    }
}
