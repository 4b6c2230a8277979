//! Body and header size limits: 413 and 431 as problem+json before anything else runs, and a
//! byte limit on streamed bodies without `Content-Length`.

use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::edge::body_timeout::TimeoutBody;
use crate::plumbing::step::Step;
use portcullis_problem::Problem;

/// Enforces `server.max_body_bytes` and `server.max_header_bytes` (a [`Step`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    max_body_bytes: u64,
    max_header_bytes: usize,
    body_read_timeout: Duration,
}

/// A streamed request body grew past `server.max_body_bytes`: the client's fault, a 413.
///
/// `Limited` reports an untyped [`LengthLimitError`] without the limit; wrapping it here
/// gives every layer that meets the error (the retry layer reading a body for replay, the
/// upstream client streaming it) one type to recognise and the number for the problem.
#[derive(Debug, thiserror::Error)]
#[error("the request body exceeds the limit of {limit} bytes")]
pub struct BodyTooLarge {
    /// `server.max_body_bytes`.
    pub limit: u64,
    #[source]
    source: LengthLimitError,
}

impl Limits {
    /// Limits from configuration.
    pub(crate) fn new(
        max_body_bytes: u64,
        max_header_bytes: usize,
        body_read_timeout: Duration,
    ) -> Self {
        Self {
            max_body_bytes,
            max_header_bytes,
            body_read_timeout,
        }
    }
}

impl Step for Limits {
    type Finish = ();

    fn step(&self, request: &mut Request<Body>) -> Result<(), Response<Body>> {
        if head_size(request) > self.max_header_bytes {
            let problem = Problem::headers_too_large(self.max_header_bytes).closing();
            return Err(problem.into_response());
        }
        // hyper turned a valid Content-Length (the framing guard refused conflicting ones)
        // into the body's exact size: the header is parsed once, by hyper.
        let declared = request.body().size_hint().exact();
        if declared.is_some_and(|len| len > self.max_body_bytes) {
            let problem = Problem::body_too_large(self.max_body_bytes).closing();
            return Err(problem.into_response());
        }
        // A declared length within the limit is enforced by hyper itself; only bodies of
        // unknown length need counting as they stream.
        if declared.is_none() {
            let max = self.max_body_bytes;
            let limit = usize::try_from(max).unwrap_or(usize::MAX);
            let body = std::mem::take(request.body_mut());
            *request.body_mut() =
                Body::new(Limited::new(body, limit).map_err(move |err| typed(err, max)));
        }
        // Bodiless requests (most GETs) skip the timer entirely.
        if !request.body().is_end_stream() {
            let body = std::mem::take(request.body_mut());
            *request.body_mut() = Body::new(TimeoutBody::new(body, self.body_read_timeout));
        }
        Ok(())
    }
}

/// Bytes of the request line and headers as they arrived (HTTP/1.1 framing).
fn head_size(request: &Request<Body>) -> usize {
    // The request target as sent: origin form (path and query) or absolute form.
    let uri = request.uri();
    let target = uri.path_and_query().map_or(1, |p| p.as_str().len())
        + uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len());
    let line = request.method().as_str().len() + target + 12;
    request.headers().iter().fold(line, |sum, (name, value)| {
        sum + name.as_str().len() + value.len() + 4
    })
}

/// Gives `Limited`'s length error its type and limit; other body errors pass unchanged.
fn typed(err: BoxError, limit: u64) -> BoxError {
    match err.downcast::<LengthLimitError>() {
        Ok(source) => Box::new(BodyTooLarge {
            limit,
            source: *source,
        }),
        Err(other) => other,
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The [`BodyTooLarge`] in `error`'s cause chain, if the body limit caused it.
pub fn body_too_large<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a BodyTooLarge> {
    portcullis_problem::caused_by::<BodyTooLarge>(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain the retry layer and the upstream client see: `Limited` inside the
    /// gateway's `Body`, inside the body-timeout wrapper, inside another `Body`.
    #[tokio::test]
    async fn an_oversized_stream_is_recognised_through_the_wrappers() {
        use futures_util::stream;
        let chunks =
            (0..4).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from_static(&[b'z'; 512])));
        let limited = Body::new(
            Limited::new(Body::from_stream(stream::iter(chunks)), 1024)
                .map_err(|err| typed(err, 1024)),
        );
        let wrapped = Body::new(TimeoutBody::new(limited, Duration::from_secs(30)));
        let err = wrapped.collect().await.unwrap_err();
        let found = body_too_large(&err).map(|e| e.limit);
        assert_eq!(found, Some(1024), "{err:?}");
    }

    #[tokio::test]
    async fn other_body_errors_are_not_a_413() {
        use futures_util::stream;
        let items = [Err::<bytes::Bytes, _>(std::io::Error::other("reset"))];
        let body = Body::new(
            Limited::new(Body::from_stream(stream::iter(items)), 1024)
                .map_err(|err| typed(err, 1024)),
        );
        let err = body.collect().await.unwrap_err();
        assert!(body_too_large(&err).is_none(), "{err:?}");
    }
}
