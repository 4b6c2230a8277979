//! The request an attempt sends: the client's, rewritten for the chosen endpoint (target,
//! `Host`, `X-Forwarded-*`).

use axum::body::Body;
use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{HeaderMap, Request, Uri};

use super::{ProxyError, ProxyErrorKind};
use crate::config::{HeaderVars, PathRule};
use crate::edge::listener::ClientTls;
use crate::edge::request_id::X_REQUEST_ID;
use crate::plumbing::client::IpText;
use crate::plumbing::client::{Client, CLIENT_ADDRESS_FIELDS};
use crate::plumbing::context::{Caller, RequestContext};
use crate::upstream::balance::Address;

/// Rewrites the request for the chosen endpoint.
///
/// Toward an HTTP/2 upstream (`http2`) the endpoint travels in `:authority` alone (from the
/// target, as hyper writes it) and no `Host` goes beside it: RFC 9113 §8.3.1 prefers
/// `:authority`, and servers such as nginx refuse a request carrying both as a duplicate
/// Host. The client's `te: trailers` (kept by the edge, see `edge::hop_by_hop`) goes to
/// HTTP/2 upstreams, where gRPC servers require it, and never to HTTP/1.1 ones.
pub(super) fn prepare(
    request: Request<Body>,
    context: &RequestContext,
    address: &Address,
    index: usize,
    http2: bool,
) -> Result<Request<Body>, ProxyError> {
    let (mut parts, body) = request.into_parts();
    let (scheme, authority) = (address.scheme.clone(), address.authority.clone());
    let route = &context.route.settings;
    let path_and_query = upstream_path(&parts.uri, &route.path, route.rewrite.as_deref());
    let client_tls = parts.extensions.get::<ClientTls>().is_some();
    // HTTP/2 clients send :authority instead of Host.
    let original_host = parts.headers.get(header::HOST).cloned().or_else(|| {
        let authority = parts.uri.authority()?;
        HeaderValue::from_str(authority.as_str()).ok()
    });
    parts.uri = Uri::from_parts({
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(scheme);
        uri.authority = Some(authority);
        uri.path_and_query = Some(path_and_query);
        uri
    })
    .map_err(|_| ProxyError::new(ProxyErrorKind::NoRoute, Some(index)))?;
    parts.version = http::Version::HTTP_11;

    // The client's hop-by-hop fields (the fixed list, `Connection` and what it named) went
    // at the edge, and no layer since adds one: nothing to strip again on this hop, except
    // the `te: trailers` the edge kept, which HTTP/1.1 upstreams do not get.
    if http2 {
        parts.headers.remove(header::HOST);
    } else {
        parts.headers.insert(header::HOST, address.host.clone());
        parts.headers.remove(header::TE);
    }
    let client = &context.client;
    if !client.peer_trusted {
        strip_client_address_fields(&mut parts.headers);
    }
    if let Some(value) = forwarded_for(client, &parts.headers) {
        parts.headers.insert(X_FORWARDED_FOR.clone(), value);
    }
    if !(client.peer_trusted && parts.headers.contains_key(&X_FORWARDED_PROTO)) {
        let proto = if client_tls { "https" } else { "http" };
        parts
            .headers
            .insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
    }
    if !(client.peer_trusted && parts.headers.contains_key(&X_FORWARDED_HOST)) {
        match original_host {
            Some(host) => {
                parts.headers.insert(X_FORWARDED_HOST.clone(), host);
            }
            None => {
                parts.headers.remove(&X_FORWARDED_HOST);
            }
        }
    }
    // Last, over the gateway's own fields, which no rule may name (see
    // `config::routes::header_rules`).
    if let Some(rules) = &route.request_headers {
        let request_id = parts.headers.get(&X_REQUEST_ID).cloned();
        rules.apply(
            &mut parts.headers,
            &header_vars(context, request_id.as_ref()),
        );
    }
    Ok(Request::from_parts(parts, body))
}

/// The values of a header rule's variables for this request.
pub(super) fn header_vars<'a>(
    context: &'a RequestContext,
    request_id: Option<&'a HeaderValue>,
) -> HeaderVars<'a> {
    HeaderVars {
        request_id,
        tenant: match &context.caller {
            Caller::Tenant(tenant) => Some(&tenant.id),
            Caller::Anonymous => None,
        },
        client_ip: context.client.ip,
        route: &context.route.settings.name,
    }
}

/// The `X-Forwarded-For` to send (see [`Client::forwarded_for`]). Usually only the peer:
/// formatted on the stack, so the value is the one allocation.
fn forwarded_for(client: &Client, headers: &HeaderMap) -> Option<HeaderValue> {
    if client.peer_trusted && headers.contains_key(&X_FORWARDED_FOR) {
        return HeaderValue::from_str(&client.forwarded_for(headers)).ok();
    }
    HeaderValue::from_bytes(IpText::new(client.peer).as_bytes()).ok()
}

/// Removes the fields that name the client's address other than `X-Forwarded-For` (which is
/// rewritten instead): from a peer that is not a trusted proxy they are whatever the client
/// chose (see [`CLIENT_ADDRESS_FIELDS`]). One pass over the names first, so the usual request
/// without any costs no lookups.
fn strip_client_address_fields(headers: &mut HeaderMap) {
    if headers
        .keys()
        .any(|name| CLIENT_ADDRESS_FIELDS.contains(&name.as_str()))
    {
        for name in CLIENT_ADDRESS_FIELDS {
            headers.remove(*name);
        }
    }
}

