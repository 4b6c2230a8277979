//! WebSockets over HTTP/2 (RFC 8441 extended CONNECT, `docs/websockets.md`) with a
//! hand-written client on the `h2` crate: messages through the gateway to the stock Python
//! echo server (which sees an HTTP/1.1 Upgrade handshake), the refused CONNECTs (none
//! reaches the upstream), the idle timeout and a drain closing the stream's tunnel with 1001,
//! and the setting advertised only when a route allows WebSockets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use h2::client::SendRequest;
use h2::ext::Protocol;
use h2::{RecvStream, SendStream};
use http::{Method, Request, StatusCode};
use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::tls::{self, TestCa};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::{config, header, Echo};
use crate::common::BIN;

/// Upper bound on any one wait of this client.
const WAIT: Duration = Duration::from_secs(10);

fn addr(gateway: &GatewayProcess) -> SocketAddr {
    let url = gateway.url();
    let authority = url.split_once("://").unwrap().1;
    authority.parse().unwrap()
}

/// An h2c connection (prior knowledge), after the gateway's SETTINGS.
async fn connect(gateway: &GatewayProcess) -> SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr(gateway)).await.unwrap();
    handshake(gateway, tcp).await
}

/// An HTTP/2 connection over TLS (ALPN `h2`, trusting `ca`), after the gateway's SETTINGS.
async fn connect_tls(gateway: &GatewayProcess, ca: &TestCa) -> SendRequest<Bytes> {
    let config = tls::client_config(&ca.pem(), &[b"h2"], true);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr(gateway)).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    handshake(gateway, stream).await
}

/// The HTTP/2 handshake on `io`; a first plain request has been answered when it returns,
/// so the peer's settings have been applied.
async fn handshake<T>(gateway: &GatewayProcess, io: T) -> SendRequest<Bytes>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, connection) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.unwrap();
    let probe = Request::get(format!("{}/healthz", gateway.url()))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(probe, true).unwrap();
    tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    client
}

/// An extended CONNECT for `path` with `:protocol` (when given) and `extra` fields.
fn connect_request(
    gateway: &GatewayProcess,
    path: &str,
    protocol: Option<&'static str>,
    extra: &[(&str, &str)],
) -> Request<()> {
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .uri(format!("{}{path}", gateway.url()));
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    if let Some(protocol) = protocol {
        request = request.extension(Protocol::from_static(protocol));
    }
    request.body(()).unwrap()
}

/// Sends `request` and returns the status, the client's send half and the response body.
async fn open(
    client: &mut SendRequest<Bytes>,
    request: Request<()>,
) -> (StatusCode, SendStream<Bytes>, RecvStream) {
    let mut client = client.clone().ready().await.unwrap();
    let (response, send) = client.send_request(request, false).unwrap();
    let response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    (response.status(), send, response.into_body())
}

/// A client frame (masked, final) with `opcode` and `payload`.
fn frame(opcode: u8, payload: &[u8]) -> Bytes {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n @ 0..=125 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    Bytes::from(f)
}

/// Reads server frames (unmasked) off the stream.
struct Frames {
    body: RecvStream,
    buf: BytesMut,
}

impl Frames {
    fn new(body: RecvStream) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
        }
    }

    /// The next frame's opcode and payload; `None` at the end of the stream.
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        for _ in 0..10_000 {
            if let Some(frame) = self.parse() {
                return Some(frame);
            }
            let data = tokio::time::timeout(WAIT, self.body.data())
                .await
                .expect("a frame in time")?
                .ok()?;
            let _ = self.body.flow_control().release_capacity(data.len());
            self.buf.extend_from_slice(&data);
        }
        panic!("no frame after 10000 reads");
    }

    fn parse(&mut self) -> Option<(u8, Vec<u8>)> {
        let b = &self.buf;
        if b.len() < 2 {
            return None;
        }
        assert_eq!(b[1] & 0x80, 0, "server frames are not masked");
        let (len, head) = match b[1] & 0x7f {
            126 if b.len() >= 4 => (usize::from(u16::from_be_bytes([b[2], b[3]])), 4),
            126 => return None,
            127 => panic!("no test frame is that long"),
            n => (usize::from(n), 2),
        };
        if b.len() < head + len {
            return None;
        }
        let opcode = b[0] & 0x0f;
        let payload = b[head..head + len].to_vec();
        self.buf.advance(head + len);
        Some((opcode, payload))
    }
}

