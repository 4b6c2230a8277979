//! Child processes that are always stopped by PID, and bounded readiness waits.

use std::io;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

/// How often readiness checks poll, and how many times at most (10 s in all by default).
pub const READY_POLL: Duration = Duration::from_millis(50);
/// Default number of readiness polls before giving up.
pub const READY_ATTEMPTS: u32 = 200;

/// Owns a child process; on drop, kills it (SIGKILL) and reaps it, so no test leaks a server.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
    name: String,
}

// === impl ChildGuard ===

impl ChildGuard {
    /// Spawns `command` and guards the child.
    pub fn spawn(name: &str, mut command: Command) -> io::Result<Self> {
        let child = command.spawn()?;
        Ok(Self {
            child: Some(child),
            name: name.to_owned(),
        })
    }

    /// The child's PID (0 once it has been reaped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Sends a named signal (`TERM`, `INT`, `STOP`, `CONT`, `KILL`, `HUP`) to the child by PID.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid();
        if pid == 0 {
            return;
        }
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status();
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Waits (bounded) for the child to exit by itself; returns its exit status if it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let polls = (timeout.as_millis() / READY_POLL.as_millis()).max(1);
        for _ in 0..polls {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Some(status);
                }
            }
            tokio::time::sleep(READY_POLL).await;
        }
        None
    }

    /// Kills the child now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            tracing::debug!(name = %self.name, "child stopped");
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls until a TCP connection to `addr` succeeds; false after `attempts` polls.
pub async fn wait_for_tcp(addr: SocketAddr, attempts: u32) -> bool {
    for _ in 0..attempts {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return true;
        }
        tokio::time::sleep(READY_POLL).await;
    }
    false
}
