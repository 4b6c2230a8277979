//! The connector of upstreams with `https://` endpoints: TCP through hyper-util's
//! `HttpConnector` (bounded by `connect_timeout`), then a rustls handshake bounded by
//! `tls_handshake_timeout`, SNI from the endpoint host (or `tls.server_name`).
//!
//! Upstreams with only `http://` endpoints never use this type: they keep the bare
//! `HttpConnector` client, so the plain path costs exactly what it did before TLS existed.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::uri::Scheme;
use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tower::Service;

use crate::config::UpstreamTls;
use crate::tls::{TlsConnectError, ALPN_H2};

use super::HttpConnector;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connects to `http://` and `https://` endpoints of one upstream.
#[derive(Clone)]
pub struct TlsConnector {
    http: HttpConnector,
    tls: tokio_rustls::TlsConnector,
    server_name: Option<ServerName<'static>>,
    handshake_timeout: Duration,
}

/// A connection to an upstream endpoint.
#[derive(Debug)]
pub enum UpstreamIo {
    /// An `http://` endpoint.
    Plain(TokioIo<TcpStream>),
    /// An `https://` endpoint (boxed: a rustls session is ~1 KiB, allocated once per
    /// connection, not per request).
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

// === impl TlsConnector ===

impl TlsConnector {
    /// Wraps `http` (which must not enforce the `http` scheme) with TLS from `tls`.
    pub fn new(mut http: HttpConnector, tls: &UpstreamTls, handshake_timeout: Duration) -> Self {
        http.enforce_http(false);
        Self {
            http,
            tls: tokio_rustls::TlsConnector::from(tls.client_config.clone()),
            server_name: tls.server_name.clone(),
            handshake_timeout,
        }
    }
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("server_name", &self.server_name)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl Service<Uri> for TlsConnector {
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<UpstreamIo, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        // An IPv6 literal host comes bracketed; a server name must not be.
        let host = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned());
        let connecting = self.http.call(uri);
        let (tls, server_name, timeout) = (
            self.tls.clone(),
            self.server_name.clone(),
            self.handshake_timeout,
        );
        Box::pin(async move {
            let tcp = connecting.await?;
            if !https {
                return Ok(UpstreamIo::Plain(tcp));
            }
            let name = match server_name {
                Some(name) => name,
                None => {
                    let host = host.unwrap_or_default();
                    ServerName::try_from(host.clone())
                        .map_err(|_| TlsConnectError::ServerName(host))?
                }
            };
            match tokio::time::timeout(timeout, tls.connect(name, tcp.into_inner())).await {
                Err(_) => Err(TlsConnectError::HandshakeTimeout(timeout).into()),
                Ok(Err(err)) => Err(TlsConnectError::Handshake(err).into()),
                Ok(Ok(stream)) => Ok(UpstreamIo::Tls(Box::new(TokioIo::new(stream)))),
            }
        })
    }
}

// === impl UpstreamIo ===

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(io) => io.connected(),
            Self::Tls(io) => {
                let (tcp, session) = io.inner().get_ref();
                let connected = tcp.connected();
                // ALPN chose h2: the pool then speaks HTTP/2 on this connection.
                if session.alpn_protocol() == Some(ALPN_H2) {
                    connected.negotiated_h2()
                } else {
                    connected
                }
            }
        }
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls(io) => Pin::new(&mut **io).poll_read(cx, buf),
        }
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls(io) => Pin::new(&mut **io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls(io) => Pin::new(&mut **io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls(io) => Pin::new(&mut **io).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(io) => io.is_write_vectored(),
            Self::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Tls(io) => Pin::new(&mut **io).poll_write_vectored(cx, bufs),
        }
    }
}
