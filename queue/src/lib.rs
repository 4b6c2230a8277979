//! The durable delivery queue behind asynchronous routes: a request is stored here before
//! the gateway answers `202 Accepted`, then leased by delivery workers (on any replica),
//! sent upstream, and recorded as delivered, scheduled for a retry, or dead-lettered.
//!
//! One trait, [`Queue`], held as `Arc<dyn Queue>`; three engines chosen by URL through
//! [`connect`]: [`SqliteQueue`] (`sqlite://path`, the embedded default),
//! [`PostgresQueue`] (`postgres://…`) and [`RedisQueue`] (`redis://…`, `rediss://…`,
//! `redis-cluster://h:p,…`). Each engine owns its schema (created on connect), independent
//! of the gateway's `migrations/`, so the queue may live in a database of its own. The
//! conformance suite (`queue/tests/conformance.rs`) runs every behaviour against every
//! engine.
//!
//! Where this sits: below the gateway's asynchronous-route handler and its delivery
//! worker; the request pipeline never sees which engine is in use.
//!
//! ```no_run
//! # async fn demo() -> Result<(), portcullis_queue::QueueError> {
//! use std::time::Duration;
//! use portcullis_queue::{connect, ConnectOptions, NewMessage};
//! let queue = connect("sqlite://queue.db", &ConnectOptions::default()).await?;
//! let id = queue.enqueue(NewMessage {
//!     queue: "webhooks".into(), tenant: None, dedupe: None,
//!     method: "POST".into(), path_and_query: "/hook".into(),
//!     headers: vec![], body: "{}".into(), delay: Duration::ZERO,
//! }).await?;
//! for m in queue.lease("webhooks", 16, Duration::from_secs(30)).await? {
//!     // … send it upstream, then `delivered`, `retry_at` or `dead` with `m.token`.
//! }
//! # Ok(()) }
//! ```
//!
//! # Leases and fencing
//!
//! [`Queue::lease`] hands each due message to one caller for `lease_for`, with a fencing
//! token greater than any earlier token of that message. While the lease lives no other
//! `lease` returns the message; once it ends the message is due again and the next lease
//! gets a new token. `delivered`, `retry_at` and `dead` succeed only with the current token
//! of a live lease ([`QueueError::Fenced`] / [`QueueError::LeaseLost`] otherwise), so a
//! consumer that stalled past its lease cannot overwrite the outcome of the one that took
//! over. Delivery is at least once (a consumer can die after the upstream answered and
//! before `delivered`); the gateway forwards an Idempotency-Key derived from the id so a
//! deduplicating backend executes each message once.
//!
//! # Durability: what a crash can lose
//!
//! - **SQLite**: WAL with `synchronous = FULL`: `enqueue` returns after the commit is on
//!   disk, so neither a gateway crash nor a power cut loses an accepted message.
//! - **PostgreSQL**: each write is a committed transaction; with the server's default
//!   `synchronous_commit = on` nothing acknowledged is lost (with `off`, a *database* crash
//!   can lose the last ≈ 3 × `wal_writer_delay`, 600 ms by default).
//! - **Redis**: as durable as the server's persistence. `appendonly yes` with
//!   `appendfsync always` loses nothing acknowledged; `everysec` (Redis' default when AOF is
//!   on) can lose the last second on a server or host crash; `no` leaves it to the kernel
//!   (typically up to 30 s); without AOF (RDB snapshots only, or none) everything since the
//!   last snapshot. [`RedisQueue`] refuses a server that may evict keys
//!   (`maxmemory-policy` other than `noeviction` with `maxmemory` set) and logs a warning
//!   when `appendonly` is off or `appendfsync` is not `always`.
//!
//! The operator's view of the same is `docs/async-delivery.md`, "Storage engines and what
//! a crash can lose".

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

mod codec;
mod connect;
mod error;
mod message;
pub mod postgres;
pub mod redis;
mod sql;
pub mod sqlite;

