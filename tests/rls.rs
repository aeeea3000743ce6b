//! Envoy's rate limit service (docs/envoy.md): requests built as Envoy builds them, sent with a gRPC client to
//! tollgate instances sharing one Redis. Fixed windows here are an hour or a day long: they are aligned on the
//! clock, and a minute's boundary falling inside a test would start its counts afresh.

mod common;

use std::path::Path;

use common::redis::RedisServer;
use common::rls::{
    ask, descriptor, descriptor_taking, header, is_ok, request, start_rls, start_rls_with,
};
use common::ReservedPort;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

/// A config on `redis` with `rls` (the lines under `rls:`, indented by two spaces).
fn on_redis(redis: &RedisServer, rls: &str) -> String {
    format!(
        "store:\n  backend: redis\n  url: {}\n  timeout: 500ms\n  on_error: deny\nrls:\n  listen: 127.0.0.1:0\n{rls}",
        redis.url()
    )
}

/// One domain `edge` with a descriptor `generic_key=<algorithm>` per algorithm, each admitting exactly 4 in the
/// test's time (buckets refill far slower than the test runs; the windows last 20000 days, from 2024-10-04 to
/// 2079-07-08 on Redis's clock).
const EVERY_ALGORITHM: &str = r#"  domains:
    edge:
      descriptors:
        - { key: generic_key, value: fixed_window, limits: [ { name: l, algorithm: fixed_window, limit: 4, period: 20000d } ] }
        - { key: generic_key, value: sliding_window, limits: [ { name: l, algorithm: sliding_window, limit: 4, period: 20000d } ] }
        - { key: generic_key, value: sliding_log, limits: [ { name: l, algorithm: sliding_log, limit: 4, period: 1h } ] }
        - { key: generic_key, value: token_bucket, limits: [ { name: l, algorithm: token_bucket, rate: 1/1h, burst: 4 } ] }
        - { key: generic_key, value: gcra, limits: [ { name: l, algorithm: gcra, rate: 1/1h, burst: 4 } ] }
        - { key: generic_key, value: leaky_bucket, limits: [ { name: l, algorithm: leaky_bucket, rate: 1/1h, burst: 4 } ] }
"#;

#[tokio::test]
async fn every_algorithm_admits_exactly_its_capacity_across_two_instances() {
    let redis = RedisServer::start();
    let yaml = on_redis(&redis, EVERY_ALGORITHM);
    let (a, b) = (start_rls(&yaml).await, start_rls(&yaml).await);
    let mut clients = [a.client().await, b.client().await];
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
        "leaky_bucket",
    ] {
        let mut admitted = 0;
        for i in 0..10 {
            let client = &mut clients[i % 2];
            let answer = ask(
                client,
                request("edge", vec![descriptor(&[("generic_key", algorithm)])]),
            )
            .await;
            assert_eq!(answer.statuses.len(), 1);
            if is_ok(&answer) {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 4, "{algorithm}: admitted across both instances");
    }
}

/// Per client address 3 a minute (a sliding log); per address on the login path 1 a minute; by a header Envoy
/// matched, 2 in a window of 20000 days (which no test outlives).
const EDGE: &str = r#"  domains:
    edge:
      descriptors:
        - key: remote_address
          limits: [ { name: per-ip, algorithm: sliding_log, limit: 3, period: 1m } ]
        - key: generic_key
          value: login
          descriptors:
            - key: remote_address
              limits: [ { name: login, algorithm: gcra, rate: 1/1m, burst: 1 } ]
        - key: header_match
          value: api-key
          limits: [ { name: keyed, algorithm: fixed_window, limit: 2, period: 20000d } ]
"#;

#[tokio::test]
async fn each_descriptor_gets_its_status_and_a_refusal_takes_from_none() {
    let redis = RedisServer::start();
    let rls = start_rls(&on_redis(&redis, EDGE)).await;
    let mut client = rls.client().await;
    let login = || {
        request(
            "edge",
            vec![
                descriptor(&[("remote_address", "192.0.2.1")]),
                descriptor(&[("generic_key", "login"), ("remote_address", "192.0.2.1")]),
            ],
        )
    };
    let first = ask(&mut client, login()).await;
    assert_eq!(first.overall_code, OK);
    let codes: Vec<i32> = first.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [OK, OK]);
    let per_ip = &first.statuses[0];
    assert_eq!(
        per_ip.current_limit.as_ref().map(|l| l.requests_per_unit),
        Some(3)
    );
    assert_eq!(
        per_ip.current_limit.as_ref().map(|l| l.unit),
        Some(2),
        "MINUTE"
    );
    assert_eq!(per_ip.limit_remaining, 2);
    assert!(per_ip.duration_until_reset.is_some());

    // The login limit is spent: refused, the per-address limit marked OK but not taken from.
    let second = ask(&mut client, login()).await;
    assert_eq!(second.overall_code, OVER_LIMIT);
    let codes: Vec<i32> = second.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [OK, OVER_LIMIT]);
    assert_eq!(
        second.statuses[0].limit_remaining, 2,
        "nothing taken from per-ip"
    );
    assert!(header(&second, "retry-after").is_some(), "{second:?}");
    let rate_limit = header(&second, "ratelimit").unwrap_or_default();
    assert!(rate_limit.starts_with("\"login\";r=0;t="), "{rate_limit}");
    assert_eq!(
        header(&second, "ratelimit-policy"),
        Some("\"per-ip\";q=3;w=60, \"login\";q=1;w=60")
    );
    assert!(
        header(&second, "x-ratelimit-limit").is_none(),
        "not asked for"
    );

    // Other paths of the same address still have the per-address limit's two.
    for expected in [OK, OK, OVER_LIMIT] {
        let answer = ask(
            &mut client,
            request("edge", vec![descriptor(&[("remote_address", "192.0.2.1")])]),
        )
        .await;
        assert_eq!(answer.overall_code, expected);
    }
    // A descriptor no rule matches, and a header Envoy matched.
    let answer = ask(
        &mut client,
        request(
            "edge",
            vec![
                descriptor(&[("destination_cluster", "api")]),
                descriptor(&[("header_match", "api-key")]),
            ],
        ),
    )
    .await;
    assert_eq!(answer.overall_code, OK);
    assert!(answer.statuses[0].current_limit.is_none());
    assert_eq!(answer.statuses[1].limit_remaining, 1);
}