/// The close frame's code and reason.
fn close_of(payload: &[u8]) -> (u16, String) {
    let code = u16::from_be_bytes([payload[0], payload[1]]);
    (code, String::from_utf8_lossy(&payload[2..]).into_owned())
}

#[tokio::test]
async fn messages_cross_an_http2_websocket_to_an_http1_upstream() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(BIN, &config(&echo, "", "")).await;
    let mut client = connect(&gateway).await;
    assert!(client.is_extended_connect_protocol_enabled());
    let request = connect_request(
        &gateway,
        "/ws/a/../chat?room=1",
        Some("websocket"),
        &[
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", "chat"),
        ],
    );
    let (status, mut send, body) = open(&mut client, request).await;
    // The echo server picks no subprotocol; it still answers 101.
    assert_eq!(status, StatusCode::OK);
    let mut frames = Frames::new(body);
    for i in 0..200 {
        let message = format!("message {i}");
        send.send_data(frame(0x1, message.as_bytes()), false)
            .unwrap();
        let (opcode, payload) = frames.next().await.expect("an echo");
        assert_eq!((opcode, payload), (0x1, message.into_bytes()));
    }
    // A message larger than one 16 KiB read of the tunnel.
    let big = vec![b'x'; 40_000];
    send.send_data(frame(0x2, &big), false).unwrap();
    let (opcode, payload) = frames.next().await.expect("the big echo");
    assert_eq!((opcode, payload.len()), (0x2, big.len()));
    // The closing handshake, then the end of the stream (the TCP close of HTTP/1.1).
    send.send_data(frame(0x8, &1000u16.to_be_bytes()), true)
        .unwrap();
    let (opcode, payload) = frames.next().await.expect("the close answer");
    assert_eq!((opcode, close_of(&payload).0), (0x8, 1000));

    let closed = echo.closed(1).await;
    assert_eq!(closed[0]["messages"], 201);
    assert_eq!(closed[0]["code"], 1000);
    let requests = echo.events("request");
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(
        request["path"], "/ws/chat?room=1",
        "normalised path upstream"
    );
    assert_eq!(header(request, "upgrade"), Some("websocket"));
    assert_eq!(header(request, "connection"), Some("upgrade"));
    assert_eq!(header(request, "sec-websocket-version"), Some("13"));
    assert_eq!(header(request, "sec-websocket-protocol"), Some("chat"));
    let key = header(request, "sec-websocket-key").expect("the gateway's own key");
    assert_eq!(key.len(), 24, "16 random bytes in base64: {key}");
    let metrics = crate::common::client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        "websocket_bytes_total{route=\"/ws\",tenant=\"anonymous\",direction=\"to_upstream\"}",
        "websocket_bytes_total{route=\"/ws\",tenant=\"anonymous\",direction=\"to_client\"}",
        "websockets_open{route=\"/ws\",tenant=\"anonymous\"}",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
}

#[tokio::test]
async fn an_http2_websocket_over_tls_alpn_h2_reaches_the_upstream() {
    let echo = Echo::start().await;
    let ca = TestCa::new("websocket h2 test CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server().write(dir.path(), "server");
    let text = config(
        &echo,
        "",
        &format!("\n[server.tls]\ncert = {cert:?}\nkey = {key:?}\n"),
    );
    let options = GatewayOptions {
        tls_ca: Some(ca.pem()),
        ..GatewayOptions::default()
    };
    let gateway = GatewayProcess::start_with(BIN, &text, options).await;
    let mut client = connect_tls(&gateway, &ca).await;
    let request = connect_request(
        &gateway,
        "/ws/tls",
        Some("websocket"),
        &[("sec-websocket-version", "13")],
    );
    let (status, mut send, body) = open(&mut client, request).await;
    assert_eq!(status, StatusCode::OK);
    let mut frames = Frames::new(body);
    for i in 0..20 {
        let message = format!("over tls {i}");
        send.send_data(frame(0x1, message.as_bytes()), false)
            .unwrap();
        assert_eq!(
            frames.next().await.expect("an echo").1,
            message.into_bytes()
        );
    }
    send.send_data(frame(0x8, &1000u16.to_be_bytes()), true)
        .unwrap();
    assert_eq!(frames.next().await.expect("the close answer").0, 0x8);
    let closed = echo.closed(1).await;
    assert_eq!(closed[0]["messages"], 20);
    let requests = echo.events("request");
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["path"], "/ws/tls");
    assert_eq!(header(&requests[0], "upgrade"), Some("websocket"));
    assert_eq!(header(&requests[0], "x-forwarded-proto"), Some("https"));
}

