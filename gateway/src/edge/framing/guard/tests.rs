use super::linger::{LINGERING_TIME, LINGERING_TIMEOUT};
use super::*;
use crate::edge::listener::Activity;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// What hyper would receive when `stream` arrives in pieces of `split` bytes.
async fn through_guard(stream: &[u8], split: usize) -> Vec<u8> {
    through_guard_answered(stream, split, None).await
}

/// [`through_guard`], with every request that asks to switch protocols answered
/// (`Some(true)`: 101) as soon as the guard waits for the answer; `None`: never answered.
async fn through_guard_answered(stream: &[u8], split: usize, answer: Option<bool>) -> Vec<u8> {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let activity = Activity::new();
    let mut guard = FramingGuard::new(server, 4096, activity.clone());
    let stream = stream.to_vec();
    let writer = tokio::spawn(async move {
        let mut client = client;
        for piece in stream.chunks(split.max(1)) {
            client.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        client.shutdown().await.unwrap();
        client
    });
    let mut seen = Vec::new();
    let mut buf = [0u8; 97];
    loop {
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), guard.read(&mut buf));
        match read.await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Ok(Err(err)) => panic!("{err}"),
            // Pending: waiting for an answer, which comes now, ...
            Err(_) if guard.position == Position::Upgrading && answer.is_some() => {
                activity.upgrade_answered(answer.unwrap_or(false));
            }
            // ... or for good: the guard refused a head and stopped reading.
            Err(_) => break,
        }
    }
    drop(writer.await.unwrap());
    seen
}

const PIPELINE: &[u8] = b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nPOST /two HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloPOST /three HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /four HTTP/1.1\r\n\r\n";

