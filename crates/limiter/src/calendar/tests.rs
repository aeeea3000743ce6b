//! The boundaries of calendar windows, checked against instants worked out by hand (UTC civil arithmetic here,
//! offsets from the zones' published rules), never against jiff itself.

use super::*;
use crate::algorithms::fixed_window::{evaluate_calendar, FixedWindowState};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// Milliseconds since the epoch of `y-m-d hh:mm` UTC (Howard Hinnant's days_from_civil).
fn utc(y: i64, m: i64, d: i64, hh: i64, mm: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * DAY + hh * HOUR + mm * 60_000
}

fn calendar(unit: CalendarUnit, zone: &str) -> Calendar {
    Calendar::new(unit, Some(zone)).expect("a zone of the database")
}

/// The window at `now`, and that its edges are where the next and previous windows meet it.
fn window(calendar: &Calendar, now: i64) -> CalendarWindow {
    let window = calendar.window_at(now);
    assert!(
        window.start_ms <= now && now < window.end_ms,
        "{window:?} {now}"
    );
    assert_eq!(calendar.window_at(window.end_ms - 1), window);
    assert_eq!(calendar.window_at(window.start_ms), window);
    assert_eq!(calendar.window_at(window.end_ms).start_ms, window.end_ms);
    assert_eq!(
        calendar.window_at(window.start_ms - 1).end_ms,
        window.start_ms
    );
    window
}

#[test]
fn the_helper_counts_days_as_the_epoch_does() {
    assert_eq!(utc(1970, 1, 1, 0, 0), 0);
    assert_eq!(utc(2025, 12, 18, 0, 0), 1_766_016_000_000);
}

#[test]
fn months_last_28_29_30_and_31_days() {
    let months = calendar(CalendarUnit::Month, "UTC");
    for (y, m, next, days) in [
        (2026, 2, (2026, 3), 28),
        (2024, 2, (2024, 3), 29),
        (2026, 4, (2026, 5), 30),
        (2026, 1, (2026, 2), 31),
        (2026, 12, (2027, 1), 31),
    ] {
        let w = window(&months, utc(y, m, 10, 12, 0));
        assert_eq!(w.start_ms, utc(y, m, 1, 0, 0), "{y}-{m}");
        assert_eq!(w.end_ms, utc(next.0, next.1, 1, 0, 0), "{y}-{m}");
        assert_eq!(w.len_ms(), days * DAY as u64, "{y}-{m}");
    }
}

#[test]
fn a_month_in_berlin_starts_at_its_midnight_and_takes_the_hour_its_clocks_change() {
    let months = calendar(CalendarUnit::Month, "Europe/Berlin");
    // March 2026: from 1 March 00:00 CET (+01:00) to 1 April 00:00 CEST (+02:00), an hour short of 31 days.
    let w = window(&months, utc(2026, 3, 15, 0, 0));
    assert_eq!(w.start_ms, utc(2026, 2, 28, 23, 0));
    assert_eq!(w.end_ms, utc(2026, 3, 31, 22, 0));
    assert_eq!(w.len_ms(), (31 * DAY - HOUR) as u64);
    // 23:30 UTC on 28 February is already March in Berlin.
    assert_eq!(months.window_at(utc(2026, 2, 28, 23, 30)), w);
}

#[test]
fn days_across_a_change_of_daylight_saving_time_last_23_or_25_hours() {
    let cases = [
        // Berlin: 29 March 2026 springs forward at 02:00, 25 October falls back at 03:00.
        ("Europe/Berlin", (2026, 3, 29), utc(2026, 3, 28, 23, 0), 23),
        (
            "Europe/Berlin",
            (2026, 10, 25),
            utc(2026, 10, 24, 22, 0),
            25,
        ),
        // New York: 8 March 2026 springs forward, 1 November falls back, both at 02:00.
        ("America/New_York", (2026, 3, 8), utc(2026, 3, 8, 5, 0), 23),
        (
            "America/New_York",
            (2026, 11, 1),
            utc(2026, 11, 1, 4, 0),
            25,
        ),
    ];
    for (zone, (y, m, d), start, hours) in cases {
        let days = calendar(CalendarUnit::Day, zone);
        let w = window(&days, start + 12 * HOUR);
        assert_eq!(w.start_ms, start, "{zone} {y}-{m}-{d}");
        assert_eq!(w.len_ms(), (hours * HOUR) as u64, "{zone} {y}-{m}-{d}");
        // The days around it are 24 hours long.
        assert_eq!(
            days.next(w).len_ms(),
            DAY as u64,
            "{zone} after {y}-{m}-{d}"
        );
        let before = days.window_at(w.start_ms - 1);
        assert_eq!(before.len_ms(), DAY as u64, "{zone} before {y}-{m}-{d}");
    }
}

