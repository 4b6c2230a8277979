//! How one upstream attempt failed, precisely enough for the retry layer's safety ladder.

use super::resolver::DnsError;
use crate::edge::body_timeout::is_body_timeout;
use crate::edge::limits::body_too_large;
use crate::tls::{certificate_failure, TlsConnectError};
use portcullis_retry::{FailureKind, UpstreamFailure};

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyErrorKind {
    /// Connection refused: nothing was sent.
    ConnectRefused,
    /// Connect timed out: nothing was sent.
    ConnectTimeout,
    /// Name resolution failed: nothing was sent.
    Dns,
    /// The TLS handshake did not finish within `tls_handshake_timeout`: nothing was sent.
    TlsHandshakeTimeout,
    /// The TLS handshake failed for a reason other than a certificate (reset, protocol or
    /// version mismatch): nothing was sent.
    TlsHandshake,
    /// A certificate was rejected — the upstream's by the gateway, or the gateway's client
    /// certificate by the upstream. Never retried (docs/retry-policy.md).
    TlsCertificate,
    /// The connection broke after the request (or part of it) was written.
    ResetAfterSent,
    /// The client's body exceeded the limit while streaming.
    BodyTooLarge,
    /// The client did not send its body within `server.body_read_timeout`.
    BodyTimeout,
    /// The client's body was malformed or broke off (e.g. bad chunked framing).
    BadClientBody,
    /// The request had no route (a stack assembly error, not a client error).
    NoRoute,
}

/// An attempt's failure, with the endpoint it went to.
#[derive(Debug, thiserror::Error)]
#[error("upstream attempt failed ({kind:?}) on endpoint {endpoint:?}")]
pub struct ProxyError {
    kind: ProxyErrorKind,
    endpoint: Option<usize>,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

// === impl ProxyError ===

impl ProxyError {
    /// An error without an underlying cause.
    pub fn new(kind: ProxyErrorKind, endpoint: Option<usize>) -> Self {
        Self {
            kind,
            endpoint,
            source: None,
        }
    }

    /// Classifies a hyper client error.
    pub fn from_client(err: hyper_util::client::legacy::Error, endpoint: usize) -> Self {
        let kind = classify(&err);
        Self {
            kind,
            endpoint: Some(endpoint),
            source: Some(Box::new(err)),
        }
    }

    /// Classifies a failure of the plain HTTP/1.1 pool (`pool`) as [`Self::from_client`]
    /// classifies the legacy client's: connecting sent nothing; a failed exchange is the
    /// client's body, or the connection broke with the request possibly written (a request
    /// handed back unsent was already sent again by the pool).
    pub(crate) fn from_pool(err: super::pool::SendError, endpoint: usize) -> Self {
        use super::pool::SendError;
        let kind = match &err {
            SendError::Connect(cause) => classify_connect(cause.as_ref()),
            SendError::Exchange(cause) => {
                client_body_kind(cause).unwrap_or(ProxyErrorKind::ResetAfterSent)
            }
        };
        Self {
            kind,
            endpoint: Some(endpoint),
            source: Some(Box::new(err)),
        }
    }

