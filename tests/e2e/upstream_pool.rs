//! The plain HTTP/1.1 upstream pool, seen from a raw upstream that numbers its connections:
//! sequential requests share one keep-alive connection; a connection the upstream closed
//! while idle (its idle timeout, a restart) is never handed to a request, so a POST with no
//! retries configured still reaches the upstream exactly once; and a client that goes away
//! in the middle of a response body does not leave a half-read connection in the pool.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::common::{single_route_config, BIN};

/// Largest request head the raw upstream reads.
const MAX_HEAD: usize = 16 * 1024;
/// The length `/big` announces; it sends it in `CHUNK`s, one every few milliseconds.
const BIG: usize = 1 << 20;
const CHUNK: usize = 8 * 1024;

/// What the upstream received: (connection number, request target, request body).
type Seen = Arc<Mutex<Vec<(usize, String, Vec<u8>)>>>;

/// A raw HTTP/1.1 upstream answering `200 ok` with keep-alive (and `/big` with a slow 1 MiB
/// body). It closes every idle connection when `close_idle` changes; `closed` counts the
/// connections that ended (closed by it or by the gateway).
struct RawUpstream {
    addr: SocketAddr,
    seen: Seen,
    close_idle: watch::Sender<u64>,
    closed: watch::Receiver<usize>,
}

impl RawUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Seen::default();
        let (close_idle, close_rx) = watch::channel(0u64);
        let (closed_tx, closed) = watch::channel(0usize);
        let closed_tx = Arc::new(closed_tx);
        let seen2 = seen.clone();
        tokio::spawn(async move {
            let mut number = 0;
            while let Ok((socket, _)) = listener.accept().await {
                number += 1;
                let (seen, close, closed) = (seen2.clone(), close_rx.clone(), closed_tx.clone());
                tokio::spawn(async move {
                    serve(socket, number, seen, close).await;
                    closed.send_modify(|n| *n += 1);
                });
            }
        });
        Self {
            addr,
            seen,
            close_idle,
            closed,
        }
    }

    fn seen(&self) -> Vec<(usize, String, Vec<u8>)> {
        self.seen.lock().unwrap().clone()
    }

    fn connections(&self) -> usize {
        self.seen().iter().map(|(c, _, _)| *c).max().unwrap_or(0)
    }

    /// Waits (bounded) until `n` connections in all have ended.
    async fn wait_closed(&mut self, n: usize) {
        let wait = self.closed.wait_for(|closed| *closed >= n);
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("the upstream connections end")
            .unwrap();
    }

    /// Closes every idle connection and waits until `n` connections in all have ended.
    async fn close_idle_connections(&mut self, n: usize) {
        self.close_idle.send_modify(|k| *k += 1);
        self.wait_closed(n).await;
    }
}

