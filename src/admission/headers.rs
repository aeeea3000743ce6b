//! The rate-limit response fields: `X-RateLimit-*`, and the IETF draft's `RateLimit-Policy` and `RateLimit`.

use std::sync::OnceLock;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::head_lines::HeadLines;
use crate::limiter::{Decision, Limit};

/// A rate-limit field's name as a map keys it, and as its head line starts.
pub(crate) struct Field {
    name: HeaderName,
    line_start: &'static [u8],
}

impl Field {
    const fn new(name: &'static str, line_start: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
            line_start: line_start.as_bytes(),
        }
    }
}

static X_RATELIMIT_LIMIT: Field = Field::new("x-ratelimit-limit", "x-ratelimit-limit: ");
static X_RATELIMIT_REMAINING: Field =
    Field::new("x-ratelimit-remaining", "x-ratelimit-remaining: ");
static X_RATELIMIT_RESET: Field = Field::new("x-ratelimit-reset", "x-ratelimit-reset: ");
static RATELIMIT_POLICY: Field = Field::new("ratelimit-policy", "ratelimit-policy: ");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `"per-ip";q=100;w=60, "per-key";q=50;w=180` for a route's limits; `None` without limits. A calendar window's `w`
/// is the length of the window `at_ms` falls in (when given: a request's time).
pub(crate) fn policy<'l>(
    limits: impl Iterator<Item = &'l Limit>,
    at_ms: Option<i64>,
) -> Option<HeaderValue> {
    // Shadow limits are never enforced: clients are not told about them. A limit met more than once (the rate limit
    // service's copies of one descriptor, each charged) is one policy: `RateLimit` names it once.
    let mut items: Vec<String> = Vec::new();
    let described = limits.filter(|l| !l.is_shadow()).map(|l| {
        let algorithm = l.algorithm();
        format!(
            "\"{}\";q={};w={}",
            l.name(),
            algorithm.capacity(),
            ceil_seconds(
                at_ms.map_or_else(|| algorithm.window_ms(), |at| algorithm.window_ms_at(at))
            )
        )
    });
    for item in described {
        if !items.contains(&item) {
            items.push(item);
        }
    }
    if items.is_empty() {
        return None;
    }
    HeaderValue::from_str(&items.join(", ")).ok()
}

/// What the fields say of one limit whatever the decision, rendered once when the config is loaded.
#[derive(Debug, Clone)]
pub(crate) struct Advertised {
    /// The start of its `RateLimit` line, `ratelimit: "<name>";r=`; the item alone is what follows `: `.
    rate_limit_line_start: String,
    /// Its capacity (`limit` or `burst`), what decisions report as their limit.
    capacity: u64,
    /// `capacity` as the `X-RateLimit-Limit` value: cloning it shares the bytes.
    capacity_value: HeaderValue,
    /// The `X-RateLimit-Limit` line of `capacity`, CRLF included.
    capacity_line: Box<[u8]>,
}

impl Advertised {
    pub(crate) fn new(limit: &Limit) -> Self {
        let capacity = limit.algorithm().capacity();
        Self {
            rate_limit_line_start: format!("ratelimit: \"{}\";r=", limit.name()),
            capacity,
            capacity_value: HeaderValue::from(capacity),
            capacity_line: format!("x-ratelimit-limit: {capacity}\r\n")
                .into_bytes()
                .into_boxed_slice(),
        }
    }

    /// The start of its `RateLimit` item, `"<name>";r=`.
    fn rate_limit_head(&self) -> &str {
        &self.rate_limit_line_start["ratelimit: ".len()..]
    }
}

