//! Redis backend: one Lua script per decision, on Redis server time, one round trip.
//!
//! # Why a script
//!
//! The decision reads every bucket, decides all-or-nothing, then writes; done as separate
//! commands (or `MULTI`/`EXEC`, which cannot branch on what it read) two replicas could both
//! read the last token. A script runs atomically on the server, so N gateway replicas
//! sharing one Redis together admit the configured rate, not N times it.
//!
//! # Why server time
//!
//! Replicas' clocks disagree by milliseconds to seconds; a bucket refilled by whichever
//! replica's clock is ahead would leak. The script reads `TIME` once and uses it for every
//! bucket (nanosecond TATs, handled so they stay exact in Lua's doubles: see `tat_lua!`). Because the script is
//! therefore non-deterministic it first asks for effects replication
//! (`redis.replicate_commands()`, needed on Redis 3.2–4, the default since 5, guarded for
//! versions without it), so replicas receive the resulting `SET`s, not the script.
//!
//! # Round trips, memory, timeouts
//!
//! - `EVALSHA` via [`redis::Script`], which sends the script body once on `NOSCRIPT`
//!   (after a restart or `SCRIPT FLUSH`): one round trip in the steady state.
//! - Each written bucket gets `PX` = time until it is full again, after which the key is
//!   worthless; Redis memory is bounded by the keys active in the last refill period.
//! - Every call, including establishing the connection, runs under `timeout` (default
//!   50 ms): a stalled Redis costs a request at most that, then an error the fallback
//!   wrapper handles. The connection is a [`ConnectionManager`], which reconnects in the
//!   background after a failure, so the limiter recovers by itself when Redis returns.
//!
//! The GCRA arithmetic lives twice: in the script (to decide and write atomically) and in
//! [`crate::gcra`] (to report remaining/reset/retry from the TATs the script returns). The
//! script returns the TATs it read, Rust recomputes, and a disagreement is reported as a
//! protocol error rather than papered over. Calendar counters are handled the same way with
//! [`crate::period::Quota`].
//!
//! # Calendar quotas: the gateway's clock, not the server's
//!
//! A calendar quota's counter is the key `<key>:<window id>` (e.g.
//! `rl:{tenant:acme}:quota:day:20261121`), an integer count. The window is computed in Rust
//! from the limiter's [`Clock`] (see [`RedisLimiter::with_clock`]) and passed in: the key
//! names the window, and the script receives the time left in it. Buckets stay on server
//! time; only *which day it is* comes from the gateway. Trade-off: replicas disagree on the
//! midnight instant by their clock skew (milliseconds under NTP), so a request at the
//! boundary may be counted in either day, never in both and never lost. Computing the
//! window from `TIME` would remove that skew but put calendar arithmetic in Lua and make the
//! boundary untestable with a `ManualClock`.
//!
//! Each write sets the counter's expiry to the time left in its window by the writer's clock
//! plus [`QUOTA_TTL_MARGIN`] (relative `PX`, not `PEXPIREAT`: the server's own clock never
//! decides what window a counter belongs to, so server/gateway skew cannot expire a live
//! counter early). The margin covers replica skew: a replica whose clock lags still finds the
//! old window's counter until its own midnight. Redis memory: one small key per quota per
//! principal that used it in the current window (two around a boundary, for the margin).
//!
//! # Redis Cluster
//!
//! [`RedisLimiter::open_cluster`] runs the same scripts on a Redis (or Valkey) Cluster
//! through [`portcullis_redis`]; the client follows `MOVED`/`ASK` by itself. A script may
//! only touch keys of one slot, and every key is hash-tagged by its principal
//! ([`crate::key`]), so a caller's buckets, per-route buckets and calendar quotas are always
//! decided by one script on one node, all-or-nothing, exactly as on a single server.
//!
//! The global ceiling (`{global}`, and route totals `{route:…}`) cannot share every
//! caller's slot. A request whose keys span slots is decided **per slot, all slots at
//! once**: one script per slot, sent concurrently, so the decision still costs one round
//! trip of latency (and one script per slot). It is admitted iff every slot's script
//! admitted. When one slot refuses while another admitted, the admitting slot has already
//! consumed: it is **refunded** (one more script on that slot) before the 429 is returned.
//!
//! So "a rejected request consumes nothing" holds on a cluster with these exceptions, and
//! only for requests whose keys span slots:
//!
//! - between a slot's consumption and its refund (about one round trip), a concurrent
//!   request sees that slot with those tokens taken and may be refused by it (for the
//!   global ceiling: while a caller over its own limit keeps being refused, the global
//!   bucket holds at most `refusal rate × round trip × cost` tokens for it, e.g. 20 tokens
//!   at 100 000 refusals/s and 200 µs);
//! - when the refund itself fails (the node died in between, or it timed out), or when
//!   another slot's script failed or timed out, what the admitting slots consumed stays
//!   consumed until their buckets refill; the error goes to the fallback wrapper like any
//!   store error. A script that timed out may or may not have run: it is never refunded.
//!
//! Each slot's buckets run on the clock of the node that owns the slot (`TIME`), so after a
//! failover the new master's clock applies, as with a single server's replica.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use portcullis_redis::{RedisClient, RedisConnection};
use redis::Script;
use tokio::sync::OnceCell;

