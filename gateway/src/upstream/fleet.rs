//! Shares what each replica learned about its adaptive upstreams through the state store.
//!
//! Every [`SYNC_INTERVAL`] each replica writes its [`FleetReport`] for each adaptive upstream
//! (learned rate, demand) into one Redis hash per upstream, with an expiry of
//! [`REPORT_TTL`] on Redis' own clock, drops the expired reports and reads the others back:
//! one Lua script, one round trip, one key (hash-tagged by upstream, so it works on a
//! cluster). The replica then caps its rate at [`fleet_share`] of the total for
//! [`SHARE_VALID`]. If the store stops answering, the share lapses and each replica is on
//! its own controller again: sharing only ever makes replicas more careful, never blind.
//! With `state = "memory"` nothing runs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use portcullis_redis::{ConnectOptions, RedisClient, RedisConnection};
use portcullis_retry::{fleet_share, FleetReport, UpstreamState};

use crate::upstream::proxy::Upstream;
use redis::Script;

use crate::config::{Config, StateBackend};

/// How often a replica publishes and reads the fleet's reports.
const SYNC_INTERVAL: Duration = Duration::from_millis(500);
/// A report not renewed within this long is dropped (four missed syncs).
const REPORT_TTL: Duration = Duration::from_secs(2);
/// A fleet share is applied this long after the sync that computed it.
const SHARE_VALID: Duration = Duration::from_secs(2);
/// Bound on one sync round trip.
const SYNC_TIMEOUT: Duration = Duration::from_millis(250);

/// KEYS[1]: the upstream's hash. ARGV: replica id, learned rate (-1: none), demand, TTL ms.
/// Each field is "learned demand expires_at_ms"; returns the live ones.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. (now + ttl))
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  local expires = tonumber(string.match(all[i + 1], '(%S+)$'))
  if expires == nil or expires < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    live[#live + 1] = all[i + 1]
  end
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return live
";

/// Starts sharing the adaptive upstreams' limits when the state store is Redis; does
/// nothing otherwise. Stops when `stop` resolves.
pub(crate) fn spawn(
    config: &Config,
    upstreams: &[Arc<Upstream>],
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), redis::RedisError> {
    let adaptive: Vec<Arc<UpstreamState>> = upstreams
        .iter()
        .map(|u| u.state())
        .filter(|d| d.adaptive().is_some())
        .cloned()
        .collect();
    if adaptive.is_empty() {
        return Ok(());
    }
    let options = ConnectOptions::default();
    let client = match &config.storage.state {
        StateBackend::Memory => return Ok(()),
        StateBackend::Redis(url) => RedisClient::single(url, &options)?,
        StateBackend::RedisCluster(nodes) => RedisClient::cluster(nodes, &options)?,
    };
    let replica = uuid::Uuid::new_v4().simple().to_string();
    tokio::spawn(async move {
        let script = Script::new(SCRIPT);
        let mut connection: Option<RedisConnection> = None;
        let mut tick = tokio::time::interval(SYNC_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = tick.tick() => {}
            }
            if connection.is_none() {
                connection = tokio::time::timeout(SYNC_TIMEOUT, client.connect())
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let Some(conn) = connection.as_mut() else {
                tracing::debug!("adaptive fleet sync: state store unreachable");
                continue;
            };
            for dependency in &adaptive {
                if let Err(reason) = sync(conn, &script, &replica, dependency).await {
                    tracing::debug!(dependency = dependency.upstream_name(), %reason, "adaptive fleet sync failed");
                    connection = None;
                    break;
                }
            }
        }
    });
    Ok(())
}

/// Why one sync failed (the share then lapses on its own).
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("state store: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("state store did not answer within {SYNC_TIMEOUT:?}")]
    Timeout,
}

async fn sync(
    conn: &mut RedisConnection,
    script: &Script,
    replica: &str,
    dependency: &UpstreamState,
) -> Result<(), SyncError> {
    let Some(throttle) = dependency.adaptive() else {
        return Ok(());
    };
    let mine = throttle.report();
    let key = format!("portcullis:adaptive:{{{}}}", dependency.upstream_name());
    let mut invocation = script.key(key);
    invocation
        .arg(replica)
        .arg(mine.learned_rate.unwrap_or(-1.0))
        .arg(mine.demand)
        .arg(u64::try_from(REPORT_TTL.as_millis()).unwrap_or(u64::MAX));
    let rows: Vec<String> = tokio::time::timeout(SYNC_TIMEOUT, invocation.invoke_async(conn))
        .await
        .map_err(|_| SyncError::Timeout)??;
    let fleet: Vec<FleetReport> = rows.iter().filter_map(|row| parse(row)).collect();
    throttle.set_fleet_share(fleet_share(&mine, &fleet), SHARE_VALID);
    Ok(())
}

/// One replica's report, as the script stores it; a malformed one is ignored.
fn parse(row: &str) -> Option<FleetReport> {
    let mut fields = row.split(' ');
    let learned: f64 = fields.next()?.parse().ok()?;
    let demand: f64 = fields.next()?.parse().ok()?;
    let finite = |v: f64| v.is_finite().then_some(v);
    Some(FleetReport {
        learned_rate: finite(learned).filter(|r| *r > 0.0),
        demand: finite(demand)?.max(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse_and_garbage_is_ignored() {
        assert_eq!(
            parse("35.5 120 1700000000000"),
            Some(FleetReport {
                learned_rate: Some(35.5),
                demand: 120.0
            })
        );
        assert_eq!(
            parse("-1 3 1700000000000"),
            Some(FleetReport {
                learned_rate: None,
                demand: 3.0
            })
        );
        for bad in ["", "x 1 2", "1", "NaN NaN 1", "1 inf 2"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
