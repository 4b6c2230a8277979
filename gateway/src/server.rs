//! The listener: accepts connections, serves HTTP/1.1 and HTTP/2 (h2c) with hyper, and on
//! shutdown stops accepting, lets in-flight requests finish within the grace period, then
//! closes what is left.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::util::BoxCloneService;
use tower::ServiceExt;

use crate::forwarded::PeerAddr;

/// The assembled request pipeline.
pub type HttpService = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// Listener settings.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Bound on receiving a request head (slowloris defence).
    pub header_read_timeout: Duration,
    /// Request head limit; hyper's read buffer is sized above it so the limits layer, not
    /// hyper, answers first with a problem+json 431.
    pub max_header_bytes: usize,
    /// Bound on graceful shutdown.
    pub shutdown_grace: Duration,
}

/// Serves `service` on `listener` until `shutdown` resolves, then drains within the grace.
pub async fn serve(
    listener: TcpListener,
    service: HttpService,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .max_buf_size((options.max_header_bytes + 16 * 1024).max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256);
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
                let hyper_service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(PeerAddr(peer));
                    service.clone().oneshot(request.map(Body::new))
                });
                let builder = builder.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                    if let Err(err) = watcher.watch(connection).await {
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
