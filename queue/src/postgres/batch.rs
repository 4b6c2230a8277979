//! Enqueues without a dedupe key, gathered into multi-row inserts (group commit).
//!
//! One message per statement costs PostgreSQL a statement and a commit (a WAL flush) each:
//! on a database shared with other work that, not the gateway, is the ceiling of an
//! asynchronous route. Here every such enqueue goes to one collector, which takes what has
//! arrived (at most [`MAX_ROWS`] messages or [`MAX_BYTES`] of bodies) and inserts it as
//! one statement, `INSERT … SELECT … FROM unnest(…)`; while the engine's insert statements
//! are all running (two: one commits while the next gathers), new arrivals wait and so form
//! the next batch. Measured in BENCHMARKS.md ("Delivery queue").
//! Nothing is held back on purpose: a lone message is inserted at once, in a batch of one.
//!
//! Each caller is answered only after its batch committed (so a 202 still means stored), and
//! with its batch's error if the statement failed; the messages of one batch are inserted in
//! arrival order. A caller that gives up (its request's timeout) does not take its message
//! out of a batch already sent: it may still be stored and delivered, as when a single
//! statement times out after the server committed it.

use std::sync::Arc;

use bytes::Bytes;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::QueueError;

/// Messages in one statement at most (eight parameters each, sent as arrays).
const MAX_ROWS: usize = 256;
/// Body bytes in one statement at most (a batch holds at least one message, whatever its size).
const MAX_BYTES: usize = 4 * 1024 * 1024;
/// Enqueues waiting for the collector at most; a caller beyond it waits for room.
const WAITING: usize = 4096;

/// One message's columns, as the single-row insert binds them.
pub(super) struct Row {
    pub(super) id: String,
    pub(super) queue: String,
    pub(super) tenant: Option<String>,
    pub(super) method: String,
    pub(super) path: String,
    pub(super) headers: Vec<u8>,
    pub(super) body: Bytes,
    pub(super) delay_ms: i64,
}

struct Pending {
    row: Row,
    done: oneshot::Sender<Result<(), Arc<sqlx::Error>>>,
}

/// The handle of the collector task (which ends when the last handle is dropped).
#[derive(Debug, Clone)]
pub(super) struct Batcher {
    tx: mpsc::Sender<Pending>,
}

impl Batcher {
    /// Starts the collector on the current runtime; at most `in_flight` statements at once.
    pub(super) fn start(pool: PgPool, in_flight: usize) -> Self {
        let (tx, rx) = mpsc::channel(WAITING);
        tokio::spawn(collect(
            pool,
            rx,
            Arc::new(Semaphore::new(in_flight.max(1))),
        ));
        Self { tx }
    }

    /// Inserts `row` with whatever else is waiting; returns once its batch committed.
    pub(super) async fn insert(&self, row: Row) -> Result<(), QueueError> {
        let (done, answer) = oneshot::channel();
        self.tx
            .send(Pending { row, done })
            .await
            .map_err(|_| QueueError::Sql(Arc::new(sqlx::Error::PoolClosed)))?;
        match answer.await {
            Ok(result) => result.map_err(QueueError::Sql),
            // The collector went away with the message (the runtime is shutting down).
            Err(_) => Err(QueueError::Sql(Arc::new(sqlx::Error::PoolClosed))),
        }
    }
}

async fn collect(pool: PgPool, mut rx: mpsc::Receiver<Pending>, slots: Arc<Semaphore>) {
    while let Some(first) = rx.recv().await {
        // A free slot first: what arrives while every slot is busy joins this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = first.row.body.len();
        let mut batch = vec![first];
        while batch.len() < MAX_ROWS && bytes < MAX_BYTES {
            match rx.try_recv() {
                Ok(next) => {
                    bytes += next.row.body.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            let (rows, answers): (Vec<Row>, Vec<_>) =
                batch.into_iter().map(|p| (p.row, p.done)).unzip();
            let result = insert(&pool, &rows).await.map_err(Arc::new);
            drop(slot);
            for done in answers {
                // A caller that gave up is gone; the others get the shared outcome.
                let _ = done.send(result.clone());
            }
        });
    }
}

/// One statement for all of `rows`, in their order: each column bound as one array.
async fn insert(pool: &PgPool, rows: &[Row]) -> Result<(), sqlx::Error> {
    let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let queues: Vec<&str> = rows.iter().map(|r| r.queue.as_str()).collect();
    let tenants: Vec<Option<&str>> = rows.iter().map(|r| r.tenant.as_deref()).collect();
    let methods: Vec<&str> = rows.iter().map(|r| r.method.as_str()).collect();
    let paths: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
    let headers: Vec<&[u8]> = rows.iter().map(|r| r.headers.as_slice()).collect();
    let bodies: Vec<&[u8]> = rows.iter().map(|r| r.body.as_ref()).collect();
    let delays: Vec<i64> = rows.iter().map(|r| r.delay_ms).collect();
    sqlx::query(concat!(
        "INSERT INTO queue_messages (id, queue, tenant, state, method, path, headers, body, \
         enqueued_at, due_at, updated_at) \
         SELECT id, queue, tenant, 0, method, path, headers, body, ",
        now!(),
        ", ",
        now!(),
        " + delay, ",
        now!(),
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
         $6::bytea[], $7::bytea[], $8::bigint[]) WITH ORDINALITY \
         AS m(id, queue, tenant, method, path, headers, body, delay, n) ORDER BY n"
    ))
    .bind(ids)
    .bind(queues)
    .bind(tenants)
    .bind(methods)
    .bind(paths)
    .bind(headers)
    .bind(bodies)
    .bind(delays)
    .execute(pool)
    .await?;
    Ok(())
}
