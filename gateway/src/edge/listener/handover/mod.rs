//! Zero-downtime restart and binary upgrade: the running gateway hands its listening sockets
//! to a successor, which serves them before the running one stops accepting.
//!
//! # How a hand-over goes
//!
//! nginx's signal, Pingora's and Envoy's hand-over:
//!
//! 1. `SIGUSR2` (or `portcullis upgrade --pid PID`, which sends it) asks the running process
//!    to start its successor from the same executable path and arguments it was started with
//!    ([`Invocation`]: argv\[0\] resolved at start-up against the working directory or
//!    `PATH`, so a binary swapped in at that path is what starts, not the deleted old file).
//! 2. The running process listens on a Unix socket in a private directory ([`runtime_dir`],
//!    mode 0700; the socket 0600, named by its PID, removed afterwards) and passes the
//!    successor the socket's path in `PORTCULLIS_HANDOVER_SOCKET`.
//! 3. The successor connects, checks the peer (`SO_PEERCRED`: same uid, its parent), and
//!    receives the listening sockets (proxy, admin, demo) as descriptors (`SCM_RIGHTS`); the
//!    running process checks the peer is the child it started. Both then accept from the
//!    same kernel queue, so no connection is refused in between.
//! 4. The successor completes its whole start-up (configuration, stores, upstreams) on those
//!    sockets and writes `ready`. Only then does the running process stop accepting, mark
//!    itself not ready and drain within `server.shutdown_grace` (`edge::listener`, section
//!    Shutdown), then exit 0.
//! 5. If the successor fails (configuration refused, a store that cannot be opened, an exit
//!    or a silence of [`HANDOVER_TIMEOUT`] before `ready`), the running process keeps serving
//!    and logs why at error (a successor that cannot start writes `failed: <its error>`
//!    first); a successor still running then is killed by PID. A second
//!    `SIGUSR2` while a hand-over is under way is refused with a log line.
//!
//! The outcome is written to `<runtime dir>/<pid>.status` (`ready <successor pid>` or
//! `failed: <reason>`), which `portcullis upgrade` waits for ([`status`]).

mod predecessor;
pub mod status;
mod successor;

use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

pub(crate) use predecessor::watch;
pub use successor::report_failure;
pub(crate) use successor::{receive, Inherited};

/// The environment variable naming the Unix socket a successor takes its sockets from.
pub const ENV_SOCKET: &str = "PORTCULLIS_HANDOVER_SOCKET";
/// How long a successor has to connect and then to finish its start-up.
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Listening sockets passed at most (proxy, admin, demo).
const MAX_SOCKETS: usize = 8;

/// Why a hand-over (either side) or `portcullis upgrade` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoverError {
    /// The private directory for the socket and status file cannot be used.
    #[error("hand-over directory {path}: {reason}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The process on the other end of the Unix socket is not the expected one.
    #[error("hand-over peer refused: {0}")]
    Peer(String),
    /// The successor exited before it was ready.
    #[error("successor (pid {pid}) exited before it was ready ({status}); its log says why")]
    Exited {
        /// Its PID.
        pid: u32,
        /// How it exited.
        status: std::process::ExitStatus,
    },
    /// The successor said why it cannot start.
    #[error("successor (pid {pid}) could not start: {reason}")]
    Failed {
        /// Its PID.
        pid: u32,
        /// Its start-up error.
        reason: String,
    },
    /// The successor closed the hand-over socket without saying it was ready.
    #[error("successor (pid {0}) gave up before it was ready; its log says why")]
    NotReady(u32),
    /// The successor did not get ready in time.
    #[error("successor (pid {pid}) not ready within {timeout:?}; stopped")]
    Timeout {
        /// Its PID.
        pid: u32,
        /// The bound.
        timeout: Duration,
    },
    /// The binary was not started through `main` (no invocation to repeat).
    #[error("this process cannot start a successor (no command line recorded)")]
    NoInvocation,
    /// Another hand-over is in progress, or this process has handed over already.
    #[error("{0}")]
    Refused(&'static str),
}

impl HandoverError {
    fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { what, source }
    }
}

/// The command line a successor is started with: the executable path as the process was
/// started (not `/proc/self/exe`, which after a binary swap names the old, deleted inode)
/// and the same arguments.
#[derive(Debug, Clone)]
pub struct Invocation {
    program: PathBuf,
    args: Vec<OsString>,
}

static INVOCATION: OnceLock<Invocation> = OnceLock::new();

// === impl Invocation ===

