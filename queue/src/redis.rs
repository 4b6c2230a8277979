//! Redis Streams engine, on one server or a Redis/Valkey Cluster.
//!
//! - **Layout**: per queue, a stream (`…:s`) with one consumer group, a hash per message
//!   (`…:m:<uuid>`: payload, state, fencing token, due time, attempt history), a sorted set
//!   of messages waiting to be due (`…:delayed`), the listing indexes (`…:idx`, one per
//!   state, scored by an enqueue sequence), the delivered-at set the sweep reads (`…:done`)
//!   and the dedupe records (`…:d:<hash>`, `SET NX PX` for the window). Every key of one
//!   queue carries the same hash tag, `{<16 hex digits of SHA-256(queue)>}`, so each
//!   operation is one Lua script on one node of a cluster. The delivery id is that tag
//!   followed by the message's UUID, so any call on an id finds the queue's slot.
//! - **Leasing** (one script): due messages move from the delayed set into the stream and
//!   new entries are handed out by the consumer group (`XREADGROUP`). The hash is the
//!   authority: a lease stamps a new token and the lease's end (also in a `…:leased` set
//!   scored by that end), an outcome checks the token and the lease, then `XACK`s and
//!   `XDEL`s the entry, so the stream holds only due and leased messages and never grows
//!   with the history. An entry whose lease ended is taken back from the group's
//!   pending-entries list with `XCLAIM`, found through the leased set rather than
//!   `XAUTOCLAIM`'s idle time: idle time counts from the last hand-out, not from the end
//!   of the lease that holder was given, so with workers using different lease lengths it
//!   would reclaim too late.
//! - **Time** is the server's (`TIME` inside each script).
//! - **Durability** depends on the server's persistence (see the crate documentation);
//!   [`RedisQueue::connect`] refuses a server that may evict keys and warns when AOF is
//!   off or not fsynced on every write.
//! - Every call is bounded by a timeout; an unreachable server is a transient error.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use portcullis_redis::{ConnectOptions, RedisClient, RedisConnection};
use redis::{FromRedisValue, Script, Value};
use sha2::{Digest, Sha256};

use crate::codec::{decode_headers, encode_headers};
use crate::error::QueueError;
use crate::message::{
    from_millis, millis, Attempt, Cursor, DeliveryId, Enqueued, Leased, ListFilter, Message,
    NewMessage, Page, State, Stats, Summary,
};
use crate::sql::{attempt_json, attempts_from_json, count, state};
use crate::Queue;

/// Default prefix of every key.
pub const DEFAULT_NAMESPACE: &str = "pq";
/// Length of a queue's hash tag in hex digits (64 bits of SHA-256).
const TAG_LEN: usize = 16;
/// Most index entries one listing call scans on the server.
const LIST_SCAN: usize = 512;

/// [`Queue`] on Redis Streams.
#[derive(Clone)]
pub struct RedisQueue {
    conn: RedisConnection,
    timeout: Duration,
    namespace: String,
    /// Queues already added to the registry set by this process (one per route: small).
    known: Arc<Mutex<HashSet<String>>>,
    scripts: Arc<Scripts>,
}

struct Scripts {
    enqueue: Script,
    lease: Script,
    finish: Script,
    replay: Script,
    purge: Script,
    stats: Script,
    list: Script,
    sweep: Script,
}

/// The keys of one queue (all under its hash tag).
struct Keys {
    base: String,
}

// === impl RedisQueue ===

impl RedisQueue {
    /// Connects to one server (`redis://…` or `rediss://…`), each call bounded by
    /// `timeout`. Refuses an evicting server ([`QueueError::Evicting`]).
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, QueueError> {
        let client = RedisClient::single(url, &ConnectOptions::with_timeout(timeout))?;
        Self::connect_client(&client, timeout).await
    }

    /// Connects to a cluster through its seed nodes (`redis://host:port` each).
    pub async fn connect_cluster<T: AsRef<str>>(
        nodes: &[T],
        timeout: Duration,
    ) -> Result<Self, QueueError> {
        let client = RedisClient::cluster(nodes, &ConnectOptions::with_timeout(timeout))?;
        Self::connect_client(&client, timeout).await
    }

