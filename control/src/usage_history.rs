//! 429s over time, per tenant, for the usage history and the top-throttled view of the admin
//! API (and so of the console's chart).
//!
//! The source is the counter the rate-limit layer already increments on the tenant it holds
//! ([`Tenant::record_rate_limited`]): nothing is added to the request path. A background task
//! ([`UsageHistory::run`]) reads every tenant's counter once a second and adds the difference
//! since its last reading to the current 10-second bucket of a per-tenant ring of
//! [`POINTS`] buckets (10 minutes). A read adds the difference not yet sampled to the
//! current bucket, so the newest point is exact at the moment it is read.
//!
//! The counts are this replica's. Across the fleet, the same task publishes this replica's
//! window totals to a [`ThrottledBoard`] (Redis when `storage.state` is Redis), and the
//! top-throttled view sums every replica's latest publication.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use portcullis_ratelimit::{Clock, SystemClock};
use serde::Serialize;

use crate::directory::{Directory, Snapshot, Tenant};

/// Width of one point of the history.
pub(crate) const BUCKET: Duration = Duration::from_secs(10);
/// Points kept per tenant: 10 minutes of 10-second buckets.
pub(crate) const POINTS: usize = 60;
/// How often the background task reads the tenants' counters: a fraction of a bucket, so a
/// 429 lands in the bucket it happened in, give or take this.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often this replica's window totals are published for the fleet view.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(5);
/// Tenants published per replica: the fleet view shows the top ones only.
pub(crate) const PUBLISH_TOP: usize = 100;

/// Index of the bucket holding `since_epoch` (seconds since the epoch / bucket width).
pub(crate) fn bucket_of(since_epoch: Duration) -> u64 {
    since_epoch.as_secs() / BUCKET.as_secs()
}

/// One tenant's ring of counts.
#[derive(Debug, Default)]
struct Series {
    /// The tenant's counter at the last sample.
    sampled_total: u64,
    /// `(bucket index, 429s)`, oldest first, at most [`POINTS`] long.
    buckets: VecDeque<(u64, u64)>,
}

// === impl Series ===

impl Series {
    fn add(&mut self, bucket: u64, count: u64) {
        if count == 0 {
            return;
        }
        match self.buckets.back_mut() {
            Some((b, n)) if *b == bucket => *n += count,
            // A clock stepping back lands its counts in the newest bucket rather than
            // reordering the ring.
            Some((b, n)) if *b > bucket => *n += count,
            _ => self.buckets.push_back((bucket, count)),
        }
        self.trim(bucket);
    }

    /// Drops buckets older than the window ending at `bucket`.
    fn trim(&mut self, bucket: u64) {
        let oldest = bucket.saturating_sub(POINTS as u64 - 1);
        while self.buckets.front().is_some_and(|(b, _)| *b < oldest) {
            self.buckets.pop_front();
        }
    }

    /// Counts not sampled yet: the counter only grows, but a tenant deleted and created
    /// again starts from zero, which then counts as all new.
    fn pending(&self, total: u64) -> u64 {
        // A total below the sampled one is a tenant re-created (its counter restarted), not
        // a race: totals are read under the lock the samples are written under.
        total.checked_sub(self.sampled_total).unwrap_or(total)
    }

    /// The window's total, the unsampled part included.
    fn window(&self, bucket: u64, total: u64) -> u64 {
        let oldest = bucket.saturating_sub(POINTS as u64 - 1);
        self.buckets
            .iter()
            .filter(|(b, _)| *b >= oldest)
            .map(|(_, n)| n)
            .sum::<u64>()
            + self.pending(total)
    }
}

/// One point of a tenant's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Point {
    /// Start of the bucket, seconds since the Unix epoch.
    pub start: u64,
    /// 429s given by this replica in the bucket.
    pub rejected: u64,
}

/// A tenant's 429s over the last [`POINTS`] buckets, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct History {
    /// Tenant id.
    pub tenant: String,
    /// Width of a point, in seconds.
    pub interval_secs: u64,
    /// Exactly [`POINTS`] points; the last is the current, still open bucket.
    pub points: Vec<Point>,
    /// This replica's 429s of the tenant since it started (the usage view's `rejected_total`).
    pub rejected_total: u64,
}

impl History {
    /// The [`POINTS`] points ending at `bucket`, from sampled `counts` by bucket and the
    /// `pending` count not yet sampled (in the current bucket).
    fn of(
        tenant: &str,
        bucket: u64,
        counts: &HashMap<u64, u64>,
        pending: u64,
        rejected_total: u64,
    ) -> Self {
        let first = bucket.saturating_sub(POINTS as u64 - 1);
        let points = (first..=bucket)
            .map(|b| Point {
                start: b * BUCKET.as_secs(),
                rejected: counts.get(&b).copied().unwrap_or(0)
                    + if b == bucket { pending } else { 0 },
            })
            .collect();
        Self {
            tenant: tenant.to_owned(),
            interval_secs: BUCKET.as_secs(),
            points,
            rejected_total,
        }
    }
}

