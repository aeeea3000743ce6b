//! The rate-limit response fields: `X-RateLimit-*`, and the IETF draft's `RateLimit-Policy` and `RateLimit`.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::LimitSettings;
use crate::limiter::{Decision, Outcome};

static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `"per-ip";q=100;w=60, "per-key";q=50;w=180` for a route's limits; `None` without limits.
pub(super) fn policy(limits: &[LimitSettings]) -> Option<HeaderValue> {
    // Shadow limits are never enforced: clients are not told about them.
    let items: Vec<String> = limits
        .iter()
        .filter(|l| !l.limit.is_shadow())
        .map(|l| {
            let algorithm = l.limit.algorithm();
            format!(
                "\"{}\";q={};w={}",
                l.limit.name(),
                algorithm.capacity(),
                ceil_seconds(algorithm.window_ms())
            )
        })
        .collect();
    if items.is_empty() {
        return None;
    }
    HeaderValue::from_str(&items.join(", ")).ok()
}

/// Adds the fields describing `outcome` to `headers`; `names[i]` is the name of the limit of `outcome.decisions[i]`.
///
/// The `X-RateLimit-*` and `RateLimit` fields describe one limit: the one that explains the outcome (see
/// [`Outcome::most_restrictive`]).
pub(super) fn apply(
    headers: &mut HeaderMap,
    policy: Option<&HeaderValue>,
    outcome: &Outcome,
    names: &[&str],
) {
    let Some(index) = outcome.most_restrictive() else {
        return;
    };
    let decision: &Decision = &outcome.decisions[index];
    let reset = ceil_seconds(decision.reset_after_ms);
    headers.insert(&X_RATELIMIT_LIMIT, HeaderValue::from(decision.limit));
    headers.insert(
        &X_RATELIMIT_REMAINING,
        HeaderValue::from(decision.remaining),
    );
    headers.insert(&X_RATELIMIT_RESET, HeaderValue::from(reset));
    if let Some(policy) = policy {
        headers.insert(&RATELIMIT_POLICY, policy.clone());
    }
    let current = format!("\"{}\";r={};t={}", names[index], decision.remaining, reset);
    if let Ok(value) = HeaderValue::from_str(&current) {
        headers.insert(&RATELIMIT, value);
    }
}

/// Seconds for a header: rounded up, so a client that waits that long is never early.
fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}
