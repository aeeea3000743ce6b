//! The script's calling convention checked against the script itself and the algorithms it mirrors.

use super::*;
use crate::algorithms::gcra::EPOCH_MS;
use crate::{LeakyMode, Limit, Rate};

fn limit(algorithm: Algorithm) -> Limit {
    Limit::new("l", algorithm, 2).expect("valid")
}

fn window() -> Limit {
    limit(Algorithm::FixedWindow {
        limit: 5,
        period_ms: 1_000,
    })
}

fn encoded(limit: &Limit, keys: &[&str], mode: Mode) -> EncodedRequest {
    let checks: Vec<LimitCheck<'_>> = keys.iter().map(|key| LimitCheck { key, limit }).collect();
    EncodedRequest::new(&checks, mode)
}

#[test]
fn a_batch_names_each_key_once_and_packs_the_requests() {
    let window = window();
    let first = encoded(&window, &["k1", "k2"], Mode::Commit);
    let second = encoded(&window, &["k2", "k3"], Mode::DryRun);
    let sha = Value::from("sha");
    let requests = [&first, &second];
    let runs = runs(&requests);
    assert_eq!(runs, [1, 1]);
    let mut command = command(
        &sha,
        Some(77),
        || 0,
        &requests,
        &[0, 9],
        &runs,
        &Value::Null,
        None,
    );
    let packed = command.pop().expect("packed requests");
    let strings: Vec<String> = command
        .iter()
        .map(|v| v.as_string().unwrap_or_default())
        .collect();
    assert_eq!(strings, ["sha", "3", "k1", "k2", "k3", "77"]);
    let fixed = [4, 5, 1000, 0, 0, 2, 0];
    let mut expected = vec![1, 1, 2, 0, 1];
    expected.extend(fixed);
    expected.push(2);
    expected.extend(fixed);
    expected.extend([0, 1, 2, 9, 2]);
    expected.extend(fixed);
    expected.push(3);
    expected.extend(fixed);
    assert_eq!(unpack_reply(&packed).expect("MessagePack"), expected);
    assert_eq!((first.limits(), second.limits()), (2, 2));
}

#[test]
fn consecutive_identical_committing_requests_form_runs() {
    let window = window();
    let log = limit(Algorithm::SlidingLog {
        limit: 5,
        period_ms: 1_000,
    });
    let a = || encoded(&window, &["a1", "a2"], Mode::Commit);
    let b = encoded(&window, &["b1", "b2"], Mode::Commit);
    let dry = encoded(&window, &["a1", "a2"], Mode::DryRun);
    let shared_key = encoded(&window, &["s", "s"], Mode::Commit);
    let logged = encoded(&log, &["l"], Mode::Commit);
    let (a1, a2, a3, a4) = (a(), a(), a(), a());
    // Order is kept: the a after b starts a run of its own.
    let requests = [
        &a1,
        &a2,
        &a3,
        &b,
        &a4,
        &dry,
        &dry,
        &shared_key,
        &shared_key,
        &logged,
        &logged,
    ];
    assert_eq!(runs(&requests), [3, 1, 1, 1, 1, 1, 1, 1, 1]);
    let sha = Value::from("sha");
    // A run's deadline is its earliest member's; none (0) is later than any.
    let packed = command(
        &sha,
        None,
        || 0,
        &requests[..4],
        &[0, 40, 30, 0],
        &[3, 1],
        &Value::Null,
        None,
    )
    .pop()
    .expect("packed requests");
    let values = unpack_reply(&packed).expect("MessagePack");
    assert_eq!(values[..4], [1, 3, 2, 30], "one entry for the run of three");
    assert_eq!(values.len(), 2 * (ARGS_PER_REQUEST + 2 * ARGS_PER_LIMIT));
}

#[test]
fn a_run_is_replayed_from_the_state_before_it() {
    let window = window(); // 5 per second, cost 2: two admissions fit in a fresh window
    let gcra = Limit::new(
        "g",
        Algorithm::Gcra {
            rate: Rate::new(10, 1_000).expect("positive"),
            burst: 10,
        },
        1,
    )
    .expect("valid")
    .with_shadow(true);
    let checks = [
        LimitCheck {
            key: "w",
            limit: &window,
        },
        LimitCheck {
            key: "g",
            limit: &gcra,
        },
    ];
    let request = EncodedRequest::new(&checks, Mode::Commit);
    let now = EPOCH_MS + 10_500;
    // The window already counts 1 this second; the GCRA key is fresh.
    let reply = [now, 0, 0, 1, now - 500, 1, 0, 0, 0, 0, 0];
    let outcomes = parse_reply(&reply, &[&request, &request, &request], &[3]).expect("well formed");
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(|o| o.expect("decided")).collect();
    let allowed: Vec<bool> = outcomes.iter().map(|o| o.allowed).collect();
    assert_eq!(allowed, [true, true, false]);
    let remaining: Vec<u64> = outcomes.iter().map(|o| o.decisions[0].remaining).collect();
    assert_eq!(remaining, [2, 0, 0]);
    // The shadow GCRA consumed for the two admitted requests only.
    let gcra_remaining: Vec<u64> = outcomes.iter().map(|o| o.decisions[1].remaining).collect();
    assert_eq!(gcra_remaining, [9, 8, 8]);
    assert!(parse_reply(&reply[..10], &[&request, &request], &[2]).is_err());
}

