//! The store's own PostgreSQL connections: a fixed-size set of `sqlx` connections that are
//! handed out and taken back without any exchange with the server.
//!
//! Why not `sqlx::PgPool`: it pings every connection when it goes back to the pool (a
//! `Sync` → `ReadyForQuery` exchange, sqlx-core `pool/connection.rs` `return_to_pool`), so
//! each one-statement decision cost two exchanges, and the connection stayed busy for the
//! second one. Here a connection goes back untouched after a statement that completed; one
//! whose statement failed at the connection level, or was abandoned half-way (the caller's
//! timeout dropped the future), is closed instead, because its protocol state is unknown.
//!
//! Each connection keeps `sqlx`'s per-connection statement cache, so after a statement's
//! first use on a connection (`Parse`/`Describe`, once) every call is one
//! `Bind`/`Execute`/`Close`/`Sync` write and one reply.
//!
//! A connection that broke usually means the server restarted or dropped everyone: the
//! *generation* is bumped and every idle connection of an older generation is closed when
//! it is next picked, so the outage fails the calls that were using a connection at that
//! moment, not one later call per stale idle connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::ConnectOptions;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::store::StoreError;

/// Connections of one [`PostgresStore`](super::PostgresStore).
pub(super) struct Pool {
    options: PgConnectOptions,
    /// One permit per connection that may exist; a caller holds one while it uses a
    /// connection, so at most `size` exist and waiting callers queue fairly.
    permits: Semaphore,
    /// Connections not in use, most recently used last (LIFO keeps the working set warm).
    idle: Mutex<Vec<Idle>>,
    generation: AtomicU64,
    size: usize,
}

struct Idle {
    conn: PgConnection,
    generation: u64,
}

/// A connection lent to one call. Dropped without [`Lease::release`], it is closed.
pub(super) struct Lease<'a> {
    pool: &'a Pool,
    conn: Option<PgConnection>,
    generation: u64,
    _permit: SemaphorePermit<'a>,
}

// === impl Pool ===

impl Pool {
    pub(super) fn new(options: PgConnectOptions, size: usize) -> Self {
        let size = size.max(1);
        Self {
            options,
            permits: Semaphore::new(size),
            idle: Mutex::new(Vec::with_capacity(size)),
            generation: AtomicU64::new(0),
            size,
        }
    }

    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// A connection, waiting for a free one until `deadline` (then
    /// [`StoreError::PoolExhausted`], never a hang) and connecting if none is idle.
    pub(super) async fn acquire(&self, deadline: Instant) -> Result<Lease<'_>, StoreError> {
        let started = Instant::now();
        let permit = match tokio::time::timeout_at(deadline, self.permits.acquire()).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed; treat it like exhaustion if it ever were.
            Ok(Err(_)) | Err(_) => {
                return Err(StoreError::PoolExhausted {
                    size: self.size,
                    waited: started.elapsed(),
                })
            }
        };
        let generation = self.generation.load(Ordering::Acquire);
        let reused = self.pop_idle(generation);
        let conn = match reused {
            Some(conn) => conn,
            None => match tokio::time::timeout_at(deadline, self.options.connect()).await {
                Ok(conn) => conn?,
                Err(_) => {
                    return Err(StoreError::Timeout(
                        deadline.saturating_duration_since(started),
                    ))
                }
            },
        };
        Ok(Lease {
            pool: self,
            conn: Some(conn),
            generation,
            _permit: permit,
        })
    }

    /// The most recently used idle connection of the current generation; older ones are
    /// dropped (closing their sockets) on the way.
    fn pop_idle(&self, generation: u64) -> Option<PgConnection> {
        let mut stale = Vec::new();
        let found = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                match idle.pop() {
                    Some(i) if i.generation == generation => break Some(i.conn),
                    Some(i) => stale.push(i.conn),
                    None => break None,
                }
            }
        };
        // Dropped outside the lock: a drop closes a socket.
        drop(stale);
        found
    }

    /// Number of connections currently idle (for tests and metrics).
    #[cfg(test)]
    pub(super) fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

// === impl Lease ===

impl Lease<'_> {
    /// The connection, for one statement.
    pub(super) fn conn(&mut self) -> Result<&mut PgConnection, StoreError> {
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::Corrupt("connection lease used after release".into()))
    }

    /// Gives the connection back after a statement that ran to completion: `result` says
    /// whether the connection is still usable.
    pub(super) fn release<T>(mut self, result: &Result<T, sqlx::Error>) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if let Err(e) = result {
            if breaks_connection(e) {
                // Probably a server restart or a dropped network: every idle connection is
                // suspect, so a new generation makes the next callers reconnect.
                self.pool.generation.fetch_add(1, Ordering::AcqRel);
                return;
            }
        }
        let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.push(Idle {
            conn,
            generation: self.generation,
        });
    }
}

/// True when the error leaves the connection unusable: anything but an error the server
/// reported for the statement, and the server's own "connection is going away" errors
/// (class 08 connection exception, 57P admin/crash shutdown).
fn breaks_connection(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        // Decoding a row (a type mismatch) happens after the exchange completed.
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::RowNotFound
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::Encode(_) => false,
        _ => true,
    }
}

/// Default number of connections: eight per core of this machine, at least 16, at most 64.
///
/// The store's statements are short and their cost is mostly the commit's WAL flush, which
/// PostgreSQL shares among every commit waiting at that moment (group commit): throughput
/// grows with the number of statements in flight, not with the database's cores, and a
/// backend waiting for the flush costs no CPU. Measured with pgbench running the store's two
/// statements on the 2-core benchmark machine (BENCHMARKS.md, "PostgreSQL idempotency"):
/// 4 clients 0.81 k/s, 8: 1.73 k, 16: 2.16 k, 32: 2.43 k, 64: 2.33 k first executions/s.
/// Past that point more connections only queue inside the server. The gateway cannot see
/// the database machine, so it scales with its own cores (more cores, more requests in
/// flight); set `storage.postgres_pool_size` when the database is shared or far away.
pub fn default_pool_size() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .saturating_mul(8)
        .clamp(16, 64)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn connection_errors_discard_the_connection() {
        assert!(breaks_connection(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
        assert!(breaks_connection(&sqlx::Error::Protocol("x".into())));
        assert!(!breaks_connection(&sqlx::Error::RowNotFound));
        assert!(!breaks_connection(&sqlx::Error::ColumnNotFound("x".into())));
    }

    #[test]
    fn default_size_is_bounded() {
        let n = default_pool_size();
        assert!((16..=64).contains(&n), "{n}");
    }

    #[tokio::test(start_paused = true)]
    async fn exhausted_pool_fails_at_the_deadline() {
        let pool = Pool::new(PgConnectOptions::new(), 1);
        // Take the only permit without connecting.
        let _held = pool.permits.acquire().await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(250);
        let err = match pool.acquire(deadline).await {
            Err(e) => e,
            Ok(_) => panic!("a full pool must not lend a connection"),
        };
        match err {
            StoreError::PoolExhausted { size, waited } => {
                assert_eq!(size, 1);
                assert_eq!(waited, Duration::from_millis(250));
            }
            other => panic!("expected PoolExhausted, got {other:?}"),
        }
        assert!(err_is_transient_exhausted());
        assert_eq!(pool.idle_count(), 0);
    }

    fn err_is_transient_exhausted() -> bool {
        StoreError::PoolExhausted {
            size: 1,
            waited: Duration::ZERO,
        }
        .is_transient()
    }
}
