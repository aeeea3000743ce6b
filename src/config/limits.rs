//! A route's `limits:` entries: the algorithm with exactly its parameters, the cost and the key.

use super::model::LimitSettings;
use super::raw::{KeyParts, RawLimit, RawMissing};
use super::validate::{check_name, Issues};
use crate::key::{KeyPart, KeySpec, MissingKey};
use crate::limiter::{Limit, WrittenAlgorithm};

/// Validates one entry of `limits:` at `at` (`routes[1].limits[0]`).
pub(crate) fn limit_settings(
    issues: &mut Issues,
    at: &str,
    raw: &RawLimit,
) -> Option<LimitSettings> {
    let before = issues.count();
    check_name(issues, &format!("{at}.name"), "limit", &raw.name);
    let key = key_spec(issues, &format!("{at}.key"), raw).map(|key| key.secret(raw.secret));
    let limit = checked_limit(issues, at, raw, before)?;
    Some(LimitSettings { limit, key: key? })
}

/// The limit of one entry, its name and key aside; `None` when `issues` grew since `before`.
fn checked_limit(issues: &mut Issues, at: &str, raw: &RawLimit, before: usize) -> Option<Limit> {
    let written = WrittenAlgorithm {
        algorithm: &raw.algorithm,
        limit: raw.limit,
        period: raw.period.as_deref(),
        rate: raw.rate.as_deref(),
        burst: raw.burst,
        mode: raw.mode.as_deref(),
        max_delay: raw.max_delay.as_deref(),
    };
    let algorithm = written.checked().map_err(|problems| {
        for problem in problems {
            issues.add(format!("{at}.{}", problem.field), problem.message);
        }
    });
    if raw.cost == 0 {
        issues.add(format!("{at}.cost"), "must be greater than 0");
    }
    if issues.count() != before {
        return None;
    }
    let limit = issues
        .check(at, Limit::new(raw.name.clone(), algorithm.ok()?, raw.cost))?
        .with_shadow(raw.shadow);
    Some(limit)
}

// === keys ===

fn key_spec(issues: &mut Issues, at: &str, raw: &RawLimit) -> Option<KeySpec> {
    let written: Vec<(String, &str)> = match &raw.key {
        None => vec![(at.to_owned(), "ip")],
        Some(KeyParts::One(part)) => vec![(at.to_owned(), part.as_str())],
        Some(KeyParts::List(parts)) => parts
            .iter()
            .enumerate()
            .map(|(i, part)| (format!("{at}[{i}]"), part.as_str()))
            .collect(),
    };
    if written.is_empty() {
        issues.add(
            at,
            "needs at least one part (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan)",
        );
        return None;
    }
    let before = issues.count();
    let parts: Vec<KeyPart> = written
        .into_iter()
        .filter_map(|(path, text)| issues.check(path, KeyPart::parse(text)))
        .collect();
    if issues.count() != before {
        return None;
    }
    let missing = match raw.missing {
        RawMissing::Ip => MissingKey::Ip,
        RawMissing::Skip => MissingKey::Skip,
    };
    Some(KeySpec::new(parts, missing))
}