    async fn connect_client(client: &RedisClient, timeout: Duration) -> Result<Self, QueueError> {
        let wait = timeout.saturating_mul(4);
        let mut conn = tokio::time::timeout(wait, client.connect())
            .await
            .map_err(|_| QueueError::Timeout(wait))??;
        match tokio::time::timeout(wait, conn.eviction_policy()).await {
            Ok(Ok((maxmemory, policy))) if maxmemory > 0 && policy != "noeviction" => {
                return Err(QueueError::Evicting { maxmemory, policy });
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e,
                "could not read the Redis eviction policy (CONFIG GET); queued messages are \
                 safe only if maxmemory-policy is noeviction"),
            Err(_) => tracing::warn!(
                "timed out reading the Redis eviction policy (CONFIG GET); queued messages \
                 are safe only if maxmemory-policy is noeviction"
            ),
        }
        match tokio::time::timeout(wait, persistence(&mut conn)).await {
            Ok(Ok((aof, fsync))) if aof != "yes" => tracing::warn!(
                appendonly = %aof, appendfsync = %fsync,
                "Redis append-only file is off: a Redis restart or crash loses every queued \
                 message written since the last snapshot (docs/async-delivery.md)"
            ),
            Ok(Ok((_, fsync))) if fsync != "always" => tracing::warn!(
                appendfsync = %fsync,
                "Redis appendfsync is not `always`: a crash of the Redis host can lose the \
                 last second (everysec) or more (no) of accepted messages \
                 (docs/async-delivery.md)"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e,
                "could not read the Redis persistence settings (CONFIG GET appendonly)"),
            Err(_) => tracing::warn!("timed out reading the Redis persistence settings"),
        }
        Ok(Self {
            conn,
            timeout,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            known: Arc::default(),
            scripts: Arc::new(Scripts {
                enqueue: Script::new(include_str!("redis/enqueue.lua")),
                lease: Script::new(include_str!("redis/lease.lua")),
                finish: Script::new(include_str!("redis/finish.lua")),
                replay: Script::new(include_str!("redis/replay.lua")),
                purge: Script::new(include_str!("redis/purge.lua")),
                stats: Script::new(include_str!("redis/stats.lua")),
                list: Script::new(include_str!("redis/list.lua")),
                sweep: Script::new(include_str!("redis/sweep.lua")),
            }),
        })
    }

    /// Uses `namespace` (no `{` or `}`) as the prefix of every key instead of
    /// [`DEFAULT_NAMESPACE`]: separate deployments (or tests) on one server.
    pub fn with_namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.replace(['{', '}'], "_");
        self
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, QueueError> {
        crate::connect::bounded(self.timeout, fut).await
    }

    fn keys(&self, tag: &str) -> Keys {
        Keys {
            base: format!("{}:{{{tag}}}:", self.namespace),
        }
    }

    fn registry(&self) -> String {
        format!("{}:queues", self.namespace)
    }

