//! Per-consumer overrides of a plan's limits (see docs/configuration.md, "Consumers and plans"): the parameters the admin API replaces for one consumer,
//! checked against the limit's algorithm.

use super::directory::LimitOverride;
use crate::limiter::{replaced, Algorithm, Limit, Replaced};

/// `base` with the parameters `change` names replaced: `limit` and `period` for window algorithms, `max` for
/// `concurrency`, `rate` and `burst` for the others. A parameter the algorithm does not take is refused with a message naming it; the values
/// are checked as the same values written in the config file would be, with its bounds and its messages.
pub fn overridden(base: &Limit, change: &LimitOverride) -> Result<Limit, String> {
    let given = [
        ("limit", change.limit.is_some()),
        ("period", change.period.is_some()),
        ("rate", change.rate.is_some()),
        ("burst", change.burst.is_some()),
        ("max", change.max.is_some()),
    ];
    let takes: &[&str] = match base.algorithm() {
        Algorithm::FixedWindow { .. }
        | Algorithm::SlidingWindow { .. }
        | Algorithm::SlidingLog { .. } => &["limit", "period"],
        // A calendar window's length is its calendar's: an override changes how much, never when.
        Algorithm::CalendarWindow { .. } => &["limit"],
        Algorithm::Concurrency { .. } => &["max"],
        _ => &["rate", "burst"],
    };
    let foreign = given
        .iter()
        .find(|(name, given)| *given && !takes.contains(name));
    if let Some((name, _)) = foreign {
        return Err(format!(
            "{name} is not a parameter of {} (limit {:?})",
            base.algorithm().name(),
            base.name()
        ));
    }
    let change = Replaced {
        limit: change.limit,
        period: change.period.as_deref(),
        rate: change.rate.as_deref(),
        burst: change.burst,
        max: change.max,
    };
    replaced(base, change)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::limiter::parse_rate;

    fn gcra() -> Limit {
        let rate = parse_rate("100/1h").expect("rate");
        Limit::new("hourly", Algorithm::Gcra { rate, burst: 20 }, 1).expect("limit")
    }

    #[test]
    fn named_parameters_are_replaced_and_others_kept() {
        let change = LimitOverride {
            rate: Some("20000/1h".to_owned()),
            burst: Some(500),
            ..Default::default()
        };
        let limit = overridden(&gcra(), &change).expect("valid");
        assert_eq!(
            *limit.algorithm(),
            Algorithm::Gcra {
                rate: parse_rate("20000/1h").expect("rate"),
                burst: 500
            }
        );
        assert_eq!(limit.name(), "hourly");
        let only_burst = LimitOverride {
            burst: Some(5),
            ..Default::default()
        };
        let limit = overridden(&gcra(), &only_burst).expect("valid");
        assert_eq!(
            *limit.algorithm(),
            Algorithm::Gcra {
                rate: parse_rate("100/1h").expect("rate"),
                burst: 5
            }
        );
    }

    #[test]
    fn an_empty_override_gives_back_the_limit_as_it_was_for_every_algorithm() {
        use crate::limiter::{LeakyMode, Rate};
        let rate = Rate::new(7, 90_061_001).expect("rate");
        let algorithms = [
            Algorithm::FixedWindow {
                limit: 9,
                period_ms: 90_061_001,
            },
            Algorithm::SlidingWindow {
                limit: 9,
                period_ms: 1_500,
            },
            Algorithm::SlidingLog {
                limit: 9,
                period_ms: 86_400_000,
            },
            Algorithm::TokenBucket { rate, burst: 9 },
            Algorithm::Gcra { rate, burst: 9 },
            Algorithm::LeakyBucket {
                rate,
                burst: 9,
                mode: LeakyMode::Delay {
                    max_delay_ms: 2_500,
                },
            },
        ];
        for algorithm in algorithms {
            let base = Limit::new("l", algorithm, 2)
                .expect("limit")
                .with_shadow(true);
            let same = overridden(&base, &LimitOverride::default()).expect("valid");
            assert_eq!(same, base);
        }
    }

    #[test]
    fn foreign_bad_and_zero_parameters_are_refused_by_name() {
        let cases = [
            (
                LimitOverride {
                    limit: Some(5),
                    ..Default::default()
                },
                "limit is not a parameter of gcra",
            ),
            (
                LimitOverride {
                    rate: Some("fast".to_owned()),
                    ..Default::default()
                },
                "invalid rate",
            ),
            (
                LimitOverride {
                    burst: Some(0),
                    ..Default::default()
                },
                "hourly.burst: must be greater than 0",
            ),
        ];
        for (change, message) in cases {
            let error = overridden(&gcra(), &change).expect_err("refused");
            assert!(error.contains(message), "{error}");
        }
        let window = Limit::new(
            "daily",
            Algorithm::FixedWindow {
                limit: 10,
                period_ms: 86_400_000,
            },
            1,
        )
        .expect("limit");
        let error = overridden(
            &window,
            &LimitOverride {
                burst: Some(3),
                ..Default::default()
            },
        )
        .expect_err("refused");
        assert!(
            error.contains("burst is not a parameter of fixed_window"),
            "{error}"
        );
    }

    #[cfg(feature = "calendar")]
    #[test]
    fn an_override_of_a_calendar_window_s_limit_keeps_its_calendar() {
        use crate::limiter::{Calendar, CalendarUnit};
        let calendar = Calendar::new(CalendarUnit::Month, Some("Europe/Berlin")).expect("zone");
        let monthly = Algorithm::CalendarWindow {
            limit: 10_000,
            calendar,
        };
        let base = Limit::new("monthly", monthly, 1).expect("limit");
        let lifted = LimitOverride {
            limit: Some(50_000),
            ..Default::default()
        };
        let expected = Algorithm::CalendarWindow {
            limit: 50_000,
            calendar,
        };
        let replaced = overridden(&base, &lifted).expect("valid");
        assert_eq!(replaced.algorithm(), &expected);
        assert_eq!(
            overridden(&base, &LimitOverride::default()),
            Ok(base.clone())
        );
        let period = LimitOverride {
            period: Some("30d".to_owned()),
            ..Default::default()
        };
        let error = overridden(&base, &period).expect_err("refused");
        assert!(error.contains("period is not a parameter"), "{error}");
    }
}
