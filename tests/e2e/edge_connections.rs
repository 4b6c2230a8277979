//! Connections as hostile or careless clients open them: TLS with a chosen ALPN and the other
//! protocol's bytes, h2c switched off, silent connections, keep-alive reuse past the header
//! deadline, heads that trickle in, the connection cap. Each asserts what the upstream saw.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::h2frames::{self, FrameReader};
use portcullis_testkit::tls::{client_config, TestCa};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::BIN;
use crate::tls_edge::config;

/// Bounds every wait of this file: a test that needs it has failed.
const PATIENCE: Duration = Duration::from_secs(20);

/// A smuggling attempt: a CL+TE request hiding a second one.
const SMUGGLE: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

async fn tls_gateway(ca: &TestCa, upstream: &ScriptedUpstream, extra: &str) -> GatewayProcess {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server().write(dir.path(), "server");
    let options = portcullis_testkit::gateway::GatewayOptions {
        tls_ca: Some(ca.pem()),
        ..Default::default()
    };
    let config = config(&upstream.url(), extra, Some((&cert, &key)));
    let gateway = GatewayProcess::start_with(BIN, &config, options).await;
    // The certificate files are read at start-up and on reload only.
    std::mem::forget(dir);
    gateway
}

async fn tls_connect(
    addr: SocketAddr,
    ca: &TestCa,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let config = client_config(&ca.pem(), alpn, false);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// Everything the peer sends until it closes (or a reset, or PATIENCE runs out: `None`).
async fn read_until_closed<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.ok().map(|()| out)
}

/// One keep-alive request on `stream`; returns the response head.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut byte))
            .await
            .expect("a response in time")
            .unwrap();
        assert_eq!(n, 1, "connection closed mid-response: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    head
}

