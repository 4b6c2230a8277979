//! The connection-level half of the defence: an IO wrapper that reads every HTTP/1.x
//! request head before hyper does.
//!
//! hyper never lets a conflicting head reach the request pipeline: it drops
//! `Content-Length` when `Transfer-Encoding` is present, and answers other framing errors
//! with a bare 400. Neither tells the client, in problem+json, that it was refused. So the
//! guard follows the byte stream — head, body by its framing, next head — and when a head
//! must be refused it hands hyper, in its place, a small *refusal head*:
//!
//! ```text
//! GET / HTTP/1.1
//! x-portcullis-refused: content-length-with-transfer-encoding
//! connection: close
//! ```
//!
//! hyper serves that in order (after any pipelined request before it), the
//! [`SmugglingLayer`](super::SmugglingLayer) answers it 400 problem+json, and hyper closes
//! the connection because of `connection: close`. Nothing after the refused head is ever
//! read; reads stay pending until hyper closes, so an in-flight earlier request is not
//! mistaken for an aborted one.
//!
//! The guard stops inspecting — and passes bytes through untouched — where it cannot
//! follow the stream for certain: after an HTTP/2 preface (h2c), when a head outgrows the
//! read limit (hyper then answers 431), or when a chunked body breaks the grammar (hyper
//! then rejects it and closes). hyper's own defences still apply there. CONNECT and Upgrade
//! heads are followed like any other: the gateway never tunnels or switches protocols.
//!
//! Holding back a partial head hides it from hyper, which matters for a connection's first
//! head: with h2c on, protocol detection waits for a byte that differs from the HTTP/2
//! preface, with no timeout of its own, and hyper's header-read timer starts only after it.
//! So the guard keeps its own deadline until the first head is complete. Later heads need
//! none: hyper's timer runs whenever hyper waits for a head, whether or not the guard holds
//! part of it — and a partial next head held while a response is still in flight must not
//! count against anything.
//!
//! Cost on the common path: the head is parsed once more (httparse, no allocation) and the
//! bytes are read straight into hyper's buffer; only a head split across reads is copied.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::chunked::{ChunkTracker, Progress};
use super::head::{self, BodyFraming, HeadVerdict, Refusal};
use super::REFUSAL_HEADER;

/// The first line of the HTTP/2 connection preface (h2c prior knowledge).
const H2_PREFACE_LINE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// Wraps a client connection that hyper serves as HTTP/1.x.
#[derive(Debug)]
pub struct FramingGuard<IO> {
    io: IO,
    position: Position,
    /// Bytes taken from `io` that hyper has not received: an incomplete head, or the
    /// refusal head that replaced a refused one.
    held: Vec<u8>,
    /// `held[..releasable]` may be handed to hyper; the rest is a head still incomplete.
    releasable: usize,
    /// How much of `held` hyper has received.
    released: usize,
    /// The longest head held back; past it the guard stops inspecting.
    max_head_bytes: usize,
    /// How long the connection's first head may take to arrive.
    head_timeout: std::time::Duration,
    /// Running from the first read that found nothing until the first head is complete.
    head_deadline: Option<Pin<Box<Sleep>>>,
}

/// Where in the request stream the next byte falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// At a request head; `first` on a fresh connection (where an h2 preface may come).
    Head { first: bool },
    /// Inside a body of this many remaining bytes.
    Length(u64),
    /// Inside a chunked body.
    Chunked(ChunkTracker),
    /// Not inspecting any more.
    PassThrough,
    /// A head was refused; nothing after it is read.
    Refused,
}

/// What scanning fresh bytes found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Every byte may go to hyper.
    Clear,
    /// The bytes from this offset are the start of a head not complete yet.
    HeadIncomplete(usize),
    /// The head starting at this offset is refused.
    Refused(usize, Refusal),
}

// === impl Position ===

