//! Hop-by-hop fields (RFC 9110 §7.6.1): `Connection`, the fields it names, and the fixed
//! list `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
//! `Proxy-Authorization` / `Proxy-Authenticate`. They describe one connection and are never
//! forwarded.
//!
//! # Where they are removed, and why there
//!
//! - **The client's request, at the edge** ([`strip_client_request`], the top of the
//!   stack): before any layer adds or reads a header. Removing `Connection`-named fields
//!   after the pipeline (as the proxy once did) let a client name away the headers the
//!   gateway had just set — `Connection: Idempotency-Key` sent a keyed POST's retries
//!   without the key to a backend trusted to dedupe on it, so a payment could run twice.
//! - **Never the gateway's own fields.** A `Connection` token naming a header the gateway
//!   sets or relies on ([`PROTECTED`]) is ignored and the header kept: `Connection` is a
//!   statement about the client's connection to us, not a way to edit what the gateway
//!   forwards. Every other token follows RFC 9110. (nginx acts on no token at all; proxies
//!   that honour every token let clients strip `X-Forwarded-For` and the like.)
//! - **The upstream's response, in the proxy** ([`strip_upstream_response`]): innermost,
//!   before the outer layers add `X-RateLimit-*`, `RateLimit*`, `Retry-After`,
//!   `X-Request-Id` and `Idempotent-Replayed`, so an upstream cannot name those away either.
//! - **The gateway's own outgoing request**: nothing more. The edge already removed every
//!   client hop-by-hop field and no layer adds one, so the proxy does not scan again. The
//!   one exception is `te: trailers` ([`strip_client_request`]), which gRPC needs end to
//!   end: it reaches HTTP/2 upstreams only.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use portcullis_retry::{IDEMPOTENCY_KEY, X_REQUEST_DEADLINE, X_REQUEST_ID, X_RETRY_ATTEMPT};

/// Hop-by-hop fields by definition, whatever `Connection` says. `Proxy-Authorization` is
/// for the gateway itself (which asks for none) and `Proxy-Authenticate` is an upstream's
/// challenge to a proxy: neither is ever meant for the next hop.
static FIXED: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
];

/// Fields a client's `Connection` header can never remove: the ones the gateway sets or
/// relies on (idempotency key, tenant, request id, deadline, attempt, forwarded chain,
/// credentials) plus `Host` and `Content-Length`, which define the message hyper already
/// framed and the router matches on. (The tenant module's names are statics, which a static
/// cannot copy; a test keeps these spellings equal to theirs.)
static PROTECTED: [HeaderName; 13] = [
    IDEMPOTENCY_KEY,
    HeaderName::from_static("x-portcullis-tenant"),
    X_REQUEST_ID,
    X_REQUEST_DEADLINE,
    X_RETRY_ATTEMPT,
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-host"),
    header::FORWARDED,
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    header::HOST,
    header::CONTENT_LENGTH,
];

/// The edge: removes the client's hop-by-hop fields before any layer runs. Fields named in
/// `Connection` go too, except the [`PROTECTED`] ones. hyper has already read `Connection`
/// for its own keep-alive decision, so `close` still closes the client's connection.
///
/// One part of `TE` is kept: a client that lists `trailers` (every gRPC client, which
/// refuses to run without) leaves exactly `te: trailers`, the one `TE` HTTP/2 allows. The
/// proxy sends it to HTTP/2 upstreams and drops it toward HTTP/1.1 ones (see
/// `upstream::proxy`), as Envoy does; any other `TE` value or token is removed here.
pub(crate) fn strip_client_request<B>(mut request: http::Request<B>) -> http::Request<B> {
    // A WebSocket handshake is recorded first (`edge::upgrade`): the proxy writes its
    // `Upgrade` and `Connection` again toward a route that allows it.
    if crate::edge::upgrade::may_switch(&request) {
        crate::edge::upgrade::mark(&mut request);
    }
    let headers = request.headers_mut();
    for name in connection_named(headers) {
        if PROTECTED.contains(&name) {
            tracing::debug!(header = %name, "Connection names a gateway header; kept");
        } else {
            headers.remove(name);
        }
    }
    if headers.keys().any(is_fixed) {
        let trailers = lists_trailers(headers);
        remove_fixed(headers);
        if trailers {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }
    request
}

/// Whether a `TE` field lists the `trailers` token (`TE: trailers, deflate;q=0.5`).
fn lists_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("trailers"))
}

/// The proxy, on an upstream response: `Connection`, every field it names, and the fixed
/// list. Runs before the outer layers add the gateway's response headers.
pub(crate) fn strip_upstream_response(headers: &mut HeaderMap) {
    for name in connection_named(headers) {
        headers.remove(name);
    }
    strip_fixed(headers);
}

/// Removes only the fixed hop-by-hop list. Most messages carry none of it: one pass over
/// the few names present (compared, not hashed) decides, instead of nine hashed removals
/// on every request and every response.
fn strip_fixed(headers: &mut HeaderMap) {
    if headers.keys().any(is_fixed) {
        remove_fixed(headers);
    }
}

