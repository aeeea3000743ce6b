//! The `store:` section: the backend, the Redis URL, the time budget, the in-process store's bounds.

use super::checks::{positive_count, positive_duration};
use super::issues::Issues;
use crate::config::model::*;
use crate::config::raw::*;
use crate::limiter::store::WhenFull;
use crate::limiter::OnError;

/// Redis URL schemes the store understands.
/// `rediss` variants are the same deployments over TLS.
const REDIS_SCHEMES: [&str; 6] = [
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
];

pub(super) fn store(issues: &mut Issues, raw: &RawStore) -> Option<StoreSettings> {
    let before = issues.count();
    let backend = match raw.backend {
        RawBackend::Redis => {
            check_redis_url(issues, &raw.url);
            BackendKind::Redis
        }
        RawBackend::Memory => BackendKind::Memory,
    };
    let timeout = positive_duration(issues, "store.timeout", &raw.timeout);
    // The prefix precedes the `{value}` hash tag; a brace in it would move every key to one cluster slot.
    if raw.key_prefix.contains(['{', '}']) {
        issues.add(
            "store.key_prefix",
            "must not contain '{' or '}' (they would change the Redis Cluster hash slot of every key)",
        );
    }
    let max_keys = positive_count(issues, "store.max_keys", raw.max_keys);
    let pool_size = positive_count(issues, "store.pool_size", raw.pool_size);
    // One limit may not take the whole store: a quarter of it unless said otherwise.
    let max_keys_per_limit = match raw.max_keys_per_limit {
        Some(count) => positive_count(issues, "store.max_keys_per_limit", count),
        None => max_keys.map(|keys| keys.div_ceil(4)),
    };
    // A share larger than the store is a share of nothing: a mistake (often max_keys lowered alone), not a wish.
    if let (Some(per_limit), Some(total)) = (max_keys_per_limit, max_keys) {
        if per_limit > total {
            issues.add(
                "store.max_keys_per_limit",
                format!(
                    "must be at most store.max_keys ({total}), got {per_limit}: it is one limit's share of the \
                     store (equal to max_keys lets one limit fill it)"
                ),
            );
        }
    }
    let on_error = match raw.on_error {
        RawOnError::Allow => OnError::Allow,
        RawOnError::Deny => OnError::Deny,
        RawOnError::Local => OnError::Local,
    };
    if issues.count() != before {
        return None;
    }
    Some(StoreSettings {
        backend,
        url: raw.url.clone(),
        timeout: timeout?,
        on_error,
        key_prefix: raw.key_prefix.clone(),
        max_keys: max_keys?,
        when_full: match raw.when_full {
            RawWhenFull::Deny => WhenFull::Deny,
            RawWhenFull::Allow => WhenFull::Allow,
        },
        pool_size: pool_size?,
        max_keys_per_limit: max_keys_per_limit?,
    })
}

fn check_redis_url(issues: &mut Issues, url: &str) {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    let known = scheme.is_some_and(|s| REDIS_SCHEMES.contains(&s));
    if !known {
        issues.add(
            "store.url",
            format_args!(
                "invalid Redis URL {url:?} (use redis://, redis-cluster:// or redis-sentinel://, or rediss… for TLS)"
            ),
        );
    }
    // The store parses the URL the same way when it connects: fail at `tollgate check`, not at start-up. (A build
    // without the Redis store refuses the settings whole, `StoreError::NoRedis`, when the store is made from them.)
    #[cfg(feature = "redis")]
    if known {
        if let Err(e) = fred::types::config::Config::from_url(url) {
            issues.add("store.url", format_args!("invalid Redis URL {url:?}: {e}"));
        }
    }
}