#[tokio::test]
async fn hits_addend_is_the_cost_per_request_and_per_descriptor() {
    let redis = RedisServer::start();
    let rls = start_rls(&on_redis(&redis, EDGE)).await;
    let mut client = rls.client().await;
    let by_address = |address: &str| descriptor(&[("remote_address", address)]);

    let mut taking_two = request("edge", vec![by_address("192.0.2.2")]);
    taking_two.hits_addend = 2;
    assert_eq!(
        ask(&mut client, taking_two.clone()).await.statuses[0].limit_remaining,
        1
    );
    // Two more than the one left: refused, and the one is still there.
    assert_eq!(ask(&mut client, taking_two).await.overall_code, OVER_LIMIT);
    let one = ask(&mut client, request("edge", vec![by_address("192.0.2.2")])).await;
    assert_eq!((one.overall_code, one.statuses[0].limit_remaining), (OK, 0));

    // The descriptor's own hits_addend wins over the request's; more than the limit holds is never admitted.
    let mut answer = request(
        "edge",
        vec![descriptor_taking(&[("remote_address", "192.0.2.3")], 3)],
    );
    answer.hits_addend = 1;
    let answer = ask(&mut client, answer).await;
    assert_eq!(
        (answer.overall_code, answer.statuses[0].limit_remaining),
        (OK, 0)
    );
    let too_many = request(
        "edge",
        vec![descriptor_taking(&[("remote_address", "192.0.2.4")], 4)],
    );
    assert_eq!(ask(&mut client, too_many).await.overall_code, OVER_LIMIT);
}

/// `hits_addend: 0` on every algorithm, and in a request's all-or-nothing, on the store of `yaml` (with
/// `{limit}` where the windows' limit goes).
async fn hits_addend_zero_takes_nothing(yaml: &str) {
    let config = |limit: u32| common::config(&yaml.replace("{limit}", &limit.to_string()));
    let rls = start_rls_with(&config(4), true).await;
    let mut client = rls.client().await;
    let read = |value: &str| {
        request(
            "edge",
            vec![descriptor_taking(&[("generic_key", value)], 0)],
        )
    };
    let take = |value: &str| request("edge", vec![descriptor(&[("generic_key", value)])]);
    for algorithm in ALGORITHMS {
        for _ in 0..3 {
            let answer = ask(&mut client, read(algorithm)).await;
            let status = &answer.statuses[0];
            assert_eq!(
                (answer.overall_code, status.code, status.limit_remaining),
                (OK, OK, 4),
                "{algorithm}: a check takes nothing"
            );
        }
        for left in [3, 2, 1, 0] {
            let answer = ask(&mut client, take(algorithm)).await;
            assert_eq!(answer.statuses[0].limit_remaining, left, "{algorithm}");
        }
        // Not one hit left, but not over the limit either: OK, with nothing remaining.
        let answer = ask(&mut client, read(algorithm)).await;
        let status = &answer.statuses[0];
        assert_eq!(
            (answer.overall_code, status.code, status.limit_remaining),
            (OK, OK, 0),
            "{algorithm}: spent is not over"
        );
        assert_eq!(
            ask(&mut client, take(algorithm)).await.overall_code,
            OVER_LIMIT
        );
    }
    // The windows lowered to 2 under the 4 they counted: over the limit, and a check is refused.
    rls.service
        .reload(config(2).rls.as_ref().expect("an rls block"));
    for algorithm in ["fixed_window", "sliding_window", "sliding_log"] {
        let answer = ask(&mut client, read(algorithm)).await;
        assert_eq!(
            (answer.overall_code, answer.statuses[0].code),
            (OVER_LIMIT, OVER_LIMIT),
            "{algorithm}: over the limit"
        );
    }
    // A refused check refuses its request: the descriptor that takes is not taken from.
    let both = request(
        "edge",
        vec![
            descriptor(&[("generic_key", "sliding_log_b")]),
            descriptor_taking(&[("generic_key", "sliding_log")], 0),
        ],
    );
    let answer = ask(&mut client, both).await;
    let codes: Vec<i32> = answer.statuses.iter().map(|s| s.code).collect();
    assert_eq!(
        (answer.overall_code, codes),
        (OVER_LIMIT, vec![OK, OVER_LIMIT])
    );
    let untouched = ask(&mut client, read("sliding_log_b")).await;
    assert_eq!(untouched.statuses[0].limit_remaining, 2, "nothing taken");
    // A check that passes lets the request take from the others.
    let both = request(
        "edge",
        vec![
            descriptor(&[("generic_key", "sliding_log_b")]),
            descriptor_taking(&[("generic_key", "gcra")], 0),
        ],
    );
    let answer = ask(&mut client, both).await;
    let remaining: Vec<u32> = answer.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!((answer.overall_code, remaining), (OK, vec![1, 0]));
}

const ALGORITHMS: [&str; 6] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
    "leaky_bucket",
];

/// [`EVERY_ALGORITHM`] with the windows' limit left as `{limit}`, and one more sliding log.
fn every_algorithm_to_lower() -> String {
    let windows = EVERY_ALGORITHM.replace("limit: 4,", "limit: {limit},");
    format!(
        "{windows}        - {{ key: generic_key, value: sliding_log_b, limits: [ {{ name: l, algorithm: sliding_log, limit: {{limit}}, period: 1h }} ] }}\n"
    )
}

