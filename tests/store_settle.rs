//! Settling reservations on a real Redis: a debt or a refund one gateway settles is what another gateway sharing
//! the Redis sees, concurrent settlements go out together and each applies exactly once, and a settlement during an
//! outage is counted, follows `on_error` and holds nothing up.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::RedisCluster;
use common::eventually;
use common::redis::RedisServer;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tollgate::limiter::store::{LimitCheck, RedisStore, RedisTopology};
use tollgate::limiter::{
    Algorithm, Backend, DecidedBy, Limit, OnError, Rate, RateLimiter, Settlement, SystemClock,
};

/// How long a settlement may take to land on a loaded two-core machine.
const LANDS_WITHIN: Duration = Duration::from_secs(10);
const HOUR_MS: u64 = 3_600_000;

/// A gateway's limiter on `redis`, its metrics recorded by `recorder`.
async fn limiter(
    redis: &RedisServer,
    on_error: OnError,
    recorder: &PrometheusRecorder,
) -> RateLimiter {
    limiter_on(&redis.url(), on_error, recorder).await
}

/// A gateway's limiter on the Redis at `url`, its metrics recorded by `recorder`.
async fn limiter_on(url: &str, on_error: OnError, recorder: &PrometheusRecorder) -> RateLimiter {
    let store = RedisStore::connect(url, 1, Duration::from_millis(500)).expect("connect");
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    metrics::with_local_recorder(recorder, || {
        RateLimiter::new(
            Backend::Redis(store),
            Duration::from_millis(500),
            on_error,
            1_000,
            Arc::new(SystemClock),
        )
    })
}

/// A token bucket of `burst` that refills one token an hour: within a test, its level is what was taken, given
/// back and owed, give or take a fraction of a token.
fn slow_bucket(burst: u64) -> Limit {
    let rate = Rate::new(1, HOUR_MS).expect("positive");
    Limit::new("tokens", Algorithm::TokenBucket { rate, burst }, 1).expect("valid")
}

/// Reserves `cost` on `key` through `limiter`: admitted, decided by the store.
async fn reserve(limiter: &RateLimiter, key: &str, limit: &Limit, cost: u64) -> (Limit, Instant) {
    let reserved = limit.clone().with_cost(cost);
    let checks = [LimitCheck {
        key,
        limit: &reserved,
    }];
    let (outcome, by) = limiter.check_leased(&checks, 0).await.expect("decided");
    assert!(outcome.allowed, "{outcome:?}");
    assert_eq!(by, DecidedBy::Store);
    (reserved, Instant::now())
}

/// Settles what `reserved` (its cost) took on `key` at `decided`, decided by `limiter`'s store, at `actual`.
fn settle(limiter: &RateLimiter, key: &str, reserved: Limit, actual: u64, decided: Instant) {
    let settlement = Settlement {
        key: key.to_owned(),
        limit: reserved,
        actual,
    };
    limiter
        .giver(DecidedBy::Store)
        .settle(vec![settlement], decided);
}

/// What a request of `cost` on `key` would get from `limiter` now, consuming nothing.
async fn peek(
    limiter: &RateLimiter,
    key: &str,
    limit: &Limit,
    cost: u64,
) -> tollgate::limiter::Decision {
    let limit = limit.clone().with_cost(cost);
    limiter
        .peek(LimitCheck { key, limit: &limit })
        .await
        .expect("peeked")
}

