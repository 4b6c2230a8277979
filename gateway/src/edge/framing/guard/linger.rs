//! Lingering close: after hyper shuts the connection down, discard what the client still
//! sends, within bounds (see the module doc of the guard).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::FramingGuard;

/// The longest a closing connection reads and discards what its client still sends.
pub(crate) const LINGERING_TIME: Duration = Duration::from_secs(30);
/// The longest a lingering close waits for the client's next bytes.
pub(crate) const LINGERING_TIMEOUT: Duration = Duration::from_secs(5);
/// The most a lingering close discards.
pub(crate) const LINGERING_BYTES: u64 = 64 << 20;

/// A closing connection's state.
#[derive(Debug)]
pub(super) struct Linger {
    state: LingerState,
    pub(super) discarded: u64,
    until: Instant,
    quiet: Pin<Box<Sleep>>,
}

/// The steps of a close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LingerState {
    /// Sending our FIN (TLS: close_notify).
    Shutting,
    /// Looking once for bytes already waiting.
    Peeking,
    /// Discarding what the client sends until it stops, or the bounds are reached.
    Draining,
    /// Closed.
    Done,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> FramingGuard<IO> {
    /// Shuts our side down, then lingers while the client may still be sending.
    pub(super) fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let may_have_unread_input = self.may_have_unread_input();
        let linger = self.closing.get_or_insert_with(|| {
            Box::new(Linger {
                state: LingerState::Shutting,
                discarded: 0,
                until: Instant::now() + LINGERING_TIME,
                quiet: Box::pin(tokio::time::sleep(LINGERING_TIMEOUT)),
            })
        });
        if linger.state == LingerState::Shutting {
            ready!(Pin::new(&mut self.io).poll_shutdown(cx))?;
            // Linger where bytes may be on their way, or already wait in the socket (nginx
            // decides the same way: an unread body, pipelined data, a readable socket).
            linger.state = if may_have_unread_input {
                LingerState::Draining
            } else {
                LingerState::Peeking
            };
        }
        let mut scratch = [0u8; 4096];
        while linger.state != LingerState::Done {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    linger.discarded += buf.filled().len() as u64;
                    let quiet_until = (Instant::now() + LINGERING_TIMEOUT).min(linger.until);
                    linger.quiet.as_mut().reset(quiet_until);
                    linger.state = if linger.discarded < LINGERING_BYTES {
                        LingerState::Draining
                    } else {
                        LingerState::Done
                    };
                }
                // End of stream or a broken connection: nothing left to protect.
                Poll::Ready(_) => linger.state = LingerState::Done,
                // Nothing waiting in the socket: close at once.
                Poll::Pending if linger.state == LingerState::Peeking => {
                    linger.state = LingerState::Done
                }
                Poll::Pending => {
                    ready!(linger.quiet.as_mut().poll(cx));
                    linger.state = LingerState::Done;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}
