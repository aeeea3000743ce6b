//! Redis Cluster: routing by hash slot, and a request whose keys span slots checked all-or-nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use fred::util::redis_keyslot;

use super::connection::{Connection, GIVE_BACK_TIMEOUT};
use super::RedisTopology;
use crate::store::script::{EncodedRequest, Mode};
use crate::store::{LimitCheck, StoreError};
use crate::{Decision, Outcome};

// === impl Connection ===

impl Connection {
    /// The hash slot that routes a call for `checks` on Redis Cluster; `None` elsewhere.
    pub(super) fn slot_of(&self, checks: &[LimitCheck<'_>]) -> Option<u16> {
        match self.topology {
            RedisTopology::Cluster => checks.first().map(|c| redis_keyslot(c.key.as_bytes())),
            _ => None,
        }
    }
    /// Checks limits whose keys live in several hash slots (so possibly on several Cluster nodes), which no
    /// single script call may touch: all-or-nothing as one call would be.
    ///
    /// First every slot is asked in a dry run, concurrently, which decides without consuming; a denial there
    /// ends it. Only if every slot admits are the committing calls sent, again one per slot and concurrently.
    /// Between the dry run and the commit another request may take the room a slot had: that slot's commit then
    /// denies (each commit decides again, so no limit ever admits more than it allows), and the slots whose commit
    /// admitted give back what they took, on the window they took it from, before the answer is given. A commit
    /// that reaches Redis past the request's deadline counts nothing (see `run_script`), and one that failed is
    /// given back by no one: a call whose fate is unknown is never undone, lest a give-back free what was not
    /// taken.
    ///
    /// The commits and give-backs run in a task of their own, so that a request that stops waiting (its time ran
    /// out) never leaves one slot's commit standing while another's denied.
    pub(super) async fn check_across_slots(
        self: Arc<Self>,
        checks: &[LimitCheck<'_>],
        groups: &[Vec<usize>],
        now_ms: Option<i64>,
        timeout: Duration,
        lease: u64,
    ) -> Result<Outcome, StoreError> {
        let subsets: Vec<Vec<LimitCheck<'_>>> = groups
            .iter()
            .map(|group| group.iter().map(|&i| checks[i]).collect())
            .collect();
        let deadline = self.deadline(now_ms, timeout);
        let dry_runs = join_all(subsets.iter().map(|subset| {
            let request = EncodedRequest::new(subset, Mode::DryRun).leased(lease);
            let slot = self.slot_of(subset);
            let connection = &self;
            async move {
                connection
                    .run_encoded(slot, &request, deadline, now_ms, timeout)
                    .await
                    .map(|(_, outcome)| outcome)
            }
        }))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        if !dry_runs.iter().all(|outcome| outcome.allowed) {
            return merge(checks.len(), groups, dry_runs);
        }
        let commits: Vec<(Option<u16>, EncodedRequest)> = subsets
            .iter()
            .map(|subset| {
                (
                    self.slot_of(subset),
                    EncodedRequest::new(subset, Mode::Commit).leased(lease),
                )
            })
            .collect();
        let commits = self
            .commit_in_a_task(commits, deadline, now_ms, timeout)
            .await?;
        merge(checks.len(), groups, commits)
    }

    /// [`commit_all_or_give_back`](Self::commit_all_or_give_back) in a task of its own, which runs to its end even
    /// if the caller stops waiting; every part's outcome, or the first failure.
    pub(super) async fn commit_in_a_task(
        self: Arc<Self>,
        commits: Vec<(Option<u16>, EncodedRequest)>,
        deadline: u64,
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Result<Vec<Outcome>, StoreError> {
        let (answer, decided) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let results = self
                .commit_all_or_give_back(&commits, deadline, now_ms, timeout)
                .await;
            let _ = answer.send(results);
        });
        decided
            .await
            .map_err(|_| StoreError::Reply("the commits' task ended unanswered".to_owned()))?
            .into_iter()
            .collect()
    }

    /// Commits every slot's share of one request, concurrently; unless all admitted, gives back what the
    /// admitting ones took. Each slot's outcome (or why its call failed), in order.
    async fn commit_all_or_give_back(
        &self,
        commits: &[(Option<u16>, EncodedRequest)],
        deadline: u64,
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Vec<Result<Outcome, StoreError>> {
        let results =
            join_all(commits.iter().map(|(slot, request)| {
                self.run_encoded(*slot, request, deadline, now_ms, timeout)
            }))
            .await;
        let all_admitted = results
            .iter()
            .all(|result| matches!(result, Ok((_, outcome)) if outcome.allowed));
        if !all_admitted {
            let give_backs = commits.iter().zip(&results).filter_map(|((slot, request), result)| {
                let (at, outcome) = result.as_ref().ok().filter(|(_, o)| o.allowed)?;
                let give_back = request.give_back(outcome.decisions.iter().map(|d| d.allowed));
                let at = u64::try_from(*at).unwrap_or(0);
                Some(async move {
                    let given = self
                        .run_encoded(*slot, &give_back, at, now_ms, GIVE_BACK_TIMEOUT)
                        .await;
                    if let Err(error) = given {
                        tracing::warn!(
                            %error,
                            "a denied request's share on another hash slot could not be given back"
                        );
                    }
                })
            });
            join_all(give_backs).await;
        }
        results
            .into_iter()
            .map(|result| {
                result.map(|(_, outcome)| {
                    if all_admitted {
                        return outcome;
                    }
                    // Given back: the request is denied and consumed nothing.
                    Outcome {
                        allowed: false,
                        ..outcome
                    }
                })
            })
            .collect()
    }
}

/// The request's checks grouped by the hash slot of their keys (indices into `checks`, in order), or `None`
/// when all keys share one slot: the common case, then one script call covers them all.
pub(super) fn slot_groups(checks: &[LimitCheck<'_>]) -> Option<Vec<Vec<usize>>> {
    let slot = |check: &LimitCheck<'_>| redis_keyslot(check.key.as_bytes());
    let first = slot(checks.first()?);
    if checks[1..].iter().all(|check| slot(check) == first) {
        return None;
    }
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, check) in checks.iter().enumerate() {
        let slot = slot(check);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    Some(groups.into_iter().map(|(_, members)| members).collect())
}

/// Puts the per-slot outcomes back in the order of the request's checks; admitted only if every slot admitted.
pub(super) fn merge(
    limits: usize,
    groups: &[Vec<usize>],
    outcomes: Vec<Outcome>,
) -> Result<Outcome, StoreError> {
    let mut decisions: Vec<Option<Decision>> = vec![None; limits];
    let mut allowed = true;
    let mut batch = 0;
    for (group, outcome) in groups.iter().zip(outcomes) {
        allowed &= outcome.allowed;
        batch = batch.max(outcome.batch);
        for (&i, decision) in group.iter().zip(outcome.decisions) {
            decisions[i] = Some(decision);
        }
    }
    let decisions = decisions
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| StoreError::Reply(format!("missing decisions for {limits} limits")))?;
    Ok(Outcome {
        allowed,
        decisions,
        batch,
    })
}

/// Polls every future concurrently and returns their outputs in order (the per-slot calls go to different
/// nodes: waiting for them one after another would add a round trip per slot).
pub(super) async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, Limit};

