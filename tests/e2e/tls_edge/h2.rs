//! HTTP/2 seen as raw frames: the SETTINGS the gateway advertises, a client exceeding
//! SETTINGS_MAX_CONCURRENT_STREAMS, h2c switched off, and request-smuggling attempts over
//! HTTP/1.1 and HTTP/2 on the plain listener.

use std::time::Duration;

use portcullis_testkit::gateway::{raw_request, GatewayProcess};
use portcullis_testkit::h2frames::{self, kind, setting, FrameReader};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use tokio::io::AsyncWriteExt;

use super::config;
use crate::common::BIN;

/// Connects with h2c prior knowledge and returns the reader after the SETTINGS exchange,
/// plus the server's SETTINGS and its first connection WINDOW_UPDATE increment.
async fn h2c_connect(
    addr: std::net::SocketAddr,
) -> (
    FrameReader<tokio::net::TcpStream>,
    Vec<(u16, u32)>,
    Option<u32>,
) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(h2frames::PREFACE).await.unwrap();
    stream.write_all(&h2frames::settings(&[])).await.unwrap();
    let mut reader = FrameReader::new(stream);
    let (mut settings, mut window) = (None, None);
    for _ in 0..10 {
        let Some(frame) = reader.next(Duration::from_secs(5)).await else {
            break;
        };
        match frame.kind {
            kind::SETTINGS if frame.flags & h2frames::ACK == 0 => settings = Some(frame.settings()),
            kind::WINDOW_UPDATE if frame.stream == 0 => {
                let b = &frame.payload;
                window = Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff);
            }
            _ => {}
        }
        if settings.is_some() && window.is_some() {
            break;
        }
    }
    let settings = settings.expect("the server sent no SETTINGS");
    reader
        .get_mut()
        .write_all(&h2frames::settings_ack())
        .await
        .unwrap();
    (reader, settings, window)
}

fn get(stream: u32, path: &str) -> Vec<u8> {
    h2frames::headers(
        stream,
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
        ],
        true,
    )
}

#[tokio::test]
async fn h2_settings_advertise_the_limits_and_a_third_stream_is_refused() {
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::stall(Duration::from_secs(2), Step::ok("slow")),
    )
    .await;
    let http2 = "[server.http2]\nmax_concurrent_streams = 2\nmax_header_list_size = 20000\ninitial_stream_window_size = 131072\ninitial_connection_window_size = 262144\n";
    let gateway =
        GatewayProcess::start(BIN, &(config(&upstream.url(), "h2c = true", None) + http2)).await;

    let (mut reader, settings, window) = h2c_connect(gateway.addr).await;
    assert!(
        settings.contains(&(setting::MAX_CONCURRENT_STREAMS, 2)),
        "{settings:?}"
    );
    assert!(
        settings.contains(&(setting::MAX_HEADER_LIST_SIZE, 20000)),
        "{settings:?}"
    );
    assert!(
        settings.contains(&(setting::INITIAL_WINDOW_SIZE, 131_072)),
        "{settings:?}"
    );
    assert_eq!(window, Some(262_144 - 65_535), "connection window");

    // A client ignoring SETTINGS_MAX_CONCURRENT_STREAMS = 2 opens a third stream: RFC 9113
    // §5.1.2 says it is refused with a stream error (REFUSED_STREAM or PROTOCOL_ERROR; h2
    // chooses REFUSED_STREAM, which tells the client it may retry the stream elsewhere).
    for id in [1, 3, 5] {
        reader.get_mut().write_all(&get(id, "/slow")).await.unwrap();
    }
    let mut reset = None;
    for _ in 0..20 {
        let Some(frame) = reader.next(Duration::from_secs(5)).await else {
            break;
        };
        if frame.kind == kind::RST_STREAM && frame.stream == 5 {
            reset = frame.error_code();
            break;
        }
    }
    assert_eq!(reset, Some(0x7), "stream 5 not refused with REFUSED_STREAM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        upstream.hit_count() <= 2,
        "{} requests reached the upstream",
        upstream.hit_count()
    );
}

#[tokio::test]
async fn h2c_can_be_turned_off() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), "h2c = false", None)).await;
    let mut bytes = h2frames::PREFACE.to_vec();
    bytes.extend(h2frames::settings(&[]));
    let answer = raw_request(gateway.addr, &bytes).await.unwrap_or_default();
    // No SETTINGS frame back: an HTTP/1.1 error or a closed connection.
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 "),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(upstream.hit_count(), 0);
}

