//! The open-loop client of the upgrade tests, and raw HTTP/1 and HTTP/2 connections.
//!
//! The clients are hyper clients (hyper-util's legacy pool, HTTP/1.1 keep-alive and HTTP/2
//! with prior knowledge) that retry as stock clients do, and only that:
//!
//! - hyper-util's own `retry_canceled_requests` (default on): a request that could not be
//!   written on a reused connection the server had just closed is sent on another;
//! - like Go's `net/http` and curl, a GET whose connection ended before any byte of a
//!   response (reset, or closed after the request was written: the race of an idle
//!   keep-alive connection closed by the old process at the moment the client reuses it,
//!   which nginx has too), or that HTTP/2 refused after a GOAWAY (RFC 9113 §6.8: a stream
//!   the server did not process may be retried), is sent once more on a new connection.
//!
//! Such a request never reached a gateway's pipeline, which the upstream checks: it must see
//! every request exactly once. The number of such retries is printed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use portcullis_testkit::h2frames::{self, kind, FrameReader};
use portcullis_testkit::upstream::ScriptedUpstream;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::process::{status_file, successor_of};
use super::PATIENCE;

/// The open-loop schedule at `rate` requests per second (`common::load_rate`, 400 by
/// default): the send interval, requests before the hand-over starts (1 s), requests after
/// the successor said it serves (1 s), and requests at most (40 s; the successor's start-up
/// bounds the rest).
struct Schedule {
    interval: Duration,
    before: usize,
    after: usize,
    max_requests: usize,
}

impl Schedule {
    fn at(rate: u32) -> Self {
        let per_second = rate as usize;
        Self {
            interval: Duration::from_secs(1) / rate,
            before: per_second,
            after: per_second,
            max_requests: per_second * 40,
        }
    }
}

type Pool = Client<HttpConnector, Full<Bytes>>;

/// What the open-loop run saw.
#[derive(Debug, Default)]
pub(super) struct Run {
    pub(super) sent: usize,
    pub(super) ok: usize,
    pub(super) failures: Vec<String>,
    pub(super) successor: Option<u32>,
    pub(super) retried: usize,
}

/// Why the request failed before any byte of a response, on a connection the server ended
/// (the cases a stock client sends a GET again for; see the module docs)?
fn unanswered(err: &hyper_util::client::legacy::Error) -> Option<&'static str> {
    let hyper = std::error::Error::source(err).and_then(|e| e.downcast_ref::<hyper::Error>())?;
    let reset = std::error::Error::source(hyper)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset);
    // h2's error type is not a dependency here; its Debug names the frame and the side.
    let debug = format!("{hyper:?}");
    let refused_after_goaway = debug.contains("GoAway(") && debug.contains("Remote");
    if refused_after_goaway {
        Some("HTTP/2 stream refused after GOAWAY")
    } else if reset {
        Some("HTTP/1 connection reset")
    } else if hyper.is_incomplete_message() {
        Some("HTTP/1 connection closed before a response")
    } else if hyper.is_canceled() {
        Some("canceled")
    } else {
        None
    }
}

/// Sends `GET /load?seq=N` every [`Schedule::interval`] (2 of 3 over HTTP/1.1 keep-alive, 1 of
/// 3 over HTTP/2), calls `trigger` after [`Schedule::before`] requests, and goes on until
/// [`Schedule::after`] requests after the status file names a successor (or the old process
/// reports a failure, or [`Schedule::max_requests`]). Sends are scheduled, not paced by
/// answers.
pub(super) async fn open_loop(
    addr: SocketAddr,
    runtime: &Path,
    pid: u32,
    trigger: impl FnOnce() -> Option<tokio::task::JoinHandle<std::process::Output>>,
) -> (Run, Option<std::process::Output>) {
    let h1: Pool = Client::builder(TokioExecutor::new()).build_http();
    let h2: Pool = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let Schedule {
        interval,
        before,
        after,
        max_requests,
    } = Schedule::at(crate::common::load_rate());
    let started = tokio::time::Instant::now();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    let mut trigger = Some(trigger);
    let mut command = None;
    let mut until = max_requests;
    let mut run = Run::default();
    let retried = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<&str, usize>::new()));
    for seq in 0..max_requests {
        if seq >= until {
            break;
        }
        ticker.tick().await;
        if seq == before {
            command = trigger.take().and_then(|trigger| trigger());
        }
        if seq > before && until == max_requests && seq % 20 == 0 {
            if let Some(successor) = successor_of(runtime, pid) {
                run.successor = Some(successor);
                until = seq + after;
            } else if std::fs::read_to_string(status_file(runtime, pid))
                .is_ok_and(|s| s.starts_with("failed"))
            {
                until = seq + after;
            }
        }
        let http2 = seq % 3 == 2;
        let client = if http2 { h2.clone() } else { h1.clone() };
        let uri = format!("http://{addr}/load?seq={seq}");
        let retried = retried.clone();
        tasks.push(tokio::spawn(async move {
            let request = || {
                http::Request::get(&uri)
                    .header("x-seq", seq.to_string())
                    .body(Full::new(Bytes::new()))
                    .unwrap()
            };
            let answer = tokio::time::timeout(PATIENCE, async {
                let response = match client.request(request()).await {
                    Ok(response) => response,
                    Err(err) if unanswered(&err).is_some() => {
                        if let Some(why) = unanswered(&err) {
                            *retried.lock().unwrap().entry(why).or_default() += 1;
                        }
                        let fresh = Client::builder(TokioExecutor::new())
                            .http2_only(http2)
                            .build_http();
                        fresh
                            .request(request())
                            .await
                            .map_err(|e| format!("retried: {e:?}"))?
                    }
                    Err(err) => return Err(format!("{err:?}")),
                };
                let status = response.status();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("body: {e:?}"))?;
                if status != 200 {
                    return Err(format!("status {status}: {:?}", body.to_bytes()));
                }
                Ok(())
            })
            .await;
            match answer {
                Ok(result) => result.map_err(|e| format!("seq {seq}: {e}")),
                Err(_) => Err(format!("seq {seq}: no answer within {PATIENCE:?}")),
            }
        }));
        run.sent += 1;
    }
    let sending = started.elapsed();
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => run.ok += 1,
            Err(failure) => run.failures.push(failure),
        }
    }
    let retried = retried.lock().unwrap().clone();
    run.retried = retried.values().sum();
    // For the record only (no assertion on time): the rate the schedule held.
    let seconds = sending.as_secs_f64();
    eprintln!(
        "open loop: {} sent in {seconds:.2} s ({:.0}/s), {} answered 200, {} sent again after a connection ended unanswered {retried:?}",
        run.sent, run.sent as f64 / seconds, run.ok, run.retried
    );
    let output = match command {
        Some(command) => Some(command.await.unwrap()),
        None => None,
    };
    (run, output)
}