#[test]
fn a_reply_that_is_not_messagepack_integers_is_an_error() {
    assert!(unpack_reply(&Value::Integer(1)).is_err());
    assert!(unpack_reply(&Value::Bytes(Bytes::from_static(b"\x92\x01"))).is_err());
    assert!(unpack_reply(&Value::Bytes(Bytes::from_static(b"\x92\x01\xa1x"))).is_err());
    let two = unpack_reply(&Value::Bytes(Bytes::from_static(b"\x92\x01\xd0\xff")));
    assert_eq!(two.expect("two integers"), [1, -1]);
}

#[test]
fn the_reply_is_split_per_request() {
    let window = window();
    let one = encoded(&window, &["a"], Mode::Commit);
    let two = encoded(&window, &["a", "b"], Mode::Commit);
    // Per limit: allowed, remaining, wait (the delay when allowed, the retry when denied), reset.
    let reply = [
        123, // now
        0,   // the epoch
        0,   // no recovery window
        1, 1, 3, 250, 900, // request 1: allowed, one limit, held 250 ms
        0, 0, 0, 400, 1_000, 1, 4, 0, 600, // request 2: denied by the first of two
    ];
    let outcomes: Vec<Outcome> = parse_reply(&reply, &[&one, &two], &[1, 1])
        .expect("well formed")
        .into_iter()
        .map(|o| o.expect("decided"))
        .collect();
    assert_eq!(outcomes.len(), 2);
    let admitted = &outcomes[0].decisions[0];
    assert!(outcomes[0].allowed);
    assert_eq!(
        (
            admitted.remaining,
            admitted.delay_ms,
            admitted.retry_after_ms
        ),
        (3, 250, 0)
    );
    assert_eq!((admitted.limit, admitted.reset_after_ms), (5, 900));
    assert!(!outcomes[1].allowed);
    let denied = &outcomes[1].decisions[0];
    assert_eq!((denied.retry_after_ms, denied.delay_ms), (400, 0));
    assert_eq!((denied.limit, denied.reset_after_ms), (5, 1_000));
    assert_eq!(outcomes[1].decisions[1].remaining, 4);
}

#[test]
fn entries_reached_past_their_deadline_are_late_and_the_others_decided() {
    let window = window();
    let one = encoded(&window, &["a"], Mode::Commit);
    let two = encoded(&window, &["a", "b"], Mode::Commit);
    // A run of two past its deadline, then one request decided.
    let reply = [123, 0, 0, -1, 1, 1, 3, 0, 900];
    let outcomes = parse_reply(&reply, &[&two, &two, &one], &[2, 1]).expect("well formed");
    assert!(matches!(outcomes[0], Err(StoreError::Late)));
    assert!(matches!(outcomes[1], Err(StoreError::Late)));
    let decided = outcomes[2].as_ref().expect("decided");
    assert!(decided.allowed);
    assert_eq!(decided.batch, 3, "the call carried three requests");
    assert_eq!(outcomes.len(), 3);
}

#[test]
fn a_reply_of_the_wrong_length_is_an_error() {
    let window = window();
    let one = encoded(&window, &["a"], Mode::Commit);
    let two = encoded(&window, &["a", "b"], Mode::Commit);
    let reply = [123, 0, 0, 1, 1, 3, 0, 900];
    assert!(parse_reply(&reply, &[&one], &[1]).is_ok());
    assert!(parse_reply(&reply, &[&two], &[1]).is_err());
    assert!(parse_reply(&reply, &[&one, &one], &[1, 1]).is_err());
    assert!(parse_reply(&reply[..7], &[&one], &[1]).is_err());
    assert!(parse_reply(&reply, &[], &[]).is_err());
    assert!(parse_reply(&[], &[], &[]).is_err());
}

