//! The running process's side: on `SIGUSR2`, start the successor, pass it the listening
//! sockets, and stop accepting only once it says it is ready.

use std::future::Future;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::process::Child;
use tokio::sync::{mpsc, watch};

use super::status::{self, Outcome};
use super::{runtime_dir, socket_path, HandoverError, Invocation, HANDOVER_TIMEOUT, MAX_SOCKETS};

/// Resolves once a successor has taken over: the listeners then stop accepting and drain.
#[derive(Debug, Clone)]
pub(crate) struct HandedOver(watch::Receiver<bool>);

// === impl HandedOver ===

impl HandedOver {
    /// Resolves when the successor is ready; never, if there is none.
    pub(crate) fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut done = self.0.clone();
        async move {
            if done.wait_for(|done| *done).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Listens for `SIGUSR2` and hands `sockets` over to a successor on each (see the module
/// docs). Inert when the binary recorded no [`Invocation`] (the gateway run as a library).
pub(crate) fn watch(sockets: &[&TcpListener]) -> HandedOver {
    let (done, handed_over) = watch::channel(false);
    let Some(invocation) = Invocation::get() else {
        return HandedOver(handed_over);
    };
    let fds: Vec<OwnedFd> = sockets
        .iter()
        .filter_map(|socket| socket.as_fd().try_clone_to_owned().ok())
        .collect();
    let mut usr2 =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2()) {
            Ok(signal) => signal,
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGUSR2: no binary upgrade");
                return HandedOver(handed_over);
            }
        };
    let fds = Arc::new(fds);
    tokio::spawn(async move {
        let (finished, mut results) = mpsc::channel(1);
        let mut in_progress = false;
        loop {
            tokio::select! {
                signal = usr2.recv() => {
                    if signal.is_none() {
                        break;
                    }
                    if *done.borrow() {
                        tracing::warn!("SIGUSR2 refused: this gateway has handed over already and is draining");
                        continue;
                    }
                    if in_progress {
                        tracing::warn!("SIGUSR2 refused: a hand-over is already in progress");
                        continue;
                    }
                    in_progress = true;
                    tracing::info!("SIGUSR2: starting a successor to hand the listening sockets to");
                    let (fds, finished) = (fds.clone(), finished.clone());
                    tokio::spawn(async move {
                        let _ = finished.send(attempt(invocation, &fds).await).await;
                    });
                }
                Some(result) = results.recv() => {
                    in_progress = false;
                    match result {
                        Ok(pid) => {
                            let _ = done.send(true);
                            // Let the accept loops see the stop before the status says so.
                            tokio::task::yield_now().await;
                            tracing::info!(successor = pid, "hand-over complete: the successor serves; this gateway stops accepting and drains");
                            status::write(Outcome::Ready(pid));
                        }
                        Err(err) => {
                            tracing::error!(%err, "hand-over failed; this gateway keeps serving");
                            status::write(Outcome::Failed(err.to_string()));
                        }
                    }
                }
            }
        }
    });
    HandedOver(handed_over)
}

/// One hand-over: start the successor and see it through to `ready`; the successor's PID.
async fn attempt(invocation: &Invocation, fds: &[OwnedFd]) -> Result<u32, HandoverError> {
    let dir = runtime_dir()?;
    let path = socket_path(&dir, std::process::id());
    let _ = std::fs::remove_file(&path);
    let listener =
        UnixListener::bind(&path).map_err(HandoverError::io("binding the hand-over socket"))?;
    let _remove = RemoveOnDrop(path.clone());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(HandoverError::io("hand-over socket mode"))?;
    let mut child = tokio::process::Command::new(&invocation.program)
        .args(&invocation.args)
        .env(super::ENV_SOCKET, &path)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(HandoverError::io("starting the successor"))?;
    let pid = child.id().unwrap_or(0);
    tracing::info!(
        successor = pid,
        program = %invocation.program.display(),
        "hand-over: successor started"
    );
    let result =
        tokio::time::timeout(HANDOVER_TIMEOUT, converse(&listener, fds, &mut child, pid)).await;
    let err = match result {
        Ok(Ok(())) => return Ok(pid),
        Ok(Err(err)) => err,
        Err(_) => HandoverError::Timeout {
            pid,
            timeout: HANDOVER_TIMEOUT,
        },
    };
    // A successor that did not get ready must not keep our sockets (or serve on them).
    if child.start_kill().is_ok() {
        let _ = tokio::time::timeout(HANDOVER_TIMEOUT, child.wait()).await;
    }
    Err(err)
}

/// Accepts the successor's connection, checks it is the child, passes the sockets, and waits
/// for its `ready` (or its exit).
async fn converse(
    listener: &UnixListener,
    fds: &[OwnedFd],
    child: &mut Child,
    pid: u32,
) -> Result<(), HandoverError> {
    let exited = |status: std::io::Result<std::process::ExitStatus>| match status {
        Ok(status) => HandoverError::Exited { pid, status },
        Err(source) => HandoverError::Io {
            what: "waiting for the successor",
            source,
        },
    };
    let mut stream = tokio::select! {
        // The connection first: a successor that fails early connects, writes why and
        // exits, so both may be ready at once.
        biased;
        accepted = listener.accept() => accepted.map_err(HandoverError::io("accepting the successor"))?.0,
        status = child.wait() => return Err(exited(status)),
    };
    let peer = stream
        .peer_cred()
        .map_err(HandoverError::io("hand-over peer"))?;
    let uid = rustix::process::getuid().as_raw();
    if peer.uid() != uid || peer.pid() != i32::try_from(pid).ok() {
        return Err(HandoverError::Peer(format!(
            "uid {} pid {:?} is not the successor (uid {uid} pid {pid})",
            peer.uid(),
            peer.pid()
        )));
    }
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(
        &borrowed[..borrowed.len().min(MAX_SOCKETS)],
    )) {
        return Err(HandoverError::Refused("too many sockets to hand over"));
    }
    stream
        .writable()
        .await
        .map_err(HandoverError::io("hand-over socket"))?;
    let sent = rustix::net::sendmsg(
        &stream,
        &[IoSlice::new(b"sockets\n")],
        &mut control,
        SendFlags::empty(),
    );
    // `ready`, or `failed: <why>`: one line, bounded.
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new((&mut stream).take(4096));
    if let Err(err) = sent {
        // A successor that failed before taking the sockets wrote why and closed its end.
        let _ = reader.read_line(&mut line).await;
        return Err(match line.strip_prefix("failed: ") {
            Some(reason) => HandoverError::Failed {
                pid,
                reason: reason.trim_end().to_owned(),
            },
            None => HandoverError::io("passing the listening sockets")(err.into()),
        });
    }
    tokio::select! {
        // The line first: a successor writes why it fails just before it exits.
        biased;
        read = reader.read_line(&mut line) => match (read, line.strip_prefix("failed: ")) {
            (Ok(_), None) if line == "ready\n" => Ok(()),
            (Ok(_), Some(reason)) => Err(HandoverError::Failed { pid, reason: reason.trim_end().to_owned() }),
            _ => Err(HandoverError::NotReady(pid)),
        },
        status = child.wait() => Err(exited(status)),
    }
}

/// Removes the hand-over socket when the attempt ends, however it ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
