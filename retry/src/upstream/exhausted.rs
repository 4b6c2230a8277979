//! Operations whose retries the gateway already spent, so that a client's retry of the same
//! operation gets one attempt rather than a new round (docs/retries.md: exactly one retry layer).
//!
//! Without it, a client that retries 3 times against an always-503 upstream, through a
//! gateway that retries 3 times, sends it (1 + 3) × (1 + 3) = 16 attempts. With it, the
//! gateway's first round is 4 attempts and each client retry within the window is one:
//! 1 + 3 + 3 = 7.
//!
//! An operation is named by a 64-bit fingerprint: the caller and the Idempotency-Key when
//! the request has one, else the caller, method, target and body. It is remembered for
//! `window` after the gateway gave up on it, in a fixed table of slots indexed by the
//! fingerprint: bounded memory, no lock, no allocation. A slot taken over by another
//! operation forgets the first one (its client retry gets a full round again, as without
//! this table); a torn read of a slot being rewritten can only do the same. Nothing is ever
//! refused because of it: at worst a retry is not retried.
//!
//! When no operation is remembered — every healthy moment — a request costs one atomic
//! load: the fingerprint (which hashes the body) is computed only while the table is live.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use tokio::time::Instant;

/// Slots in the table (a power of two): 16 KiB per upstream.
const SLOTS: usize = 1024;

/// The default window: as long as the retry budget's, and longer than the backoff of common
/// client retry libraries' first retries.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// Recently exhausted operations of one upstream.
#[derive(Debug)]
pub(crate) struct Exhausted {
    window: Duration,
    origin: Instant,
    hasher: std::collections::hash_map::RandomState,
    /// Milliseconds since `origin` until which any slot may be live (0: none ever was).
    live_until: AtomicU64,
    slots: Box<[Slot]>,
}

#[derive(Debug, Default)]
struct Slot {
    fingerprint: AtomicU64,
    until: AtomicU64,
}

// === impl Exhausted ===

impl Exhausted {
    /// A table remembering operations for `window` (zero: never).
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            origin: Instant::now(),
            hasher: std::collections::hash_map::RandomState::new(),
            live_until: AtomicU64::new(0),
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }

    /// Whether anything may be remembered at `now`: when not, no fingerprint is needed.
    pub(crate) fn is_live(&self, now: Instant) -> bool {
        self.live_until.load(Ordering::Relaxed) > self.millis(now)
    }

    /// The fingerprint of an operation; `None` when it cannot be named (a body too large to
    /// keep, without an Idempotency-Key).
    pub(crate) fn fingerprint(
        &self,
        caller: u64,
        parts: &Parts,
        key: Option<&[u8]>,
        body: Option<&Bytes>,
    ) -> Option<u64> {
        let mut h = self.hasher.build_hasher();
        caller.hash(&mut h);
        match (key, body) {
            (Some(key), _) => key.hash(&mut h),
            (None, Some(body)) => {
                parts.method.as_str().hash(&mut h);
                parts.uri.path().hash(&mut h);
                parts.uri.query().hash(&mut h);
                body.hash(&mut h);
            }
            (None, None) => return None,
        }
        Some(h.finish())
    }

    /// Remembers that the gateway gave up on `fingerprint` at `now`.
    pub(crate) fn remember(&self, fingerprint: u64, now: Instant) {
        if self.window.is_zero() {
            return;
        }
        let until = self.millis(now + self.window).max(1);
        let slot = &self.slots[self.index(fingerprint)];
        slot.until.store(0, Ordering::Relaxed);
        slot.fingerprint.store(fingerprint, Ordering::Relaxed);
        slot.until.store(until, Ordering::Relaxed);
        self.live_until.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether the gateway gave up on `fingerprint` within the window before `now`.
    pub(crate) fn contains(&self, fingerprint: u64, now: Instant) -> bool {
        let slot = &self.slots[self.index(fingerprint)];
        slot.fingerprint.load(Ordering::Relaxed) == fingerprint
            && slot.until.load(Ordering::Relaxed) > self.millis(now)
    }

    fn index(&self, fingerprint: u64) -> usize {
        // SLOTS is a power of two; the fingerprint is a keyed hash, so its low bits are
        // uniform and not chosen by the client.
        (fingerprint as usize) & (SLOTS - 1)
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str) -> Parts {
        let (parts, ()) = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts();
        parts
    }

    #[tokio::test(start_paused = true)]
    async fn remembers_for_the_window_only() {
        let table = Exhausted::new(Duration::from_secs(30));
        let now = Instant::now();
        assert!(!table.is_live(now));
        let body = Bytes::from_static(b"{}");
        let fp = table
            .fingerprint(7, &parts("POST", "/pay?x=1"), None, Some(&body))
            .unwrap();
        table.remember(fp, now);
        assert!(table.is_live(now) && table.contains(fp, now));
        let later = now + Duration::from_secs(31);
        assert!(!table.contains(fp, later) && !table.is_live(later));
    }

    #[tokio::test(start_paused = true)]
    async fn operations_are_told_apart() {
        let table = Exhausted::new(Duration::from_secs(30));
        let body = Bytes::from_static(b"{}");
        let other = Bytes::from_static(b"{ }");
        let fp = |caller, method, uri, key, body| {
            table.fingerprint(caller, &parts(method, uri), key, body)
        };
        let base = fp(1, "POST", "/pay", None, Some(&body));
        assert_ne!(base, fp(2, "POST", "/pay", None, Some(&body)), "caller");
        assert_ne!(base, fp(1, "PUT", "/pay", None, Some(&body)), "method");
        assert_ne!(base, fp(1, "POST", "/pay?a", None, Some(&body)), "query");
        assert_ne!(base, fp(1, "POST", "/pay", None, Some(&other)), "body");
        // The same key names the same operation whatever else the retry changed.
        assert_eq!(
            fp(1, "POST", "/pay", Some(b"k1"), Some(&body)),
            fp(1, "POST", "/pay", Some(b"k1"), Some(&other))
        );
        assert_eq!(fp(1, "POST", "/pay", None, None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_window_remembers_nothing() {
        let table = Exhausted::new(Duration::ZERO);
        table.remember(42, Instant::now());
        assert!(!table.is_live(Instant::now()) && !table.contains(42, Instant::now()));
    }
}
