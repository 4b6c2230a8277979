//! What one client connection is doing, and when it has waited too long.
//!
//! Three parties share a connection's [`Activity`]:
//!
//! - the hyper service adapter counts requests in flight: a [`Busy`] token is taken
//!   when a request starts and dropped when its response body has been sent (or abandoned);
//! - the framing guard (HTTP/1 only) reports a request head that arrived in part and is
//!   still incomplete;
//! - the connection's [`watchdog`](Activity::deadline) reads both and decides when the
//!   connection has been silent too long.
//!
//! The timeouts, as nginx applies them (`client_header_timeout`, `keepalive_timeout`):
//!
//! | phase | bound | on expiry |
//! |---|---|---|
//! | fresh connection, no request yet (h1, h2 with or without its preface, after TLS) | `header_read_timeout` | closed at once |
//! | a request head arrived in part | `header_read_timeout`, from its first byte or from the end of the response before it, whichever is later | closed |
//! | between requests (keep-alive), nothing in flight | `keep_alive_timeout` | closed gracefully (HTTP/2: GOAWAY), within 1 s |
//! | the client does not take what the gateway writes (socket buffers full) | `send_timeout`, between two writes that make progress | closed |
//! | an HTTP/2 stream's response waits on the client's flow-control window | `send_timeout` (`stream`) | the stream reset |
//! | a request in flight or its response streaming | none otherwise (attempt and body timeouts apply) | — |
//!
//! A head that arrives in one read never registers as "in part", so the common path costs
//! two atomic operations per request and no timer reset.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The bounds a connection's watchdog applies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// A request head (or the first request of a connection) must arrive within this.
    pub(crate) header_read: Duration,
    /// An idle connection between requests is closed after this.
    pub(crate) keep_alive: Duration,
    /// A write the client does not take for this long closes the connection.
    pub(crate) send: Duration,
}

/// Why a connection's wait ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// A request head did not arrive in time: close at once.
    Head,
    /// Nothing happened for the idle bound: close gracefully.
    Idle,
    /// The client stopped reading what the gateway sends: close at once.
    Send,
}

/// Shared state of one connection: requests in flight, a request head arriving in part,
/// and since when the connection has been idle. Times are milliseconds since it started.
#[derive(Debug)]
pub struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    /// A request has been received on this connection.
    served: AtomicBool,
    /// The listener is shutting down: HTTP/1 responses say `Connection: close`.
    draining: AtomicBool,
    /// When the connection last became idle (no request in flight).
    idle_since_ms: AtomicU64,
    /// 1 + when the head now arriving in part started; 0 when none is.
    head_since_ms: AtomicU64,
    /// 1 + since when a write has been waiting for the client to make room; 0 when none is.
    write_blocked_since_ms: AtomicU64,
    /// Wakes the watchdog when its deadline may have moved earlier.
    changed: Notify,
    /// The answer to a request that asked to switch protocols, for the framing guard
    /// (see [`Upgrade`]).
    upgrade: Mutex<Upgrade>,
}

/// Where a request that asked to switch protocols (`Upgrade`, CONNECT) stands. The framing
/// guard reads nothing after such a request until its answer is known: a 101 hands the
/// connection over untouched, anything else resumes HTTP/1 inspection, so the bytes that
/// follow are never read in the wrong mode.
#[derive(Debug, Default)]
pub(crate) enum Upgrade {
    /// No answer yet (or no such request).
    #[default]
    Pending,
    /// Waiting for the answer; the guard's read task.
    Waiting(Waker),
    /// Answered `101 Switching Protocols`: the connection is no longer HTTP.
    Switched,
    /// Answered otherwise: the connection stays HTTP/1.
    Stayed,
}

/// A request in flight on a connection; dropping it ends the request.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Activity>);

// === impl Activity ===

