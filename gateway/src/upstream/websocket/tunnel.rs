//! One tunnel: the bytes of an upgraded connection copied both ways, each direction read
//! only as fast as the other side takes it (one buffer per direction, written whole before
//! the next read), until either side closes or a limit ends it.
//!
//! A limit (idle, lifetime, drain) stops both directions at their next frame boundary
//! (waiting at most [`FINISH_FRAME`] for a frame in progress), sends each side a close
//! frame with 1001 and the reason, ends the writes, and waits at most [`CLOSE_WAIT`] for
//! both sides to close. A direction that cannot reach a boundary in time is cut without a
//! close frame.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use metrics::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::frames::{close_frame, Frames};
use super::Meters;
use crate::config::WebSocketSettings;
use crate::edge::upgrade::ConnectionHold;

/// Bytes read at once per direction.
const BUFFER: usize = 16 * 1024;
/// Longest wait for a frame in progress to end once the tunnel is closing.
pub(crate) const FINISH_FRAME: Duration = Duration::from_secs(1);
/// Longest wait for both sides to close after the close frames.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// RFC 6455 §7.4.1: "going away".
pub(crate) const GOING_AWAY: u16 = 1001;

/// Why the gateway closed a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    Idle,
    Lifetime,
    Drain,
}

/// How one direction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// Its reader reached the end of the stream (the end was passed on).
    Eof,
    /// Reading or writing failed.
    Failed,
    /// Stopped by a limit; `true` between two frames.
    Stopped(bool),
}

/// One direction, handed back when it ends.
struct Ended<R, W> {
    from: R,
    to: W,
    how: How,
}

// === impl Reason ===

impl Reason {
    fn text(self) -> &'static str {
        match self {
            Reason::Idle => "idle timeout",
            Reason::Lifetime => "maximum lifetime reached",
            Reason::Drain => "gateway shutting down",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Reason::Idle => "idle",
            Reason::Lifetime => "lifetime",
            Reason::Drain => "drain",
        }
    }
}

/// Runs the tunnel between `client` and `upstream` to its end.
pub(crate) async fn run(
    client: Upgraded,
    upstream: Upgraded,
    limits: WebSocketSettings,
    mut hold: ConnectionHold,
    meters: &Meters,
) {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (stop_tx, stop) = watch::channel(false);
    let (client_r, client_w) = tokio::io::split(TokioIo::new(client));
    let (upstream_r, upstream_w) = tokio::io::split(TokioIo::new(upstream));
    let up = pump(
        client_r,
        upstream_w,
        &meters.to_upstream,
        stop.clone(),
        &last,
        start,
    );
    let down = pump(upstream_r, client_w, &meters.to_client, stop, &last, start);
    tokio::pin!(up, down);
    let (mut up_end, mut down_end) = (None, None);
    let idle = tokio::time::sleep(limits.idle_timeout);
    let lifetime = async {
        match limits.max_lifetime {
            Some(bound) => tokio::time::sleep(bound).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(idle, lifetime);
    let reason = loop {
        tokio::select! {
            end = &mut up, if up_end.is_none() => {
                up_end = Some(end);
                if down_end.is_some() {
                    break None;
                }
            }
            end = &mut down, if down_end.is_none() => {
                down_end = Some(end);
                if up_end.is_some() {
                    break None;
                }
            }
            () = &mut idle => {
                let deadline = start + Duration::from_millis(last.load(Ordering::Relaxed)) + limits.idle_timeout;
                if deadline <= Instant::now() {
                    break Some(Reason::Idle);
                }
                idle.as_mut().reset(deadline);
            }
            () = &mut lifetime => break Some(Reason::Lifetime),
            () = hold.draining() => break Some(Reason::Drain),
        }
    };
    let Some(reason) = reason else {
        meters.closed("peer");
        return;
    };
    meters.closed(reason.label());
    tracing::debug!(reason = reason.label(), "closing a WebSocket tunnel");
    let _ = stop_tx.send(true);
    let up_end = match up_end {
        Some(end) => Some(end),
        None => tokio::time::timeout(FINISH_FRAME, &mut up).await.ok(),
    };
    let down_end = match down_end {
        Some(end) => Some(end),
        None => tokio::time::timeout(FINISH_FRAME, &mut down).await.ok(),
    };
    // Cut without a close frame: a direction still inside a frame.
    let (Some(up_end), Some(down_end)) = (up_end, down_end) else {
        return;
    };
    let mask = rand::random::<[u8; 4]>();
    let goodbye = async {
        let (mut client_w, mut client_r) = (down_end.to, up_end.from);
        let (mut upstream_w, mut upstream_r) = (up_end.to, down_end.from);
        if down_end.how == How::Stopped(true) {
            let frame = close_frame(GOING_AWAY, reason.text(), None);
            let _ = client_w.write_all(&frame).await;
        }
        if up_end.how == How::Stopped(true) {
            let frame = close_frame(GOING_AWAY, reason.text(), Some(mask));
            let _ = upstream_w.write_all(&frame).await;
        }
        let _ = tokio::join!(client_w.shutdown(), upstream_w.shutdown());
        // Both sides answer with their close frame and close; what they send is discarded.
        tokio::join!(discard(&mut client_r), discard(&mut upstream_r));
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, goodbye).await;
}

/// Copies `from` to `to` until the end of `from`, a failure, or `stop` (then up to the end
/// of the frame in progress).
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    bytes: &Counter,
    mut stop: watch::Receiver<bool>,
    last: &AtomicU64,
    start: Instant,
) -> Ended<R, W>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUFFER].into_boxed_slice();
    let mut frames = Frames::default();
    let mut stopping = false;
    loop {
        if stopping && frames.at_boundary() {
            return Ended {
                from,
                to,
                how: How::Stopped(true),
            };
        }
        let read = if stopping {
            from.read(&mut buf).await
        } else {
            tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => {
                    stopping = true;
                    continue;
                }
                read = from.read(&mut buf) => read,
            }
        };
        let n = match read {
            Ok(0) => {
                // Half-close passed on: the other side may still answer.
                let _ = to.shutdown().await;
                return Ended {
                    from,
                    to,
                    how: How::Eof,
                };
            }
            Ok(n) => n,
            Err(_) => {
                return Ended {
                    from,
                    to,
                    how: How::Failed,
                }
            }
        };
        let since = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(since, Ordering::Relaxed);
        let n = if stopping {
            // Only the rest of the frame in progress; what follows it is dropped.
            frames.advance(&buf[..n])
        } else {
            frames.advance_all(&buf[..n]);
            n
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return Ended {
                from,
                to,
                how: How::Failed,
            };
        }
        bytes.increment(n as u64);
    }
}

/// Reads and drops until the end of the stream or a failure.
async fn discard<R: AsyncRead + Unpin>(from: &mut R) {
    let mut buf = [0u8; 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}
