//! What an operator reads at start-up and shutdown: errors that name the config field and
//! the path, each reason printed once and no banner before them; the banner after the
//! listeners are up; every line on stderr; drain messages naming the listener; no Rust
//! `Option` formatting in log lines.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use portcullis_testkit::ports::free_addr;
use portcullis_testkit::process::{ChildGuard, READY_ATTEMPTS, READY_POLL};
use portcullis_testkit::tls::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::BIN;

/// Runs `portcullis --config` on `text` in `dir` (bounded); returns (exit code, stdout, stderr).
fn run_in(dir: &Path, text: &str) -> (Option<i32>, String, String) {
    let path = dir.join("portcullis.toml");
    std::fs::write(&path, text).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("--config")
        .arg(&path)
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    // A gateway that wrongly starts would serve forever: the guard kills it after the bound.
    let out_path = dir.join("stdout.log");
    let err_path = dir.join("stderr.log");
    cmd.stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut guard = ChildGuard::spawn("portcullis", cmd).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = runtime.block_on(guard.wait_exit(Duration::from_secs(15)));
    drop(guard);
    (
        status.and_then(|s| s.code()),
        std::fs::read_to_string(out_path).unwrap_or_default(),
        std::fs::read_to_string(err_path).unwrap_or_default(),
    )
}

/// `[server]` on free loopback ports plus `extra`.
fn server(extra: &str) -> String {
    format!(
        "[server]\nlisten = \"{}\"\nadmin_listen = \"{}\"\n{extra}\n",
        free_addr(),
        free_addr()
    )
}

/// Asserts a refusal to start: status 2, `needles` on stderr, `once` exactly once, nothing
/// on stdout and no banner.
fn assert_refused(result: &(Option<i32>, String, String), needles: &[&str], once: &str) {
    let (code, stdout, stderr) = result;
    assert_eq!(*code, Some(2), "must refuse to start:\n{stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "stderr must name {needle}:\n{stderr}"
        );
    }
    assert_eq!(
        stderr.matches(once).count(),
        1,
        "the reason is printed once:\n{stderr}"
    );
    assert!(
        !stderr.contains("Portcullis is listening"),
        "no banner:\n{stderr}"
    );
    assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
}

#[test]
fn database_file_that_cannot_be_created_names_the_field_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("portcullis.db");
    let result = run_in(
        dir.path(),
        &server(&format!(
            "[storage]\ndatabase = \"sqlite://{}\"\n",
            missing.display()
        )),
    );
    let path = missing.display().to_string();
    assert_refused(
        &result,
        &["storage.database = \"sqlite://", &path],
        "No such file or directory",
    );

    // The directory is a file (ENOTDIR: refused even when running as root).
    std::fs::write(dir.path().join("plain-file"), b"").unwrap();
    let result = run_in(
        dir.path(),
        &server("[storage]\ndatabase = \"sqlite://plain-file/portcullis.db\"\n"),
    );
    // A relative path is shown made absolute: where the process looked for it.
    let absolute = dir.path().join("plain-file/portcullis.db");
    assert_refused(
        &result,
        &[
            "storage.database = \"sqlite://plain-file/portcullis.db\"",
            &absolute.display().to_string(),
        ],
        "Not a directory",
    );
}

#[test]
fn missing_or_unreadable_certificate_files_name_the_field_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = TestCa::new("startup").server().write(dir.path(), "edge");
    let missing = dir.path().join("missing.pem");
    let result = run_in(
        dir.path(),
        &server(&format!(
            "[server.tls]\ncert = {missing:?}\nkey = {key:?}\n"
        )),
    );
    assert_refused(
        &result,
        &["server.tls.cert", &missing.display().to_string()],
        "No such file or directory",
    );

    // A directory where the key should be: readable by nobody as a file.
    let result = run_in(
        dir.path(),
        &server(&format!(
            "[server.admin_tls]\ncert = {cert:?}\nkey = {:?}\n",
            dir.path()
        )),
    );
    assert_refused(
        &result,
        &["server.admin_tls.key", &dir.path().display().to_string()],
        "cannot read",
    );
}

#[test]
fn ports_in_use_name_the_field_and_the_address() {
    for field in ["listen", "admin_listen"] {
        let dir = tempfile::tempdir().unwrap();
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let other = free_addr();
        let (listen, admin) = if field == "listen" {
            (addr, other)
        } else {
            (other, addr)
        };
        let result = run_in(
            dir.path(),
            &format!("[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin}\"\n"),
        );
        assert_refused(
            &result,
            &[&format!("server.{field} = {addr}: cannot listen")],
            "in use",
        );
        drop(taken);
    }
}

/// Reads `path` until it contains `needle` (bounded); the text read last.
async fn wait_for_text(path: &Path, needle: &str) -> String {
    let mut text = String::new();
    for _ in 0..READY_ATTEMPTS {
        text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            break;
        }
        tokio::time::sleep(READY_POLL).await;
    }
    text
}

#[tokio::test]
async fn banner_after_the_listeners_one_stream_and_drain_messages_naming_the_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin, demo) = (free_addr(), free_addr(), free_addr());
    let config = format!(
        "[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin}\"\n\n[demo]\nenabled = true\nlisten = \"{demo}\"\n"
    );
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, config).unwrap();
    let (out_path, err_path) = (dir.path().join("stdout.log"), dir.path().join("stderr.log"));
    let mut cmd = Command::new(BIN);
    cmd.arg("--config")
        .arg(&path)
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut guard = ChildGuard::spawn("portcullis", cmd).unwrap();

    let stderr = wait_for_text(&err_path, "Portcullis is listening").await;
    let listening = stderr.find("portcullis listening").expect(&stderr);
    let banner = stderr.find("Portcullis is listening").expect(&stderr);
    assert!(
        listening < banner,
        "the banner follows the listeners:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("curl -i http://{listen}/demo/orders")),
        "{stderr}"
    );

    // A refused request is logged with the peer's address, not `Some(…)`.
    let mut stream = tokio::net::TcpStream::connect(listen).await.unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(answer.starts_with(b"HTTP/1.1 400"), "{answer:?}");
    let stderr = wait_for_text(&err_path, "request refused before routing").await;
    let peer = stream.local_addr().unwrap();
    assert!(stderr.contains(&format!("peer={peer}")), "{stderr}");

    guard.signal("TERM");
    let status = guard
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exits");
    assert!(status.success(), "{status:?}");
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        stderr.contains(&format!("proxy {listen} draining")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("admin {admin} draining")),
        "{stderr}"
    );
    assert!(!stderr.contains("Some("), "no Option formatting:\n{stderr}");
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    assert!(stdout.is_empty(), "every line on stderr; stdout: {stdout}");
}