/// Where the rate-limit fields go: an answer's map, or the head lines the server's own HTTP/1.1 writer copies
/// after the map's fields ([`HeadLines`]). One rendering for both, so that they say the same.
pub(crate) trait Fields {
    /// Makes room for `count` more fields.
    fn reserve(&mut self, count: usize);
    /// `X-RateLimit-Limit` of a decision that reports the limit's capacity, as `limit` advertises it.
    fn capacity(&mut self, limit: &Advertised);
    /// `field: value`, in place of any field of that name.
    fn value(&mut self, field: &'static Field, value: &HeaderValue);
    /// `field: n`.
    fn number(&mut self, field: &'static Field, n: u64);
    /// `RateLimit: "<name>";r=<remaining>;t=<reset>` of the limit `limit` advertises.
    fn rate_limit(&mut self, limit: &Advertised, remaining: u64, reset: u64);
}

impl Fields for HeaderMap {
    fn reserve(&mut self, count: usize) {
        HeaderMap::reserve(self, count);
    }

    fn capacity(&mut self, limit: &Advertised) {
        self.insert(&X_RATELIMIT_LIMIT.name, limit.capacity_value.clone());
    }

    fn value(&mut self, field: &'static Field, value: &HeaderValue) {
        self.insert(&field.name, value.clone());
    }

    fn number(&mut self, field: &'static Field, n: u64) {
        self.insert(&field.name, number_value(n));
    }

    fn rate_limit(&mut self, limit: &Advertised, remaining: u64, reset: u64) {
        // Exactly sized, so that it becomes the header's bytes as it is (no copy, no second allocation).
        let head = limit.rate_limit_head();
        let (mut remaining_digits, mut reset_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (remaining, reset) = (
            remaining_digits.format(remaining).as_bytes(),
            reset_digits.format(reset).as_bytes(),
        );
        let mut current = Vec::with_capacity(head.len() + remaining.len() + 3 + reset.len());
        current.extend_from_slice(head.as_bytes());
        current.extend_from_slice(remaining);
        current.extend_from_slice(b";t=");
        current.extend_from_slice(reset);
        if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(current)) {
            self.insert(&RATELIMIT, value);
        }
    }
}

/// As lines, each field's start and whatever does not change per request were written once: a line costs a copy
/// or three, not one per part.
impl Fields for HeadLines {
    fn reserve(&mut self, _count: usize) {}

    fn capacity(&mut self, limit: &Advertised) {
        self.push_raw(&limit.capacity_line);
    }

    fn value(&mut self, field: &'static Field, value: &HeaderValue) {
        self.push_line(field.line_start, value.as_bytes());
    }

    fn number(&mut self, field: &'static Field, n: u64) {
        self.push_line(field.line_start, itoa::Buffer::new().format(n).as_bytes());
    }

    fn rate_limit(&mut self, limit: &Advertised, remaining: u64, reset: u64) {
        let (mut remaining_digits, mut reset_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
        self.push_raw(limit.rate_limit_line_start.as_bytes());
        self.push_raw(remaining_digits.format(remaining).as_bytes());
        self.push_line(b";t=", reset_digits.format(reset).as_bytes());
    }
}

/// Whether `name` is one of the rate-limit fields an answer of tollgate's says (an upstream's own are replaced).
pub(crate) fn is_rate_limit_field(name: &HeaderName) -> bool {
    let name = name.as_str();
    name.starts_with("x-ratelimit-") || name.starts_with("ratelimit")
}

/// Adds the fields describing `decision`, the one that explains the request's outcome (see
/// [`Outcome::most_restrictive`](crate::limiter::Outcome::most_restrictive)), to `fields`; `limit` is how its limit
/// is advertised.
///
/// Runs on every admitted response: what does not change per request was rendered at load, small numbers come
/// from a table, and a map grows once. `HeaderValue::from(u64)` would cost two allocations a number (a buffer
/// and the header shared over it) and a `String` for `RateLimit` two more; into a map, `RateLimit` costs one, and
/// a number one only when it is too large for the table; as head lines, nothing but the lines' own bytes.
pub(crate) fn apply<F: Fields>(
    fields: &mut F,
    policy: Option<&HeaderValue>,
    decision: &Decision,
    limit: &Advertised,
) {
    let reset = ceil_seconds(decision.reset_after_ms);
    fields.reserve(5);
    if decision.limit == limit.capacity {
        fields.capacity(limit);
    } else {
        fields.number(&X_RATELIMIT_LIMIT, decision.limit);
    }
    fields.number(&X_RATELIMIT_REMAINING, decision.remaining);
    fields.number(&X_RATELIMIT_RESET, reset);
    if let Some(policy) = policy {
        fields.value(&RATELIMIT_POLICY, policy);
    }
    fields.rate_limit(limit, decision.remaining, reset);
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

    /// The head lines say what the map's fields say, in the same order: the server's own writer and hyper send
    /// the same answer.
    #[test]
    fn head_lines_and_the_map_carry_the_same_fields() {
        let algorithm = crate::limiter::Algorithm::FixedWindow {
            limit: 100,
            period_ms: 60_000,
        };
        let limit = Limit::new("per-ip", algorithm, 1).expect("valid limit");
        let advertised = Advertised::new(&limit);
        let policy = policy([&limit].into_iter(), None);
        for (limit, remaining, reset_after_ms) in [(100, 41, 2_500), (7, 0, 1), (100, 123_456, 0)] {
            let decision = Decision {
                allowed: true,
                limit,
                remaining,
                retry_after_ms: 0,
                reset_after_ms,
                delay_ms: 0,
                owed: 0,
            };
            let mut map = HeaderMap::new();
            apply(&mut map, policy.as_ref(), &decision, &advertised);
            let mut lines = HeadLines::default();
            apply(&mut lines, policy.as_ref(), &decision, &advertised);
            let from_map: String = map
                .iter()
                .map(|(name, value)| format!("{name}: {}\r\n", value.to_str().expect("text")))
                .collect();
            assert_eq!(std::str::from_utf8(lines.as_bytes()), Ok(from_map.as_str()));
            assert!(from_map.contains(&format!("x-ratelimit-remaining: {remaining}\r\n")));
        }
    }

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
