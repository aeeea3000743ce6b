//! The in-process store's own tests: denials consume nothing, and a full store displaces only what it may.

use super::*;
use crate::{Algorithm, Limit, ManualClock};

fn log_limit(name: &str, limit: u64) -> Limit {
    Limit::new(
        name,
        Algorithm::SlidingLog {
            limit,
            period_ms: 60_000,
        },
        1,
    )
    .unwrap()
}

#[test]
fn denied_request_consumes_from_no_limit() {
    let store = MemoryStore::new(1000, Arc::new(ManualClock::new(0)));
    let wide = log_limit("wide", 10);
    let narrow = log_limit("narrow", 2);
    let checks = [
        LimitCheck {
            key: "w",
            limit: &wide,
        },
        LimitCheck {
            key: "n",
            limit: &narrow,
        },
    ];
    let admitted = (0..5).filter(|_| store.check(&checks).allowed).count();
    assert_eq!(admitted, 2);
    let only_wide = [LimitCheck {
        key: "w",
        limit: &wide,
    }];
    let outcome = store.check(&only_wide);
    assert_eq!(
        outcome.decisions[0].remaining, 7,
        "3 denied requests took nothing from 'wide'"
    );
}

#[test]
fn a_key_moved_by_another_key_making_room_is_stored_under_its_own_name() {
    // Two keys a shard: `a` stored first (so it expires first), then `c`; a request on `b` and `a`, all
    // three in one shard, makes room for `b` by evicting `a`, which moves `c` to where `a` was found.
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(2 * SHARDS, clock.clone());
    let mut same_shard = (0..).map(|i| format!("k{i}"));
    let first = same_shard.next().expect("a key");
    let shard = store.key_ref(&first).shard();
    let mut keys = vec![first];
    keys.extend(
        same_shard
            .filter(|k| store.key_ref(k).shard() == shard)
            .take(2),
    );
    let (a, c, b) = (&keys[0], &keys[1], &keys[2]);
    let limit = log_limit("l", 10);
    fn on<'a>(key: &'a str, limit: &'a Limit) -> LimitCheck<'a> {
        LimitCheck { key, limit }
    }
    let check = |key| on(key, &limit);
    for _ in 0..3 {
        assert!(store.check(&[check(a)]).allowed);
    }
    clock.advance(1);
    assert!(store.check(&[check(c)]).allowed);
    clock.advance(1);

    assert!(store.check(&[check(b), check(a)]).allowed);

    assert_eq!(
        store.peek(check(a)).remaining,
        6,
        "a keeps its own count: 4 taken"
    );
    // Which of b and c made room for a depends on the eviction's random sample; neither may hold a's count.
    for (name, key) in [("b", b), ("c", c)] {
        let remaining = store.peek(check(key)).remaining;
        assert!(
            remaining == 9 || remaining == 10,
            "{name} holds its own count or nothing, not a's: {remaining}"
        );
    }
}

/// `n` keys that all fall in one shard of `store`.
fn same_shard_keys(store: &MemoryStore, n: usize) -> Vec<String> {
    let mut names = (0..).map(|i| format!("k{i}"));
    let first = names.next().expect("a key");
    let shard = store.key_ref(&first).shard();
    let mut keys = vec![first];
    keys.extend(
        names
            .filter(|k| store.key_ref(k).shard() == shard)
            .take(n - 1),
    );
    keys
}

fn on<'a>(key: &'a str, limit: &'a Limit) -> LimitCheck<'a> {
    LimitCheck { key, limit }
}

#[test]
fn a_flood_of_new_keys_never_frees_a_key_over_its_limit() {
    // The attack: a 30 s sliding_log at its limit, then 20,000 new keys through a store of 10,000.
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = MemoryStore::new(10_000, clock.clone());
    let limit = Limit::new(
        "l",
        Algorithm::SlidingLog {
            limit: 50,
            period_ms: 30_000,
        },
        1,
    )
    .unwrap();
    let admitted = (0..60)
        .filter(|_| store.check(&[on("victim", &limit)]).allowed)
        .count();
    assert_eq!(admitted, 50);
    for i in 0..20_000 {
        let key = format!("flood{i}");
        assert!(store.check(&[on(&key, &limit)]).allowed, "{key}");
        if i % 1000 == 0 {
            clock.advance(1);
        }
    }
    assert!(store.len() <= 10_000 + SHARDS, "{} keys", store.len());
    let after = (0..20)
        .filter(|_| store.check(&[on("victim", &limit)]).allowed)
        .count();
    assert_eq!(after, 0, "the victim key is still at its limit");
    clock.advance(30_000);
    assert!(
        store.check(&[on("victim", &limit)]).allowed,
        "until its retry time"
    );
}

#[test]
fn a_key_back_to_full_is_displaced_before_the_least_recently_used() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(2 * SHARDS, clock.clone());
    let keys = same_shard_keys(&store, 3);
    let short = log_limit("short", 10);
    let long = Limit::new(
        "long",
        Algorithm::SlidingLog {
            limit: 10,
            period_ms: 600_000,
        },
        1,
    )
    .unwrap();
    // `old` is the least recently used but still counts; `full` is used later and back to full at 60 s.
    assert!(store.check(&[on(&keys[0], &long)]).allowed);
    clock.advance(1_000);
    assert!(store.check(&[on(&keys[1], &short)]).allowed);
    clock.advance(60_000);

    assert!(store.check(&[on(&keys[2], &short)]).allowed);

    assert_eq!(store.peek(on(&keys[0], &long)).remaining, 9, "kept");
    assert_eq!(store.len(), 2);
}

