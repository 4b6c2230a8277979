//! Reading the Lua script's reply: every check re-evaluated from the value the script read,
//! with the same arithmetic and ticks as the script, so the decisions reported match what
//! Redis decided (see the parent module's docs).

use std::time::Duration;

use crate::decision::Verdict;
use crate::gcra::Gcra;
use crate::limiter::{Check, Eval, LimiterError};
use crate::period::Quota;
use crate::policy::Policy;

/// The script's tick for `policy`'s bucket, in nanoseconds (1 or 1000).
pub(super) fn tick_nanos(policy: &Policy) -> u64 {
    u64::try_from(policy.store_tick().as_nanos()).unwrap_or(1)
}

/// Evaluates one check from the value the script read (`-1`: absent; a bucket's TAT in
/// nanoseconds) at server time `now_us`, in the policy's store ticks exactly as the script
/// did (a microsecond bucket rounds a stored sub-microsecond remainder up).
pub(super) fn evaluate(
    check: &Check,
    until_end: Option<Duration>,
    now_us: u64,
    value: i64,
) -> Eval {
    let p = &check.policy;
    let stored = u64::try_from(value).ok();
    let cost = u64::from(check.cost);
    match until_end {
        None => {
            let (now, stored) = if tick_nanos(p) == 1 {
                (now_us.saturating_mul(1000), stored)
            } else {
                (now_us, stored.map(|ns| ns.div_ceil(1000)))
            };
            Eval::Bucket(Gcra::new(p.store_interval(), p.burst()).evaluate(stored, now, cost))
        }
        Some(until_end) => {
            Eval::Quota(Quota::new(p.burst()).evaluate(stored.unwrap_or(0), cost, until_end))
        }
    }
}

/// One evaluation per check, inline up to four.
pub(super) type Evals = smallvec::SmallVec<[Eval; 4]>;

/// Recomputes the evaluations from the values the script read (see the module docs), and
/// whether the script admitted. `windows[i]`: time left in check `i`'s window (calendar
/// quotas only).
pub(super) fn evals_from_reply(
    checks: &[Check],
    windows: &[Option<Duration>],
    reply: &[i64],
) -> Result<(bool, Evals), LimiterError> {
    let bad = || LimiterError::Protocol(format!("script reply {reply:?}"));
    let (&now, rest) = reply.split_first().ok_or_else(bad)?;
    let (&admitted, values) = rest.split_first().ok_or_else(bad)?;
    if values.len() != checks.len() || windows.len() != checks.len() || now < 0 {
        return Err(bad());
    }
    let now = now.unsigned_abs();
    let admitted = admitted == 1;
    let evals: Evals = checks
        .iter()
        .zip(windows)
        .zip(values)
        .map(|((check, &until_end), &value)| evaluate(check, until_end, now, value))
        .collect();
    let blocked = checks
        .iter()
        .zip(&evals)
        .any(|(check, eval)| !eval.allowed() && !check.policy.is_shadow());
    if blocked == admitted {
        return Err(bad());
    }
    Ok((admitted, evals))
}

/// The verdict over evaluated checks; `committed`: the request was admitted and consumed.
pub(super) fn verdict_of<'a>(
    evals: impl Iterator<Item = (&'a Check, &'a Eval)>,
    committed: bool,
) -> Verdict {
    Verdict::from_decisions(evals.map(|(check, eval)| {
        eval.decision(
            committed && eval.allowed(),
            check.policy.is_shadow(),
            check.policy.store_tick(),
        )
    }))
}
