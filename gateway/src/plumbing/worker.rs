//! Which worker thread a request runs on (see `edge::listener::accept`), so that per-worker
//! state (the upstream connection pools) stays on the thread whose runtime drives it.
//! Worker 0 is the main runtime; threads the gateway did not start count as 0 too.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// How many workers serve the proxy listener; set once at start-up, before the upstreams
/// are built.
static COUNT: AtomicUsize = AtomicUsize::new(1);

/// This thread is worker `index`.
pub(crate) fn set_index(index: usize) {
    INDEX.with(|cell| cell.set(index));
}

/// The worker this thread is.
pub(crate) fn index() -> usize {
    INDEX.with(Cell::get)
}

/// The proxy listener will have `count` workers.
pub(crate) fn set_count(count: usize) {
    COUNT.store(count.max(1), Ordering::Relaxed);
}

/// How many workers there are (at least 1).
pub(crate) fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}
