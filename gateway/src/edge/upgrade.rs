//! WebSocket handshakes at the edge: which requests may become a tunnel, and what ties a
//! tunnel to the connection it came from. The tunnel itself is the upstream's
//! (`upstream::websocket`); the choices are described in `docs/websockets.md`.
//!
//! A request is a WebSocket handshake when it is what RFC 6455 §4.2.1 describes — `GET`,
//! HTTP/1.1, `Upgrade` naming `websocket`, `Connection` naming `upgrade`, one
//! `Sec-WebSocket-Key`, a `Sec-WebSocket-Version` — with no body, on an HTTP/1 connection
//! that hyper offered the switch. [`mark`] records that in a [`WebSocketHandshake`]
//! extension before the hop-by-hop fields (`Upgrade`, `Connection`) are removed with every
//! other request's; the proxy writes them again only toward a route with
//! `websocket = true`. Any other `Upgrade` (h2c, a handshake with a body, HTTP/1.0) loses
//! the field like any hop-by-hop field and is served as a plain request.
//!
//! Over HTTP/2 the handshake is RFC 8441's extended CONNECT: `CONNECT` with
//! `:protocol = websocket`, a `:path`, a `Sec-WebSocket-Version` and no body, on a
//! connection that advertised `SETTINGS_ENABLE_CONNECT_PROTOCOL` (only when some route has
//! `websocket = true`). [`mark`] records it with [`Form::Http2`] and turns its method into
//! `GET`, the method of the HTTP/1.1 handshake it becomes toward the upstream, so routing,
//! method rules and the access log see one kind of handshake. Any other CONNECT is left as
//! it is and refused before routing ends (`pipeline::websocket`): the gateway opens no
//! generic tunnel.

use std::sync::Arc;

use http::header::{self, HeaderMap};
use http::{Method, Request, Version};
use hyper::ext::Protocol;
use hyper::upgrade::OnUpgrade;
use tokio::sync::{mpsc, watch};

use crate::edge::listener::activity::Busy;

/// Request extension, HTTP/1 connections only, on the requests hyper offers a switch: what
/// ties a tunnel opened from the request to its connection — the listener's stop signal
/// (a drain closes tunnels with 1001) and a hold that keeps the connection counted (its
/// slot, the drain's wait) until the tunnel ends.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionHold {
    stop: watch::Receiver<bool>,
    _open: mpsc::Sender<()>,
    /// HTTP/2: the stream counts as a request in flight while a tunnel runs on it, so the
    /// connection is neither idle-closed nor reclaimed under it (an HTTP/1 connection hands
    /// its whole socket to the tunnel instead).
    _busy: Option<Arc<Busy>>,
}

/// How the client asked for the WebSocket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// HTTP/1.1 `GET` with `Upgrade: websocket`; answered `101`.
    Http1,
    /// HTTP/2 extended CONNECT (RFC 8441); answered `200`, the stream becomes the tunnel.
    Http2,
}

/// Request extension: a valid WebSocket handshake (see the module docs), with the means to
/// take over its client connection once the upstream answers 101.
#[derive(Debug, Clone)]
pub(crate) struct WebSocketHandshake {
    /// The client connection, once hyper has written the 101.
    pub(crate) on_upgrade: OnUpgrade,
    /// Its connection's drain signal and slot.
    pub(crate) hold: ConnectionHold,
    /// HTTP/1.1 upgrade or HTTP/2 extended CONNECT.
    pub(crate) form: Form,
}

// === impl ConnectionHold ===

impl ConnectionHold {
    /// A hold on a connection; the connection waits for `open`'s receiver to see every
    /// sender gone before it ends.
    pub(crate) fn new(stop: watch::Receiver<bool>, open: mpsc::Sender<()>) -> Self {
        Self {
            stop,
            _open: open,
            _busy: None,
        }
    }

    /// The hold of one HTTP/2 stream that may become a tunnel: it also keeps the stream
    /// counted in flight (`busy`).
    pub(crate) fn with_busy(&self, busy: Busy) -> Self {
        Self {
            _busy: Some(Arc::new(busy)),
            ..self.clone()
        }
    }

    /// Resolves once the listener drains (or is gone).
    pub(crate) async fn draining(&mut self) {
        let _ = self.stop.wait_for(|stop| *stop).await;
    }
}

