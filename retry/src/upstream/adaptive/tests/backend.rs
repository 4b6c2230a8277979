//! A synthetic backend that accepts a fixed rate, and the two ways of driving the controller
//! against it: an open loop at a steady offered rate, and clients that honour `Retry-After`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use tokio::time::Instant;

use super::super::controller::Cause;
use super::super::*;
use super::{ANY, MS};

/// A backend that accepts `capacity` req/s (a token bucket `burst` deep) and answers 429
/// above it, after 2 ms; optionally on a loaded machine that stalls it now and then.
pub(super) struct Backend {
    capacity: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
    /// Stalls: (the first one's start, every, lasting). A request that comes during one is
    /// seen (counted in the bucket) and answered when it ends, with all the others that
    /// came meanwhile: the Python upstream of `bench/adaptive.sh` on a loaded machine.
    stalls: Option<(Instant, Duration, Duration)>,
}

impl Backend {
    pub(super) fn new(capacity: f64, burst: f64, now: Instant) -> Self {
        Self {
            capacity,
            burst,
            tokens: burst,
            at: now,
            stalls: None,
        }
    }

    /// Stalls for `lasting` every `every`, the first one after `every`.
    pub(super) fn stalling(mut self, every: Duration, lasting: Duration) -> Self {
        self.stalls = Some((self.at + every, every, lasting));
        self
    }

    /// When a request sent at `t` is seen: at once, or at the end of the stall it came in.
    fn seen(&self, t: Instant) -> Instant {
        let Some((first, every, lasting)) = self.stalls else {
            return t;
        };
        let Some(since) = t.checked_duration_since(first) else {
            return t;
        };
        let into = Duration::from_nanos((since.as_nanos() % every.as_nanos()) as u64);
        if into < lasting {
            t + (lasting - into)
        } else {
            t
        }
    }

    fn accepts(&mut self, now: Instant) -> bool {
        let elapsed = (now - self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.capacity).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Per second of the run: (requests that reached the backend, requests it accepted,
/// requests refused at the edge).
pub(super) type Seconds = Vec<(u32, u32, u32)>;

/// Offers `offered` req/s evenly for `secs` seconds; the backend answers after 2 ms.
/// Admitted requests leave after their wait, re-timed as [`AdaptiveThrottle::wait_turn`]
/// does (by the decreases meanwhile), in time order with the arrivals.
pub(super) fn drive(
    controller: &mut Controller,
    backend: &mut Backend,
    start: Instant,
    offered: u32,
    secs: u32,
) -> Seconds {
    let step = Duration::from_secs(1) / offered;
    let mut out = vec![(0, 0, 0); secs as usize];
    // Admitted, not yet sent: (due, admitted or last re-timed at), earliest first.
    let mut waiting = BinaryHeap::new();
    let mut send = |controller: &mut Controller, out: &mut Seconds, now: Instant| {
        let Some(second) = out.get_mut((now - start).as_secs() as usize) else {
            return;
        };
        second.0 += 1;
        let signal = if backend.accepts(backend.seen(now)) {
            second.1 += 1;
            Signal::Accepted(2 * MS)
        } else {
            Signal::Throttled
        };
        controller.observe(signal, now, now + 2 * MS);
    };
    // Sends every waiter due by `until`, each re-timed when its turn comes.
    let mut leave = |controller: &mut Controller,
                     out: &mut Seconds,
                     waiting: &mut BinaryHeap<Reverse<(Instant, Instant)>>,
                     until: Instant| {
        while let Some(&Reverse((due, checked))) = waiting.peek().filter(|w| w.0 .0 <= until) {
            waiting.pop();
            let later = controller.retime(checked, due);
            if later > due {
                waiting.push(Reverse((later, due)));
            } else {
                send(controller, out, due);
            }
        }
    };
    for i in 0..offered * secs {
        let arrived = start + step * i;
        leave(controller, &mut out, &mut waiting, arrived);
        match controller.admit(arrived, true, ANY) {
            Ok(wait) => waiting.push(Reverse((arrived + wait, arrived))),
            Err(_) => out[(i / offered) as usize].2 += 1,
        }
    }
    let end = start + Duration::from_secs(secs.into());
    leave(
        controller,
        &mut out,
        &mut waiting,
        end + Duration::from_secs(60),
    );
    out
}

/// The scenario (`bench/adaptive.sh`) on the bare controller: `clients` clients
/// each sending every 100 ms while they have work, one request at a time; a request refused
/// at the edge comes back after its `Retry-After` (whole seconds, rounded up), one the
/// backend refused after the backend's `Retry-After: 1`. Per second: (reached the backend,
/// accepted, refused at the edge); and the decreases, by cause.
pub(super) fn drive_clients(
    controller: &mut Controller,
    backend: &mut Backend,
    start: Instant,
    clients: u32,
    secs: u32,
) -> (Seconds, Vec<Cause>) {
    #[derive(Clone, Copy)]
    enum Next {
        Arrive(Instant),
        Send(Instant),
        /// (answered at, sent at, accepted)
        Answer(Instant, Instant, bool),
    }
    let at = |n: Next| match n {
        Next::Arrive(t) | Next::Send(t) | Next::Answer(t, _, _) => t,
    };
    let period = Duration::from_millis(100);
    let end = start + Duration::from_secs(secs.into());
    let mut out = vec![(0, 0, 0); secs as usize];
    let mut causes = Vec::new();
    // Phases spread over the period, as the bench's clients.
    let mut next: Vec<Next> = (0..clients)
        .map(|n| Next::Arrive(start + period * n / clients))
        .collect();
    let mut slot: Vec<Instant> = next.iter().map(|n| at(*n)).collect();
    // Bounded: every step moves one client's next event forward by at least 2 ms.
    for _ in 0..clients * secs * 1000 {
        let Some((i, event)) = next.iter().copied().enumerate().min_by_key(|(_, n)| at(*n)) else {
            break;
        };
        let now = at(event);
        if now >= end {
            break;
        }
        let second = &mut out[(now - start).as_secs() as usize];
        next[i] = match event {
            Next::Arrive(t) => match controller.admit(t, true, ANY) {
                Ok(wait) => Next::Send(t + wait),
                Err(wait) => {
                    second.2 += 1;
                    slot[i] = t + Duration::from_secs(wait.as_secs_f64().ceil() as u64);
                    Next::Arrive(slot[i])
                }
            },
            Next::Send(t) => {
                second.0 += 1;
                let seen = backend.seen(t);
                let accepted = backend.accepts(seen);
                if accepted {
                    second.1 += 1;
                }
                Next::Answer(seen + 2 * MS, t, accepted)
            }
            Next::Answer(answered, sent, accepted) => {
                let signal = if accepted {
                    Signal::Accepted(answered - sent)
                } else {
                    Signal::Throttled
                };
                causes.extend(controller.observe(signal, sent, answered));
                let back_off = if accepted {
                    Duration::ZERO
                } else {
                    Duration::from_secs(1)
                };
                slot[i] = (slot[i] + period).max(answered + back_off);
                Next::Arrive(slot[i])
            }
        };
    }
    (out, causes)
}
