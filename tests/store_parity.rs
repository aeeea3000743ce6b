//! The Redis script and the in-process store make identical decisions for the same requests at the same
//! (explicit) timestamps: random limits, costs and time steps, including repeated and backward timestamps.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis::RedisServer;
use http::{HeaderMap, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tollgate::admission::{Checked, LimitSet, LimitSettings};
use tollgate::key::{Counts, KeyPart, KeySpec, MissingKey, TokenKind};
use tollgate::limiter::store::{LimitCheck, MemoryStore, RedisStore};
use tollgate::limiter::{
    Algorithm, Decision, DenyCache, LeakyMode, Limit, ManualClock, Outcome, Rate, MAX_LOG_ENTRIES,
    MAX_SCALED,
};

fn algorithm() -> impl Strategy<Value = Algorithm> {
    let period = prop_oneof![Just(1_000u64), Just(60_000), 1u64..5_000];
    let rate = (1u64..50, period.clone())
        .prop_map(|(count, period_ms)| Rate::new(count, period_ms).expect("positive"));
    let mode = prop_oneof![
        Just(LeakyMode::Reject),
        (1u64..3_000).prop_map(|max_delay_ms| LeakyMode::Delay { max_delay_ms })
    ];
    prop_oneof![
        (1u64..20, period.clone())
            .prop_map(|(limit, period_ms)| Algorithm::FixedWindow { limit, period_ms }),
        (1u64..20, rate.clone()).prop_map(|(burst, rate)| Algorithm::Gcra { rate, burst }),
        (1u64..20, rate, mode).prop_map(|(burst, rate, mode)| Algorithm::LeakyBucket {
            rate,
            burst,
            mode
        }),
        (1u64..20, period.clone())
            .prop_map(|(limit, period_ms)| Algorithm::SlidingWindow { limit, period_ms }),
        (1u64..20, period.clone())
            .prop_map(|(limit, period_ms)| Algorithm::SlidingLog { limit, period_ms }),
        (1u64..20, 1u64..50, period).prop_map(|(burst, count, period_ms)| Algorithm::TokenBucket {
            rate: Rate::new(count, period_ms).expect("positive"),
            burst,
        }),
    ]
}

/// A step: time moves by `delta` ms (sometimes zero, sometimes backwards), and a request of cost `cost` checks
/// both limits.
fn steps() -> impl Strategy<Value = Vec<(i64, u64)>> {
    prop::collection::vec(
        (prop_oneof![Just(0i64), -50i64..0, 0i64..3_000], 1u64..4),
        1..60,
    )
}

struct Fixture {
    redis: RedisServer,
    store: RedisStore,
    runtime: tokio::runtime::Runtime,
    case: AtomicUsize,
}

/// A Redis store on a fresh server, owned by the test so that the server is killed when the test ends (a
/// `static` would outlive the test process's destructors and leave `redis-server` running).
fn fixture() -> Fixture {
    {
        let redis = RedisServer::start();
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let store = runtime.block_on(async {
            let store =
                RedisStore::connect(&redis.url(), 1, Duration::from_secs(1)).expect("connect");
            assert!(store.wait_connected(Duration::from_secs(5)).await);
            store
        });
        Fixture {
            redis,
            store,
            runtime,
            case: AtomicUsize::new(0),
        }
    }
}

#[test]
fn redis_and_memory_decide_alike() {
    let fx = fixture();
    let config = ProptestConfig {
        cases: 96,
        // Failures found are saved beside this file (store_parity.proptest-regressions) and replayed first.
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    // Some requests carry their own cost on the first limit (a reservation): none, or more than it holds.
    let own_costs = prop::collection::vec(prop::option::of(0u64..25), 60);
    let inputs = (
        algorithm(),
        algorithm(),
        (any::<bool>(), any::<bool>()),
        steps(),
        own_costs,
    );
    let result = runner.run(&inputs, |(first, second, shadows, steps, own_costs)| {
        let case = fx.case.fetch_add(1, Ordering::SeqCst);
        let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
        let mut now: i64 = 1_700_000_000_000;
        for (i, ((delta, cost), own)) in steps.into_iter().zip(own_costs).enumerate() {
            now += delta;
            let cost_a = cost.min(first.capacity());
            let cost_b = cost.min(second.capacity());
            let a = Limit::new("a", first, cost_a)
                .expect("valid")
                .with_shadow(shadows.0);
            let a = match own {
                Some(own) => a.with_cost(own),
                None => a,
            };
            let b = Limit::new("b", second, cost_b)
                .expect("valid")
                .with_shadow(shadows.1);
            let key_a = format!("case{case}:a");
            let key_b = format!("case{case}:b");
            let checks = [
                LimitCheck {
                    key: &key_a,
                    limit: &a,
                },
                LimitCheck {
                    key: &key_b,
                    limit: &b,
                },
            ];
            let expected = memory.check_at(now, &checks);
            let actual = fx
                .runtime
                .block_on(fx.store.check(&checks, Some(now)))
                .expect("redis");
            prop_assert_eq!(&actual, &expected, "step {} at {} (cost {})", i, now, cost);
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Admissions given back (a held request whose client left, a Cluster slot whose request another slot denied)
/// leave both stores in the same state: each step either checks a request or gives back the last admitted one,
/// on the window it was admitted in, possibly a while later.
#[test]
fn a_give_back_decides_alike_in_both_stores() {
    let fx = fixture();
    let config = ProptestConfig {
        cases: 64,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let inputs = (
        algorithm(),
        prop::collection::vec((steps(), any::<bool>()), 1..6),
    );
    let result = runner.run(&inputs, |(algorithm, rounds)| {
        let case = fx.case.fetch_add(1, Ordering::SeqCst);
        let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
        let key = format!("give-back{case}");
        let mut now: i64 = 1_700_000_000_000;
        let mut last_admitted: Option<(i64, Limit)> = None;
        for (steps, give_back) in rounds {
            for (delta, cost) in steps {
                now += delta;
                let limit =
                    Limit::new("g", algorithm, cost.min(algorithm.capacity())).expect("valid");
                let checks = [LimitCheck {
                    key: &key,
                    limit: &limit,
                }];
                let expected = memory.check_at(now, &checks);
                let actual = fx
                    .runtime
                    .block_on(fx.store.check(&checks, Some(now)))
                    .expect("redis");
                prop_assert_eq!(&actual, &expected, "at {}", now);
                if expected.allowed {
                    last_admitted = Some((now, limit));
                }
            }
            if let (true, Some((at, limit))) = (give_back, last_admitted.take()) {
                let checks = [LimitCheck {
                    key: &key,
                    limit: &limit,
                }];
                memory.give_back_at(now, at, &checks);
                fx.runtime
                    .block_on(fx.store.give_back(&checks, at, Some(now)))
                    .expect("redis");
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// A give-back on a `sliding_log` after its admission's entries have left the interval frees nothing: the entries
/// from its time on are then others' admitted since, and removing them would admit past the limit.
#[test]
fn a_give_back_after_its_entries_left_the_log_frees_nothing_in_either_store() {
    let fx = fixture();
    let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
    let log = Algorithm::SlidingLog {
        limit: 10,
        period_ms: 1_000,
    };
    let (whole, one) = (
        Limit::new("l", log, 10).expect("valid"),
        Limit::new("l", log, 1).expect("valid"),
    );
    let key = "late-give-back";
    let check = |limit: &Limit, now: i64| {
        let checks = [LimitCheck { key, limit }];
        let expected = memory.check_at(now, &checks);
        let actual = fx
            .runtime
            .block_on(fx.store.check(&checks, Some(now)))
            .expect("redis");
        assert_eq!(actual, expected, "at {now}");
        actual.allowed
    };
    let t0: i64 = 1_700_000_000_000;
    assert!(check(&whole, t0));
    // A period and a half later the first ten have left; ten more fill the log.
    assert!(check(&whole, t0 + 1_500));
    // The first request's answer comes back unused a moment later: nothing of it is left to give back.
    let checks = [LimitCheck { key, limit: &whole }];
    memory.give_back_at(t0 + 1_600, t0, &checks);
    fx.runtime
        .block_on(fx.store.give_back(&checks, t0, Some(t0 + 1_600)))
        .expect("redis");
    assert!(
        !check(&one, t0 + 1_600),
        "ten admitted in the last second already"
    );
    assert!(check(&one, t0 + 2_500), "once they leave");
}

/// Reservations settled after their answers leave both stores in the same state: each step reserves any amount
/// (zero, up to the capacity, or past it), and settles an earlier admitted reservation a while later for less
/// (given back), more (a debt, up to several capacities) or exactly what it reserved, on the window it landed in.
#[test]
fn reserve_and_settle_sequences_decide_alike_in_both_stores() {
    let fx = fixture();
    let config = ProptestConfig {
        cases: 96,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let step = (
        prop_oneof![Just(0i64), -50i64..0, 0i64..3_000],
        0u64..25,
        prop::option::of((0u64..70, any::<bool>())),
    );
    let inputs = (algorithm(), prop::collection::vec(step, 1..60));
    let result = runner.run(&inputs, |(algorithm, steps)| {
        let case = fx.case.fetch_add(1, Ordering::SeqCst);
        let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
        let key = format!("settle{case}");
        let base = Limit::new("s", algorithm, 1).expect("valid");
        let mut now: i64 = 1_700_000_000_000;
        let mut reserved: std::collections::VecDeque<(i64, u64)> = Default::default();
        for (i, (delta, cost, settle)) in steps.into_iter().enumerate() {
            now += delta;
            let limit = base.clone().with_cost(cost);
            let checks = [LimitCheck {
                key: &key,
                limit: &limit,
            }];
            let expected = memory.check_at(now, &checks);
            let actual = fx
                .runtime
                .block_on(fx.store.check(&checks, Some(now)))
                .expect("redis");
            prop_assert_eq!(&actual, &expected, "step {} at {} (cost {})", i, now, cost);
            if expected.allowed {
                reserved.push_back((now, cost));
            }
            // Settled later, in any order of the answers.
            let Some((used, newest)) = settle else {
                continue;
            };
            let taken = if newest {
                reserved.pop_back()
            } else {
                reserved.pop_front()
            };
            let Some((at, cost)) = taken else {
                continue;
            };
            let (amount, debt) = match used.cmp(&cost) {
                std::cmp::Ordering::Equal => continue,
                std::cmp::Ordering::Less => (cost - used, false),
                std::cmp::Ordering::Greater => (used - cost, true),
            };
            let limit = base.clone().with_cost(amount);
            let checks = [LimitCheck {
                key: &key,
                limit: &limit,
            }];
            if debt {
                memory.add_debts_at(now, at, &checks);
                fx.runtime
                    .block_on(fx.store.add_debts(&checks, at, Some(now)))
                    .expect("redis");
            } else {
                memory.give_back_at(now, at, &checks);
                fx.runtime
                    .block_on(fx.store.give_back(&checks, at, Some(now)))
                    .expect("redis");
            }
            let peek = base.clone().with_cost(0);
            let checks = [LimitCheck {
                key: &key,
                limit: &peek,
            }];
            let expected = memory.check_at(now, &checks);
            let actual = fx
                .runtime
                .block_on(fx.store.check(&checks, Some(now)))
                .expect("redis");
            prop_assert_eq!(
                &actual,
                &expected,
                "after settling {} for {} at {} (decided at {})",
                cost,
                used,
                now,
                at
            );
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// What a client is told of a request's `outcome` on a route of `limits`: its status and every rate-limit field
/// (`Retry-After`, `RateLimit`, `RateLimit-Policy`, `X-RateLimit-*` and the token fields), as the gateway writes
/// them.
fn told(limits: &LimitSet, outcome: &Outcome) -> (u16, Vec<(String, String)>) {
    let checked = Checked::of_every_limit(outcome.clone());
    let mut headers = HeaderMap::new();
    let status = if outcome.allowed {
        limits.decorate(&mut headers, &checked);
        StatusCode::OK
    } else {
        limits.decorate_refusal(&mut headers, &checked);
        limits.deny_status()
    };
    let mut fields: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| {
            let value = value.to_str().expect("ASCII fields").to_owned();
            (name.as_str().to_owned(), value)
        })
        .collect();
    fields.sort();
    (status.as_u16(), fields)
}

/// The over-limit cache answers what the store would have: a gateway on Redis remembers its denials in-process and
/// answers from them while they hold, the memory store (asked every time) is the reference. Each step reserves
/// any amount on a limit counting tokens, beside a limit counting requests, and may settle an earlier reservation
/// for less (a refund) or more (a debt); the cache is told of settlements as the limiter's settlements tell it.
/// Time only moves forward, as the cache's own (monotonic) clock does. Every step must tell the client the same:
/// status and fields, and the same decision for each limit (what the rate limit service reports of each).
#[test]
fn remembered_denials_tell_what_the_store_would() {
    let fx = fixture();
    let config = ProptestConfig {
        cases: 128,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    // Most requests reserve the route's usual amount (a client's `max_tokens`), some another.
    let step = (
        prop_oneof![Just(0i64), 0i64..3_000, 0i64..60_000],
        prop_oneof![3 => Just(None), 1 => (0u64..25).prop_map(Some)],
        prop::option::of((0u64..70, any::<bool>())),
    );
    // Some routes have the token limit alone: a denial of it is the whole answer.
    let inputs = (
        algorithm(),
        prop::option::of(algorithm()),
        0u64..25,
        prop::collection::vec(step, 1..60),
    );
    let result = runner.run(&inputs, |(tokens, requests, usual, steps)| {
        let case = fx.case.fetch_add(1, Ordering::SeqCst);
        let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
        let cache = DenyCache::default();
        let tok = Limit::new("tok", tokens, 1).expect("valid");
        let req = requests.map(|requests| Limit::new("req", requests, 1).expect("valid"));
        let by_ip = || KeySpec::new(vec![KeyPart::Ip], MissingKey::Ip);
        let mut settings =
            vec![LimitSettings::new(tok.clone(), by_ip())
                .counting(Counts::Tokens(TokenKind::Output))];
        settings.extend(
            req.iter()
                .map(|req| LimitSettings::new(req.clone(), by_ip())),
        );
        let limits =
            LimitSet::new("r", "", settings, StatusCode::TOO_MANY_REQUESTS).reserving_tokens();
        let (key_tok, key_req) = (format!("told{case}:tok"), format!("told{case}:req"));
        let mut now: i64 = 1_700_000_000_000;
        let mut reserved: std::collections::VecDeque<(i64, u64)> = Default::default();
        for (i, (delta, cost, settle)) in steps.into_iter().enumerate() {
            now += delta;
            let cost = cost.unwrap_or(usual);
            let reserving = tok.clone().with_cost(cost);
            let mut checks = vec![LimitCheck {
                key: &key_tok,
                limit: &reserving,
            }];
            checks.extend(req.iter().map(|limit| LimitCheck {
                key: &key_req,
                limit,
            }));
            let expected = memory.check_at(now, &checks);
            let actual = match cache.answer(&checks, now) {
                Some(remembered) => remembered,
                None => {
                    let outcome = fx
                        .runtime
                        .block_on(fx.store.check(&checks, Some(now)))
                        .expect("redis");
                    cache.learn(&checks, &outcome, now);
                    outcome
                }
            };
            prop_assert_eq!(
                told(&limits, &actual),
                told(&limits, &expected),
                "step {} at {} (reserving {})",
                i,
                now,
                cost
            );
            // What a key owes is the store's to tell (the admin API reads it there); no answer shows it.
            let owing_aside = |outcome: &Outcome| Outcome {
                decisions: (outcome.decisions.iter())
                    .map(|d| Decision { owed: 0, ..*d })
                    .collect(),
                ..outcome.clone()
            };
            prop_assert_eq!(
                owing_aside(&actual),
                owing_aside(&expected),
                "step {} at {}",
                i,
                now
            );
            if expected.allowed {
                reserved.push_back((now, cost));
            }
            let Some((used, newest)) = settle else {
                continue;
            };
            let taken = if newest {
                reserved.pop_back()
            } else {
                reserved.pop_front()
            };
            let Some((at, cost)) = taken else {
                continue;
            };
            let owed = tok.clone().with_cost(used.abs_diff(cost));
            let checks = [LimitCheck {
                key: &key_tok,
                limit: &owed,
            }];
            match used.cmp(&cost) {
                std::cmp::Ordering::Equal => continue,
                std::cmp::Ordering::Less => {
                    memory.give_back_at(now, at, &checks);
                    fx.runtime
                        .block_on(fx.store.give_back(&checks, at, Some(now)))
                        .expect("redis");
                }
                std::cmp::Ordering::Greater => {
                    memory.add_debts_at(now, at, &checks);
                    fx.runtime
                        .block_on(fx.store.add_debts(&checks, at, Some(now)))
                        .expect("redis");
                }
            }
            cache.settled(&key_tok);
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Parameters at and near the bounds both stores carry exactly (`MAX_SCALED`, `MAX_LOG_ENTRIES`): a value the
/// limit accepts is decided alike by both stores, one past a bound is refused (by the config and the admin API
/// alike, which both build limits through `Limit::new`).
fn bounded_algorithm() -> impl Strategy<Value = Algorithm> {
    let big = prop_oneof![
        Just(MAX_SCALED),
        Just(MAX_SCALED - 1),
        Just(MAX_SCALED / 3),
        Just(MAX_SCALED + 1),
        Just(u64::MAX),
        1u64..5_000,
    ];
    let rate = (big.clone(), big.clone()).prop_filter_map("positive", |(count, period_ms)| {
        Rate::new(count, period_ms).ok()
    });
    prop_oneof![
        (big.clone(), big.clone())
            .prop_map(|(limit, period_ms)| Algorithm::FixedWindow { limit, period_ms }),
        (big.clone(), big.clone())
            .prop_map(|(limit, period_ms)| Algorithm::SlidingWindow { limit, period_ms }),
        (
            prop_oneof![Just(MAX_LOG_ENTRIES), Just(MAX_LOG_ENTRIES + 1), 1u64..50],
            big.clone()
        )
            .prop_map(|(limit, period_ms)| Algorithm::SlidingLog { limit, period_ms }),
        (big.clone(), rate.clone()).prop_map(|(burst, rate)| Algorithm::Gcra { rate, burst }),
        (big, rate).prop_map(|(burst, rate)| Algorithm::TokenBucket { rate, burst }),
    ]
}

#[test]
fn limits_at_their_bounds_decide_alike_and_past_them_are_refused() {
    let fx = fixture();
    let config = ProptestConfig {
        cases: 64,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let inputs = (bounded_algorithm(), 1u64..4, steps());
    let result = runner.run(&inputs, |(algorithm, cost, steps)| {
        let case = fx.case.fetch_add(1, Ordering::SeqCst);
        let parameters = format!("{algorithm:?}");
        let past_a_bound = parameters
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u128>().ok())
            .any(|n| n > u128::from(MAX_SCALED))
            || matches!(algorithm, Algorithm::SlidingLog { limit, .. } if limit > MAX_LOG_ENTRIES);
        let limit = match Limit::new("b", algorithm, cost.min(algorithm.capacity())) {
            Ok(limit) => limit,
            Err(refused) => {
                // Refused for a bound, or for a product of in-range values that exact arithmetic cannot hold.
                prop_assert!(
                    past_a_bound || refused.to_string().contains("too large"),
                    "{} refused: {}",
                    parameters,
                    refused
                );
                return Ok(());
            }
        };
        prop_assert!(!past_a_bound, "{} accepted", parameters);
        let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
        let key = format!("bounds{case}");
        let checks = [LimitCheck {
            key: &key,
            limit: &limit,
        }];
        let mut now: i64 = 1_700_000_000_000;
        for (i, (delta, _)) in steps.into_iter().enumerate() {
            now += delta;
            let expected = memory.check_at(now, &checks);
            let actual = fx
                .runtime
                .block_on(fx.store.check(&checks, Some(now)))
                .expect("redis");
            prop_assert_eq!(&actual, &expected, "step {} at {}", i, now);
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Batches of requests at one timestamp, as the gateway coalesces concurrent requests: one script call for the
/// whole batch decides each request exactly as the in-process store does one after another, although the script
/// reads each key once per batch and writes it back once at the end.
#[test]
fn a_batch_decides_like_requests_one_after_another() {
    // Batches of 1 to 40 requests; each request checks two of three limits (so keys are shared within a batch
    // in varying combinations) with its own cost, which may be 0 or more than a limit holds.
    let batches = prop::collection::vec(
        (
            prop_oneof![Just(0i64), 0i64..3_000],
            prop::collection::vec((0usize..3, 0u64..6), 1..40),
        ),
        1..8,
    );
    decides_batches_like_one_after_another(64, batches);
}

/// One client's concurrent requests arrive as runs of identical requests, which the script decides in closed form
/// and the gateway replays: long runs that exhaust their limits mid-run, between other requests on the same keys.
#[test]
fn runs_of_identical_requests_decide_like_requests_one_after_another() {
    let batches = prop::collection::vec(
        (
            prop_oneof![Just(0i64), 0i64..3_000],
            // Cost 0 included: such requests are never joined into a run, but sent one by one.
            prop::collection::vec((0usize..3, 0u64..3, 1usize..25), 1..5).prop_map(|runs| {
                runs.into_iter()
                    .flat_map(|(first, cost, copies)| std::iter::repeat_n((first, cost), copies))
                    .collect::<Vec<_>>()
            }),
        ),
        1..8,
    );
    decides_batches_like_one_after_another(96, batches);
}

/// Sends each generated batch as one script call at its time and compares every outcome with the in-process
/// store's for the same requests one after another. A batch is `(time step, requests)`; request `(first, cost)`
/// checks limits `first` and `first + 1` (mod 3) of three random algorithms at `cost` (a reservation's: 0, or
/// more than the limit holds, are decided too), the second maybe in shadow mode.
fn decides_batches_like_one_after_another(
    cases: u32,
    batches: impl Strategy<Value = Vec<(i64, Vec<(usize, u64)>)>>,
) {
    let fx = fixture();
    let config = ProptestConfig {
        cases,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let inputs = (
        algorithm(),
        algorithm(),
        algorithm(),
        any::<bool>(),
        batches,
    );
    let result = runner.run(&inputs, |(x, y, z, shadow, batches)| {
        let case = fx.case.fetch_add(1, Ordering::SeqCst);
        let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
        let algorithms = [x, y, z];
        let keys: Vec<String> = (0..3).map(|i| format!("batch{case}:{i}")).collect();
        let mut now: i64 = 1_700_000_000_000;
        for (b, (delta, requests)) in batches.into_iter().enumerate() {
            now += delta;
            let limits: Vec<[Limit; 2]> = requests
                .iter()
                .map(|&(first, cost)| {
                    let pick = |i: usize, shadow: bool| {
                        let algorithm = algorithms[i % 3];
                        Limit::new(format!("l{}", i % 3), algorithm, 1)
                            .expect("valid")
                            .with_cost(cost)
                            .with_shadow(shadow)
                    };
                    [pick(first, false), pick(first + 1, shadow)]
                })
                .collect();
            let checks: Vec<[LimitCheck<'_>; 2]> = requests
                .iter()
                .zip(&limits)
                .map(|(&(first, _), [a, b])| {
                    [
                        LimitCheck {
                            key: &keys[first % 3],
                            limit: a,
                        },
                        LimitCheck {
                            key: &keys[(first + 1) % 3],
                            limit: b,
                        },
                    ]
                })
                .collect();
            let batch: Vec<&[LimitCheck<'_>]> = checks.iter().map(|c| c.as_slice()).collect();
            let actual = fx
                .runtime
                .block_on(fx.store.check_batch(&batch, Some(now)))
                .expect("redis");
            prop_assert_eq!(actual.len(), batch.len());
            for (j, (request, outcome)) in batch.iter().zip(&actual).enumerate() {
                let expected = memory.check_at(now, request);
                prop_assert_eq!(outcome, &expected, "batch {} request {} at {}", b, j, now);
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

#[test]
fn a_key_written_by_another_algorithm_starts_afresh() {
    // A limit whose algorithm changed in the config finds a key of another Redis type: never WRONGTYPE.
    let fx = fixture();
    let log = Limit::new(
        "l",
        Algorithm::SlidingLog {
            limit: 5,
            period_ms: 60_000,
        },
        1,
    )
    .expect("valid");
    let bucket = Limit::new(
        "l",
        Algorithm::TokenBucket {
            rate: Rate::new(1, 60_000).expect("rate"),
            burst: 3,
        },
        1,
    )
    .expect("valid");
    let gcra = Limit::new(
        "l",
        Algorithm::Gcra {
            rate: Rate::new(1, 60_000).expect("rate"),
            burst: 4,
        },
        1,
    )
    .expect("valid");
    let leaky = Limit::new(
        "l",
        Algorithm::LeakyBucket {
            rate: Rate::new(1, 60_000).expect("rate"),
            burst: 6,
            mode: LeakyMode::Reject,
        },
        1,
    )
    .expect("valid");
    let key = "changed-algorithm";
    let now = Some(1_700_000_000_000);
    // The bucket and the leaky meter both keep two integers: each must still see the other's as no state.
    let sequence = [
        (&log, 4),
        (&bucket, 2),
        (&gcra, 3),
        (&log, 4),
        (&leaky, 5),
        (&bucket, 2),
        (&leaky, 5),
    ];
    for (limit, remaining) in sequence {
        let outcome = fx
            .runtime
            .block_on(fx.store.check(&[LimitCheck { key, limit }], now))
            .expect("no WRONGTYPE");
        assert!(outcome.allowed);
        assert_eq!(
            outcome.decisions[0].remaining,
            remaining,
            "{}",
            limit.algorithm().name()
        );
    }
    // A counter left as a hash by an older tollgate starts afresh too.
    fx.redis.cli(&["DEL", key]);
    fx.redis.cli(&["HSET", key, "l", "0", "u", "1700000000000"]);
    let outcome = fx
        .runtime
        .block_on(fx.store.check(
            &[LimitCheck {
                key,
                limit: &bucket,
            }],
            now,
        ))
        .expect("no WRONGTYPE");
    assert_eq!(outcome.decisions[0].remaining, 2, "a fresh bucket of 3");
}

#[test]
fn a_token_bucket_an_earlier_build_wrote_is_read_as_it_stands_and_then_keeps_its_capacity() {
    // 0.2.0 wrote a bucket as its id, its level and the ms of its update (17 bytes); the capacity it was computed
    // under is kept since (25 bytes), so that a burst raised later gives its room at once.
    let fx = fixture();
    let now: i64 = 1_700_000_000_000;
    let rate = Rate::new(1, 60_000).expect("rate");
    let check = |burst: u64| {
        let limit = Limit::new("l", Algorithm::TokenBucket { rate, burst }, 1).expect("valid");
        fx.runtime
            .block_on(fx.store.check(
                &[LimitCheck {
                    key: "legacy:bucket",
                    limit: &limit,
                }],
                Some(now),
            ))
            .expect("decided")
    };
    // Two tokens of four left (120,000 scaled units).
    fx.redis.cli(&[
        "EVAL",
        "redis.call('SET', KEYS[1], struct.pack('<Bdd', 3, 120000, ARGV[1]))",
        "1",
        "legacy:bucket",
        &now.to_string(),
    ]);
    let outcome = check(4);
    assert!(outcome.allowed);
    assert_eq!(outcome.decisions[0].remaining, 1, "read as it stands");
    let length = fx.redis.cli(&["STRLEN", "legacy:bucket"]);
    assert_eq!(length.as_deref(), Some("25"), "rewritten with its capacity");
    // The burst raised from 4 to 10: the six new tokens are there at once (one left + 6, less this request).
    let outcome = check(10);
    assert!(outcome.allowed);
    assert_eq!(outcome.decisions[0].remaining, 6);
}

#[test]
fn a_counter_written_as_text_by_an_earlier_build_is_read_and_rewritten_binary() {
    // Earlier builds wrote counters as text (gcra's TAT still is); an upgrade must keep every client's state. Each key below says "2 of 4 used",
    // so the next request leaves 1 (a fresh key would leave 3).
    let fx = fixture();
    let now: i64 = 1_700_000_000_000;
    let window_start = now - now % 60_000;
    let rate = Rate::new(1, 60_000).expect("rate");
    // One token, or one emission interval, is 60,000 scaled units or ticks at this rate.
    let cases = [
        (
            Algorithm::FixedWindow {
                limit: 4,
                period_ms: 60_000,
            },
            format!("fw:{window_start}:2"),
            4,
        ),
        (
            Algorithm::SlidingWindow {
                limit: 4,
                period_ms: 60_000,
            },
            format!("sw:{window_start}:2:0"),
            1,
        ),
        (
            Algorithm::TokenBucket { rate, burst: 4 },
            format!("tb:120000:{now}"),
            3,
        ),
        (
            Algorithm::LeakyBucket {
                rate,
                burst: 4,
                mode: LeakyMode::Reject,
            },
            format!("lb:120000:{now}"),
            6,
        ),
    ];
    for (algorithm, text, id) in cases {
        let name = algorithm.name();
        let limit = Limit::new("l", algorithm, 1).expect("valid");
        let key = format!("legacy:{name}");
        fx.redis.cli(&["SET", &key, &text]);
        let outcome = fx
            .runtime
            .block_on(fx.store.check(
                &[LimitCheck {
                    key: &key,
                    limit: &limit,
                }],
                Some(now),
            ))
            .expect("decided");
        assert!(outcome.allowed, "{name}");
        assert_eq!(outcome.decisions[0].remaining, 1, "{name} read {text}");
        let first_byte = fx.redis.cli(&[
            "EVAL",
            "return string.byte(redis.call('GET', KEYS[1]))",
            "1",
            &key,
        ]);
        assert_eq!(first_byte, Some(id.to_string()), "{name} rewritten binary");
    }
}

/// A call reads at most 1,000 keys per MGET (Lua's C stack bounds `unpack`): a batch over 1,200 keys, whose
/// keys past the first thousand already hold state from an earlier call, decides as the in-process store does.
#[test]
fn a_batch_over_a_thousand_keys_reads_every_key() {
    let fx = fixture();
    let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
    let limits: Vec<Limit> = (0..4)
        .map(|i| {
            let algorithm = match i {
                0 => Algorithm::FixedWindow {
                    limit: 3,
                    period_ms: 60_000,
                },
                1 => Algorithm::TokenBucket {
                    rate: Rate::new(1, 60_000).expect("positive"),
                    burst: 3,
                },
                2 => Algorithm::SlidingWindow {
                    limit: 3,
                    period_ms: 60_000,
                },
                _ => Algorithm::Gcra {
                    rate: Rate::new(1, 60_000).expect("positive"),
                    burst: 3,
                },
            };
            Limit::new(format!("l{i}"), algorithm, 1).expect("valid")
        })
        .collect();
    // 300 clients, each with a key per limit: 1,200 keys in one call.
    let keys: Vec<Vec<String>> = (0..300)
        .map(|client| (0..4).map(|i| format!("wide:{client}:{i}")).collect())
        .collect();
    let checks: Vec<Vec<LimitCheck<'_>>> = keys
        .iter()
        .map(|client| {
            client
                .iter()
                .zip(&limits)
                .map(|(key, limit)| LimitCheck { key, limit })
                .collect()
        })
        .collect();
    let batch: Vec<&[LimitCheck<'_>]> = checks.iter().map(Vec::as_slice).collect();
    let now = 1_700_000_000_000;
    // Four calls of three requests each per key: the fourth is denied only if every earlier admission was read back.
    for round in 0..4 {
        let actual = fx
            .runtime
            .block_on(fx.store.check_batch(&batch, Some(now + round)))
            .expect("redis");
        assert_eq!(actual.len(), batch.len());
        for (client, (request, outcome)) in batch.iter().zip(&actual).enumerate() {
            let expected = memory.check_at(now + round, request);
            assert_eq!(outcome, &expected, "round {round}, client {client}");
            assert_eq!(outcome.allowed, round < 3, "round {round}, client {client}");
        }
    }
}
