//! Zero-downtime restart and binary upgrade (`edge::listener::handover`): SIGUSR2 and
//! `portcullis upgrade --pid` hand the listening sockets to a successor while an open-loop
//! client runs, and no request fails.
//!
//! The clients and what they may retry: `load`.

mod load;
mod process;

use std::time::Duration;

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::ScriptedUpstream;
use tokio::net::TcpStream;

use self::load::{
    assert_goaway_then_close, assert_upstream_saw_each_once, exchange, h2_connection, open_loop,
};
use self::process::{
    assert_handed_over, config, kill, start, status_file, upgrade_command, wait_log, wait_successor,
};
use crate::common::BIN;

/// The drain bound of the old process in these tests.
const GRACE: Duration = Duration::from_secs(5);
/// Bounds every other wait of this file: a test that needs it has failed.
const PATIENCE: Duration = Duration::from_secs(30);

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
    let successor = wait_successor(&gateway, runtime.path(), pid).await;

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
    let successor = wait_successor(&gateway, runtime.path(), pid).await;
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
