//! Zero-downtime restart and binary upgrade (`edge::listener::handover`): SIGUSR2 and
//! `portcullis upgrade --pid` hand the listening sockets to a successor while an open-loop
//! client runs, and no request fails.
//!
//! The clients are hyper clients (hyper-util's legacy pool, HTTP/1.1 keep-alive and HTTP/2
//! with prior knowledge) that retry as stock clients do, and only that:
//!
//! - hyper-util's own `retry_canceled_requests` (default on): a request that could not be
//!   written on a reused connection the server had just closed is sent on another;
//! - like Go's `net/http` and curl, a GET whose connection ended before any byte of a
//!   response (reset, or closed after the request was written: the race of an idle
//!   keep-alive connection closed by the old process at the moment the client reuses it,
//!   which nginx has too), or that HTTP/2 refused after a GOAWAY (RFC 9113 §6.8: a stream
//!   the server did not process may be retried), is sent once more on a new connection.
//!
//! Such a request never reached a gateway's pipeline, which the upstream checks: it must see
//! every request exactly once. The number of such retries is printed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::h2frames::{self, kind, FrameReader};
use portcullis_testkit::upstream::ScriptedUpstream;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common::BIN;

/// The drain bound of the old process in these tests.
const GRACE: Duration = Duration::from_secs(5);
/// Open-loop send interval: 400 requests per second.
const INTERVAL: Duration = Duration::from_micros(2500);
/// Requests sent before the hand-over starts (1 s).
const BEFORE: usize = 400;
/// Requests sent after the successor said it serves (1 s).
const AFTER: usize = 400;
/// Requests at most (the successor's start-up bounds the rest).
const MAX_REQUESTS: usize = 400 * 40;
/// Bounds every other wait of this file: a test that needs it has failed.
const PATIENCE: Duration = Duration::from_secs(30);

type Pool = Client<HttpConnector, Full<Bytes>>;

fn config(upstream: &ScriptedUpstream) -> String {
    format!(
        r#"[server]
listen = "{{listen}}"
admin_listen = "{{admin_listen}}"
shutdown_grace = "{}s"

{}"#,
        GRACE.as_secs(),
        crate::common::single_route_config(&upstream.url(), "")
    )
}

/// A gateway whose hand-over files live in a private runtime directory of the test.
async fn start(upstream: &ScriptedUpstream) -> (GatewayProcess, tempfile::TempDir) {
    let runtime = tempfile::tempdir().unwrap();
    let options = GatewayOptions {
        env: vec![(
            "XDG_RUNTIME_DIR".into(),
            runtime.path().display().to_string(),
        )],
        ..Default::default()
    };
    let gateway = GatewayProcess::start_with(BIN, &config(upstream), options).await;
    (gateway, runtime)
}

fn status_file(runtime: &Path, pid: u32) -> PathBuf {
    runtime.join("portcullis").join(format!("{pid}.status"))
}

/// The successor's PID once the old process reports the hand-over done.
fn successor_of(runtime: &Path, pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(status_file(runtime, pid)).ok()?;
    text.strip_prefix("ready ")?.trim().parse().ok()
}

/// A successor started by the gateway (not our child): stopped by PID, SIGKILL on drop.
struct Successor(u32);

impl Successor {
    fn alive(&self) -> bool {
        // A zombie waiting for its new parent to reap it has exited.
        std::fs::read_to_string(format!("/proc/{}/stat", self.0)).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.0.to_string())
            .status();
    }

    /// SIGTERM, then waits (bounded) until it has exited.
    async fn stop(self) {
        self.signal("TERM");
        for _ in 0..(PATIENCE.as_millis() / 50) {
            if !self.alive() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("successor {} did not stop on SIGTERM", self.0);
    }
}

impl Drop for Successor {
    fn drop(&mut self) {
        if self.alive() {
            self.signal("KILL");
        }
    }
}

/// What the open-loop run saw.
#[derive(Debug, Default)]
struct Run {
    sent: usize,
    ok: usize,
    failures: Vec<String>,
    successor: Option<u32>,
    retried: usize,
}

