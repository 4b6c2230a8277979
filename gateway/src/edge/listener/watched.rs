//! A connection whose writes report to its [`Activity`]: a write that finds the client's
//! side full starts the send deadline, a write that goes through ends it (nginx's
//! `send_timeout`, measured between two successive writes).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::Activity;

/// `io`, with its writes watched.
#[derive(Debug)]
pub(crate) struct Watched<IO> {
    io: IO,
    activity: Arc<Activity>,
}

impl<IO> Watched<IO> {
    pub(crate) fn new(io: IO, activity: Arc<Activity>) -> Self {
        Self { io, activity }
    }

    fn observe<T>(&self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match &poll {
            Poll::Pending => self.activity.write_blocked(),
            Poll::Ready(_) => self.activity.write_progressed(),
        }
        poll
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.observe(poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.observe(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.observe(poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::listener::activity::{Expiry, Timeouts};
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_full_client_side_starts_the_send_deadline_and_progress_ends_it() {
        let timeouts = Timeouts {
            header_read: Duration::from_secs(10),
            keep_alive: Duration::from_secs(75),
            send: Duration::from_secs(60),
        };
        let activity = Activity::new();
        let _request = activity.request();
        let (mut client, server) = tokio::io::duplex(16);
        let mut watched = Watched::new(server, activity.clone());
        watched.write_all(&[0; 16]).await.unwrap();
        // The client reads nothing: the next write waits.
        let stalled = tokio::time::timeout(Duration::from_millis(1), watched.write_all(&[0; 8]));
        assert!(stalled.await.is_err());
        assert_eq!(activity.deadline(&timeouts).unwrap().1, Expiry::Send);
        let mut sink = [0u8; 16];
        tokio::io::AsyncReadExt::read_exact(&mut client, &mut sink)
            .await
            .unwrap();
        watched.write_all(&[0; 8]).await.unwrap();
        assert_eq!(activity.deadline(&timeouts), None);
    }
}
