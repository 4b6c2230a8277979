//! The request-level half of the defence: answers the refusal heads the
//! [`FramingGuard`](super::FramingGuard) substitutes, and — as a backstop whatever server
//! library sits underneath — refuses conflicting framing headers that reach it anyway.
//!
//! Cost on the common path: three header-map lookups; no allocation (as a [`Step`], its
//! future is an `Either`, not a box).

use axum::body::Body;
use http::{header, HeaderMap, HeaderName, Request, Response};

use super::head::Refusal;
use super::REFUSAL_HEADER;
use crate::plumbing::client::PeerAddr;
use crate::plumbing::step::Step;
use portcullis_problem::Problem;

/// [`REFUSAL_HEADER`] as a name, so the lookup on every request does not parse it again.
const REFUSAL: HeaderName = HeaderName::from_static(REFUSAL_HEADER);

/// Refuses requests with conflicting framing headers (a `Step`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Smuggling;

// === impl Smuggling ===

impl Step for Smuggling {
    type Finish = ();

    fn step(&self, request: &mut Request<Body>) -> Result<(), Response<Body>> {
        let refusal = match request.headers().get(REFUSAL) {
            // A client that sends the header itself is refused too: harmless, and it means
            // the header never travels upstream.
            Some(code) => {
                Some(Refusal::from_code(code.as_bytes()).unwrap_or(Refusal::MalformedHead))
            }
            None => conflict(request.headers()),
        };
        match refusal {
            Some(refusal) => {
                let peer = request.extensions().get::<PeerAddr>().map(|p| p.0);
                Err(refuse(refusal, peer))
            }
            None => Ok(()),
        }
    }
}

/// The problem+json answer to a refused request, closing the connection.
fn refuse(refusal: Refusal, peer: Option<std::net::SocketAddr>) -> Response<Body> {
    tracing::info!(
        reason = refusal.code(),
        // Absent rather than `Some(…)`: logs never show Rust's `Option` formatting.
        peer = peer.map(tracing::field::display),
        "request refused before routing"
    );
    metrics::counter!("requests_refused_total", "reason" => refusal.code()).increment(1);
    let (slug, title) = match refusal {
        Refusal::TooManyHeaders => ("headers-too-large", "Request header fields too large"),
        Refusal::UnsupportedTransferEncoding => (
            "unsupported-transfer-encoding",
            "Transfer coding not implemented",
        ),
        Refusal::UnsupportedVersion => ("unsupported-http-version", "HTTP version not supported"),
        r if r.is_framing() => ("conflicting-framing", "Ambiguous message framing"),
        _ => ("malformed-request", "Malformed request"),
    };
    // HTTP/1.1: hyper closes the connection after this response, so no byte left behind
    // by the ambiguous framing is ever read as a next request. (HTTP/2 strips the header;
    // there a refusal concerns one stream only.)
    Problem::new(
        refusal.status(),
        slug,
        title,
        format!(
            "{}; the request was refused and the connection is closed",
            refusal.detail()
        ),
    )
    .with("reason", refusal.code())
    .closing()
    .into_response()
}

/// Why the framing headers of a parsed request conflict, if they do.
pub fn conflict(headers: &HeaderMap) -> Option<Refusal> {
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    let first = lengths.next()?;
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return Some(Refusal::LengthWithTransferEncoding);
    }
    // Each field may itself be a list ("5, 5"); every element must be the same number.
    let mut seen: Option<&[u8]> = None;
    for value in std::iter::once(first).chain(lengths) {
        for element in value.as_bytes().split(|b| *b == b',') {
            let element = element.trim_ascii();
            match seen {
                None => seen = Some(element),
                Some(previous) if previous == element => {}
                Some(_) => return Some(Refusal::ConflictingLengths),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::step::StepLayer;
    use http::{HeaderValue, StatusCode};
    use tower::Layer;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn agreeing_or_absent_framing_passes() {
        assert_eq!(conflict(&headers(&[])), None);
        assert_eq!(conflict(&headers(&[("content-length", "5")])), None);
        assert_eq!(
            conflict(&headers(&[
                ("content-length", "5"),
                ("content-length", "5")
            ])),
            None
        );
        assert_eq!(conflict(&headers(&[("content-length", "5, 5")])), None);
        assert_eq!(
            conflict(&headers(&[("transfer-encoding", "chunked")])),
            None
        );
    }

    #[test]
    fn conflicting_framing_is_named() {
        let both = headers(&[("content-length", "5"), ("transfer-encoding", "chunked")]);
        assert_eq!(conflict(&both), Some(Refusal::LengthWithTransferEncoding));
        let two = headers(&[("content-length", "5"), ("content-length", "6")]);
        assert_eq!(conflict(&two), Some(Refusal::ConflictingLengths));
        let listed = headers(&[("content-length", "5, 6")]);
        assert_eq!(conflict(&listed), Some(Refusal::ConflictingLengths));
    }

    #[tokio::test]
    async fn the_layer_answers_400_and_closes() {
        use tower::ServiceExt;
        let inner = tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
        });
        let service = StepLayer::new(Smuggling).layer(inner);
        let mut request = Request::new(Body::empty());
        *request.headers_mut() = headers(&[("content-length", "1"), ("content-length", "2")]);
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let mut marked = Request::new(Body::empty());
        marked
            .headers_mut()
            .insert(REFUSAL_HEADER, HeaderValue::from_static("too-many-headers"));
        let response = service.clone().oneshot(marked).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let ok = service.oneshot(Request::new(Body::empty())).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
}