/// Why the request failed before any byte of a response, on a connection the server ended
/// (the cases a stock client sends a GET again for; see the module docs)?
fn unanswered(err: &hyper_util::client::legacy::Error) -> Option<&'static str> {
    let hyper = std::error::Error::source(err).and_then(|e| e.downcast_ref::<hyper::Error>())?;
    let reset = std::error::Error::source(hyper)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset);
    // h2's error type is not a dependency here; its Debug names the frame and the side.
    let debug = format!("{hyper:?}");
    let refused_after_goaway = debug.contains("GoAway(") && debug.contains("Remote");
    if refused_after_goaway {
        Some("HTTP/2 stream refused after GOAWAY")
    } else if reset {
        Some("HTTP/1 connection reset")
    } else if hyper.is_incomplete_message() {
        Some("HTTP/1 connection closed before a response")
    } else if hyper.is_canceled() {
        Some("canceled")
    } else {
        None
    }
}

/// Sends `GET /load?seq=N` every [`INTERVAL`] (2 of 3 over HTTP/1.1 keep-alive, 1 of 3 over
/// HTTP/2), calls `trigger` after [`BEFORE`] requests, and goes on until [`AFTER`] requests
/// after the status file names a successor (or the old process reports a failure, or
/// [`MAX_REQUESTS`]). Sends are scheduled, not paced by answers.
async fn open_loop(
    addr: SocketAddr,
    runtime: &Path,
    pid: u32,
    trigger: impl FnOnce() -> Option<tokio::task::JoinHandle<std::process::Output>>,
) -> (Run, Option<std::process::Output>) {
    let h1: Pool = Client::builder(TokioExecutor::new()).build_http();
    let h2: Pool = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut ticker = tokio::time::interval(INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    let mut trigger = Some(trigger);
    let mut command = None;
    let mut until = MAX_REQUESTS;
    let mut run = Run::default();
    let retried = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<&str, usize>::new()));
    for seq in 0..MAX_REQUESTS {
        if seq >= until {
            break;
        }
        ticker.tick().await;
        if seq == BEFORE {
            command = trigger.take().and_then(|trigger| trigger());
        }
        if seq > BEFORE && until == MAX_REQUESTS && seq % 20 == 0 {
            if let Some(successor) = successor_of(runtime, pid) {
                run.successor = Some(successor);
                until = seq + AFTER;
            } else if std::fs::read_to_string(status_file(runtime, pid))
                .is_ok_and(|s| s.starts_with("failed"))
            {
                until = seq + AFTER;
            }
        }
        let http2 = seq % 3 == 2;
        let client = if http2 { h2.clone() } else { h1.clone() };
        let uri = format!("http://{addr}/load?seq={seq}");
        let retried = retried.clone();
        tasks.push(tokio::spawn(async move {
            let request = || {
                http::Request::get(&uri)
                    .header("x-seq", seq.to_string())
                    .body(Full::new(Bytes::new()))
                    .unwrap()
            };
            let answer = tokio::time::timeout(PATIENCE, async {
                let response = match client.request(request()).await {
                    Ok(response) => response,
                    Err(err) if unanswered(&err).is_some() => {
                        if let Some(why) = unanswered(&err) {
                            *retried.lock().unwrap().entry(why).or_default() += 1;
                        }
                        let fresh = Client::builder(TokioExecutor::new())
                            .http2_only(http2)
                            .build_http();
                        fresh
                            .request(request())
                            .await
                            .map_err(|e| format!("retried: {e:?}"))?
                    }
                    Err(err) => return Err(format!("{err:?}")),
                };
                let status = response.status();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("body: {e:?}"))?;
                if status != 200 {
                    return Err(format!("status {status}: {:?}", body.to_bytes()));
                }
                Ok(())
            })
            .await;
            match answer {
                Ok(result) => result.map_err(|e| format!("seq {seq}: {e}")),
                Err(_) => Err(format!("seq {seq}: no answer within {PATIENCE:?}")),
            }
        }));
        run.sent += 1;
    }
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => run.ok += 1,
            Err(failure) => run.failures.push(failure),
        }
    }
    let retried = retried.lock().unwrap().clone();
    run.retried = retried.values().sum();
    eprintln!(
        "open loop: {} sent, {} answered 200, {} sent again after a connection ended unanswered {retried:?}",
        run.sent, run.ok, run.retried
    );
    let output = match command {
        Some(command) => Some(command.await.unwrap()),
        None => None,
    };
    (run, output)
}