/// A tenant's 429s in the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Throttled {
    /// Tenant id.
    pub tenant: String,
    /// 429s in the last [`POINTS`] × [`BUCKET`].
    pub rejected: u64,
}

/// Where replicas publish their window totals and read everyone's (implemented over Redis
/// by the gateway; absent with memory state, where the view is this replica's).
#[async_trait]
pub trait ThrottledBoard: Send + Sync {
    /// Publishes this replica's totals (`(tenant, 429s in the window)`, nonzero, at most
    /// [`PUBLISH_TOP`]), replacing its previous publication.
    async fn publish(&self, replica: &str, counts: &[(String, u64)]) -> Result<(), BoardError>;
    /// Every live replica's latest publication, by replica id.
    async fn read(&self) -> Result<Vec<(String, Vec<(String, u64)>)>, BoardError>;
}

/// The board's store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BoardError {
    /// The store answered with an error, or could not be reached.
    // The store's error is said in the message (it is what `fleet_error` shows), not
    // chained as a source, so a reporter walking the chain does not say it twice.
    #[error("throttled-tenants board unavailable: {0}")]
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
    /// The store did not answer within the bound.
    #[error("throttled-tenants board did not answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// Every tenant's 429 history on this replica.
#[derive(Debug)]
pub(crate) struct UsageHistory {
    directory: Arc<Directory>,
    series: Mutex<HashMap<Arc<str>, Series>>,
    /// This replica's id on the board (random per process).
    replica: String,
    /// Places the buckets (wall time, so replicas' buckets line up).
    clock: Arc<dyn Clock>,
}

// === impl UsageHistory ===

impl UsageHistory {
    /// An empty history of `directory`'s tenants.
    pub(crate) fn new(directory: Arc<Directory>) -> Self {
        Self {
            directory,
            series: Mutex::default(),
            replica: format!("{:016x}", rand::random::<u64>()),
            clock: Arc::new(SystemClock),
        }
    }

    /// The bucket holding now.
    pub(crate) fn current_bucket(&self) -> u64 {
        bucket_of(self.clock.unix_now())
    }