pub use connect::{connect, ConnectOptions};
pub use error::QueueError;
pub use message::{
    Attempt, AttemptOutcome, Cursor, Dedupe, DeliveryId, Enqueued, Headers, Leased, ListFilter,
    Message, NewMessage, Page, State, Stats, Summary, DEFAULT_DEDUPE_WINDOW, DEFAULT_RETENTION,
    MAX_PAGE,
};
pub use postgres::PostgresQueue;
pub use redis::RedisQueue;
pub use sqlite::SqliteQueue;

/// A durable queue of HTTP requests to deliver. Object-safe; held as `Arc<dyn Queue>`.
///
/// Times are the engine's clock (the database or Redis server; SQLite's is the host's), so
/// replicas with skewed clocks still agree on leases and due times.
#[async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Stores `message` durably, pending and due after `message.delay`. With
    /// `message.dedupe`, the look-up of a live dedupe record and the insert are one atomic
    /// step: of concurrent enqueuers of one key exactly one gets [`Enqueued::New`], the
    /// others [`Enqueued::Duplicate`] with its id, for the whole window.
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError>;

    /// Leases up to `max` due messages of `queue` (earliest due first; messages due in the
    /// same millisecond in any order) for `lease_for`, each with a new fencing token. Never
    /// returns a message whose lease is live.
    async fn lease(
        &self,
        queue: &str,
        max: usize,
        lease_for: Duration,
    ) -> Result<Vec<Leased>, QueueError>;

    /// Records a successful attempt: the message becomes delivered (kept until
    /// [`Queue::sweep`] removes it after the retention).
    async fn delivered(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Attempt,
    ) -> Result<(), QueueError>;

    /// Records a failed attempt and makes the message due again `due_in` from now; the
    /// lease ends.
    async fn retry_at(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Attempt,
        due_in: Duration,
    ) -> Result<(), QueueError>;

    /// Moves the message to the dead-letter queue with `reason`, recording `attempt` when
    /// there was one (a message too old to try again has none). Payload, headers and
    /// history are kept.
    async fn dead(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Option<Attempt>,
        reason: &str,
    ) -> Result<(), QueueError>;

    /// The message with its payload and history; `None` when absent.
    async fn get(&self, id: &DeliveryId) -> Result<Option<Message>, QueueError>;

    /// A page of message summaries matching `filter`, oldest enqueue first (Redis without a
    /// queue filter: queue by queue). A page may hold fewer than `filter.limit` rows while
    /// [`Page::next`] is present: each call scans a bounded number of entries.
    async fn list(&self, filter: &ListFilter) -> Result<Page, QueueError>;

    /// Makes a delivered or dead message pending again, due now, with its history kept and
    /// any earlier token refused. The next lease counts attempts and age from the replay
    /// ([`Leased::attempts`], [`Leased::age`]), so the message gets a fresh schedule.
    /// [`QueueError::StillPending`] for a pending message.
    async fn replay(&self, id: &DeliveryId) -> Result<(), QueueError>;

    /// Removes the message in any state; returns whether it existed. Its dedupe record
    /// stays for its window, so a resend of the same event is still a duplicate.
    async fn purge(&self, id: &DeliveryId) -> Result<bool, QueueError>;

    /// Depth, oldest pending age and dead-letter count of `queue`.
    async fn stats(&self, queue: &str) -> Result<Stats, QueueError>;

    /// Removes up to `limit` delivered messages older than `retention` (since delivery)
    /// and expired dedupe records; returns how many messages went. Call it periodically;
    /// each call does bounded work.
    async fn sweep(&self, retention: Duration, limit: usize) -> Result<u64, QueueError>;

    /// The engine's name for logs and metrics (`sqlite`, `postgres`, `redis`).
    fn engine(&self) -> &'static str;
}

/// A shared queue.
pub type SharedQueue = Arc<dyn Queue>;