impl Position {
    /// Follows the stream through `bytes`, advancing `self` past every complete message.
    fn scan(&mut self, bytes: &[u8]) -> Scan {
        let mut at = 0;
        while at < bytes.len() {
            match *self {
                Position::PassThrough | Position::Refused => return Scan::Clear,
                Position::Length(left) => {
                    let take = left.min((bytes.len() - at) as u64);
                    at += take as usize;
                    *self = match left - take {
                        0 => Position::Head { first: false },
                        left => Position::Length(left),
                    };
                }
                Position::Chunked(mut tracker) => match tracker.advance(&bytes[at..]) {
                    Progress::Continues => {
                        *self = Position::Chunked(tracker);
                        return Scan::Clear;
                    }
                    Progress::Ended(used) => {
                        at += used;
                        *self = Position::Head { first: false };
                    }
                    Progress::Lost => {
                        *self = Position::PassThrough;
                        return Scan::Clear;
                    }
                },
                Position::Head { first } => {
                    let rest = &bytes[at..];
                    if first
                        && rest.len() < H2_PREFACE_LINE.len()
                        && H2_PREFACE_LINE.starts_with(rest)
                    {
                        return Scan::HeadIncomplete(at);
                    }
                    if first && rest.starts_with(H2_PREFACE_LINE) {
                        *self = Position::PassThrough;
                        return Scan::Clear;
                    }
                    match head::inspect(rest) {
                        HeadVerdict::Incomplete => return Scan::HeadIncomplete(at),
                        HeadVerdict::Refused(refusal) => {
                            *self = Position::Refused;
                            return Scan::Refused(at, refusal);
                        }
                        HeadVerdict::Complete { len, body } => {
                            at += len;
                            *self = match body {
                                BodyFraming::Empty => Position::Head { first: false },
                                BodyFraming::Length(n) => Position::Length(n),
                                BodyFraming::Chunked => Position::Chunked(ChunkTracker::new()),
                            };
                        }
                    }
                }
            }
        }
        Scan::Clear
    }
}

/// The request hyper reads in place of a refused head.
fn refusal_head(refusal: Refusal) -> Vec<u8> {
    format!(
        "GET / HTTP/1.1\r\n{REFUSAL_HEADER}: {}\r\nconnection: close\r\n\r\n",
        refusal.code()
    )
    .into_bytes()
}

// === impl FramingGuard ===

impl<IO> FramingGuard<IO> {
    /// Guards a fresh connection. Heads longer than `max_head_bytes` are passed through
    /// uninspected (hyper's own size limit answers them); a head the guard waits for longer
    /// than `head_timeout` ends the connection.
    pub fn new(io: IO, max_head_bytes: usize, head_timeout: std::time::Duration) -> Self {
        Self {
            io,
            position: Position::Head { first: true },
            held: Vec::new(),
            releasable: 0,
            released: 0,
            max_head_bytes,
            head_timeout,
            head_deadline: None,
        }
    }

    /// Is the connection's first head still incomplete?
    fn awaiting_first_head(&self) -> bool {
        self.position == (Position::Head { first: true })
    }

