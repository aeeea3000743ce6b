//! The units of envoyproxy/ratelimit's `rate_limit: {unit, requests_per_unit}` and of Envoy's API, as window lengths.

use crate::limiter::{Algorithm, Limit, LimitError};

/// A unit of time a rate may be given per, with envoyproxy/ratelimit's window lengths (a month is 30 days, a year
/// 365).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

const DAY_MS: u64 = 86_400_000;

/// Every unit, shortest first.
pub const UNITS: [Unit; 7] = [
    Unit::Second,
    Unit::Minute,
    Unit::Hour,
    Unit::Day,
    Unit::Week,
    Unit::Month,
    Unit::Year,
];

// === impl Unit ===

impl Unit {
    /// The unit a file names, in any case (`second`, `MINUTE`).
    pub fn parse(text: &str) -> Option<Self> {
        UNITS
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(text.trim()))
    }

    /// The name as files write it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The window's length.
    pub fn period_ms(self) -> u64 {
        match self {
            Unit::Second => 1000,
            Unit::Minute => 60_000,
            Unit::Hour => 3_600_000,
            Unit::Day => DAY_MS,
            Unit::Week => 7 * DAY_MS,
            Unit::Month => 30 * DAY_MS,
            Unit::Year => 365 * DAY_MS,
        }
    }

    /// The unit whose window is exactly `period_ms`, if any.
    pub fn of_period(period_ms: u64) -> Option<Self> {
        UNITS.into_iter().find(|unit| unit.period_ms() == period_ms)
    }

    /// envoyproxy/ratelimit's limit: `requests` per aligned window of one unit, as a fixed window named `name`.
    pub fn fixed_window(self, name: &str, requests: u64) -> Result<Limit, LimitError> {
        Limit::new(
            name,
            Algorithm::FixedWindow {
                limit: requests,
                period_ms: self.period_ms(),
            },
            1,
        )
    }
}

/// What Envoy's `current_limit` can say of a limit: requests per unit, when its window is one unit long (other
/// windows and buckets are reported with their capacity and no unit).
pub fn requests_per_unit(limit: &Limit) -> (u64, Option<Unit>) {
    let algorithm = limit.algorithm();
    (algorithm.capacity(), Unit::of_period(algorithm.window_ms()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_in_any_case_and_name_their_windows() {
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::parse("day"), Some(Unit::Day));
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::of_period(3_600_000), Some(Unit::Hour));
        assert_eq!(Unit::of_period(5_000), None);
    }
}
