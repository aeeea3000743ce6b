//! Calendar quotas (`fixed_window` with `calendar:` and `timezone:`): windows from one midnight of a time zone's
//! calendar to the next, in both stores alike at every edge (months of 28 to 31 days, days of 23 and 25 hours, a
//! half-hour zone, the year's end); the response fields pointing at the next boundary; plans, overrides and the
//! admin API; and the config errors, located.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::clock::WINDOW_START_MS;
use common::config_builder::ConfigBuilder;
use common::http_client::{client, json_answer};
use common::redis::RedisServer;
use common::{serve_admin, start_gateway, TestGateway};
use serde_json::json;
use tollgate::limiter::store::{LimitCheck, MemoryStore, RedisStore};
use tollgate::limiter::{Algorithm, Calendar, CalendarUnit, Limit, ManualClock, Outcome};

const SECOND: i64 = 1_000;
const HOUR: i64 = 3_600 * SECOND;
const DAY: i64 = 24 * HOUR;
const TOKEN: &str = "admin-token";

/// Milliseconds since the epoch of `y-m-d hh:mm` UTC (Howard Hinnant's days_from_civil): the instants the tests
/// expect are worked out here and from the zones' published offsets, never by the code under test.
fn utc(y: i64, m: i64, d: i64, hh: i64, mm: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) * DAY + hh * HOUR + mm * 60_000
}

/// A calendar window ending at a boundary: the limit's calendar, when the window starts and ends, and how long
/// the window after it lasts.
struct Edge {
    what: &'static str,
    unit: CalendarUnit,
    zone: &'static str,
    start: i64,
    end: i64,
    next_len: i64,
}

fn edges() -> Vec<Edge> {
    let edge = |what, unit, zone, start, end, next_len| Edge {
        what,
        unit,
        zone,
        start,
        end,
        next_len,
    };
    use CalendarUnit::{Day, Month, Week, Year};
    vec![
        edge(
            "February 2026, 28 days",
            Month,
            "UTC",
            utc(2026, 2, 1, 0, 0),
            utc(2026, 3, 1, 0, 0),
            31 * DAY,
        ),
        edge(
            "February 2024, 29 days",
            Month,
            "UTC",
            utc(2024, 2, 1, 0, 0),
            utc(2024, 3, 1, 0, 0),
            31 * DAY,
        ),
        edge(
            "April 2026, 30 days",
            Month,
            "UTC",
            utc(2026, 4, 1, 0, 0),
            utc(2026, 5, 1, 0, 0),
            31 * DAY,
        ),
        edge(
            "January 2026, 31 days",
            Month,
            "UTC",
            utc(2026, 1, 1, 0, 0),
            utc(2026, 2, 1, 0, 0),
            28 * DAY,
        ),
        // Berlin: +01:00 in winter, +02:00 from 29 March 2026 02:00 to 25 October 03:00.
        edge(
            "29 March 2026 in Berlin, 23 hours",
            Day,
            "Europe/Berlin",
            utc(2026, 3, 28, 23, 0),
            utc(2026, 3, 29, 22, 0),
            DAY,
        ),
        edge(
            "25 October 2026 in Berlin, 25 hours",
            Day,
            "Europe/Berlin",
            utc(2026, 10, 24, 22, 0),
            utc(2026, 10, 25, 23, 0),
            DAY,
        ),
        // New York: -05:00 in winter, -04:00 from 8 March 2026 02:00 to 1 November 02:00.
        edge(
            "8 March 2026 in New York, 23 hours",
            Day,
            "America/New_York",
            utc(2026, 3, 8, 5, 0),
            utc(2026, 3, 9, 4, 0),
            DAY,
        ),
        edge(
            "1 November 2026 in New York, 25 hours",
            Day,
            "America/New_York",
            utc(2026, 11, 1, 4, 0),
            utc(2026, 11, 2, 5, 0),
            DAY,
        ),
        // Kolkata: +05:30 all year.
        edge(
            "1 June 2026 in Kolkata",
            Day,
            "Asia/Kolkata",
            utc(2026, 5, 31, 18, 30),
            utc(2026, 6, 1, 18, 30),
            DAY,
        ),
        edge(
            "March 2026 in Berlin, an hour short",
            Month,
            "Europe/Berlin",
            utc(2026, 2, 28, 23, 0),
            utc(2026, 3, 31, 22, 0),
            30 * DAY,
        ),
        edge(
            "the week of 19 October 2026 in Berlin",
            Week,
            "Europe/Berlin",
            utc(2026, 10, 18, 22, 0),
            utc(2026, 10, 25, 23, 0),
            7 * DAY,
        ),
        edge(
            "2026 in UTC",
            Year,
            "UTC",
            utc(2026, 1, 1, 0, 0),
            utc(2027, 1, 1, 0, 0),
            365 * DAY,
        ),
        edge(
            "2026 in Berlin",
            Year,
            "Europe/Berlin",
            utc(2025, 12, 31, 23, 0),
            utc(2026, 12, 31, 23, 0),
            365 * DAY,
        ),
        edge(
            "2028 in UTC, a leap year",
            Year,
            "UTC",
            utc(2028, 1, 1, 0, 0),
            utc(2029, 1, 1, 0, 0),
            365 * DAY,
        ),
    ]
}

