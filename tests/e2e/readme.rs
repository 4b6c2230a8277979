//! The README's commands, verbatim, against the embedded default: every ```` ```sh test ````
//! block runs with `bash -euo pipefail` while `portcullis` (no `--config`) serves on its
//! default ports from a temp directory, with `PORTCULLIS_ADMIN_TOKEN` set and the binary on
//! PATH. The blocks check their own key outputs (`grep`, `curl -f`); a block that fails
//! fails the test with its output.
//!
//! The default ports (8080, 8081, 9000) are outside the kernel's ephemeral range that every
//! other test draws its ports from, so only another run of this test can hold them: it
//! waits (bounded) for them to be free.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use portcullis_testkit::gateway::raw_get_status;
use portcullis_testkit::process::{ChildGuard, READY_ATTEMPTS, READY_POLL};

use crate::common::BIN;

const README: &str = include_str!("../../README.md");
const DEFAULT_PORTS: [u16; 3] = [8080, 8081, 9000];
const TOKEN: &str = "readme-test-admin-token-0123456789";
/// One block's bound: the retry demo waits a second, the rest are single requests.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// The bodies of the ```` ```sh test ```` blocks, in order.
fn test_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line.trim_end() == "```sh test" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

fn ports_free() -> bool {
    DEFAULT_PORTS
        .iter()
        .all(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok())
}

#[test]
fn readme_refers_to_nothing_outside_the_repository() {
    for outside in ["../shared", "/work/", "seeds/", "seed 0"] {
        assert!(!README.contains(outside), "README mentions {outside:?}");
    }
    assert!(
        test_blocks(README).len() >= 4,
        "README lost its tested blocks"
    );
}

#[tokio::test]
async fn readme_commands_work_verbatim_on_the_embedded_default() {
    let blocks = test_blocks(README);
    assert!(!blocks.is_empty());
    let mut free = ports_free();
    for _ in 0..(READY_ATTEMPTS * 3) {
        if free {
            break;
        }
        tokio::time::sleep(READY_POLL).await;
        free = ports_free();
    }
    assert!(
        free,
        "the embedded default's ports {DEFAULT_PORTS:?} stay busy; stop what holds them"
    );

    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir.path())
        .env("PORTCULLIS_ADMIN_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut gateway = ChildGuard::spawn("portcullis", cmd).unwrap();
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut healthy = false;
    for _ in 0..READY_ATTEMPTS {
        if logs().contains("portcullis listening")
            && raw_get_status(([127, 0, 0, 1], 8080).into(), "/healthz").await == Some(200)
        {
            healthy = true;
            break;
        }
        if !gateway.is_running() {
            break;
        }
        tokio::time::sleep(READY_POLL).await;
    }
    assert!(healthy, "embedded default did not start:\n{}", logs());

    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for block in &blocks {
        let mut bash = tokio::process::Command::new("bash");
        bash.args(["-euo", "pipefail", "-c", block])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("PORTCULLIS_ADMIN_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(BLOCK_TIMEOUT, bash.output())
            .await
            .unwrap_or_else(|_| panic!("README block timed out:\n{block}"))
            .unwrap();
        assert!(
            output.status.success(),
            "README block failed ({}):\n{block}\n--- stdout\n{}\n--- stderr\n{}\n--- gateway\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            logs()
        );
    }
    // What the README says about the database file and the retry demo.
    assert!(dir.path().join("portcullis.db").exists());
    assert!(logs().contains("retrying upstream request"), "{}", logs());

    gateway.signal("TERM");
    let status = gateway.wait_exit(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        logs()
    );
}

#[test]
fn finds_only_the_marked_blocks() {
    let text = "a\n```sh test\none\ntwo\n```\n```sh\nnot me\n```\n```sh test\nthree\n```\n";
    assert_eq!(test_blocks(text), vec!["one\ntwo\n", "three\n"]);
}