#[tokio::test(start_paused = true)]
async fn well_formed_pipelines_pass_untouched_however_they_are_split() {
    for split in [1, 2, 3, 7, 16, 50, 4096] {
        assert_eq!(
            through_guard(PIPELINE, split).await,
            PIPELINE,
            "split {split}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_conflicting_head_is_replaced_and_nothing_after_it_is_read() {
    let attack = b"POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n";
    let stream = [PIPELINE, &attack[..]].concat();
    let expected = [
        PIPELINE,
        &refusal_head(Refusal::LengthWithTransferEncoding)[..],
    ]
    .concat();
    for split in [1, 5, 33, 4096] {
        assert_eq!(
            through_guard(&stream, split).await,
            expected,
            "split {split}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn body_bytes_are_never_read_as_heads() {
    // A body that looks like a conflicting request must not be refused.
    let inner = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
    let carrier = [
        format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", inner.len()).as_bytes(),
        inner,
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        format!("{:x}\r\n", inner.len()).as_bytes(),
        inner,
        b"\r\n0\r\n\r\n",
    ]
    .concat();
    for split in [1, 9, 4096] {
        assert_eq!(
            through_guard(&carrier, split).await,
            carrier,
            "split {split}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn h2_prefaces_are_refused_and_oversized_heads_pass_through() {
    // Only HTTP/1 connections reach the guard: a preface here names HTTP/2.0 as text.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    for split in [1, 3, 4096] {
        assert_eq!(
            through_guard(preface, split).await,
            refusal_head(Refusal::UnsupportedVersion)
        );
    }
    let huge = format!(
        "GET / HTTP/1.1\r\nX-Big: {}\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "a".repeat(5000)
    );
    assert_eq!(through_guard(huge.as_bytes(), 1000).await, huge.as_bytes());
}

#[tokio::test(start_paused = true)]
async fn a_stream_ending_mid_head_is_handed_over_as_it_is() {
    let cut = b"GET / HTTP/1.1\r\nHost: a";
    assert_eq!(through_guard(cut, 4).await, cut);
}

#[tokio::test(start_paused = true)]
async fn heads_arriving_in_part_are_reported_to_the_watchdog() {
    use crate::edge::listener::activity::{Expiry, Timeouts};
    let timeouts = Timeouts {
        header_read: std::time::Duration::from_secs(10),
        keep_alive: std::time::Duration::from_secs(75),
        send: std::time::Duration::from_secs(60),
    };
    let activity = Activity::new();
    let (mut client, server) = tokio::io::duplex(1024);
    let mut guard = FramingGuard::new(server, 4096, activity.clone());
    let mut buf = [0u8; 256];

    // A whole head in one read never registers as partial.
    client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(guard.read(&mut buf).await.unwrap(), 18);
    assert!(activity.is_idle());

    // Part of a head: the watchdog now times it.
    client
        .write_all(b"GET /next HTTP/1.1\r\nX-Slow: ")
        .await
        .unwrap();
    let pending = tokio::time::timeout(std::time::Duration::from_millis(10), guard.read(&mut buf));
    assert!(pending.await.is_err(), "a partial head is held back");
    assert!(!activity.is_idle());
    assert_eq!(activity.deadline(&timeouts).unwrap().1, Expiry::Head);

    // Its end arrives: handed over whole, and the connection counts as idle again.
    client.write_all(b"1\r\n\r\n").await.unwrap();
    let n = guard.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"GET /next HTTP/1.1\r\nX-Slow: 1\r\n\r\n");
    assert!(activity.is_idle());
}

#[tokio::test(start_paused = true)]
async fn closing_with_a_body_still_arriving_lingers_until_the_client_is_done() {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let mut guard = FramingGuard::new(server, 4096, Activity::new());
    let mut buf = [0u8; 256];
    // hyper reads the head and answers early, leaving the declared body unread.
    client
        .write_all(b"POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\nfirst")
        .await
        .unwrap();
    let _ = guard.read(&mut buf).await.unwrap();
    guard
        .write_all(b"HTTP/1.1 413 Payload Too Large\r\n\r\n")
        .await
        .unwrap();
    let closing = tokio::spawn(async move {
        guard.shutdown().await.unwrap();
        guard
    });
    // The client goes on sending its body, then reads: the answer is there, and the
    // gateway's side saw end of stream only after everything was discarded.
    for _ in 0..10 {
        client.write_all(&[b'x'; 9000]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 413"));
    assert!(
        !closing.is_finished(),
        "still lingering while the client keeps its side open"
    );
    drop(client);
    let guard = closing.await.unwrap();
    assert_eq!(guard.closing.as_ref().unwrap().discarded, 90_000);
}

#[tokio::test(start_paused = true)]
async fn lingering_is_bounded_and_skipped_when_nothing_is_unread() {
    // Nothing unread: the close is immediate even though the client never closes.
    let (_client, server) = tokio::io::duplex(1024);
    let mut guard = FramingGuard::new(server, 4096, Activity::new());
    let started = Instant::now();
    guard.shutdown().await.unwrap();
    assert_eq!(Instant::now(), started);

    // A body still owed, then silence: the close waits LINGERING_TIMEOUT, no more.
    let (mut client, server) = tokio::io::duplex(1024);
    let mut guard = FramingGuard::new(server, 4096, Activity::new());
    client
        .write_all(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let _ = guard.read(&mut buf).await.unwrap();
    let started = Instant::now();
    guard.shutdown().await.unwrap();
    assert_eq!(Instant::now() - started, LINGERING_TIMEOUT);

    // A client that trickles forever is cut off at LINGERING_TIME.
    let (mut client, server) = tokio::io::duplex(1024);
    let mut guard = FramingGuard::new(server, 4096, Activity::new());
    client
        .write_all(b"POST / HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n")
        .await
        .unwrap();
    let _ = guard.read(&mut buf).await.unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if client.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    let started = Instant::now();
    guard.shutdown().await.unwrap();
    assert!(Instant::now() - started <= LINGERING_TIME + std::time::Duration::from_secs(1));
    drop(guard);
    trickle.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn held_bytes_stay_bounded_when_every_read_ends_mid_head() {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let mut guard = FramingGuard::new(server, 4096, Activity::new());
    let head = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut buf = [0u8; 1024];
    // Each write completes the previous head and starts the next one.
    client.write_all(&head[..10]).await.unwrap();
    for _ in 0..500 {
        client.write_all(&head[10..]).await.unwrap();
        client.write_all(&head[..10]).await.unwrap();
        let n = guard.read(&mut buf).await.unwrap();
        assert!(n > 0);
        assert!(guard.held.len() <= 2 * head.len(), "{}", guard.held.len());
    }
}

#[tokio::test(start_paused = true)]
async fn connect_and_upgrade_heads_answered_otherwise_keep_inspection_on() {
    let attack =
        b"POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    for opener in [
        &b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"POST / HTTP/1.1\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\nabc",
    ] {
        let stream = [opener, &attack[..]].concat();
        let expected = [
            opener,
            &refusal_head(Refusal::LengthWithTransferEncoding)[..],
        ]
        .concat();
        for split in [1, 7, 4096] {
            assert_eq!(
                through_guard_answered(&stream, split, Some(false)).await,
                expected
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn nothing_after_a_switch_request_is_read_before_its_answer() {
    let opener = b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
    let after = b"POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
    let stream = [&opener[..], &after[..]].concat();
    for split in [1, 5, 4096] {
        assert_eq!(through_guard_answered(&stream, split, None).await, opener);
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_101_the_bytes_pass_untouched() {
    let opener = b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
    // What a tunnel carries may look like a conflicting head: it is not HTTP any more.
    let after =
        b"POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n\x81\x05hello";
    let stream = [&opener[..], &after[..]].concat();
    for split in [1, 9, 4096] {
        assert_eq!(
            through_guard_answered(&stream, split, Some(true)).await,
            stream
        );
    }
}

#[test]
fn an_http10_upgrade_is_no_switch_request_and_connect_is() {
    let verdict = |head: &[u8]| match head::inspect(head) {
        HeadVerdict::Complete { upgrade, .. } => upgrade,
        other => panic!("{other:?}"),
    };
    assert!(!verdict(b"GET / HTTP/1.0\r\nUpgrade: websocket\r\n\r\n"));
    assert!(!verdict(b"CONNECT a:1 HTTP/1.0\r\nUpgrade: x\r\n\r\n"));
    assert!(verdict(b"CONNECT a:1 HTTP/1.0\r\n\r\n"));
    assert!(verdict(b"GET / HTTP/1.1\r\nupgrade: \r\n\r\n"));
    assert!(!verdict(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
}