/// The rate limit service with `domains` on `redis`, or in memory.
fn on_store(redis: Option<&RedisServer>, domains: &str) -> String {
    match redis {
        Some(redis) => on_redis(redis, domains),
        None => format!("store:\n  backend: memory\nrls:\n  listen: 127.0.0.1:0\n{domains}"),
    }
}

async fn hits_addend_zero_on_every_algorithm(redis: Option<&RedisServer>) {
    hits_addend_zero_takes_nothing(&on_store(redis, &every_algorithm_to_lower())).await;
}

crate::each_store!(
    hits_addend_zero_takes_nothing_and_is_refused_only_over_the_limit,
    hits_addend_zero_on_every_algorithm
);

#[tokio::test]
async fn hits_addend_zero_on_a_redis_that_fails_follows_on_error() {
    let nowhere = ReservedPort::new();
    let config = |on_error: &str| {
        common::config(&format!(
            "store:\n  backend: redis\n  url: redis://{}\n  timeout: 50ms\n  on_error: {on_error}\nrls:\n  listen: 127.0.0.1:0\n{EDGE}",
            nowhere.addr()
        ))
    };
    let read = || {
        request(
            "edge",
            vec![descriptor_taking(&[("remote_address", "192.0.2.1")], 0)],
        )
    };
    let deny = start_rls_with(&config("deny"), false).await;
    let status = deny
        .client()
        .await
        .should_rate_limit(read())
        .await
        .expect_err("the store is down");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let allow = start_rls_with(&config("allow"), false).await;
    assert_eq!(
        ask(&mut allow.client().await, read()).await.overall_code,
        OK
    );
    // The in-process store is read: its 3 a minute, nothing taken.
    let local = start_rls_with(&config("local"), false).await;
    let answer = ask(&mut local.client().await, read()).await;
    assert_eq!(
        (answer.overall_code, answer.statuses[0].limit_remaining),
        (OK, 3)
    );
}

#[tokio::test]
async fn envoys_limit_override_is_a_fixed_window_of_its_own() {
    let redis = RedisServer::start();
    let rls = start_rls(&on_redis(&redis, EDGE)).await;
    let mut client = rls.client().await;
    let overridden = || {
        let mut d = descriptor(&[("remote_address", "192.0.2.9")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 3, // HOUR
        });
        request("edge", vec![d])
    };
    let first = ask(&mut client, overridden()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        first.statuses[0].current_limit.as_ref().map(|l| l.unit),
        Some(3)
    );
    assert_eq!(
        ask(&mut client, overridden()).await.overall_code,
        OVER_LIMIT
    );
}

#[tokio::test]
async fn requests_it_cannot_decide_are_invalid_arguments_and_take_nothing() {
    let rls = start_rls(&on_store(None, EDGE)).await;
    let mut client = rls.client().await;
    let by_address = || descriptor(&[("remote_address", "192.0.2.7")]);
    let in_unit = |unit: i32| {
        let mut d = descriptor(&[("remote_address", "192.0.2.7")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit,
        });
        d
    };
    let invalid = [
        request("", vec![by_address()]),
        request("edge", Vec::new()),
        // UNKNOWN, and a unit this build does not know, beside a descriptor that would be limited.
        request("edge", vec![by_address(), in_unit(0)]),
        request("edge", vec![by_address(), in_unit(99)]),
    ];
    for refused in invalid {
        let status = client
            .should_rate_limit(refused)
            .await
            .expect_err("not a request the service can decide");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    // Nothing was taken from the address's 3 a minute.
    let first = ask(&mut client, request("edge", vec![by_address()])).await;
    assert_eq!(remaining(&first), [2]);
}

/// The folder of envoyproxy/ratelimit files under tests/fixtures/rls, in memory: their units are hours and days,
/// fixed windows that would end mid-test on Redis's clock in an hour's last minute; the in-process store's test
/// clock starts each at its beginning. What the files mean does not depend on the store (Redis's fixed windows
/// are proven by `every_algorithm_admits_exactly_its_capacity_across_two_instances`).
fn with_ratelimit_files() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rls");
    format!(
        "store:\n  backend: memory\nrls:\n  listen: 127.0.0.1:0\n  config_dir: {}\n",
        dir.display()
    )
}

