//! The listener: accepts connections (at most `server.max_connections`), picks each
//! connection's protocol, serves it with hyper, and bounds every silent phase.
//!
//! # Which protocol a connection gets
//!
//! | connection | served as |
//! |---|---|
//! | TLS, ALPN `h2` | HTTP/2 only |
//! | TLS, ALPN `http/1.1` or none | HTTP/1.x only, through the [`FramingGuard`] |
//! | plain, `server.h2c = true` | HTTP/2 if it opens with the prior-knowledge preface, else HTTP/1.x through the guard |
//! | plain, `server.h2c = false` | HTTP/1.x only, through the guard (a preface is answered 505) |
//!
//! hyper's own HTTP/1 and HTTP/2 connection builders are used directly, one per protocol,
//! so nothing downstream of this choice can switch protocols again.
//!
//! # Time limits
//!
//! Each connection runs under a watchdog (`activity`): the TLS handshake and the wait
//! for a first request are bounded by `server.header_read_timeout`, and so is every request
//! head that arrives in part; an idle connection between requests is closed after
//! `server.keep_alive_timeout` (HTTP/2: GOAWAY), which HTTP/1 responses advertise as
//! `Keep-Alive: timeout=N` so clients stop reusing the connection first; a client that stops
//! reading what the gateway writes is disconnected after `server.send_timeout`.
//!
//! # Connection cap
//!
//! At the cap, the listener asks up to 32 idle keep-alive connections to close (as nginx
//! reuses idle connections when `worker_connections` runs out) and the new connection waits
//! briefly for a slot, without holding up the accept loop; if none frees up, it is closed
//! and counted in
//! `connections_refused_total{listener}`. The admin listener has a cap of its own, so
//! `/healthz`, `/readyz` and `/metrics` stay reachable when the proxy listener is full.
//!
//! # Shutdown
//!
//! On shutdown the listener stops accepting, asks every connection to finish gracefully
//! (HTTP/2: GOAWAY; a WebSocket tunnel: a close frame, 1001), and waits for them within
//! `server.shutdown_grace`. HTTP/1 connections drain as Envoy drains them: every response
//! from then on says `Connection: close`, and a connection still idle after a short linger
//! (`watchdog`, 1 s) is closed, so a client that was about to reuse it gets the close on a
//! response rather than on a request it just sent. The linger narrows, but cannot remove,
//! the race with a client that writes on an idle connection at the very moment it closes
//! (nginx has the same); stock clients retry a request that fails before any byte of it
//! was written on a reused connection.
//!
//! The listening sockets themselves can be handed to a successor process ([`handover`]).
//!
//! # Upgrades
//!
//! HTTP/1 connections allow hyper's upgrades: a request the proxy answers `101` becomes a
//! WebSocket tunnel (`upstream::websocket`), which keeps the connection's slot until it
//! ends. HTTP/2 connections advertise `SETTINGS_ENABLE_CONNECT_PROTOCOL` when some route
//! has `websocket = true` ([`ServeOptions::extended_connect`]): an RFC 8441 extended
//! CONNECT the proxy answers `200` becomes a tunnel on its stream, which counts as a
//! request in flight until the tunnel ends.

mod accept;
pub(crate) mod activity;
pub mod handover;
mod service;
mod sniff;
mod stream;
mod swap;
mod watchdog;
mod watched;

use std::convert::Infallible;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Request, Response};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify};
use tokio_rustls::TlsAcceptor;
use tower::util::BoxCloneService;

pub use self::accept::{serve, serve_workers};
pub use self::activity::Activity;
use self::activity::Timeouts;
use self::service::ConnectionService;
use self::sniff::{sniff, Protocol, Rewind};
use self::stream::StreamExecutor;
use self::swap::Current;
pub use self::swap::Swap;
use self::watched::Watched;
use crate::config::Http2Settings;
use crate::edge::framing::FramingGuard;
use crate::edge::upgrade::ConnectionHold;
use crate::tls::ALPN_H2;

/// How long a connection accepted at the cap waits for a reclaimed idle one to free a slot.
const RECLAIM_WAIT: Duration = Duration::from_millis(50);
/// Idle connections closed at most per connection accepted at the cap (nginx reclaims 32).
const RECLAIM_BATCH: usize = 32;