fn calendar_limit(limit: u64, unit: CalendarUnit, zone: &str) -> Limit {
    let calendar = Calendar::new(unit, Some(zone)).expect("a zone of the database");
    Limit::new("quota", Algorithm::CalendarWindow { limit, calendar }, 1).expect("a valid limit")
}

/// What a step's outcome says of the quota: admitted, remaining, retry and reset in ms.
fn said(outcome: &Outcome) -> (bool, u64, u64, u64) {
    let d = &outcome.decisions[0];
    (
        outcome.allowed,
        d.remaining,
        d.retry_after_ms,
        d.reset_after_ms,
    )
}

/// Both stores, at explicit times around each edge: the window's first instant, its last, the next window's first;
/// the same decisions in each, and those a window from `start` to `end` makes (two admitted per window, the third
/// told to wait until the boundary, the next window's first request told how long that one lasts). The Redis
/// script is given the boundaries a gateway would draw a millisecond before the call (as its estimate of Redis's
/// clock, never ahead of it, would): at the boundary itself the script moves on to the next window on its own.
#[tokio::test(flavor = "multi_thread")]
async fn both_stores_count_each_calendar_window_from_boundary_to_boundary() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), 1, Duration::from_secs(2)).expect("connect");
    assert!(store.wait_connected(Duration::from_secs(5)).await);
    for (case, edge) in edges().iter().enumerate() {
        let memory = MemoryStore::new(1_000, Arc::new(ManualClock::new(0)));
        let limit = calendar_limit(2, edge.unit, edge.zone);
        let key = format!("calendar:{case}");
        let checks = [LimitCheck {
            key: &key,
            limit: &limit,
        }];
        let len = (edge.end - edge.start) as u64;
        let next = edge.next_len as u64;
        let steps = [
            (edge.start, (true, 1, 0, len)),
            (edge.end - 1, (true, 0, 0, 1)),
            (edge.end - 1, (false, 0, 1, 1)),
            (edge.end, (true, 1, 0, next)),
            (edge.end, (true, 0, 0, next)),
            (edge.end + 1, (false, 0, next - 1, next - 1)),
        ];
        for (at, expected) in steps {
            let in_memory = memory.check_at(at, &checks);
            let on_redis = store.check(&checks, Some(at)).await.expect("redis answers");
            assert_eq!(
                said(&in_memory),
                expected,
                "{} in memory at {at}",
                edge.what
            );
            assert_eq!(said(&on_redis), expected, "{} on Redis at {at}", edge.what);
        }
    }
}