#[tokio::test]
async fn ratelimit_files_decide_as_that_service_documents() {
    let rls = start_rls(&with_ratelimit_files()).await;
    let mut client = rls.client().await;
    let shared_client = client.clone();
    let admitted = async |domain: &str, entries: &[&[(&str, &str)]], times: usize| {
        let mut client = shared_client.clone();
        let mut count = 0;
        for _ in 0..times {
            let descriptors = entries.iter().map(|e| descriptor(e)).collect();
            if is_ok(&ask(&mut client, request(domain, descriptors)).await) {
                count += 1;
            }
        }
        count
    };
    // The most specific match: one address is refused everything, the others get 3 an hour each.
    assert_eq!(
        admitted("edge_per_ip", &[&[("remote_address", "50.0.0.5")]], 3).await,
        0
    );
    assert_eq!(
        admitted("edge_per_ip", &[&[("remote_address", "50.0.0.1")]], 5).await,
        3
    );
    assert_eq!(
        admitted("edge_per_ip", &[&[("remote_address", "50.0.0.2")]], 5).await,
        3
    );

    // Nesting: 2 marketing messages a day to a number, 4 messages of any kind.
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
    let any: &[(&str, &str)] = &[("to_number", "2061111111")];
    assert_eq!(admitted("messaging", &[marketing, any], 3).await, 2);
    assert_eq!(admitted("messaging", &[any], 3).await, 2, "2 of 4 left");
    // A descriptor longer than the path to its rule finds none.
    let deeper: &[(&str, &str)] = &[("to_number", "2062222222"), ("extra", "x")];
    assert_eq!(admitted("messaging", &[deeper], 6).await, 6);

    // `unlimited` never limits, and answers the largest remaining.
    assert_eq!(admitted("internal", &[&[("ldap", "bind")]], 20).await, 20);
    let unlimited = ask(
        &mut client,
        request("internal", vec![descriptor(&[("ldap", "bind")])]),
    )
    .await;
    assert_eq!(unlimited.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(admitted("internal", &[&[("azure", "x")]], 3).await, 2);

    // Wildcards: `files/*` values share one count, `files_no_share/*` values count apart.
    let shared = |v: &'static str| [("files", v)];
    assert_eq!(admitted("wildcards", &[&shared("files/a.pdf")], 1).await, 1);
    assert_eq!(admitted("wildcards", &[&shared("files/b.csv")], 2).await, 1);
    let apart = |v: &'static str| [("files_no_share", v)];
    assert_eq!(
        admitted("wildcards", &[&apart("files_no_share/a")], 3).await,
        2
    );
    assert_eq!(
        admitted("wildcards", &[&apart("files_no_share/b")], 3).await,
        2
    );

    // A domain nobody configured limits nothing.
    assert_eq!(
        admitted("nobody", &[&[("remote_address", "x")]], 3).await,
        3
    );
}

#[tokio::test]
async fn a_replacing_rule_takes_the_place_of_the_rule_it_names() {
    let rls = start_rls(&with_ratelimit_files()).await;
    let mut client = rls.client().await;
    let specific: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let replacing: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    // Both met: only the replacing rule (3 an hour) applies, and the replaced one (1) is not taken from.
    for expected in [OK, OK, OK, OVER_LIMIT] {
        let both = request(
            "replacing",
            vec![descriptor(specific), descriptor(replacing)],
        );
        let answer = ask(&mut client, both).await;
        assert_eq!(answer.overall_code, expected);
        assert_eq!(answer.statuses[0].code, OK);
    }
    let alone = request("replacing", vec![descriptor(specific)]);
    assert_eq!(ask(&mut client, alone.clone()).await.overall_code, OK);
    assert_eq!(ask(&mut client, alone).await.overall_code, OVER_LIMIT);
}

#[tokio::test]
async fn shadow_mode_answers_ok_and_still_counts() {
    let rls = start_rls(&with_ratelimit_files()).await;
    let mut client = rls.client().await;
    let user = |name: &str| {
        request(
            "shadow",
            vec![descriptor(&[("service", "auth"), ("user", name)])],
        )
    };
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let answer = ask(&mut client, user("user-a")).await;
        assert_eq!((answer.overall_code, answer.statuses[0].code), (OK, OK));
        remaining.push(answer.statuses[0].limit_remaining);
    }
    // Counted by the store all along (2 an hour), never enforced.
    assert_eq!(remaining, [1, 0, 0, 0]);
    let enforced: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(ask(&mut client, user("user-b")).await.overall_code);
        }
        codes
    };
    assert_eq!(enforced, [OK, OK, OVER_LIMIT]);
}

#[tokio::test]
async fn with_redis_down_on_error_decides() {
    let nowhere = ReservedPort::new();
    let config = |on_error: &str, when: &str| {
        common::config(&format!(
            "store:\n  backend: redis\n  url: redis://{}\n  timeout: 50ms\n  on_error: {on_error}\nrls:\n  listen: 127.0.0.1:0\n  when_unavailable: {when}\n{EDGE}",
            nowhere.addr()
        ))
    };
    let by_address = || request("edge", vec![descriptor(&[("remote_address", "192.0.2.1")])]);

    let deny = start_rls_with(&config("deny", "unavailable"), false).await;
    let status = deny
        .client()
        .await
        .should_rate_limit(by_address())
        .await
        .expect_err("the store is down");
    assert_eq!(status.code(), tonic::Code::Unavailable);

    let refuse = start_rls_with(&config("deny", "over_limit"), false).await;
    let answer = ask(&mut refuse.client().await, by_address()).await;
    assert_eq!(answer.overall_code, OVER_LIMIT);
    // Every descriptor over, with only `Retry-After: 1`: no limit was read.
    let two = request(
        "edge",
        vec![
            descriptor(&[("remote_address", "192.0.2.1")]),
            descriptor(&[("generic_key", "elsewhere")]),
        ],
    );
    let answer = ask(&mut refuse.client().await, two).await;
    let codes: Vec<i32> = answer.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [OVER_LIMIT, OVER_LIMIT]);
    assert_eq!(header(&answer, "retry-after"), Some("1"));
    assert_eq!(answer.response_headers_to_add.len(), 1);

    let allow = start_rls_with(&config("allow", "unavailable"), false).await;
    let mut client = allow.client().await;
    for _ in 0..5 {
        assert_eq!(ask(&mut client, by_address()).await.overall_code, OK);
    }

    // The in-process store decides alone: 3 a minute still hold on this instance.
    let local = start_rls_with(&config("local", "unavailable"), false).await;
    let mut client = local.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(ask(&mut client, by_address()).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OK, OVER_LIMIT]);
}

#[tokio::test]
async fn the_health_check_follows_the_store_only_when_told_to() {
    let nowhere = ReservedPort::new();
    let config = |follows: bool| {
        common::config(&format!(
            "store:\n  backend: redis\n  url: redis://{}\n  timeout: 50ms\n  on_error: allow\nrls:\n  listen: 127.0.0.1:0\n  health_follows_store: {follows}\n{EDGE}",
            nowhere.addr()
        ))
    };
    let status_of = async |rls: &common::rls::TestRls| {
        let mut health = HealthClient::new(rls.channel().await);
        let service = "envoy.service.ratelimit.v3.RateLimitService";
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("a health answer");
        answer.into_inner().status
    };
    let serving = start_rls_with(&config(false), false).await;
    assert_eq!(status_of(&serving).await, ServingStatus::Serving as i32);
    let following = start_rls_with(&config(true), false).await;
    let not_serving = common::eventually(std::time::Duration::from_secs(5), async || {
        status_of(&following).await == ServingStatus::NotServing as i32
    })
    .await;
    assert!(not_serving.is_some(), "NOT_SERVING while Redis is down");
    assert_eq!(status_of(&serving).await, ServingStatus::Serving as i32);
}