#[tokio::test]
async fn refused_connects_never_reach_the_upstream() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(BIN, &config(&echo, "", "")).await;
    let mut client = connect(&gateway).await;
    let version = [("sec-websocket-version", "13")];
    let cases = [
        // A route without websocket = true.
        (
            "/plain",
            Some("websocket"),
            &version[..],
            StatusCode::FORBIDDEN,
        ),
        // Another protocol, on a route that allows WebSockets.
        (
            "/ws",
            Some("connect-udp"),
            &version[..],
            StatusCode::NOT_IMPLEMENTED,
        ),
        // No Sec-WebSocket-Version: not a WebSocket handshake.
        (
            "/ws",
            Some("websocket"),
            &[][..],
            StatusCode::NOT_IMPLEMENTED,
        ),
    ];
    for (path, protocol, extra, expected) in cases {
        let request = connect_request(&gateway, path, protocol, extra);
        let (status, _send, _body) = open(&mut client, request).await;
        assert_eq!(status, expected, "{path} {protocol:?} {extra:?}");
    }
    // A classic CONNECT (no :protocol, authority-form): no generic tunnel.
    let authority = addr(&gateway).to_string();
    let request = Request::builder()
        .method(Method::CONNECT)
        .uri(authority.as_str())
        .body(())
        .unwrap();
    let (status, _send, _body) = open(&mut client, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // The connection still serves the next stream.
    let request = connect_request(&gateway, "/ws", Some("websocket"), &version);
    let (status, _send, _body) = open(&mut client, request).await;
    assert_eq!(status, StatusCode::OK);
    for _ in 0..200 {
        if !echo.events("request").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let requests = echo.events("request");
    assert_eq!(requests.len(), 1, "only the valid one reached the upstream");
    assert_eq!(requests[0]["path"], "/ws");
}

#[tokio::test]
async fn the_setting_is_not_advertised_without_a_websocket_route() {
    let echo = Echo::start().await;
    let text = config(&echo, "", "").replace("websocket = true\n", "");
    let gateway = GatewayProcess::start(BIN, &text).await;
    let client = connect(&gateway).await;
    assert!(!client.is_extended_connect_protocol_enabled());
}

#[tokio::test]
async fn an_idle_http2_tunnel_is_closed_with_1001_on_its_stream() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(&echo, "websocket_idle_timeout = \"300ms\"", ""),
    )
    .await;
    let mut client = connect(&gateway).await;
    let request = connect_request(
        &gateway,
        "/ws",
        Some("websocket"),
        &[("sec-websocket-version", "13")],
    );
    let (status, mut send, body) = open(&mut client, request).await;
    assert_eq!(status, StatusCode::OK);
    let mut frames = Frames::new(body);
    let (opcode, payload) = frames.next().await.expect("a close frame");
    assert_eq!(opcode, 0x8);
    assert_eq!(close_of(&payload), (1001, "idle timeout".to_owned()));
    let _ = send.send_data(frame(0x8, &1001u16.to_be_bytes()), true);
    assert_eq!(
        echo.closed(1).await[0]["code"],
        1001,
        "the upstream got it too"
    );
}

