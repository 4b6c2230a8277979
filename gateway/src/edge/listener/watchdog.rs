//! The connection watchdog: drives a connection and closes it when its wait runs out (see
//! [`Activity`] for the bounds), when it is idle and reclaimed at the connection cap, or on
//! shutdown.
//!
//! Its timer is lazy, as nginx's timers are: one `Sleep` for the connection's life, re-armed
//! only when it fires. A deadline that moves later (a request ends, a write makes progress)
//! costs nothing: the timer fires early, the watchdog reads the real deadline and sleeps
//! again. Only a deadline that may move earlier (the connection's first request, a head
//! arriving in part, a blocked write) wakes it at once ([`Activity::changed`]). While a request is in flight there is no
//! deadline; the timer is then armed one keep-alive bound ahead, which is never later than
//! the idle deadline that follows the request. So the common request costs the watchdog
//! nothing but the polls of its pending branches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use hyper::body::Body;
use hyper::rt::{Read, Write};
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use tokio::time::Instant;

use super::activity::{Activity, Expiry, Timeouts};
use super::{closed, Listener};

/// How long a connection closed for idleness may take to say goodbye: enough for hyper to
/// write the GOAWAY of an idle HTTP/2 connection, whose graceful close would otherwise wait
/// for the client to acknowledge a PING that a silent client never sends.
const IDLE_CLOSE_BOUND: Duration = Duration::from_secs(1);

/// How long an HTTP/1 connection may stay open once the listener drains, for the client to
/// receive a `Connection: close` response instead of a close while it may be sending (as
/// Envoy's drain period does; nginx closes idle connections at once).
const DRAIN_LINGER: Duration = Duration::from_secs(1);

/// What the watchdog does after reading the connection's deadline.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    /// Nothing is due: sleep until then.
    SleepUntil(Instant),
    /// The wait ran out.
    Expired(Expiry),
}

/// Reads `activity`'s deadline at `now`.
fn check(activity: &Activity, timeouts: &Timeouts, now: Instant) -> Check {
    match activity.deadline(timeouts) {
        Some((at, expiry)) if at <= now => Check::Expired(expiry),
        Some((at, _)) => Check::SleepUntil(at),
        // In flight: no deadline. The idle deadline that follows the request is at least
        // one keep-alive bound from now, so waking then is never late.
        None => Check::SleepUntil(now + timeouts.keep_alive),
    }
}

impl Listener {
    /// Drives `connection` under the watchdog: closes it when a head is overdue or the
    /// client stops reading, closes it gracefully when idle too long, when reclaimed at
    /// the cap, or on shutdown.
    pub(super) async fn watch<C>(&self, connection: C, activity: Arc<Activity>, peer: SocketAddr)
    where
        C: Graceful,
    {
        let timeouts = self.timeouts();
        let mut stop = self.stop.clone();
        tokio::pin!(connection);
        let first = match check(&activity, &timeouts, Instant::now()) {
            Check::SleepUntil(at) => at,
            Check::Expired(_) => Instant::now(), // zero bounds: the first check closes it
        };
        let timer = tokio::time::sleep_until(first);
        tokio::pin!(timer);
        let why = loop {
            tokio::select! {
                // The connection first: it is what wakes this task on almost every poll.
                biased;
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(%err, %peer, "connection ended with an error");
                    }
                    return;
                }
                () = &mut timer => {}
                () = activity.changed() => {}
                () = self.reclaim.notified() => {
                    if activity.is_idle() && self.take_reclaim() {
                        break "reclaimed";
                    }
                    continue;
                }
                _ = stop.wait_for(|stop| *stop) => break "shutdown",
            }
            match check(&activity, &timeouts, Instant::now()) {
                Check::SleepUntil(at) => timer.as_mut().reset(at),
                // Like nginx's client_header_timeout and send_timeout: no answer, just close.
                Check::Expired(Expiry::Head) => {
                    return closed("header_timeout", self.options.name, peer)
                }
                Check::Expired(Expiry::Send) => {
                    return closed("send_timeout", self.options.name, peer)
                }
                Check::Expired(Expiry::Idle) => break "idle",
            }
        };
        if why == "shutdown" {
            activity.drain();
            if C::LINGERS {
                // HTTP/1: responses now say `Connection: close`; a connection that has not
                // closed itself by the end of the linger is closed (gracefully, after the
                // response in flight if there is one).
                tokio::select! {
                    biased;
                    result = connection.as_mut() => {
                        if let Err(err) = result {
                            tracing::debug!(%err, %peer, "connection ended with an error");
                        }
                        return;
                    }
                    () = tokio::time::sleep(DRAIN_LINGER.min(self.options.shutdown_grace / 2)) => {}
                }
            }
        }
        connection.as_mut().graceful_shutdown();
        if why == "shutdown" {
            // The listener's grace period bounds this.
            if let Err(err) = connection.await {
                tracing::debug!(%err, %peer, "connection ended with an error");
            }
            return;
        }
        closed(why, self.options.name, peer);
        let _ = tokio::time::timeout(IDLE_CLOSE_BOUND, connection).await;
    }
}

