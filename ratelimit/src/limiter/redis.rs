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
//! bucket (microseconds: exact in Lua's doubles, see `MAX_REFILL_MICROS` in `policy.rs`). Because the script is
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
//! protocol error rather than papered over.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::sync::OnceCell;

use super::{Check, Limiter, LimiterError};
use crate::decision::Verdict;
use crate::gcra::Gcra;
use crate::metrics::REDIS_DECISION_SECONDS;

/// The decision script. See the module docs; `KEYS`/`ARGV` layout in its header.
const SCRIPT: &str = r#"
-- Portcullis GCRA: all-or-nothing decision over #KEYS buckets on Redis server time.
-- ARGV[1]: '1' = consume if admitted, '0' = peek.
-- ARGV[2 + 4(i-1) ..]: interval_us, burst, cost, shadow ('1'/'0') of bucket KEYS[i].
-- Returns {now_us, admitted (1/0), tat_1 or -1, ..., tat_n or -1} (TATs as read).
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {now, 1}
local admitted = true
local new_tats = {}
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  local interval = tonumber(ARGV[a])
  local burst = tonumber(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 2])
  local tat = now
  local stored = redis.call('GET', KEYS[i])
  if stored then
    stored = tonumber(stored)
    out[i + 2] = stored
    if stored > now then tat = stored end
  else
    out[i + 2] = -1
  end
  local new_tat = tat + cost * interval
  if cost <= burst and new_tat - burst * interval <= now then
    new_tats[i] = new_tat
  elseif ARGV[a + 3] ~= '1' then
    admitted = false
  end
end
if not admitted then out[2] = 0 end
if ARGV[1] == '1' and admitted then
  for i = 1, #KEYS do
    local nt = new_tats[i]
    if nt and nt > now then
      redis.call('SET', KEYS[i], string.format('%.0f', nt), 'PX', math.ceil((nt - now) / 1000))
    end
  end
end
return out
"#;

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
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    script: Script,
    config: RedisLimiterConfig,
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
            config,
        })
    }

    /// Connects (if not yet) and sends `PING`, under the timeout: a readiness probe.
    pub async fn ping(&self) -> Result<(), LimiterError> {
        self.bounded(async {
            let mut conn = self.connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await?;
            Ok(())
        })
        .await
    }

    /// The settings in force.
    pub fn config(&self) -> &RedisLimiterConfig {
        &self.config
    }

    async fn connection(&self) -> Result<ConnectionManager, LimiterError> {
        let conn = self
            .conn
            .get_or_try_init(|| {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.config.timeout)
                    .set_response_timeout(self.config.timeout)
                    // Background reconnects: quick first attempts, then at most 1 s apart.
                    .set_number_of_retries(3)
                    .set_factor(10)
                    .set_max_delay(1_000);
                ConnectionManager::new_with_config(self.client.clone(), config)
            })
            .await?;
        Ok(conn.clone())
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, LimiterError>>,
    ) -> Result<T, LimiterError> {
        tokio::time::timeout(self.config.timeout, fut)
            .await
            .unwrap_or(Err(LimiterError::Timeout(self.config.timeout)))
    }

    async fn decide(&self, checks: &[Check], commit: bool) -> Result<Verdict, LimiterError> {
        if checks.is_empty() {
            return Ok(Verdict::from_decisions([]));
        }
        let started = tokio::time::Instant::now();
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(u8::from(commit));
        for check in checks {
            if self.config.key_prefix.is_empty() {
                invocation.key(check.key.as_str());
            } else {
                invocation.key(format!("{}{}", self.config.key_prefix, check.key));
            }
            let p = &check.policy;
            invocation
                .arg(p.interval_micros())
                .arg(p.burst())
                .arg(check.cost)
                .arg(u8::from(p.is_shadow()));
        }
        let reply: Vec<i64> = self
            .bounded(async {
                let mut conn = self.connection().await?;
                Ok(invocation.invoke_async(&mut conn).await?)
            })
            .await?;
        let op = if commit { "check" } else { "peek" };
        metrics::histogram!(REDIS_DECISION_SECONDS, "op" => op)
            .record(started.elapsed().as_secs_f64());
        verdict_from_reply(checks, commit, &reply)
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
}

/// Recomputes the decisions from the TATs the script read; see the module docs.
fn verdict_from_reply(
    checks: &[Check],
    commit: bool,
    reply: &[i64],
) -> Result<Verdict, LimiterError> {
    let bad = || LimiterError::Protocol(format!("script reply {reply:?}"));
    let (&now, rest) = reply.split_first().ok_or_else(bad)?;
    let (&admitted, tats) = rest.split_first().ok_or_else(bad)?;
    if tats.len() != checks.len() || now < 0 {
        return Err(bad());
    }
    let now = now.unsigned_abs();
    let admitted = admitted == 1;
    let micro = Duration::from_micros(1);
    let verdict = Verdict::from_decisions(checks.iter().zip(tats).map(|(check, &tat)| {
        let p = &check.policy;
        let stored = u64::try_from(tat).ok();
        let eval =
            Gcra::new(p.interval_micros(), p.burst()).evaluate(stored, now, u64::from(check.cost));
        eval.decision(commit && admitted && eval.allowed, p.is_shadow(), micro)
    }));
    if verdict.is_allowed() != admitted {
        return Err(bad());
    }
    Ok(verdict)
}
