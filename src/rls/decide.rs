//! Deciding one request of Envoy's: the rule each descriptor finds, the rules replaced, then every limit that
//! applies, on its store key, checked through admission as a route's limits are (one all-or-nothing call).

use std::borrow::Cow;

use smallvec::SmallVec;

use super::domains::{Domain, Matched, Rule, RuleKind, MAX_SHARED_DEPTH};
use super::unit::Unit;
use crate::admission::{check_keyed, Refusal};
use crate::key::{key_head, push_escaped, seal_key};
use crate::limiter::store::LimitCheck;
use crate::limiter::{Decision, Limit, Outcome, RateLimiter};

/// One descriptor of a request, as Envoy sent it.
#[derive(Debug, Clone)]
pub struct Descriptor<'r> {
    /// Its entries, in order: (key, value).
    pub entries: SmallVec<[(&'r str, &'r str); 4]>,
    /// What it takes from each limit it meets (`hits_addend`, per descriptor or else per request). 0 (a
    /// descriptor's own `hits_addend: 0`) takes nothing and is refused only by a limit that is over.
    pub hits: u64,
    /// The limit Envoy's route config gives it in place of the configured one: requests per unit.
    pub limit_override: Option<(u64, Unit)>,
}

/// What a descriptor found in its domain.
#[derive(Debug, Clone)]
pub enum Found<'d> {
    /// No rule: nothing limits it.
    Nothing,
    /// A rule that never limits (`unlimited: true`).
    Unlimited,
    /// A rule that another rule met by the same request replaces.
    Replaced(&'d Rule),
    /// Refused whatever the store holds (`requests_per_unit: 0`), by a rule or by Envoy's override.
    Blocked {
        /// The rule; `None` for an override.
        rule: Option<&'d Rule>,
        /// The unit of its zero requests.
        unit: Unit,
    },
    /// Limits: the rule's (the request's own for an override, with no rule).
    Limited(Option<&'d Rule>),
}

/// One limit a request met, with what the store said of it.
#[derive(Debug, Clone)]
pub struct Checked<'d> {
    /// The descriptor it applies to.
    pub descriptor: usize,
    /// The limit, with what the request takes from it as its cost: the descriptor's hits, summed over the copies
    /// of a descriptor sent more than once.
    pub limit: Cow<'d, Limit>,
    /// Its decision; `None` when the store was not asked (a blocked rule refused the request first, or the store
    /// failed and `on_error: allow` admitted it).
    pub decision: Option<Decision>,
    /// The descriptor's hits are more than the limit can ever hold: over the limit whatever the store holds.
    pub impossible: bool,
}

/// The answer to one request, before it is written for Envoy.
#[derive(Debug)]
pub struct Decided<'d> {
    /// Per descriptor of the request, in its order.
    pub found: Vec<Found<'d>>,
    /// Every limit that applied, in the order they were checked.
    pub checked: Vec<Checked<'d>>,
    /// Why the request is refused, if it is: a limit refused it ([`Refusal::RateLimited`]: nothing was then taken
    /// from any limit), or the store failed and `on_error` refuses ([`Refusal::Unavailable`]: nothing decided).
    pub refusal: Option<Refusal>,
}

