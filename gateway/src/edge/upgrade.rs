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

use http::header::{self, HeaderMap};
use http::{Method, Request, Version};
use hyper::upgrade::OnUpgrade;
use tokio::sync::{mpsc, watch};

/// Request extension, HTTP/1 connections only, on the requests hyper offers a switch: what
/// ties a tunnel opened from the request to its connection — the listener's stop signal
/// (a drain closes tunnels with 1001) and a hold that keeps the connection counted (its
/// slot, the drain's wait) until the tunnel ends.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionHold {
    stop: watch::Receiver<bool>,
    _open: mpsc::Sender<()>,
}

/// Request extension: a valid WebSocket handshake (see the module docs), with the means to
/// take over its client connection once the upstream answers 101.
#[derive(Debug, Clone)]
pub(crate) struct WebSocketHandshake {
    /// The client connection, once hyper has written the 101.
    pub(crate) on_upgrade: OnUpgrade,
    /// Its connection's drain signal and slot.
    pub(crate) hold: ConnectionHold,
}

// === impl ConnectionHold ===

impl ConnectionHold {
    /// A hold on a connection; the connection waits for `open`'s receiver to see every
    /// sender gone before it ends.
    pub(crate) fn new(stop: watch::Receiver<bool>, open: mpsc::Sender<()>) -> Self {
        Self { stop, _open: open }
    }

    /// Resolves once the listener drains (or is gone).
    pub(crate) async fn draining(&mut self) {
        let _ = self.stop.wait_for(|stop| *stop).await;
    }
}

/// Records a valid WebSocket handshake as a [`WebSocketHandshake`] (the edge, before the
/// hop-by-hop fields go).
pub(crate) fn mark<B>(request: &mut Request<B>) {
    if request.method() != Method::GET || request.version() != Version::HTTP_11 {
        return;
    }
    let extensions = request.extensions();
    let (Some(on_upgrade), Some(hold)) = (
        extensions.get::<OnUpgrade>(),
        extensions.get::<ConnectionHold>(),
    ) else {
        return;
    };
    if !is_handshake(request.headers()) {
        return;
    }
    let handshake = WebSocketHandshake {
        on_upgrade: on_upgrade.clone(),
        hold: hold.clone(),
    };
    request.extensions_mut().insert(handshake);
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

    #[test]
    fn a_request_hyper_offered_no_switch_is_not_marked() {
        let mut request = Request::get("/").body(()).unwrap();
        *request.headers_mut() = handshake(&VALID);
        request.extensions_mut().insert(hold());
        mark(&mut request);
        assert!(request.extensions().get::<WebSocketHandshake>().is_none());
    }
}
