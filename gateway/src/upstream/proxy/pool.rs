//! The connection pool of plain HTTP/1.1 upstreams (`http://`, not `http2`): per endpoint,
//! a LIFO stack of idle `hyper::client::conn::http1` senders.
//!
//! Each connection is driven by a task of its own, spawned once when it is opened (as
//! hyper-util's client does); what this pool saves is the checkout and checkin around it.
//! hyper-util's legacy client finds idle connections by hashing `(Scheme, Authority)` (twice
//! per request), stores connection metadata in the request's extensions, and spawns a task
//! per request that waits for the connection to become idle again. Here a pool is found by
//! the endpoint's stable id (a binary search in a short sorted list), a request goes out in
//! origin form on the sender popped from the stack, and the sender goes back when the
//! response body ends (`body.rs`).
//!
//! Reuse is LIFO (nginx's `keepalive` cache, Envoy's pool): the most recently used idle
//! connection first, so a burst's surplus sits at the bottom and ages out. At most
//! `pool_max_idle` connections stay idle (the oldest goes first), none reused after the idle
//! timeout; both are enforced at checkout and checkin, with no timer per connection. When
//! traffic stops, one reaper task per endpoint (running only while it has idle
//! connections) closes each idle connection at its idle timeout, as nginx's
//! `keepalive_timeout` does, so a quiet gateway holds no backend sockets for ever.
//!
//! A request that hyper hands back unsent (the reused connection turned out closed before a
//! byte was written) goes once more on a fresh connection, as the legacy client's
//! `retry_canceled_requests` does; every other failure is reported as a [`SendError`] that
//! keeps connecting (nothing sent) apart from the exchange (the request may have been sent).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::Body;
use http::{Request, Response, Uri};
use hyper::client::conn::http1::{self, SendRequest};
use tokio::time::Instant;
use tower::ServiceExt;

use super::HttpConnector;
use crate::upstream::balance::{Balancer, Endpoint};

/// hyper's own smallest read buffer for HTTP/1.
const MIN_READ_BUFFER: usize = 8 * 1024;
/// The read buffer when none is set (hyper's default, about 400 KiB).
const DEFAULT_READ_BUFFER: usize = 8 * 1024 + 4096 * 100;

mod body;
#[cfg(test)]
mod tests;