fn remove_fixed(headers: &mut HeaderMap) {
    for name in &FIXED {
        headers.remove(name);
    }
}

/// Whether `name` is in [`FIXED`]: one string match (by length, then bytes) rather than
/// nine `HeaderName` comparisons per field present.
fn is_fixed(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authorization"
            | "proxy-authenticate"
    )
}

/// The field names listed in every `Connection` header; tokens that are not valid field
/// names (or not text) are skipped, and so are `close`, `keep-alive`, `upgrade` and `te`
/// (which HTTP/1.1 requires beside `TE`), which name no field the fixed list does not
/// already handle. Allocates only when `Connection`
/// names some other field (the common `Connection: keep-alive` costs nothing).
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|token| {
            !["close", "keep-alive", "upgrade", "te", ""]
                .iter()
                .any(|common| token.eq_ignore_ascii_case(common))
        })
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_check_is_the_fixed_list() {
        for name in &FIXED {
            assert!(is_fixed(name), "{name}");
        }
        for name in [
            "host",
            "content-length",
            "x-te",
            "connections",
            "upgrade-insecure-requests",
        ] {
            assert!(!is_fixed(&HeaderName::from_static(name)), "{name}");
        }
    }

    fn request(pairs: &[(&str, &str)]) -> http::Request<()> {
        let mut builder = http::Request::builder();
        for (name, value) in pairs {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn client_fields_named_in_connection_are_removed() {
        let r = strip_client_request(request(&[
            ("connection", "close, X-Secret ,keep-alive, TE"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic Zm9v"),
            ("transfer-encoding", "chunked"),
            ("x-kept", "1"),
        ]));
        let names: Vec<_> = r.headers().keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-kept", "te"]);
        assert_eq!(r.headers()["te"], "trailers");
    }

    #[test]
    fn only_the_trailers_token_of_te_is_kept() {
        for (te, kept) in [
            ("trailers", true),
            ("gzip;q=0.5, Trailers", true),
            ("gzip, deflate", false),
            ("trailers-not", false),
        ] {
            let r = strip_client_request(request(&[("te", te), ("te", "chunked")]));
            let values: Vec<_> = r.headers().get_all("te").iter().collect();
            let want: &[&str] = if kept { &["trailers"] } else { &[] };
            assert_eq!(values, want, "{te}");
        }
    }

    #[test]
    fn gateway_fields_cannot_be_named_away() {
        let mut pairs = vec![(
            "connection",
            "Idempotency-Key, X-Portcullis-Tenant, X-Request-Id, X-Request-Deadline, X-Retry-Attempt, \
             X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host, Forwarded, Authorization, X-API-Key, Host, Content-Length",
        )];
        pairs.extend(PROTECTED.iter().map(|n| (n.as_str(), "v")));
        let r = strip_client_request(request(&pairs));
        for name in &PROTECTED {
            assert_eq!(r.headers()[name], "v", "{name}");
        }
        assert!(r.headers().get("connection").is_none());
    }

    #[test]
    fn protected_names_match_the_modules_that_own_them() {
        for name in [
            &crate::plumbing::headers::X_PORTCULLIS_TENANT,
            &crate::plumbing::headers::X_API_KEY,
            &crate::edge::request_id::X_REQUEST_ID,
            &portcullis_idempotency::key::IDEMPOTENCY_KEY,
        ] {
            assert!(PROTECTED.contains(name), "{name}");
        }
    }

    #[test]
    fn upstream_response_loses_connection_named_fields_and_fixed_ones() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            "x-ratelimit-remaining, x-private".parse().unwrap(),
        );
        h.insert("x-ratelimit-remaining", "999".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("proxy-authenticate", "Basic".parse().unwrap());
        h.insert("trailer", "x-sum".parse().unwrap());
        h.insert("content-type", "text/plain".parse().unwrap());
        strip_upstream_response(&mut h);
        let names: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type"]);
    }

    #[test]
    fn fixed_list_ignores_connection_tokens() {
        let mut h = HeaderMap::new();
        h.insert("connection", "x-request-id".parse().unwrap());
        h.insert("x-request-id", "abc".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        strip_fixed(&mut h);
        let names: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-request-id"]);
    }

    proptest::proptest! {
        // Arbitrary client Connection values never panic and never remove a protected field.
        #[test]
        fn arbitrary_connection_values_keep_protected_fields(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..120)) {
            let mut r = request(&[("x-request-id", "id"), ("idempotency-key", "k")]);
            if let Ok(v) = http::HeaderValue::from_bytes(&bytes) {
                r.headers_mut().insert("connection", v);
            }
            let r = strip_client_request(r);
            proptest::prop_assert_eq!(&r.headers()["x-request-id"], "id");
            proptest::prop_assert_eq!(&r.headers()["idempotency-key"], "k");
        }
    }
}