    /// Called when the connection has nothing to read: `Err` once the first head is overdue.
    fn poll_head_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.awaiting_first_head() {
            self.head_deadline = None;
            return Poll::Pending;
        }
        let timeout = self.head_timeout;
        let deadline = self
            .head_deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(deadline.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "request head not received in time",
        )))
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Hands what may be released to hyper; `true` if anything was.
    fn release(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        if self.released >= self.releasable {
            return false;
        }
        let n = buf.remaining().min(self.releasable - self.released);
        buf.put_slice(&self.held[self.released..self.released + n]);
        self.released += n;
        if self.released == self.releasable {
            // Keep only the incomplete head, if any: a client whose reads keep ending
            // mid-head must not make the buffer grow with what hyper already has.
            if self.released == self.held.len() && self.held.capacity() > 4096 {
                self.held = Vec::new();
            } else {
                self.held.drain(..self.released);
            }
            self.releasable = 0;
            self.released = 0;
        }
        true
    }

    /// Acts on a scan of `held[releasable..]`.
    fn settle_held(&mut self, scan: Scan) {
        match scan {
            Scan::Clear => self.releasable = self.held.len(),
            Scan::HeadIncomplete(at) => {
                self.releasable += at;
                if self.held.len() - self.releasable > self.max_head_bytes {
                    // Too long to hold: let hyper see it and answer 431.
                    self.position = Position::PassThrough;
                    self.releasable = self.held.len();
                }
            }
            Scan::Refused(at, refusal) => {
                self.held.truncate(self.releasable + at);
                self.held.extend_from_slice(&refusal_head(refusal));
                self.releasable = self.held.len();
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FramingGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let read = this.poll_read_guarded(cx, buf);
        if read.is_ready() && this.head_deadline.is_some() && !this.awaiting_first_head() {
            // The first head is through; from here hyper times every head itself.
            this.head_deadline = None;
        }
        read
    }
}

impl<IO: AsyncRead + Unpin> FramingGuard<IO> {
    fn poll_read_guarded(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.release(buf) {
                return Poll::Ready(Ok(()));
            }
            if self.position == Position::Refused {
                // Never read past a refused head; hyper closes after answering it.
                return Poll::Pending;
            }
            let before = buf.filled().len();
            if Pin::new(&mut self.io).poll_read(cx, buf)?.is_pending() {
                return self.poll_head_deadline(cx);
            }
            let fresh = buf.filled().len() - before;
            if self.held.is_empty() {
                // Common path: inspect in hyper's own buffer.
                if fresh == 0 {
                    return Poll::Ready(Ok(()));
                }
                match self.position.scan(&buf.filled()[before..]) {
                    Scan::Clear => return Poll::Ready(Ok(())),
                    Scan::HeadIncomplete(at) => {
                        self.held.extend_from_slice(&buf.filled()[before + at..]);
                        buf.set_filled(before + at);
                        self.settle_held(Scan::HeadIncomplete(0));
                        if at > 0 {
                            return Poll::Ready(Ok(()));
                        }
                    }
                    Scan::Refused(at, refusal) => {
                        buf.set_filled(before + at);
                        self.settle_held(Scan::Refused(0, refusal));
                        if at > 0 {
                            return Poll::Ready(Ok(()));
                        }
                    }
                }
            } else {
                // A head is incomplete: collect behind it, then inspect it again whole.
                self.held.extend_from_slice(&buf.filled()[before..]);
                buf.set_filled(before);
                if fresh == 0 {
                    // End of stream mid-head: hand over what there is; hyper reports it.
                    self.position = Position::PassThrough;
                    self.releasable = self.held.len();
                    continue;
                }
                let scan = self.position.scan(&self.held[self.releasable..]);
                self.settle_held(scan);
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FramingGuard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What hyper would receive when `stream` arrives in pieces of `split` bytes.
    async fn through_guard(stream: &[u8], split: usize) -> Vec<u8> {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut guard = FramingGuard::new(server, 4096, std::time::Duration::from_secs(30));
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
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(5), guard.read(&mut buf));
            match read.await {
                Ok(Ok(0)) => break,
                Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
                Ok(Err(err)) => panic!("{err}"),
                // Pending for good: the guard refused a head and stopped reading.
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
    async fn h2_prefaces_and_oversized_heads_pass_through() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        for split in [1, 3, 4096] {
            assert_eq!(through_guard(preface, split).await, preface);
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
    async fn a_head_the_guard_waits_for_is_bounded_in_time() {
        use std::time::Duration;
        let timeout = Duration::from_secs(2);
        let mut buf = [0u8; 256];

        // Nothing at all on a fresh connection.
        let (_client, server) = tokio::io::duplex(1024);
        let mut guard = FramingGuard::new(server, 4096, timeout);
        let err = guard.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        // Part of a head, then silence.
        let (mut client, server) = tokio::io::duplex(1024);
        let mut guard = FramingGuard::new(server, 4096, timeout);
        client
            .write_all(b"GET / HTTP/1.1\r\nX-Slow: ")
            .await
            .unwrap();
        let err = guard.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        // A whole head, then an idle keep-alive connection: hyper's own timers decide.
        let (mut client, server) = tokio::io::duplex(1024);
        let mut guard = FramingGuard::new(server, 4096, timeout);
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(guard.read(&mut buf).await.unwrap(), 18);
        let idle = tokio::time::timeout(timeout * 10, guard.read(&mut buf)).await;
        assert!(
            idle.is_err(),
            "an idle connection is not the guard's to close"
        );
        // Nor is a later head held in part (hyper may still be answering the first one;
        // its own timer covers the heads it waits for).
        client
            .write_all(b"GET /next HTTP/1.1\r\nX-Slow: ")
            .await
            .unwrap();
        let held = tokio::time::timeout(timeout * 10, guard.read(&mut buf)).await;
        assert!(
            held.is_err(),
            "a later partial head is not the guard's to time"
        );

        // Heads that trickle in, each whole within the deadline, are all served, however
        // long the connection lasts.
        let (mut client, server) = tokio::io::duplex(1024);
        let mut guard = FramingGuard::new(server, 4096, timeout);
        let reader = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut buf = [0u8; 256];
            while seen.len() < 36 {
                let n = guard.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
            seen
        });
        for piece in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"\r\n",
            b"GET / HTTP/1.1\r\n",
            b"\r\n",
        ] {
            tokio::time::sleep(timeout * 3 / 10).await;
            client.write_all(piece).await.unwrap();
        }
        assert_eq!(reader.await.unwrap().len(), 36);
    }

    #[tokio::test(start_paused = true)]
    async fn held_bytes_stay_bounded_when_every_read_ends_mid_head() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut guard = FramingGuard::new(server, 4096, std::time::Duration::from_secs(30));
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
    async fn connect_and_upgrade_heads_do_not_switch_inspection_off() {
        let attack =
            b"POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        for opener in [
            &b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        ] {
            let stream = [opener, &attack[..]].concat();
            let expected = [
                opener,
                &refusal_head(Refusal::LengthWithTransferEncoding)[..],
            ]
            .concat();
            assert_eq!(through_guard(&stream, 4096).await, expected);
        }
    }
}