/// A hyper connection the watchdog drives: a future that can be asked to finish
/// gracefully. (hyper-util's `GracefulConnection` does not cover HTTP/1 connections that
/// allow upgrades, which the HTTP/1 listener serves.)
pub(super) trait Graceful: Future<Output = Result<(), hyper::Error>> {
    /// Drains by lingering with `Connection: close` responses (HTTP/1) rather than at once.
    const LINGERS: bool = false;

    /// Finish the request in flight (HTTP/1) or send GOAWAY (HTTP/2), then close.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Graceful for http1::UpgradeableConnection<I, S>
where
    S: HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: Read + Write + Unpin + Send + 'static,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    const LINGERS: bool = true;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<I, S, B, E> Graceful for http2::Connection<I, S, E>
where
    S: HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: Read + Write + Unpin + 'static,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future as _;

    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        header_read: Duration::from_secs(10),
        keep_alive: Duration::from_secs(75),
        send: Duration::from_secs(30),
    };

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_wakes_the_watchdog_no_later_than_its_idle_deadline() {
        let activity = Activity::new();
        let start = Instant::now();
        assert_eq!(
            check(&activity, &TIMEOUTS, start),
            Check::SleepUntil(start + TIMEOUTS.header_read)
        );
        let request = activity.request();
        tokio::time::advance(Duration::from_secs(3)).await;
        let armed = match check(&activity, &TIMEOUTS, Instant::now()) {
            Check::SleepUntil(at) => at,
            other => panic!("{other:?}"),
        };
        tokio::time::advance(Duration::from_secs(20)).await;
        drop(request); // idle from now: the real deadline is now + keep-alive
        let idle_deadline = Instant::now() + TIMEOUTS.keep_alive;
        assert!(armed <= idle_deadline);
        // The early wake-up reads the real deadline and sleeps again, without closing.
        tokio::time::advance(armed - Instant::now()).await;
        assert_eq!(
            check(&activity, &TIMEOUTS, Instant::now()),
            Check::SleepUntil(idle_deadline)
        );
        tokio::time::advance(idle_deadline - Instant::now()).await;
        assert_eq!(
            check(&activity, &TIMEOUTS, Instant::now()),
            Check::Expired(Expiry::Idle)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_request_re_arms_a_first_request_bound_longer_than_keep_alive() {
        let timeouts = Timeouts {
            header_read: Duration::from_secs(300),
            keep_alive: Duration::from_secs(1),
            ..TIMEOUTS
        };
        let activity = Activity::new();
        let changed = activity.changed();
        tokio::pin!(changed);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(changed.as_mut().poll(&mut cx).is_pending());
        let first = activity.request();
        assert!(
            changed.as_mut().poll(&mut cx).is_ready(),
            "first request: re-arm"
        );
        let now = Instant::now();
        assert_eq!(
            check(&activity, &timeouts, now),
            Check::SleepUntil(now + timeouts.keep_alive)
        );
        drop(first);
        let changed = activity.changed();
        tokio::pin!(changed);
        let second = activity.request();
        assert!(
            changed.as_mut().poll(&mut cx).is_pending(),
            "later requests: no wake-up"
        );
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_arriving_in_part_moves_the_deadline_earlier_and_says_so() {
        let activity = Activity::new();
        drop(activity.request());
        activity.changed().await; // the first request's wake-up
        let changed = activity.changed();
        tokio::pin!(changed);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Ending a request moves the deadline later: no wake-up for that.
        assert!(changed.as_mut().poll(&mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(1)).await;
        activity.head_started();
        assert!(changed.as_mut().poll(&mut cx).is_ready());
        let now = Instant::now();
        assert_eq!(
            check(&activity, &TIMEOUTS, now),
            Check::SleepUntil(now + TIMEOUTS.header_read)
        );
    }
}