/// Every request answered 200 reached the upstream exactly once (by `x-seq`).
fn assert_upstream_saw_each_once(upstream: &ScriptedUpstream, run: &Run) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for hit in upstream.hits() {
        if let Some(seq) = hit.headers.get("x-seq").and_then(|v| v.to_str().ok()) {
            *seen.entry(seq.to_owned()).or_default() += 1;
        }
    }
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicated.is_empty(), "sent twice upstream: {duplicated:?}");
    assert_eq!(seen.len(), run.sent, "the upstream saw every request once");
}

/// An HTTP/2 connection (raw frames) that has had one answer before the hand-over.
async fn h2_connection(addr: SocketAddr) -> FrameReader<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(h2frames::PREFACE).await.unwrap();
    stream.write_all(&h2frames::settings(&[])).await.unwrap();
    let authority = addr.to_string();
    let fields = [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/raw-h2"),
        (":authority", authority.as_str()),
    ];
    stream
        .write_all(&h2frames::headers(1, &fields, true))
        .await
        .unwrap();
    let mut reader = FrameReader::new(stream);
    loop {
        let frame = reader.next(PATIENCE).await.expect("an HTTP/2 answer");
        if frame.kind == kind::SETTINGS && frame.flags & h2frames::ACK == 0 {
            let ack = h2frames::settings_ack();
            reader.get_mut().write_all(&ack).await.unwrap();
        }
        if frame.kind == kind::HEADERS && frame.stream == 1 {
            assert_eq!(frame.static_status(), Some(200));
            return reader;
        }
    }
}

/// Reads the connection to its end: the frames that ended it must be a GOAWAY with
/// NO_ERROR and no RST_STREAM. PINGs (hyper's graceful shutdown sends one) are answered.
async fn assert_goaway_then_close(mut reader: FrameReader<TcpStream>) {
    const PING: u8 = 0x6;
    let mut goaways = Vec::new();
    for _ in 0..1000 {
        let Some(frame) = reader.next(PATIENCE).await else {
            break;
        };
        match frame.kind {
            kind::GOAWAY => goaways.push(frame.error_code()),
            kind::RST_STREAM => panic!("stream reset during the hand-over: {frame:?}"),
            PING if frame.flags & h2frames::ACK == 0 => {
                let pong = h2frames::encode(PING, h2frames::ACK, 0, &frame.payload);
                let _ = reader.get_mut().write_all(&pong).await;
            }
            _ => {}
        }
    }
    assert!(!goaways.is_empty(), "the HTTP/2 connection got no GOAWAY");
    assert!(
        goaways.iter().all(|code| *code == Some(0)),
        "GOAWAY with NO_ERROR only: {goaways:?}"
    );
}

/// Checks shared by the two successful hand-overs, after the load: the old process exited
/// 0 having drained within the grace, and the successor serves the same sockets.
async fn assert_handed_over(
    gateway: &mut GatewayProcess,
    upstream: &ScriptedUpstream,
    run: &Run,
) -> Successor {
    // Guarded first: a failed assertion below must not leave it running.
    let successor = run.successor.map(Successor);
    assert!(
        run.failures.is_empty(),
        "{} of {} failed: {:?}\nlog:\n{}",
        run.failures.len(),
        run.sent,
        &run.failures[..run.failures.len().min(10)],
        gateway.logs()
    );
    assert_eq!(run.ok, run.sent);
    let successor = successor.expect("the status file names the successor");
    let status = gateway
        .guard()
        .wait_exit(GRACE + Duration::from_secs(2))
        .await
        .expect("the old process exits after its drain");
    assert!(status.success(), "old process exit: {status:?}");
    let logs = gateway.logs();
    assert!(logs.contains("hand-over complete"), "{logs}");
    assert!(
        !logs.contains("grace period over"),
        "drained within the grace: {logs}"
    );
    assert!(successor.alive(), "the successor runs: {logs}");
    assert_upstream_saw_each_once(upstream, run);

    // Only the successor is left: it answers on the same sockets, and it is ready.
    let before = upstream.hit_count();
    let answer = crate::common::client()
        .get(gateway.url() + "/after")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(upstream.hit_count(), before + 1, "the upstream got it");
    let ready = crate::common::client()
        .get(gateway.admin_url() + "/readyz")
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "the successor is ready");
    successor
}