/// One upstream connection: answers requests until told to close while idle, or the peer goes.
async fn serve(mut socket: TcpStream, number: usize, seen: Seen, mut close: watch::Receiver<u64>) {
    // Close orders given before this connection existed are not for it.
    close.borrow_and_update();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Bounded: a test sends a few dozen requests per connection at most.
    for _ in 0..1000 {
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if buf.len() > MAX_HEAD {
                return;
            }
            let n = tokio::select! {
                read = socket.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                _ = close.changed(), if buf.is_empty() => return,
            };
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let target = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let length: usize = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = buf[head_end..head_end + length].to_vec();
        buf.drain(..head_end + length);
        seen.lock().unwrap().push((number, target.clone(), body));
        if target == "/big" {
            send_big(&mut socket).await;
            // Only a gateway that went away ends the slow body early.
            return;
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok";
        if socket.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// `/big`: a 1 MiB body in 8 KiB chunks, one every 5 ms, until done or the peer is gone.
async fn send_big(socket: &mut TcpStream) {
    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n");
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for _ in 0..BIG / CHUNK {
        if socket.write_all(&[b'x'; CHUNK]).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn gateway(upstream: &RawUpstream) -> GatewayProcess {
    gateway_with_workers(upstream, 1).await
}

/// One worker by default: each worker keeps its own pool (as each nginx worker keeps its
/// own `keepalive` cache), so with more, client connections accepted by different workers
/// use different upstream connections.
async fn gateway_with_workers(upstream: &RawUpstream, workers: usize) -> GatewayProcess {
    // No retries: a request sent on a dead connection would show as a 502.
    let config = format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nworker_threads = {workers}\n\n{}",
        single_route_config(&format!("http://{}", upstream.addr), "")
    );
    GatewayProcess::start(BIN, &config).await
}

/// `POST path` with the body `hello` on a fresh client connection; the status.
async fn post(gateway: &GatewayProcess, path: &str) -> Option<u16> {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    );
    parse_status(&raw_request(gateway.addr, request.as_bytes()).await?)
}

fn targets(seen: &[(usize, String, Vec<u8>)]) -> Vec<&str> {
    seen.iter().map(|(_, t, _)| t.as_str()).collect()
}

#[tokio::test]
async fn with_two_workers_each_keeps_its_own_pool_and_every_request_arrives_once() {
    let upstream = RawUpstream::start().await;
    let gateway = gateway_with_workers(&upstream, 2).await;
    // Sequential requests on fresh client connections land on either worker: each worker
    // opens at most one upstream connection for them and reuses it.
    for i in 0..20 {
        let status = post(&gateway, &format!("/w/{i}")).await;
        assert_eq!(status, Some(200), "#{i}: {}", gateway.logs());
    }
    let seen = upstream.seen();
    let mut paths = targets(&seen);
    paths.sort_unstable();
    let mut expected: Vec<String> = (0..20).map(|i| format!("/w/{i}")).collect();
    expected.sort_unstable();
    assert_eq!(paths, expected, "each request exactly once");
    assert!(
        (1..=2).contains(&upstream.connections()),
        "at most one upstream connection per worker: {}",
        upstream.connections()
    );
}

#[tokio::test]
async fn sequential_requests_share_one_upstream_connection() {
    let upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    for i in 0..10 {
        let status = post(&gateway, &format!("/r/{i}")).await;
        assert_eq!(status, Some(200), "#{i}: {}", gateway.logs());
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 10);
    assert_eq!(
        upstream.connections(),
        1,
        "one keep-alive connection: {seen:?}"
    );
    assert!(seen.iter().all(|(_, _, body)| body == b"hello"));
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_never_handed_out() {
    let mut upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    for round in 1..=5 {
        let path = format!("/orders/{round}");
        let status = post(&gateway, &path).await;
        assert_eq!(status, Some(200), "round {round}: {}", gateway.logs());
        // The upstream's idle timeout fires: the pooled connection is now closed.
        upstream.close_idle_connections(round).await;
    }
    let seen = upstream.seen();
    let expected: Vec<String> = (1..=5).map(|i| format!("/orders/{i}")).collect();
    assert_eq!(
        targets(&seen),
        expected,
        "every POST reached the upstream once"
    );
    let connections: Vec<usize> = seen.iter().map(|(c, _, _)| *c).collect();
    assert_eq!(connections, [1, 2, 3, 4, 5], "each on a fresh connection");
}

#[tokio::test]
async fn a_client_gone_mid_body_leaves_no_broken_connection_in_the_pool() {
    let mut upstream = RawUpstream::start().await;
    let gateway = gateway(&upstream).await;
    // Warm the pool: connection 1 is idle.
    assert_eq!(post(&gateway, "/before").await, Some(200));
    // A client reads the start of the slow body on connection 1, then goes away.
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let request = b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n";
    client.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while got.len() < 2 * CHUNK {
        let read = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk)).await;
        match read.expect("the body starts").unwrap() {
            0 => panic!("closed early: {}", String::from_utf8_lossy(&got)),
            n => got.extend_from_slice(&chunk[..n]),
        }
    }
    assert_eq!(parse_status(&got), Some(200));
    drop(client);
    // The gateway gives the half-read connection up (it never goes back to the pool).
    upstream.wait_closed(1).await;
    let status = post(&gateway, "/after").await;
    assert_eq!(status, Some(200), "{}", gateway.logs());
    let seen = upstream.seen();
    assert_eq!(targets(&seen), ["/before", "/big", "/after"]);
    let (connection, _, body) = &seen[2];
    assert_eq!(body, b"hello", "received intact");
    assert_eq!(*connection, 2, "on a fresh connection");
}
