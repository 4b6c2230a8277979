//! Protocol detection on plain connections with `server.h2c` on: HTTP/2 with prior
//! knowledge starts with a fixed 24-byte preface (RFC 9113 §3.4); anything else is HTTP/1.
//!
//! The bytes read to decide are handed back in front of the stream ([`Rewind`]), so the
//! protocol's own parser sees the connection from its first byte. Detection stops at the
//! first byte that differs from the preface, so an HTTP/1 request is never delayed.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The HTTP/2 connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a plain connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
}

/// A stream with some already-read bytes put back in front of it.
#[derive(Debug)]
pub(crate) struct Rewind<IO> {
    prefix: Vec<u8>,
    consumed: usize,
    io: IO,
}

/// Reads just enough of `io` to tell HTTP/2 prior knowledge from HTTP/1. The caller bounds
/// the wait (a silent client is the watchdog's business once the connection is served, so
/// detection runs under the same `header_read_timeout`).
pub(crate) async fn sniff<IO: AsyncRead + Unpin>(mut io: IO) -> io::Result<(Protocol, Rewind<IO>)> {
    let mut prefix = Vec::with_capacity(H2_PREFACE.len());
    let mut buf = [0u8; 24];
    let protocol = loop {
        let want = H2_PREFACE.len() - prefix.len();
        let n = io.read(&mut buf[..want]).await?;
        if n == 0 {
            // Closed before deciding: HTTP/1 sees the bytes and the end of stream.
            break Protocol::Http1;
        }
        prefix.extend_from_slice(&buf[..n]);
        if !H2_PREFACE.starts_with(&prefix) {
            break Protocol::Http1;
        }
        if prefix.len() == H2_PREFACE.len() {
            break Protocol::Http2;
        }
    };
    Ok((
        protocol,
        Rewind {
            prefix,
            consumed: 0,
            io,
        },
    ))
}

impl<IO> Rewind<IO> {
    /// The stream with nothing put back.
    pub(crate) fn new(io: IO) -> Self {
        Self {
            prefix: Vec::new(),
            consumed: 0,
            io,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.consumed < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.consumed);
            buf.put_slice(&this.prefix[this.consumed..this.consumed + n]);
            this.consumed += n;
            if this.consumed == this.prefix.len() {
                this.prefix = Vec::new();
                this.consumed = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewind<IO> {
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
    use tokio::io::AsyncWriteExt;

    async fn detect(bytes: &'static [u8], split: usize) -> (Protocol, Vec<u8>) {
        let (mut client, server) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            for piece in bytes.chunks(split) {
                client.write_all(piece).await.unwrap();
                tokio::task::yield_now().await;
            }
            client.shutdown().await.unwrap();
        });
        let (protocol, mut rewound) = sniff(server).await.unwrap();
        let mut seen = Vec::new();
        rewound.read_to_end(&mut seen).await.unwrap();
        writer.await.unwrap();
        (protocol, seen)
    }

    #[tokio::test]
    async fn tells_prior_knowledge_from_http1_and_hands_every_byte_back() {
        let h2: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04";
        let h1: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        // An HTTP/1 line that shares the preface's first bytes.
        let almost: &[u8] = b"PRI * HTTP/1.1\r\nHost: a\r\n\r\n";
        for split in [1, 3, 24, 100] {
            assert_eq!(detect(h2, split).await, (Protocol::Http2, h2.to_vec()));
            assert_eq!(detect(h1, split).await, (Protocol::Http1, h1.to_vec()));
            assert_eq!(
                detect(almost, split).await,
                (Protocol::Http1, almost.to_vec())
            );
        }
        assert_eq!(detect(b"PRI", 1).await, (Protocol::Http1, b"PRI".to_vec()));
    }
}