#[test]
fn a_half_hour_zone_starts_its_days_on_the_half_hour() {
    // Asia/Kolkata is +05:30 all year: its days start at 18:30 UTC the day before.
    let days = calendar(CalendarUnit::Day, "Asia/Kolkata");
    let w = window(&days, utc(2026, 6, 1, 18, 29));
    assert_eq!(w.start_ms, utc(2026, 5, 31, 18, 30));
    assert_eq!(w.end_ms, utc(2026, 6, 1, 18, 30));
    let months = calendar(CalendarUnit::Month, "Asia/Kolkata");
    assert_eq!(
        window(&months, utc(2026, 6, 30, 18, 30)).start_ms,
        utc(2026, 6, 30, 18, 30)
    );
}

#[test]
fn a_year_ends_at_midnight_of_new_year_in_its_zone() {
    let years = calendar(CalendarUnit::Year, "UTC");
    let w = window(&years, utc(2026, 12, 31, 23, 59));
    assert_eq!(
        (w.start_ms, w.end_ms),
        (utc(2026, 1, 1, 0, 0), utc(2027, 1, 1, 0, 0))
    );
    assert_eq!(years.next(w).len_ms(), 365 * DAY as u64);
    // 2028 is a leap year.
    assert_eq!(
        window(&years, utc(2028, 7, 1, 0, 0)).len_ms(),
        366 * DAY as u64
    );
    // New York's year ends five hours after UTC's.
    let new_york = calendar(CalendarUnit::Year, "America/New_York");
    let w = window(&new_york, utc(2027, 1, 1, 4, 59));
    assert_eq!(w.end_ms, utc(2027, 1, 1, 5, 0));
}

#[test]
fn weeks_start_on_monday() {
    let weeks = calendar(CalendarUnit::Week, "UTC");
    // 29 November 2026 is a Sunday; 23 November a Monday.
    let w = window(&weeks, utc(2026, 11, 29, 23, 0));
    assert_eq!(w.start_ms, utc(2026, 11, 23, 0, 0));
    assert_eq!(w.len_ms(), 7 * DAY as u64);
    // The week of the Berlin autumn change is an hour longer.
    let berlin = calendar(CalendarUnit::Week, "Europe/Berlin");
    assert_eq!(
        window(&berlin, utc(2026, 10, 25, 12, 0)).len_ms(),
        (7 * DAY + HOUR) as u64
    );
}

#[test]
fn zones_are_the_database_s_and_default_to_utc() {
    let default = Calendar::new(CalendarUnit::Day, None).expect("UTC");
    assert_eq!(default.to_string(), "day (UTC)");
    assert_eq!(
        calendar(CalendarUnit::Month, "Europe/Berlin").to_string(),
        "month (Europe/Berlin)"
    );
    assert_eq!(
        Calendar::new(CalendarUnit::Day, Some("Europe/Atlantis")),
        Err(CalendarError::UnknownZone("Europe/Atlantis".to_owned()))
    );
    assert!("fortnight".parse::<CalendarUnit>().is_err());
}

#[test]
fn a_calendar_window_s_count_resets_at_the_boundary_and_says_when() {
    let months = calendar(CalendarUnit::Month, "UTC");
    // Two a month; the last minute of February 2026.
    let now = utc(2026, 2, 28, 23, 59);
    let mut state: Option<FixedWindowState> = None;
    for _ in 0..2 {
        let t = evaluate_calendar(2, months.window_at(now), state.as_ref(), now, 1);
        assert!(t.admitted.allowed);
        state = Some(t.next);
    }
    let denied = evaluate_calendar(2, months.window_at(now), state.as_ref(), now, 1);
    assert!(!denied.admitted.allowed);
    assert_eq!(denied.admitted.retry_after_ms, 60_000);
    let march = utc(2026, 3, 1, 0, 0);
    let t = evaluate_calendar(2, months.window_at(march), state.as_ref(), march, 1);
    assert!(t.admitted.allowed);
    assert_eq!(t.admitted.reset_after_ms, 31 * DAY as u64);
    assert_eq!(t.ttl_ms, 31 * DAY as u64);
}
