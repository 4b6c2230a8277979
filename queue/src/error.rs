//! Queue errors, with the queries a delivery worker and the admin API need.

use std::time::Duration;

use crate::message::DeliveryId;

/// A queue operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The presented fencing token is not the message's current one: another consumer
    /// leased it since, or it was finished (delivered, retried, dead-lettered, replayed).
    #[error("delivery {id}: fencing token {presented} is stale")]
    Fenced {
        /// The message.
        id: DeliveryId,
        /// The token presented.
        presented: u64,
    },
    /// The token is the current one but its lease has ended: the message may be leased by
    /// another consumer at any moment, so the result is not recorded.
    #[error("delivery {id}: the lease of token {presented} expired")]
    LeaseLost {
        /// The message.
        id: DeliveryId,
        /// The token presented.
        presented: u64,
    },
    /// No such message (never enqueued, purged, or swept after its retention).
    #[error("delivery {0} not found")]
    NotFound(DeliveryId),
    /// `replay` of a message that is still pending.
    #[error("delivery {0} is still pending: only a delivered or dead message can be replayed")]
    StillPending(DeliveryId),
    /// A listing cursor this engine did not produce (a client's typo or another engine's).
    #[error("invalid listing cursor {0:?}")]
    InvalidCursor(String),
    /// The engine did not answer in time.
    #[error("queue engine timed out after {0:?}")]
    Timeout(Duration),
    /// A SQLite or PostgreSQL error (shared by the calls of one batched statement).
    #[error("queue database: {0}")]
    Sql(#[source] std::sync::Arc<sqlx::Error>),
    /// A Redis error.
    #[error("queue redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis may evict keys under memory pressure: accepted messages could vanish.
    #[error(
        "redis evicts keys under memory pressure (maxmemory {maxmemory}, maxmemory-policy \
         {policy}): accepted messages could be lost; set maxmemory-policy noeviction \
         (or maxmemory 0)"
    )]
    Evicting {
        /// The server's `maxmemory`.
        maxmemory: u64,
        /// The server's `maxmemory-policy`.
        policy: String,
    },
    /// The queue URL is not one this crate accepts.
    #[error("queue URL {shown:?}: {reason}")]
    InvalidUrl {
        /// The URL with any password hidden.
        shown: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// The SQLite file cannot be created or opened.
    #[error("queue database file {path}: {source}")]
    File {
        /// The path, absolute when it could be made so.
        path: String,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Stored data this crate cannot read.
    #[error("corrupt queue record: {0}")]
    Corrupt(String),
}

// === impl QueueError ===

impl From<sqlx::Error> for QueueError {
    fn from(err: sqlx::Error) -> Self {
        Self::Sql(std::sync::Arc::new(err))
    }
}

impl QueueError {
    /// True when retrying later may succeed (network, timeout, overload, failover).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Redis(e) => portcullis_redis::is_transient(e),
            Self::Sql(e) => match &**e {
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                    // PostgreSQL: 08 connection, 40 serialization/deadlock, 53 resources,
                    // 57 shutdown. SQLite: 5 SQLITE_BUSY, 6 SQLITE_LOCKED (and extended codes).
                    ["08", "40", "53", "57"].iter().any(|p| c.starts_with(p))
                        || c.parse::<i64>().is_ok_and(|n| matches!(n & 0xff, 5 | 6))
                }),
                _ => false,
            },
            Self::Fenced { .. }
            | Self::LeaseLost { .. }
            | Self::NotFound(_)
            | Self::StillPending(_)
            | Self::InvalidCursor(_)
            | Self::Evicting { .. }
            | Self::InvalidUrl { .. }
            | Self::File { .. }
            | Self::Corrupt(_) => false,
        }
    }

    /// True when the caller no longer holds the message (`Fenced` or `LeaseLost`): its
    /// attempt must not be recorded, and another consumer owns the message.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. } | Self::LeaseLost { .. })
    }

    /// True for [`QueueError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }

    /// Short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Fenced { .. } => "fenced",
            Self::LeaseLost { .. } => "lease_lost",
            Self::NotFound(_) => "not_found",
            Self::StillPending(_) => "still_pending",
            Self::InvalidCursor(_) => "invalid_cursor",
            Self::Timeout(_) => "timeout",
            Self::Sql(_) => "database",
            Self::Redis(_) => "redis",
            Self::Evicting { .. } => "evicting",
            Self::InvalidUrl { .. } => "invalid_url",
            Self::File { .. } => "file",
            Self::Corrupt(_) => "corrupt",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let id = DeliveryId::parse("abc").unwrap();
        assert!(QueueError::Timeout(Duration::from_millis(5)).is_transient());
        assert!(QueueError::Fenced {
            id: id.clone(),
            presented: 1
        }
        .is_fenced());
        assert!(!QueueError::NotFound(id.clone()).is_transient());
        assert!(QueueError::NotFound(id).is_not_found());
        assert!(QueueError::from(sqlx::Error::PoolTimedOut).is_transient());
        assert_eq!(QueueError::Corrupt("x".into()).kind(), "corrupt");
    }
}
