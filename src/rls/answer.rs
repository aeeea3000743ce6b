//! A decision written for Envoy: `overall_code`, one status per descriptor, and the fields tollgate's own 429
//! carries (`RateLimit-Policy`, `RateLimit`, `Retry-After`) in `response_headers_to_add`.

use envoy_types::pb::envoy::config::core::v3::HeaderValue as EnvoyHeader;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as EnvoyUnit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as EnvoyDuration;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::decide::{Checked, Decided, Found};
use super::domains::HeaderNames;
use super::unit::{requests_per_unit, Unit};
use crate::admission::{apply_rate_limit_fields, rate_limit_policy, Advertised};
use crate::limiter::{Decision, Limit};

/// The `X-RateLimit-*` fields, sent only when `rls.x_ratelimit_headers` says so.
const X_RATELIMIT: [&str; 3] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

/// The IETF draft's fields, not sent under `rls.headers: draft03`.
const RATELIMIT_POLICY: &str = "ratelimit-policy";
const RATELIMIT: &str = "ratelimit";

/// The fields `rls.headers: draft03` sends, each the `X-RateLimit-*` field of the same place in [`X_RATELIMIT`].
const DRAFT03: [HeaderName; 3] = [
    HeaderName::from_static("ratelimit-limit"),
    HeaderName::from_static("ratelimit-remaining"),
    HeaderName::from_static("ratelimit-reset"),
];

/// `decided` as Envoy reads it; `x_ratelimit_headers` keeps the `X-RateLimit-*` fields, `names` says which names
/// the others go by.
pub fn response(
    decided: &Decided<'_>,
    x_ratelimit_headers: bool,
    names: HeaderNames,
) -> RateLimitResponse {
    let statuses = decided
        .found
        .iter()
        .enumerate()
        .map(|(index, found)| status(decided, index, found))
        .collect();
    let overall = if decided.over_limit() {
        Code::OverLimit
    } else {
        Code::Ok
    };
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add: headers(decided, x_ratelimit_headers, names),
        ..RateLimitResponse::default()
    }
}

/// Every descriptor OVER_LIMIT, with `Retry-After: 1` and no other field: the answer when the store failed and
/// `on_error` refuses under `rls.when_unavailable: over_limit`.
pub fn every_descriptor_over(descriptors: usize) -> RateLimitResponse {
    let over = DescriptorStatus {
        code: Code::OverLimit as i32,
        ..DescriptorStatus::default()
    };
    let mut headers = HeaderMap::new();
    headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![over; descriptors],
        response_headers_to_add: envoy_headers(&headers),
        ..RateLimitResponse::default()
    }
}

/// One descriptor's status: of its limits, the one that explains its answer (see [`explaining`]).
fn status(decided: &Decided<'_>, index: usize, found: &Found<'_>) -> DescriptorStatus {
    let ok = Code::Ok as i32;
    match found {
        Found::Nothing | Found::Replaced(_) => DescriptorStatus {
            code: ok,
            ..DescriptorStatus::default()
        },
        Found::Unlimited => DescriptorStatus {
            code: ok,
            limit_remaining: u32::MAX,
            ..DescriptorStatus::default()
        },
        Found::Blocked { rule, unit } => {
            let shadow = rule.is_some_and(|rule| rule.shadow);
            DescriptorStatus {
                code: if shadow { ok } else { Code::OverLimit as i32 },
                current_limit: Some(RateLimit {
                    name: rule.map(|rule| rule.path.clone()).unwrap_or_default(),
                    requests_per_unit: 0,
                    unit: envoy_unit(Some(*unit)) as i32,
                }),
                ..DescriptorStatus::default()
            }
        }
        Found::Limited(_) => {
            let own: Vec<&Checked<'_>> = decided
                .checked
                .iter()
                .filter(|checked| checked.descriptor == index)
                .collect();
            let over = own.iter().any(|checked| refuses(checked));
            let Some(shown) = explaining(&own, over) else {
                return DescriptorStatus {
                    code: if over { Code::OverLimit as i32 } else { ok },
                    ..DescriptorStatus::default()
                };
            };
            let (requests, unit) = requests_per_unit(&shown.limit);
            let decision = shown.decision.unwrap_or(Decision {
                allowed: !shown.impossible,
                limit: requests,
                remaining: 0,
                retry_after_ms: 0,
                reset_after_ms: 0,
                delay_ms: 0,
                owed: 0,
            });
            DescriptorStatus {
                code: if over { Code::OverLimit as i32 } else { ok },
                current_limit: Some(RateLimit {
                    name: shown.limit.name().to_owned(),
                    requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
                    unit: envoy_unit(unit) as i32,
                }),
                limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
                duration_until_reset: shown.decision.map(|d| duration(d.reset_after_ms)),
                ..DescriptorStatus::default()
            }
        }
    }
}