/// The path the upstream receives: as the client sent it (normalised), or with the matched
/// prefix replaced by `rewrite` — on an `exact` route the whole path. `strip_prefix` arrives
/// here as `rewrite = "/"`. The replacement and the rest always meet at one `/`
/// (`/api` + `/v2` on `/api/x` → `/v2/x`, not `/v2//x` or `/v2x`).
fn upstream_path(uri: &Uri, path: &PathRule, rewrite: Option<&str>) -> PathAndQuery {
    let original = || {
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"))
    };
    let Some(rewrite) = rewrite else {
        // The common case: the original target, shared rather than re-formatted.
        return original();
    };
    let rest = match path {
        // The router matched on a segment boundary, so the rest is empty or starts with
        // `/` or `;`.
        PathRule::Prefix(prefix) => uri
            .path()
            .strip_prefix(prefix.trim_end_matches('/'))
            .unwrap_or(uri.path()),
        PathRule::Exact(_) => "",
        // Refused by validation.
        PathRule::Pattern(_) => return original(),
    };
    let mut full = if rest.is_empty() {
        rewrite.to_owned()
    } else {
        format!("{}{rest}", rewrite.trim_end_matches('/'))
    };
    if !full.starts_with('/') {
        full.insert(0, '/');
    }
    if let Some(query) = uri.query() {
        full.push('?');
        full.push_str(query);
    }
    full.parse()
        .unwrap_or_else(|_| PathAndQuery::from_static("/"))
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_is_the_peer_or_the_trusted_chain_plus_the_peer() {
        let client = |peer: &str, peer_trusted| Client {
            ip: peer.parse().unwrap(),
            peer: peer.parse().unwrap(),
            peer_trusted,
        };
        let mut chain = HeaderMap::new();
        chain.insert(
            X_FORWARDED_FOR.clone(),
            HeaderValue::from_static("203.0.113.9"),
        );
        let longest = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        for (client, headers, want) in [
            (client("10.0.0.1", false), &chain, "10.0.0.1"),
            (client(longest, false), &chain, longest),
            (client("10.0.0.1", true), &HeaderMap::new(), "10.0.0.1"),
            (client("10.0.0.1", true), &chain, "203.0.113.9, 10.0.0.1"),
        ] {
            let got = forwarded_for(&client, headers).unwrap();
            assert_eq!(got, want);
            assert_eq!(got, client.forwarded_for(headers).as_str());
        }
    }

    #[test]
    fn client_address_fields_are_stripped_and_others_kept() {
        let mut headers = HeaderMap::new();
        for name in CLIENT_ADDRESS_FIELDS {
            headers.append(*name, HeaderValue::from_static("1.2.3.4"));
            headers.append(*name, HeaderValue::from_static("5.6.7.8"));
        }
        headers.insert("x-other", HeaderValue::from_static("kept"));
        strip_client_address_fields(&mut headers);
        assert_eq!(headers.len(), 1);
        assert_eq!(headers["x-other"], "kept");
    }

    #[test]
    fn paths_with_and_without_stripping() {
        let prefix = PathRule::Prefix("/orders".into());
        let uri: Uri = "/orders/7?x=1".parse().unwrap();
        assert_eq!(upstream_path(&uri, &prefix, None).as_str(), "/orders/7?x=1");
        assert_eq!(upstream_path(&uri, &prefix, Some("/")).as_str(), "/7?x=1");
        let root: Uri = "/orders".parse().unwrap();
        assert_eq!(upstream_path(&root, &prefix, Some("/")).as_str(), "/");
        let matrix: Uri = "/orders;v=1/7".parse().unwrap();
        assert_eq!(
            upstream_path(&matrix, &prefix, Some("/")).as_str(),
            "/;v=1/7"
        );
    }

    #[test]
    fn rewrites_replace_the_matched_prefix_at_one_slash() {
        let prefix = PathRule::Prefix("/api".into());
        let slashed = PathRule::Prefix("/api/".into());
        for (rule, rewrite, from, to) in [
            (&prefix, "/v2", "/api/orders?a=b", "/v2/orders?a=b"),
            (&prefix, "/v2/", "/api/orders", "/v2/orders"),
            (&prefix, "/v2", "/api", "/v2"),
            (&prefix, "/v2/", "/api", "/v2/"),
            (&prefix, "/v2", "/api;k=v/x", "/v2;k=v/x"),
            (&slashed, "/v2", "/api/orders", "/v2/orders"),
            (&slashed, "/v2/", "/api/", "/v2/"),
            (&PathRule::Prefix("/".into()), "/base", "/x/y", "/base/x/y"),
            (
                &PathRule::Exact("/old".into()),
                "/new/place",
                "/old?q=1",
                "/new/place?q=1",
            ),
        ] {
            let uri: Uri = from.parse().unwrap();
            assert_eq!(
                upstream_path(&uri, rule, Some(rewrite)).as_str(),
                to,
                "{from} via {rewrite}"
            );
        }
    }
}