#[tokio::test]
async fn a_quiet_tunnel_keeps_its_http2_connection_past_the_keep_alive_timeout() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(
            &echo,
            "websocket_idle_timeout = \"30s\"",
            "keep_alive_timeout = \"1s\"",
        ),
    )
    .await;
    let mut client = connect(&gateway).await;
    let request = connect_request(
        &gateway,
        "/ws",
        Some("websocket"),
        &[("sec-websocket-version", "13")],
    );
    let (status, mut send, body) = open(&mut client, request).await;
    assert_eq!(status, StatusCode::OK);
    let mut frames = Frames::new(body);
    // Well past the keep-alive timeout (and the 1 s an idle close waits for its GOAWAY):
    // the tunnel's stream is a request in flight, so the connection is not idle.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    send.send_data(frame(0x1, b"still here"), false).unwrap();
    let (opcode, payload) = frames.next().await.expect("an echo");
    assert_eq!((opcode, payload), (0x1, b"still here".to_vec()));
    send.send_data(frame(0x8, &1000u16.to_be_bytes()), true)
        .unwrap();
    assert_eq!(echo.closed(1).await[0]["messages"], 1);
}

#[tokio::test]
async fn a_drain_closes_http2_tunnels_with_1001_within_the_grace() {
    let echo = Echo::start().await;
    let mut gateway =
        GatewayProcess::start(BIN, &config(&echo, "", "shutdown_grace = \"10s\"")).await;
    let mut client = connect(&gateway).await;
    let request = connect_request(
        &gateway,
        "/ws",
        Some("websocket"),
        &[("sec-websocket-version", "13")],
    );
    let (status, mut send, body) = open(&mut client, request).await;
    assert_eq!(status, StatusCode::OK);
    let mut frames = Frames::new(body);
    send.send_data(frame(0x1, b"before"), false).unwrap();
    assert_eq!(frames.next().await.expect("echo").1, b"before");
    gateway.guard().signal("TERM");
    let (opcode, payload) = frames.next().await.expect("a close frame");
    assert_eq!(opcode, 0x8);
    assert_eq!(
        close_of(&payload),
        (1001, "gateway shutting down".to_owned())
    );
    let _ = send.send_data(frame(0x8, &1001u16.to_be_bytes()), true);
    let status = gateway
        .guard()
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("gateway exits");
    assert!(status.success(), "{status:?}");
    assert_eq!(echo.closed(1).await[0]["code"], 1001);
}

/// A raw HTTP/1.1 upstream that answers each handshake as its path says — a 101 with a
/// wrong `Sec-WebSocket-Accept`, or a 200 that does not switch — and sends the request
/// heads it read on `heads`. Serves `connections` connections, then stops.
async fn lying_upstream(connections: usize) -> (SocketAddr, tokio::sync::mpsc::Receiver<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, heads) = tokio::sync::mpsc::channel(connections);
    tokio::spawn(async move {
        for _ in 0..connections {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let answer: &[u8] = if head.starts_with("GET /ws/bad-accept ") {
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            };
            let _ = stream.write_all(answer).await;
            let _ = tx.send(head).await;
        }
    });
    (addr, heads)
}

#[tokio::test]
async fn an_upstream_that_does_not_switch_properly_opens_no_http2_tunnel() {
    let (upstream, mut heads) = lying_upstream(2).await;
    let text = format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\n\n\
         [[upstreams]]\nname = \"liar\"\nendpoints = [\"http://{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nprefix = \"/ws\"\nupstream = \"liar\"\nwebsocket = true\n"
    );
    let gateway = GatewayProcess::start(BIN, &text).await;
    let mut client = connect(&gateway).await;
    for path in ["/ws/bad-accept", "/ws/no-switch"] {
        let request = connect_request(
            &gateway,
            path,
            Some("websocket"),
            &[("sec-websocket-version", "13")],
        );
        let (status, _send, _body) = open(&mut client, request).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{path}");
        let head = tokio::time::timeout(WAIT, heads.recv())
            .await
            .unwrap()
            .unwrap()
            .to_ascii_lowercase();
        assert!(
            head.starts_with(&format!("get {path} http/1.1\r\n")),
            "{head}"
        );
        assert!(head.contains("\r\nupgrade: websocket\r\n"), "{head}");
        assert!(head.contains("\r\nsec-websocket-key: "), "{head}");
    }
}
