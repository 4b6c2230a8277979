//! `server.send_timeout` per HTTP/2 stream.
//!
//! A client can keep one stream's flow-control window closed while its connection stays
//! busy and healthy (pings, other streams, the socket drained): the connection watchdog
//! (`watched`) never sees a blocked write, and hyper has no per-stream send timeout, so the
//! stream, its in-flight slots and its upstream connection would stay pinned until the
//! client leaves. nginx bounds this with `send_timeout` per stream; so does this module.
//!
//! hyper runs each stream as a task through the HTTP/2 builder's executor. [`StreamExecutor`]
//! spawns every such task inside a [`Deadline`], which shares a [`StreamClock`] with the
//! stream's response body ([`SendWait`], found through a task-local while the task is
//! polled). hyper pulls a body frame only once the stream has room for it; so "a frame was
//! handed over and the body has not been asked for the next one" while the task waits means
//! the response is waiting on the client's window. When that lasts `send_timeout`, the
//! task is dropped: h2 resets the stream (RST_STREAM CANCEL) and drops what it buffered for
//! it, and the response body, its permits and its upstream connection go with it.
//!
//! Cost: one task-local set per poll of a stream's task, one atomic store per body frame
//! and per body poll; the clock is read only when a stream waits with a frame handed over.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::plumbing::held::Held;

tokio::task_local! {
    /// The clock of the HTTP/2 stream whose task is being polled.
    static STREAM: Arc<StreamClock>;
}

/// What a stream's body tells its [`Deadline`]: how many frames it has handed over, and
/// whether the last one is still waiting for the body to be asked again. One word: the
/// frame count shifted left once, the low bit set while waiting.
#[derive(Debug, Default)]
pub(crate) struct StreamClock(AtomicU64);

// === impl StreamClock ===

impl StreamClock {
    /// A frame was handed to hyper: waiting until the body is polled again.
    fn handed_over(&self) {
        let n = self.0.load(Ordering::Relaxed);
        self.0.store(((n >> 1) + 1) << 1 | 1, Ordering::Relaxed);
    }

    /// The body is asked for its next frame: hyper had room for the last one.
    fn asked(&self) {
        let n = self.0.load(Ordering::Relaxed);
        if n & 1 == 1 {
            self.0.store(n & !1, Ordering::Relaxed);
        }
    }

    /// The frame now waiting, if one is.
    fn waiting(&self) -> Option<u64> {
        let n = self.0.load(Ordering::Relaxed);
        (n & 1 == 1).then_some(n >> 1)
    }
}

/// Held by an HTTP/2 response body: reports its frames to the stream's clock.
#[derive(Debug)]
pub(crate) struct SendWait(Arc<StreamClock>);

impl SendWait {
    /// The clock of the stream being polled now (`None` outside a [`StreamExecutor`] task).
    pub(crate) fn current() -> Option<Self> {
        STREAM.try_with(|clock| Self(clock.clone())).ok()
    }
}

impl Held for SendWait {
    fn polled(&mut self) {
        self.0.asked();
    }

    fn sent(&mut self, _len: usize) {
        self.0.handed_over();
    }
}

/// The HTTP/2 builder's executor: every stream's task runs under a [`Deadline`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamExecutor {
    pub(crate) send_timeout: Duration,
    pub(crate) listener: &'static str,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, task: F) {
        tokio::spawn(Deadline {
            task,
            clock: Arc::default(),
            timer: None,
            armed_for: 0,
            send_timeout: self.send_timeout,
            listener: self.listener,
        });
    }
}

pin_project_lite::pin_project! {
    /// A stream's task, dropped once its response has waited `send_timeout` on the client.
    pub(crate) struct Deadline<F> {
        #[pin]
        task: F,
        clock: Arc<StreamClock>,
        // Boxed and made only for a stream that waits: most never do.
        timer: Option<Pin<Box<Sleep>>>,
        // The frame the timer is armed for.
        armed_for: u64,
        send_timeout: Duration,
        listener: &'static str,
    }
}

impl<F: Future<Output = ()>> Future for Deadline<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let clock = this.clock.clone();
        if STREAM.sync_scope(clock, || this.task.poll(cx)).is_ready() {
            return Poll::Ready(());
        }
        let Some(frame) = this.clock.waiting() else {
            return Poll::Pending;
        };
        // The wait is timed from the first poll that finds this frame waiting.
        let timer = match this.timer {
            Some(timer) if *this.armed_for == frame => timer,
            Some(timer) => {
                timer.as_mut().reset(Instant::now() + *this.send_timeout);
                *this.armed_for = frame;
                timer
            }
            None => {
                *this.armed_for = frame;
                let deadline = Instant::now() + *this.send_timeout;
                this.timer
                    .insert(Box::pin(tokio::time::sleep_until(deadline)))
            }
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        // Dropping the task resets the stream (see the module docs).
        tracing::debug!(
            listener = *this.listener,
            "HTTP/2 stream reset: the client took none of its response for send_timeout"
        );
        metrics::counter!("http2_streams_reset_total", "listener" => *this.listener, "reason" => "send_timeout")
            .increment(1);
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_tells_frames_apart_and_sees_the_next_ask() {
        let clock = StreamClock::default();
        assert_eq!(clock.waiting(), None);
        clock.handed_over();
        assert_eq!(clock.waiting(), Some(1));
        clock.asked();
        assert_eq!(clock.waiting(), None);
        clock.asked();
        clock.handed_over();
        assert_eq!(clock.waiting(), Some(2), "another frame, another wait");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_whose_frame_is_never_taken_is_dropped_at_the_timeout() {
        let executor = StreamExecutor {
            send_timeout: Duration::from_secs(5),
            listener: "test",
        };
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        // A task that hands a frame over, then waits forever (its window never opens).
        hyper::rt::Executor::execute(&executor, async move {
            let _dropped = dropped_tx;
            let mut wait = SendWait::current().expect("inside a stream task");
            wait.polled();
            wait.sent(10);
            std::future::pending::<()>().await;
        });
        let started = Instant::now();
        let _ = dropped_rx.await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_keeps_taking_frames_or_waits_on_its_upstream_is_left_alone() {
        let executor = StreamExecutor {
            send_timeout: Duration::from_secs(5),
            listener: "test",
        };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<bool>();
        hyper::rt::Executor::execute(&executor, async move {
            let mut wait = SendWait::current().expect("inside a stream task");
            for _ in 0..4 {
                // Asked for a frame, handed it over, and asked again 3 s later.
                wait.polled();
                wait.sent(10);
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            // Asked and the upstream is slow: not the client's doing.
            wait.polled();
            tokio::time::sleep(Duration::from_secs(60)).await;
            let _ = done_tx.send(true);
        });
        assert!(done_rx.await.unwrap_or(false), "the stream ran to its end");
    }
}