/// `portcullis upgrade --pid PID`, as an operator runs it: the same user, but not the
/// gateway's environment (the command finds the gateway's private directory itself).
fn upgrade_command(pid: u32) -> std::process::Output {
    Command::new(BIN)
        .args(["upgrade", "--pid", &pid.to_string(), "--timeout", "60s"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap()
}

fn kill(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

#[tokio::test]
async fn sigusr2_hands_the_sockets_over_and_no_request_fails() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let (mut gateway, runtime) = start(&upstream).await;
    let pid = gateway.guard().pid();
    let h2 = h2_connection(gateway.addr).await;
    let goaway = tokio::spawn(assert_goaway_then_close(h2));

    let (run, _) = open_loop(gateway.addr, runtime.path(), pid, || {
        kill("USR2", pid);
        None
    })
    .await;
    let successor = assert_handed_over(&mut gateway, &upstream, &run).await;
    goaway.await.unwrap();
    successor.stop().await;
}

#[tokio::test]
async fn upgrade_command_prints_the_successor_and_no_request_fails() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let (mut gateway, runtime) = start(&upstream).await;
    let pid = gateway.guard().pid();
    let (run, output) = open_loop(gateway.addr, runtime.path(), pid, move || {
        Some(tokio::task::spawn_blocking(move || upgrade_command(pid)))
    })
    .await;
    let successor = assert_handed_over(&mut gateway, &upstream, &run).await;
    let output = output.expect("the command ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{output:?}\nlog:\n{}",
        gateway.logs()
    );
    assert_eq!(
        stdout.trim(),
        successor.0.to_string(),
        "prints the successor's PID"
    );
    successor.stop().await;
}

#[tokio::test]
async fn a_failing_successor_leaves_the_old_process_serving() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let (mut gateway, runtime) = start(&upstream).await;
    let pid = gateway.guard().pid();
    // The successor reads the same file, now invalid: it must refuse to start.
    let config_path = gateway.dir().join("portcullis.toml");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        text.replace("shutdown_grace", "shutdown_grease"),
    )
    .unwrap();
    let (run, output) = open_loop(gateway.addr, runtime.path(), pid, move || {
        Some(tokio::task::spawn_blocking(move || upgrade_command(pid)))
    })
    .await;
    let logs = gateway.logs();
    assert!(
        run.failures.is_empty(),
        "{:?}\n{logs}",
        &run.failures[..run.failures.len().min(10)]
    );
    assert_upstream_saw_each_once(&upstream, &run);
    assert_eq!(run.successor, None, "{logs}");
    let output = output.expect("the command ran");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    // The successor's own reason, naming the field, reaches the operator's command.
    assert!(
        stderr.contains("hand-over failed") && stderr.contains("shutdown_grease"),
        "{stderr}"
    );
    assert!(
        logs.contains("hand-over failed; this gateway keeps serving"),
        "{logs}"
    );
    assert!(
        logs.contains("shutdown_grease"),
        "the successor said why: {logs}"
    );
    assert!(gateway.guard().is_running(), "the old process still serves");
    let answer = crate::common::client()
        .get(gateway.url() + "/still")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let ready = crate::common::client()
        .get(gateway.admin_url() + "/readyz")
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "still ready");
    let status = gateway.terminate(GRACE + Duration::from_secs(5)).await;
    assert!(status.is_some_and(|s| s.success()));
}

/// Sends `GET path` on `stream` and reads one response (head and `content-length` body).
async fn exchange(stream: &mut TcpStream, path: &str) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let request = format!("GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..100 {
        let text = String::from_utf8_lossy(&received).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if received.len() >= end + 4 + length {
                return Some(text);
            }
        }
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        received.extend_from_slice(&buf[..n]);
    }
    None
}

#[tokio::test]
async fn idle_keep_alive_connections_get_their_close_on_a_response() {
    use tokio::io::AsyncReadExt;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let (mut gateway, runtime) = start(&upstream).await;
    let pid = gateway.guard().pid();
    // Two keep-alive connections, each with one exchange behind it, idle at the hand-over.
    let mut reused = TcpStream::connect(gateway.addr).await.unwrap();
    let mut silent = TcpStream::connect(gateway.addr).await.unwrap();
    for stream in [&mut reused, &mut silent] {
        let answer = exchange(stream, "/before").await.expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    kill("USR2", pid);
    let mut successor = None;
    for _ in 0..(PATIENCE.as_millis() / 20) {
        successor = successor_of(runtime.path(), pid);
        if successor.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let successor = Successor(successor.expect("handed over"));

    // The old process drains: a request on its idle connection is still answered (within
    // the linger), and the answer says the connection closes.
    let answer = exchange(&mut reused, "/during-drain")
        .await
        .expect("answered, not closed under the client");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, reused.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0))), "then closed: {read:?}");
    assert!(
        upstream
            .hits()
            .iter()
            .any(|h| h.uri.path() == "/during-drain"),
        "the upstream got it"
    );
    // The connection that stays silent is closed, cleanly, within the grace.
    let read = tokio::time::timeout(GRACE, silent.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0))), "closed by the drain: {read:?}");
    let status = gateway
        .guard()
        .wait_exit(GRACE + Duration::from_secs(2))
        .await;
    assert!(status.is_some_and(|s| s.success()), "{}", gateway.logs());
    successor.stop().await;
}

