//! Redis store for the distributed mode: every replica sees the same records.
//!
//! - **One round trip per decision.** `try_lock`, `complete` and `release` are each one Lua
//!   script (`EVALSHA`), so the fencing check and the write are atomic on the server. A
//!   MULTI/EXEC transaction cannot branch on what it read, and WATCH would add round trips
//!   and retries under contention (50 identical requests would mostly loop).
//! - **Leases on server time.** While in flight the record's key TTL is the lease (`PEXPIRE`),
//!   so a crashed gateway's lock expires without anyone cleaning up; once completed the TTL
//!   becomes the retention. Timestamps for the admin view come from Redis `TIME`.
//! - **Fencing tokens** come from an `INCR` inside the lock script on one counter per tenant
//!   that never expires, so tokens never repeat (memory: one small key per tenant).
//! - **Cluster-ready keys**: `idem:{<tenant>}:r:<route len>:<route>:<key>` (record),
//!   `…:h:…` (holder marker) and `idem:{<tenant>}:fence` share the `{tenant}` hash tag, so a
//!   script's keys always live in one slot. The route is length-prefixed because routes and
//!   keys may both contain `:`; a tenant outside `[A-Za-z0-9._-]` is hex-encoded behind `~`
//!   because `{`/`}` would break the hash tag.
//! - **Never a hang.** Every call is bounded by a tight timeout (default 250 ms; a healthy
//!   Redis answers in well under 1 ms), after which it fails with the transient
//!   [`StoreError::Timeout`] and the layer answers 503. `ConnectionManager` reconnects in
//!   the background.

use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use http::StatusCode;
use portcullis_redis::{ConnectOptions, RedisClient, RedisConnection};
use redis::{Script, Value};

use super::{millis, LockOutcome, RecordKey, Store, StoreError};
use crate::fingerprint::Fingerprint;
use crate::record::{Completion, RecordInfo, RecordState, StoredResponse};

/// Default bound on one Redis call, connection included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// [`Store`] on Redis (standalone, through a reconnecting `ConnectionManager`, or a
/// Redis/Valkey Cluster, through the cluster client; see [`portcullis_redis`]).
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConnection,
    timeout: Duration,
    lock: Script,
    complete: Script,
    release: Script,
}

// === impl RedisStore ===

impl RedisStore {
    /// Wraps an existing connection (a `ConnectionManager` or a cluster connection), with
    /// [`DEFAULT_TIMEOUT`] per call.
    pub fn new(conn: impl Into<RedisConnection>) -> Self {
        Self {
            conn: conn.into(),
            timeout: DEFAULT_TIMEOUT,
            lock: Script::new(include_str!("redis/lock.lua")),
            complete: Script::new(include_str!("redis/complete.lua")),
            release: Script::new(include_str!("redis/release.lua")),
        }
    }