#[test]
fn script_and_rust_share_the_gcra_epoch() {
    assert!(CHECK_SCRIPT.contains(&format!("local GCRA_EPOCH_MS = {EPOCH_MS}\n")));
}

/// Every algorithm, with parameters that do not matter here.
#[cfg(feature = "calendar")]
fn every_algorithm() -> Vec<Algorithm> {
    let rate = crate::parse_rate("10/s").expect("rate");
    let calendar = crate::Calendar::new(crate::CalendarUnit::Month, Some("Europe/Berlin"));
    vec![
        Algorithm::CalendarWindow {
            limit: 5,
            calendar: calendar.expect("a zone"),
        },
        Algorithm::SlidingWindow {
            limit: 5,
            period_ms: 1_000,
        },
        Algorithm::SlidingLog {
            limit: 5,
            period_ms: 1_000,
        },
        Algorithm::TokenBucket { rate, burst: 5 },
        Algorithm::FixedWindow {
            limit: 5,
            period_ms: 1_000,
        },
        Algorithm::Gcra { rate, burst: 5 },
        Algorithm::LeakyBucket {
            rate,
            burst: 5,
            mode: LeakyMode::Reject,
        },
        Algorithm::Concurrency {
            max: 5,
            lease_ms: 30_000,
            queue: None,
        },
    ]
}

// Every id, the calendar window's among them: only in a build that has calendar windows.
#[cfg(feature = "calendar")]
#[test]
fn the_script_and_the_gateway_name_the_same_algorithm_ids() {
    // The header's table: `--   <id> <name>  <parameters>`.
    let listed: std::collections::HashMap<u64, &str> = CHECK_SCRIPT
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("--   ")?.split_whitespace();
            let id = words.next()?.parse().ok()?;
            let name = words.next()?;
            name.starts_with(|c: char| c.is_ascii_lowercase())
                .then_some((id, name))
        })
        .collect();
    let algorithms = every_algorithm();
    assert_eq!(listed.len(), algorithms.len(), "{listed:?}");
    for algorithm in &algorithms {
        let id = script_params(algorithm, &mut || 0)[0];
        assert_eq!(listed.get(&id), Some(&algorithm.name()), "id {id}");
    }
    // Every comparison of an id in the code names the algorithm, on its line or in the comment above it, and
    // the ids run from 1 to the number of algorithms (the argument check refuses the rest).
    let lines: Vec<&str> = CHECK_SCRIPT.lines().collect();
    for (at, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("--") {
            continue;
        }
        for (_, rest) in line
            .match_indices("alg ")
            .map(|(i, _)| ((), &line[i + 4..]))
        {
            let Some(id) = rest
                .strip_prefix("== ")
                .or_else(|| rest.strip_prefix("~= "))
                .and_then(|r| r.get(..1))
                .and_then(|d| d.parse::<u64>().ok())
            else {
                continue;
            };
            let name = listed
                .get(&id)
                .unwrap_or_else(|| panic!("line {}: id {id} is not listed", at + 1));
            let above = at.checked_sub(1).map_or("", |i| lines[i]);
            assert!(
                line.contains(&format!("-- {name}"))
                    || line.contains(&format!("-- not {name}"))
                    || above.contains(name),
                "line {}: `alg {}` does not name {name}: {line}",
                at + 1,
                &rest[..4]
            );
        }
    }
    assert!(CHECK_SCRIPT.contains(&format!("alg > {}", algorithms.len())));
}

#[test]
fn the_script_is_every_part_of_its_folder_in_order() {
    // A part added to the folder but not to `CHECK_SCRIPT` (or out of order) would go unsent.
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts/check");
    let mut parts: Vec<_> = std::fs::read_dir(folder)
        .expect("the script's folder")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "lua"))
        .collect();
    parts.sort();
    let joined: String = parts
        .iter()
        .map(|path| std::fs::read_to_string(path).expect("a part"))
        .collect();
    assert_eq!(joined, CHECK_SCRIPT);
    assert!(
        CHECK_SCRIPT.starts_with("#!lua\n"),
        "the flags line comes first"
    );
}

#[test]
fn a_request_split_per_limit_keeps_each_key_with_its_limit() {
    let window = window();
    let request = encoded(&window, &["k1", "key2", "k3"], Mode::Commit);
    let parts = request.per_limit(Mode::DryRun);
    let expected: Vec<EncodedRequest> = ["k1", "key2", "k3"]
        .iter()
        .map(|key| encoded(&window, &[key], Mode::DryRun))
        .collect();
    assert_eq!(parts, expected);
    assert!(parts[1].same_keys(&encoded(&window, &["key2"], Mode::Commit)));
    assert!(!request.same_keys(&parts[0]));
}