impl Invocation {
    /// Records this process's command line (argv\[0\] resolved now, against the start-up
    /// working directory or `PATH`, as nginx does): the binary calls it first thing, and
    /// only then can the gateway start a successor.
    pub fn remember() {
        let mut args = std::env::args_os();
        let Some(argv0) = args.next() else { return };
        let program = resolve(Path::new(&argv0));
        let _ = INVOCATION.set(Self {
            program,
            args: args.collect(),
        });
    }

    fn get() -> Option<&'static Self> {
        INVOCATION.get()
    }
}

/// argv\[0\] as a path that still names the same file after a `chdir`: relative paths are
/// joined to the working directory, a bare name is looked up in `PATH`; the running
/// executable's path is the fallback.
fn resolve(argv0: &Path) -> PathBuf {
    if argv0.components().count() > 1 || argv0.is_absolute() {
        return match std::env::current_dir() {
            Ok(cwd) => cwd.join(argv0),
            Err(_) => argv0.to_path_buf(),
        };
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(argv0))
            .find(|candidate| {
                candidate
                    .metadata()
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
    });
    found
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| argv0.to_path_buf())
}

/// The private directory holding the hand-over socket and status files:
/// `$XDG_RUNTIME_DIR/portcullis`, else `<temp dir>/portcullis-<uid>`; created with mode
/// 0700, and refused unless it is a directory owned by this user that nobody else can enter.
pub fn runtime_dir() -> Result<PathBuf, HandoverError> {
    let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    private_dir(xdg, std::env::temp_dir())
}

/// [`runtime_dir`] as the process `pid` sees it: its own `XDG_RUNTIME_DIR` and `TMPDIR`,
/// read from `/proc/PID/environ` (a shell's session often has an `XDG_RUNTIME_DIR` that a
/// system service does not), else this process's.
pub(crate) fn runtime_dir_of(pid: u32) -> Result<PathBuf, HandoverError> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return runtime_dir();
    };
    let var = |name: &[u8]| {
        environ.split(|b| *b == 0).find_map(|entry| {
            let value = entry.strip_prefix(name)?.strip_prefix(b"=")?;
            Some(PathBuf::from(std::ffi::OsStr::from_bytes(value)))
        })
    };
    let temp = var(b"TMPDIR")
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    private_dir(var(b"XDG_RUNTIME_DIR"), temp)
}

/// `xdg/portcullis`, else `temp/portcullis-<uid>`, created 0700 and checked.
fn private_dir(xdg: Option<PathBuf>, temp: PathBuf) -> Result<PathBuf, HandoverError> {
    let uid = rustix::process::getuid().as_raw();
    let dir = match xdg {
        Some(base) if base.is_absolute() => base.join("portcullis"),
        _ => temp.join(format!("portcullis-{uid}")),
    };
    let refuse = |reason: String| HandoverError::Directory {
        path: dir.clone(),
        reason,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(refuse(err.to_string())),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|err| refuse(err.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse("not a directory".into()));
    }
    if meta.uid() != uid {
        return Err(refuse(format!("owned by uid {}, not {uid}", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "mode {:o}: others may enter it (want 0700)",
            meta.mode() & 0o777
        )));
    }
    Ok(dir)
}

/// Tells systemd (`Type=notify`, `NOTIFY_SOCKET`) that this process is ready and is the
/// service's main process: after a hand-over the successor becomes the main PID (which
/// needs `NotifyAccess=all`, the message coming from a process systemd did not start).
pub(crate) fn notify_systemd() {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        if let Err(err) = notify(&path) {
            tracing::warn!(%err, "cannot notify systemd through NOTIFY_SOCKET");
        }
    }
}

/// Sends systemd's readiness message to `path` (a file, or `@name` in the abstract namespace).
fn notify(path: &std::ffi::OsStr) -> std::io::Result<usize> {
    use std::os::unix::ffi::OsStrExt;
    let message = format!("READY=1\nMAINPID={}\n", std::process::id());
    let socket = std::os::unix::net::UnixDatagram::unbound()?;
    match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message.as_bytes(), &addr)
        }
        None => socket.send_to(message.as_bytes(), path),
    }
}

/// The hand-over socket of the process `pid`.
fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv0_is_resolved_to_a_path_that_survives_a_chdir() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(resolve(Path::new("./bin/x")), cwd.join("./bin/x"));
        assert_eq!(
            resolve(Path::new("/usr/bin/x")),
            PathBuf::from("/usr/bin/x")
        );
        // A bare name found in PATH (`sh` is everywhere).
        let sh = resolve(Path::new("sh"));
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
    }

    #[test]
    fn systemd_hears_ready_and_the_main_pid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let systemd = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        notify(path.as_os_str()).unwrap();
        let mut buf = [0u8; 128];
        let n = systemd.recv(&mut buf).unwrap();
        let text = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(text, format!("READY=1\nMAINPID={}\n", std::process::id()));
    }
}