    /// Connects to `url` (`redis://host:port/db`) with connection and response timeouts
    /// equal to `timeout`. Fails if Redis is unreachable now; later outages are retried in
    /// the background and surface as transient errors.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let client = RedisClient::single(url, &connect_options(timeout))?;
        Self::connect_client(&client, timeout).await
    }

    /// Connects to a Redis/Valkey Cluster through its seed nodes
    /// (`redis://[user:password@]host:port` each), with the same timeouts as
    /// [`RedisStore::connect`]. A record's keys share its tenant's hash tag, so each script
    /// runs on the one node that owns that slot.
    pub async fn connect_cluster<T: AsRef<str>>(
        nodes: &[T],
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = RedisClient::cluster(nodes, &connect_options(timeout))?;
        Self::connect_client(&client, timeout).await
    }

    /// Connects and refuses a server that may evict records before their TTL
    /// ([`StoreError::Evicting`]). A server that does not allow `CONFIG GET` (managed
    /// services often rename it) is accepted with a warning: its policy cannot be checked.
    async fn connect_client(client: &RedisClient, timeout: Duration) -> Result<Self, StoreError> {
        let mut conn = tokio::time::timeout(timeout.saturating_mul(4), client.connect())
            .await
            .map_err(|_| StoreError::Timeout(timeout.saturating_mul(4)))??;
        let policy = tokio::time::timeout(timeout.saturating_mul(4), conn.eviction_policy()).await;
        match policy {
            Ok(Ok((maxmemory, policy))) if maxmemory > 0 && policy != "noeviction" => {
                return Err(StoreError::Evicting { maxmemory, policy });
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e,
                "could not read the Redis eviction policy (CONFIG GET); idempotency records \
                 are safe only if maxmemory-policy is noeviction"),
            Err(_) => tracing::warn!(
                "timed out reading the Redis eviction policy (CONFIG GET); idempotency \
                 records are safe only if maxmemory-policy is noeviction"
            ),
        }
        Ok(Self::new(conn).with_timeout(timeout))
    }

    /// Sets the per-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    async fn finish(
        &self,
        key: &RecordKey,
        fencing: u64,
        script: &Script,
        args: &[&[u8]],
    ) -> Result<(), StoreError> {
        let mut inv = script.prepare_invoke();
        inv.key(record_key(key, 'r')).key(record_key(key, 'h'));
        inv.arg(fencing);
        for a in args {
            inv.arg(*a);
        }
        let mut conn = self.conn.clone();
        let reply: String = self.bounded(inv.invoke_async(&mut conn)).await?;
        match reply.as_str() {
            "ok" => Ok(()),
            "fenced" => Err(StoreError::Fenced { presented: fencing }),
            "lease_lost" => Err(StoreError::LeaseLost { presented: fencing }),
            other => Err(StoreError::Corrupt(format!(
                "unexpected script reply {other:?}"
            ))),
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn try_lock(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        retention: Duration,
    ) -> Result<LockOutcome, StoreError> {
        let mut inv = self.lock.prepare_invoke();
        inv.key(record_key(key, 'r'))
            .key(record_key(key, 'h'))
            .key(fence_key(&key.tenant))
            .arg(&fingerprint.as_bytes()[..])
            .arg(millis(lease))
            .arg(millis(retention));
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut conn)).await?;
        parse_lock_reply(&reply)
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fencing: u64,
        completion: Completion,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let (state, status, body) = match &completion {
            Completion::Response(r) => (RecordState::Completed, r.status, r.encode()),
            Completion::TooLarge(status) => (RecordState::TooLarge, *status, Vec::new()),
        };
        let status = status.as_u16().to_string();
        let retention = millis(retention).to_string();
        let args: [&[u8]; 4] = [
            state.as_str().as_bytes(),
            status.as_bytes(),
            &body,
            retention.as_bytes(),
        ];
        self.finish(key, fencing, &self.complete, &args).await
    }

    async fn release(&self, key: &RecordKey, fencing: u64) -> Result<(), StoreError> {
        self.finish(key, fencing, &self.release, &[]).await
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(record_key(key, 'r'))
            .arg(&["state", "fp", "fence", "status", "created", "exp"]);
        let mut conn = self.conn.clone();
        let v: (
            Option<String>,
            Option<Vec<u8>>,
            Option<u64>,
            Option<u16>,
            Option<u64>,
            Option<u64>,
        ) = self.bounded(cmd.query_async(&mut conn)).await?;
        let (Some(state), Some(fp), Some(fencing), created, expires) = (v.0, v.1, v.2, v.4, v.5)
        else {
            return Ok(None);
        };
        let state = RecordState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown state {state:?}")))?;
        let at = |ms: Option<u64>| UNIX_EPOCH + Duration::from_millis(ms.unwrap_or(0));
        Ok(Some(RecordInfo {
            state,
            fingerprint_hex: hex::encode(fp),
            fencing,
            status: v.3,
            created_at: at(created),
            expires_at: at(expires),
        }))
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(record_key(key, 'r')).arg(record_key(key, 'h'));
        let mut conn = self.conn.clone();
        let n: u64 = self.bounded(cmd.query_async(&mut conn)).await?;
        Ok(n > 0)
    }
}

