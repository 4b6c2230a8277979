//! Store errors, with the queries the layer needs to decide what to do next.

use std::time::Duration;

use crate::record::DecodeError;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The presented fencing token is not the current holder's: the lease was taken over,
    /// or the record was completed, released or deleted meanwhile.
    #[error("fencing token {presented} is stale: the key is held or finished by another request")]
    Fenced {
        /// The token the caller presented.
        presented: u64,
    },
    /// The caller's lease expired before it completed or released.
    #[error("the lease for fencing token {presented} expired before the request finished")]
    LeaseLost {
        /// The token the caller presented.
        presented: u64,
    },
    /// The memory store is at its byte limit and nothing more may be evicted.
    #[error("idempotency store full: {needed} bytes needed, {capacity} byte capacity")]
    Full {
        /// Bytes the new record needs.
        needed: usize,
        /// Configured capacity.
        capacity: usize,
    },
    /// The memory store holds as much of the tenant's records as its share allows; other
    /// tenants' shares are untouched. Passes as the tenant's records expire.
    #[error("idempotency store: share {share:?} full: {needed} bytes needed, {limit} byte share")]
    ShareFull {
        /// The share the tenant is charged to.
        share: String,
        /// Bytes the new record needs.
        needed: usize,
        /// The share's size.
        limit: usize,
    },
    /// The backend did not answer in time.
    #[error("idempotency store timed out after {0:?}")]
    Timeout(Duration),
    /// Every connection of the store's pool was busy for the whole wait: the database is
    /// slower than the offered load (or the pool too small for it).
    #[error("idempotency store: all {size} connections busy for {waited:?}")]
    PoolExhausted {
        /// Connections in the pool.
        size: usize,
        /// How long the call waited for one.
        waited: Duration,
    },
    /// A Redis error.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A PostgreSQL error.
    #[error("postgres: {0}")]
    Postgres(#[from] sqlx::Error),
    /// Redis may evict keys before their TTL (`maxmemory` set, `maxmemory-policy` other than
    /// `noeviction`): a record could vanish under any tenant's load and its key execute twice.
    #[error(
        "redis evicts keys under memory pressure (maxmemory {maxmemory}, maxmemory-policy \
         {policy}): an idempotency record could go before its TTL and a retry execute twice; \
         set maxmemory-policy noeviction (or maxmemory 0)"
    )]
    Evicting {
        /// The server's `maxmemory`.
        maxmemory: u64,
        /// The server's `maxmemory-policy`.
        policy: String,
    },
    /// The store returned data this crate cannot interpret.
    #[error("corrupt idempotency record: {0}")]
    Corrupt(String),
}

// === impl StoreError ===

impl StoreError {
    /// True when retrying later may succeed (network, timeout, overload, failover). The layer
    /// answers 503 + `Retry-After` to *every* `try_lock` error; this tells operators and
    /// callers whether the condition is expected to pass.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Full { .. }
            | Self::ShareFull { .. }
            | Self::Timeout(_)
            | Self::PoolExhausted { .. } => true,
            Self::Redis(e) => portcullis_redis::is_transient(e),
            Self::Postgres(e) => match e {
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                    // 08 connection, 40 serialization/deadlock, 53 resources, 57 shutdown.
                    ["08", "40", "53", "57"].iter().any(|p| c.starts_with(p))
                }),
                _ => false,
            },
            Self::Fenced { .. }
            | Self::LeaseLost { .. }
            | Self::Corrupt(_)
            | Self::Evicting { .. } => false,
        }
    }

    /// True when the caller no longer holds the key (`Fenced` or `LeaseLost`): its result
    /// must not be stored, and the condition is permanent for that token.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. } | Self::LeaseLost { .. })
    }

    /// Short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Fenced { .. } => "fenced",
            Self::LeaseLost { .. } => "lease_lost",
            Self::Full { .. } => "full",
            Self::ShareFull { .. } => "share_full",
            Self::Timeout(_) => "timeout",
            Self::PoolExhausted { .. } => "pool_exhausted",
            Self::Redis(_) => "redis",
            Self::Postgres(_) => "postgres",
            Self::Corrupt(_) => "corrupt",
            Self::Evicting { .. } => "evicting",
        }
    }
}

impl From<DecodeError> for StoreError {
    fn from(e: DecodeError) -> Self {
        Self::Corrupt(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        assert!(StoreError::Timeout(Duration::from_millis(5)).is_transient());
        assert!(StoreError::Full {
            needed: 1,
            capacity: 0
        }
        .is_transient());
        assert!(!StoreError::Fenced { presented: 1 }.is_transient());
        assert!(StoreError::LeaseLost { presented: 1 }.is_fenced());
        assert!(StoreError::Postgres(sqlx::Error::PoolTimedOut).is_transient());
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(StoreError::Redis(io).is_transient());
        assert_eq!(StoreError::Corrupt("x".into()).kind(), "corrupt");
    }
}
