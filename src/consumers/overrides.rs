//! Per-consumer overrides of a plan's limits (design §10): the parameters the admin API replaces for one consumer,
//! checked against the limit's algorithm.

use super::directory::LimitOverride;
use crate::config::{parse_duration, parse_rate};
use crate::limiter::{Algorithm, Limit};

/// `base` with the parameters `change` names replaced: `limit` and `period` for window algorithms, `rate` and
/// `burst` for the others. A parameter the algorithm does not take, or a value that does not parse or is not
/// positive, is refused with a message naming it.
pub fn overridden(base: &Limit, change: &LimitOverride) -> Result<Limit, String> {
    let takes_window = matches!(
        base.algorithm(),
        Algorithm::FixedWindow { .. }
            | Algorithm::SlidingWindow { .. }
            | Algorithm::SlidingLog { .. }
    );
    let foreign = if takes_window {
        [
            ("rate", change.rate.is_some()),
            ("burst", change.burst.is_some()),
        ]
    } else {
        [
            ("limit", change.limit.is_some()),
            ("period", change.period.is_some()),
        ]
    };
    if let Some((name, _)) = foreign.iter().find(|(_, given)| *given) {
        return Err(format!(
            "{name} is not a parameter of {} (limit {:?})",
            base.algorithm().name(),
            base.name()
        ));
    }
    let positive = |name: &str, value: Option<u64>| match value {
        Some(0) => Err(format!("{name} must be greater than 0")),
        other => Ok(other),
    };
    let count = positive("limit", change.limit)?;
    let burst = positive("burst", change.burst)?;
    let period_ms = match &change.period {
        Some(text) => {
            let period = parse_duration(text).map_err(|e| e.to_string())?;
            let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
            Some(positive("period", Some(ms))?.unwrap_or_default())
        }
        None => None,
    };
    let rate = match &change.rate {
        Some(text) => Some(parse_rate(text).map_err(|e| e.to_string())?),
        None => None,
    };
    let algorithm = match *base.algorithm() {
        Algorithm::FixedWindow {
            limit,
            period_ms: p,
        } => Algorithm::FixedWindow {
            limit: count.unwrap_or(limit),
            period_ms: period_ms.unwrap_or(p),
        },
        Algorithm::SlidingWindow {
            limit,
            period_ms: p,
        } => Algorithm::SlidingWindow {
            limit: count.unwrap_or(limit),
            period_ms: period_ms.unwrap_or(p),
        },
        Algorithm::SlidingLog {
            limit,
            period_ms: p,
        } => Algorithm::SlidingLog {
            limit: count.unwrap_or(limit),
            period_ms: period_ms.unwrap_or(p),
        },
        Algorithm::TokenBucket { rate: r, burst: b } => Algorithm::TokenBucket {
            rate: rate.unwrap_or(r),
            burst: burst.unwrap_or(b),
        },
        Algorithm::Gcra { rate: r, burst: b } => Algorithm::Gcra {
            rate: rate.unwrap_or(r),
            burst: burst.unwrap_or(b),
        },
        Algorithm::LeakyBucket {
            rate: r,
            burst: b,
            mode,
        } => Algorithm::LeakyBucket {
            rate: rate.unwrap_or(r),
            burst: burst.unwrap_or(b),
            mode,
        },
    };
    Limit::new(base.name(), algorithm, base.cost())
        .map(|limit| limit.with_shadow(base.is_shadow()))
        .map_err(|e| format!("limit {:?}: {e}", base.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "burst must be greater than 0",
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
}