/// The assembled request pipeline.
pub type HttpService = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// Listener settings.
#[derive(Clone)]
pub struct ServeOptions {
    /// Metrics label of the listener (`proxy`, `admin`).
    pub name: &'static str,
    /// Bound on receiving a request head (slowloris defence); also bounds the TLS
    /// handshake and a fresh connection's wait for its first request.
    pub header_read_timeout: Duration,
    /// Idle keep-alive connections are closed after this.
    pub keep_alive_timeout: Duration,
    /// A client that takes none of a pending write for this long is disconnected; an
    /// HTTP/2 stream whose response waits this long on the client's window is reset.
    pub send_timeout: Duration,
    /// Bytes of one HTTP/2 response stream hyper buffers toward the client at most.
    pub response_buffer_bytes: usize,
    /// Open connections at most.
    pub max_connections: usize,
    /// Request head limit; hyper's read buffer is sized above it so the limits layer, not
    /// hyper, answers first with a problem+json 431.
    pub max_header_bytes: usize,
    /// Bound on graceful shutdown.
    pub shutdown_grace: Duration,
    /// Detect HTTP/2 prior knowledge (h2c) on plain connections; otherwise HTTP/1.1 only.
    pub h2c: bool,
    /// HTTP/2 limits.
    pub http2: Http2Settings,
    /// Advertise RFC 8441 extended CONNECT on HTTP/2 connections (WebSockets over HTTP/2):
    /// set when some route has `websocket = true`.
    pub extended_connect: bool,
    /// Terminate TLS with this acceptor; `None` → plain HTTP.
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("name", &self.name)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("keep_alive_timeout", &self.keep_alive_timeout)
            .field("send_timeout", &self.send_timeout)
            .field("response_buffer_bytes", &self.response_buffer_bytes)
            .field("max_connections", &self.max_connections)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("h2c", &self.h2c)
            .field("http2", &self.http2)
            .field("extended_connect", &self.extended_connect)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Request extension: the request arrived over TLS (the proxy then forwards
/// `X-Forwarded-Proto: https`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTls;

/// Everything a connection task needs, built once per listener.
struct Listener {
    options: ServeOptions,
    http1: http1::Builder,
    http2: http2::Builder<StreamExecutor>,
    /// `Keep-Alive: timeout=N`, advertised on HTTP/1 responses.
    keep_alive: HeaderValue,
    /// The guard holds back at most what hyper would buffer for one head.
    head_limit: usize,
    /// Asks idle connections to close (connection cap reached) …
    reclaim: Notify,
    /// … this many of them at most.
    reclaim_budget: AtomicUsize,
    /// `true` once the listener shuts down.
    stop: watch::Receiver<bool>,
}

/// One accepted connection.
struct Conn {
    pipeline: Current,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

/// hyper's read buffer: above the head limit, so the limits layer (not hyper) answers 431.
fn read_buffer_bytes(options: &ServeOptions) -> usize {
    (options.max_header_bytes + 16 * 1024).max(8192)
}

impl Listener {
    fn new(options: ServeOptions, stop: watch::Receiver<bool>) -> Self {
        let mut http1 = http1::Builder::new();
        // Head and idle timing is the watchdog's (hyper's header timer would also run
        // while a keep-alive connection idles, closing it at the header deadline).
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true)
            .max_buf_size(read_buffer_bytes(&options));
        let h2 = options.http2;
        // Each stream's task under `server.send_timeout` (see `stream`).
        let mut http2 = http2::Builder::new(StreamExecutor {
            send_timeout: options.send_timeout,
            listener: options.name,
        });
        http2
            .timer(TokioTimer::new())
            .max_send_buf_size(options.response_buffer_bytes)
            .max_concurrent_streams(h2.max_concurrent_streams)
            .max_header_list_size(h2.max_header_list_size)
            .initial_stream_window_size(h2.initial_stream_window_size)
            .initial_connection_window_size(h2.initial_connection_window_size);
        if options.extended_connect {
            http2.enable_connect_protocol();
        }
        let keep_alive = HeaderValue::from_str(&format!(
            "timeout={}",
            options.keep_alive_timeout.as_secs().max(1)
        ))
        .unwrap_or(HeaderValue::from_static("timeout=75"));
        Self {
            head_limit: read_buffer_bytes(&options),
            options,
            http1,
            http2,
            keep_alive,
            reclaim: Notify::new(),
            reclaim_budget: AtomicUsize::new(0),
            stop,
        }
    }

    /// Counts this connection against the reclaim budget; `false` once it is spent.
    fn take_reclaim(&self) -> bool {
        self.reclaim_budget
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// At the cap: asks up to [`RECLAIM_BATCH`] idle connections to close.
    fn reclaim_idle(&self) {
        self.reclaim_budget.store(RECLAIM_BATCH, Ordering::Release);
        self.reclaim.notify_waiters();
    }

    fn timeouts(&self) -> Timeouts {
        Timeouts {
            header_read: self.options.header_read_timeout,
            keep_alive: self.options.keep_alive_timeout,
            send: self.options.send_timeout,
        }
    }

    /// Serves one accepted connection to its end on the listener's current pipeline.
    async fn connection(self: Arc<Self>, pipeline: Current, stream: TcpStream, peer: SocketAddr) {
        let activity = Activity::new();
        let conn = Conn {
            pipeline,
            peer,
            activity,
        };
        let bound = self.options.header_read_timeout;
        let Some(acceptor) = self.options.tls.clone() else {
            if !self.options.h2c {
                return self.http1(Rewind::new(stream), conn, false).await;
            }
            match tokio::time::timeout(bound, sniff(stream)).await {
                Ok(Ok((Protocol::Http2, io))) => self.http2(io, conn, false).await,
                Ok(Ok((Protocol::Http1, io))) => self.http1(io, conn, false).await,
                Ok(Err(err)) => {
                    tracing::debug!(%err, %peer, "connection failed before its first request")
                }
                Err(_) => closed("first_request_timeout", self.options.name, peer),
            }
            return;
        };
        let stream = match tokio::time::timeout(bound, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => return tracing::debug!(%err, %peer, "TLS handshake failed"),
            Err(_) => return closed("handshake_timeout", self.options.name, peer),
        };
        if stream.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
            self.http2(stream, conn, true).await
        } else {
            self.http1(stream, conn, true).await
        }
    }

    async fn http1<IO>(&self, io: IO, conn: Conn, tls: bool)
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let io = Watched::new(io, conn.activity.clone());
        let guarded = FramingGuard::new(io, self.head_limit, conn.activity.clone());
        // A tunnel opened from this connection (`edge::upgrade`) holds a sender: the
        // connection, its slot and the drain's wait last until the last one is gone.
        let (open, mut tunnels) = mpsc::channel::<()>(1);
        let service = ConnectionService::new(
            conn.pipeline,
            conn.peer,
            tls,
            conn.activity.clone(),
            Some(self.keep_alive.clone()),
        )
        .with_upgrades(ConnectionHold::new(self.stop.clone(), open));
        let connection = self
            .http1
            .serve_connection(TokioIo::new(guarded), service)
            .with_upgrades();
        self.watch(connection, conn.activity, conn.peer).await;
        // Bounded by the tunnel's own limits, and on shutdown by its close (1001).
        let _ = tunnels.recv().await;
    }

    async fn http2<IO>(&self, io: IO, conn: Conn, tls: bool)
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        // A tunnel on one of its streams holds a sender, as on HTTP/1; the connection
        // itself carries the tunnel's frames, so it runs until the tunnel's stream ends.
        let (open, mut tunnels) = mpsc::channel::<()>(1);
        let mut service =
            ConnectionService::new(conn.pipeline, conn.peer, tls, conn.activity.clone(), None);
        if self.options.extended_connect {
            service = service.with_streams(ConnectionHold::new(self.stop.clone(), open));
        } else {
            drop(open);
        }
        let io = Watched::new(io, conn.activity.clone());
        let connection = self.http2.serve_connection(TokioIo::new(io), service);
        self.watch(connection, conn.activity, conn.peer).await;
        let _ = tunnels.recv().await;
    }
}

/// Counts a connection the gateway closed, by reason.
fn closed(reason: &'static str, listener: &'static str, peer: SocketAddr) {
    tracing::debug!(%peer, reason, listener, "closing connection");
    metrics::counter!("connections_closed_total", "listener" => listener, "reason" => reason)
        .increment(1);
}