use super::{Check, Limiter, LimiterError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Verdict};
use crate::metrics::REDIS_DECISION_SECONDS;
use connection::connect_options;
use keys::counter_ttl_ms;
use reply::{evals_from_reply, evaluate, tick_nanos, verdict_of, Evals};
use scripts::{GIVE_BACK_SCRIPT, REFUND_SCRIPT, SCRIPT};

/// Added to a calendar counter's expiry beyond the end of its window (by the writing
/// gateway's clock), to cover clock skew between replicas. See the module docs.
pub const QUOTA_TTL_MARGIN: Duration = Duration::from_secs(60);

/// Settings for [`RedisLimiter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisLimiterConfig {
    /// Upper bound on one decision, connection set-up included (default 50 ms).
    pub timeout: Duration,
    /// Prepended to every key, e.g. `portcullis:` (default empty). Must not contain `{` or
    /// `}`, which would change the keys' hash tags.
    pub key_prefix: String,
}

/// Rate limiter state in Redis, shared by every gateway replica. See the module docs.
pub struct RedisLimiter {
    client: RedisClient,
    conn: OnceCell<RedisConnection>,
    script: Script,
    give_back_script: Script,
    refund_script: Script,
    config: RedisLimiterConfig,
    clock: Arc<dyn Clock>,
}

// === impl RedisLimiterConfig ===

impl Default for RedisLimiterConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            key_prefix: String::new(),
        }
    }
}

// === impl RedisLimiter ===

impl RedisLimiter {
    /// A limiter for `url` (`redis://[:password@]host:port[/db]`). Does no I/O: the
    /// connection is made on first use, so a gateway can start while Redis is down and
    /// serve through the fallback until it comes up.
    pub fn open(url: &str, config: RedisLimiterConfig) -> Result<Self, LimiterError> {
        let client = redis::Client::open(url)
            .map_err(|e| LimiterError::Config(format!("invalid redis URL: {e}")))?;
        Self::new(client, config)
    }

    /// A limiter over an existing client. Does no I/O.
    pub fn new(client: redis::Client, config: RedisLimiterConfig) -> Result<Self, LimiterError> {
        let options = connect_options(&config);
        Self::with_client(RedisClient::Single(client, options), config)
    }

    /// A limiter on a Redis (or Valkey) Cluster, through its seed nodes
    /// (`redis://[user:password@]host:port` each). Does no I/O. See "Redis Cluster" in the
    /// module docs for how a request whose keys span slots is decided.
    pub fn open_cluster<T: AsRef<str>>(
        nodes: &[T],
        config: RedisLimiterConfig,
    ) -> Result<Self, LimiterError> {
        let client = RedisClient::cluster(nodes, &connect_options(&config))
            .map_err(|e| LimiterError::Config(format!("invalid redis cluster nodes: {e}")))?;
        Self::with_client(client, config)
    }

    fn with_client(client: RedisClient, config: RedisLimiterConfig) -> Result<Self, LimiterError> {
        if config.key_prefix.contains(['{', '}']) {
            return Err(LimiterError::Config(
                "key_prefix must not contain '{' or '}'".into(),
            ));
        }
        if config.timeout.is_zero() {
            return Err(LimiterError::Config("timeout must be longer than 0".into()));
        }
        Ok(Self {
            client,
            conn: OnceCell::new(),
            script: Script::new(SCRIPT),
            give_back_script: Script::new(GIVE_BACK_SCRIPT),
            refund_script: Script::new(REFUND_SCRIPT),
            config,
            clock: Arc::new(SystemClock),
        })
    }

    /// The wall clock that places calendar-quota windows (default [`SystemClock`]). Buckets
    /// are unaffected: they run on Redis server time.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Connects (if not yet) and sends `PING`, under the timeout: a readiness probe.
    pub async fn ping(&self) -> Result<(), LimiterError> {
        self.bounded(async {
            let mut conn = self.connection().await?;
            conn.ping().await?;
            Ok(())
        })
        .await
    }

