//! Failed authentication limited per client address (`auth.failure_limit` per
//! `auth.failure_window`).
//!
//! Every 401 from tenant resolution (an unknown, revoked or disabled API key, a refused JWT)
//! counts against the client address it came from — an IPv4 address, an IPv6 /64 (the block
//! one subscriber usually holds), the client as resolved through `server.trusted_proxies`.
//! Past the limit within one window, every request from that address that presents a
//! credential (`X-API-Key`, `Authorization: Bearer`) is answered 429 problem+json with
//! `Retry-After` until the window that counted them ends — *without* checking the
//! credential, valid ones included. Checking it would answer "valid" (the request passes) or
//! "invalid" (429) and so keep the guessing going at full speed under another status code;
//! nginx's `limit_req` on a failure location blocks everything alike. A real user behind the
//! same NAT as a guesser waits at most one window. Requests without a credential (anonymous)
//! are not refused here: they guess nothing.
//!
//! Memory is fixed: a set-associative table of [`SETS`] × [`WAYS`] addresses, each set
//! behind its own lock; a new address takes an empty way or evicts the one whose window
//! started first. The counts are per replica (not shared through Redis): behind N replicas an
//! address gets at most N × the limit per window.
//!
//! A request from an address that is not blocked costs one atomic load: the table is only
//! looked at while some address is blocked.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use http::{Response, StatusCode};
use portcullis_problem::Problem;
use tokio::time::Instant;

/// Sets in the table.
pub(crate) const SETS: usize = 1024;
/// Addresses per set.
pub(crate) const WAYS: usize = 8;

/// The failure counts of client addresses (see the module docs).
#[derive(Debug)]
pub(crate) struct AuthFailures {
    limit: u32,
    window: Duration,
    sets: Box<[Mutex<[Option<Slot>; WAYS]>]>,
    hasher: RandomState,
    /// When the last block that is known ends, in milliseconds since `epoch` (rounded up);
    /// 0 while no address is blocked.
    blocked_until: AtomicU64,
    epoch: Instant,
}

/// One address's count in its current window.
#[derive(Debug, Clone, Copy)]
struct Slot {
    source: u128,
    started: Instant,
    failures: u32,
}

// === impl AuthFailures ===