impl Activity {
    /// A connection starting now (the framing guard of a fresh connection takes one).
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(0),
            write_blocked_since_ms: AtomicU64::new(0),
            changed: Notify::new(),
            upgrade: Mutex::new(Upgrade::Pending),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, ms: u64) -> Instant {
        self.started + Duration::from_millis(ms)
    }

    /// A request starts; the token ends it when dropped.
    pub(crate) fn request(self: &Arc<Self>) -> Busy {
        if !self.served.load(Ordering::Relaxed) {
            self.served.store(true, Ordering::Relaxed);
            // The watchdog's timer may be at the first-request bound, later than the
            // keep-alive deadline this request will end with: it must re-arm.
            self.changed.notify_one();
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// The listener drains: responses from now on close the connection (HTTP/1).
    pub(crate) fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The framing guard holds the start of a head that is not complete yet.
    pub(crate) fn head_started(&self) {
        if self.head_since_ms.load(Ordering::Relaxed) == 0 {
            self.head_since_ms
                .store(self.now_ms().saturating_add(1), Ordering::Relaxed);
            // The head deadline may fall before the idle deadline the watchdog sleeps on.
            self.changed.notify_one();
        }
    }

    /// The head the guard was holding is complete (or handed over unparsed).
    pub(crate) fn head_done(&self) {
        self.head_since_ms.store(0, Ordering::Relaxed);
    }

    /// A write found the client's side full (the client is not reading).
    pub(crate) fn write_blocked(&self) {
        if self.write_blocked_since_ms.load(Ordering::Relaxed) == 0 {
            self.write_blocked_since_ms
                .store(self.now_ms().saturating_add(1), Ordering::Relaxed);
            // The send deadline may fall before anything the watchdog sleeps on.
            self.changed.notify_one();
        }
    }

    /// A write went through.
    pub(crate) fn write_progressed(&self) {
        if self.write_blocked_since_ms.load(Ordering::Relaxed) != 0 {
            self.write_blocked_since_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Is the connection between requests, with nothing arriving and nothing in flight?
    pub(crate) fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since_ms.load(Ordering::Relaxed) == 0
    }

    /// When the connection's current wait runs out, and what that means; `None` while a
    /// request is in flight.
    pub(crate) fn deadline(&self, timeouts: &Timeouts) -> Option<(Instant, Expiry)> {
        match self.write_blocked_since_ms.load(Ordering::Relaxed) {
            0 => {}
            blocked => return Some((self.at(blocked - 1) + timeouts.send, Expiry::Send)),
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle_since = self.idle_since_ms.load(Ordering::Relaxed);
        match self.head_since_ms.load(Ordering::Relaxed) {
            // No first request in time: closed at once, like a head that never arrived
            // (an HTTP/2 client that never sent its preface would not answer a GOAWAY).
            0 if !self.served.load(Ordering::Relaxed) => {
                Some((self.at(idle_since) + timeouts.header_read, Expiry::Head))
            }
            0 => Some((self.at(idle_since) + timeouts.keep_alive, Expiry::Idle)),
            head => {
                // A head that began while a response was still going out is timed from
                // the end of that response.
                let from = idle_since.max(head - 1);
                Some((self.at(from) + timeouts.header_read, Expiry::Head))
            }
        }
    }

    /// The service answered the request that asked to switch protocols: `switched` when
    /// with a 101. Wakes the guard waiting on it.
    pub(crate) fn upgrade_answered(&self, switched: bool) {
        let answer = if switched {
            Upgrade::Switched
        } else {
            Upgrade::Stayed
        };
        let previous = std::mem::replace(
            &mut *self.upgrade.lock().unwrap_or_else(PoisonError::into_inner),
            answer,
        );
        if let Upgrade::Waiting(waker) = previous {
            waker.wake();
        }
    }

    /// The guard: the answer to the request it holds back after, once known (and the state
    /// reset for the next such request); pending until then.
    pub(crate) fn poll_upgrade_answer(&self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut upgrade = self.upgrade.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::take(&mut *upgrade) {
            Upgrade::Switched => Poll::Ready(true),
            Upgrade::Stayed => Poll::Ready(false),
            Upgrade::Pending | Upgrade::Waiting(_) => {
                *upgrade = Upgrade::Waiting(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// Resolves when the deadline may have moved earlier: the first request started (its
    /// end is bounded by `keep_alive`, not `header_read`), a head started arriving in part,
    /// or a write found the client's side full. (Moving later wakes nobody.)
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }
}

// === impl Busy ===

impl Busy {
    /// Is the request's connection draining (its response should close it)?
    pub(crate) fn draining(&self) -> bool {
        self.0.draining.load(Ordering::Relaxed)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        // Stored first: a watchdog that sees the count reach 0 must see when it did (the
        // value is not read while requests are in flight).
        activity
            .idle_since_ms
            .store(activity.now_ms(), Ordering::Relaxed);
        // No wake-up: the idle deadline that begins now is later than the watchdog's timer
        // (see `watchdog`), which reads it when it fires.
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        header_read: Duration::from_secs(10),
        keep_alive: Duration::from_secs(75),
        send: Duration::from_secs(60),
    };

    #[tokio::test(start_paused = true)]
    async fn a_fresh_connection_gets_the_header_bound() {
        let activity = Activity::new();
        let start = Instant::now();
        assert_eq!(
            activity.deadline(&TIMEOUTS),
            Some((start + TIMEOUTS.header_read, Expiry::Head)),
            "closed at once, not gracefully"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alive_runs_from_the_end_of_the_last_response() {
        let activity = Activity::new();
        let token = activity.request();
        assert_eq!(activity.deadline(&TIMEOUTS), None, "busy: no deadline");
        assert!(!activity.is_idle());
        tokio::time::advance(Duration::from_secs(40)).await;
        drop(token);
        assert!(activity.is_idle());
        let (at, why) = activity.deadline(&TIMEOUTS).unwrap();
        assert_eq!(why, Expiry::Idle);
        assert_eq!(at, Instant::now() + TIMEOUTS.keep_alive);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_head_is_timed_from_its_first_byte() {
        let activity = Activity::new();
        drop(activity.request());
        tokio::time::advance(Duration::from_secs(30)).await;
        activity.head_started();
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(3)).await;
        activity.head_started(); // later reads of the same head do not move it
        assert_eq!(
            activity.deadline(&TIMEOUTS),
            Some((started + TIMEOUTS.header_read, Expiry::Head))
        );
        activity.head_done();
        assert_eq!(activity.deadline(&TIMEOUTS).unwrap().1, Expiry::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_pipelined_behind_a_slow_response_is_timed_from_its_end() {
        let activity = Activity::new();
        let token = activity.request();
        activity.head_started();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(activity.deadline(&TIMEOUTS), None);
        drop(token);
        assert_eq!(
            activity.deadline(&TIMEOUTS),
            Some((Instant::now() + TIMEOUTS.header_read, Expiry::Head))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_timed_even_mid_request() {
        let activity = Activity::new();
        let _token = activity.request();
        tokio::time::advance(Duration::from_secs(5)).await;
        activity.write_blocked();
        let blocked = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        activity.write_blocked(); // still the same stall
        assert_eq!(
            activity.deadline(&TIMEOUTS),
            Some((blocked + TIMEOUTS.send, Expiry::Send))
        );
        activity.write_progressed();
        assert_eq!(
            activity.deadline(&TIMEOUTS),
            None,
            "in flight and writing: no bound"
        );
    }
}
