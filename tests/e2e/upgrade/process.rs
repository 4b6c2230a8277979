//! The gateway processes of the upgrade tests: the old one (a child of the test), its
//! successor (not a child: stopped by PID), the hand-over status file, `portcullis upgrade`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::ScriptedUpstream;

use super::load::{assert_upstream_saw_each_once, Run};
use super::{GRACE, PATIENCE};
use crate::common::BIN;

pub(super) fn config(upstream: &ScriptedUpstream) -> String {
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
pub(super) async fn start(upstream: &ScriptedUpstream) -> (GatewayProcess, tempfile::TempDir) {
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

pub(super) fn status_file(runtime: &Path, pid: u32) -> PathBuf {
    runtime.join("portcullis").join(format!("{pid}.status"))
}

/// The successor's PID once the old process reports the hand-over done.
pub(super) fn successor_of(runtime: &Path, pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(status_file(runtime, pid)).ok()?;
    text.strip_prefix("ready ")?.trim().parse().ok()
}

/// Polls (bounded) until the old process `pid` reports its successor; guards it.
pub(super) async fn wait_successor(
    gateway: &GatewayProcess,
    runtime: &Path,
    pid: u32,
) -> Successor {
    for _ in 0..(PATIENCE.as_millis() / 20) {
        if let Some(successor) = successor_of(runtime, pid) {
            return Successor(successor);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no successor reported; log:\n{}", gateway.logs());
}

/// A successor started by the gateway (not our child): stopped by PID, SIGKILL on drop.
pub(super) struct Successor(pub(super) u32);

impl Successor {
    pub(super) fn alive(&self) -> bool {
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
    pub(super) async fn stop(self) {
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

/// Checks shared by the two successful hand-overs, after the load: the old process exited
/// 0 having drained within the grace, and the successor serves the same sockets.
pub(super) async fn assert_handed_over(
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
pub(super) fn upgrade_command(pid: u32) -> std::process::Output {
    Command::new(BIN)
        .args(["upgrade", "--pid", &pid.to_string(), "--timeout", "60s"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap()
}

pub(super) fn kill(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// Polls (bounded) until `gateway`'s log contains `text`.
pub(super) async fn wait_log(gateway: &GatewayProcess, text: &str) {
    for _ in 0..(PATIENCE.as_millis() / 20) {
        if gateway.logs().contains(text) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no {text:?} in the log:\n{}", gateway.logs());
}