    /// The settings in force.
    pub fn config(&self) -> &RedisLimiterConfig {
        &self.config
    }

    async fn decide(&self, checks: &[Check], commit: bool) -> Result<Verdict, LimiterError> {
        if checks.is_empty() {
            return Ok(Verdict::from_decisions([]));
        }
        let started = tokio::time::Instant::now();
        let unix_now = checks
            .iter()
            .any(|c| c.policy.period().is_some())
            .then(|| self.clock.unix_now());
        let verdict = match self.slot_groups(checks, unix_now) {
            None => {
                let (admitted, evals) = self.bounded(self.run(checks, commit, unix_now)).await?;
                verdict_of(checks.iter().zip(&evals), commit && admitted)
            }
            Some(groups) => self.decide_split(&groups, commit, unix_now).await?,
        };
        let op = if commit { "check" } else { "peek" };
        metrics::histogram!(REDIS_DECISION_SECONDS, "op" => op)
            .record(started.elapsed().as_secs_f64());
        Ok(verdict)
    }

    /// Runs the decision script over `checks` (keys of one slot): whether it admitted, and
    /// each check's evaluation.
    async fn run(
        &self,
        checks: &[Check],
        commit: bool,
        unix_now: Option<Duration>,
    ) -> Result<(bool, Evals), LimiterError> {
        let mut windows = smallvec::SmallVec::<[Option<Duration>; 4]>::new();
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(u8::from(commit));
        for check in checks {
            let p = &check.policy;
            let until_end = if p.period().is_none() && self.config.key_prefix.is_empty() {
                // The common case: the key as it is, no formatting.
                invocation.key(check.key.as_str());
                None
            } else {
                let target = self.target(check, unix_now);
                invocation.key(target.key);
                target.until_end
            };
            windows.push(until_end);
            invocation
                .arg(p.store_interval())
                .arg(p.burst())
                .arg(check.cost)
                .arg(u8::from(p.is_shadow()))
                .arg(until_end.map_or(0, counter_ttl_ms))
                .arg(tick_nanos(p));
        }
        let mut conn = self.connection().await?;
        let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
        evals_from_reply(checks, &windows, &reply)
    }
}

impl fmt::Debug for RedisLimiter {
    // The client's connection info may hold a password: not printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("config", &self.config)
            .field("connected", &self.conn.initialized())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Limiter for RedisLimiter {
    async fn check(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.decide(checks, true).await
    }

    async fn peek(&self, checks: &[Check]) -> Result<Verdict, LimiterError> {
        self.decide(checks, false).await
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        if checks.is_empty() {
            return Ok(());
        }
        let unix_now = Some(self.clock.unix_now());
        let keys: Vec<String> = checks
            .iter()
            .map(|c| self.target(c, unix_now).key)
            .collect();
        // One DEL: atomic, and an absent key is a full bucket or a zero count.
        self.bounded(async {
            let mut conn = self.connection().await?;
            // On a cluster the keys may span slots: the client splits the DEL per slot, so
            // it is atomic per key rather than for the whole list.
            redis::cmd("DEL")
                .arg(&keys)
                .query_async::<i64>(&mut conn)
                .await?;
            Ok(())
        })
        .await
    }

    async fn give_back(&self, check: &Check, amount: u64) -> Result<Decision, LimiterError> {
        let p = &check.policy;
        let target = self.target(check, Some(self.clock.unix_now()));
        // Bounded so the script's doubles stay exact: more than a burst back is a full
        // bucket, more than 2^52 back is a zero count (counts stay below 2^49).
        let amount = match target.until_end {
            None => amount.min(p.burst()),
            Some(_) => amount.min(1 << 52),
        };
        let mut invocation = self.give_back_script.key(&target.key);
        invocation
            .arg(p.store_interval())
            .arg(amount)
            .arg(target.until_end.map_or(0, counter_ttl_ms))
            .arg(tick_nanos(p));
        let reply: Vec<i64> = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(invocation.invoke_async(&mut conn).await?)
            })
            .await?;
        let &[now, value] = reply.as_slice() else {
            return Err(LimiterError::Protocol(format!(
                "give-back script reply {reply:?}"
            )));
        };
        let eval = evaluate(check, target.until_end, now.unsigned_abs(), value);
        Ok(eval.decision(false, p.is_shadow(), p.store_tick()))
    }
}

mod cluster;
mod connection;
mod keys;
mod reply;
mod scripts;
