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
//! [`Smuggling`](super::Smuggling) step answers it 400 problem+json, and hyper closes
//! the connection because of `connection: close`. Nothing after the refused head is ever
//! read; reads stay pending until hyper closes, so an in-flight earlier request is not
//! mistaken for an aborted one.
//!
//! The guard stops inspecting — and passes bytes through untouched — where it cannot
//! follow the stream for certain: when a head outgrows the read limit (hyper then answers
//! 431), or when a chunked body breaks the grammar (hyper then rejects it and closes).
//! hyper's own defences still apply there.
//!
//! A request that asks to switch protocols (CONNECT, or `Upgrade` in HTTP/1.1: exactly the
//! requests hyper offers an upgrade) is followed to the end of its body, and then nothing
//! more is read until it is answered (`Activity::upgrade_answered`): a 101 hands what
//! follows to the tunnel untouched; any other answer resumes inspection at the next head.
//! So bytes a client sends ahead of the answer are never read as HTTP and then tunnelled,
//! nor tunnelled when the connection stays HTTP. The guard only ever sees
//! HTTP/1 connections (the listener picks the protocol first), so an HTTP/2 preface here
//! is an unsupported version, answered 505.
//!
//! Holding back a partial head hides it from hyper, so hyper cannot time it: the guard
//! reports it to the connection's [`Activity`], whose watchdog bounds every head (and the
//! idle time between requests) — see `server::activity`.
//!
//! # Lingering close
//!
//! A client that sends its whole body before reading (no `Expect: 100-continue`) and is
//! answered early — 413, 429, 401 before the body is read — would otherwise lose that
//! answer: closing a socket with unread bytes makes the kernel send a reset, and the reset
//! discards the response the client has not read yet. So when hyper closes a connection
//! that may still have request bytes in flight, the guard first half-closes (FIN), then
//! reads and discards what the client still sends, for at most `LINGERING_TIME` in
//! all, `LINGERING_TIMEOUT` between reads and `LINGERING_BYTES` bytes, as nginx's
//! `lingering_close` does (its defaults: 30 s and 5 s).
//!
//! Cost on the common path: the head is parsed once more (httparse, no allocation) and the
//! bytes are read straight into hyper's buffer; only a head split across reads is copied.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::chunked::{ChunkTracker, Progress};
use super::head::{self, BodyFraming, HeadVerdict, Refusal};
use super::REFUSAL_HEADER;
use crate::edge::listener::Activity;

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
    /// Where partial heads are reported, for the connection's watchdog.
    activity: Arc<Activity>,
    /// Set once hyper closes the connection.
    closing: Option<Box<linger::Linger>>,
}

/// Where in the request stream the next byte falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// At a request head.
    Head,
    /// Inside a body of this many remaining bytes.
    Length(u64, After),
    /// Inside a chunked body.
    Chunked(ChunkTracker, After),
    /// After a request that asked to switch protocols: nothing more is read until its
    /// answer is known (`Activity::upgrade_answered`).
    Upgrading,
    /// Not inspecting any more.
    PassThrough,
    /// Answered 101: the connection is no longer HTTP; bytes pass untouched.
    Switched,
    /// A head was refused; nothing after it is read.
    Refused,
}

/// What follows a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// The next request head.
    Head,
    /// The wait for the answer of a request that asked to switch protocols.
    Answer,
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
    /// The bytes from this offset follow a request that asked to switch protocols: held
    /// until its answer.
    Hold(usize),
}

// === impl Position ===