    /// This replica's id on the board.
    pub(crate) fn replica(&self) -> &str {
        &self.replica
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Series>> {
        // Counts are plain numbers: a panic while holding the lock leaves nothing torn.
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads every tenant's counter into `bucket`; tenants gone from the snapshot are forgotten.
    pub(crate) fn sample(&self, snapshot: &Snapshot, bucket: u64) {
        let mut series = self.lock();
        series.retain(|id, _| snapshot.by_id(id).is_some());
        for tenant in snapshot.tenants() {
            let total = tenant.rate_limited_total();
            let entry = series.entry(tenant.id.clone()).or_default();
            let pending = entry.pending(total);
            entry.sampled_total = total;
            entry.add(bucket, pending);
            entry.trim(bucket);
        }
    }

    /// `tenant`'s history as of `bucket`.
    pub(crate) fn history(&self, tenant: &Tenant, bucket: u64) -> History {
        let series = self.lock();
        // Read under the lock, so a sample taken meanwhile cannot be ahead of `total`.
        let total = tenant.rate_limited_total();
        let (counts, pending) = match series.get(&tenant.id) {
            Some(s) => (s.buckets.iter().copied().collect(), s.pending(total)),
            None => (HashMap::new(), total),
        };
        History::of(&tenant.id, bucket, &counts, pending, total)
    }

    /// The history of a tenant this replica has not loaded yet (its snapshot is up to a
    /// poll behind the database): nothing counted.
    pub(crate) fn nothing_yet(&self, id: &str, bucket: u64) -> History {
        History::of(id, bucket, &HashMap::new(), 0, 0)
    }

    /// This replica's tenants with 429s in the window ending at `bucket`, most first (ties
    /// by id), at most `limit`.
    pub(crate) fn top(&self, snapshot: &Snapshot, bucket: u64, limit: usize) -> Vec<Throttled> {
        let series = self.lock();
        let mut top: Vec<Throttled> = snapshot
            .tenants()
            .filter_map(|tenant| {
                let total = tenant.rate_limited_total();
                let rejected = match series.get(&tenant.id) {
                    Some(s) => s.window(bucket, total),
                    None => total,
                };
                (rejected > 0).then(|| Throttled {
                    tenant: tenant.id.to_string(),
                    rejected,
                })
            })
            .collect();
        sort_top(&mut top, limit);
        top
    }

    /// Samples every [`SAMPLE_EVERY`] and, with a board, publishes every [`PUBLISH_EVERY`],
    /// until the history is dropped (`this` is the only strong reference the task holds
    /// between ticks, so the task ends with the admin router).
    pub(crate) async fn run(this: std::sync::Weak<Self>, board: Option<Arc<dyn ThrottledBoard>>) {
        let mut ticker = tokio::time::interval(SAMPLE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let publish_every = PUBLISH_EVERY.as_secs() / SAMPLE_EVERY.as_secs();
        let mut tick: u64 = 0;
        loop {
            ticker.tick().await;
            let Some(history) = this.upgrade() else {
                return;
            };
            let bucket = history.current_bucket();
            history.sample(&history.directory.snapshot(), bucket);
            tick = tick.wrapping_add(1);
            let Some(board) = board
                .as_ref()
                .filter(|_| tick.is_multiple_of(publish_every))
            else {
                continue;
            };
            let counts: Vec<(String, u64)> = history
                .top(&history.directory.snapshot(), bucket, PUBLISH_TOP)
                .into_iter()
                .map(|t| (t.tenant, t.rejected))
                .collect();
            let replica = history.replica.clone();
            // Not held across the await: the task must not keep the history alive.
            drop(history);
            if let Err(err) = board.publish(&replica, &counts).await {
                tracing::debug!(%err, "publishing throttled tenants failed; next try in {PUBLISH_EVERY:?}");
            }
        }
    }
}

/// Most 429s first, ties by tenant id; at most `limit`.
pub(crate) fn sort_top(top: &mut Vec<Throttled>, limit: usize) {
    top.sort_by(|a, b| b.rejected.cmp(&a.rejected).then(a.tenant.cmp(&b.tenant)));
    top.truncate(limit);
}

/// Sums the replicas' publications, this replica's own replaced by `own` (exact now, where
/// its publication is up to [`PUBLISH_EVERY`] old).
pub(crate) fn fleet_top(
    own_replica: &str,
    own: Vec<Throttled>,
    published: Vec<(String, Vec<(String, u64)>)>,
    limit: usize,
) -> (usize, Vec<Throttled>) {
    let mut sums: HashMap<String, u64> = own.into_iter().map(|t| (t.tenant, t.rejected)).collect();
    let mut replicas = 1;
    for (replica, counts) in published {
        if replica == own_replica {
            continue;
        }
        replicas += 1;
        for (tenant, n) in counts {
            *sums.entry(tenant).or_default() += n;
        }
    }
    let mut top: Vec<Throttled> = sums
        .into_iter()
        .map(|(tenant, rejected)| Throttled { tenant, rejected })
        .collect();
    sort_top(&mut top, limit);
    (replicas, top)
}

mod redis_board;

pub use redis_board::RedisBoard;

#[cfg(test)]
mod tests {
    use super::*;

    fn throttled(tenant: &str, rejected: u64) -> Throttled {
        Throttled {
            tenant: tenant.into(),
            rejected,
        }
    }

    #[test]
    fn series_keeps_the_window_and_counts_pending() {
        let mut s = Series::default();
        s.add(100, 3);
        s.add(100, 2);
        s.add(101, 1);
        assert_eq!(s.buckets, VecDeque::from(vec![(100, 5), (101, 1)]));
        s.sampled_total = 6;
        assert_eq!(s.pending(9), 3);
        assert_eq!(s.window(101, 9), 9);
        // A clock stepping back adds to the newest bucket.
        s.add(50, 1);
        assert_eq!(s.buckets.back(), Some(&(101, 2)));
        // 60 buckets later the first two are gone.
        s.add(100 + POINTS as u64, 4);
        assert_eq!(s.buckets, VecDeque::from(vec![(101, 2), (160, 4)]));
        assert_eq!(
            s.window(161, 6),
            4,
            "bucket 101 left the window ending at 161"
        );
        // A tenant re-created: its counter restarts below the sampled total.
        assert_eq!(s.pending(2), 2);
    }

    #[test]
    fn top_is_most_first_ties_by_id_and_bounded() {
        let mut top = vec![throttled("b", 2), throttled("a", 2), throttled("c", 9)];
        sort_top(&mut top, 2);
        assert_eq!(top, vec![throttled("c", 9), throttled("a", 2)]);
    }

    #[test]
    fn fleet_sums_other_replicas_and_replaces_its_own() {
        let published = vec![
            ("me".to_owned(), vec![("a".to_owned(), 100)]),
            (
                "r2".to_owned(),
                vec![("a".to_owned(), 3), ("b".to_owned(), 4)],
            ),
            ("r3".to_owned(), vec![("b".to_owned(), 4)]),
        ];
        let (replicas, top) = fleet_top("me", vec![throttled("a", 1)], published, 10);
        assert_eq!(replicas, 3);
        assert_eq!(top, vec![throttled("b", 8), throttled("a", 4)]);
    }
}