#[test]
fn the_least_recently_used_key_not_over_its_limit_is_displaced() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(2 * SHARDS, clock.clone());
    let keys = same_shard_keys(&store, 3);
    let limit = log_limit("l", 10);
    assert!(store.check(&[on(&keys[0], &limit)]).allowed);
    clock.advance(1);
    assert!(store.check(&[on(&keys[1], &limit)]).allowed);
    clock.advance(1);
    // Used again: now the most recently used.
    assert!(store.check(&[on(&keys[0], &limit)]).allowed);
    clock.advance(1);

    assert!(store.check(&[on(&keys[2], &limit)]).allowed);

    assert_eq!(store.peek(on(&keys[0], &limit)).remaining, 8, "kept");
    assert_eq!(store.peek(on(&keys[1], &limit)).remaining, 10, "displaced");
    assert_eq!(store.peek(on(&keys[2], &limit)).remaining, 9);
}

#[test]
fn with_only_keys_over_their_limit_a_new_key_is_refused_until_one_is_back_to_full() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(SHARDS, clock.clone());
    let keys = same_shard_keys(&store, 2);
    let limit = log_limit("l", 1);
    assert!(store.check(&[on(&keys[0], &limit)]).allowed);
    clock.advance(10_000);

    let refused = store.check(&[on(&keys[1], &limit)]);
    assert!(!refused.allowed);
    assert_eq!(refused.decisions[0].remaining, 0);
    assert_eq!(
        refused.decisions[0].retry_after_ms, 50_000,
        "until the held key is back to full"
    );
    assert!(!store.check(&[on(&keys[0], &limit)]).allowed, "still held");

    store.set_when_full(WhenFull::Allow);
    assert!(store.check(&[on(&keys[1], &limit)]).allowed, "admitted");
    assert!(
        store.check(&[on(&keys[1], &limit)]).allowed,
        "but not counted: nowhere to keep it"
    );
    assert!(!store.check(&[on(&keys[0], &limit)]).allowed, "still held");

    store.set_when_full(WhenFull::Deny);
    clock.advance(50_000);
    assert!(store.check(&[on(&keys[1], &limit)]).allowed);
    assert!(!store.check(&[on(&keys[1], &limit)]).allowed, "now counted");
}

#[test]
fn a_request_refused_for_room_consumes_from_no_limit() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(SHARDS, clock.clone());
    let keys = same_shard_keys(&store, 2);
    // A key in another shard, which has room: keys hash with a per-process seed, so a fixed name would share
    // the full shard once in SHARDS runs.
    let full_shard = store.key_ref(&keys[0]).shard();
    let elsewhere = (0..)
        .map(|i| format!("elsewhere{i}"))
        .find(|k| store.key_ref(k).shard() != full_shard)
        .expect("a key in another shard");
    let one = log_limit("one", 1);
    let wide = log_limit("wide", 10);
    assert!(store.check(&[on(&keys[0], &one)]).allowed);
    let outcome = store.check(&[on(&elsewhere, &wide), on(&keys[1], &one)]);
    assert!(!outcome.allowed);
    assert!(outcome.decisions[0].allowed);
    assert_eq!(store.peek(on(&elsewhere, &wide)).remaining, 10);
}

#[test]
fn keys_expire_and_the_store_stays_bounded() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(640, clock.clone());
    let limit = log_limit("l", 1);
    for i in 0..10_000 {
        let key = format!("k{i}");
        store.check(&[LimitCheck {
            key: &key,
            limit: &limit,
        }]);
    }
    assert!(store.len() <= 640, "{} keys", store.len());
    clock.advance(60_000);
    store.purge_expired();
    assert!(store.is_empty());
}

#[test]
fn one_limit_cannot_take_the_store_from_the_others() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(4 * SHARDS, clock.clone());
    store.set_max_keys_per_limit(SHARDS);
    // Keys over their limit after one request: none may be displaced before its minute is up.
    let greedy = log_limit("greedy", 1);
    let mut refused = 0;
    for i in 0..4 * SHARDS {
        let key = format!("t:r:greedy:{{k{i}}}");
        if !store.check(&[on(&key, &greedy)]).allowed {
            refused += 1;
        }
    }
    assert!(refused >= SHARDS, "{refused} greedy keys refused");
    assert!(
        store.len() <= SHARDS,
        "{} keys held by one limit",
        store.len()
    );
    // Every other limit goes on: its new keys find room beside the greedy limit's share.
    let other = log_limit("other", 100);
    for i in 0..8 * SHARDS {
        let key = format!("t:r:other:{{k{i}}}");
        assert!(store.check(&[on(&key, &other)]).allowed, "{key}");
    }
    // Once a greedy key is back to full, the greedy limit's new keys have room again.
    clock.advance(61_000);
    assert!(store.check(&[on("t:r:greedy:{late}", &greedy)]).allowed);
}
