//! The listener: accepts connections, serves HTTP/1.1 and HTTP/2 with hyper — over TLS with
//! the protocol chosen by ALPN, or in plain text with h2c prior-knowledge detection when
//! `server.h2c` is on — and on shutdown stops accepting, lets in-flight requests finish
//! within the grace period, then closes what is left. Every connection that may speak
//! HTTP/1.x is read through a [`FramingGuard`], which refuses ambiguous request heads
//! before hyper parses them.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::util::BoxCloneService;
use tower::ServiceExt;

use crate::config::Http2Settings;
use crate::forwarded::PeerAddr;
use crate::smuggling::FramingGuard;
use crate::tls::ALPN_H2;

/// The assembled request pipeline.
pub type HttpService = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// Listener settings.
#[derive(Clone)]
pub struct ServeOptions {
    /// Bound on receiving a request head (slowloris defence); also bounds the TLS handshake.
    pub header_read_timeout: Duration,
    /// Request head limit; hyper's read buffer is sized above it so the limits layer, not
    /// hyper, answers first with a problem+json 431.
    pub max_header_bytes: usize,
    /// Bound on graceful shutdown.
    pub shutdown_grace: Duration,
    /// Detect HTTP/2 prior knowledge (h2c) on plain connections; otherwise HTTP/1.1 only.
    pub h2c: bool,
    /// HTTP/2 limits.
    pub http2: Http2Settings,
    /// Terminate TLS with this acceptor; `None` → plain HTTP.
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("header_read_timeout", &self.header_read_timeout)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("h2c", &self.h2c)
            .field("http2", &self.http2)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Request extension: the request arrived over TLS (the proxy then forwards
/// `X-Forwarded-Proto: https`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTls;

/// The connection builders, built once per listener and shared by every connection task.
struct Builders {
    /// Plain connections: auto-detecting (h2c on) or HTTP/1.1 only.
    plain: auto::Builder<TokioExecutor>,
    /// TLS connections that negotiated `http/1.1` (or no ALPN).
    http1: auto::Builder<TokioExecutor>,
    /// TLS connections that negotiated `h2`.
    http2: auto::Builder<TokioExecutor>,
}

/// hyper's read buffer: above the head limit, so the limits layer (not hyper) answers 431.
fn read_buffer_bytes(options: &ServeOptions) -> usize {
    (options.max_header_bytes + 16 * 1024).max(8192)
}

fn builders(options: &ServeOptions) -> Builders {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size(read_buffer_bytes(options));
    let h2 = options.http2;
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(h2.max_concurrent_streams)
        .max_header_list_size(h2.max_header_list_size)
        .initial_stream_window_size(h2.initial_stream_window_size)
        .initial_connection_window_size(h2.initial_connection_window_size);
    let http1 = builder.clone().http1_only();
    let http2 = builder.clone().http2_only();
    let plain = if options.h2c { builder } else { http1.clone() };
    Builders {
        plain,
        http1,
        http2,
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, then drains within the grace.
pub async fn serve(
    listener: TcpListener,
    service: HttpService,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let builders = Arc::new(builders(&options));
    // The guard holds back at most what hyper would buffer for one head.
    let head_limit = read_buffer_bytes(&options);
    let header_read_timeout = options.header_read_timeout;
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(err) => {
                        // Out of file descriptors and the like: back off briefly instead of spinning.
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                let builders = builders.clone();
                let watcher = graceful.watcher();
                let Some(acceptor) = options.tls.clone() else {
                    // Plain HTTP: no handshake, straight to hyper through the framing guard.
                    let hyper_service = hyper_service(service, peer, false);
                    let stream = FramingGuard::new(stream, head_limit, header_read_timeout);
                    tokio::spawn(async move {
                        let connection = builders.plain.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                        if let Err(err) = watcher.watch(connection).await {
                            tracing::debug!(%err, %peer, "connection ended with an error");
                        }
                    });
                    continue;
                };
                let handshake_timeout = options.header_read_timeout;
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(err)) => {
                            tracing::debug!(%err, %peer, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    let hyper_service = hyper_service(service, peer, true);
                    let result = if stream.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
                        let connection = builders.http2.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                        watcher.watch(connection).await
                    } else {
                        let stream = FramingGuard::new(stream, head_limit, header_read_timeout);
                        let connection = builders.http1.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                        watcher.watch(connection).await
                    };
                    if let Err(err) = result {
                        tracing::debug!(%err, %peer, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(
        grace_ms = options.shutdown_grace.as_millis() as u64,
        "draining connections"
    );
    if tokio::time::timeout(options.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; closing remaining connections");
    }
}

/// Adapts the pipeline to hyper: the peer address (and TLS marker) as request extensions.
fn hyper_service(
    service: HttpService,
    peer: std::net::SocketAddr,
    tls: bool,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(PeerAddr(peer));
        if tls {
            request.extensions_mut().insert(ClientTls);
        }
        service.clone().oneshot(request.map(Body::new))
    })
}