/// `name`'s value in what `recorder` renders, 0 when absent.
fn counter(recorder: &PrometheusRecorder, name: &str) -> f64 {
    recorder
        .handle()
        .render()
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_or_a_refund_settled_by_one_gateway_is_what_another_sees() {
    let redis = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let first = limiter(&redis, OnError::Deny, &recorder).await;
    let second = limiter(&redis, OnError::Deny, &recorder).await;
    let bucket = slow_bucket(10);

    // Reserved 5, spent 13: 8 owed, 3 tokens below empty.
    let (reserved, decided) = reserve(&first, "owing", &bucket, 5).await;
    settle(&first, "owing", reserved, 13, decided);
    let landed = eventually(LANDS_WITHIN, async || {
        !peek(&second, "owing", &bucket, 0).await.allowed
    })
    .await;
    assert!(landed.is_some(), "the debt never reached the other gateway");
    // Nothing is admitted, not even a request of no cost, until three hours of refill have paid the debt.
    let waits = peek(&second, "owing", &bucket, 0).await.retry_after_ms;
    assert!(
        (3 * HOUR_MS - 60_000..=3 * HOUR_MS).contains(&waits),
        "waits {waits} ms"
    );

    // Reserved the whole bucket, spent 3: 7 given back, and no more.
    let (reserved, decided) = reserve(&first, "refunded", &bucket, 10).await;
    settle(&first, "refunded", reserved, 3, decided);
    let landed = eventually(LANDS_WITHIN, async || {
        peek(&second, "refunded", &bucket, 7).await.allowed
    })
    .await;
    assert!(
        landed.is_some(),
        "the refund never reached the other gateway"
    );
    assert!(!peek(&second, "refunded", &bucket, 8).await.allowed);
    assert_eq!(counter(&recorder, "tollgate_settlements_failed_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settlements_go_out_together_and_each_applies_exactly_once() {
    const REQUESTS: u64 = 200;
    let redis = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let limiter = Arc::new(limiter(&redis, OnError::Deny, &recorder).await);
    let bucket = slow_bucket(1_000);
    let mut reservations = Vec::new();
    for _ in 0..REQUESTS {
        reservations.push(reserve(&limiter, "shared", &bucket, 2).await);
    }
    assert_eq!(
        peek(&limiter, "shared", &bucket, 0).await.remaining,
        1_000 - 2 * REQUESTS
    );
    let (calls_before, started) = (redis.command_calls("evalsha"), Instant::now());
    // Each answer spent 0 to 4 of its 2: given back, owed, or settled as reserved.
    let spent: Vec<u64> = (0..REQUESTS).map(|i| i % 5).collect();
    let settling: Vec<_> = reservations
        .into_iter()
        .zip(&spent)
        .map(|((reserved, decided), &actual)| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { settle(&limiter, "shared", reserved, actual, decided) })
        })
        .collect();
    for task in settling {
        task.await.expect("settled");
    }
    let expected = 1_000 - spent.iter().sum::<u64>();
    let mut peeks = 1;
    let landed = eventually(LANDS_WITHIN, async || {
        peeks += 1;
        peek(&limiter, "shared", &bucket, 0).await.remaining == expected
    })
    .await;
    let remaining = peek(&limiter, "shared", &bucket, 0).await.remaining;
    assert!(landed.is_some(), "{remaining} left, {expected} expected");
    // 160 settlements differ from their reservation (the other 40 cost no call): far fewer calls than that. Not
    // theirs: the peeks, and the limiter's health check (the same script, once a second).
    let health_checks = started.elapsed().as_secs() + 1;
    let calls =
        (redis.command_calls("evalsha") - calls_before).saturating_sub(peeks + health_checks);
    assert!(calls < 100, "{calls} script calls");
    assert_eq!(counter(&recorder, "tollgate_settlements_failed_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_while_redis_is_down_is_counted_follows_on_error_and_holds_nothing_up() {
    let mut redis = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let local = limiter(&redis, OnError::Local, &recorder).await;
    let allow = limiter(&redis, OnError::Allow, &recorder).await;
    let bucket = slow_bucket(10);
    let (on_local, local_decided) = reserve(&local, "down", &bucket, 5).await;
    let (on_allow, allow_decided) = reserve(&allow, "down", &bucket, 5).await;
    redis.kill();

    let started = Instant::now();
    for (limiter, reserved, decided) in [
        (&local, on_local, local_decided),
        (&allow, on_allow, allow_decided),
    ] {
        settle(limiter, "down", reserved, 13, decided);
    }
    // Handed off: settling waits for nothing.
    assert!(started.elapsed() < Duration::from_secs(1));
    let counted = eventually(LANDS_WITHIN, async || {
        counter(&recorder, "tollgate_settlements_failed_total") == 2.0
    })
    .await;
    assert!(counted.is_some(), "both failures counted");
    // Under `local` the fallback owes the debt (from a full bucket: it had not seen the reservation); under
    // `allow` it was dropped.
    let owing = bucket.clone().with_cost(3);
    let check = LimitCheck {
        key: "down",
        limit: &owing,
    };
    assert!(!local.local().peek(check).allowed);
    assert!(allow.local().peek(check).allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster_a_settlement_lands_in_every_slot_its_limits_are_in() {
    let cluster = RedisCluster::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let first = limiter_on(&cluster.url(), OnError::Deny, &recorder).await;
    let second = limiter_on(&cluster.url(), OnError::Deny, &recorder).await;
    let Backend::Redis(store) = first.backend() else {
        panic!("a redis limiter");
    };
    assert_eq!(store.topology(), RedisTopology::Cluster);
    let bucket = slow_bucket(10);
    // Hash tags on different nodes: one call per slot, in the batches of each.
    let keys = ["t:tokens:{alpha}", "t:tokens:{spread}"];
    let reserved = bucket.clone().with_cost(5);
    let checks = keys.map(|key| LimitCheck {
        key,
        limit: &reserved,
    });
    let (outcome, by) = first.check_leased(&checks, 0).await.expect("decided");
    assert!(outcome.allowed && by == DecidedBy::Store, "{outcome:?}");
    let decided = Instant::now();
    // One owes 8, the other gives 4 back.
    let settlements = vec![
        Settlement {
            key: keys[0].to_owned(),
            limit: reserved.clone(),
            actual: 13,
        },
        Settlement {
            key: keys[1].to_owned(),
            limit: reserved.clone(),
            actual: 1,
        },
    ];
    first.giver(DecidedBy::Store).settle(settlements, decided);
    let landed = eventually(LANDS_WITHIN, async || {
        !peek(&second, keys[0], &bucket, 0).await.allowed
            && peek(&second, keys[1], &bucket, 9).await.allowed
    })
    .await;
    assert!(landed.is_some(), "both slots settled");
    assert!(!peek(&second, keys[1], &bucket, 10).await.allowed);
    assert_eq!(counter(&recorder, "tollgate_settlements_failed_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_and_give_backs_are_queued_with_the_checks_without_a_task_each() {
    const ANSWERS: u64 = 100;
    let redis = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let limiter = limiter(&redis, OnError::Deny, &recorder).await;
    let bucket = slow_bucket(1_000);
    let mut reservations = Vec::new();
    for _ in 0..ANSWERS {
        reservations.push(reserve(&limiter, "queued", &bucket, 4).await);
    }
    // Frozen, Redis answers nothing: work that waits for it stays alive meanwhile.
    redis.pause();
    let runtime = tokio::runtime::Handle::current().metrics();
    let alive_before = runtime.num_alive_tasks();
    for (i, (reserved, decided)) in reservations.into_iter().enumerate() {
        if i % 2 == 0 {
            // An answer whose status a limit does not count: its place is given back whole.
            let taken = vec![("queued".to_owned(), reserved)];
            limiter.giver(DecidedBy::Store).give_back(taken, decided);
        } else {
            settle(&limiter, "queued", reserved, 1, decided);
        }
    }
    let alive = runtime.num_alive_tasks();
    redis.resume();
    // The batcher's one call in flight, give or take the client's own: not one task per answer.
    assert!(
        alive <= alive_before + 5,
        "{alive_before} tasks alive before {ANSWERS} answers ended, {alive} after"
    );
    // Each landed once: 50 gave 4 back, 50 gave 3 back, 50 x 1 spent.
    let landed = eventually(LANDS_WITHIN, async || {
        peek(&limiter, "queued", &bucket, 0).await.remaining == 1_000 - 50
    })
    .await;
    let remaining = peek(&limiter, "queued", &bucket, 0).await.remaining;
    assert!(landed.is_some(), "{remaining} left");
    assert_eq!(counter(&recorder, "tollgate_settlements_failed_total"), 0.0);
}

/// Whether `limiter` gives one more slot of `slots` on `key` (held under a lease of its own from then on).
async fn takes_a_slot(limiter: &RateLimiter, key: &str, slots: &Limit) -> bool {
    let checks = [LimitCheck { key, limit: slots }];
    let (outcome, _) = limiter
        .check_leased(&checks, limiter.new_lease())
        .await
        .expect("decided");
    outcome.allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_releases_are_queued_with_the_checks_without_a_task_each() {
    const REQUESTS: u64 = 100;
    let redis = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let limiter = limiter(&redis, OnError::Deny, &recorder).await;
    let slots = Limit::new(
        "in-flight",
        Algorithm::Concurrency {
            max: REQUESTS,
            lease_ms: 30_000,
            queue: None,
        },
        1,
    )
    .expect("valid");
    let mut leases = Vec::new();
    for _ in 0..REQUESTS {
        let lease = limiter.new_lease();
        let checks = [LimitCheck {
            key: "slots",
            limit: &slots,
        }];
        let (outcome, _) = limiter.check_leased(&checks, lease).await.expect("decided");
        assert!(outcome.allowed, "{outcome:?}");
        leases.push(lease);
    }
    assert!(
        !takes_a_slot(&limiter, "slots", &slots).await,
        "every slot is held"
    );
    // Frozen, Redis answers nothing: work that waits for it stays alive meanwhile.
    redis.pause();
    let runtime = tokio::runtime::Handle::current().metrics();
    let alive_before = runtime.num_alive_tasks();
    for lease in leases {
        let held = vec![("slots".to_owned(), slots.clone())];
        limiter.giver(DecidedBy::Store).release_slots(held, lease);
    }
    let alive = runtime.num_alive_tasks();
    redis.resume();
    assert!(
        alive <= alive_before + 5,
        "{alive_before} tasks alive before {REQUESTS} requests ended, {alive} after"
    );
    // Every release landed: the key gives its `max` slots again, and not one more.
    let freed = eventually(LANDS_WITHIN, async || {
        takes_a_slot(&limiter, "slots", &slots).await
    })
    .await;
    assert!(freed.is_some(), "no slot came back");
    for taken in 1..REQUESTS {
        assert!(
            takes_a_slot(&limiter, "slots", &slots).await,
            "slot {taken} of the released"
        );
    }
    assert!(
        !takes_a_slot(&limiter, "slots", &slots).await,
        "more than max"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_memory_store_a_settlement_applies_at_once() {
    let limiter = RateLimiter::new(
        Backend::Memory,
        Duration::from_millis(500),
        OnError::Deny,
        1_000,
        Arc::new(SystemClock),
    );
    let bucket = slow_bucket(10);
    let (reserved, decided) = reserve(&limiter, "owing", &bucket, 5).await;
    settle(&limiter, "owing", reserved, 13, decided);
    // Applied by the answer's end itself: no task, no store call to wait for.
    assert!(!peek(&limiter, "owing", &bucket, 0).await.allowed);
    let waits = peek(&limiter, "owing", &bucket, 0).await.retry_after_ms;
    assert!(
        (3 * HOUR_MS - 60_000..=3 * HOUR_MS).contains(&waits),
        "waits {waits} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_lifts_the_denial_this_gateway_remembers() {
    let redis = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let limiter = limiter(&redis, OnError::Deny, &recorder).await;
    let other = limiter_on(&redis.url(), OnError::Deny, &recorder).await;
    let bucket = slow_bucket(10);
    // The limiter hears other instances' resets once its subscriber is connected, and forgets every denial it
    // remembers when that connection is made: wait until it hears one, so that it remembers from then on.
    let full = bucket.clone().with_cost(10);
    let probe = [LimitCheck {
        key: "probe",
        limit: &full,
    }];
    let denials_kept = eventually(LANDS_WITHIN, async || {
        limiter.check(&probe).await.expect("decided");
        limiter.check(&probe).await.expect("decided");
        other.reset("probe").await.expect("reset");
        let before = redis.command_calls("evalsha");
        limiter.check(&probe).await.expect("decided");
        // Asked of Redis again: the reset was heard.
        redis.command_calls("evalsha") > before
    })
    .await;
    assert!(denials_kept.is_some(), "resets are heard");
    let (reserved, decided) = reserve(&limiter, "remembered", &bucket, 10).await;
    // Denied for hours, and remembered so until then: answered without a script call.
    let five = bucket.clone().with_cost(5);
    let checks = [LimitCheck {
        key: "remembered",
        limit: &five,
    }];
    let denied = limiter.check(&checks).await.expect("decided");
    assert!(!denied.allowed && denied.decisions[0].retry_after_ms > HOUR_MS);
    // (The store's health check is a script call too, once a second: whichever comes between is not the check's.)
    let remembered = eventually(LANDS_WITHIN, async || {
        let before = redis.command_calls("evalsha");
        let outcome = limiter.check(&checks).await.expect("decided");
        !outcome.allowed && redis.command_calls("evalsha") == before
    })
    .await;
    assert!(remembered.is_some(), "the denial is remembered");
    // The answer spent 2 of the 10: 8 come back, and the next request of 5 is admitted.
    settle(&limiter, "remembered", reserved, 2, decided);
    let admitted = eventually(LANDS_WITHIN, async || {
        limiter.check(&checks).await.expect("decided").allowed
    })
    .await;
    assert!(
        admitted.is_some(),
        "the refund was answered by the remembered denial"
    );
}

/// The promise of settling: over two gateways sharing Redis, what the admitted requests spent never exceeds the
/// limit by more than what they spent beyond their reservations, however their checks and settlements interleave;
/// and every settlement lands once (the bucket ends where the spending says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_admitted_requests_spend_exceeds_the_limit_by_their_underestimates_at_most() {
    const BURST: u64 = 1_000;
    let redis = RedisServer::start();
    let recorder = PrometheusBuilder::new().build_recorder();
    let gateways = Arc::new([
        limiter(&redis, OnError::Deny, &recorder).await,
        limiter(&redis, OnError::Deny, &recorder).await,
    ]);
    let bucket = slow_bucket(BURST);
    // Each request reserves 1 to 40 and spends from nothing to a little more than that; several rounds, so
    // that refunds make room for later requests while others are still in flight.
    let tasks: Vec<_> = (0..240u64)
        .map(|i| {
            let gateways = Arc::clone(&gateways);
            let bucket = bucket.clone();
            tokio::spawn(async move {
                let gateway = &gateways[(i % 2) as usize];
                let reserved = bucket.clone().with_cost(1 + i * 7 % 40);
                let checks = [LimitCheck {
                    key: "budget",
                    limit: &reserved,
                }];
                let (outcome, by) = gateway.check_leased(&checks, 0).await.expect("decided");
                if !outcome.allowed {
                    return None;
                }
                let actual = match i % 4 {
                    0 => reserved.cost() + i % 3,
                    1 => reserved.cost() / 2,
                    2 => 0,
                    _ => reserved.cost(),
                };
                let over = actual.saturating_sub(reserved.cost());
                let settlement = Settlement {
                    key: "budget".to_owned(),
                    limit: reserved,
                    actual,
                };
                gateway.giver(by).settle(vec![settlement], Instant::now());
                Some((actual, over))
            })
        })
        .collect();
    let (mut spent, mut underestimated) = (0, 0);
    for task in tasks {
        if let Some((actual, over)) = task.await.expect("task") {
            spent += actual;
            underestimated += over;
        }
    }
    assert!(spent > 0);
    // One token refills in an hour: none within the test.
    assert!(
        spent <= BURST + underestimated,
        "spent {spent}, underestimates {underestimated}"
    );
    let expected = BURST.saturating_sub(spent);
    let landed = eventually(LANDS_WITHIN, async || {
        peek(&gateways[0], "budget", &bucket, 0).await.remaining == expected
    })
    .await;
    let remaining = peek(&gateways[0], "budget", &bucket, 0).await.remaining;
    assert!(
        landed.is_some(),
        "{remaining} left, {expected} expected (spent {spent})"
    );
}
