//! The reload task: SIGHUP, or a changed file, swaps listener certificates in place.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::listener::{ReloadOutcome, ReloadableCert};
use crate::plumbing::hangup::Hangup;

/// How often the certificate files are checked for changes. One `stat` per file per second
/// is negligible, and a rotation tool's rename is picked up within this bound.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Reloads `certs` on SIGHUP and whenever their files change, until `stop` resolves.
///
/// The handler for SIGHUP is installed even without certificates; the configuration reload
/// (`start::reload`) answers the same signal.
pub async fn watch(certs: Vec<Arc<ReloadableCert>>, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    let mut hangup = Hangup::install("certificates reload on file change only");
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = hangup.received() => {
                if certs.is_empty() {
                    // The configuration reloads on SIGHUP too (`start::reload`), which logs.
                    tracing::debug!("SIGHUP: no TLS certificate configured");
                }
                for cert in &certs {
                    report(cert, cert.reload(true), "SIGHUP");
                }
            }
            _ = poll.tick(), if !certs.is_empty() => {
                for cert in &certs {
                    report(cert, cert.reload(false), "file change");
                }
            }
        }
    }
}

fn report(cert: &ReloadableCert, outcome: ReloadOutcome, trigger: &'static str) {
    match outcome {
        ReloadOutcome::Unchanged => {}
        ReloadOutcome::Reloaded => tracing::info!(
            listener = cert.name(),
            cert = %cert.cert_path().display(),
            trigger,
            "TLS certificate reloaded; new handshakes use it, open connections keep theirs"
        ),
        ReloadOutcome::Refused(err) => tracing::error!(
            listener = cert.name(),
            error = %err,
            trigger,
            "new TLS certificate refused; the previous certificate stays in service"
        ),
    }
}
