//! Calendar windows: a day, a week (from Monday), a month or a year that starts at midnight in a time zone.
//!
//! A `fixed_window` on a calendar counts from one boundary of the calendar to the next instead of from one
//! multiple of its period to the next, so its windows are as long as the calendar makes them: a month of 28 to 31
//! days, a day of 23 or 25 hours across a change of daylight saving time. Every window is a half-open interval of
//! milliseconds since the Unix epoch, `[start_ms, end_ms)`, computed from the time zone's rules alone: both stores
//! and every instance agree on it whatever their machines' zone settings.

mod zone;

use std::fmt;
use std::str::FromStr;

pub use self::zone::Zone;

/// The longest day in any zone's history is 25 hours (a day that gives an hour back); a month is at most 31 such
/// days, a year 366.
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

/// Which calendar unit a window spans (`calendar:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalendarUnit {
    /// From midnight to midnight.
    Day,
    /// From Monday's midnight to the next Monday's.
    Week,
    /// From the first of the month at midnight to the first of the next.
    Month,
    /// From the first of January at midnight to the next.
    Year,
}

/// A calendar unit in a time zone: what a calendar window is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: Zone,
}

/// One window of a calendar: `[start_ms, end_ms)` in milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalendarWindow {
    /// The first millisecond of the window: a boundary of the calendar.
    pub start_ms: i64,
    /// The first millisecond of the next window.
    pub end_ms: i64,
}

/// Why a calendar could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// Not one of the units.
    #[error("unknown calendar {0:?} (use day, week, month or year)")]
    UnknownUnit(String),
    /// Not a zone of the IANA database this build carries.
    #[error(
        "unknown time zone {0:?} (use an IANA name such as UTC, Europe/Berlin or America/New_York)"
    )]
    UnknownZone(String),
    /// Built without the `calendar` feature, which carries the time zone database.
    #[error(
        "calendar windows need tollgate built with its `calendar` feature (the time zone database)"
    )]
    NotBuilt,
}

// === impl CalendarUnit ===

impl CalendarUnit {
    /// The unit as the config file writes it.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }

    /// The longest a window of this unit can last in any zone: how long a key of it may have to be kept.
    pub fn longest_ms(self) -> u64 {
        let days = match self {
            CalendarUnit::Day => 1,
            CalendarUnit::Week => 7,
            CalendarUnit::Month => 31,
            CalendarUnit::Year => 366,
        };
        // Zones have changed their offset by more than an hour at once (a date line crossed), never by a day.
        days * DAY_MS + DAY_MS
    }

    /// How long a window of this unit lasts in UTC in the common case, for what needs one length and no time:
    /// a refusal of a cost above the capacity.
    pub fn nominal_ms(self) -> u64 {
        match self {
            CalendarUnit::Day => DAY_MS,
            CalendarUnit::Week => 7 * DAY_MS,
            CalendarUnit::Month => 30 * DAY_MS,
            CalendarUnit::Year => 365 * DAY_MS,
        }
    }
}

impl FromStr for CalendarUnit {
    type Err = CalendarError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "day" => Ok(CalendarUnit::Day),
            "week" => Ok(CalendarUnit::Week),
            "month" => Ok(CalendarUnit::Month),
            "year" => Ok(CalendarUnit::Year),
            other => Err(CalendarError::UnknownUnit(other.to_owned())),
        }
    }
}

// === impl Calendar ===

impl Calendar {
    /// `unit` in the IANA zone `timezone` (UTC when `None`).
    pub fn new(unit: CalendarUnit, timezone: Option<&str>) -> Result<Self, CalendarError> {
        let zone = Zone::named(timezone.map_or("UTC", str::trim))?;
        Ok(Self { unit, zone })
    }

    /// The calendar unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The zone's IANA name, as written.
    pub fn timezone(&self) -> &'static str {
        self.zone.name()
    }

    /// The window `now_ms` falls in.
    pub fn window_at(&self, now_ms: i64) -> CalendarWindow {
        self.zone.window_at(self.unit, now_ms)
    }

    /// `ms` as the zone's local time in RFC 3339, with its offset then (`2026-11-01T00:00:00+01:00`).
    pub fn local_time(&self, ms: i64) -> String {
        self.zone.local_time(ms)
    }

    /// The window after `window`.
    pub fn next(&self, window: CalendarWindow) -> CalendarWindow {
        self.window_at(window.end_ms)
    }
}

impl fmt::Display for Calendar {
    /// `month (Europe/Berlin)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.unit.name(), self.timezone())
    }
}

// === impl CalendarWindow ===

impl CalendarWindow {
    /// Its length in milliseconds.
    pub fn len_ms(&self) -> u64 {
        u64::try_from(self.end_ms - self.start_ms).unwrap_or(0)
    }

    /// The milliseconds from `now_ms` to its end (0 once it has ended).
    pub fn left_ms(&self, now_ms: i64) -> u64 {
        u64::try_from(self.end_ms - now_ms).unwrap_or(0)
    }
}

#[cfg(all(test, feature = "calendar"))]
mod tests;
