//! `bench-bareproxy`: the cheapest reverse proxy the gateway's building blocks allow, as a
//! floor for `bench/run.sh`'s pass-through comparison with nginx. No routing,
//! policy, telemetry, header rewriting or error mapping: hyper's HTTP/1 server in front,
//! hyper's client behind, one current-thread runtime, the gateway's allocator.
//!
//! ```text
//! bench-bareproxy --port P --upstream 127.0.0.1:U [--client pooled|dedicated]
//! ```
//!
//! - `pooled` (default): hyper-util's legacy client with its keep-alive pool, as the gateway.
//! - `dedicated`: each client connection gets one upstream connection of its own
//!   (`hyper::client::conn::http1`, its connection task spawned once), used for every request
//!   of that client connection: no pool, no lookup. HTTP/1 without pipelining has one
//!   request at a time per connection, so this is the least work per request hyper allows.
//!
//! Loopback only (both addresses must be 127.0.0.0/8); stops on SIGINT/SIGTERM.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str =
    "usage: bench-bareproxy --port P --upstream 127.0.0.1:U [--client pooled|dedicated]";

type BoxBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, hyper::Error>;

#[derive(Clone, Copy, PartialEq)]
enum ClientKind {
    Pooled,
    Dedicated,
}

fn parse_args() -> Result<(u16, SocketAddr, ClientKind), String> {
    let mut args = std::env::args().skip(1);
    let (mut port, mut upstream, mut kind) = (None, None, ClientKind::Pooled);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(USAGE)?;
        match arg.as_str() {
            "--port" => port = Some(value.parse::<u16>().map_err(|e| format!("--port: {e}"))?),
            "--upstream" => {
                let addr: SocketAddr = value.parse().map_err(|e| format!("--upstream: {e}"))?;
                if !addr.ip().is_loopback() {
                    return Err("--upstream: loopback addresses only".into());
                }
                upstream = Some(addr);
            }
            "--client" => {
                kind = match value.as_str() {
                    "pooled" => ClientKind::Pooled,
                    "dedicated" => ClientKind::Dedicated,
                    other => return Err(format!("--client: unknown {other}")),
                }
            }
            _ => return Err(USAGE.into()),
        }
    }
    Ok((port.ok_or(USAGE)?, upstream.ok_or(USAGE)?, kind))
}

fn bad_gateway() -> Response<BoxBody> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

/// One client connection's upstream connection (`dedicated`), opened on its first request.
type Dedicated = Arc<Mutex<Option<hyper::client::conn::http1::SendRequest<Incoming>>>>;

async fn forward_dedicated(
    slot: Dedicated,
    upstream: SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<BoxBody>, Infallible> {
    let mut guard = slot.lock().await;
    if guard.as_ref().is_none_or(|s| s.is_closed()) {
        let Ok(stream) = TcpStream::connect(upstream).await else {
            return Ok(bad_gateway());
        };
        let _ = stream.set_nodelay(true);
        let Ok((sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            return Ok(bad_gateway());
        };
        tokio::spawn(conn);
        *guard = Some(sender);
    }
    let Some(sender) = guard.as_mut() else {
        return Ok(bad_gateway());
    };
    if sender.ready().await.is_err() {
        *guard = None;
        return Ok(bad_gateway());
    }
    match sender.send_request(request).await {
        Ok(response) => Ok(response.map(BodyExt::boxed_unsync)),
        Err(_) => Ok(bad_gateway()),
    }
}

fn main() -> Result<(), String> {
    let (port, upstream, kind) = parse_args()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build(connector);
        let authority: http::uri::Authority = upstream
            .to_string()
            .parse()
            .map_err(|e| format!("--upstream: {e}"))?;
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (client, authority) = (client.clone(), authority.clone());
            let slot: Dedicated = Arc::default();
            tokio::spawn(async move {
                let service = service_fn(move |mut request: Request<Incoming>| {
                    let (client, slot) = (client.clone(), slot.clone());
                    // The absolute form hyper-util's client wants, from parts: no formatting.
                    let mut parts = request.uri().clone().into_parts();
                    parts.scheme = Some(http::uri::Scheme::HTTP);
                    parts.authority = Some(authority.clone());
                    let absolute = http::Uri::from_parts(parts);
                    async move {
                        if kind == ClientKind::Dedicated {
                            return forward_dedicated(slot, upstream, request).await;
                        }
                        let Ok(uri) = absolute else {
                            return Ok(bad_gateway());
                        };
                        *request.uri_mut() = uri;
                        match client.request(request).await {
                            Ok(response) => Ok(response.map(BodyExt::boxed_unsync)),
                            Err(_) => Ok(bad_gateway()),
                        }
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