/// Asserts that `answer` (everything read until the gateway closed) holds `earlier`
/// ordinary responses followed by exactly one 400/431/501/505 problem+json refusal naming
/// `reason`, with `Connection: close`.
pub(crate) fn assert_refused(answer: Option<Vec<u8>>, earlier: usize, reason: &str) {
    let answer = answer.expect("the gateway closed the connection after refusing");
    let text = String::from_utf8_lossy(&answer);
    let responses: Vec<&str> = text.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(responses.len(), earlier + 1, "{text}");
    let refusal = responses[earlier].to_ascii_lowercase();
    let status = match reason {
        "too-many-headers" => "431 ",
        "unsupported-transfer-encoding" => "501 ",
        "unsupported-http-version" => "505 ",
        _ => "400 ",
    };
    assert!(refusal.starts_with(status), "{text}");
    assert!(
        refusal.contains("content-type: application/problem+json"),
        "{text}"
    );
    assert!(refusal.contains("connection: close"), "{text}");
    assert!(
        refusal.contains(&format!("\"reason\":\"{reason}\"")),
        "{text}"
    );
}

/// Request-smuggling vectors in front of a following request the attack tries to hide.
pub(crate) const SMUGGLING_ATTEMPTS: [(&str, &str); 8] = [
    (
        "Content-Length: 5\r\nContent-Length: 6",
        "conflicting-content-length",
    ),
    ("Content-Length: 5, 6", "conflicting-content-length"),
    (
        "Content-Length: 4\r\nTransfer-Encoding: chunked",
        "content-length-with-transfer-encoding",
    ),
    (
        "Transfer-Encoding: chunked\r\nContent-Length: 4",
        "content-length-with-transfer-encoding",
    ),
    (
        "Transfer-Encoding: chunked, identity",
        "unsupported-transfer-encoding",
    ),
    ("Content-Length: +5", "invalid-content-length"),
    (
        "Transfer-Encoding: gzip, chunked",
        "unsupported-transfer-encoding",
    ),
    ("Transfer-Encoding: chunked, chunked", "repeated-chunked"),
];

/// One attack: an ordinary GET, then `POST /b` with `framing`, a body readable either way,
/// and a request hidden behind it.
pub(crate) fn smuggling_attack(framing: &str) -> String {
    format!(
        "GET /first HTTP/1.1\r\nHost: a\r\n\r\nPOST /b HTTP/1.1\r\nHost: a\r\n{framing}\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
    )
}

#[tokio::test]
async fn smuggling_attempts_get_400_problem_json_and_the_connection_closed() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::Echo).await;
    let gateway = GatewayProcess::start(BIN, &config(&upstream.url(), "", None)).await;

    // The pipelined GET before the attack is answered first, in order; the attack gets the
    // refusal; nothing after it is read.
    for (framing, reason) in SMUGGLING_ATTEMPTS {
        let attack = smuggling_attack(framing);
        assert_refused(
            raw_request(gateway.addr, attack.as_bytes()).await,
            1,
            reason,
        );
    }
    // Heads hyper cannot parse, or with too many lines, get problem+json too.
    let garbage = raw_request(gateway.addr, b"GET / HTTP/1.1\r\nBad Header\r\n\r\n").await;
    assert_refused(garbage, 0, "malformed-request-head");
    let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(101));
    assert_refused(
        raw_request(gateway.addr, many.as_bytes()).await,
        0,
        "too-many-headers",
    );
    // A client cannot slip the refusal header upstream either.
    let marked = raw_request(
        gateway.addr,
        b"GET / HTTP/1.1\r\nx-portcullis-refused: whatever\r\n\r\n",
    )
    .await;
    assert_refused(marked, 0, "malformed-request-head");

    let paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    assert_eq!(paths, vec!["/first"; SMUGGLING_ATTEMPTS.len()]);

    // HTTP/2: differing content-length fields and transfer-encoding are malformed (RFC 9113
    // §8.1.1, §8.2.2); the h2 library resets those streams before any layer runs.
    let (mut reader, _, _) = h2c_connect(gateway.addr).await;
    let fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/c"),
        (":authority", "localhost"),
        ("content-length", "5"),
        ("content-length", "50"),
    ];
    reader
        .get_mut()
        .write_all(&h2frames::headers(1, &fields, false))
        .await
        .unwrap();
    reader
        .get_mut()
        .write_all(&h2frames::data(1, b"hello", true))
        .await
        .unwrap();
    let te = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/d"),
        (":authority", "localhost"),
        ("transfer-encoding", "chunked"),
    ];
    reader
        .get_mut()
        .write_all(&h2frames::headers(3, &te, true))
        .await
        .unwrap();
    let (mut reset_1, mut reset_3) = (None, None);
    for _ in 0..20 {
        let Some(frame) = reader.next(Duration::from_secs(5)).await else {
            break;
        };
        match (frame.kind, frame.stream) {
            (kind::HEADERS, 1 | 3) => panic!("a malformed stream was answered: {frame:?}"),
            (kind::RST_STREAM, 1) => reset_1 = frame.error_code(),
            (kind::RST_STREAM, 3) => reset_3 = frame.error_code(),
            _ => {}
        }
        if reset_1.is_some() && reset_3.is_some() {
            break;
        }
    }
    assert_eq!(
        (reset_1, reset_3),
        (Some(0x1), Some(0x1)),
        "PROTOCOL_ERROR on both"
    );
    assert!(upstream
        .hits()
        .iter()
        .all(|h| !["/c", "/d"].contains(&h.uri.path())));
}