impl AuthFailures {
    /// `limit` failures per `window` and client address; `None` when `limit` is 0 (off).
    pub(crate) fn new(limit: u32, window: Duration) -> Option<Self> {
        (limit > 0).then(|| Self {
            limit,
            window,
            sets: (0..SETS).map(|_| Mutex::new([None; WAYS])).collect(),
            hasher: RandomState::new(),
            blocked_until: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// How long `ip`'s credentials are still refused; `None` when they are checked as usual.
    pub(crate) fn blocked(&self, ip: IpAddr) -> Option<Duration> {
        let until = self.blocked_until.load(Ordering::Relaxed);
        if until == 0 {
            return None;
        }
        let now = Instant::now();
        if self.millis(now) >= until {
            // Every block known has ended: back to the one atomic load. A block recorded
            // meanwhile raised the value, and the exchange fails.
            let _ =
                self.blocked_until
                    .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
            return None;
        }
        let source = source(ip);
        let set = self.set(source);
        let slot = set.iter().flatten().find(|slot| slot.source == source)?;
        let ends = slot.started + self.window;
        (slot.failures >= self.limit && now < ends).then(|| ends - now)
    }

    /// Counts one failed authentication from `ip`.
    pub(crate) fn failed(&self, ip: IpAddr) {
        let now = Instant::now();
        let source = source(ip);
        let mut set = self.set(source);
        let index = set
            .iter()
            .position(|slot| slot.is_some_and(|slot| slot.source == source))
            .or_else(|| set.iter().position(Option::is_none))
            .unwrap_or_else(|| oldest(&set[..]));
        let slot = match &mut set[index] {
            Some(slot) if slot.source == source && now < slot.started + self.window => slot,
            other => other.insert(Slot {
                source,
                started: now,
                failures: 0,
            }),
        };
        slot.failures = slot.failures.saturating_add(1);
        if slot.failures >= self.limit {
            let ends = self.millis_ceil(slot.started + self.window);
            self.blocked_until.fetch_max(ends, Ordering::Relaxed);
        }
    }

    fn set(&self, source: u128) -> std::sync::MutexGuard<'_, [Option<Slot>; WAYS]> {
        let index = usize::try_from(self.hasher.hash_one(source) % SETS as u64).unwrap_or(0);
        // A panic while holding a set cannot leave it inconsistent: take it as it is.
        self.sets[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whole milliseconds since `epoch`, rounded down.
    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whole milliseconds since `epoch`, rounded up (at least 1, so never "none blocked"):
    /// `millis(now) >= millis_ceil(at)` only once `now >= at`.
    fn millis_ceil(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(nanos.div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// The way whose window started first (the set is full).
fn oldest(set: &[Option<Slot>]) -> usize {
    set.iter()
        .enumerate()
        .min_by_key(|(_, slot)| slot.map(|slot| slot.started))
        .map_or(0, |(index, _)| index)
}

/// What an address counts as: an IPv4 address (IPv4-mapped IPv6 included) or an IPv6 /64,
/// tagged apart.
fn source(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => (1 << 64) | u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6) >> 64,
    }
}

/// The 429 for a blocked address; `Retry-After` is when its window ends.
pub(crate) fn refusal(wait: Duration) -> Response<Body> {
    metrics::counter!("auth_failures_blocked_total").increment(1);
    Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-auth-failures",
        "Too many failed authentications",
        "Too many requests from your address presented an invalid credential; credentials from \
         it are not checked until Retry-After has passed.",
    )
    .retry_after(wait)
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn blocks_after_the_limit_until_the_window_ends() {
        let table = AuthFailures::new(3, Duration::from_secs(60)).unwrap();
        let guesser = ip("192.0.2.7");
        for _ in 0..2 {
            table.failed(guesser);
            assert_eq!(table.blocked(guesser), None);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        table.failed(guesser);
        let until_window_ends = Some(Duration::from_secs(50));
        assert_eq!(
            table.blocked(guesser),
            until_window_ends,
            "counted from the first"
        );
        assert_eq!(table.blocked(ip("192.0.2.8")), None, "another address");
        tokio::time::advance(Duration::from_secs(49)).await;
        assert_eq!(table.blocked(guesser), Some(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(table.blocked(guesser), None, "the window ended");
        assert_eq!(
            table.blocked_until.load(Ordering::Relaxed),
            0,
            "fast path again"
        );
        table.failed(guesser);
        assert_eq!(table.blocked(guesser), None, "a new window counts from one");
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_slash_64_counts_as_one_address_and_mapped_ipv4_as_ipv4() {
        let table = AuthFailures::new(2, Duration::from_secs(60)).unwrap();
        table.failed(ip("2001:db8:1:2::1"));
        table.failed(ip("2001:db8:1:2:ffff::9"));
        assert!(table.blocked(ip("2001:db8:1:2::77")).is_some());
        assert_eq!(table.blocked(ip("2001:db8:1:3::1")), None);
        table.failed(ip("::ffff:198.51.100.1"));
        table.failed(ip("198.51.100.1"));
        assert!(table.blocked(ip("198.51.100.1")).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_stays_its_size_and_evicts_the_oldest() {
        let table = AuthFailures::new(1, Duration::from_secs(60)).unwrap();
        let first = ip("10.0.0.1");
        table.failed(first);
        tokio::time::advance(Duration::from_millis(1)).await;
        // Far more addresses than ways in any set: each set evicts its oldest.
        for n in 0..(SETS * WAYS * 4) as u32 {
            table.failed(IpAddr::from((0x0b00_0000 + n).to_be_bytes()));
        }
        assert_eq!(table.sets.len(), SETS);
        assert_eq!(table.blocked(first), None, "the oldest was evicted");
        let last = IpAddr::from((0x0b00_0000 + (SETS * WAYS * 4) as u32 - 1).to_be_bytes());
        assert!(table.blocked(last).is_some());
    }

    #[test]
    fn a_zero_limit_is_off() {
        assert!(AuthFailures::new(0, Duration::from_secs(60)).is_none());
    }
}