    /// Adds `queue` to the registry the sweep and unfiltered listings walk (once per
    /// process and queue).
    async fn register(&self, queue: &str) -> Result<(), QueueError> {
        let known = self
            .known
            .lock()
            .map(|k| k.contains(queue))
            .unwrap_or(false);
        if known {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("SADD")
            .arg(self.registry())
            .arg(queue)
            .to_owned();
        self.bounded(cmd.query_async::<()>(&mut conn)).await?;
        if let Ok(mut k) = self.known.lock() {
            k.insert(queue.to_owned());
        }
        Ok(())
    }

    async fn queues(&self) -> Result<BTreeSet<String>, QueueError> {
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("SMEMBERS").arg(self.registry()).to_owned();
        let all: Vec<String> = self.bounded(cmd.query_async(&mut conn)).await?;
        Ok(all.into_iter().collect())
    }

    async fn finish(
        &self,
        id: &DeliveryId,
        token: u64,
        op: &str,
        attempt: Option<&Attempt>,
        due_in: Duration,
        reason: &str,
    ) -> Result<(), QueueError> {
        let (tag, uuid) = split(id).ok_or_else(|| QueueError::NotFound(id.clone()))?;
        let k = self.keys(tag);
        let mut inv = self.scripts.finish.prepare_invoke();
        inv.key(k.message(uuid))
            .key(k.stream())
            .key(k.delayed())
            .key(k.index(Some(State::Pending)))
            .key(k.index(Some(State::Delivered)))
            .key(k.index(Some(State::Dead)))
            .key(k.done())
            .key(k.leased());
        inv.arg(uuid)
            .arg(token)
            .arg(op)
            .arg(attempt.map(attempt_json).unwrap_or_default())
            .arg(millis(due_in))
            .arg(reason);
        let mut conn = self.conn.clone();
        let reply: String = self.bounded(inv.invoke_async(&mut conn)).await?;
        match reply.as_str() {
            "ok" => Ok(()),
            "not_found" => Err(QueueError::NotFound(id.clone())),
            "lease_lost" => Err(QueueError::LeaseLost {
                id: id.clone(),
                presented: token,
            }),
            _ => Err(QueueError::Fenced {
                id: id.clone(),
                presented: token,
            }),
        }
    }

    /// One queue's page: rows after `after`, and the cursor to continue in this queue.
    async fn list_queue(
        &self,
        queue: &str,
        filter: &ListFilter,
        after: i64,
        want: usize,
    ) -> Result<(Vec<Summary>, Option<i64>), QueueError> {
        let k = self.keys(&tag(queue));
        let mut inv = self.scripts.list.prepare_invoke();
        inv.key(k.index(filter.state));
        inv.arg(k.message(""))
            .arg(after)
            .arg(want)
            .arg(filter.tenant.as_deref().unwrap_or_default())
            .arg(if filter.tenant.is_some() { "1" } else { "0" })
            .arg(LIST_SCAN.max(want + 1));
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut conn)).await?;
        let last: i64 = field(&reply, 0)?;
        let exhausted: i64 = field(&reply, 1)?;
        let mut rows = Vec::new();
        for row in reply.iter().skip(2) {
            let Value::Array(f) = row else {
                return Err(QueueError::Corrupt("listing row".into()));
            };
            let uuid: String = field(f, 0)?;
            rows.push(Summary {
                id: DeliveryId::from_stored(format!("{}{uuid}", tag(queue))),
                queue: field(f, 1)?,
                tenant: field(f, 2)?,
                state: state(field(f, 3)?)?,
                enqueued_at_ms: field(f, 4)?,
                due_at_ms: field(f, 5)?,
                attempts: u32::try_from(field::<i64>(f, 6)?).unwrap_or(u32::MAX),
                reason: field(f, 7)?,
            });
        }
        Ok((rows, (exhausted == 0).then_some(last)))
    }
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue")
            .field("conn", &self.conn)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Queue for RedisQueue {
    async fn enqueue(&self, m: NewMessage) -> Result<Enqueued, QueueError> {
        self.register(&m.queue).await?;
        let tag = tag(&m.queue);
        let k = self.keys(&tag);
        let uuid = DeliveryId::random();
        let dedupe = m
            .dedupe
            .as_ref()
            .map(|d| (dedupe_hash(&m.queue, m.tenant.as_deref(), &d.key), d));
        let mut inv = self.scripts.enqueue.prepare_invoke();
        inv.key(k.message(uuid.as_str()))
            .key(k.delayed())
            .key(k.index(None))
            .key(k.index(Some(State::Pending)))
            .key(k.seq())
            .key(k.dedupe(dedupe.as_ref().map_or("", |(h, _)| h.as_str())));
        inv.arg(uuid.as_str())
            .arg(&m.queue)
            .arg(m.tenant.as_deref().unwrap_or_default())
            .arg(if m.tenant.is_some() { "1" } else { "0" })
            .arg(&m.method)
            .arg(&m.path_and_query)
            .arg(encode_headers(&m.headers))
            .arg(m.body.as_ref())
            .arg(m.dedupe.as_ref().map_or("", |d| d.key.as_str()))
            .arg(m.dedupe.as_ref().map_or(1, |d| millis(d.window).max(1)))
            .arg(millis(m.delay));
        let mut conn = self.conn.clone();
        let (what, stored): (String, String) = self.bounded(inv.invoke_async(&mut conn)).await?;
        let id = DeliveryId::from_stored(format!("{tag}{stored}"));
        Ok(if what == "new" {
            Enqueued::New(id)
        } else {
            Enqueued::Duplicate(id)
        })
    }

    async fn lease(
        &self,
        queue: &str,
        max: usize,
        lease_for: Duration,
    ) -> Result<Vec<Leased>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let tag = tag(queue);
        let k = self.keys(&tag);
        let mut inv = self.scripts.lease.prepare_invoke();
        inv.key(k.stream()).key(k.delayed()).key(k.leased());
        inv.arg(k.message(""))
            .arg(max)
            .arg(millis(lease_for).max(1));
        let mut conn = self.conn.clone();
        let rows: Vec<Value> = self.bounded(inv.invoke_async(&mut conn)).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let Value::Array(f) = row else {
                return Err(QueueError::Corrupt("lease row".into()));
            };
            let uuid: String = field(f, 0)?;
            let headers: Vec<u8> = field(f, 9)?;
            let body: Vec<u8> = field(f, 10)?;
            let enqueued_at_ms: i64 = field(f, 4)?;
            let now: i64 = field(f, 11)?;
            let cycle_at: i64 = field(f, 12)?;
            out.push(Leased {
                id: DeliveryId::from_stored(format!("{tag}{uuid}")),
                token: field(f, 1)?,
                attempts: u32::try_from(field::<i64>(f, 2)?).unwrap_or(u32::MAX),
                leases: u32::try_from(field::<i64>(f, 3)?).unwrap_or(u32::MAX),
                enqueued_at_ms,
                age: from_millis(now.saturating_sub(cycle_at)),
                queue: field(f, 5)?,
                tenant: field(f, 6)?,
                method: field(f, 7)?,
                path_and_query: field(f, 8)?,
                headers: decode_headers(&headers)?,
                body: Bytes::from(body),
            });
        }
        Ok(out)
    }

    async fn delivered(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Attempt,
    ) -> Result<(), QueueError> {
        self.finish(id, token, "delivered", Some(&attempt), Duration::ZERO, "")
            .await
    }

    async fn retry_at(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Attempt,
        due_in: Duration,
    ) -> Result<(), QueueError> {
        self.finish(id, token, "retry", Some(&attempt), due_in, "")
            .await
    }

    async fn dead(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Option<Attempt>,
        reason: &str,
    ) -> Result<(), QueueError> {
        self.finish(id, token, "dead", attempt.as_ref(), Duration::ZERO, reason)
            .await
    }

    async fn get(&self, id: &DeliveryId) -> Result<Option<Message>, QueueError> {
        let Some((tag, uuid)) = split(id) else {
            return Ok(None);
        };
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("HGETALL")
            .arg(self.keys(tag).message(uuid))
            .to_owned();
        let h: HashMap<String, Vec<u8>> = self.bounded(cmd.query_async(&mut conn)).await?;
        if h.is_empty() {
            return Ok(None);
        }
        let text = |name: &str| -> Result<String, QueueError> {
            h.get(name)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .ok_or_else(|| QueueError::Corrupt(format!("message field {name} missing")))
        };
        let number = |name: &str| -> Result<i64, QueueError> {
            text(name)?
                .parse()
                .map_err(|_| QueueError::Corrupt(format!("message field {name}")))
        };
        let optional = |name: &str| h.get(name).map(|v| String::from_utf8_lossy(v).into_owned());
        Ok(Some(Message {
            id: id.clone(),
            queue: text("queue")?,
            tenant: optional("tenant"),
            state: state(number("state")?)?,
            method: text("method")?,
            path_and_query: text("path")?,
            headers: decode_headers(h.get("headers").map_or(&[][..], Vec::as_slice))?,
            body: Bytes::from(h.get("body").cloned().unwrap_or_default()),
            dedupe_key: optional("dkey"),
            enqueued_at_ms: number("enq")?,
            due_at_ms: number("due")?,
            updated_at_ms: number("upd")?,
            attempts: attempts_from_json(&text("att")?)?,
            reason: optional("reason"),
        }))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Page, QueueError> {
        let size = filter.page_size();
        let (start, mut after) = match &filter.cursor {
            Some(c) => parse_cursor(c)?,
            None => (None, 0),
        };
        let queues: Vec<String> = match &filter.queue {
            Some(q) => vec![q.clone()],
            None => self.queues().await?.into_iter().collect(),
        };
        if let (Some(start), Some(q)) = (&start, &filter.queue) {
            if start != q {
                return Err(QueueError::InvalidCursor(
                    filter
                        .cursor
                        .as_ref()
                        .map(|c| c.0.clone())
                        .unwrap_or_default(),
                ));
            }
        }
        let mut items = Vec::new();
        let first = match &start {
            Some(s) => queues.partition_point(|q| q < s),
            None => 0,
        };
        // Bounded: one script call per queue (route), each scanning at most LIST_SCAN.
        for (i, queue) in queues.iter().enumerate().skip(first) {
            if start.as_ref() != Some(queue) {
                after = 0;
            }
            let (rows, more) = self
                .list_queue(queue, filter, after, size - items.len())
                .await?;
            items.extend(rows);
            if let Some(last) = more {
                return Ok(Page {
                    items,
                    next: Some(cursor(queue, last)),
                });
            }
            if items.len() >= size {
                let next = queues.get(i + 1).map(|q| cursor(q, 0));
                return Ok(Page { items, next });
            }
        }
        Ok(Page { items, next: None })
    }

    async fn replay(&self, id: &DeliveryId) -> Result<(), QueueError> {
        let (tag, uuid) = split(id).ok_or_else(|| QueueError::NotFound(id.clone()))?;
        let k = self.keys(tag);
        let mut inv = self.scripts.replay.prepare_invoke();
        inv.key(k.message(uuid))
            .key(k.delayed())
            .key(k.index(Some(State::Pending)))
            .key(k.index(Some(State::Delivered)))
            .key(k.index(Some(State::Dead)))
            .key(k.done());
        inv.arg(uuid);
        let mut conn = self.conn.clone();
        let reply: String = self.bounded(inv.invoke_async(&mut conn)).await?;
        match reply.as_str() {
            "ok" => Ok(()),
            "pending" => Err(QueueError::StillPending(id.clone())),
            _ => Err(QueueError::NotFound(id.clone())),
        }
    }

    async fn purge(&self, id: &DeliveryId) -> Result<bool, QueueError> {
        let Some((tag, uuid)) = split(id) else {
            return Ok(false);
        };
        let k = self.keys(tag);
        let mut inv = self.scripts.purge.prepare_invoke();
        inv.key(k.message(uuid))
            .key(k.stream())
            .key(k.delayed())
            .key(k.index(None))
            .key(k.index(Some(State::Pending)))
            .key(k.index(Some(State::Delivered)))
            .key(k.index(Some(State::Dead)))
            .key(k.done())
            .key(k.leased());
        inv.arg(uuid);
        let mut conn = self.conn.clone();
        let gone: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(gone > 0)
    }

    async fn stats(&self, queue: &str) -> Result<Stats, QueueError> {
        let k = self.keys(&tag(queue));
        let mut inv = self.scripts.stats.prepare_invoke();
        inv.key(k.index(Some(State::Pending)))
            .key(k.index(Some(State::Dead)));
        inv.arg(k.message(""));
        let mut conn = self.conn.clone();
        let (depth, age, dead): (i64, i64, i64) = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(Stats {
            depth: count(depth),
            oldest_age: (age >= 0).then(|| from_millis(age)),
            dead: count(dead),
        })
    }

    async fn sweep(&self, retention: Duration, limit: usize) -> Result<u64, QueueError> {
        let mut removed = 0u64;
        for queue in self.queues().await? {
            let left = limit.saturating_sub(usize::try_from(removed).unwrap_or(usize::MAX));
            if left == 0 {
                break;
            }
            let k = self.keys(&tag(&queue));
            let mut inv = self.scripts.sweep.prepare_invoke();
            inv.key(k.done())
                .key(k.index(None))
                .key(k.index(Some(State::Delivered)));
            inv.arg(k.message("")).arg(millis(retention)).arg(left);
            let mut conn = self.conn.clone();
            let n: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
            removed += count(n);
        }
        // Dedupe records expire on their own (their TTL is the window).
        Ok(removed)
    }

    fn engine(&self) -> &'static str {
        "redis"
    }
}

