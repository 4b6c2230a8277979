//! The request target, settled once before routing: the path in normal form and the
//! authority checked, so that every later layer sees the same target the upstream will.
//!
//! # Why here, and only here
//!
//! Route policy is keyed by path prefix. If `/x/../secure/a`, `//secure/a` or `/%73ecure/a`
//! reached the router as written, they would match `/` instead of `/secure` and skip its
//! policy, while the upstream (which normalises) serves `/secure/a`. So this layer sits just
//! before the router and rewrites the request's URI in place: routing, rate limiting, the
//! idempotency fingerprint and the proxy then all read the one normalised path. The rules
//! are RFC 3986 §6.2.2 as nginx and Envoy apply them (see [`path`]); what cannot be
//! normalised without guessing is refused as `invalid-path` problem+json with a `reason`
//! member.
//!
//! The authority follows RFC 9112 §3.2 as nginx does: HTTP/1.1 without `Host`, two `Host`
//! fields, an invalid one, or userinfo are 400 `invalid-host`; an absolute-form target's
//! authority wins over `Host`, which is rewritten to it (the proxy then sends it as
//! `X-Forwarded-Host`); over HTTP/2 a `host` field that disagrees with `:authority` is 400.
//!
//! Request-target forms (RFC 9112 §3.2): origin- and absolute-form are served. Asterisk-form
//! (`*`) is 400 for every method, OPTIONS included, as nginx answers: the gateway has no
//! server-wide options to describe, and no upstream owns `*`. Authority-form belongs to
//! CONNECT, which the gateway does not tunnel: 400 too.
//!
//! Cost on the common path (normal path, one valid `Host`): a scan of the path and of the
//! host, no allocation, no boxed future.

mod host;
mod path;

pub(crate) use path::normalize as normalize_path;

use std::borrow::Cow;

use axum::body::Body;
use http::uri::PathAndQuery;
use http::{header, Request, Response, StatusCode, Uri};

use self::host::HostError;
use self::path::PathError;
use crate::plumbing::client::PeerAddr;
use crate::plumbing::step::Step;
use portcullis_problem::Problem;

/// Why a request target is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TargetError {
    /// The path cannot be normalised safely.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The authority (Host, absolute-form, `:authority`) is missing, repeated or invalid.
    #[error(transparent)]
    Host(#[from] HostError),
    /// `*`: only meaningful for OPTIONS, and not served by the gateway.
    #[error("asterisk-form ('*') targets the server as a whole; the gateway serves only requests for a path")]
    Asterisk,
    /// `host:port` as the target: only for CONNECT, which the gateway does not tunnel.
    #[error("authority-form targets are only for CONNECT, and the gateway does not tunnel")]
    AuthorityForm,
    /// The normalised path could not be put back into a URI (not expected: it only holds
    /// characters the original held).
    #[error("the normalised request target cannot be represented")]
    Unrepresentable,
}

// === impl TargetError ===

impl TargetError {
    /// A stable, machine-readable reason.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::Path(path) => path.code(),
            Self::Host(host) => host.code(),
            Self::Asterisk => "asterisk-form",
            Self::AuthorityForm => "authority-form",
            Self::Unrepresentable => "unrepresentable-target",
        }
    }

    /// The 400 problem: type `invalid-host` for authority problems, `invalid-path` otherwise.
    /// The connection closes after it, as nginx closes after a 400.
    pub(crate) fn problem(self) -> Problem {
        let (slug, title) = match self {
            Self::Host(_) => ("invalid-host", "Invalid Host"),
            _ => ("invalid-path", "Invalid request target"),
        };
        Problem::new(StatusCode::BAD_REQUEST, slug, title, self.to_string())
            .with("reason", self.code())
            .closing()
    }
}

/// Settles the request target before routing: path normalised in place, authority checked
/// (a [`Step`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Target;

// === impl Target ===

impl Step for Target {
    type Finish = ();

    fn step(&self, request: &mut Request<Body>) -> Result<(), Response<Body>> {
        settle(request).map_err(|error| {
            let peer = request.extensions().get::<PeerAddr>().map(|p| p.0);
            tracing::debug!(
                reason = error.code(),
                peer = peer.map(tracing::field::display),
                "request target refused"
            );
            metrics::counter!("requests_refused_total", "reason" => error.code()).increment(1);
            error.problem().into_response()
        })
    }
}

/// Checks the target's form and authority, then normalises its path in place.
fn settle(request: &mut Request<Body>) -> Result<(), TargetError> {
    let uri = request.uri();
    match uri.path() {
        "*" => return Err(TargetError::Asterisk),
        path if !path.starts_with('/') => {
            return Err(if uri.authority().is_some() && uri.scheme().is_none() {
                TargetError::AuthorityForm
            } else {
                TargetError::Path(PathError::NotAbsolute)
            })
        }
        _ => {}
    }
    let host = host::check(request.version(), uri, request.headers())?;
    // `http://host?q` has an empty path; it is sent on as `/?q`.
    let no_slash = uri
        .path_and_query()
        .is_some_and(|pq| !pq.as_str().starts_with('/'));
    let rebuilt = match path::normalize(uri.path())? {
        Cow::Borrowed(_) if !no_slash => None,
        normal => {
            let mut normal = normal.into_owned();
            if let Some(query) = uri.query() {
                normal.push('?');
                normal.push_str(query);
            }
            Some(PathAndQuery::try_from(normal).map_err(|_| TargetError::Unrepresentable)?)
        }
    };
    if let Some(path_and_query) = rebuilt {
        let mut parts = std::mem::take(request.uri_mut()).into_parts();
        parts.path_and_query = Some(path_and_query);
        *request.uri_mut() = Uri::from_parts(parts).map_err(|_| TargetError::Unrepresentable)?;
    }
    if let Some(host) = host {
        request.headers_mut().insert(header::HOST, host);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
