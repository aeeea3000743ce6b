//! Validated limit definitions: an algorithm with its parameters, a cost and a name.

use std::fmt;

use super::algorithms::gcra::{Ticks, EPOCH_MS};
pub use super::algorithms::leaky_bucket::LeakyMode;
use super::calendar::Calendar;

/// The largest value any algorithm's scaled integer arithmetic may reach (2^52).
///
/// The Redis scripts compute with Lua numbers (IEEE doubles), which are exact integers, and whose floor division is
/// exact, below 2^53. Keeping every product below 2^52 makes the Lua scripts and the Rust memory store compute the
/// same integers, so both stores make identical decisions.
pub const MAX_SCALED: u64 = 1 << 52;

/// The most entries a `sliding_log` key may hold (its limit): each admitted unit of cost is one sorted-set member
/// in Redis and one timestamp in the memory store, written and trimmed inside the call that admits it. Beyond,
/// one call could keep Redis busy for seconds; `sliding_window` holds any limit in constant space.
pub const MAX_LOG_ENTRIES: u64 = 100_000;

/// When a request refused for want of a slot may ask again (`Retry-After: 1`), in milliseconds.
pub const SLOT_RETRY_MS: u64 = 1_000;

/// The shortest `lease` of a `concurrency` limit: renewed every third of it, a lease must outlast a renewal call
/// that Redis answers late.
pub const MIN_LEASE_MS: u64 = 300;

/// `count` events per `period_ms` milliseconds; both are positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    count: u64,
    period_ms: u64,
}

/// Which algorithm a limit uses, with its validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Counter per aligned window.
    FixedWindow {
        /// Requests per window.
        limit: u64,
        /// Window length in milliseconds.
        period_ms: u64,
    },
    /// Counter per calendar window (`fixed_window` with `calendar:`): from one boundary of the calendar in its
    /// time zone to the next, windows of unequal lengths.
    CalendarWindow {
        /// Requests per window.
        limit: u64,
        /// The unit and the time zone the windows follow.
        calendar: Calendar,
    },
    /// Counter over the current and previous aligned window, weighted by overlap (Cloudflare's approximation).
    SlidingWindow {
        /// Requests per period.
        limit: u64,
        /// Window length in milliseconds.
        period_ms: u64,
    },
    /// Exact log of admitted requests: at most `limit` in any interval of `period_ms`.
    SlidingLog {
        /// Requests per period.
        limit: u64,
        /// Interval length in milliseconds.
        period_ms: u64,
    },
    /// Bucket of `burst` tokens refilled continuously at `rate`.
    TokenBucket {
        /// Refill rate.
        rate: Rate,
        /// Bucket capacity.
        burst: u64,
    },
    /// Generic cell rate algorithm (redis-cell `CL.THROTTLE` semantics).
    Gcra {
        /// Sustained rate.
        rate: Rate,
        /// Requests a fresh key may make at once.
        burst: u64,
    },
    /// Meter of capacity `burst` leaking at `rate`, rejecting or delaying what overflows.
    LeakyBucket {
        /// Leak rate.
        rate: Rate,
        /// Meter capacity.
        burst: u64,
        /// Reject, or delay up to a bound.
        mode: LeakyMode,
    },
    /// At most `max` requests of one key in flight at once, across every instance: each holds a slot (a lease of
    /// `lease_ms` in Redis, renewed while the request lives) until its answer ends.
    Concurrency {
        /// Requests in flight at once.
        max: u64,
        /// How long a slot outlives an instance that stopped renewing it (crashed, cut off), in milliseconds.
        lease_ms: u64,
        /// Whether a request finding the key full waits for a slot, and how long.
        queue: Option<SlotQueue>,
    },
}

/// How requests wait for a slot of a full `concurrency` key (`queue:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotQueue {
    /// The longest a request waits for a slot before it is refused, in milliseconds.
    pub max_wait_ms: u64,
    /// The most requests of the limit waiting on one instance, whatever their key; more are refused at once.
    pub max_waiting: u64,
}

