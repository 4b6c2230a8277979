//! [`Detached`]: a future that runs in the caller's task while the caller waits for it, and
//! moves to a task of its own if the caller stops waiting.
//!
//! A locked request must run to its outcome — upstream answer, record settled — even when
//! the client hangs up and hyper drops the response future. Spawning every locked request
//! guarantees that but costs each one a task and two wake-ups across tasks; almost no client
//! hangs up. So the request runs inline, and only a drop before completion hands the
//! unfinished future to the runtime, where it completes unobserved.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::{BoxFuture, CatchUnwind, FutureExt};

/// A panic below the future, caught: the outcome is unknown.
#[derive(Debug)]
pub(crate) struct Panicked;

/// See the module docs. Output: the future's, or [`Panicked`] if it panicked.
pub(crate) struct Detached<T: Send + 'static> {
    future: Option<CatchUnwind<AssertUnwindSafe<BoxFuture<'static, T>>>>,
}

impl<T: Send + 'static> Detached<T> {
    /// Starts nothing: `future` runs when this is polled, or once dropped unfinished.
    pub(crate) fn new(future: impl Future<Output = T> + Send + 'static) -> Self {
        let boxed: BoxFuture<'static, T> = Box::pin(future);
        Self {
            future: Some(AssertUnwindSafe(boxed).catch_unwind()),
        }
    }
}

impl<T: Send + 'static> Future for Detached<T> {
    type Output = Result<T, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `Detached` is `Unpin`: the inner future is boxed.
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(Err(Panicked));
        };
        let output = std::task::ready!(future.poll_unpin(cx));
        self.future = None;
        Poll::Ready(output.map_err(|_| Panicked))
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        // Outside a runtime (it is shutting down) nothing can run it any more: the lease then
        // expires, as after a crash.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(future);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn runs_inline_when_awaited() {
        let output = Detached::new(async { 7 }).await;
        assert_eq!(output.ok(), Some(7));
    }

    #[tokio::test]
    async fn a_panic_is_an_error_not_an_unwind() {
        let output = Detached::new(async {
            if true {
                panic!("below us");
            }
            1
        })
        .await;
        assert!(output.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn finishes_in_its_own_task_once_dropped() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let detached = Detached::new(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            flag.store(true, Ordering::SeqCst);
        });
        // The caller gives up after the future started and before it finished.
        let gave_up = tokio::time::timeout(Duration::from_millis(10), detached).await;
        assert!(gave_up.is_err());
        assert!(!done.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(done.load(Ordering::SeqCst), "completed after the drop");
    }
}