#[tokio::test]
async fn tls_serves_exactly_the_negotiated_protocol() {
    let ca = TestCa::new("alpn-ca");
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let gateway = tls_gateway(&ca, &upstream, "").await;

    // ALPN h2, then HTTP/1.1 bytes carrying a smuggling attempt: not HTTP/2, so refused.
    let mut h2 = tls_connect(gateway.addr, &ca, &[b"h2"]).await;
    h2.write_all(SMUGGLE).await.unwrap();
    let answer = read_until_closed(&mut h2).await.expect("closed");
    assert!(
        !answer.starts_with(b"HTTP/1"),
        "HTTP/1 answered after ALPN h2: {answer:?}"
    );

    // ALPN http/1.1, then an HTTP/2 preface: 505, never served as HTTP/2.
    let mut h1 = tls_connect(gateway.addr, &ca, &[b"http/1.1"]).await;
    h1.write_all(h2frames::PREFACE).await.unwrap();
    h1.write_all(&h2frames::settings(&[])).await.unwrap();
    let answer = read_until_closed(&mut h1).await.expect("closed");
    assert_eq!(
        parse_status(&answer),
        Some(505),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(String::from_utf8_lossy(&answer).contains("application/problem+json"));

    // ALPN http/1.1 (and no ALPN at all): the framing guard applies.
    for alpn in [&[&b"http/1.1"[..]][..], &[]] {
        let mut h1 = tls_connect(gateway.addr, &ca, alpn).await;
        h1.write_all(SMUGGLE).await.unwrap();
        let answer = read_until_closed(&mut h1).await.expect("closed");
        assert_eq!(
            parse_status(&answer),
            Some(400),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    assert_eq!(upstream.hit_count(), 0, "{:?}", upstream.hits());
}

#[tokio::test]
async fn h2c_off_refuses_prior_knowledge_and_on_serves_it() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let off = GatewayProcess::start(BIN, &config(&upstream.url(), "h2c = false", None)).await;
    let mut bytes = h2frames::PREFACE.to_vec();
    bytes.extend(h2frames::settings(&[]));
    bytes.extend(h2frames::headers(
        1,
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/x"),
            (":authority", "localhost"),
        ],
        true,
    ));
    let answer = raw_request(off.addr, &bytes).await.expect("an answer");
    assert_eq!(
        parse_status(&answer),
        Some(505),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(upstream.hit_count(), 0);

    let on = GatewayProcess::start(BIN, &config(&upstream.url(), "", None)).await;
    let mut stream = TcpStream::connect(on.addr).await.unwrap();
    stream.write_all(&bytes).await.unwrap();
    let mut frames = FrameReader::new(stream);
    let mut status = None;
    while let Some(frame) = frames.next(PATIENCE).await {
        if frame.kind == h2frames::kind::HEADERS {
            status = frame.static_status();
            break;
        }
    }
    assert_eq!(status, Some(200));
    assert_eq!(upstream.hit_count(), 1);
}

#[tokio::test]
async fn silent_connections_are_closed_at_the_header_deadline() {
    let ca = TestCa::new("silent-ca");
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let gateway = tls_gateway(&ca, &upstream, "header_read_timeout = \"500ms\"").await;
    // TLS done with ALPN h2 or http/1.1, then nothing; plain TCP with nothing at all.
    let mut silent_h2 = Vec::new();
    for _ in 0..30 {
        silent_h2.push(tls_connect(gateway.addr, &ca, &[b"h2"]).await);
    }
    let mut silent_h1 = tls_connect(gateway.addr, &ca, &[b"http/1.1"]).await;
    let mut silent_tcp = TcpStream::connect(gateway.addr).await.unwrap();
    for stream in &mut silent_h2 {
        assert!(
            read_until_closed(stream).await.is_some(),
            "h2 silent connection closed"
        );
    }
    assert!(read_until_closed(&mut silent_h1).await.is_some());
    assert!(read_until_closed(&mut silent_tcp).await.is_some());

    // The same on plain h2c: a preface, then no request.
    let plain = GatewayProcess::start(
        BIN,
        &config(&upstream.url(), "header_read_timeout = \"500ms\"", None),
    )
    .await;
    let mut stream = TcpStream::connect(plain.addr).await.unwrap();
    stream.write_all(h2frames::PREFACE).await.unwrap();
    stream.write_all(&h2frames::settings(&[])).await.unwrap();
    assert!(
        read_until_closed(&mut stream).await.is_some(),
        "h2c silent connection closed"
    );
    assert_eq!(upstream.hit_count(), 0);
}

#[tokio::test]
async fn keep_alive_outlives_the_header_deadline_and_is_advertised() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(
            &upstream.url(),
            // Keep-alive far beyond PATIENCE: only the header deadline can close it.
            "header_read_timeout = \"300ms\"\nkeep_alive_timeout = \"1h\"",
            None,
        ),
    )
    .await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    let head = exchange(&mut stream, "/one").await;
    assert!(
        head.to_ascii_lowercase()
            .contains("keep-alive: timeout=3600"),
        "{head}"
    );
    // Idle well past the header deadline: the connection is still usable.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let head = exchange(&mut stream, "/two").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // A later head that trickles in is cut off at the header deadline.
    stream
        .write_all(b"GET /three HTTP/1.1\r\nX-Slow: ")
        .await
        .unwrap();
    let rest = read_until_closed(&mut stream).await.expect("closed");
    assert!(
        rest.is_empty(),
        "no answer to a head that never completed: {rest:?}"
    );
    let paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    assert_eq!(paths, ["/one", "/two"]);
}

#[tokio::test]
async fn idle_keep_alive_connections_close_after_their_timeout() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let gateway = GatewayProcess::start(
        BIN,
        // The header deadline far beyond PATIENCE: only the keep-alive bound can close it.
        &config(
            &upstream.url(),
            "keep_alive_timeout = \"1s\"\nheader_read_timeout = \"300s\"",
            None,
        ),
    )
    .await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    exchange(&mut stream, "/one").await;
    assert_eq!(read_until_closed(&mut stream).await, Some(Vec::new()));
}

#[tokio::test]
async fn the_connection_cap_reclaims_idle_connections_and_refuses_busy_ones() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let gateway =
        GatewayProcess::start(BIN, &config(&upstream.url(), "max_connections = 3", None)).await;
    // Three idle keep-alive connections fill the cap; a fourth client is still served,
    // because idle connections are closed to make room.
    let mut idle = Vec::new();
    for i in 0..3 {
        let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
        exchange(&mut stream, &format!("/idle{i}")).await;
        idle.push(stream);
    }
    let mut fourth = TcpStream::connect(gateway.addr).await.unwrap();
    assert!(exchange(&mut fourth, "/fourth")
        .await
        .starts_with("HTTP/1.1 200"));
    drop(fourth);

    // Three connections each waiting on a slow upstream answer: a new one is refused.
    upstream.set_fallback(Step::stall(Duration::from_secs(3), Step::ok("slow")));
    let mut busy = Vec::new();
    for i in 0..3 {
        let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
        let request = format!("GET /busy{i} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        busy.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = raw_request(gateway.addr, b"GET /refused HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(refused, Some(Vec::new()), "closed without an answer");
    // The admin listener has its own cap: health and metrics stay reachable.
    let metrics = crate::common::client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("connections_refused_total{listener=\"proxy\"} 1"),
        "{metrics}"
    );
    for stream in &mut busy {
        let answer = read_until_closed(stream).await;
        drop(answer);
    }
    assert!(upstream.hits().iter().all(|h| h.uri.path() != "/refused"));
}