/// One named limit of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    name: String,
    algorithm: Algorithm,
    cost: u64,
    shadow: bool,
}

/// Why a limit definition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A parameter that must be positive was zero.
    #[error("{0} must be greater than 0")]
    Zero(&'static str),
    /// A request would cost more than the limit can ever hold.
    #[error(
        "cost {cost} is larger than the capacity {capacity}: no request could ever be admitted"
    )]
    CostAboveCapacity {
        /// The configured cost.
        cost: u64,
        /// The limit's capacity.
        capacity: u64,
    },
    /// A `sliding_log` limit above [`MAX_LOG_ENTRIES`].
    #[error(
        "limit {limit} is too large for sliding_log, which keeps one entry per admitted request (at most \
         {max}); use sliding_window, which holds any limit in constant space"
    )]
    LogTooLong {
        /// The configured limit.
        limit: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A `concurrency` limit with a cost other than 1.
    #[error(
        "cost {0} for a concurrency limit: a request in flight holds one slot (raise max instead)"
    )]
    SlotCost(u64),
    /// A `concurrency` lease too short to be renewed in time.
    #[error(
        "lease {lease} is too short: it is renewed every third of it, and must be at least {min}"
    )]
    LeaseTooShort {
        /// The configured lease.
        lease: String,
        /// The shortest allowed.
        min: String,
    },
    /// The parameters are too large for exact arithmetic.
    #[error("{what} is too large: {value} exceeds {max} ({hint})")]
    TooLarge {
        /// Which product overflowed.
        what: &'static str,
        /// What to change.
        hint: &'static str,
        /// Its value.
        value: u128,
        /// The largest allowed value.
        max: u64,
    },
}

// === impl Rate ===

impl Rate {
    /// `count` events per `period_ms` milliseconds.
    pub fn new(count: u64, period_ms: u64) -> Result<Self, LimitError> {
        if count == 0 {
            return Err(LimitError::Zero("rate count"));
        }
        if period_ms == 0 {
            return Err(LimitError::Zero("rate period"));
        }
        Ok(Self { count, period_ms })
    }

    /// Events per period.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Period in milliseconds.
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }
}

impl fmt::Display for Rate {
    /// As the config file writes it: `5/s`, `30/1m`, `100/5m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period = format_duration_ms(self.period_ms);
        let period = match period.as_str() {
            "1s" | "1m" | "1h" | "1d" => &period[1..],
            _ => &period,
        };
        write!(f, "{}/{period}", self.count)
    }
}

// === impl Algorithm ===

