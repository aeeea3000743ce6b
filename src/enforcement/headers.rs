//! The rate-limit response fields: `X-RateLimit-*`, and the IETF draft's `RateLimit-Policy` and `RateLimit`.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::LimitSettings;
use crate::limiter::{Decision, Limit};

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

/// What the fields say of one limit whatever the decision, rendered once when the config is loaded.
#[derive(Debug, Clone)]
pub(super) struct Advertised {
    /// The start of its `RateLimit` item, `"<name>";r=`.
    rate_limit_head: String,
    /// Its capacity (`limit` or `burst`), what decisions report as their limit.
    capacity: u64,
    /// `capacity` as the `X-RateLimit-Limit` value: cloning it shares the bytes.
    capacity_value: HeaderValue,
}

impl Advertised {
    pub(super) fn new(limit: &Limit) -> Self {
        let capacity = limit.algorithm().capacity();
        Self {
            rate_limit_head: format!("\"{}\";r=", limit.name()),
            capacity,
            capacity_value: HeaderValue::from(capacity),
        }
    }
}

/// Adds the fields describing `decision`, the one that explains the request's outcome (see
/// [`Outcome::most_restrictive`](crate::limiter::Outcome::most_restrictive)), to `headers`; `limit` is how its limit
/// is advertised.
///
/// Runs on every admitted response: what does not change per request was rendered at load, the numbers are rendered
/// without the formatting machinery, and the map grows once.
pub(super) fn apply(
    headers: &mut HeaderMap,
    policy: Option<&HeaderValue>,
    decision: &Decision,
    limit: &Advertised,
) {
    let reset = ceil_seconds(decision.reset_after_ms);
    headers.reserve(5);
    let limit_value = if decision.limit == limit.capacity {
        limit.capacity_value.clone()
    } else {
        HeaderValue::from(decision.limit)
    };
    headers.insert(&X_RATELIMIT_LIMIT, limit_value);
    headers.insert(
        &X_RATELIMIT_REMAINING,
        HeaderValue::from(decision.remaining),
    );
    headers.insert(&X_RATELIMIT_RESET, HeaderValue::from(reset));
    if let Some(policy) = policy {
        headers.insert(&RATELIMIT_POLICY, policy.clone());
    }
    let mut numbers = itoa::Buffer::new();
    let mut current = String::with_capacity(limit.rate_limit_head.len() + 24);
    current.push_str(&limit.rate_limit_head);
    current.push_str(numbers.format(decision.remaining));
    current.push_str(";t=");
    current.push_str(numbers.format(reset));
    if let Ok(value) = HeaderValue::try_from(current) {
        headers.insert(&RATELIMIT, value);
    }
}

/// Seconds for a header: rounded up, so a client that waits that long is never early.
fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}