// === impl Keys ===

impl Keys {
    fn message(&self, uuid: &str) -> String {
        format!("{}m:{uuid}", self.base)
    }
    fn stream(&self) -> String {
        format!("{}s", self.base)
    }
    fn delayed(&self) -> String {
        format!("{}delayed", self.base)
    }
    fn seq(&self) -> String {
        format!("{}seq", self.base)
    }
    fn leased(&self) -> String {
        format!("{}leased", self.base)
    }
    fn done(&self) -> String {
        format!("{}done", self.base)
    }
    fn dedupe(&self, hash: &str) -> String {
        format!("{}d:{hash}", self.base)
    }
    /// The listing index of one state, or of all.
    fn index(&self, state: Option<State>) -> String {
        match state {
            None => format!("{}idx", self.base),
            Some(s) => format!("{}idx:{}", self.base, s.code()),
        }
    }
}

/// The hash tag of `queue`'s keys.
fn tag(queue: &str) -> String {
    let digest = Sha256::digest(queue.as_bytes());
    let mut hex = hex::encode(digest);
    hex.truncate(TAG_LEN);
    hex
}

/// A delivery id's hash tag and message UUID.
fn split(id: &DeliveryId) -> Option<(&str, &str)> {
    let s = id.as_str();
    let (tag, uuid) = (s.get(..TAG_LEN)?, s.get(TAG_LEN..)?);
    (!uuid.is_empty() && tag.bytes().all(|b| b.is_ascii_hexdigit())).then_some((tag, uuid))
}