impl Algorithm {
    /// The algorithm's name as written in the config file.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } | Algorithm::CalendarWindow { .. } => "fixed_window",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::Concurrency { .. } => "concurrency",
        }
    }

    /// The capacity: requests per window, or the bucket size.
    pub fn capacity(&self) -> u64 {
        match *self {
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::CalendarWindow { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. } => limit,
            Algorithm::TokenBucket { burst, .. }
            | Algorithm::Gcra { burst, .. }
            | Algorithm::LeakyBucket { burst, .. } => burst,
            Algorithm::Concurrency { max, .. } => max,
        }
    }

    /// Whether a request holds what it takes only until its answer ends (`concurrency`).
    pub fn holds_slots(&self) -> bool {
        matches!(self, Algorithm::Concurrency { .. })
    }

    /// How a request finding a `concurrency` key full waits for a slot, when it does (`queue:`).
    pub fn slot_queue(&self) -> Option<&SlotQueue> {
        match self {
            Algorithm::Concurrency { queue, .. } => queue.as_ref(),
            _ => None,
        }
    }

    /// The calendar of a calendar window.
    pub fn calendar(&self) -> Option<&Calendar> {
        match self {
            Algorithm::CalendarWindow { calendar, .. } => Some(calendar),
            _ => None,
        }
    }

    /// The policy window at `now_ms`: for a calendar window the length of the window `now_ms` falls in (a month of
    /// 28 to 31 days), for any other algorithm [`window_ms`](Self::window_ms).
    pub fn window_ms_at(&self, now_ms: i64) -> u64 {
        match self {
            Algorithm::CalendarWindow { calendar, .. } => calendar.window_at(now_ms).len_ms(),
            _ => self.window_ms(),
        }
    }

    /// The policy window in milliseconds: the period for window algorithms, the time to refill an empty bucket
    /// for bucket algorithms (the `w` of the `RateLimit-Policy` header). A calendar window's length depends on
    /// when it is asked ([`window_ms_at`](Self::window_ms_at)); here its unit's common length in UTC.
    pub fn window_ms(&self) -> u64 {
        match *self {
            Algorithm::CalendarWindow { calendar, .. } => calendar.unit().nominal_ms(),
            Algorithm::FixedWindow { period_ms, .. }
            | Algorithm::SlidingWindow { period_ms, .. }
            | Algorithm::SlidingLog { period_ms, .. } => period_ms,
            Algorithm::TokenBucket { rate, burst }
            | Algorithm::Gcra { rate, burst }
            | Algorithm::LeakyBucket { rate, burst, .. } => {
                (u128::from(burst) * u128::from(rate.period_ms)).div_ceil(u128::from(rate.count))
                    as u64
            }
            // A full key is asked again after a second: slots come back when answers end, not on a clock.
            Algorithm::Concurrency { .. } => SLOT_RETRY_MS,
        }
    }

    /// The longest time a key of this algorithm must be kept once traffic stops.
    pub fn max_ttl_ms(&self) -> u64 {
        match *self {
            Algorithm::FixedWindow { period_ms, .. } | Algorithm::SlidingLog { period_ms, .. } => {
                period_ms
            }
            Algorithm::CalendarWindow { calendar, .. } => calendar.unit().longest_ms(),
            Algorithm::SlidingWindow { period_ms, .. } => 2 * period_ms,
            Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } => self.window_ms(),
            Algorithm::LeakyBucket { mode, .. } => {
                let held = mode.max_delay_ms();
                self.window_ms() + held
            }
            Algorithm::Concurrency { lease_ms, .. } => lease_ms,
        }
    }

    fn validate(&self) -> Result<(), LimitError> {
        let capacity = self.capacity();
        if capacity == 0 {
            return Err(LimitError::Zero(match self {
                Algorithm::FixedWindow { .. }
                | Algorithm::CalendarWindow { .. }
                | Algorithm::SlidingWindow { .. }
                | Algorithm::SlidingLog { .. } => "limit",
                Algorithm::Concurrency { .. } => "max",
                _ => "burst",
            }));
        }
        if let Algorithm::Concurrency { lease_ms, .. } = *self {
            if lease_ms < MIN_LEASE_MS {
                return Err(LimitError::LeaseTooShort {
                    lease: format_duration_ms(lease_ms),
                    min: format_duration_ms(MIN_LEASE_MS),
                });
            }
        }
        if let Algorithm::SlidingLog { limit, .. } = *self {
            if limit > MAX_LOG_ENTRIES {
                return Err(LimitError::LogTooLong {
                    limit,
                    max: MAX_LOG_ENTRIES,
                });
            }
        }
        let parameters = self
            .parameters()
            .into_iter()
            .map(|(what, value)| (what, u128::from(value), "lower it"));
        for (what, value, hint) in parameters.chain(self.scaled_products()) {
            if value > u128::from(MAX_SCALED) {
                return Err(LimitError::TooLarge {
                    what,
                    hint,
                    value,
                    max: MAX_SCALED,
                });
            }
        }
        Ok(())
    }

    /// Each parameter with its name: every one must be exact as a Lua number (a double) and in Redis's expiries,
    /// or the stores would disagree (a fixed window's limit of 2^63 denied everything in Redis and admitted all in
    /// memory; a period of 2^63 ms expired the key at once).
    fn parameters(&self) -> Vec<(&'static str, u64)> {
        match *self {
            Algorithm::FixedWindow { limit, period_ms }
            | Algorithm::SlidingWindow { limit, period_ms }
            | Algorithm::SlidingLog { limit, period_ms } => {
                vec![("limit", limit), ("period (in ms)", period_ms)]
            }
            Algorithm::CalendarWindow { limit, .. } => vec![("limit", limit)],
            Algorithm::TokenBucket { rate, burst } | Algorithm::Gcra { rate, burst } => vec![
                ("burst", burst),
                ("rate count", rate.count),
                ("rate period (in ms)", rate.period_ms),
            ],
            Algorithm::LeakyBucket { rate, burst, mode } => {
                let max_delay_ms = mode.max_delay_ms();
                vec![
                    ("burst", burst),
                    ("rate count", rate.count),
                    ("rate period (in ms)", rate.period_ms),
                    ("max_delay (in ms)", max_delay_ms),
                ]
            }
            Algorithm::Concurrency {
                max,
                lease_ms,
                queue,
            } => {
                let (max_wait_ms, max_waiting) =
                    queue.map_or((0, 0), |q| (q.max_wait_ms, q.max_waiting));
                vec![
                    ("max", max),
                    ("lease (in ms)", lease_ms),
                    ("queue.max_wait (in ms)", max_wait_ms),
                    ("queue.max_waiting", max_waiting),
                ]
            }
        }
    }

    /// The largest integers each algorithm's arithmetic reaches, with what to call them and what to change in
    /// an error.
    fn scaled_products(&self) -> Vec<(&'static str, u128, &'static str)> {
        const SHORTER: &str = "lower it or shorten the period";
        let wide = |a: u64, b: u64| u128::from(a) * u128::from(b);
        match *self {
            Algorithm::FixedWindow { .. }
            | Algorithm::CalendarWindow { .. }
            | Algorithm::Concurrency { .. } => Vec::new(),
            Algorithm::SlidingWindow { limit, period_ms }
            | Algorithm::SlidingLog { limit, period_ms } => {
                vec![("limit × period (in ms)", wide(limit, period_ms), SHORTER)]
            }
            Algorithm::TokenBucket { rate, burst } => vec![
                (
                    "burst × rate period (in ms)",
                    wide(burst, rate.period_ms),
                    SHORTER,
                ),
                (
                    "rate count × period (in ms)",
                    wide(rate.count, rate.period_ms),
                    SHORTER,
                ),
            ],
            Algorithm::Gcra { rate, burst } => {
                let ticks = Ticks::of(rate);
                // Ticks since the GCRA epoch must stay exact until 2100.
                let until_2100 = (4_102_444_800_000 - EPOCH_MS) as u64;
                vec![
                    (
                        "burst × emission interval (in ticks)",
                        wide(burst, ticks.interval),
                        SHORTER,
                    ),
                    (
                        "rate precision (ticks per ms until 2100)",
                        wide(ticks.ticks_per_ms, until_2100),
                        "use a count that divides the period in ms more evenly, e.g. 1000/1h",
                    ),
                ]
            }
            Algorithm::LeakyBucket { rate, burst, mode } => {
                let held = wide(mode.max_delay_ms(), rate.count);
                vec![(
                    "burst × rate period + max_delay × rate count",
                    wide(burst, rate.period_ms) + held,
                    "lower the burst or max_delay",
                )]
            }
        }
    }
}