    /// The client's request body failed while being sent (its own error, kept by
    /// `WitnessedBody`): too large, too slow or malformed — never the upstream's fault.
    pub(crate) fn from_client_body(err: axum::Error, endpoint: usize) -> Self {
        let kind = if body_too_large(&err).is_some() {
            ProxyErrorKind::BodyTooLarge
        } else if is_body_timeout(&err) {
            ProxyErrorKind::BodyTimeout
        } else {
            ProxyErrorKind::BadClientBody
        };
        Self {
            kind,
            endpoint: Some(endpoint),
            source: Some(Box::new(err)),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> ProxyErrorKind {
        self.kind
    }

    /// For [`ProxyErrorKind::TlsCertificate`]: the verdict, e.g. `UnknownIssuer`.
    pub fn certificate_reason(&self) -> Option<String> {
        let source: &(dyn std::error::Error + 'static) = self.source.as_deref()?;
        certificate_failure(source)
    }

    /// For [`ProxyErrorKind::BodyTooLarge`]: the limit the client's body exceeded.
    pub fn body_limit(&self) -> Option<u64> {
        let source: &(dyn std::error::Error + 'static) = self.source.as_deref()?;
        body_too_large(source).map(|e| e.limit)
    }

    /// Whether the client caused this failure (its body was too large, too slow or
    /// malformed): a 4xx for the client, never an upstream failure to warn about.
    pub fn is_client_fault(&self) -> bool {
        matches!(
            self.kind,
            ProxyErrorKind::BodyTooLarge
                | ProxyErrorKind::BodyTimeout
                | ProxyErrorKind::BadClientBody
        )
    }

    /// Whether the request provably never reached the backend.
    pub fn is_provably_unprocessed(&self) -> bool {
        matches!(
            self.kind,
            ProxyErrorKind::ConnectRefused
                | ProxyErrorKind::ConnectTimeout
                | ProxyErrorKind::Dns
                | ProxyErrorKind::TlsHandshakeTimeout
                | ProxyErrorKind::TlsHandshake
                | ProxyErrorKind::NoRoute
        )
    }
}

fn classify(err: &hyper_util::client::legacy::Error) -> ProxyErrorKind {
    if let Some(kind) = client_body_kind(err) {
        return kind;
    }
    // A certificate verdict, during the handshake or (TLS 1.3 client certificates) on the
    // first read after it.
    if certificate_failure(err).is_some() {
        return ProxyErrorKind::TlsCertificate;
    }
    if err.is_connect() {
        if let Some(tls) = find::<TlsConnectError>(err) {
            return match tls {
                TlsConnectError::HandshakeTimeout(_) => ProxyErrorKind::TlsHandshakeTimeout,
                _ => ProxyErrorKind::TlsHandshake,
            };
        }
        return classify_connect(err);
    }
    ProxyErrorKind::ResetAfterSent
}

/// The client's own body failure in `err`'s cause chain, if that is what failed.
fn client_body_kind(err: &(dyn std::error::Error + 'static)) -> Option<ProxyErrorKind> {
    if body_too_large(err).is_some() {
        return Some(ProxyErrorKind::BodyTooLarge);
    }
    if is_body_timeout(err) {
        return Some(ProxyErrorKind::BodyTimeout);
    }
    if is_client_body_error(err) {
        return Some(ProxyErrorKind::BadClientBody);
    }
    None
}

/// A failed TCP connect (resolution, refusal, timeout): nothing was sent.
fn classify_connect(err: &(dyn std::error::Error + 'static)) -> ProxyErrorKind {
    // The resolver's own error type (see `resolver.rs`), not hyper-util's message.
    if find::<DnsError>(err).is_some() {
        return ProxyErrorKind::Dns;
    }
    match find::<std::io::Error>(err).map(std::io::Error::kind) {
        Some(std::io::ErrorKind::TimedOut) => ProxyErrorKind::ConnectTimeout,
        // Refused, or a connect-phase error without an io cause: still nothing was sent.
        _ => ProxyErrorKind::ConnectRefused,
    }
}

impl UpstreamFailure for ProxyError {
    fn kind(&self) -> FailureKind {
        match self.kind {
            ProxyErrorKind::ConnectRefused => FailureKind::ConnectRefused,
            ProxyErrorKind::ConnectTimeout => FailureKind::ConnectTimeout,
            ProxyErrorKind::Dns => FailureKind::Dns,
            ProxyErrorKind::TlsHandshakeTimeout => FailureKind::TlsHandshakeTimeout,
            // Nothing was sent; a reset or a transient refusal during the handshake is as
            // safe to retry as a reset before sending.
            ProxyErrorKind::TlsHandshake => FailureKind::ResetBeforeSent,
            ProxyErrorKind::TlsCertificate => FailureKind::TlsCertificate,
            ProxyErrorKind::ResetAfterSent => FailureKind::ResetAfterSent,
            // The client's own body or a local assembly error: never worth a retry.
            ProxyErrorKind::BodyTooLarge
            | ProxyErrorKind::BodyTimeout
            | ProxyErrorKind::BadClientBody
            | ProxyErrorKind::NoRoute => FailureKind::Other,
        }
    }

    fn endpoint(&self) -> Option<usize> {
        self.endpoint
    }
}

/// hyper marks errors that came out of the request body we handed it (the client's stream)
/// as "user" errors: the client's framing, not the upstream, failed.
fn is_client_body_error(err: &(dyn std::error::Error + 'static)) -> bool {
    find::<hyper::Error>(err).is_some_and(hyper::Error::is_user)
}

/// The first error of type `T` in `err`'s cause chain.
pub(super) use portcullis_problem::caused_by as find;
