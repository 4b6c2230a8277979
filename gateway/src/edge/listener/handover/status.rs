//! How `portcullis upgrade --pid PID` learns the outcome of a hand-over: the running process
//! writes `<runtime dir>/<pid>.status` (atomically, by rename) once the hand-over is over,
//! `ready <successor pid>` after the successor serves and this process stopped accepting,
//! or `failed: <reason>` while it keeps serving. The command removes an old status file,
//! sends `SIGUSR2`, and polls for the new one (bounded by its `--timeout`).

use std::path::PathBuf;
use std::time::Duration;

use super::{runtime_dir, runtime_dir_of, HandoverError};

/// How a hand-over ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The successor (this PID) serves; the old process stopped accepting and drains.
    Ready(u32),
    /// The old process keeps serving; why the successor did not take over.
    Failed(String),
}

/// How often `portcullis upgrade` looks for the outcome.
const POLL: Duration = Duration::from_millis(50);

/// The status file of the process `pid`, in its private directory.
fn path_for(pid: u32) -> Result<PathBuf, HandoverError> {
    Ok(runtime_dir_of(pid)?.join(format!("{pid}.status")))
}

// === impl Outcome ===

impl Outcome {
    fn to_line(&self) -> String {
        match self {
            Self::Ready(pid) => format!("ready {pid}\n"),
            Self::Failed(reason) => format!("failed: {reason}\n"),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let line = text.lines().next()?;
        if let Some(pid) = line.strip_prefix("ready ") {
            return pid.trim().parse().ok().map(Self::Ready);
        }
        line.strip_prefix("failed: ")
            .map(|reason| Self::Failed(reason.to_owned()))
    }
}

/// Records this process's hand-over outcome (logged, not fatal, when it cannot be written).
pub(crate) fn write(outcome: Outcome) {
    let written = runtime_dir().and_then(|dir| {
        let path = dir.join(format!("{}.status", std::process::id()));
        let temp = path.with_extension("status.tmp");
        std::fs::write(&temp, outcome.to_line())
            .and_then(|()| std::fs::rename(&temp, &path))
            .map_err(HandoverError::io("writing the hand-over status"))
    });
    if let Err(err) = written {
        tracing::warn!(%err, "portcullis upgrade will not learn this outcome");
    }
}

/// `portcullis upgrade --pid PID`: asks `pid` to hand over (`SIGUSR2`) and waits up to
/// `timeout` for the outcome. Must run as the gateway's user (the private directory is
/// found from the gateway's own environment).
pub fn upgrade(pid: u32, timeout: Duration) -> Result<Outcome, HandoverError> {
    let path = path_for(pid)?;
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(HandoverError::Io {
                what: "removing the previous hand-over status",
                source,
            })
        }
    }
    let target = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or(HandoverError::Refused("not a process id"))?;
    rustix::process::kill_process(target, rustix::process::Signal::USR2)
        .map_err(|err| HandoverError::io("sending SIGUSR2")(err.into()))?;
    let polls = (timeout.as_millis() / POLL.as_millis()).max(1);
    for _ in 0..polls {
        std::thread::sleep(POLL);
        if let Some(outcome) = std::fs::read_to_string(&path)
            .ok()
            .as_deref()
            .and_then(Outcome::parse)
        {
            return Ok(outcome);
        }
        if rustix::process::test_kill_process(target).is_err() {
            return Err(HandoverError::Refused(
                "the gateway exited before reporting a hand-over",
            ));
        }
    }
    Err(HandoverError::Refused(
        "no hand-over outcome within --timeout; see the gateway's log",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_through_the_status_line() {
        for outcome in [Outcome::Ready(42), Outcome::Failed("bad config".into())] {
            assert_eq!(Outcome::parse(&outcome.to_line()), Some(outcome));
        }
        assert_eq!(Outcome::parse("ready x\n"), None);
        assert_eq!(Outcome::parse(""), None);
    }
}