// === impl Limit ===

impl Limit {
    /// A validated limit; `cost` is what one request takes from it.
    pub fn new(
        name: impl Into<String>,
        algorithm: Algorithm,
        cost: u64,
    ) -> Result<Self, LimitError> {
        algorithm.validate()?;
        if cost == 0 {
            return Err(LimitError::Zero("cost"));
        }
        if algorithm.holds_slots() && cost != 1 {
            return Err(LimitError::SlotCost(cost));
        }
        let capacity = algorithm.capacity();
        if cost > capacity {
            return Err(LimitError::CostAboveCapacity { cost, capacity });
        }
        Ok(Self {
            name: name.into(),
            algorithm,
            cost,
            shadow: false,
        })
    }

    /// The same limit under another name (a plan's limit is advertised as `<plan>.<limit>`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The same limit with `cost` as what this one request takes: a reservation whose amount is known per
    /// request (the tokens a request may spend). Any amount is accepted: 0 admits while the key is not over its
    /// limit (or in debt) and consumes nothing; more than the capacity is never admitted (its `retry_after` is
    /// the limit's whole window: waiting makes it fit no better).
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The same `concurrency` limit with `max` slots (the running config's, for a request that waited through a
    /// reload); any other limit as it is. `max` is a validated config's, never 0.
    pub fn with_max(mut self, max: u64) -> Self {
        if let Algorithm::Concurrency { max: slots, .. } = &mut self.algorithm {
            *slots = max;
        }
        self
    }

    /// The same limit in shadow mode (`shadow: true`): decided, logged and counted, never enforced. A request
    /// it denies is still admitted, and consumes from it nothing; a request it admits consumes as usual.
    pub fn with_shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Whether the limit is only observed, never enforced.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The limit's name, unique within its route.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// What one request takes from the limit.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

/// Formats milliseconds the way the config file writes durations, for messages about limits (`250ms`, `2s`, `1m`, `1h`, `1d`).
pub fn format_duration_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (size, unit) in UNITS {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_cost_above_capacity() {
        let alg = Algorithm::SlidingLog {
            limit: 3,
            period_ms: 1000,
        };
        assert_eq!(
            Limit::new("l", alg, 4),
            Err(LimitError::CostAboveCapacity {
                cost: 4,
                capacity: 3
            })
        );
    }

    #[test]
    fn refuses_products_beyond_exact_arithmetic() {
        let alg = Algorithm::SlidingWindow {
            limit: 1 << 30,
            period_ms: 1 << 30,
        };
        assert!(matches!(
            Limit::new("l", alg, 1),
            Err(LimitError::TooLarge { .. })
        ));
    }

    #[test]
    fn every_parameter_is_bounded_where_both_stores_carry_it_exactly() {
        let huge = MAX_SCALED + 1;
        let rate = |count, period_ms| Rate::new(count, period_ms).expect("positive");
        for algorithm in [
            Algorithm::FixedWindow {
                limit: huge,
                period_ms: 1_000,
            },
            Algorithm::FixedWindow {
                limit: 10,
                period_ms: huge,
            },
            Algorithm::FixedWindow {
                limit: u64::MAX,
                period_ms: u64::MAX,
            },
            Algorithm::Gcra {
                rate: rate(1, huge),
                burst: 1,
            },
            Algorithm::TokenBucket {
                rate: rate(huge, 1_000),
                burst: 1,
            },
            Algorithm::LeakyBucket {
                rate: rate(1, 1_000),
                burst: 1,
                mode: LeakyMode::Delay { max_delay_ms: huge },
            },
        ] {
            assert!(
                matches!(
                    Limit::new("l", algorithm, 1),
                    Err(LimitError::TooLarge { .. })
                ),
                "{algorithm:?}"
            );
        }
        let at_the_bound = Algorithm::FixedWindow {
            limit: MAX_SCALED,
            period_ms: MAX_SCALED,
        };
        assert!(Limit::new("l", at_the_bound, MAX_SCALED).is_ok());
    }

    #[test]
    fn a_sliding_log_holds_at_most_its_bound_of_entries() {
        let log = |limit| Algorithm::SlidingLog {
            limit,
            period_ms: 60_000,
        };
        assert!(Limit::new("l", log(MAX_LOG_ENTRIES), 1).is_ok());
        let error = Limit::new("l", log(MAX_LOG_ENTRIES + 1), 1).expect_err("too long");
        assert!(error.to_string().contains("use sliding_window"), "{error}");
    }

    #[test]
    fn bucket_window_is_time_to_refill_from_empty() {
        let alg = Algorithm::TokenBucket {
            rate: Rate::new(5, 1000).unwrap(),
            burst: 10,
        };
        assert_eq!(alg.window_ms(), 2000);
    }
}