/// One reconnection attempt in the background (a single server), at most 1 s apart.
fn connect_options(timeout: Duration) -> ConnectOptions {
    ConnectOptions {
        connection_timeout: timeout,
        response_timeout: timeout,
        retries: 1,
        ..ConnectOptions::default()
    }
}

fn parse_lock_reply(reply: &[Value]) -> Result<LockOutcome, StoreError> {
    let corrupt = || StoreError::Corrupt(format!("unexpected lock reply {reply:?}"));
    let tag = match reply.first() {
        Some(Value::BulkString(b)) => b.as_slice(),
        Some(Value::SimpleString(s)) => s.as_bytes(),
        _ => return Err(corrupt()),
    };
    let int = |i: usize| match reply.get(i) {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    let bytes = |i: usize| match reply.get(i) {
        Some(Value::BulkString(b)) => Some(b.as_slice()),
        _ => None,
    };
    Ok(match tag {
        b"acquired" => LockOutcome::Acquired {
            fencing: int(1)
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(corrupt)?,
            took_over: int(2) == Some(1),
        },
        // PTTL is -1/-2 only in races that the script's atomicity excludes; clamp anyway.
        b"in_flight" => LockOutcome::InFlight {
            lease_remaining: Duration::from_millis(int(1).unwrap_or(0).max(0) as u64),
        },
        b"completed" => {
            LockOutcome::Completed(StoredResponse::decode(bytes(1).ok_or_else(corrupt)?)?)
        }
        b"too_large" => LockOutcome::TooLarge {
            status: bytes(1)
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|s| s.parse::<u16>().ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(corrupt)?,
        },
        b"mismatch" => LockOutcome::Mismatch,
        _ => return Err(corrupt()),
    })
}

/// `idem:{<tenant>}:<kind>:<route len>:<route>:<key>`.
fn record_key(key: &RecordKey, kind: char) -> String {
    format!(
        "idem:{{{}}}:{kind}:{}:{}:{}",
        tenant_tag(&key.tenant),
        key.route.len(),
        key.route,
        key.key.as_str()
    )
}

fn fence_key(tenant: &str) -> String {
    format!("idem:{{{}}}:fence", tenant_tag(tenant))
}

/// Tenant ids are usually plain; anything else is hex behind `~` (which plain ids cannot
/// start with), so the encoding stays injective and the hash tag braces intact.
fn tenant_tag(tenant: &str) -> String {
    let plain = !tenant.is_empty()
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        tenant.to_owned()
    } else {
        format!("~{}", hex::encode(tenant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::IdempotencyKey;

    #[test]
    fn keys_are_hash_tagged_and_unambiguous() {
        let k = |t: &str, r: &str, key: &str| {
            RecordKey::new(t, r, IdempotencyKey::parse(key.as_bytes(), 64).unwrap())
        };
        assert_eq!(
            record_key(&k("acme", "/orders", "abc"), 'r'),
            "idem:{acme}:r:7:/orders:abc"
        );
        assert_ne!(
            record_key(&k("acme", "a:b", "c"), 'r'),
            record_key(&k("acme", "a", "b:c"), 'r')
        );
        assert_eq!(
            tenant_tag("we{ird}"),
            format!("~{}", hex::encode("we{ird}"))
        );
        assert_eq!(fence_key("acme"), "idem:{acme}:fence");
    }

    #[test]
    fn parses_lock_replies() {
        let acquired = [
            Value::BulkString(b"acquired".to_vec()),
            Value::Int(7),
            Value::Int(1),
        ];
        assert_eq!(
            parse_lock_reply(&acquired).unwrap(),
            LockOutcome::Acquired {
                fencing: 7,
                took_over: true
            }
        );
        assert!(parse_lock_reply(&[Value::Int(1)]).is_err());
    }
}
