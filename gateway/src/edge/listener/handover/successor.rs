//! The successor's side: take the listening sockets from the running process at start-up,
//! say `ready` once started, or why it could not start.

use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, PoisonError};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

use super::{HandoverError, ENV_SOCKET, HANDOVER_TIMEOUT, MAX_SOCKETS};

/// The listening sockets a predecessor handed over (none for a fresh start).
#[derive(Debug, Default)]
pub(crate) struct Inherited {
    sockets: Vec<std::net::TcpListener>,
}

/// The connection to the predecessor, from [`receive`] until `ready` or a failure is told.
static CHANNEL: Mutex<Option<UnixStream>> = Mutex::new(None);

/// Takes the sockets from the predecessor named by `PORTCULLIS_HANDOVER_SOCKET`; without it,
/// nothing (a fresh start binds its own). Fails, and the process refuses to start, when the
/// variable is set but the hand-over does not work: binding instead would fail anyway.
pub(crate) fn receive() -> Result<Inherited, HandoverError> {
    let Some(stream) = connect()? else {
        return Ok(Inherited::default());
    };
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut bytes = [0u8; 64];
    rustix::net::recvmsg(
        &stream,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|err| HandoverError::io("receiving the listening sockets")(err.into()))?;
    let mut sockets = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for fd in fds {
                let socket = std::net::TcpListener::from(fd);
                socket
                    .set_nonblocking(true)
                    .map_err(HandoverError::io("inherited socket"))?;
                sockets.push(socket);
            }
        }
    }
    tracing::info!(
        sockets = sockets.len(),
        "took over the listening sockets from the running gateway"
    );
    *CHANNEL.lock().unwrap_or_else(PoisonError::into_inner) = Some(stream);
    Ok(Inherited { sockets })
}

/// Tells the running gateway why this successor cannot start (it logs it and keeps
/// serving); nothing when this process is no successor. The binary calls it on any
/// start-up error, including one before [`receive`] (a configuration refused).
pub fn report_failure(reason: &str) {
    let taken = CHANNEL
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let channel = match taken {
        Some(channel) => Some(channel),
        None => connect().ok().flatten(),
    };
    if let Some(mut channel) = channel {
        let line = reason.replace(['\r', '\n'], " ");
        let _ = channel.write_all(format!("failed: {line}\n").as_bytes());
    }
}

/// Connects to the predecessor named by `PORTCULLIS_HANDOVER_SOCKET` and checks it is our
/// parent, running as our user; `None` without the variable.
fn connect() -> Result<Option<UnixStream>, HandoverError> {
    let Some(path) = std::env::var_os(ENV_SOCKET) else {
        return Ok(None);
    };
    let stream = UnixStream::connect(&path)
        .map_err(HandoverError::io("connecting to the running gateway"))?;
    stream
        .set_read_timeout(Some(HANDOVER_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HANDOVER_TIMEOUT)))
        .map_err(HandoverError::io("hand-over socket"))?;
    let peer = rustix::net::sockopt::socket_peercred(&stream)
        .map_err(|err| HandoverError::io("hand-over peer")(err.into()))?;
    let uid = rustix::process::getuid();
    if peer.uid != uid {
        return Err(HandoverError::Peer(format!(
            "uid {} is not ours ({})",
            peer.uid.as_raw(),
            uid.as_raw()
        )));
    }
    if Some(peer.pid) != rustix::process::getppid() {
        return Err(HandoverError::Peer(format!(
            "pid {} is not our parent",
            peer.pid.as_raw_pid()
        )));
    }
    Ok(Some(stream))
}

// === impl Inherited ===

impl Inherited {
    /// The handed-over socket listening on `addr`, if any; the configured address must match
    /// exactly (a changed address is bound afresh, and the old socket closes with the old
    /// process).
    pub(crate) fn take(&mut self, addr: SocketAddr) -> Option<std::net::TcpListener> {
        let at = self
            .sockets
            .iter()
            .position(|s| s.local_addr().is_ok_and(|local| local == addr))?;
        Some(self.sockets.swap_remove(at))
    }

    /// Tells the predecessor this process has started and serves: it then stops accepting.
    /// Sockets not taken are closed here. Tells systemd too, when it started the service.
    pub(crate) fn ready(mut self) {
        self.sockets.clear();
        super::notify_systemd();
        let channel = CHANNEL
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut channel) = channel {
            if let Err(err) = channel.write_all(b"ready\n") {
                tracing::error!(%err, "cannot tell the running gateway this one is ready");
            }
        }
    }
}