#[test]
fn problems_in_ratelimit_files_are_located_in_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("bad.yaml"),
        "domain: bad\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n  - key: b\n    value: x\n    share_threshold: true\n  - key: c\n    quota_mode: true\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("typo.yml"),
        "domain: typo\ndescriptors:\n  - key: a\n    rate_limt: {}\n",
    )
    .expect("write");
    // Not a YAML file: not read.
    std::fs::write(dir.path().join("README"), "not: [yaml").expect("write");
    let yaml = format!(
        "rls:\n  listen: 127.0.0.1:0\n  config_dir: {}\n  domains:\n    edge:\n      descriptors:\n        - key: remote_address\n          limits: [ {{ name: per-ip, key: ip, algorithm: gcra, rate: 1/s, burst: 1 }} ]\n",
        dir.path().display()
    );
    let error = tollgate::config::parse(&yaml, Path::new("gateway.yaml")).expect_err("invalid");
    assert_eq!(
        error.to_string(),
        "gateway.yaml:8:37: rls.domains.edge.descriptors[0].limits[0].key: a descriptor's limits are keyed by the descriptor's entries: remove key"
    );
    let yaml = format!(
        "rls:\n  listen: 127.0.0.1:0\n  config_dir: {}\n",
        dir.path().display()
    );
    let error = tollgate::config::parse(&yaml, Path::new("gateway.yaml")).expect_err("invalid");
    let bad = dir.path().join("bad.yaml");
    let typo = dir.path().join("typo.yml");
    let lines: Vec<String> = error.to_string().lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [
            format!(
                "{}:5:7: descriptors[0].rate_limit.unit: invalid unit \"fortnight\" (use second, minute, hour, day, week, month or year)",
                bad.display()
            ),
            format!(
                "{}:9:5: descriptors[1].share_threshold: share_threshold needs a value with '*' (the values it matches share one count)",
                bad.display()
            ),
            format!(
                "{}:11:5: descriptors[2].quota_mode: quota_mode is not supported by tollgate's rate limit service (remove it: the descriptor's limit is then enforced)",
                bad.display()
            ),
            format!(
                "{}:4:5: descriptors[0].rate_limt: unknown field `rate_limt`, expected one of `key`, `value`, `rate_limit`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata`, `descriptors`",
                typo.display()
            ),
        ]
    );
}

#[test]
fn check_prints_the_domains_and_their_descriptors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("gateway.yaml");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rls");
    std::fs::write(
        &config,
        format!(
            "rls:\n  listen: 127.0.0.1:8081\n  config_dir: {}\n{EDGE}",
            fixtures.display()
        ),
    )
    .expect("write");
    let output = std::process::Command::new(common::binary::BIN)
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .expect("run tollgate check");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    // Words, not the columns' widths.
    let rows: Vec<String> = text
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let has = |row: &str| rows.iter().any(|r| r.starts_with(row));
    assert!(has("rls: listen 127.0.0.1:8081 domains 7"), "{text}");
    for row in [
        "edge generic_key_login.remote_address login gcra rate 1/m, burst 1",
        "edge_per_ip remote_address_50.0.0.5 - refuses all 0 per second",
        "internal ldap - unlimited",
        "shadow service.user_user-a service.user_user-a fixed_window 2 per 1h shadow",
        "replacing key_2_value_2.user_bkthomps key_2_value_2.user_bkthomps fixed_window 3 per 1h replaces specific_limit",
    ] {
        assert!(has(row), "{row:?} in\n{text}");
    }
}

/// The rate limit service's address, from the line the process logs when it listens.
fn rls_address(gateway: &common::binary::Tollgate) -> std::net::SocketAddr {
    let log = gateway.log();
    let line = log
        .lines()
        .find(|line| line.contains("rate limit service listening"))
        .unwrap_or_else(|| panic!("no rate limit service line in\n{log}"));
    let start = line.find("listen=").expect("a listen field") + "listen=".len();
    line[start..]
        .split([' ', '"', ','])
        .next()
        .and_then(|addr| addr.parse().ok())
        .expect("an address")
}

/// The config of the process test: `limit` requests an hour per address, under the limit name `name`, and a
/// shadow rule of one an hour.
fn process_config(name: &str, limit: u32) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nstore: {{ backend: memory }}\nrls:\n  listen: 127.0.0.1:0\n  domains:\n    edge:\n      descriptors:\n        - key: remote_address\n          limits: [ {{ name: {name}, algorithm: fixed_window, limit: {limit}, period: 1h }} ]\n        - {{ key: generic_key, value: watched, shadow_mode: true, limits: [ {{ name: watch, algorithm: fixed_window, limit: 1, period: 1h }} ] }}\n"
    )
}

