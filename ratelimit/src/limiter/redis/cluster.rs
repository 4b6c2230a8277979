//! Redis Cluster: a request whose keys span slots, decided by one script per slot, all
//! slots at once, and refunded on the slots that admitted when another refused.

use std::time::Duration;

use futures_util::future::join_all;

use super::keys::counter_ttl_ms;
use super::reply::{tick_nanos, verdict_of};
use super::RedisLimiter;
use crate::decision::Verdict;
use crate::limiter::{Check, Eval, LimiterError};

/// Cluster only: the checks of one request whose keys live in one slot, with their
/// positions in the request.
pub(super) struct SlotGroup {
    positions: Vec<usize>,
    checks: Vec<Check>,
}

impl RedisLimiter {
    /// Cluster only: the checks grouped by slot, in order of first appearance, when they
    /// span more than one slot. `None`: one script decides them all (always on one server).
    pub(super) fn slot_groups(
        &self,
        checks: &[Check],
        unix_now: Option<Duration>,
    ) -> Option<Vec<SlotGroup>> {
        if !self.client.is_cluster() || checks.len() < 2 {
            return None;
        }
        let mut groups: Vec<(u16, SlotGroup)> = Vec::with_capacity(2);
        for (i, check) in checks.iter().enumerate() {
            let slot = portcullis_redis::slot(self.target(check, unix_now).key.as_bytes());
            let at = match groups.iter().position(|(s, _)| *s == slot) {
                Some(at) => at,
                None => {
                    groups.push((
                        slot,
                        SlotGroup {
                            positions: Vec::new(),
                            checks: Vec::new(),
                        },
                    ));
                    groups.len() - 1
                }
            };
            if let Some((_, group)) = groups.get_mut(at) {
                group.positions.push(i);
                group.checks.push(check.clone());
            }
        }
        (groups.len() > 1).then(|| groups.into_iter().map(|(_, g)| g).collect())
    }

    /// Cluster: one script per slot, all sent at once (one round trip of latency). Admitted
    /// only if every slot admitted; then every slot has consumed. Otherwise the slots that
    /// admitted (and so consumed) are refunded before the answer. See the module docs.
    pub(super) async fn decide_split(
        &self,
        groups: &[SlotGroup],
        commit: bool,
        unix_now: Option<Duration>,
    ) -> Result<Verdict, LimiterError> {
        let outcomes = join_all(
            groups
                .iter()
                .map(|g| self.bounded(self.run(&g.checks, commit, unix_now))),
        )
        .await;
        let admitted = outcomes.iter().all(|o| matches!(o, Ok((true, _))));
        if commit && !admitted {
            let refunds = groups.iter().zip(&outcomes).filter_map(|(g, o)| match o {
                Ok((true, evals)) => Some(self.refund(&g.checks, evals, unix_now)),
                _ => None,
            });
            for result in join_all(refunds).await {
                if let Err(err) = result {
                    // The tokens stay consumed until the buckets refill: the documented
                    // exception to "a rejected request consumes nothing".
                    tracing::warn!(error = %err, "rate-limit refund failed on Redis Cluster");
                }
            }
        }
        let mut slots: smallvec::SmallVec<[Option<(&Check, Eval)>; 4]> =
            smallvec::smallvec![None; groups.iter().map(|g| g.checks.len()).sum()];
        for (group, outcome) in groups.iter().zip(outcomes) {
            let (_, evals) = outcome?;
            for ((&at, check), eval) in group.positions.iter().zip(&group.checks).zip(evals) {
                if let Some(slot) = slots.get_mut(at) {
                    *slot = Some((check, eval));
                }
            }
        }
        let bad = || LimiterError::Protocol("a check got no decision".into());
        let evals = slots
            .into_iter()
            .map(|s| s.ok_or_else(bad))
            .collect::<Result<smallvec::SmallVec<[(&Check, Eval); 4]>, _>>()?;
        Ok(verdict_of(
            evals.iter().map(|(c, e)| (*c, e)),
            commit && admitted,
        ))
    }

    /// Gives back what an admitted script consumed for `checks` (one slot).
    async fn refund(
        &self,
        checks: &[Check],
        evals: &[Eval],
        unix_now: Option<Duration>,
    ) -> Result<(), LimiterError> {
        let mut invocation = self.refund_script.prepare_invoke();
        let mut any = false;
        for (check, eval) in checks.iter().zip(evals) {
            // A check that did not allow consumed nothing (a shadow one that would reject).
            if !eval.allowed() || check.cost == 0 {
                continue;
            }
            let target = self.target(check, unix_now);
            invocation
                .key(target.key)
                .arg(check.policy.store_interval())
                .arg(check.cost)
                .arg(target.until_end.map_or(0, counter_ttl_ms))
                .arg(tick_nanos(&check.policy));
            any = true;
        }
        if !any {
            return Ok(());
        }
        self.bounded(async {
            let mut conn = self.connection().await?;
            invocation.invoke_async::<i64>(&mut conn).await?;
            Ok(())
        })
        .await
    }
}