/// Records a valid WebSocket handshake as a [`WebSocketHandshake`] (the edge, before the
/// hop-by-hop fields go); an HTTP/2 one becomes a `GET`.
pub(crate) fn mark<B>(request: &mut Request<B>) {
    let form = match (request.method(), request.version()) {
        (&Method::GET, Version::HTTP_11) => Form::Http1,
        (&Method::CONNECT, Version::HTTP_2) => Form::Http2,
        _ => return,
    };
    let extensions = request.extensions();
    let (Some(on_upgrade), Some(hold)) = (
        extensions.get::<OnUpgrade>(),
        extensions.get::<ConnectionHold>(),
    ) else {
        return;
    };
    let valid = match form {
        Form::Http1 => is_handshake(request.headers()),
        Form::Http2 => is_extended_connect(request),
    };
    if !valid {
        return;
    }
    let handshake = WebSocketHandshake {
        on_upgrade: on_upgrade.clone(),
        hold: hold.clone(),
        form,
    };
    request.extensions_mut().insert(handshake);
    if form == Form::Http2 {
        *request.method_mut() = Method::GET;
    }
}

/// An RFC 8441 WebSocket: `:protocol = websocket`, a `:path`, a `Sec-WebSocket-Version`,
/// no body announced (hyper resets a CONNECT stream that announces one).
fn is_extended_connect<B>(request: &Request<B>) -> bool {
    let headers = request.headers();
    request
        .extensions()
        .get::<Protocol>()
        .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
        && request.uri().path_and_query().is_some()
        && headers.contains_key(header::SEC_WEBSOCKET_VERSION)
        && headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .all(|v| v.as_bytes() == b"0")
}

/// Whether the edge should look at `request` for a handshake (an `Upgrade` field, or a
/// CONNECT): one lookup and one comparison on every request.
pub(crate) fn may_switch<B>(request: &Request<B>) -> bool {
    request.method() == Method::CONNECT || request.headers().contains_key(header::UPGRADE)
}

/// The fields of a WebSocket opening handshake, and no body.
fn is_handshake(headers: &HeaderMap) -> bool {
    let names = |name: header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    let no_body = !headers.contains_key(header::TRANSFER_ENCODING)
        && headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .all(|v| v.as_bytes() == b"0");
    no_body
        && names(header::UPGRADE, "websocket")
        && names(header::CONNECTION, "upgrade")
        && headers.get_all(header::SEC_WEBSOCKET_KEY).iter().count() == 1
        && headers.contains_key(header::SEC_WEBSOCKET_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold() -> ConnectionHold {
        let (_stop_tx, stop) = watch::channel(false);
        let (open, _rx) = mpsc::channel(1);
        ConnectionHold::new(stop, open)
    }

    fn handshake(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        h
    }

    const VALID: [(&str, &str); 4] = [
        ("upgrade", "websocket"),
        ("connection", "keep-alive, Upgrade"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
    ];

    #[test]
    fn only_complete_bodiless_handshakes_count() {
        assert!(is_handshake(&handshake(&VALID)));
        for missing in VALID {
            let fewer: Vec<_> = VALID.into_iter().filter(|p| *p != missing).collect();
            assert!(!is_handshake(&handshake(&fewer)), "without {missing:?}");
        }
        let mut with_body = VALID.to_vec();
        with_body.push(("content-length", "5"));
        assert!(!is_handshake(&handshake(&with_body)));
        let mut chunked = VALID.to_vec();
        chunked.push(("transfer-encoding", "chunked"));
        assert!(!is_handshake(&handshake(&chunked)));
        let mut two_keys = VALID.to_vec();
        two_keys.push(("sec-websocket-key", "x"));
        assert!(!is_handshake(&handshake(&two_keys)));
        let mut h2c = VALID.to_vec();
        h2c[0] = ("upgrade", "h2c");
        assert!(!is_handshake(&handshake(&h2c)));
    }

    fn extended_connect(protocol: Option<&'static str>, version: bool) -> Request<()> {
        let mut request = Request::builder()
            .method(Method::CONNECT)
            .version(Version::HTTP_2)
            .uri("https://example.com/chat")
            .body(())
            .unwrap();
        if version {
            request
                .headers_mut()
                .insert(header::SEC_WEBSOCKET_VERSION, "13".parse().unwrap());
        }
        if let Some(protocol) = protocol {
            request
                .extensions_mut()
                .insert(Protocol::from_static(protocol));
        }
        request
    }

    #[test]
    fn only_websocket_with_a_version_is_an_http2_handshake() {
        assert!(is_extended_connect(&extended_connect(
            Some("websocket"),
            true
        )));
        assert!(is_extended_connect(&extended_connect(
            Some("WebSocket"),
            true
        )));
        for (protocol, version) in [
            (Some("connect-udp"), true),
            (Some("websocket"), false),
            (None, true),
        ] {
            let request = extended_connect(protocol, version);
            assert!(!is_extended_connect(&request), "{protocol:?} {version}");
        }
    }

    #[test]
    fn a_request_hyper_offered_no_switch_is_not_marked() {
        let mut request = Request::get("/").body(()).unwrap();
        *request.headers_mut() = handshake(&VALID);
        request.extensions_mut().insert(hold());
        mark(&mut request);
        assert!(request.extensions().get::<WebSocketHandshake>().is_none());
    }
}
