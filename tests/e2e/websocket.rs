//! WebSocket tunnels (`websocket = true`, docs/websockets.md) with the stock Python
//! `websockets` library on both ends (`websocket/peer.py`; `scripts/test.sh` installs it):
//! 10 000 messages echoed through the gateway, the upstream's view of the handshake, the
//! `max_websockets` cap (429), the idle and lifetime limits and a drain closing with 1001.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::ports::free_addr;
use portcullis_testkit::process::{wait_for_tcp, ChildGuard, READY_ATTEMPTS};
use serde_json::Value;

use crate::common::BIN;

// RFC 8441: WebSockets over HTTP/2 with a hand-written h2 client.
mod h2;
// Tenants of the admin API with their own WebSocket cap and idle timeout.
mod tenants;

/// Upper bound on one client run.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

fn peer_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/websocket/peer.py")
}

/// The Python echo server and the events it logged.
struct Echo {
    addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
    _child: ChildGuard,
}

impl Echo {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("events.jsonl");
        let addr = free_addr();
        let mut command = Command::new("python3");
        command
            .arg(peer_script())
            .arg("server")
            .arg(addr.port().to_string())
            .arg(&log);
        let child = ChildGuard::spawn("websocket echo", command).expect("python3");
        assert!(
            wait_for_tcp(addr, READY_ATTEMPTS).await,
            "echo server up (needs the Python websockets library)"
        );
        Self {
            addr,
            log,
            _dir: dir,
            _child: child,
        }
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == kind)
            .collect()
    }

    /// Waits (bounded) until `n` connections have closed on the upstream.
    async fn closed(&self, n: usize) -> Vec<Value> {
        for _ in 0..200 {
            let closed = self.events("closed");
            if closed.len() >= n {
                return closed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("upstream saw no close: {:?}", self.events("closed"));
    }
}

fn header<'a>(request: &'a Value, name: &str) -> Option<&'a str> {
    request["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

fn config(echo: &Echo, route_extra: &str, server_extra: &str) -> String {
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"
{server_extra}

[[upstreams]]
name = "echo"
endpoints = ["http://{addr}"]
retry = {{ max_retries = 0 }}

[[routes]]
prefix = "/ws"
upstream = "echo"
websocket = true
{route_extra}

[[routes]]
prefix = "/plain"
upstream = "echo"
"#,
        addr = echo.addr
    )
}

/// Runs one client of `peer.py` and returns its JSON line.
async fn client(mode: &str, url: &str, arg: &str) -> Value {
    client_as(mode, url, arg, None).await
}

/// [`client`] with an API key (`X-Api-Key`).
async fn client_as(mode: &str, url: &str, arg: &str, api_key: Option<&str>) -> Value {
    let mut command = tokio::process::Command::new("python3");
    command.arg(peer_script()).args([mode, url, arg]);
    if let Some(key) = api_key {
        command.env("PEER_API_KEY", key);
    }
    let run = command.kill_on_drop(true).output();
    let output = tokio::time::timeout(CLIENT_TIMEOUT, run)
        .await
        .expect("client finished in time")
        .expect("python3");
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "client output {text:?}, stderr {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn ws_url(gateway: &GatewayProcess, path: &str) -> String {
    gateway.url().replacen("http://", "ws://", 1) + path
}