    fn limit() -> Limit {
        Limit::new(
            "l",
            Algorithm::FixedWindow {
                limit: 1,
                period_ms: 1_000,
            },
            1,
        )
        .expect("valid")
    }

    #[test]
    fn keys_sharing_a_hash_tag_need_one_call() {
        let limit = limit();
        let checks =
            ["p:r:a:{v}", "p:r:b:{v}", "p:r:c:{v}"].map(|key| LimitCheck { key, limit: &limit });
        assert_eq!(slot_groups(&checks), None);
        assert_eq!(slot_groups(&checks[..1]), None);
        assert_eq!(slot_groups(&[]), None);
    }

    #[test]
    fn keys_in_several_slots_are_grouped_in_request_order() {
        let limit = limit();
        let checks = ["p:r:a:{x}", "p:r:b:{y}", "p:r:c:{x}", "p:r:d:{z}"]
            .map(|key| LimitCheck { key, limit: &limit });
        assert_eq!(
            slot_groups(&checks),
            Some(vec![vec![0, 2], vec![1], vec![3]])
        );
    }

    #[test]
    fn merged_outcomes_keep_the_request_order_and_admit_only_if_every_slot_does() {
        let decision = |remaining| Decision {
            allowed: remaining > 0,
            limit: 9,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: 0,
            delay_ms: 0,
            owed: 0,
        };
        let groups = vec![vec![0, 2], vec![1]];
        let outcomes = vec![
            Outcome {
                allowed: true,
                decisions: vec![decision(1), decision(3)],
                batch: 2,
            },
            Outcome {
                allowed: false,
                decisions: vec![decision(0)],
                batch: 5,
            },
        ];
        let merged = merge(3, &groups, outcomes).expect("complete");
        assert!(!merged.allowed);
        assert_eq!(merged.batch, 5, "the largest per-slot call");
        let remaining: Vec<u64> = merged.decisions.iter().map(|d| d.remaining).collect();
        assert_eq!(remaining, [1, 0, 3]);
        assert!(merge(3, &groups[..1], Vec::new()).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn join_all_runs_futures_concurrently_and_keeps_their_order() {
        let started = tokio::time::Instant::now();
        let outputs = join_all([30u64, 10, 20].into_iter().map(|ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ms
        }))
        .await;
        assert_eq!(outputs, [30, 10, 20]);
        // Paused clock: one after another would take 60 ms.
        assert_eq!(started.elapsed(), Duration::from_millis(30));
    }
}
