//! What the in-process fallback admitted during a Redis outage, carried into Redis when it answers again: so that
//! N instances admit at most N × a limit over any window, not that plus a full limit more from Redis.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use super::store::{LimitCheck, MemoryStore, RedisStore};
use super::Limit;

/// Keys remembered per outage at most; past it, the others' admissions are not carried (the cost of a flood of
/// new keys during an outage stays bounded).
const MAX_KEYS: usize = 100_000;
/// How long one carrying call may wait for Redis.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The keys the fallback admitted requests on since Redis last answered, with their limits.
#[derive(Debug, Default)]
pub(super) struct FallbackLedger {
    keys: Mutex<HashMap<Box<str>, Limit>>,
    /// The fallback store, whose state says how much each key took.
    local: OnceLock<Arc<MemoryStore>>,
}

impl FallbackLedger {
    /// The fallback store whose admissions this ledger carries.
    pub(super) fn set_local(&self, local: Arc<MemoryStore>) {
        let _ = self.local.set(local);
    }

    /// Remembers the keys of a request the fallback admitted.
    pub(super) fn record(&self, checks: &[LimitCheck<'_>]) {
        let mut keys = self.keys.lock();
        for check in checks.iter().filter(|check| !check.limit.is_shadow()) {
            if let Some(limit) = keys.get_mut(check.key) {
                if limit != check.limit {
                    *limit = check.limit.clone();
                }
            } else if keys.len() < MAX_KEYS {
                keys.insert(check.key.into(), check.limit.clone());
            }
        }
    }

    /// Redis answers again: carries into it, in a task of its own, what the fallback took from each key it
    /// admitted on.
    pub(super) fn carry(&self, redis: &RedisStore) {
        let keys = std::mem::take(&mut *self.keys.lock());
        let Some(local) = self.local.get() else {
            return;
        };
        if keys.is_empty() {
            return;
        }
        tokio::spawn(carry_over(redis.clone(), Arc::clone(local), keys));
    }
}

/// For each key, what the fallback's state says was taken and not yet given back by time (the capacity less what
/// remains: a window's count, a bucket's spent tokens), consumed again in Redis one request's cost at a time until
/// Redis refuses (the key is then at its limit there too). Consumed now rather than when it was admitted, so a key
/// may be held a little longer than it would have been: never more admitted.
async fn carry_over(redis: RedisStore, local: Arc<MemoryStore>, keys: HashMap<Box<str>, Limit>) {
    let (mut carried, mut full) = (0u64, 0usize);
    for (key, limit) in &keys {
        let check = LimitCheck { key, limit };
        let standing = local.peek(check);
        let taken = standing.limit.saturating_sub(standing.remaining);
        for _ in 0..taken.div_ceil(limit.cost()) {
            match tokio::time::timeout(CALL_TIMEOUT, redis.check(&[check], None)).await {
                Ok(Ok(outcome)) if outcome.allowed => carried += 1,
                Ok(Ok(_)) => {
                    full += 1;
                    break;
                }
                // Redis failed again: the next recovery carries what the fallback takes from now on.
                Ok(Err(_)) | Err(_) => {
                    tracing::debug!(
                        carried,
                        "carrying the fallback's admissions into redis stopped: redis failed"
                    );
                    return;
                }
            }
        }
    }
    tracing::info!(
        keys = keys.len(),
        requests = carried,
        at_limit = full,
        "what the fallback admitted during the outage is counted in redis"
    );
}