/// Decides `descriptors` of a request to `domain` (`None`: a domain not configured, where nothing limits): the
/// rules they find, then every limit that applies checked through admission ([`check_keyed`]), refused as a
/// route's request is. Store keys are `<key_prefix>rls:<domain>:<limit>:{<entries>}`: the descriptor's entries
/// are the hash tag, so a descriptor's limits share a Redis Cluster slot.
pub async fn decide<'d>(
    domain: Option<&'d Domain>,
    descriptors: &[Descriptor<'_>],
    key_prefix: &str,
    limiter: &RateLimiter,
) -> Decided<'d> {
    let Some(domain) = domain else {
        return Decided {
            found: vec![Found::Nothing; descriptors.len()],
            checked: Vec::new(),
            refusal: None,
        };
    };
    let (found, matched) = find_rules(domain, descriptors);
    let met = limits_met(domain, &found, &matched, descriptors, key_prefix);
    let mut checked: Vec<Checked<'d>> = met.iter().map(at_its_cost).collect();
    // A blocked rule refuses whatever the store holds, and so does a limit no request of this size can ever meet
    // (hits above its capacity); in shadow, either only observes.
    let refused_here = found.iter().any(
        |found| matches!(found, Found::Blocked { rule, .. } if !rule.is_some_and(|r| r.shadow)),
    ) || checked.iter().any(|c| c.impossible && !c.limit.is_shadow());
    if refused_here {
        // Refused whatever the store holds: it is not asked, and nothing is taken.
        let unasked = Outcome {
            allowed: false,
            decisions: Vec::new(),
            batch: 0,
        };
        let refusal = Refusal::RateLimited {
            checked: crate::admission::Checked::of_every_limit(unasked),
            plan: None,
        };
        return Decided {
            found,
            checked,
            refusal: Some(refusal),
        };
    }
    // One check per key (a copy's is its first's). A shadow limit no request of this size can meet is left out: it
    // would only say "would deny".
    let asked: Vec<usize> = (0..checked.len())
        .filter(|&i| met[i].first == i && !checked[i].impossible)
        .collect();
    let checks: Vec<LimitCheck<'_>> = asked
        .iter()
        .map(|&i| LimitCheck {
            key: &met[i].key,
            limit: &checked[i].limit,
        })
        .collect();
    let answered = check_keyed(limiter, &checks).await;
    drop(checks);
    let decisions = match &answered {
        Ok(asked) | Err(Refusal::RateLimited { checked: asked, .. }) => {
            asked.outcome.decisions.as_slice()
        }
        // The store failed and `on_error` refuses: nothing was decided.
        Err(_) => &[],
    };
    // Empty when the store failed and `on_error: allow` admitted the request.
    for (&i, decision) in asked.iter().zip(decisions) {
        checked[i].decision = Some(*decision);
    }
    for i in 0..checked.len() {
        checked[i].decision = checked[met[i].first].decision;
    }
    Decided {
        found,
        checked,
        refusal: answered.err(),
    }
}

// === impl Decided ===

impl Decided<'_> {
    /// Whether the limits refused the request (OVER_LIMIT).
    pub fn over_limit(&self) -> bool {
        matches!(self.refusal, Some(Refusal::RateLimited { .. }))
    }

    /// Whether the limits decided the request: not when the store failed and `on_error` refused it.
    pub fn limits_decided(&self) -> bool {
        !matches!(self.refusal, Some(Refusal::Unavailable(_)))
    }
}

/// `met`'s limit at what the request takes from it, not yet decided: impossible when it can never take that much.
fn at_its_cost<'d>(met: &Met<'d>) -> Checked<'d> {
    let (limit, impossible) = match with_cost(met.limit.clone(), met.hits) {
        Ok(limit) => (limit, false),
        Err(limit) => (limit, true),
    };
    Checked {
        descriptor: met.descriptor,
        limit,
        decision: None,
        impossible,
    }
}

/// A limit a descriptor meets, on its store key.
struct Met<'d> {
    descriptor: usize,
    limit: Cow<'d, Limit>,
    key: String,
    /// What every descriptor that meets this limit on this key takes together.
    hits: u64,
    /// The first limit met on the same key with the same parameters (itself if none before it).
    first: usize,
}

/// Every limit the descriptors meet, in order, on its store key. A descriptor sent more than once (Envoy sends
/// duplicates when a virtual host and a route both add one), or two that share a key (`share_threshold`), meet
/// the same limit on the same key each time: each copy is charged, as envoyproxy/ratelimit charges each, so every
/// copy carries the sum of their hits, and the store is asked once for the first.
fn limits_met<'d>(
    domain: &'d Domain,
    found: &[Found<'d>],
    matched: &[SharedEntries<'d>],
    descriptors: &[Descriptor<'_>],
    key_prefix: &str,
) -> Vec<Met<'d>> {
    let scope = format!("rls:{}", domain.name);
    let mut met: Vec<Met<'d>> = Vec::new();
    for (index, (found, descriptor)) in found.iter().zip(descriptors).enumerate() {
        let limits: Vec<Cow<'d, Limit>> = match found {
            Found::Limited(Some(rule)) => rule.limits.iter().map(Cow::Borrowed).collect(),
            Found::Limited(None) => match override_limit(descriptor) {
                Some(limit) => vec![Cow::Owned(limit)],
                None => Vec::new(),
            },
            _ => continue,
        };
        for limit in limits {
            let mut key = key_head(key_prefix, &scope, limit.name());
            push_entries(&mut key, &descriptor.entries, &matched[index]);
            let first = met
                .iter()
                .position(|m| m.key == key && m.limit.algorithm() == limit.algorithm())
                .unwrap_or(met.len());
            met.push(Met {
                descriptor: index,
                limit,
                key,
                hits: descriptor.hits,
                first,
            });
        }
    }
    for i in 0..met.len() {
        let first = met[i].first;
        if first != i {
            met[first].hits = met[first].hits.saturating_add(met[i].hits);
        }
    }
    for i in 0..met.len() {
        met[i].hits = met[met[i].first].hits;
    }
    met
}

