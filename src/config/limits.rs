//! A route's `limits:` entries: the algorithm with exactly its parameters, the cost and the key.

use super::model::LimitSettings;
use super::raw::{KeyParts, RawCounts, RawLimit, RawMissing};
use super::validate::{check_name, unique_names, Issues};
use crate::key::{Counts, KeyPart, KeySpec, MissingKey, StatusSet, TokenKind};
use crate::limiter::{Limit, WrittenAlgorithm, WrittenQueue};

/// Validates a list of `limits:` at `at` (`routes[1]`, `consumers.plans.free`): each entry, and their names
/// unique in it.
pub(crate) fn limit_list(issues: &mut Issues, at: &str, raw: &[RawLimit]) -> Vec<LimitSettings> {
    unique_limit_names(issues, at, raw);
    raw.iter()
        .enumerate()
        .filter_map(|(j, limit)| limit_settings(issues, &format!("{at}.limits[{j}]"), limit))
        .collect()
}

/// Reports a name given to two entries of the `limits:` at `at`, on the later one.
pub(crate) fn unique_limit_names(issues: &mut Issues, at: &str, raw: &[RawLimit]) {
    unique_names(
        issues,
        "limit",
        raw.iter()
            .enumerate()
            .map(|(j, l)| (format!("{at}.limits[{j}]"), l.name.as_str())),
    );
}

/// Validates one entry of `limits:` at `at` (`routes[1].limits[0]`).
pub(crate) fn limit_settings(
    issues: &mut Issues,
    at: &str,
    raw: &RawLimit,
) -> Option<LimitSettings> {
    let before = issues.count();
    check_name(issues, &format!("{at}.name"), "limit", &raw.name);
    let key = key_spec(issues, &format!("{at}.key"), raw).map(|key| key.secret(raw.secret));
    let counts = counts(issues, &format!("{at}.counts"), raw.counts.as_ref());
    let limit = checked_limit(issues, at, raw, before)?;
    if limit.algorithm().holds_slots() && raw.counts.is_some() {
        issues.add(
            format!("{at}.counts"),
            "a concurrency limit counts requests in flight: remove counts",
        );
        return None;
    }
    Some(LimitSettings {
        limit,
        key: key?,
        counts: counts?,
    })
}

/// What a limit counts, `counts:` at `at`: `requests` when absent.
fn counts(issues: &mut Issues, at: &str, raw: Option<&RawCounts>) -> Option<Counts> {
    match raw {
        None => Some(Counts::Requests),
        Some(RawCounts::Name(name)) if name == "requests" => Some(Counts::Requests),
        Some(RawCounts::Name(name)) => match TokenKind::from_name(name) {
            Some(kind) => Some(Counts::Tokens(kind)),
            None => {
                issues.add(
                    at,
                    format_args!(
                        "unknown count {name:?} (use requests, input_tokens, output_tokens, total_tokens, or {{ status: [401, 403] }})"
                    ),
                );
                None
            }
        },
        Some(RawCounts::Status(statuses)) => {
            let mut set = StatusSet::default();
            let mut valid = true;
            for (i, status) in statuses.iter().enumerate() {
                if set.add(status).is_none() {
                    issues.add(
                        format!("{at}.status[{i}]"),
                        format_args!(
                            "{status:?} is not an HTTP status (100 to 599) or class (1xx to 5xx)"
                        ),
                    );
                    valid = false;
                }
            }
            if statuses.is_empty() {
                issues.add(
                    format!("{at}.status"),
                    "names no status: list the ones to count (401, 5xx)",
                );
                valid = false;
            }
            valid.then_some(Counts::Status(set))
        }
    }
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
        max: raw.max,
        lease: raw.lease.as_deref(),
        queue: raw.queue.as_ref().map(|queue| WrittenQueue {
            max_wait: queue.max_wait.as_deref(),
            max_waiting: queue.max_waiting,
        }),
        calendar: raw.calendar.as_deref(),
        timezone: raw.timezone.as_deref(),
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
            "needs at least one part (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan, client_cert)",
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
