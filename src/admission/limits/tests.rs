//! The keys a set of limits builds for a request, and what its one limiter call decides.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

use super::*;
use crate::key::{KeyPart, MissingKey};
use crate::limiter::{Algorithm, Backend, OnError, Rate, SystemClock};

/// The limits of a route named `api`, store keys prefixed `t:`: per limit its name, key part, what a request
/// without that part does, and algorithm, at cost 1.
fn limit_set_of(limits: &[(&str, &str, MissingKey, Algorithm)]) -> LimitSet {
    let limits = limits
        .iter()
        .map(|&(name, part, missing, algorithm)| {
            LimitSettings::new(
                Limit::new(name, algorithm, 1).expect("valid limit"),
                KeySpec::new(vec![KeyPart::parse(part).expect("key part")], missing),
            )
        })
        .collect();
    LimitSet::new("api", "t:", limits, StatusCode::TOO_MANY_REQUESTS)
}

/// `limit` per minute in fixed windows.
fn per_minute(limit: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        period_ms: 60_000,
    }
}

/// One request a second, three at once.
fn one_a_second() -> Rate {
    Rate::new(1, 1_000).expect("valid rate")
}

/// Three limits, two keyed alike by the client address and one by a header.
fn limit_set() -> LimitSet {
    let burst = Algorithm::TokenBucket {
        rate: one_a_second(),
        burst: 3,
    };
    limit_set_of(&[
        ("per-ip", "ip", MissingKey::Ip, per_minute(10)),
        ("per-key", "header:x-api-key", MissingKey::Ip, per_minute(5)),
        ("per-ip-burst", "ip", MissingKey::Ip, burst),
    ])
}

/// A `GET /` on route `api` from 192.0.2.7 with `headers`.
fn facts_of(headers: &HeaderMap) -> RequestFacts<'_> {
    RequestFacts::get("192.0.2.7", headers, None)
}

#[tokio::test]
async fn each_limit_is_keyed_by_its_own_spec_and_the_tightest_is_advertised() {
    let limits = limit_set();
    let limiter = RateLimiter::new(
        Backend::Memory,
        Duration::from_millis(25),
        OnError::Local,
        1000,
        Arc::new(SystemClock),
    );
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("k1"));
    let facts = facts_of(&headers);
    let checked = limits
        .check(&limiter, LimitRequest::of(&facts))
        .await
        .expect("decided");
    assert!(checked.outcome.allowed);

    for (limit, value) in [
        ("per-ip", "192.0.2.7"),
        ("per-key", "k1"),
        ("per-ip-burst", "192.0.2.7"),
    ] {
        let (key, _) = limits.key_for(limit, value).expect("limit exists");
        assert_eq!(key, format!("t:api:{limit}:{{{value}}}"));
        assert!(limiter.local().reset(&key), "{limit} counted under {key}");
    }

    let mut response = HeaderMap::new();
    limits.decorate(&mut response, &checked);
    // The token bucket has 2 of 3 left: fewer than the others.
    assert_eq!(response["x-ratelimit-limit"], "3");
    assert_eq!(response["x-ratelimit-remaining"], "2");
    assert_eq!(response["ratelimit"], "\"per-ip-burst\";r=2;t=1");
    assert_eq!(
        response["ratelimit-policy"],
        "\"per-ip\";q=10;w=60, \"per-key\";q=5;w=60, \"per-ip-burst\";q=3;w=3"
    );
}

/// Limits keyed five ways, two pairs sharing a key spec: by address, by a header that may be absent (skip),
/// and by a header whose value may be too long to stand in a key.
fn keyed_five_ways() -> LimitSet {
    let (rate, burst) = (one_a_second(), 3);
    limit_set_of(&[
        ("a", "ip", MissingKey::Ip, per_minute(10)),
        ("b", "header:x-api-key", MissingKey::Skip, per_minute(5)),
        ("c", "ip", MissingKey::Ip, Algorithm::Gcra { rate, burst }),
        ("d", "header:x-token", MissingKey::Ip, per_minute(5)),
        (
            "e",
            "header:x-api-key",
            MissingKey::Skip,
            Algorithm::TokenBucket { rate, burst },
        ),
    ])
}

#[test]
fn request_keys_are_the_store_keys_of_the_limits_that_apply() {
    let limits = keyed_five_ways();
    let long_token = "t".repeat(200);
    let header_sets: [&[(&str, &str)]; 4] = [
        &[],
        &[("x-api-key", "k1")],
        &[("x-token", &long_token)],
        &[("x-api-key", "k{1}"), ("x-token", "short")],
    ];
    for set in header_sets {
        let mut headers = HeaderMap::new();
        for (name, value) in set {
            headers.insert(*name, HeaderValue::from_str(value).expect("value"));
        }
        let facts = facts_of(&headers);
        // One key at a time, as the admin API builds them.
        let expected: Vec<(usize, String)> = limits
            .limits()
            .enumerate()
            .filter_map(|(index, settings)| {
                let value = settings.key.value(&facts).expect("unambiguous")?;
                let (key, _) = limits.key_for(settings.limit.name(), &value)?;
                Some((index, key))
            })
            .collect();
        let keys = limits.request_keys(&facts).expect("unambiguous");
        let built: Vec<(usize, String)> = keys
            .iter()
            .map(|(index, key)| (index, key.to_owned()))
            .collect();
        assert_eq!(built, expected, "headers {set:?}");
    }
}
