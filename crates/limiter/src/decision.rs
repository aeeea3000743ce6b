//! The answer a limit gives for one request, and the combined answer of all the limits of a route.

use std::time::Duration;

/// What one limit says about one request.
///
/// When the request as a whole is denied, nothing was consumed from any limit, and every decision describes the
/// state as it stands (for a limit that would have admitted, `remaining` counts what is still available).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether this limit admits the request.
    pub allowed: bool,
    /// The capacity of the limit: `limit` for window algorithms, `burst` for bucket algorithms.
    pub limit: u64,
    /// What is still available after this request (or, when denied, what is available now).
    pub remaining: u64,
    /// Milliseconds until this request, with its cost, would be admitted; zero when admitted.
    pub retry_after_ms: u64,
    /// Milliseconds until the limit is back to full capacity for this key.
    pub reset_after_ms: u64,
    /// Milliseconds the request must be held before it conforms (`leaky_bucket` in `delay` mode); zero otherwise.
    pub delay_ms: u64,
    /// How far the key stands past its capacity, where `remaining` stops at zero: a debt (answers that spent more
    /// than they reserved), a limit lowered below what was already admitted, or a `leaky_bucket`'s held requests.
    pub owed: u64,
}

/// The combined answer of every limit of a route, in the order of the route's limits.
///
/// Two outcomes are equal when they decide the same: how the store call was batched is not compared.
#[derive(Debug, Clone, Eq, Default)]
pub struct Outcome {
    /// True when every limit admitted the request (and so it consumed from each).
    pub allowed: bool,
    /// One decision per limit; empty when no store could decide and the policy admitted the request.
    pub decisions: Vec<Decision>,
    /// How many requests' checks the Redis call that decided this one carried, itself included (the batcher
    /// coalesces concurrent requests; on Redis Cluster, the largest of its per-slot calls); 0 when no Redis call
    /// decided it (the memory store, the fallback, a remembered denial).
    pub batch: u32,
}

impl PartialEq for Outcome {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed && self.decisions == other.decisions
    }
}

impl Decision {
    /// How long until this request would be admitted.
    pub fn retry_after(&self) -> Duration {
        Duration::from_millis(self.retry_after_ms)
    }

    /// How long until the limit is back to full capacity.
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.reset_after_ms)
    }

    /// What the key has used of the limit, past its capacity when it owes (`capacity - remaining + owed`).
    pub fn used(&self) -> u64 {
        self.limit.saturating_sub(self.remaining) + self.owed
    }
}

impl Outcome {
    /// Index of the decision that explains the outcome best: among the denying limits the one that makes the
    /// client wait longest; when admitted, the limit with the fewest requests remaining.
    pub fn most_restrictive(&self) -> Option<usize> {
        self.most_restrictive_among(|_| true)
    }

    /// [`most_restrictive`](Self::most_restrictive) among the decisions whose index passes `include` (the
    /// enforced limits, when some are in shadow mode).
    pub fn most_restrictive_among(&self, include: impl Fn(usize) -> bool) -> Option<usize> {
        let indexed = self
            .decisions
            .iter()
            .enumerate()
            .filter(|&(i, _)| include(i));
        if self.allowed {
            indexed.min_by_key(|(_, d)| d.remaining).map(|(i, _)| i)
        } else {
            indexed
                .filter(|(_, d)| !d.allowed)
                .max_by_key(|(_, d)| (d.retry_after_ms, u64::MAX - d.remaining))
                .map(|(i, _)| i)
        }
    }

    /// How long an admitted request must be held before it is forwarded: the longest delay of its limits.
    pub fn delay_ms(&self) -> u64 {
        self.decisions.iter().map(|d| d.delay_ms).max().unwrap_or(0)
    }

    /// The longest wait among the denying limits: when the whole request would be admitted.
    pub fn retry_after_ms(&self) -> u64 {
        self.decisions
            .iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after_ms)
            .max()
            .unwrap_or(0)
    }
}