#[tokio::test]
async fn the_process_serves_it_beside_the_gateway_reloads_it_and_counts_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, process_config("per-ip", 2)).expect("write");
    let mut command = common::binary::Tollgate::command(&path);
    command.env("RUST_LOG", "info");
    let gateway = common::binary::Tollgate::spawn(command);
    let addr = rls_address(&gateway);
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
    let by_address = || request("edge", vec![descriptor(&[("remote_address", "192.0.2.1")])]);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut client, by_address()).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
    let watched = || request("edge", vec![descriptor(&[("generic_key", "watched")])]);
    for _ in 0..2 {
        assert_eq!(ask(&mut client, watched()).await.overall_code, OK, "shadow");
    }

    // A reload brings the new domains: a limit under a new name starts afresh.
    std::fs::write(&path, process_config("per-ip-wider", 5)).expect("write");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &gateway.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let reloaded = common::eventually(std::time::Duration::from_secs(5), async || {
        let answer = ask(&mut client.clone(), by_address()).await;
        answer.statuses[0]
            .current_limit
            .as_ref()
            .is_some_and(|limit| limit.name == "per-ip-wider")
    })
    .await;
    assert!(reloaded.is_some(), "{}", gateway.log());

    let metrics = common::http_client::metrics_text(&gateway.admin_url("")).await;
    for series in [
        "tollgate_rls_requests_total{domain=\"edge\",code=\"ok\"}",
        // At least the one refused before the reload (the polls for the reload may add more).
        "tollgate_rls_requests_total{domain=\"edge\",code=\"over_limit\"}",
        "tollgate_rls_request_duration_seconds_bucket",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
    // Per limit as the HTTP routes' limits are counted: its two admissions, its refusals.
    let value = |series: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series))
            .and_then(|rest| rest.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} in\n{metrics}"))
    };
    let per_ip =
        r#"tollgate_decisions_total{route="rls:edge",descriptor="remote_address",limit="per-ip""#;
    assert_eq!(value(&format!("{per_ip},decision=\"allowed\"}}")), 2);
    assert!(value(&format!("{per_ip},decision=\"denied\"}}")) >= 1);
    assert_eq!(value(&format!("{per_ip},decision=\"shadow_denied\"}}")), 0);
    let watch = r#"tollgate_decisions_total{route="rls:edge",descriptor="generic_key_watched",limit="watch""#;
    assert_eq!(value(&format!("{watch},decision=\"allowed\"}}")), 1);
    assert_eq!(value(&format!("{watch},decision=\"shadow_denied\"}}")), 1);
    assert_eq!(value(&format!("{watch},decision=\"denied\"}}")), 0);
}

/// The binary on `store` (a flow mapping) with `server` settings and [`EDGE`]; its rate limit service's address.
fn draining_process(
    store: &str,
    server: &str,
) -> (
    common::binary::Tollgate,
    std::net::SocketAddr,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nserver: {server}\nstore: {store}\nrls:\n  listen: 127.0.0.1:0\n{EDGE}"
        ),
    )
    .expect("write");
    let mut command = common::binary::Tollgate::command(&path);
    command.env("RUST_LOG", "info");
    let gateway = common::binary::Tollgate::spawn(command);
    let addr = rls_address(&gateway);
    (gateway, addr, dir)
}

async fn rls_client(
    addr: std::net::SocketAddr,
) -> envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
    tonic::transport::Channel,
>{
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the rate limit service")
}

fn terminate(gateway: &common::binary::Tollgate) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &gateway.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// Waits for the process to exit, and asserts it exited 0.
async fn exits_cleanly(gateway: &mut common::binary::Tollgate) {
    let mut exit = None;
    let exited = common::eventually(std::time::Duration::from_secs(20), async || {
        exit = gateway.process.0.try_wait().expect("wait");
        exit.is_some()
    })
    .await;
    assert!(exited.is_some(), "exited\n{}", gateway.log());
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{}", gateway.log());
}

/// A domain no config names: answered without the store.
fn elsewhere() -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    request(
        "elsewhere",
        vec![descriptor(&[("remote_address", "192.0.2.1")])],
    )
}