/// Whether an enforced limit refuses: the store denied it, or no request of this size can meet it.
fn refuses(checked: &Checked<'_>) -> bool {
    !checked.limit.is_shadow()
        && (checked.impossible || checked.decision.is_some_and(|d| !d.allowed))
}

/// Of `checked`, the limit that explains the answer: when refused, the refusing limit that makes the client wait
/// longest; otherwise the one with the fewest requests remaining. Enforced limits first: shadow limits are shown
/// only when nothing else applies.
fn explaining<'c, 'd>(checked: &[&'c Checked<'d>], over: bool) -> Option<&'c Checked<'d>> {
    let enforced = checked.iter().filter(|c| !c.limit.is_shadow());
    let pick = |candidates: &mut dyn Iterator<Item = &&'c Checked<'d>>| -> Option<&'c Checked<'d>> {
        if over {
            candidates
                .filter(|c| refuses(c))
                .max_by_key(|c| c.decision.map_or(u64::MAX, |d| d.retry_after_ms))
                .copied()
        } else {
            candidates
                .min_by_key(|c| c.decision.map_or(u64::MAX, |d| d.remaining))
                .copied()
        }
    };
    pick(&mut enforced.clone()).or_else(|| pick(&mut checked.iter()))
}

/// The fields tollgate's own answer would carry: `RateLimit-Policy` of the enforced limits met, `RateLimit` of the
/// one that explains the answer, and `Retry-After` when refused.
fn headers(
    decided: &Decided<'_>,
    x_ratelimit_headers: bool,
    names: HeaderNames,
) -> Vec<EnvoyHeader> {
    let enforced: Vec<&Checked<'_>> = decided
        .checked
        .iter()
        .filter(|checked| !checked.limit.is_shadow())
        .collect();
    let Some(shown) = explaining(&enforced, decided.over_limit()) else {
        return Vec::new();
    };
    let mut headers = HeaderMap::new();
    if let Some(decision) = &shown.decision {
        let limits: Vec<&Limit> = enforced.iter().map(|c| c.limit.as_ref()).collect();
        let policy = rate_limit_policy(limits.into_iter(), None);
        apply_rate_limit_fields(
            &mut headers,
            policy.as_ref(),
            decision,
            &Advertised::new(&shown.limit),
        );
    }
    if decided.over_limit() {
        let retry_after_ms = enforced
            .iter()
            .filter_map(|c| c.decision)
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after_ms)
            .max();
        if let Some(ms) = retry_after_ms {
            // At least 1: `Retry-After: 0` would invite an immediate retry that is still refused.
            headers.insert(RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000).max(1)));
        }
    }
    if names == HeaderNames::Draft03 {
        // The same numbers under envoyproxy/ratelimit's names: the limit, what is left and the seconds until it
        // is full again, of the limit that explains the answer.
        for (draft03, name) in DRAFT03.iter().zip(X_RATELIMIT) {
            if let Some(value) = headers.get(name).cloned() {
                headers.insert(draft03, value);
            }
        }
        for name in [RATELIMIT_POLICY, RATELIMIT, RETRY_AFTER.as_str()] {
            headers.remove(name);
        }
    }
    if !x_ratelimit_headers {
        for name in X_RATELIMIT {
            headers.remove(name);
        }
    }
    envoy_headers(&headers)
}

fn envoy_headers(headers: &HeaderMap) -> Vec<EnvoyHeader> {
    headers
        .iter()
        .map(|(name, value)| EnvoyHeader {
            key: name.as_str().to_owned(),
            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ..EnvoyHeader::default()
        })
        .collect()
}

fn envoy_unit(unit: Option<Unit>) -> EnvoyUnit {
    match unit {
        None => EnvoyUnit::Unknown,
        Some(Unit::Second) => EnvoyUnit::Second,
        Some(Unit::Minute) => EnvoyUnit::Minute,
        Some(Unit::Hour) => EnvoyUnit::Hour,
        Some(Unit::Day) => EnvoyUnit::Day,
        Some(Unit::Week) => EnvoyUnit::Week,
        Some(Unit::Month) => EnvoyUnit::Month,
        Some(Unit::Year) => EnvoyUnit::Year,
    }
}

/// The unit an Envoy override names; `None` for UNKNOWN or a value this build does not know.
pub fn from_envoy_unit(unit: i32) -> Option<Unit> {
    match EnvoyUnit::try_from(unit).ok()? {
        EnvoyUnit::Unknown => None,
        EnvoyUnit::Second => Some(Unit::Second),
        EnvoyUnit::Minute => Some(Unit::Minute),
        EnvoyUnit::Hour => Some(Unit::Hour),
        EnvoyUnit::Day => Some(Unit::Day),
        EnvoyUnit::Week => Some(Unit::Week),
        EnvoyUnit::Month => Some(Unit::Month),
        EnvoyUnit::Year => Some(Unit::Year),
    }
}

fn duration(ms: u64) -> EnvoyDuration {
    EnvoyDuration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}
