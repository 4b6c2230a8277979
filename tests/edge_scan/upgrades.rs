//! Upgrade cases: protocol-switch requests against a raw upstream that records every head it
//! receives. Nothing ambiguous may reach it: no `Upgrade` toward a route without
//! `websocket = true`, no switch on `h2c` or on a request with a body, and an upstream's 101
//! is either a clean tunnel (websocket route) or a 502 — never a half-switched connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::BIN;

/// An upstream that records each request head and answers 200, or, for a path ending in
/// `/switch`, `101` with a `Content-Length` and five bytes after it.
struct RawUpstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RawUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = heads.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // At most 16 requests per connection, each bounded by the reads.
                    for _ in 0..16 {
                        let end = loop {
                            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break at + 4;
                            }
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        while buf.len() < end + length {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let body = String::from_utf8_lossy(&buf[end..end + length]).into_owned();
                        buf.drain(..end + length);
                        let switch = head.lines().next().is_some_and(|l| l.contains("/switch "));
                        recorded.lock().unwrap().push(head + &body);
                        if switch {
                            let _ = stream
                                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nContent-Length: 5\r\n\r\nhello")
                                .await;
                            // Holds the connection as a tunnel peer would.
                            let _ = stream.read(&mut chunk).await;
                            return;
                        }
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await;
                    }
                });
            }
        });
        Self { addr, heads, task }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn config(upstream: SocketAddr) -> String {
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"

[[upstreams]]
name = "u"
endpoints = ["http://{upstream}"]
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/ws"
upstream = "u"
websocket = true
websocket_idle_timeout = "300ms"

[[routes]]
prefix = "/"
upstream = "u"
"#
    )
}

const HANDSHAKE: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
const CLOSE: &[u8] = b"GET /after HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// Statuses of the HTTP/1.1 responses in `answer`, in order.
fn statuses(answer: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(answer);
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| text.get(at + 9..at + 12)?.parse().ok())
        .collect()
}

#[tokio::test]
async fn upgrade_requests_leave_nothing_ambiguous_upstream() {
    let upstream = RawUpstream::start().await;
    let gateway = GatewayProcess::start(BIN, &config(upstream.addr)).await;
    let addr = gateway.addr;
    let mut failures = Vec::new();
    let mut check = |name: &str, ok: bool, detail: String| {
        if !ok {
            failures.push(format!("{name}: {detail}"));
        }
    };

    // A handshake to a route that does not allow it, then a pipelined request.
    let before = upstream.heads().len();
    let request = [
        format!("GET /plain HTTP/1.1\r\nHost: localhost\r\n{HANDSHAKE}\r\n").as_bytes(),
        CLOSE,
    ]
    .concat();
    let answer = raw_request(addr, &request).await.unwrap_or_default();
    let heads = upstream.heads()[before..].to_vec();
    check(
        "upgrade-to-plain-route",
        statuses(&answer) == [200, 200]
            && heads.len() == 2
            && heads.iter().all(|h| !h.contains("upgrade")),
        format!("{:?} / {heads:?}", String::from_utf8_lossy(&answer)),
    );

    // A handshake with a body: not a handshake; served as a plain request.
    let before = upstream.heads().len();
    let request = [
        format!("POST /ws/chat HTTP/1.1\r\nHost: localhost\r\n{HANDSHAKE}Content-Length: 5\r\n\r\nhello").as_bytes(),
        CLOSE,
    ]
    .concat();
    let answer = raw_request(addr, &request).await.unwrap_or_default();
    let heads = upstream.heads()[before..].to_vec();
    check(
        "upgrade-with-body",
        statuses(&answer) == [200, 200]
            && heads.len() == 2
            && !heads[0].contains("upgrade")
            && heads[0].ends_with("hello"),
        format!("{:?} / {heads:?}", String::from_utf8_lossy(&answer)),
    );

    // h2c upgrade headers, then the HTTP/2 preface a client sends after a 101.
    let before = upstream.heads().len();
    let request = [
        &b"GET /h2c HTTP/1.1\r\nHost: localhost\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n"[..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ]
    .concat();
    let answer = raw_request(addr, &request).await.unwrap_or_default();
    let heads = upstream.heads()[before..].to_vec();
    let answered = statuses(&answer);
    check(
        "h2c-upgrade",
        answered.first() == Some(&200)
            && !answered.contains(&101)
            && heads.len() == 1
            && !heads[0].contains("upgrade")
            && !heads[0].contains("http2-settings"),
        format!("{:?} / {heads:?}", String::from_utf8_lossy(&answer)),
    );

    // An upstream 101 (with a body) to a request that did not ask: 502, connection closed.
    let answer = raw_request(
        addr,
        b"GET /plain/switch HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap_or_default();
    check(
        "101-unasked",
        statuses(&answer) == [502],
        format!("{:?}", String::from_utf8_lossy(&answer)),
    );

    // The same 101 to a forwarded handshake: a clean switch; the five bytes after the head
    // are the tunnel's, and the 101 the client sees declares no length.
    let request = format!("GET /ws/switch HTTP/1.1\r\nHost: localhost\r\n{HANDSHAKE}\r\n");
    let answer = raw_request(addr, request.as_bytes())
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let head_end = text.find("\r\n\r\n").map_or(0, |at| at + 4);
    check(
        "101-with-body",
        parse_status(&answer) == Some(101)
            && !text[..head_end].contains("content-length")
            && text[head_end..].starts_with("hello"),
        format!("{text:?}"),
    );

    assert!(failures.is_empty(), "{failures:#?}");
}