#[tokio::test]
async fn a_draining_process_says_not_serving_and_answers_through_the_delay() {
    let (mut gateway, addr, _dir) = draining_process(
        "{ backend: memory }",
        "{ shutdown_delay: 4s, shutdown_grace: 30s }",
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    let mut status = async || {
        let answer = health
            .check(HealthCheckRequest {
                service: "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
            })
            .await
            .expect("a health answer");
        answer.into_inner().status
    };
    assert_eq!(status().await, ServingStatus::Serving as i32);
    terminate(&gateway);
    let not_serving = common::eventually(std::time::Duration::from_secs(5), async || {
        status().await == ServingStatus::NotServing as i32
    })
    .await;
    assert!(
        not_serving.is_some(),
        "NOT_SERVING once draining\n{}",
        gateway.log()
    );
    // Through the delay it still decides, on a new connection too.
    let mut fresh = rls_client(addr).await;
    let by_address = request("edge", vec![descriptor(&[("remote_address", "192.0.2.1")])]);
    assert_eq!(ask(&mut fresh, by_address).await.overall_code, OK);
    // Then the listener closes.
    let refused = common::eventually(std::time::Duration::from_secs(10), async || {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(refused.is_some(), "the listener closed\n{}", gateway.log());
    drop(fresh);
    exits_cleanly(&mut gateway).await;
}

#[tokio::test]
async fn calls_in_flight_when_the_listener_closes_are_answered_before_the_process_exits() {
    let redis = RedisServer::start();
    let (mut gateway, addr, _dir) = draining_process(
        &format!(
            "{{ backend: redis, url: \"{}\", timeout: 20s, on_error: allow }}",
            redis.url()
        ),
        "{ shutdown_delay: 0s, shutdown_grace: 30s }",
    );
    let mut client = rls_client(addr).await;
    let by_address = || request("edge", vec![descriptor(&[("remote_address", "192.0.2.1")])]);
    assert_eq!(ask(&mut client, by_address()).await.overall_code, OK);

    // A call in flight: Redis frozen, it waits for Redis (until Redis is back, or fred gives up on it).
    redis.pause();
    let mut waiting = client.clone();
    let in_flight = async move { waiting.should_rate_limit(by_address()).await };
    tokio::pin!(in_flight);
    // Sent after it on the same connection: once this one is answered, the service has the other.
    tokio::select! {
        biased;
        _ = &mut in_flight => panic!("answered while Redis is frozen"),
        answer = client.should_rate_limit(elsewhere()) => { answer.expect("an answer"); }
    }
    terminate(&gateway);
    let refused = common::eventually(std::time::Duration::from_secs(10), async || {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(refused.is_some(), "the listener closed\n{}", gateway.log());
    // Answered once Redis is back (or once fred gives up on the frozen connection, after 2 s: on_error then
    // admits); either way an answer after the listener closed is the drain waiting for it.
    let answered_already = tokio::select! {
        biased;
        answer = &mut in_flight => Some(answer),
        () = std::future::ready(()) => None,
    };
    if answered_already.is_none() {
        assert!(
            gateway.process.0.try_wait().expect("wait").is_none(),
            "the process waits for the call in flight\n{}",
            gateway.log()
        );
    }
    redis.resume();
    let answer = match answered_already {
        Some(answer) => answer,
        None => in_flight.await,
    };
    let answer = answer.expect("the call in flight is answered");
    assert_eq!(answer.into_inner().overall_code, OK);
    drop(client);
    exits_cleanly(&mut gateway).await;
    let log = gateway.log();
    assert!(log.contains("rate limit service drained"), "{log}");
}

#[tokio::test]
async fn on_a_redis_cluster_descriptors_in_different_slots_are_still_all_or_nothing() {
    let cluster = common::cluster::RedisCluster::start();
    let yaml = format!(
        "store:\n  backend: redis\n  url: {}\n  timeout: 500ms\n  on_error: deny\nrls:\n  listen: 127.0.0.1:0\n{EDGE}",
        cluster.url()
    );
    let (a, b) = (start_rls(&yaml).await, start_rls(&yaml).await);
    let (mut first, mut second) = (a.client().await, b.client().await);
    // Many addresses, so that the descriptors of one request fall in different slots on different nodes.
    for n in 0..8 {
        let address = format!("198.51.100.{n}");
        let both = || {
            request(
                "edge",
                vec![
                    descriptor(&[("remote_address", &address)]),
                    descriptor(&[("generic_key", "login"), ("remote_address", &address)]),
                ],
            )
        };
        assert_eq!(ask(&mut first, both()).await.overall_code, OK);
        let refused = ask(&mut second, both()).await;
        assert_eq!(refused.overall_code, OVER_LIMIT, "{address}");
        // The per-address limit took one (of 3) for the first request, and nothing for the refused one.
        assert_eq!(refused.statuses[0].limit_remaining, 2, "{address}");
        let alone = request("edge", vec![descriptor(&[("remote_address", &address)])]);
        assert_eq!(ask(&mut first, alone).await.statuses[0].limit_remaining, 1);
    }
    let keys: usize = cluster
        .keys_per_node("tollgate:rls:edge:*")
        .iter()
        .map(Vec::len)
        .sum();
    assert_eq!(keys, 16, "two keys per address, each in its entries' slot");
    assert!(
        cluster
            .keys_per_node("tollgate:rls:edge:*")
            .iter()
            .all(|node| !node.is_empty()),
        "spread over every node"
    );
}

#[tokio::test]
async fn a_changed_ratelimit_file_is_loaded_once_it_has_settled() {
    use tollgate::reload::{Polled, Watcher};
    let dir = tempfile::tempdir().expect("temp dir");
    let files = dir.path().join("ratelimit");
    std::fs::create_dir(&files).expect("mkdir");
    let file = files.join("d.yaml");
    let rule = |key: &str| {
        format!("domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {{ unit: hour, requests_per_unit: 1 }}\n")
    };
    std::fs::write(&file, rule("k")).expect("write");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(
        &path,
        "store: { backend: memory }\nrls:\n  listen: 127.0.0.1:0\n  config_dir: ratelimit\n",
    )
    .expect("write");
    let config = tollgate::config::load(&path).expect("valid");
    let gateway = common::start_gateway_with(config.clone()).await;
    let rls = start_rls_with(&config, false).await;
    let mut watcher = Watcher::new(std::sync::Arc::clone(&gateway.gateway), path.clone())
        .serving_rls(std::sync::Arc::clone(&rls.service));
    let mut client = rls.client().await;
    let k = || request("d", vec![descriptor(&[("k", "v")])]);
    assert_eq!(ask(&mut client, k()).await.overall_code, OK);
    assert_eq!(ask(&mut client, k()).await.overall_code, OVER_LIMIT);
    assert_eq!(watcher.poll().await, Polled::Unchanged);

    // A broken file is refused, the running rules stay.
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight }\n",
    )
    .expect("write");
    assert_eq!(watcher.poll().await, Polled::Settling);
    assert_eq!(watcher.poll().await, Polled::Refused);
    assert_eq!(ask(&mut client, k()).await.overall_code, OVER_LIMIT);

    // The rule moves to another key: `k` is no longer limited.
    std::fs::write(&file, rule("other")).expect("write");
    assert_eq!(watcher.poll().await, Polled::Settling);
    assert_eq!(watcher.poll().await, Polled::Reloaded);
    assert_eq!(watcher.poll().await, Polled::Unchanged);
    let answer = ask(&mut client, k()).await;
    assert_eq!(answer.overall_code, OK);
    assert!(answer.statuses[0].current_limit.is_none());
}

/// Per `generic_key` value 5, per client address 20, and one of 30 for the property test, each in a fixed window of
/// 20000 days (2024-10-04 to 2079-07-08 on Redis's clock), which no test outlives.
const COPIES: &str = r#"  domains:
    edge:
      descriptors:
        - { key: generic_key, limits: [ { name: five, algorithm: fixed_window, limit: 5, period: 20000d } ] }
        - { key: remote_address, limits: [ { name: twenty, algorithm: fixed_window, limit: 20, period: 20000d } ] }
        - { key: tenant, limits: [ { name: thirty, algorithm: fixed_window, limit: 30, period: 20000d } ] }
"#;

fn copies_in_memory() -> String {
    on_store(None, COPIES)
}

/// The remaining counts of `answer`'s statuses, in order.
fn remaining(
    answer: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> Vec<u32> {
    answer.statuses.iter().map(|s| s.limit_remaining).collect()
}

/// The same descriptor N times in one request costs N times its hits on one key, all or nothing, with a status
/// per copy.
async fn copies_are_each_charged(redis: Option<&RedisServer>) {
    let rls = start_rls(&on_store(redis, COPIES)).await;
    let mut client = rls.client().await;
    let copies = |value: &str, n: usize, hits: u64| {
        request(
            "edge",
            vec![descriptor_taking(&[("generic_key", value)], hits); n],
        )
    };
    // 7 of a limit of 5: refused, and nothing taken.
    let seven = ask(&mut client, copies("a", 7, 1)).await;
    assert_eq!(seven.overall_code, OVER_LIMIT);
    assert_eq!(seven.statuses.len(), 7);
    assert!(seven.statuses.iter().all(|s| s.code == OVER_LIMIT));
    let four = ask(&mut client, copies("a", 4, 1)).await;
    assert_eq!(four.overall_code, OK, "the refusal took nothing");
    assert_eq!(remaining(&four), [1; 4], "four copies took four");
    let two = ask(&mut client, copies("a", 2, 1)).await;
    assert_eq!(two.overall_code, OVER_LIMIT, "two more than the one left");
    // Two copies of 2 each take 4 of 5.
    let twice = ask(&mut client, copies("b", 2, 2)).await;
    assert_eq!((twice.overall_code, remaining(&twice)), (OK, vec![1, 1]));
    // One limit met twice is one policy, which `RateLimit` names.
    assert_eq!(
        header(&twice, "ratelimit-policy"),
        Some("\"five\";q=5;w=1728000000"),
        "{twice:?}"
    );
    let once = ask(&mut client, copies("b", 1, 2)).await;
    assert_eq!(once.overall_code, OVER_LIMIT);
}

crate::each_store!(
    copies_of_a_descriptor_are_each_charged,
    copies_are_each_charged
);

/// After a refusal by one descriptor's limit, every other status still reads its own limit's count from the store
/// (a denial remembered in-process answers only for the keys it knows).
async fn every_status_reads_its_own_count(redis: Option<&RedisServer>) {
    let rls = start_rls(&on_store(redis, COPIES)).await;
    let mut client = rls.client().await;
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("generic_key", "c")]),
                descriptor(&[("remote_address", "192.0.2.9")]),
            ],
        )
    };
    for taken in 1..=5 {
        let answer = ask(&mut client, both()).await;
        assert_eq!(answer.overall_code, OK);
        assert_eq!(remaining(&answer), [5 - taken, 20 - taken]);
    }
    for _ in 0..5 {
        let answer = ask(&mut client, both()).await;
        assert_eq!(answer.overall_code, OVER_LIMIT);
        assert_eq!(remaining(&answer), [0, 15], "{answer:?}");
    }
}

