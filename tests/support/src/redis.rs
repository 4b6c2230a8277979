//! Real `redis-server` processes for tests.

use std::process::{Command, Stdio};

use crate::ports::free_port;
use crate::process::{wait_for_tcp, ChildGuard, READY_ATTEMPTS};

/// Environment variable holding the URL of the shared Redis started by `scripts/test.sh`.
pub const SHARED_URL_ENV: &str = "PORTCULLIS_TEST_REDIS_URL";

/// URL of the shared Redis server. Panics with instructions when the test command did not set it:
/// a Redis test must never pass silently without Redis.
pub fn shared_url() -> String {
    std::env::var(SHARED_URL_ENV).unwrap_or_else(|_| {
        panic!("{SHARED_URL_ENV} is not set: run the suite with scripts/test.sh, which starts a real redis-server")
    })
}

/// A private `redis-server` child on a free loopback port, for tests that stop or pause it.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    guard: Option<ChildGuard>,
    dir: tempfile::TempDir,
    durable: bool,
}

// === impl RedisServer ===

impl RedisServer {
    /// Starts a new server on a free port and waits (bounded) until it accepts connections.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = Self {
            port: free_port(),
            guard: None,
            dir,
            durable: false,
        };
        server.spawn().await;
        server
    }

    /// Starts a server that persists every write before answering (`appendonly yes`,
    /// `appendfsync always`) in its own directory: [`RedisServer::restart`] (even after
    /// [`RedisServer::kill`]) brings back everything it acknowledged.
    pub async fn start_durable() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = Self {
            port: free_port(),
            guard: None,
            dir,
            durable: true,
        };
        server.spawn().await;
        server
    }

    async fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"]);
        if self.durable {
            cmd.args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ]);
        } else {
            cmd.args(["--save", "", "--appendonly", "no"]);
        }
        cmd.arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let guard =
            ChildGuard::spawn("redis-server", cmd).expect("spawn redis-server (is it installed?)");
        self.guard = Some(guard);
        let addr = ([127, 0, 0, 1], self.port).into();
        assert!(
            wait_for_tcp(addr, READY_ATTEMPTS).await,
            "redis-server did not start on {addr}"
        );
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The child guard, to send signals (`STOP`/`CONT`) to the server.
    pub fn guard(&self) -> Option<&ChildGuard> {
        self.guard.as_ref()
    }

    /// Kills the server (SIGKILL); its port stays reserved for [`RedisServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            guard.kill();
        }
    }

    /// Starts the server again on the same port: an empty dataset, or for a
    /// [`RedisServer::start_durable`] one, what its append-only file holds.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}
