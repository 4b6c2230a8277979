//! Hostile clients: slow headers, slow bodies and malformed HTTP are cut off by timeouts and
//! answered with 4xx, without exhausting the gateway.

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{single_route_config, still_serving, BIN};

fn hostile_config(upstream: &ScriptedUpstream) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nheader_read_timeout = \"1s\"\nbody_read_timeout = \"1s\"\nload_shed_limit = 50\n\n{}",
        single_route_config(&upstream.url(), "")
    )
}

/// Reads until the peer closes, bounded to `limit`; returns the bytes and whether it closed.
async fn read_until_closed(stream: &mut tokio::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let closed = tokio::time::timeout(limit, stream.read_to_end(&mut out))
        .await
        .is_ok();
    (out, closed)
}

#[tokio::test]
async fn slow_headers_are_cut_off_and_others_keep_being_served() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &hostile_config(&upstream)).await;
    // Many trickling clients at once: each sends part of a head and then stalls.
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
        stream
            .write_all(b"GET /x HTTP/1.1\r\nHost: a\r\nX-Slow: ")
            .await
            .unwrap();
        stalled.push(stream);
    }
    // And some that connect and never say a word (h2c is on: protocol detection waits for
    // a first byte, so this is the guard's deadline, not hyper's).
    for _ in 0..5 {
        stalled.push(tokio::net::TcpStream::connect(gateway.addr).await.unwrap());
    }
    // Meanwhile a well-behaved client is served.
    still_serving(&gateway, "/ok").await;
    for mut stream in stalled {
        let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
        assert!(
            closed,
            "a client that never finished its head was disconnected"
        );
    }
    assert_eq!(
        upstream.hit_count(),
        1,
        "no partial request reached the upstream"
    );
    still_serving(&gateway, "/ok").await;
}

#[tokio::test]
async fn slow_bodies_get_408_and_release_their_slot() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::Echo).await;
    let gateway = GatewayProcess::start(BIN, &hostile_config(&upstream)).await;
    for path in ["/put-small", "/post-small"] {
        let method = if path.starts_with("/put") {
            "PUT"
        } else {
            "POST"
        };
        let mut stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
        let head =
            format!("{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789");
        stream.write_all(head.as_bytes()).await.unwrap();
        let (answer, _) = read_until_closed(&mut stream, Duration::from_secs(10)).await;
        assert_eq!(
            parse_status(&answer),
            Some(408),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(String::from_utf8_lossy(&answer).contains("application/problem+json"));
    }
    still_serving(&gateway, "/ok").await;
}

#[tokio::test]
async fn many_malformed_requests_leave_the_gateway_serving() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &hostile_config(&upstream)).await;
    let samples: [&[u8]; 6] = [
        b"\x00\x01\x02\x03\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n: empty-name\r\n\r\n",
        b"GET http://[::1 HTTP/1.1\r\n\r\n",
    ];
    for round in 0..10 {
        for sample in samples {
            let answer = portcullis_testkit::gateway::raw_request(gateway.addr, sample)
                .await
                .unwrap_or_default();
            if let Some(status) = parse_status(&answer) {
                // 4xx, or 505 for a request line naming another HTTP version.
                assert!(
                    (400..500).contains(&status) || status == 505,
                    "round {round}: {status} for {:?}",
                    String::from_utf8_lossy(sample)
                );
            }
        }
    }
    assert_eq!(upstream.hit_count(), 0);
    still_serving(&gateway, "/ok").await;
}