/// The rule each descriptor finds, with the rules replaced: a rule named in the `replaces` of another rule met by
/// the same request does not apply (whether the replacing rule limits or is unlimited).
fn find_rules<'d>(
    domain: &'d Domain,
    descriptors: &[Descriptor<'_>],
) -> (Vec<Found<'d>>, Vec<SharedEntries<'d>>) {
    let matched: Vec<Option<Matched<'d>>> = descriptors
        .iter()
        .map(|descriptor| {
            if descriptor.limit_override.is_some() {
                None
            } else {
                domain.rule_for(&descriptor.entries)
            }
        })
        .collect();
    let replaced = |rule: &Rule| {
        rule.name.as_ref().is_some_and(|name| {
            matched
                .iter()
                .flatten()
                .any(|other| other.rule.replaces.contains(name))
        })
    };
    let found = matched
        .iter()
        .zip(descriptors)
        .map(|(matched, descriptor)| match matched {
            None => match descriptor.limit_override {
                Some((0, unit)) => Found::Blocked { rule: None, unit },
                Some(_) => Found::Limited(None),
                None => Found::Nothing,
            },
            Some(m) if m.rule.kind == RuleKind::Unlimited => Found::Unlimited,
            Some(m) if replaced(m.rule) => Found::Replaced(m.rule),
            Some(m) => match m.rule.kind {
                RuleKind::Blocked(unit) => Found::Blocked {
                    rule: Some(m.rule),
                    unit,
                },
                _ => Found::Limited(Some(m.rule)),
            },
        })
        .collect();
    let shared = matched
        .iter()
        .map(|m| m.map_or([None; MAX_SHARED_DEPTH], |m| m.shared))
        .collect();
    (found, shared)
}

/// Per entry of a descriptor: the pattern counted in place of its value (`share_threshold`).
type SharedEntries<'d> = [Option<&'d str>; MAX_SHARED_DEPTH];

/// The request's own limit for a descriptor (Envoy's `limit` override): a fixed window, as envoyproxy/ratelimit
/// applies it (`requests_per_unit: 0` is [`Found::Blocked`], never here).
fn override_limit(descriptor: &Descriptor<'_>) -> Option<Limit> {
    let (requests, unit) = descriptor.limit_override?;
    let mut name = String::new();
    for (i, (key, value)) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            name.push('.');
        }
        name.push_str(key);
        if !value.is_empty() {
            name.push('_');
            name.push_str(value);
        }
    }
    unit.fixed_window(&name, requests).ok()
}

/// `limit` taking `hits`: the same limit when that is its cost; `Err` with the limit when it can never take that
/// much (more than its capacity), so that the descriptor is over the limit whatever the store holds. 0 takes
/// nothing and is admitted while the key is not over the limit (`hits_addend: 0`, Envoy's "check without
/// counting").
fn with_cost(limit: Cow<'_, Limit>, hits: u64) -> Result<Cow<'_, Limit>, Cow<'_, Limit>> {
    if limit.cost() == hits {
        return Ok(limit);
    }
    if hits > limit.algorithm().capacity() {
        return Err(limit);
    }
    Ok(Cow::Owned(limit.into_owned().with_cost(hits)))
}

/// Writes the descriptor's entries as a store key's value, `key=value|key=value` (`\` escaping `|`, `=` and
/// itself, so that no two descriptors write the same text), then closes the key.
fn push_entries(key: &mut String, entries: &[(&str, &str)], shared: &SharedEntries<'_>) {
    let start = key.len();
    for (depth, (name, value)) in entries.iter().enumerate() {
        if depth > 0 {
            key.push('|');
        }
        push_escaped(key, name, &['|', '=']);
        key.push('=');
        let value = shared.get(depth).copied().flatten().unwrap_or(value);
        push_escaped(key, value, &['|', '=']);
    }
    seal_key(key, start);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_written_so_that_no_two_descriptors_share_a_key() {
        let write = |entries: &[(&str, &str)]| {
            let mut key = String::from("h:{");
            push_entries(&mut key, entries, &[None; MAX_SHARED_DEPTH]);
            key
        };
        assert_eq!(
            write(&[("generic_key", "login"), ("remote_address", "1.2.3.4")]),
            "h:{generic_key=login|remote_address=1.2.3.4}"
        );
        assert_ne!(write(&[("a", "b|c=d")]), write(&[("a", "b"), ("c", "d")]));
        let mut shared = [None; MAX_SHARED_DEPTH];
        shared[0] = Some("files/*");
        let mut key = String::from("h:{");
        push_entries(&mut key, &[("files", "files/a.pdf")], &shared);
        assert_eq!(key, "h:{files=files/*}");
    }
}
