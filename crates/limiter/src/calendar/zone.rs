//! Time zones by IANA name, from the database compiled into the build (jiff's bundled copy), never the machine's.

#[cfg(not(feature = "calendar"))]
pub use self::absent::Zone;
#[cfg(feature = "calendar")]
pub use self::bundled::Zone;

#[cfg(feature = "calendar")]
mod bundled {
    use std::fmt;
    use std::sync::{Mutex, PoisonError};

    use jiff::civil::Date;
    use jiff::tz::TimeZone;
    use jiff::{Span, Timestamp};

    use super::super::{CalendarError, CalendarUnit, CalendarWindow};

    /// A time zone of the bundled database: a name and its rules, shared by every limit that names it.
    #[derive(Clone, Copy)]
    pub struct Zone {
        name: &'static str,
        tz: &'static TimeZone,
    }

    /// The zones named so far. Limits are `Copy` values checked on the request path, so a zone is a pair of
    /// references; each zone is made once and kept for the life of the process, at most one per zone of the
    /// database (about 600), whatever the reloads.
    static ZONES: Mutex<Vec<Zone>> = Mutex::new(Vec::new());

    impl Zone {
        /// The zone called `name` in the database.
        pub(in crate::calendar) fn named(name: &str) -> Result<Self, CalendarError> {
            let mut zones = ZONES.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(zone) = zones.iter().find(|zone| zone.name == name) {
                return Ok(*zone);
            }
            let tz = jiff::tz::db()
                .get(name)
                .map_err(|_| CalendarError::UnknownZone(name.to_owned()))?;
            let zone = Zone {
                name: Box::leak(name.to_owned().into_boxed_str()),
                tz: Box::leak(Box::new(tz)),
            };
            zones.push(zone);
            Ok(zone)
        }

        pub(in crate::calendar) fn name(&self) -> &'static str {
            self.name
        }

        /// The window of `unit` that `now_ms` falls in. Beyond the years jiff represents (±9999), where no clock
        /// of ours will be, the unit's nominal length aligned on the epoch.
        pub(in crate::calendar) fn window_at(
            &self,
            unit: CalendarUnit,
            now_ms: i64,
        ) -> CalendarWindow {
            self.bounds(unit, now_ms).unwrap_or_else(|| {
                let nominal = unit.nominal_ms() as i64;
                let start_ms = now_ms - now_ms.rem_euclid(nominal);
                CalendarWindow {
                    start_ms,
                    end_ms: start_ms + nominal,
                }
            })
        }

        fn bounds(&self, unit: CalendarUnit, now_ms: i64) -> Option<CalendarWindow> {
            let now = Timestamp::from_millisecond(now_ms).ok()?;
            let today = now.to_zoned_datetime(self.tz.clone()).date();
            let first = match unit {
                CalendarUnit::Day => today,
                CalendarUnit::Week => {
                    let since_monday = today.weekday().to_monday_zero_offset();
                    today.checked_sub(Span::new().days(since_monday)).ok()?
                }
                CalendarUnit::Month => today.first_of_month(),
                CalendarUnit::Year => today.first_of_year(),
            };
            let next = match unit {
                CalendarUnit::Day => first.tomorrow().ok()?,
                CalendarUnit::Week => first.checked_add(Span::new().days(7)).ok()?,
                CalendarUnit::Month => first.checked_add(Span::new().months(1)).ok()?,
                CalendarUnit::Year => first.checked_add(Span::new().years(1)).ok()?,
            };
            Some(CalendarWindow {
                start_ms: self.midnight_ms(first)?,
                end_ms: self.midnight_ms(next)?,
            })
        }

        /// `ms` as RFC 3339 with the zone's offset then (`2026-11-01T00:00:00+01:00`); milliseconds as a number
        /// past what jiff represents.
        pub(in crate::calendar) fn local_time(&self, ms: i64) -> String {
            match Timestamp::from_millisecond(ms) {
                Ok(at) => at.display_with_offset(self.tz.to_offset(at)).to_string(),
                Err(_) => ms.to_string(),
            }
        }

        /// The first instant of `date` in the zone: its midnight, or where a change of offset skips midnight (a
        /// zone that moves its clocks at 00:00), the first instant after the gap; where midnight happens twice, the
        /// first.
        fn midnight_ms(&self, date: Date) -> Option<i64> {
            let start = date.to_zoned_datetime(self.tz.clone()).ok()?;
            Some(start.timestamp().as_millisecond())
        }
    }

    impl PartialEq for Zone {
        fn eq(&self, other: &Self) -> bool {
            self.name == other.name
        }
    }

    impl Eq for Zone {}

    impl fmt::Debug for Zone {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_tuple("Zone").field(&self.name).finish()
        }
    }
}

#[cfg(not(feature = "calendar"))]
mod absent {
    use super::super::{CalendarError, CalendarUnit, CalendarWindow};

    /// No zone: a build without the `calendar` feature has no time zone database, and no calendar can be made.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Zone {}

    impl Zone {
        pub(in crate::calendar) fn named(_: &str) -> Result<Self, CalendarError> {
            Err(CalendarError::NotBuilt)
        }

        pub(in crate::calendar) fn name(&self) -> &'static str {
            match *self {}
        }

        pub(in crate::calendar) fn window_at(&self, _: CalendarUnit, _: i64) -> CalendarWindow {
            match *self {}
        }

        pub(in crate::calendar) fn local_time(&self, _: i64) -> String {
            match *self {}
        }
    }
}
