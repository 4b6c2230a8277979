//! Spawning the real `portcullis` binary with a temporary configuration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ports::free_addr;
use crate::process::{ChildGuard, READY_ATTEMPTS, READY_POLL};

/// A running gateway process with its own temp directory (config, SQLite file, log).
#[derive(Debug)]
pub struct GatewayProcess {
    /// Proxy listener.
    pub addr: SocketAddr,
    /// Admin / operations listener.
    pub admin_addr: SocketAddr,
    guard: ChildGuard,
    dir: tempfile::TempDir,
    tls_ca: Option<String>,
}

/// Options for [`GatewayProcess::start_with`].
#[derive(Debug, Default, Clone)]
pub struct GatewayOptions {
    /// Extra environment variables for the process.
    pub env: Vec<(String, String)>,
    /// Fixed listen address (to restart a gateway on the same port); free port when `None`.
    pub listen: Option<SocketAddr>,
    /// Fixed admin address; free port when `None`.
    pub admin_listen: Option<SocketAddr>,
    /// The proxy listener terminates TLS with a certificate from this CA (PEM): health
    /// checks go over TLS and [`GatewayProcess::url`] is `https://`.
    pub tls_ca: Option<String>,
}

// === impl GatewayProcess ===

impl GatewayProcess {
    /// Writes `config` and starts `bin` on it, then waits (bounded) for `/healthz`.
    ///
    /// `{listen}` and `{admin_listen}` in `config` are replaced by free loopback addresses; when
    /// the text has no `[server]` table, one with those two addresses is prepended. Panics with
    /// the process log if the gateway does not become healthy.
    pub async fn start(bin: &str, config: &str) -> Self {
        Self::start_with(bin, config, GatewayOptions::default()).await
    }

    /// [`GatewayProcess::start`] with extra options.
    ///
    /// Free ports are picked by binding `:0` and releasing, so another process can grab one
    /// before the gateway binds it. The gateway logs `portcullis listening` only after both
    /// listeners are bound; until that line appears nothing answering on the port is trusted,
    /// and if the gateway exits without it (port taken) it is started again on new ports.
    pub async fn start_with(bin: &str, config: &str, options: GatewayOptions) -> Self {
        const ATTEMPTS: u32 = 3;
        let mut last_log = String::new();
        for _ in 0..ATTEMPTS {
            let dir = tempfile::tempdir().expect("temp dir for gateway");
            let addr = options.listen.unwrap_or_else(free_addr);
            let admin_addr = options.admin_listen.unwrap_or_else(free_addr);
            let rendered = render_config(config, addr, admin_addr);
            let config_path = dir.path().join("portcullis.toml");
            std::fs::write(&config_path, rendered).expect("write gateway config");
            let guard = spawn(bin, dir.path(), &config_path, &options.env);
            let mut gateway = Self {
                addr,
                admin_addr,
                guard,
                dir,
                tls_ca: options.tls_ca.clone(),
            };
            if gateway.wait_listening().await && gateway.wait_healthy().await {
                return gateway;
            }
            last_log = gateway.logs();
            let port_taken = last_log.contains("cannot listen");
            if !port_taken || options.listen.is_some() {
                break;
            }
        }
        panic!("gateway did not become healthy; log:\n{last_log}");
    }

    /// Waits (bounded) for the gateway's own "listening" log line; false if it exits first.
    async fn wait_listening(&mut self) -> bool {
        for _ in 0..READY_ATTEMPTS {
            if self.logs().contains("portcullis listening") {
                return true;
            }
            if !self.guard.is_running() {
                return false;
            }
            tokio::time::sleep(READY_POLL).await;
        }
        false
    }

    /// Polls `/healthz` on the proxy listener; false after the bounded number of attempts or
    /// when the process exited.
    pub async fn wait_healthy(&self) -> bool {
        for _ in 0..READY_ATTEMPTS {
            let status = match &self.tls_ca {
                None => raw_get_status(self.addr, "/healthz").await,
                Some(ca) => crate::tls::tls_get_status(self.addr, ca, "/healthz").await,
            };
            if let Some(status) = status {
                if status == 200 {
                    return true;
                }
            }
            tokio::time::sleep(READY_POLL).await;
        }
        false
    }

    /// `http://ADDR` of the proxy listener (`https://` when it terminates TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls_ca.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// `http://ADDR` of the admin listener.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// Everything the process wrote to stdout and stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    /// The process's temp directory (config, SQLite database, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The child guard (PID, signals).
    pub fn guard(&mut self) -> &mut ChildGuard {
        &mut self.guard
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit; returns whether it did.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.guard.signal("TERM");
        self.guard.wait_exit(timeout).await
    }
}

fn render_config(config: &str, addr: SocketAddr, admin_addr: SocketAddr) -> String {
    let config = config
        .replace("{listen}", &addr.to_string())
        .replace("{admin_listen}", &admin_addr.to_string());
    if config.contains("[server]") {
        config
    } else {
        format!("[server]\nlisten = \"{addr}\"\nadmin_listen = \"{admin_addr}\"\n\n{config}")
    }
}

fn spawn(bin: &str, dir: &Path, config_path: &PathBuf, env: &[(String, String)]) -> ChildGuard {
    let log = std::fs::File::create(dir.join("gateway.log")).expect("create gateway log");
    let log_err = log.try_clone().expect("clone log handle");
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(config_path)
        .current_dir(dir)
        .env(
            "RUST_LOG",
            std::env::var("PORTCULLIS_TEST_GATEWAY_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    for (k, v) in env {
        cmd.env(k, v);
    }
    ChildGuard::spawn("portcullis", cmd).expect("spawn portcullis binary")
}

/// Sends `GET path` over a fresh connection and returns the status code, if any answer came.
pub async fn raw_get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let response = raw_request(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    parse_status(&response)
}

/// Writes raw bytes to `addr` and returns everything read until the peer closes (bounded to 5 s).
pub async fn raw_request(addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(bytes).await.ok()?;
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        Some(out)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Status code of a raw HTTP/1.x response.
pub fn parse_status(response: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(response.get(..response.len().min(64))?).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}
