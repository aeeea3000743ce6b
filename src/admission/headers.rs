//! The rate-limit response fields: `X-RateLimit-*`, and the IETF draft's `RateLimit-Policy` and `RateLimit`.

use std::sync::OnceLock;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::limiter::{Decision, Limit};

static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `"per-ip";q=100;w=60, "per-key";q=50;w=180` for a route's limits; `None` without limits. A calendar window's `w`
/// is the length of the window `at_ms` falls in (when given: a request's time).
pub(crate) fn policy<'l>(
    limits: impl Iterator<Item = &'l Limit>,
    at_ms: Option<i64>,
) -> Option<HeaderValue> {
    // Shadow limits are never enforced: clients are not told about them.
    let items: Vec<String> = limits
        .filter(|l| !l.is_shadow())
        .map(|l| {
            let algorithm = l.algorithm();
            format!(
                "\"{}\";q={};w={}",
                l.name(),
                algorithm.capacity(),
                ceil_seconds(
                    at_ms.map_or_else(|| algorithm.window_ms(), |at| algorithm.window_ms_at(at))
                )
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
pub(crate) struct Advertised {
    /// The start of its `RateLimit` item, `"<name>";r=`.
    rate_limit_head: String,
    /// Its capacity (`limit` or `burst`), what decisions report as their limit.
    capacity: u64,
    /// `capacity` as the `X-RateLimit-Limit` value: cloning it shares the bytes.
    capacity_value: HeaderValue,
}

impl Advertised {
    pub(crate) fn new(limit: &Limit) -> Self {
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
/// Runs on every admitted response: what does not change per request was rendered at load, small numbers come
/// from a table, and the map grows once. `HeaderValue::from(u64)` would cost two allocations a number (a buffer
/// and the header shared over it) and a `String` for `RateLimit` two more; here `RateLimit` costs one, and a
/// number one only when it is too large for the table.
pub(crate) fn apply(
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
        number_value(decision.limit)
    };
    headers.insert(&X_RATELIMIT_LIMIT, limit_value);
    headers.insert(&X_RATELIMIT_REMAINING, number_value(decision.remaining));
    headers.insert(&X_RATELIMIT_RESET, number_value(reset));
    if let Some(policy) = policy {
        headers.insert(&RATELIMIT_POLICY, policy.clone());
    }
    // Exactly sized, so that it becomes the header's bytes as it is (no copy, no second allocation).
    let (mut remaining, mut reset_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (remaining, reset) = (
        remaining.format(decision.remaining).as_bytes(),
        reset_digits.format(reset).as_bytes(),
    );
    let head = limit.rate_limit_head.as_bytes();
    let mut current = Vec::with_capacity(head.len() + remaining.len() + 3 + reset.len());
    current.extend_from_slice(head);
    current.extend_from_slice(remaining);
    current.extend_from_slice(b";t=");
    current.extend_from_slice(reset);
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(current)) {
        headers.insert(&RATELIMIT, value);
    }
}

static X_RATELIMIT_LIMIT_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-limit-tokens");
static X_RATELIMIT_REMAINING_TOKENS: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining-tokens");
static X_RATELIMIT_RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");

/// The fields OpenAI's API gives of its token limit, for the token limit `decision` is of: its capacity, what is
/// left, and the time until it is full again as OpenAI writes it (`6m0s`, `1s`, `20ms`).
pub(crate) fn apply_tokens(headers: &mut HeaderMap, decision: &Decision) {
    headers.insert(&X_RATELIMIT_LIMIT_TOKENS, number_value(decision.limit));
    headers.insert(
        &X_RATELIMIT_REMAINING_TOKENS,
        number_value(decision.remaining),
    );
    if let Ok(value) = HeaderValue::from_str(&go_duration(decision.reset_after_ms)) {
        headers.insert(&X_RATELIMIT_RESET_TOKENS, value);
    }
}

/// Adds the `RateLimit` item of the limit `name`'s `decision` after the items already there.
pub(crate) fn add_rate_limit_item(headers: &mut HeaderMap, name: &str, decision: &Decision) {
    let item = format!(
        "\"{name}\";r={};t={}",
        decision.remaining,
        ceil_seconds(decision.reset_after_ms)
    );
    let value = match headers.get(&RATELIMIT).and_then(|v| v.to_str().ok()) {
        Some(existing) => format!("{existing}, {item}"),
        None => item,
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(&RATELIMIT, value);
    }
}

/// `ms` as Go writes a duration, as OpenAI's `x-ratelimit-reset-*` fields do: `20ms` below a second, else whole
/// seconds rounded up (`1s`, `6m0s`, `1h0m0s`).
fn go_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let seconds = ceil_seconds(ms);
    let (hours, minutes, seconds) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// Numbers below this come from [`small_numbers`]: remaining counts and reset seconds of usual limits (100 a
/// minute, 1,000 an hour) fall below it.
const SMALL_NUMBERS: u64 = 1024;

/// `n` as a header value: from the table when small (no allocation, and cloning a static value is a copy),
/// otherwise rendered into one exact allocation.
fn number_value(n: u64) -> HeaderValue {
    if let Some(value) = usize::try_from(n).ok().and_then(|i| small_numbers().get(i)) {
        return value.clone();
    }
    let mut digits = itoa::Buffer::new();
    HeaderValue::from_str(digits.format(n)).expect("decimal digits are a valid header value")
}

/// The header values of `0..SMALL_NUMBERS`, made once over strings that live as long as the process (a few KiB).
fn small_numbers() -> &'static [HeaderValue] {
    static TABLE: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..SMALL_NUMBERS)
            .map(|n| HeaderValue::from_static(Box::leak(n.to_string().into_boxed_str())))
            .collect()
    })
}

/// Seconds for a header: rounded up, so a client that waits that long is never early.
fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_resets_read_as_openai_writes_them() {
        assert_eq!(go_duration(20), "20ms");
        assert_eq!(go_duration(1000), "1s");
        assert_eq!(go_duration(1001), "2s");
        assert_eq!(go_duration(360_000), "6m0s");
        assert_eq!(go_duration(3_600_000), "1h0m0s");
    }

    #[test]
    fn numbers_read_the_same_from_the_table_and_beyond_it() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            999,
            SMALL_NUMBERS - 1,
            SMALL_NUMBERS,
            123_456,
            u64::MAX,
        ] {
            assert_eq!(number_value(n), n.to_string().as_str(), "{n}");
        }
    }
}