#[tokio::test]
async fn a_binary_swapped_in_at_the_start_path_is_what_the_successor_runs() {
    use std::os::unix::fs::PermissionsExt;
    let upstream = ScriptedUpstream::start(vec![]).await;
    let bin_dir = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let path = bin_dir.path().join("portcullis");
    if std::fs::hard_link(BIN, &path).is_err() {
        std::fs::copy(BIN, &path).unwrap();
    }
    let options = GatewayOptions {
        env: vec![(
            "XDG_RUNTIME_DIR".into(),
            runtime.path().display().to_string(),
        )],
        ..Default::default()
    };
    let mut gateway =
        GatewayProcess::start_with(path.to_str().unwrap(), &config(&upstream), options).await;
    let pid = gateway.guard().pid();
    // A deploy renames the new binary over the old path: the running process's own
    // executable is now a deleted file. The "new binary" notes its PID, then runs.
    let marker = bin_dir.path().join("started-from-the-new-binary");
    let staged = bin_dir.path().join("portcullis.new");
    std::fs::write(
        &staged,
        format!(
            "#!/bin/sh\necho $$ > '{}'\nexec '{BIN}' \"$@\"\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, &path).unwrap();

    kill("USR2", pid);
    let mut successor = None;
    for _ in 0..(PATIENCE.as_millis() / 20) {
        successor = successor_of(runtime.path(), pid);
        if successor.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let successor = Successor(successor.unwrap_or_else(|| panic!("{}", gateway.logs())));
    let started = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(
        started.trim(),
        successor.0.to_string(),
        "started from the path, anew"
    );
    let status = gateway
        .guard()
        .wait_exit(GRACE + Duration::from_secs(2))
        .await;
    assert!(status.is_some_and(|s| s.success()), "{}", gateway.logs());
    let answer = crate::common::client()
        .get(gateway.url() + "/after")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    successor.stop().await;
}

/// Polls (bounded) until `gateway`'s log contains `text`.
async fn wait_log(gateway: &GatewayProcess, text: &str) {
    for _ in 0..(PATIENCE.as_millis() / 20) {
        if gateway.logs().contains(text) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no {text:?} in the log:\n{}", gateway.logs());
}

#[tokio::test]
async fn a_second_sigusr2_during_a_hand_over_is_refused() {
    let upstream = ScriptedUpstream::start(vec![]).await;
    let (mut gateway, runtime) = start(&upstream).await;
    let pid = gateway.guard().pid();
    // The successor's database accepts connections and never answers: its start-up waits.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let database = silent.local_addr().unwrap();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::channel(16);
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
            let _ = accepted_tx.try_send(());
        }
    });
    let config_path = gateway.dir().join("portcullis.toml");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        format!("{text}\n[storage]\ndatabase = \"postgres://u:p@{database}/db\"\n"),
    )
    .unwrap();

    kill("USR2", pid);
    tokio::time::timeout(PATIENCE, accepted.recv())
        .await
        .expect("the successor is starting");
    kill("USR2", pid);
    wait_log(
        &gateway,
        "SIGUSR2 refused: a hand-over is already in progress",
    )
    .await;
    // Its database gone, the successor fails; the old process serves on.
    holder.abort();
    wait_log(&gateway, "hand-over failed; this gateway keeps serving").await;
    assert_eq!(
        gateway
            .logs()
            .matches("hand-over: successor started")
            .count(),
        1,
        "one successor only"
    );
    let status = std::fs::read_to_string(status_file(runtime.path(), pid)).unwrap();
    assert!(status.starts_with("failed: "), "{status}");
    let answer = crate::common::client()
        .get(gateway.url() + "/still")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(gateway.guard().is_running());
    let status = gateway.terminate(GRACE + Duration::from_secs(5)).await;
    assert!(status.is_some_and(|s| s.success()));
}
