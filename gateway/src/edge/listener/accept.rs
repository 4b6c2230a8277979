//! Accepting connections, on one thread or on several: [`serve`] and [`serve_workers`].
//!
//! With more than one worker the gateway runs as nginx does, one event loop per core rather
//! than one work-stealing runtime: every worker is a thread with a current-thread runtime
//! that accepts on the same listening socket (a duplicate of its descriptor) and serves what
//! it accepted to the end, so a connection, its requests and the upstream connections they
//! open share one thread and never wake another (BENCHMARKS.md, "Multi-core": two one-worker
//! processes served 1.3 × what one two-worker runtime did). The workers share one
//! connection cap, one reclaim of idle connections and one stop signal; worker 0 is the
//! caller's runtime, which also runs the admin listener and the background tasks.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::swap::Current;
use super::{Listener, ServeOptions, Swap, RECLAIM_WAIT};

/// What every worker of one listener shares.
struct Shared {
    listener: Arc<Listener>,
    slots: Arc<Semaphore>,
}

impl Shared {
    /// The listener's name (`proxy`, `admin`), for logs and metric labels.
    fn name(&self) -> &'static str {
        self.listener.options.name
    }
}

/// Serves `service` (the listener's pipeline, which a reload may replace) on `listener` until `shutdown` resolves, then drains within the grace.
pub async fn serve(
    listener: TcpListener,
    service: Arc<Swap>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    serve_workers(listener, service, options, 1, shutdown).await;
}

/// [`serve`] on `workers` threads (see the module docs); `1` serves on the caller's runtime
/// only. A worker thread that cannot start is logged and the others serve.
pub async fn serve_workers(
    listener: TcpListener,
    service: Arc<Swap>,
    options: ServeOptions,
    workers: usize,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (drained_tx, drained_rx) = watch::channel(false);
    let grace = options.shutdown_grace;
    let name = options.name;
    // The drain messages name the listener and its address (`proxy 127.0.0.1:8080`), so an
    // operator can tell the two listeners' shutdowns apart.
    let label = match listener.local_addr() {
        Ok(addr) => format!("{name} {addr}"),
        Err(_) => name.to_owned(),
    };
    let cap = options.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let shared = Arc::new(Shared {
        listener: Arc::new(Listener::new(options, stop_rx.clone())),
        slots: Arc::new(Semaphore::new(cap)),
    });
    let (listener, threads) = spawn_workers(listener, &service, &shared, workers, &drained_rx);
    let Some(listener) = listener else {
        return;
    };
    accept_until(listener, service, shared.clone(), async {
        shutdown.await;
    })
    .await;
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        listener = name,
        "{label} draining connections"
    );
    let _ = stop_tx.send(true);
    // Every connection holds a slot until it ends: all slots back means all drained.
    let all = u32::try_from(cap).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, shared.slots.clone().acquire_many_owned(all))
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "{label}: grace period over; closing remaining connections"
        );
    }
    let _ = drained_tx.send(true);
    // The worker threads are not joined: they stop accepting and serving here, but their
    // runtimes live until the process exits, because a shared client first used from a
    // worker (a store's connection, say) runs its connection task there, and the caller's
    // final steps (leases returned, spans flushed) still need it.
    drop(threads);
}

/// Starts workers 1.. on duplicates of `listener`'s socket; returns the listener for worker 0
/// (`None` if the socket could not be handed back to this runtime) and the threads started.
fn spawn_workers(
    listener: TcpListener,
    service: &Arc<Swap>,
    shared: &Arc<Shared>,
    workers: usize,
    drained: &watch::Receiver<bool>,
) -> (Option<TcpListener>, Vec<std::thread::JoinHandle<()>>) {
    if workers <= 1 {
        return (Some(listener), Vec::new());
    }
    let std_listener = match listener.into_std() {
        Ok(std_listener) => std_listener,
        Err(err) => {
            tracing::error!(%err, listener = shared.name(), "cannot share the listening socket");
            return (None, Vec::new());
        }
    };
    let mut threads = Vec::new();
    for index in 1..workers {
        let started = std_listener.try_clone().and_then(|socket| {
            let (service, shared, drained) = (service.clone(), shared.clone(), drained.clone());
            std::thread::Builder::new()
                .name(format!("portcullis-worker-{index}"))
                .spawn(move || worker(index, socket, service, shared, drained))
        });
        match started {
            Ok(thread) => threads.push(thread),
            Err(err) => tracing::error!(%err, index, "cannot start a worker thread"),
        }
    }
    match TcpListener::from_std(std_listener) {
        Ok(listener) => (Some(listener), threads),
        Err(err) => {
            tracing::error!(%err, listener = shared.name(), "cannot serve the listening socket");
            (None, threads)
        }
    }
}

/// Worker `index`: its own current-thread runtime, accepting until the stop, serving until
/// the drain is over.
fn worker(
    index: usize,
    socket: std::net::TcpListener,
    service: Arc<Swap>,
    shared: Arc<Shared>,
    mut drained: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return tracing::error!(%err, index, "cannot start a worker's runtime"),
    };
    crate::plumbing::worker::set_index(index);
    runtime.block_on(async move {
        let listener = match TcpListener::from_std(socket) {
            Ok(listener) => listener,
            Err(err) => return tracing::error!(%err, index, "worker cannot serve the socket"),
        };
        let mut stop = shared.listener.stop.clone();
        accept_until(listener, service, shared, async move {
            let _ = stop.wait_for(|stop| *stop).await;
        })
        .await;
        // Its connections run on this runtime: keep it until they are drained, and then
        // for the rest of the process (see `serve_workers`).
        let _ = drained.wait_for(|drained| *drained).await;
        std::future::pending::<()>().await;
    });
}

/// Accepts connections and serves each in a task of this runtime until `stop` resolves.
async fn accept_until(
    listener: TcpListener,
    service: Arc<Swap>,
    shared: Arc<Shared>,
    stop: impl Future<Output = ()>,
) {
    let name = shared.name();
    let open = metrics::gauge!("connections_open", "listener" => name);
    let refused = metrics::counter!("connections_refused_total", "listener" => name);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    // Another worker taking the connection first is not an error here:
                    // tokio waits for the next one.
                    Ok(pair) => pair,
                    Err(err) => {
                        // Out of file descriptors and the like: back off briefly instead of spinning.
                        tracing::warn!(%err, listener = name, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (shared, open, pipeline) = (shared.clone(), open.clone(), Current::new(&service));
                let refused = refused.clone();
                // The accept loop never waits: at the cap, the connection's own task waits
                // briefly for a reclaimed slot.
                tokio::spawn(async move {
                    let Some(slot) = take_slot(&shared.slots, &shared.listener).await else {
                        refused.increment(1);
                        tracing::debug!(%peer, listener = name, "connection cap reached; connection closed");
                        return;
                    };
                    open.increment(1.0);
                    shared.listener.clone().connection(pipeline, stream, peer).await;
                    open.decrement(1.0);
                    drop(slot);
                });
            }
            () = &mut stop => break,
        }
    }
}

/// A connection slot: at once if one is free; else idle connections are asked to close
/// and the new connection waits briefly for one of them.
async fn take_slot(slots: &Arc<Semaphore>, listener: &Listener) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    listener.reclaim_idle();
    tokio::time::timeout(RECLAIM_WAIT, slots.clone().acquire_owned())
        .await
        .ok()?
        .ok()
}
