//! Durations (`250ms`, `1s`, `1m30s`) and rates (`10/s`, `30/1m`) as the config file (and code building limits)
//! writes them.

use std::time::Duration;

use super::{LimitError, Rate};

/// Units from the largest down, so that combined durations are written largest first (`1h30m`, not `30m1h`).
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Why a duration or a rate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// Not a duration at all.
    #[error("invalid duration {0:?} (use 250ms, 1s, 1m, 1h, 1d)")]
    Duration(String),
    /// Not a rate at all.
    #[error("invalid rate {0:?} (use N/duration, e.g. 10/s, 30/1m)")]
    Rate(String),
    /// A well-formed rate with a zero count or period.
    #[error("invalid rate {text:?}: {source}")]
    ZeroRate {
        /// The rate as written.
        text: String,
        /// What is zero.
        source: LimitError,
    },
    /// More milliseconds than fit the limiter's integers.
    #[error("duration {0:?} is too large")]
    TooLarge(String),
}

/// Parses a duration: whole numbers with units `ms`, `s`, `m`, `h`, `d`, largest first (`250ms`, `1m30s`).
///
/// Zero is accepted here; whether a zero duration makes sense is for the field to say.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    parse_duration_ms(text).map(Duration::from_millis)
}

/// Like [`parse_duration`], in milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, UnitError> {
    let invalid = || UnitError::Duration(text.to_owned());
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    // Index into UNITS below which the next component's unit must lie.
    let mut smallest_allowed = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let letters = rest[digits..]
            .find(|c: char| !c.is_ascii_alphabetic())
            .map_or(rest.len(), |n| digits + n);
        let (number, unit) = (&rest[..digits], &rest[digits..letters]);
        let unit_index = UNITS
            .iter()
            .position(|(name, _)| *name == unit)
            .filter(|&i| i >= smallest_allowed && !number.is_empty())
            .ok_or_else(invalid)?;
        let count: u64 = number.parse().map_err(|_| invalid())?;
        total = count
            .checked_mul(UNITS[unit_index].1)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| UnitError::TooLarge(text.to_owned()))?;
        smallest_allowed = unit_index + 1;
        rest = &rest[letters..];
    }
    Ok(total)
}

/// Parses a rate `N/duration`, where a duration of one unit may omit its count (`10/s` is `10/1s`).
pub fn parse_rate(text: &str) -> Result<Rate, UnitError> {
    let invalid = || UnitError::Rate(text.to_owned());
    let (count, period) = text.trim().split_once('/').ok_or_else(invalid)?;
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let count: u64 = count.parse().map_err(|_| invalid())?;
    let period_ms = if period.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration_ms(period)
    } else {
        parse_duration_ms(&format!("1{period}"))
    }
    .map_err(|_| invalid())?;
    Rate::new(count, period_ms).map_err(|source| UnitError::ZeroRate {
        text: text.to_owned(),
        source,
    })
}

#[cfg(test)]
// A failed unwrap is a failed test, with the value in the message.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1s"), Ok(1_000));
        assert_eq!(parse_duration_ms("1m"), Ok(60_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("1d"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("1m30s"), Ok(90_000));
        assert_eq!(parse_duration_ms("1h5m250ms"), Ok(3_900_250));
        assert_eq!(parse_duration("25ms"), Ok(Duration::from_millis(25)));
        // Zero parses; fields that need a positive duration say so themselves.
        assert_eq!(parse_duration_ms("0s"), Ok(0));
    }

    #[test]
    fn malformed_durations_use_the_contract_message() {
        for text in [
            "1 minute", "1.5s", "10", "s", "", "-1s", "1x", "30s1m", "1s1s", "1ms5s", "1m 30s",
        ] {
            let err = parse_duration_ms(text).unwrap_err();
            assert_eq!(err, UnitError::Duration(text.to_owned()), "{text}");
        }
        assert_eq!(
            parse_duration_ms("1 minute").unwrap_err().to_string(),
            r#"invalid duration "1 minute" (use 250ms, 1s, 1m, 1h, 1d)"#
        );
    }

    #[test]
    fn huge_durations_are_refused_not_wrapped() {
        assert_eq!(
            parse_duration_ms("999999999999999999d"),
            Err(UnitError::TooLarge("999999999999999999d".to_owned()))
        );
        assert!(parse_duration_ms("99999999999999999999999s").is_err());
    }

    #[test]
    fn rates_with_and_without_period_count() {
        let rate = |text| parse_rate(text).map(|r| (r.count(), r.period_ms()));
        assert_eq!(rate("10/s"), Ok((10, 1_000)));
        assert_eq!(rate("30/1m"), Ok((30, 60_000)));
        assert_eq!(rate("100/5m"), Ok((100, 300_000)));
        assert_eq!(rate("5/250ms"), Ok((5, 250)));
        assert_eq!(rate("1000/1h"), Ok((1000, 3_600_000)));
        assert_eq!(rate("1/ms"), Ok((1, 1)));
    }

    #[test]
    fn malformed_or_zero_rates_are_refused() {
        for text in [
            "10",
            "10/",
            "/s",
            "ten/s",
            "1.5/s",
            "10/1.5s",
            "10/minute",
            "-1/s",
        ] {
            assert_eq!(
                parse_rate(text),
                Err(UnitError::Rate(text.to_owned())),
                "{text}"
            );
        }
        assert_eq!(
            parse_rate("10/minute").unwrap_err().to_string(),
            r#"invalid rate "10/minute" (use N/duration, e.g. 10/s, 30/1m)"#
        );
        assert_eq!(
            parse_rate("10/0s").unwrap_err().to_string(),
            r#"invalid rate "10/0s": rate period must be greater than 0"#
        );
        assert_eq!(
            parse_rate("0/s").unwrap_err().to_string(),
            r#"invalid rate "0/s": rate count must be greater than 0"#
        );
    }
}