/// The dedupe record's name: queue, tenant (or none, distinct from an empty one) and key.
fn dedupe_hash(queue: &str, tenant: Option<&str>, key: &str) -> String {
    let mut h = Sha256::new();
    for part in [queue.as_bytes(), key.as_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    match tenant {
        Some(t) => {
            h.update([1]);
            h.update(t.as_bytes());
        }
        None => h.update([0]),
    }
    hex::encode(h.finalize())
}

fn cursor(queue: &str, seq: i64) -> Cursor {
    Cursor(format!("{}.{seq}", hex::encode(queue)))
}

fn parse_cursor(c: &Cursor) -> Result<(Option<String>, i64), QueueError> {
    let bad = || QueueError::InvalidCursor(c.0.clone());
    let (queue, seq) = c.0.split_once('.').ok_or_else(bad)?;
    let queue = String::from_utf8(hex::decode(queue).map_err(|_| bad())?).map_err(|_| bad())?;
    Ok((Some(queue), seq.parse().map_err(|_| bad())?))
}

fn field<T: FromRedisValue>(items: &[Value], i: usize) -> Result<T, QueueError> {
    let v = items
        .get(i)
        .ok_or_else(|| QueueError::Corrupt(format!("reply field {i} missing")))?;
    Ok(redis::from_redis_value(v)?)
}

/// `(appendonly, appendfsync)` from `CONFIG GET`.
async fn persistence(conn: &mut RedisConnection) -> redis::RedisResult<(String, String)> {
    let aof: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(conn)
        .await?;
    let fsync: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        .query_async(conn)
        .await?;
    Ok((
        aof.get(1).cloned().unwrap_or_default(),
        fsync.get(1).cloned().unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_queue_tag() {
        let t = tag("webhooks");
        assert_eq!(t.len(), TAG_LEN);
        let id = DeliveryId::from_stored(format!("{t}{}", DeliveryId::random()));
        assert!(DeliveryId::parse(id.as_str()).is_some());
        assert_eq!(split(&id).map(|(t, _)| t.to_owned()), Some(t));
        assert_eq!(split(&DeliveryId::from_stored("short".into())), None);
    }

    #[test]
    fn a_queue_keys_share_one_slot() {
        let k = RedisQueue::keys_for_test("pq", &tag("orders"));
        let slot = portcullis_redis::slot(k.stream().as_bytes());
        for key in [
            k.message("abc"),
            k.delayed(),
            k.index(None),
            k.dedupe("ff"),
            k.done(),
            k.leased(),
        ] {
            assert_eq!(portcullis_redis::slot(key.as_bytes()), slot, "{key}");
        }
    }

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let c = cursor("a.b/c", 42);
        assert_eq!(parse_cursor(&c).unwrap(), (Some("a.b/c".into()), 42));
        assert!(parse_cursor(&Cursor("x".into())).is_err());
        assert!(parse_cursor(&Cursor("zz.1".into())).is_err());
    }

    #[test]
    fn dedupe_names_separate_tenant_none_from_empty() {
        assert_ne!(dedupe_hash("q", None, "k"), dedupe_hash("q", Some(""), "k"));
        assert_ne!(dedupe_hash("q", None, "ab"), dedupe_hash("qa", None, "b"));
    }

    impl RedisQueue {
        fn keys_for_test(namespace: &str, tag: &str) -> Keys {
            Keys {
                base: format!("{namespace}:{{{tag}}}:"),
            }
        }
    }
}