#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected_and_frees_its_slot() {
    // 64 MiB: far more than every socket buffer between gateway and client on loopback.
    let big = "x".repeat(64 << 20);
    let upstream =
        ScriptedUpstream::start_with_fallback(vec![Step::ok(&big)], Step::ok("fine")).await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(
            &upstream.url(),
            // One anonymous caller (loopback): no per-caller share.
            "send_timeout = \"1s\"\nload_shed_limit = 1\ncaller_share = 1.0",
            None,
        ),
    )
    .await;
    let mut stuck = TcpStream::connect(gateway.addr).await.unwrap();
    stuck
        .write_all(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    // While the stuck client holds the only in-flight slot, others are shed (503); once the
    // gateway gives up on it, they are served again.
    let client = crate::common::client();
    let mut served = false;
    for _ in 0..100 {
        let response = client.get(gateway.url() + "/next").send().await.unwrap();
        if response.status() == 200 {
            served = true;
            break;
        }
        assert_eq!(response.status(), 503);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(served, "the stuck client kept its slot");
    // The stuck connection was closed before the whole body went out.
    let received = read_until_closed(&mut stuck).await.unwrap_or_default();
    assert!(received.len() < big.len(), "{} bytes", received.len());
}

/// How long `stream` stays open, from now, before the gateway closes it.
async fn open_for<S: AsyncRead + Unpin>(stream: &mut S) -> Duration {
    let started = tokio::time::Instant::now();
    assert!(read_until_closed(stream).await.is_some(), "never closed");
    started.elapsed()
}

#[tokio::test]
async fn silent_h2_connections_close_at_their_deadline_not_seconds_later() {
    // The margins only tell "at the deadline (plus at most 1 s to say goodbye)" from "5 s
    // later", which is what waiting for a GOAWAY a silent client never answers cost.
    const SERVER: &str = "header_read_timeout = \"2s\"\nkeep_alive_timeout = \"2s\"";
    const LATEST: Duration = Duration::from_millis(4_500);
    let ca = TestCa::new("silent-h2-ca");
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("fine")).await;
    let tls = tls_gateway(&ca, &upstream, SERVER).await;
    let plain = GatewayProcess::start(BIN, &config(&upstream.url(), SERVER, None)).await;

    // TLS with ALPN h2, then no preface at all.
    let tls_silent = async {
        let mut stream = tls_connect(tls.addr, &ca, &[b"h2"]).await;
        open_for(&mut stream).await
    };
    // h2c prior knowledge: the preface, then nothing.
    let h2c_silent = async {
        let mut stream = TcpStream::connect(plain.addr).await.unwrap();
        stream.write_all(h2frames::PREFACE).await.unwrap();
        open_for(&mut stream).await
    };
    // h2c with one request answered, then idle: closed at the keep-alive bound.
    let h2c_idle = async {
        let stream = TcpStream::connect(plain.addr).await.unwrap();
        let mut reader = FrameReader::new(stream);
        let mut hello = h2frames::PREFACE.to_vec();
        hello.extend(h2frames::settings(&[]));
        hello.extend(h2frames::headers(
            1,
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/one"),
                (":authority", "localhost"),
            ],
            true,
        ));
        reader.get_mut().write_all(&hello).await.unwrap();
        // Bounded: until the answer has ended, or PATIENCE.
        loop {
            let frame = reader.next(PATIENCE).await.expect("the answer");
            if frame.stream == 1 && frame.flags & h2frames::END_STREAM != 0 {
                break;
            }
        }
        open_for(reader.get_mut()).await
    };
    let (tls_silent, h2c_silent, h2c_idle) = tokio::join!(tls_silent, h2c_silent, h2c_idle);
    for (what, open) in [
        ("TLS h2 without a preface", tls_silent),
        ("h2c preface only", h2c_silent),
        ("idle h2c", h2c_idle),
    ] {
        assert!(
            open >= Duration::from_millis(1_500) && open <= LATEST,
            "{what}: closed after {open:?}"
        );
    }
    let paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    assert_eq!(paths, ["/one"]);
}