/// A batch of identical requests is decided by the script in one run (and replayed by the gateway from the key's
/// state): across a boundary, the run counts in the window Redis's clock is in, as the memory store does.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_of_requests_at_a_boundary_counts_in_the_new_window_in_both_stores() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), 1, Duration::from_secs(2)).expect("connect");
    assert!(store.wait_connected(Duration::from_secs(5)).await);
    let memory = MemoryStore::new(1_000, Arc::new(ManualClock::new(0)));
    let limit = calendar_limit(3, CalendarUnit::Day, "America/New_York");
    let checks = [LimitCheck {
        key: "run",
        limit: &limit,
    }];
    let (last_day, boundary) = (utc(2026, 11, 1, 4, 0), utc(2026, 11, 2, 5, 0));
    for _ in 0..3 {
        assert!(memory.check_at(last_day, &checks).allowed);
    }
    store
        .check_batch(&[&checks, &checks, &checks], Some(last_day))
        .await
        .expect("redis answers");
    let batch: Vec<&[LimitCheck<'_>]> = vec![&checks; 4];
    let on_redis = store
        .check_batch(&batch, Some(boundary))
        .await
        .expect("redis answers");
    let in_memory: Vec<Outcome> = (0..4).map(|_| memory.check_at(boundary, &checks)).collect();
    let said_all = |outcomes: &[Outcome]| outcomes.iter().map(said).collect::<Vec<_>>();
    assert_eq!(said_all(&on_redis), said_all(&in_memory));
    let admitted: Vec<bool> = on_redis.iter().map(|o| o.allowed).collect();
    assert_eq!(admitted, [true, true, true, false]);
    // What the run took is stored in the new window: the next request there is refused in both.
    let after = store
        .check(&checks, Some(boundary + 1))
        .await
        .expect("redis answers");
    assert_eq!(said(&after), said(&memory.check_at(boundary + 1, &checks)));
    assert!(!after.allowed);
}

/// A route limit of two a day in Kolkata on `store`, answering 200 directly.
fn kolkata_yaml(redis: Option<&RedisServer>, calendar: &str) -> String {
    ConfigBuilder::new()
        .store(redis)
        .route("api", "/api")
        .respond(200, "ok")
        .limit(
            "daily",
            "ip",
            &format!("algorithm: fixed_window, limit: 2, {calendar}"),
        )
        .build()
}

/// The gateway's clock: the test's in memory, the system's (Redis's, within the link) on Redis.
fn now_ms(gateway: &TestGateway) -> i64 {
    match &gateway.clock {
        Some(clock) => tollgate::limiter::Clock::now_ms(clock.as_ref()),
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
    }
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Seconds `value` says, checked to be within a second of `expected_ms` (the request's own time in between).
fn assert_seconds(value: &str, expected_ms: i64, what: &str) {
    let seconds: i64 = value
        .parse()
        .unwrap_or_else(|_| panic!("{what}: {value:?}"));
    let expected = (expected_ms + 999) / 1_000;
    assert!(
        (seconds - expected).abs() <= 1,
        "{what}: {seconds} s, expected {expected} s"
    );
}

/// `Retry-After`, `X-RateLimit-Reset` and `RateLimit`'s `t` point at the next midnight in Kolkata (18:30 UTC), not
/// UTC's; `RateLimit-Policy`'s `w` is the day's length.
async fn fields_point_at_the_next_boundary(redis: Option<&RedisServer>) {
    let gateway = start_gateway(&kolkata_yaml(
        redis,
        "calendar: day, timezone: Asia/Kolkata",
    ))
    .await;
    let http = client();
    let now = now_ms(&gateway);
    let next_midnight = {
        let since = (now - (18 * HOUR + 30 * 60_000)).rem_euclid(DAY);
        now - since + DAY
    };
    for _ in 0..2 {
        let response = http.get(gateway.url("/api")).send().await.expect("request");
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            "\"daily\";q=2;w=86400"
        );
        assert_seconds(
            &header(&response, "x-ratelimit-reset"),
            next_midnight - now,
            "X-RateLimit-Reset",
        );
    }
    let refused = http.get(gateway.url("/api")).send().await.expect("request");
    assert_eq!(refused.status(), 429);
    assert_seconds(
        &header(&refused, "retry-after"),
        next_midnight - now,
        "Retry-After",
    );
    let rate_limit = header(&refused, "ratelimit");
    let t = rate_limit.split("t=").nth(1).unwrap_or_default();
    assert_seconds(t, next_midnight - now, "RateLimit t");
    // The admin API shows the day: from Kolkata's last midnight to its next.
    let admin = serve_admin(&gateway, None).await;
    let (status, shown) =
        json_answer(http.get(format!("{admin}/limits/api/daily?key=127.0.0.1"))).await;
    assert_eq!(status, 200, "{shown}");
    let window = &shown["window"];
    assert_eq!(
        window["start_ms"].as_i64(),
        Some(next_midnight - DAY),
        "{shown}"
    );
    assert_eq!(window["end_ms"].as_i64(), Some(next_midnight), "{shown}");
    let start = window["start"].as_str().unwrap_or_default();
    assert!(start.ends_with("T00:00:00+05:30"), "{shown}");
    assert_eq!(shown["remaining"], 0, "{shown}");
}

crate::each_store!(
    fields_point_at_the_next_boundary_on,
    fields_point_at_the_next_boundary,
    flavor = "multi_thread"
);

/// On the test's clock: the last minute of February 2026 in Berlin (28 days, `w=2419200`), then March, an hour
/// short of 31 days (`w=2674800`), whose first request is admitted again and told the month's whole length.
#[tokio::test]
async fn a_month_s_window_is_its_own_length_and_the_next_one_starts_afresh() {
    let yaml = ConfigBuilder::new()
        .store(None)
        .route("api", "/api")
        .respond(200, "ok")
        .limit(
            "monthly",
            "ip",
            "algorithm: fixed_window, limit: 1, calendar: month, timezone: Europe/Berlin",
        )
        .build();
    let gateway = start_gateway(&yaml).await;
    let clock = gateway.clock.clone().expect("the memory store's clock");
    // 1 March 00:00 in Berlin is 28 February 23:00 UTC; a minute before.
    clock.advance(utc(2026, 2, 28, 22, 59) - WINDOW_START_MS);
    let http = client();
    let first = http.get(gateway.url("/api")).send().await.expect("request");
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        "\"monthly\";q=1;w=2419200"
    );
    assert_eq!(header(&first, "x-ratelimit-reset"), "60");
    let refused = http.get(gateway.url("/api")).send().await.expect("request");
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after"), "60");
    clock.advance(60 * SECOND);
    let march = http.get(gateway.url("/api")).send().await.expect("request");
    assert_eq!(march.status(), 200);
    assert_eq!(
        header(&march, "ratelimit-policy"),
        "\"monthly\";q=1;w=2674800"
    );
    assert_seconds(
        &header(&march, "x-ratelimit-reset"),
        31 * DAY - HOUR,
        "X-RateLimit-Reset",
    );
}

