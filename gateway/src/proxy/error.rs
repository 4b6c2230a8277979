//! How one upstream attempt failed, precisely enough for the retry layer's safety ladder.

use crate::body_timeout::is_body_timeout;
use crate::limits::is_body_limit_error;
use crate::retry::{FailureKind, UpstreamFailure};

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
    /// Anything else.
    Other,
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

    /// What went wrong.
    pub fn kind(&self) -> ProxyErrorKind {
        self.kind
    }

    /// The endpoint the attempt went to.
    pub fn endpoint(&self) -> Option<usize> {
        self.endpoint
    }

    /// Whether the request provably never reached the backend.
    pub fn is_provably_unprocessed(&self) -> bool {
        matches!(
            self.kind,
            ProxyErrorKind::ConnectRefused
                | ProxyErrorKind::ConnectTimeout
                | ProxyErrorKind::Dns
                | ProxyErrorKind::NoRoute
        )
    }
}

fn classify(err: &hyper_util::client::legacy::Error) -> ProxyErrorKind {
    if is_body_limit_error(err) {
        return ProxyErrorKind::BodyTooLarge;
    }
    if is_body_timeout(err) {
        return ProxyErrorKind::BodyTimeout;
    }
    if is_client_body_error(err) {
        return ProxyErrorKind::BadClientBody;
    }
    if err.is_connect() {
        let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = current {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                return match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => ProxyErrorKind::ConnectRefused,
                    std::io::ErrorKind::TimedOut => ProxyErrorKind::ConnectTimeout,
                    _ if e.to_string().contains("dns") => ProxyErrorKind::Dns,
                    _ => ProxyErrorKind::ConnectRefused,
                };
            }
            if e.to_string().contains("dns error") {
                return ProxyErrorKind::Dns;
            }
            current = e.source();
        }
        // A connect-phase error without an io cause: still nothing was sent.
        return ProxyErrorKind::ConnectRefused;
    }
    ProxyErrorKind::ResetAfterSent
}

impl UpstreamFailure for ProxyError {
    fn kind(&self) -> FailureKind {
        match self.kind {
            ProxyErrorKind::ConnectRefused => FailureKind::ConnectRefused,
            ProxyErrorKind::ConnectTimeout => FailureKind::ConnectTimeout,
            ProxyErrorKind::Dns => FailureKind::Dns,
            ProxyErrorKind::ResetAfterSent => FailureKind::ResetAfterSent,
            // The client's own body or a local assembly error: never worth a retry.
            ProxyErrorKind::BodyTooLarge
            | ProxyErrorKind::BodyTimeout
            | ProxyErrorKind::BadClientBody
            | ProxyErrorKind::NoRoute
            | ProxyErrorKind::Other => FailureKind::Other,
        }
    }

    fn endpoint(&self) -> Option<usize> {
        self.endpoint
    }
}

/// hyper marks errors that came out of the request body we handed it (the client's stream)
/// as "user" errors: the client's framing, not the upstream, failed.
fn is_client_body_error(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(hyper_err) = e.downcast_ref::<hyper::Error>() {
            if hyper_err.is_user() {
                return true;
            }
        }
        current = e.source();
    }
    false
}
