//! gRPC with stock grpcio on both sides (the C core shared by Python, C++, Ruby and PHP):
//! a grpcio client (h2c) → the gateway → a grpcio server, plain h2c and TLS upstreams.
//! grpcio checks what tonic does not (`te: trailers`, one `:authority`), so every call kind
//! (unary, server, client and bidirectional streaming) runs here as well as in `grpc`.
//! The scripts are `tests/e2e/grpcio/{server,client}.py`; `scripts/test.sh` installs grpcio.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::ports::free_addr;
use portcullis_testkit::process::{wait_for_tcp, ChildGuard};
use portcullis_testkit::tls::TestCa;
use serde_json::Value;

use crate::common::BIN;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/e2e/grpcio")
        .join(name)
}

/// A grpcio server on a free loopback port, killed by PID on drop; its calls are logged.
struct StockServer {
    _child: ChildGuard,
    addr: std::net::SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl StockServer {
    /// `fail`: how many `Flaky` calls answer UNAVAILABLE first; `tls`: serve with this CA's
    /// certificate for `localhost` / `127.0.0.1`.
    async fn start(fail: u32, tls: Option<&TestCa>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls.jsonl");
        let addr = free_addr();
        let mut command = std::process::Command::new("python3");
        command
            .arg(script("server.py"))
            .args(["--port", &addr.port().to_string()])
            .arg("--log")
            .arg(&log)
            .args(["--fail", &fail.to_string()]);
        if let Some(ca) = tls {
            let (cert, key) = ca.server().write(dir.path(), "server");
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        let child = ChildGuard::spawn("grpcio server", command).expect("python3 grpcio server");
        assert!(
            wait_for_tcp(addr, 200).await,
            "grpcio server did not listen (is grpcio installed?)"
        );
        Self {
            _child: child,
            addr,
            log,
            _dir: dir,
        }
    }

    /// The calls the server received, one JSON object each.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// The server's view of one call's metadata: the value of `name`, if sent.
fn metadata<'a>(call: &'a Value, name: &str) -> Vec<&'a str> {
    call["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pair| pair[0] == name)
        .map(|pair| pair[1].as_str().unwrap())
        .collect()
}

/// Runs the grpcio client against the gateway (bounded, killed on timeout) and returns one
/// result per call named.
async fn run_client(gateway: &GatewayProcess, calls: &[&str]) -> Vec<Value> {
    let target = gateway.url().trim_start_matches("http://").to_owned();
    let mut command = tokio::process::Command::new("python3");
    command
        .arg(script("client.py"))
        .args(["--target", &target])
        .args(calls)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("grpcio client finished")
        .expect("python3 grpcio client");
    assert!(
        output.status.success(),
        "client: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(results.len(), calls.len(), "{results:?}");
    results
}

/// h2c on the listener, the `echo.Echo` service routed to `endpoint` over HTTP/2;
/// `upstream` adds upstream fields, `route` route fields.
fn config(endpoint: &str, upstream: &str, route: &str) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\nh2c = true\n\n[[upstreams]]\nname = \"echo\"\nendpoints = [\"{endpoint}\"]\nhttp2 = true\nretry = {{ base = \"10ms\", cap = \"50ms\", max_retries = 3 }}\n{upstream}\n\n[[routes]]\nprefix = \"/echo.Echo\"\nupstream = \"echo\"\n{route}\n"
    )
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Every call kind answered, as the server sent it, with what the server received.
async fn every_call_kind(gateway: &GatewayProcess, server: &StockServer) {
    let results = run_client(
        gateway,
        &[
            "unary",
            "server_stream",
            "client_stream",
            "bidi",
            "trailing",
        ],
    )
    .await;
    for result in &results {
        assert_eq!(result["code"], "OK", "{result}");
    }
    assert_eq!(results[0]["messages"][0], hex("hello"));
    assert_eq!(results[1]["messages"].as_array().unwrap().len(), 3);
    assert_eq!(results[2]["messages"][0], hex("a|bb|ccc"));
    let pongs: Vec<_> = (0..3)
        .map(|i| Value::from(hex(&format!("ping-{i}"))))
        .collect();
    assert_eq!(results[3]["messages"].as_array().unwrap(), &pongs);
    // The server's trailing metadata reached the client through the gateway.
    assert_eq!(results[4]["trailing"], serde_json::json!([["x-sum", "4"]]));

    let calls = server.calls();
    let methods: Vec<_> = calls
        .iter()
        .map(|c| c["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        ["Unary", "ServerStream", "ClientStream", "Bidi", "Trailing"]
    );
    assert_eq!(calls[2]["messages"], 3);
    assert_eq!(calls[3]["messages"], 3);
    for call in &calls {
        // One call, one attempt; the gateway's own fields arrived; the client's deadline
        // (5 s) arrived as grpc-timeout, never longer.
        assert_eq!(metadata(call, "x-retry-attempt"), ["1"], "{call}");
        assert_eq!(metadata(call, "x-forwarded-for"), ["127.0.0.1"], "{call}");
        assert!(call["time_remaining"].as_f64().unwrap() <= 5.0, "{call}");
    }
}

#[tokio::test]
async fn every_call_kind_reaches_a_stock_grpcio_server_over_h2c() {
    let server = StockServer::start(0, None).await;
    let gateway =
        GatewayProcess::start(BIN, &config(&format!("http://{}", server.addr), "", "")).await;
    every_call_kind(&gateway, &server).await;
}

#[tokio::test]
async fn every_call_kind_reaches_a_stock_grpcio_server_over_tls() {
    let ca = TestCa::new("grpc-ca");
    let server = StockServer::start(0, Some(&ca)).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = ca.write(dir.path(), "ca.pem");
    let gateway = GatewayProcess::start(
        BIN,
        &config(
            &format!("https://localhost:{}", server.addr.port()),
            &format!("tls = {{ ca = {bundle:?} }}"),
            "",
        ),
    )
    .await;
    every_call_kind(&gateway, &server).await;
}

#[tokio::test]
async fn grpcio_unavailable_is_retried_only_where_safe() {
    // An idempotent route: the unary call is replayed, the client sees OK.
    let server = StockServer::start(2, None).await;
    let endpoint = format!("http://{}", server.addr);
    let gateway = GatewayProcess::start(BIN, &config(&endpoint, "", "idempotent = true")).await;
    let results = run_client(&gateway, &["flaky"]).await;
    assert_eq!(results[0]["code"], "OK", "{results:?}");
    let attempts: Vec<_> = server
        .calls()
        .iter()
        .map(|c| metadata(c, "x-retry-attempt")[0].to_owned())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);

    // The same call on a route that is not idempotent: a plain POST, not replayed.
    let server = StockServer::start(2, None).await;
    let endpoint = format!("http://{}", server.addr);
    let gateway = GatewayProcess::start(BIN, &config(&endpoint, "", "")).await;
    let results = run_client(&gateway, &["flaky"]).await;
    assert_eq!(results[0]["code"], "UNAVAILABLE", "{results:?}");
    assert_eq!(server.calls().len(), 1);

    // A client-streaming call on the idempotent route: two messages were sent, so it is
    // never replayed, whatever the route says.
    let server = StockServer::start(1, None).await;
    let endpoint = format!("http://{}", server.addr);
    let gateway = GatewayProcess::start(BIN, &config(&endpoint, "", "idempotent = true")).await;
    let results = run_client(&gateway, &["flaky_stream"]).await;
    assert_eq!(results[0]["code"], "UNAVAILABLE", "{results:?}");
    assert_eq!(server.calls().len(), 1);
}