#[tokio::test]
async fn ten_thousand_messages_echo_through_the_gateway() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(BIN, &config(&echo, "", "")).await;
    // A path the edge normalises before routing and forwarding.
    let result = client("echo", &ws_url(&gateway, "/ws/a/../chat"), "10000").await;
    assert_eq!(result["received"], 10000, "{result}");
    let closed = echo.closed(1).await;
    assert_eq!(closed[0]["messages"], 10000);
    let requests = echo.events("request");
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request["path"], "/ws/chat", "normalised path upstream");
    assert_eq!(header(request, "upgrade"), Some("websocket"));
    assert_eq!(header(request, "x-forwarded-for"), Some("127.0.0.1"));
    assert!(header(request, "sec-websocket-key").is_some());
    let metrics = crate::common::client()
        .get(gateway.admin_url() + "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "websocket_bytes_total{route=\"/ws\",tenant=\"anonymous\",direction=\"to_upstream\"}"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_handshake_to_a_route_without_websocket_reaches_the_upstream_without_upgrade() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(BIN, &config(&echo, "", "")).await;
    let result = client("echo", &ws_url(&gateway, "/plain"), "1").await;
    // The echo server refuses a GET that does not ask to upgrade.
    assert_eq!(result["status"], 426, "{result}");
    let requests = echo.events("request");
    assert_eq!(requests.len(), 1);
    assert_eq!(header(&requests[0], "upgrade"), None);
    assert_eq!(header(&requests[0], "connection"), None);
}

#[tokio::test]
async fn handshakes_over_max_websockets_are_refused_with_429() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(BIN, &config(&echo, "max_websockets = 1", "")).await;
    let url = ws_url(&gateway, "/ws");
    let holder = tokio::spawn({
        let url = url.clone();
        async move { client("wait", &url, "3").await }
    });
    for _ in 0..200 {
        if !echo.events("request").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(echo.events("request").len(), 1);
    let refused = client("echo", &url, "1").await;
    assert_eq!(refused["status"], 429, "{refused}");
    assert_eq!(
        echo.events("request").len(),
        1,
        "the refused one never reached the upstream"
    );
    assert_eq!(holder.await.unwrap()["error"], "not closed in time");
    // Its slot is back once it closed.
    echo.closed(1).await;
    let again = client("echo", &url, "5").await;
    assert_eq!(again["received"], 5, "{again}");
}

#[tokio::test]
async fn an_idle_tunnel_is_closed_with_1001() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(&echo, "websocket_idle_timeout = \"300ms\"", ""),
    )
    .await;
    let result = client("wait", &ws_url(&gateway, "/ws"), "20").await;
    assert_eq!(result["code"], 1001, "{result}");
    assert_eq!(result["reason"], "idle timeout");
    let closed = echo.closed(1).await;
    assert_eq!(closed[0]["code"], 1001, "the upstream got the close too");
}

#[tokio::test]
async fn a_busy_tunnel_is_closed_at_its_max_lifetime_with_1001() {
    let echo = Echo::start().await;
    let gateway = GatewayProcess::start(
        BIN,
        &config(
            &echo,
            "websocket_idle_timeout = \"10s\"\nwebsocket_max_lifetime = \"700ms\"",
            "",
        ),
    )
    .await;
    let result = client("tick", &ws_url(&gateway, "/ws"), "20").await;
    assert_eq!(result["code"], 1001, "{result}");
    assert_eq!(result["reason"], "maximum lifetime reached");
    let closed = echo.closed(1).await;
    assert_eq!(closed[0]["code"], 1001);
    assert!(closed[0]["messages"].as_u64().unwrap() >= 2);
}

#[tokio::test]
async fn a_drain_closes_open_tunnels_with_1001_within_the_grace() {
    let echo = Echo::start().await;
    let mut gateway =
        GatewayProcess::start(BIN, &config(&echo, "", "shutdown_grace = \"10s\"")).await;
    let url = ws_url(&gateway, "/ws");
    let open = tokio::spawn(async move { client("wait", &url, "30").await });
    for _ in 0..200 {
        if !echo.events("request").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    gateway.guard().signal("TERM");
    let result = open.await.unwrap();
    assert_eq!(result["code"], 1001, "{result}");
    assert_eq!(result["reason"], "gateway shutting down");
    let status = gateway
        .guard()
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("gateway exits");
    assert!(status.success(), "{status:?}");
    assert_eq!(echo.closed(1).await[0]["code"], 1001);
}
