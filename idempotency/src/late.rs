//! A keyed request whose upstream attempt timed out, finished in the background.
//!
//! The layer below (the retry layer) stops waiting for an attempt at its timeout and the
//! client gets its 504 at once. Storing that 504 as the key's outcome would replay "timed
//! out" for the record's whole retention although the upstream may complete the request a
//! moment later, so the client never learns what happened. Instead the layer offers a
//! [`LateAnswer`] in the request: the layer below takes its delivery end and, when the
//! timeout ends the request, keeps the exchange running until the record's lease ends and
//! delivers the response head. Meanwhile the record stays in flight (duplicates get 409 with
//! `Retry-After`, never a second execution); once the answer lands it is settled like any
//! other (stored and replayed, or released per the outcome table). If no answer comes by the
//! end of the lease, the 504 is stored, as it would have been at once.

use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use http::Response;
use tokio::sync::oneshot::{self, error::TryRecvError};
use tokio::time::Instant;

/// Request extension: where the layer below delivers the response to an attempt it stopped
/// waiting for but left running. Inserted only for keyed requests whose key the layer holds
/// and whose upstream does not dedupe on keys.
#[derive(Debug, Clone)]
pub struct LateAnswer {
    shared: Arc<Shared>,
}

/// The delivery end of a [`LateAnswer`], taken once by the layer below.
#[derive(Debug)]
pub struct LateSender(oneshot::Sender<Response<Body>>);

#[derive(Debug)]
struct Shared {
    until: Instant,
    sender: Mutex<Option<oneshot::Sender<Response<Body>>>>,
}

/// The layer's end of a [`LateAnswer`].
pub(crate) struct Pending {
    answer: LateAnswer,
    receiver: oneshot::Receiver<Response<Body>>,
}

/// An answer still to come after the request returned (or one that just came).
pub(crate) struct Late {
    until: Instant,
    state: State,
}

enum State {
    /// The exchange is running in the background.
    Running(oneshot::Receiver<Response<Body>>),
    /// It landed already.
    Arrived(Response<Body>),
}

// === impl LateAnswer ===

impl LateAnswer {
    /// An offer valid until `until` (the end of the record's lease).
    pub(crate) fn new(until: Instant) -> (Self, Pending) {
        let (sender, receiver) = oneshot::channel();
        let answer = Self {
            shared: Arc::new(Shared {
                until,
                sender: Mutex::new(Some(sender)),
            }),
        };
        let pending = Pending {
            answer: answer.clone(),
            receiver,
        };
        (answer, pending)
    }

    /// How long a background exchange may run: the end of the record's lease.
    pub fn until(&self) -> Instant {
        self.shared.until
    }

    /// Takes the delivery end (once; `None` after). Whoever holds it until the request
    /// returns tells the layer an answer may still come; dropping it says none will.
    pub fn take(&self) -> Option<LateSender> {
        self.shared
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .map(LateSender)
    }
}

// === impl LateSender ===

impl LateSender {
    /// Delivers the late response head; its body is read by the layer.
    pub fn deliver(self, response: Response<Body>) {
        // The layer gave up waiting (its bound passed): nothing to record.
        let _ = self.0.send(response);
    }
}

// === impl Pending ===

impl Pending {
    /// After the request returned: `None` if no answer can come (the offer was never
    /// taken, or its taker dropped it), else the answer or the wait for it.
    pub(crate) fn after_return(mut self) -> Option<Late> {
        let untaken = self
            .answer
            .shared
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        if untaken {
            return None;
        }
        let state = match self.receiver.try_recv() {
            Ok(response) => State::Arrived(response),
            Err(TryRecvError::Empty) => State::Running(self.receiver),
            Err(TryRecvError::Closed) => return None,
        };
        let until = self.answer.until();
        Some(Late { until, state })
    }
}

// === impl Late ===

impl Late {
    /// When the wait (and reading the answer's body) ends at the latest.
    pub(crate) fn until(&self) -> Instant {
        self.until
    }

    /// The late response, or `None` if the exchange failed or outlived the bound.
    pub(crate) async fn answer(self) -> Option<Response<Body>> {
        match self.state {
            State::Arrived(response) => Some(response),
            State::Running(receiver) => tokio::time::timeout_at(self.until, receiver)
                .await
                .ok()
                .and_then(Result::ok),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn an_offer_nobody_took_means_no_answer() {
        let (_answer, pending) = LateAnswer::new(Instant::now() + Duration::from_secs(5));
        assert!(pending.after_return().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_sender_means_no_answer() {
        let (answer, pending) = LateAnswer::new(Instant::now() + Duration::from_secs(5));
        drop(answer.take());
        assert!(pending.after_return().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_sender_delivers_later() {
        let (answer, pending) = LateAnswer::new(Instant::now() + Duration::from_secs(5));
        let sender = answer.take().unwrap();
        assert!(answer.take().is_none(), "taken once");
        let Some(late) = pending.after_return() else {
            panic!("not running");
        };
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            sender.deliver(Response::new(Body::from("late")));
        });
        assert!(late.answer().await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_at_the_bound() {
        let (answer, pending) = LateAnswer::new(Instant::now() + Duration::from_secs(5));
        let sender = answer.take().unwrap();
        let Some(late) = pending.after_return() else {
            panic!("not running");
        };
        assert!(late.answer().await.is_none());
        drop(sender);
    }
}