crate::each_store!(
    after_a_refusal_every_status_reads_its_own_count,
    every_status_reads_its_own_count
);

/// Random requests of repeated descriptors with random hits take exactly their sum from the limit when admitted
/// and nothing when refused, on both stores: each status reads what is left.
#[test]
fn repeated_descriptors_charge_exactly_their_sum_in_both_stores() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let redis = RedisServer::start();
    let (memory, on_redis) = runtime.block_on(async {
        (
            start_rls(&copies_in_memory()).await,
            start_rls(&on_redis(&redis, COPIES)).await,
        )
    });
    let clients = runtime.block_on(async { [memory.client().await, on_redis.client().await] });
    let config = Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    // Requests: each the same descriptor 1 to 5 times, each copy taking 0 to 4.
    let requests = prop::collection::vec(prop::collection::vec(0u64..5, 1..6), 1..12);
    let case = std::sync::atomic::AtomicUsize::new(0);
    let result = runner.run(&requests, |requests| {
        let tenant = format!(
            "t{}",
            case.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        for client in &clients {
            // A client is a handle on its channel: cloned, it still asks the same service.
            let mut client = client.clone();
            let mut left: u64 = 30;
            for hits in &requests {
                let descriptors = hits
                    .iter()
                    .map(|&h| descriptor_taking(&[("tenant", tenant.as_str())], h))
                    .collect();
                let answer = runtime.block_on(ask(&mut client, request("edge", descriptors)));
                let sum: u64 = hits.iter().sum();
                prop_assert_eq!(answer.statuses.len(), hits.len());
                if sum <= left {
                    left -= sum;
                    prop_assert_eq!(answer.overall_code, OK);
                    prop_assert!(
                        answer
                            .statuses
                            .iter()
                            .all(|s| u64::from(s.limit_remaining) == left),
                        "{:?}",
                        answer
                    );
                } else {
                    prop_assert_eq!(answer.overall_code, OVER_LIMIT, "{} on {} left", sum, left);
                }
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// `rls.headers: draft03` sends envoyproxy/ratelimit's names: `RateLimit-Limit`, `-Remaining` and `-Reset`, and
/// none of the IETF draft's fields; by default the IETF draft's.
#[tokio::test]
async fn draft03_headers_carry_envoyproxy_ratelimits_names() {
    let yaml = copies_in_memory().replace("  domains:", "  headers: draft03\n  domains:");
    let rls = start_rls(&yaml).await;
    let mut client = rls.client().await;
    let ask_one =
        |value: &'static str| request("edge", vec![descriptor(&[("generic_key", value)])]);
    let admitted = ask(&mut client, ask_one("d")).await;
    assert_eq!(admitted.overall_code, OK);
    assert_eq!(header(&admitted, "ratelimit-limit"), Some("5"));
    assert_eq!(header(&admitted, "ratelimit-remaining"), Some("4"));
    assert!(header(&admitted, "ratelimit-reset").is_some());
    for _ in 0..4 {
        ask(&mut client, ask_one("d")).await;
    }
    let refused = ask(&mut client, ask_one("d")).await;
    assert_eq!(refused.overall_code, OVER_LIMIT);
    assert_eq!(header(&refused, "ratelimit-remaining"), Some("0"));
    for ietf in [
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
        "x-ratelimit-limit",
    ] {
        assert!(header(&refused, ietf).is_none(), "{ietf}: {refused:?}");
    }
    let ietf = start_rls(&copies_in_memory()).await;
    let answer = ask(&mut ietf.client().await, ask_one("d")).await;
    assert!(header(&answer, "ratelimit").is_some());
    assert!(header(&answer, "ratelimit-limit").is_none());
}