impl Position {
    /// Follows the stream through `bytes`, advancing `self` past every complete message.
    fn scan(&mut self, bytes: &[u8]) -> Scan {
        let mut at = 0;
        while at < bytes.len() {
            match *self {
                Position::PassThrough | Position::Switched | Position::Refused => {
                    return Scan::Clear
                }
                Position::Upgrading => return Scan::Hold(at),
                Position::Length(left, after) => {
                    let take = left.min((bytes.len() - at) as u64);
                    at += take as usize;
                    *self = match left - take {
                        0 => after.position(),
                        left => Position::Length(left, after),
                    };
                }
                Position::Chunked(mut tracker, after) => match tracker.advance(&bytes[at..]) {
                    Progress::Continues => {
                        *self = Position::Chunked(tracker, after);
                        return Scan::Clear;
                    }
                    Progress::Ended(used) => {
                        at += used;
                        *self = after.position();
                    }
                    Progress::Lost => {
                        *self = Position::PassThrough;
                        return Scan::Clear;
                    }
                },
                Position::Head => {
                    let rest = &bytes[at..];
                    match head::inspect(rest) {
                        HeadVerdict::Incomplete => return Scan::HeadIncomplete(at),
                        HeadVerdict::Refused(refusal) => {
                            *self = Position::Refused;
                            return Scan::Refused(at, refusal);
                        }
                        HeadVerdict::Complete { len, body, upgrade } => {
                            at += len;
                            let after = if upgrade { After::Answer } else { After::Head };
                            *self = match body {
                                BodyFraming::Empty => after.position(),
                                BodyFraming::Length(n) => Position::Length(n, after),
                                BodyFraming::Chunked => {
                                    Position::Chunked(ChunkTracker::new(), after)
                                }
                            };
                        }
                    }
                }
            }
        }
        if *self == Position::Upgrading {
            return Scan::Hold(at);
        }
        Scan::Clear
    }
}

// === impl After ===

impl After {
    fn position(self) -> Position {
        match self {
            After::Head => Position::Head,
            After::Answer => Position::Upgrading,
        }
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
    /// uninspected (hyper's own size limit answers them); a head that arrives in part is
    /// reported to `activity`, whose watchdog bounds it in time.
    pub fn new(io: IO, max_head_bytes: usize, activity: Arc<Activity>) -> Self {
        Self {
            io,
            position: Position::Head,
            held: Vec::new(),
            releasable: 0,
            released: 0,
            max_head_bytes,
            activity,
            closing: None,
        }
    }

    /// Tells the watchdog whether a head is arriving in part.
    fn report_head(&self) {
        if self.position == Position::Head && self.held.len() > self.releasable {
            self.activity.head_started();
        } else {
            self.activity.head_done();
        }
    }

    /// May request bytes still be on their way (a body hyper stopped reading, a refused or
    /// uninspected stream, a head held back)?
    fn may_have_unread_input(&self) -> bool {
        self.position != Position::Head || self.released < self.held.len()
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
            Scan::Hold(at) => self.releasable += at,
        }
    }

    /// Acts on the answer to the request the guard holds back after.
    fn settle_upgrade(&mut self, switched: bool) {
        if switched {
            // hyper hands the connection, with what it has read, to the upgrade; what the
            // guard held follows untouched.
            self.position = Position::Switched;
            self.releasable = self.held.len();
        } else {
            self.position = Position::Head;
            let scan = self.position.scan(&self.held[self.releasable..]);
            self.settle_held(scan);
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
        this.report_head();
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
            match self.position {
                // Never read past a refused head; hyper closes after answering it.
                Position::Refused => return Poll::Pending,
                // Nor past a request that asked to switch protocols, until its answer.
                Position::Upgrading => match self.activity.poll_upgrade_answer(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(switched) => {
                        self.settle_upgrade(switched);
                        continue;
                    }
                },
                _ => {}
            }
            let before = buf.filled().len();
            if Pin::new(&mut self.io).poll_read(cx, buf)?.is_pending() {
                return Poll::Pending;
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
                    Scan::Hold(at) => {
                        self.held.extend_from_slice(&buf.filled()[before + at..]);
                        buf.set_filled(before + at);
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

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for FramingGuard<IO> {
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
        let this = self.get_mut();
        if this.position == Position::Switched {
            // A switched connection is closed by its tunnel, which lingers no more.
            return Pin::new(&mut this.io).poll_shutdown(cx);
        }
        this.poll_close(cx)
    }
}

mod linger;

#[cfg(test)]
mod tests;