/// A plan's monthly quota, a consumer's override of its limit keeping the calendar, and the window's start and end
/// in the admin API, on both stores.
async fn plans_and_overrides_keep_the_calendar(redis: Option<&RedisServer>) {
    let yaml = ConfigBuilder::new()
        .store(redis)
        .top(
            r#"consumers:
  identify:
    - api_key: { header: x-api-key }
  keys:
    - { key: acme-key, consumer: acme, plan: pro }
  plans:
    pro:
      limits:
        - { name: monthly, key: consumer, algorithm: fixed_window, limit: 1, calendar: month, timezone: Europe/Berlin }
"#,
        )
        .route("api", "/api")
        .respond(200, "ok")
        .build();
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let http = client();
    let call = |path: &str| {
        http.get(gateway.url(path))
            .header("x-api-key", "acme-key")
            .send()
    };
    let first = call("/api").await.expect("request");
    assert_eq!(first.status(), 200);
    assert_eq!(call("/api").await.expect("request").status(), 429);

    let (status, body) = json_answer(
        http.put(format!("{admin}/consumers/acme"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(json!({"overrides": {"monthly": {"limit": 3}}}).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let lifted = common::eventually(Duration::from_secs(2), async || {
        call("/api")
            .await
            .map(|r| r.status() == 200)
            .unwrap_or(false)
    })
    .await;
    assert!(lifted.is_some(), "the override never applied");
    let (status, shown) = json_answer(
        http.get(format!("{admin}/consumers/acme"))
            .header("authorization", format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(status, 200, "{shown}");
    let limit = &shown["limits"][0];
    assert_eq!(limit["overridden"], true, "{shown}");
    assert_eq!(limit["capacity"], 3, "{shown}");
    let window = &limit["window"];
    assert_eq!(window["calendar"], "month", "{shown}");
    assert_eq!(window["timezone"], "Europe/Berlin", "{shown}");
    let (start, end) = (window["start_ms"].as_i64(), window["end_ms"].as_i64());
    let (Some(start), Some(end)) = (start, end) else {
        panic!("no window in {shown}");
    };
    let now = now_ms(&gateway);
    assert!(start <= now && now < end, "{shown}");
    // The window is the month in Berlin: it starts at a local midnight on the first, ends on the next first.
    let local = |field: &str| window[field].as_str().unwrap_or_default().to_owned();
    assert!(local("start").contains("-01T00:00:00+0"), "{shown}");
    assert!(local("end").contains("-01T00:00:00+0"), "{shown}");
    // The override's limit is counted in the same calendar window: the request its plan refused still counts.
    assert_eq!(limit["remaining"], 1, "{shown}");
    assert_eq!(
        limit["reset_after_ms"].as_i64().map(|ms| ms > 0),
        Some(true),
        "{shown}"
    );
}

crate::each_store!(
    plans_and_overrides_keep_the_calendar_on,
    plans_and_overrides_keep_the_calendar,
    flavor = "multi_thread"
);

/// Each config mistake is refused at its line and column, naming the field.
#[test]
fn calendar_mistakes_are_located_config_errors() {
    let cases = [
        (
            "algorithm: fixed_window, limit: 5, calendar: month, timezone: Mars/Olympus",
            "routes[0].limits[0].timezone: unknown time zone \"Mars/Olympus\"",
        ),
        (
            "algorithm: fixed_window, limit: 5, period: 30d, calendar: month",
            "routes[0].limits[0].calendar: calendar and period exclude each other",
        ),
        (
            "algorithm: sliding_window, limit: 5, period: 1d, calendar: day",
            "routes[0].limits[0].calendar: calendar windows are fixed_window's, not sliding_window's",
        ),
        (
            "algorithm: fixed_window, limit: 5, calendar: fortnight",
            "routes[0].limits[0].calendar: unknown calendar \"fortnight\"",
        ),
        (
            "algorithm: fixed_window, limit: 5, period: 1d, timezone: Europe/Berlin",
            "routes[0].limits[0].timezone: only used with calendar",
        ),
    ];
    for (params, expected) in cases {
        let yaml = format!(
            "store:\n  backend: memory\nroutes:\n  - name: api\n    match: {{ path_prefix: /api }}\n    respond: {{ status: 200 }}\n    limits:\n      - name: quota\n        key: ip\n        {}\n",
            params.replace(", ", "\n        ")
        );
        let field = expected
            .split(": ")
            .next()
            .and_then(|path| path.rsplit('.').next())
            .unwrap_or_default();
        let line = yaml
            .lines()
            .position(|line| line.trim_start().starts_with(&format!("{field}:")))
            .map(|i| i + 1)
            .expect("the field's line");
        let error = match tollgate::config::parse(&yaml, std::path::Path::new("test.yaml")) {
            Ok(_) => panic!("accepted: {params}"),
            Err(error) => error.to_string(),
        };
        let located = format!("test.yaml:{line}:9: {expected}");
        assert!(error.contains(&located), "{error}\nexpected: {located}");
    }
}

/// `tollgate check` says what a calendar quota is: `10000 per month (Europe/Berlin)`.
#[test]
fn check_prints_the_calendar_and_its_zone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("calendar.yaml");
    let yaml = ConfigBuilder::new()
        .store(None)
        .route("api", "/api")
        .respond(200, "ok")
        .limit(
            "monthly",
            "ip",
            "algorithm: fixed_window, limit: 10000, calendar: month, timezone: Europe/Berlin",
        )
        .limit(
            "daily",
            "ip",
            "algorithm: fixed_window, limit: 500, calendar: day",
        )
        .build();
    std::fs::write(&path, yaml).expect("write the config");
    let output = std::process::Command::new(common::binary::BIN)
        .args(["check", "--config", path.to_str().expect("a UTF-8 path")])
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .expect("run tollgate");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("10000 per month (Europe/Berlin)"),
        "{stdout}"
    );
    assert!(stdout.contains("500 per day (UTC)"), "{stdout}");
}