/// Every request answered 200 reached the upstream exactly once (by `x-seq`).
pub(super) fn assert_upstream_saw_each_once(upstream: &ScriptedUpstream, run: &Run) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for hit in upstream.hits() {
        if let Some(seq) = hit.headers.get("x-seq").and_then(|v| v.to_str().ok()) {
            *seen.entry(seq.to_owned()).or_default() += 1;
        }
    }
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicated.is_empty(), "sent twice upstream: {duplicated:?}");
    assert_eq!(seen.len(), run.sent, "the upstream saw every request once");
}

/// An HTTP/2 connection (raw frames) that has had one answer before the hand-over.
pub(super) async fn h2_connection(addr: SocketAddr) -> FrameReader<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(h2frames::PREFACE).await.unwrap();
    stream.write_all(&h2frames::settings(&[])).await.unwrap();
    let authority = addr.to_string();
    let fields = [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/raw-h2"),
        (":authority", authority.as_str()),
    ];
    stream
        .write_all(&h2frames::headers(1, &fields, true))
        .await
        .unwrap();
    let mut reader = FrameReader::new(stream);
    loop {
        let frame = reader.next(PATIENCE).await.expect("an HTTP/2 answer");
        if frame.kind == kind::SETTINGS && frame.flags & h2frames::ACK == 0 {
            let ack = h2frames::settings_ack();
            reader.get_mut().write_all(&ack).await.unwrap();
        }
        if frame.kind == kind::HEADERS && frame.stream == 1 {
            assert_eq!(frame.static_status(), Some(200));
            return reader;
        }
    }
}

/// Reads the connection to its end: the frames that ended it must be a GOAWAY with
/// NO_ERROR and no RST_STREAM. PINGs (hyper's graceful shutdown sends one) are answered.
pub(super) async fn assert_goaway_then_close(mut reader: FrameReader<TcpStream>) {
    const PING: u8 = 0x6;
    let mut goaways = Vec::new();
    for _ in 0..1000 {
        let Some(frame) = reader.next(PATIENCE).await else {
            break;
        };
        match frame.kind {
            kind::GOAWAY => goaways.push(frame.error_code()),
            kind::RST_STREAM => panic!("stream reset during the hand-over: {frame:?}"),
            PING if frame.flags & h2frames::ACK == 0 => {
                let pong = h2frames::encode(PING, h2frames::ACK, 0, &frame.payload);
                let _ = reader.get_mut().write_all(&pong).await;
            }
            _ => {}
        }
    }
    assert!(!goaways.is_empty(), "the HTTP/2 connection got no GOAWAY");
    assert!(
        goaways.iter().all(|code| *code == Some(0)),
        "GOAWAY with NO_ERROR only: {goaways:?}"
    );
}

/// Sends `GET path` on `stream` and reads one response (head and `content-length` body).
pub(super) async fn exchange(stream: &mut TcpStream, path: &str) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let request = format!("GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..100 {
        let text = String::from_utf8_lossy(&received).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if received.len() >= end + 4 + length {
                return Some(text);
            }
        }
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        received.extend_from_slice(&buf[..n]);
    }
    None
}
