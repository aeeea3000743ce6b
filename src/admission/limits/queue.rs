//! What a set's limits say of a request refused only for want of a slot it may wait for (`queue:` on a
//! `concurrency` limit), and asking again for it.

use super::{Checked, LimitRequest, LimitSet, NotChecked, Replaced, SetLimit};
use crate::admission::reserve::Reserve;
use crate::key::RequestFacts;
use crate::limiter::{Algorithm, Limit, RateLimiter, SlotQueues};

/// A refusal that waiting may end: every limit that refused is a `concurrency` limit with a queue. Names the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::admission) struct QueuedRefusal {
    /// The limit's index in the set.
    pub index: usize,
    /// Its queue's `max_wait`, in milliseconds.
    pub max_wait_ms: u64,
    /// Its queue's `max_waiting`.
    pub max_waiting: u64,
    /// Its lease, in milliseconds.
    pub lease_ms: u64,
}

// === impl LimitSet ===

impl LimitSet {
    /// The refusal of `checked`, if waiting for a slot may end it: only `concurrency` limits with a queue refused
    /// (a shadow limit refuses nothing). `None` for an admission, or when any other limit refused.
    pub(in crate::admission) fn queued_refusal(&self, checked: &Checked) -> Option<QueuedRefusal> {
        if checked.outcome.allowed {
            return None;
        }
        let mut first = None;
        for (i, decision) in checked.outcome.decisions.iter().enumerate() {
            if decision.allowed || self.is_shadow(checked, i) {
                continue;
            }
            let index = *checked.applied.get(i)?;
            let limit = self.limit_at(index, checked.replaced.as_ref());
            let Algorithm::Concurrency {
                lease_ms,
                queue: Some(queue),
                ..
            } = limit.algorithm()
            else {
                return None;
            };
            first.get_or_insert(QueuedRefusal {
                index,
                max_wait_ms: queue.max_wait_ms,
                max_waiting: queue.max_waiting,
                lease_ms: *lease_ms,
            });
        }
        first
    }

    /// The store key the request `facts` describes has for the limit at `index`, if that limit applies to it.
    pub(in crate::admission) fn key_at(
        &self,
        facts: &RequestFacts<'_>,
        index: usize,
    ) -> Option<String> {
        let keys = self.request_keys(facts).ok()?;
        let key = keys
            .iter()
            .find(|&(at, _)| at == index)
            .map(|(_, key)| key.to_owned());
        key
    }

    /// What the store keys of the limit at `index` start with: the limit's name among every instance's waiting
    /// requests (a plan's limit shares it across routes, as its keys do).
    pub(in crate::admission) fn head_at(&self, index: usize) -> &str {
        &self.limits[index].head
    }

    /// `tollgate_queue_wait_seconds` of the limit at `index`, when its configuration has a queue.
    pub(in crate::admission) fn queue_wait(&self, index: usize) -> Option<&metrics::Histogram> {
        self.limits.get(index)?.queue_wait.as_ref()
    }

    /// Asks the limiter again, for all the limits, what `checked` asked (the same replaced limits, `reserve`'s
    /// reservation): all-or-nothing as the first time, so a refusal takes nothing from any limit. Its
    /// `concurrency` limits count to the `max` of the running config: a reload since the request came may have
    /// changed it, and the request waited through it with the config it came under.
    pub(in crate::admission) async fn ask_again<R: Reserve>(
        &self,
        limiter: &RateLimiter,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        reserve: R,
    ) -> Result<Checked, NotChecked> {
        let replaced = self.at_running_max(limiter.slot_queues(), checked.replaced.as_ref());
        let request = LimitRequest {
            facts,
            replaced,
            reserve,
        };
        self.check(limiter, request).await
    }

    /// The `max` of each `concurrency` limit in the running config, by the head of its store keys.
    pub(crate) fn slot_maxes(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        self.limits
            .iter()
            .filter_map(|limit| match limit.settings.limit.algorithm() {
                Algorithm::Concurrency { max, .. } => Some((limit.head.clone(), *max)),
                _ => None,
            })
    }

    /// `replaced`, and each `concurrency` limit it leaves as the set has it at the `max` the running config
    /// gives it, where that differs (a limit a consumer's override replaces keeps the override's).
    fn at_running_max(&self, queues: &SlotQueues, replaced: Option<&Replaced>) -> Option<Replaced> {
        let mut changed: Vec<(usize, Limit)> = Vec::new();
        for (index, SetLimit { settings, head, .. }) in self.limits.iter().enumerate() {
            let Algorithm::Concurrency { max, .. } = settings.limit.algorithm() else {
                continue;
            };
            if replaced.is_some_and(|replaced| replaced.get(index).is_some()) {
                continue;
            }
            match queues.running_max(head) {
                Some(running) if running != *max => {
                    changed.push((index, settings.limit.clone().with_max(running)));
                }
                _ => {}
            }
        }
        if changed.is_empty() {
            return replaced.cloned();
        }
        // Counted from the set's first limit: what `replaced` replaces moves to its index in the set.
        if let Some(replaced) = replaced {
            let offset = replaced.offset;
            changed.extend(
                replaced
                    .limits
                    .iter()
                    .map(|(index, limit)| (index + offset, limit.clone())),
            );
        }
        Some(Replaced::new(0, changed.into()))
    }
}