pub(crate) use body::{Connection, UpstreamBody};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a pooled attempt failed, before the proxy classifies it (`ProxyError::from_pool`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// Connecting (resolution, TCP connect, its timeout) failed: nothing was sent.
    #[error("connecting to the upstream failed")]
    Connect(#[source] BoxError),
    /// The HTTP/1 exchange failed: the request (or part of it) may have been written.
    #[error("the upstream exchange failed")]
    Exchange(#[source] hyper::Error),
}

/// The pools of one upstream, one per endpoint, sorted by the endpoint's stable id (an
/// endpoint that discovery keeps keeps its id, so its connections).
pub(crate) struct Pools {
    by_endpoint: ArcSwap<Vec<(usize, Arc<EndpointPool>)>>,
    connector: HttpConnector,
    max_idle: usize,
    idle_timeout: Duration,
    /// hyper's read buffer per connection at most: the largest body chunk read ahead.
    read_buffer: usize,
}

/// The idle connections of one endpoint.
pub(crate) struct EndpointPool {
    /// `http://authority/`: what the connector resolves and connects to.
    target: Uri,
    connector: HttpConnector,
    /// Oldest at the front, most recently used at the back.
    idle: Mutex<VecDeque<Idle>>,
    /// A reaper task is running (read and written under the `idle` lock).
    reaping: AtomicBool,
    max_idle: usize,
    idle_timeout: Duration,
    read_buffer: usize,
}

/// An idle connection's sender and since when it is idle.
struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

// === impl Pools ===

impl Pools {
    /// Pools connecting through `connector`, keeping at most `max_idle` idle connections per
    /// endpoint, reused for at most `idle_timeout` after their last exchange.
    pub(crate) fn new(connector: HttpConnector, max_idle: usize, idle_timeout: Duration) -> Self {
        Self {
            by_endpoint: ArcSwap::from_pointee(Vec::new()),
            connector,
            max_idle,
            idle_timeout,
            read_buffer: DEFAULT_READ_BUFFER,
        }
    }

    /// The same, reading at most `bytes` ahead of the client per connection (at least
    /// hyper's minimum, 8 KiB): a response body arrives in chunks no larger than this, and
    /// while the client is slow the upstream waits in TCP's own flow control.
    pub(crate) fn with_read_buffer(mut self, bytes: usize) -> Self {
        self.read_buffer = bytes.max(MIN_READ_BUFFER);
        self
    }

    /// The pool of `endpoint`, created on its first request.
    pub(crate) fn get(&self, endpoint: &Endpoint, balancer: &Balancer) -> Arc<EndpointPool> {
        let id = endpoint.state.id;
        let pools = self.by_endpoint.load();
        match pools.binary_search_by_key(&id, |(id, _)| *id) {
            Ok(at) => pools[at].1.clone(),
            Err(_) => self.insert(endpoint, balancer),
        }
    }

    /// Adds `endpoint`'s pool and drops those of endpoints no longer in the balancer's set
    /// (with their idle connections).
    #[cold]
    fn insert(&self, endpoint: &Endpoint, balancer: &Balancer) -> Arc<EndpointPool> {
        let id = endpoint.state.id;
        let fresh = Arc::new(EndpointPool::new(
            target_of(endpoint),
            self.connector.clone(),
            self.max_idle,
            self.idle_timeout,
            self.read_buffer,
        ));
        let current = balancer.endpoint_set();
        let live = |id: usize| current.endpoints().iter().any(|e| e.state.id == id);
        let mut chosen = fresh.clone();
        // A concurrent insert of the same endpoint wins; this one is then dropped unused.
        self.by_endpoint.rcu(|pools| {
            let mut next: Vec<_> = pools.iter().filter(|(id, _)| live(*id)).cloned().collect();
            match next.binary_search_by_key(&id, |(id, _)| *id) {
                Ok(at) => chosen = next[at].1.clone(),
                Err(at) => {
                    chosen = fresh.clone();
                    next.insert(at, (id, fresh.clone()));
                }
            }
            next
        });
        chosen
    }
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools")
            .field("endpoints", &self.by_endpoint.load().len())
            .field("max_idle", &self.max_idle)
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

/// `http://authority/` of an endpoint (built once per endpoint pool, not per request).
fn target_of(endpoint: &Endpoint) -> Uri {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(endpoint.address.scheme.clone());
    parts.authority = Some(endpoint.address.authority.clone());
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    // Scheme and authority come from a parsed endpoint, so this cannot fail; if it did, the
    // connector's error for an empty URI is a connect failure like any other.
    Uri::from_parts(parts).unwrap_or_default()
}

/// The request's target in origin form (`/path?query`), which HTTP/1.1 sends to an origin
/// server: the absolute URI's path and query moved out, not re-formatted.
fn origin_form(request: &mut Request<Body>) {
    let uri = std::mem::take(request.uri_mut());
    if let Some(path_and_query) = uri.into_parts().path_and_query {
        *request.uri_mut() = Uri::from(path_and_query);
    }
}

// === impl EndpointPool ===

impl EndpointPool {
    fn new(
        target: Uri,
        connector: HttpConnector,
        max_idle: usize,
        idle_timeout: Duration,
        read_buffer: usize,
    ) -> Self {
        Self {
            target,
            connector,
            idle: Mutex::new(VecDeque::new()),
            reaping: AtomicBool::new(false),
            max_idle,
            idle_timeout,
            read_buffer,
        }
    }

    /// Sends `request` (`Host` set; its target is sent in origin form) on an idle connection,
    /// or on a new one; the response body returns the connection to this pool when it ends.
    ///
    /// Not an `async fn`: that would keep the request twice in its state (the argument and
    /// the binding it is moved into), and the state is copied into the proxy's future.
    pub(crate) fn send(
        self: Arc<Self>,
        mut request: Request<Body>,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, SendError>> + Send {
        origin_form(&mut request);
        let idle = self.checkout();
        async move {
            let request = match idle {
                None => request,
                Some(mut sender) => match sender.try_send_request(request).await {
                    Ok(response) => {
                        return Ok(response.map(|inner| Connection::hold(inner, sender, self)))
                    }
                    Err(mut err) => match err.take_message() {
                        // Handed back unsent: the connection closed under us. Provably not
                        // processed, so it goes once more, on a fresh connection.
                        Some(unsent) => unsent,
                        None => return Err(SendError::Exchange(err.into_error())),
                    },
                },
            };
            // Once per connection, not per request: boxed, so that its state does not
            // widen every request's.
            let mut sender = Box::pin(self.connect()).await?;
            match sender.try_send_request(request).await {
                Ok(response) => Ok(response.map(|inner| Connection::hold(inner, sender, self))),
                Err(err) => Err(SendError::Exchange(err.into_error())),
            }
        }
    }

    /// Opens a connection and spawns the task that drives it until it closes.
    async fn connect(&self) -> Result<SendRequest<Body>, SendError> {
        let io = self
            .connector
            .clone()
            .oneshot(self.target.clone())
            .await
            .map_err(|err| SendError::Connect(Box::new(err)))?;
        let (sender, connection) = http1::Builder::new()
            .max_buf_size(self.read_buffer)
            .handshake(io)
            .await
            .map_err(|err| SendError::Connect(Box::new(err)))?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "upstream connection failed");
            }
        });
        Ok(sender)
    }

    /// Sends a request that asks to switch protocols on a connection of its own, which is
    /// never pooled: after a 101 it belongs to the tunnel (`hyper::upgrade::on` on the
    /// response), after anything else it closes once the response ends.
    pub(crate) async fn send_upgrade(
        &self,
        mut request: Request<Body>,
    ) -> Result<Response<hyper::body::Incoming>, SendError> {
        origin_form(&mut request);
        let io = self
            .connector
            .clone()
            .oneshot(self.target.clone())
            .await
            .map_err(|err| SendError::Connect(Box::new(err)))?;
        let (mut sender, connection) = http1::Builder::new()
            .max_buf_size(self.read_buffer)
            .handshake(io)
            .await
            .map_err(|err| SendError::Connect(Box::new(err)))?;
        tokio::spawn(async move {
            if let Err(err) = connection.with_upgrades().await {
                tracing::debug!(error = %err, "upstream upgrade connection failed");
            }
        });
        sender
            .send_request(request)
            .await
            .map_err(SendError::Exchange)
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Idle>> {
        // A poisoned lock still holds a valid stack.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that is still open and idle, if any; closed
    /// and expired ones met on the way are dropped.
    fn checkout(&self) -> Option<SendRequest<Body>> {
        let mut idle = self.lock();
        let now = Instant::now();
        // Bounded: every round takes one sender off a stack of at most `max_idle`.
        while let Some(top) = idle.pop_back() {
            if now.saturating_duration_since(top.since) >= self.idle_timeout {
                // The top is the youngest: everything below is older still.
                idle.clear();
                return None;
            }
            // Ready: the connection's task waits for a request (the previous exchange is
            // over, both ways). Otherwise it closed (the peer's close was read).
            if top.sender.is_ready() {
                return Some(top.sender);
            }
        }
        None
    }

    /// Puts an idle connection's sender on top of the stack, dropping expired ones and,
    /// at `max_idle`, the oldest.
    fn checkin(self: &Arc<Self>, sender: SendRequest<Body>) {
        if self.max_idle == 0 {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock();
        self.drop_expired(&mut idle, now);
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back(Idle { sender, since: now });
        if !self.reaping.load(Ordering::Relaxed) {
            self.reaping.store(true, Ordering::Relaxed);
            tokio::spawn(reap(Arc::downgrade(self)));
        }
    }

    /// Drops the idle connections whose idle timeout has passed at `now` (oldest first).
    fn drop_expired(&self, idle: &mut VecDeque<Idle>, now: Instant) {
        while idle
            .front()
            .is_some_and(|i| now.saturating_duration_since(i.since) >= self.idle_timeout)
        {
            idle.pop_front();
        }
    }

    /// Returns a sender whose response body is done with: to the stack if its connection
    /// is idle; if the response ended but the connection's task has not caught up yet (it
    /// is still finishing the exchange, e.g. writing the rest of the request body), once it
    /// has; otherwise (the body was dropped early, the connection failed) never — dropping
    /// it closes the connection, as hyper does.
    fn release(self: Arc<Self>, sender: SendRequest<Body>, body_ended: bool) {
        if sender.is_ready() {
            self.checkin(sender);
        } else if body_ended && !sender.is_closed() {
            let mut sender = sender;
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    self.checkin(sender);
                }
            });
        }
    }
}

/// Closes `pool`'s idle connections as their idle timeouts pass, until none is left idle
/// (the next checkin starts another) or the pool is gone.
async fn reap(pool: Weak<EndpointPool>) {
    loop {
        let next = {
            let Some(pool) = pool.upgrade() else { return };
            let mut idle = pool.lock();
            pool.drop_expired(&mut idle, Instant::now());
            match idle.front() {
                Some(oldest) => oldest.since + pool.idle_timeout,
                None => {
                    // Under the lock, so a checkin either saw this run or starts the next.
                    pool.reaping.store(false, Ordering::Relaxed);
                    return;
                }
            }
        };
        tokio::time::sleep_until(next).await;
    }
}
