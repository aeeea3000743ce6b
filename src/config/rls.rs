//! `rls:`, Envoy's rate limit service: the listener, domains written in tollgate's own form (every algorithm), and
//! `config_dir`, a folder of envoyproxy/ratelimit files read as they are.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::limits::{limit_settings, unique_limit_names};
use super::raw::{Ordered, RawLimit};
use super::validate::{check_name, socket_addr, Issues};
use crate::limiter::{LeakyMode, Limit};
use crate::rls::{
    Domain, HeaderNames, Node, RlsSettings, Rule, RuleKind, Unit, ValueMatch, WhenUnavailable,
};

/// `rls:` as written.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawRls {
    pub listen: String,
    pub domains: Ordered<RawDomain>,
    pub config_dir: Option<String>,
    pub when_unavailable: RawWhenUnavailable,
    pub x_ratelimit_headers: bool,
    pub headers: RawHeaderNames,
    pub health_follows_store: bool,
}

/// `rls.headers`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawHeaderNames {
    #[default]
    Ietf,
    Draft03,
}

/// `rls.when_unavailable`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawWhenUnavailable {
    #[default]
    Unavailable,
    OverLimit,
}

/// One domain of `rls.domains`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawDomain {
    pub descriptors: Vec<RawDescriptor>,
}

/// One descriptor in tollgate's form: envoyproxy/ratelimit's nesting, with tollgate's `limits:`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    pub key: String,
    pub value: Option<String>,
    pub limits: Vec<RawLimit>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    pub name: Option<String>,
    pub replaces: Vec<String>,
    pub share_threshold: bool,
    pub descriptors: Vec<RawDescriptor>,
}

/// An envoyproxy/ratelimit file, with every key its README documents.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawRatelimitFile {
    pub domain: String,
    pub descriptors: Vec<RawEnvoyDescriptor>,
}

/// One descriptor of an envoyproxy/ratelimit file.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawEnvoyDescriptor {
    pub key: String,
    pub value: Option<String>,
    pub rate_limit: Option<RawEnvoyRateLimit>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    /// Metric naming only: tollgate's metrics are per domain.
    pub detailed_metric: bool,
    /// Metric naming only, as `detailed_metric`.
    pub value_to_metric: bool,
    pub share_threshold: bool,
    /// Sent by envoyproxy/ratelimit as response metadata when so configured; accepted and not sent.
    pub metadata: Option<serde_yaml::Value>,
    pub descriptors: Vec<RawEnvoyDescriptor>,
}

/// `rate_limit:` of an envoyproxy/ratelimit descriptor.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawEnvoyRateLimit {
    pub unit: Option<String>,
    pub requests_per_unit: Option<u64>,
    pub unlimited: bool,
    pub name: Option<String>,
    pub replaces: Vec<RawReplaces>,
}

/// One entry of `replaces:` in an envoyproxy/ratelimit file.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawReplaces {
    pub name: String,
}

impl Default for RawRls {
    fn default() -> Self {
        RawRls {
            listen: "0.0.0.0:8081".to_owned(),
            domains: Ordered::default(),
            config_dir: None,
            when_unavailable: RawWhenUnavailable::default(),
            x_ratelimit_headers: false,
            headers: RawHeaderNames::default(),
            health_follows_store: false,
        }
    }
}

/// `rls:` without the domains of `config_dir` (read afterwards, each file located on its own).
pub(crate) fn rls(issues: &mut Issues, raw: &RawRls, folder: &Path) -> Option<RlsSettings> {
    let before = issues.count();
    let listen = socket_addr(issues, "rls.listen", &raw.listen);
    let domains: Vec<Domain> = raw
        .domains
        .0
        .iter()
        .map(|(name, domain)| {
            let at = format!("rls.domains.{name}");
            check_domain_name(issues, &at, name);
            let descriptors = descriptors(
                issues,
                &format!("{at}.descriptors"),
                "",
                &domain.descriptors,
            );
            Domain {
                name: name.clone(),
                descriptors,
                file: None,
            }
        })
        .collect();
    let config_dir = raw.config_dir.as_ref().map(|dir| folder.join(dir));
    if raw.domains.0.is_empty() && config_dir.is_none() {
        issues.add(
            "rls",
            "the rate limit service needs domains (rls.domains) or a folder of envoyproxy/ratelimit files \
             (rls.config_dir)",
        );
    }
    if issues.count() != before {
        return None;
    }
    let settings = RlsSettings {
        listen: listen?,
        domains,
        when_unavailable: match raw.when_unavailable {
            RawWhenUnavailable::Unavailable => WhenUnavailable::Unavailable,
            RawWhenUnavailable::OverLimit => WhenUnavailable::OverLimit,
        },
        x_ratelimit_headers: raw.x_ratelimit_headers,
        headers: match raw.headers {
            RawHeaderNames::Ietf => HeaderNames::Ietf,
            RawHeaderNames::Draft03 => HeaderNames::Draft03,
        },
        health_follows_store: raw.health_follows_store,
        config_dir,
    };
    Some(settings)
}

/// A domain name stands in store keys, before the hash tag: no braces, no control characters.
fn check_domain_name(issues: &mut Issues, at: &str, name: &str) {
    if name.is_empty() {
        issues.add(at, "a domain needs a name");
    } else if name.chars().any(|c| c == '{' || c == '}' || c.is_control()) {
        issues.add(
            at,
            format_args!("domain {name:?} may not contain braces or control characters (it becomes part of Redis keys)"),
        );
    }
}

/// A descriptor as one of the two file forms writes it: tollgate's (`rls.domains`) or envoyproxy/ratelimit's.
trait DescriptorForm: Sized {
    /// Its key, its value as written, `share_threshold`, and the descriptors nested in it.
    fn entry(&self) -> (&str, Option<&str>, bool, &[Self]);
    /// Its rule at `at`, whose path is `path` (`generic_key_login.remote_address`), if it has one.
    fn rule(&self, issues: &mut Issues, at: &str, path: &str) -> Option<Rule>;
}

impl DescriptorForm for RawDescriptor {
    fn entry(&self) -> (&str, Option<&str>, bool, &[Self]) {
        let value = self.value.as_deref();
        (&self.key, value, self.share_threshold, &self.descriptors)
    }
    fn rule(&self, issues: &mut Issues, at: &str, path: &str) -> Option<Rule> {
        descriptor_rule(issues, at, path, self)
    }
}

impl DescriptorForm for RawEnvoyDescriptor {
    fn entry(&self) -> (&str, Option<&str>, bool, &[Self]) {
        let value = self.value.as_deref();
        (&self.key, value, self.share_threshold, &self.descriptors)
    }
    fn rule(&self, issues: &mut Issues, at: &str, path: &str) -> Option<Rule> {
        if self.quota_mode {
            issues.add(
                format!("{at}.quota_mode"),
                "quota_mode is not supported by tollgate's rate limit service (remove it: the descriptor's limit is \
                 then enforced)",
            );
        }
        self.rate_limit.as_ref().and_then(|rate_limit| {
            envoy_rule(
                issues,
                &format!("{at}.rate_limit"),
                path,
                rate_limit,
                self.shadow_mode,
            )
        })
    }
}

/// One level of descriptors, in either form, at `at` (`rls.domains.edge.descriptors`), under `parent` (the path
/// of the level above, `generic_key_login.`).
fn descriptors<D: DescriptorForm>(
    issues: &mut Issues,
    at: &str,
    parent: &str,
    raw: &[D],
) -> Vec<Node> {
    let mut nodes = Vec::with_capacity(raw.len());
    for (i, descriptor) in raw.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let before = issues.count();
        let (key, written, share_threshold, children) = descriptor.entry();
        let value = value_match(issues, &at, key, written, share_threshold);
        let path = format!("{parent}{}", step(key, written));
        unique_level(issues, &at, &nodes, key, written);
        let rule = descriptor.rule(issues, &at, &path);
        let children = descriptors(
            issues,
            &format!("{at}.descriptors"),
            &format!("{path}."),
            children,
        );
        if issues.count() == before {
            if let Some(value) = value {
                nodes.push(Node {
                    key: key.to_owned(),
                    value,
                    rule,
                    descriptors: children,
                });
            }
        }
    }
    nodes
}

/// The rule of a descriptor in tollgate's form, if it has limits or is unlimited.
fn descriptor_rule(issues: &mut Issues, at: &str, path: &str, raw: &RawDescriptor) -> Option<Rule> {
    if raw.unlimited && !raw.limits.is_empty() {
        issues.add(
            format!("{at}.unlimited"),
            "an unlimited descriptor has no limits",
        );
        return None;
    }
    check_replaces(
        issues,
        raw.name.as_deref(),
        raw.replaces.iter().map(String::as_str),
        |j| format!("{at}.replaces[{j}]"),
    );
    if let Some(name) = &raw.name {
        check_name(issues, &format!("{at}.name"), "descriptor", name);
    }
    unique_limit_names(issues, at, &raw.limits);
    let mut limits = Vec::with_capacity(raw.limits.len());
    for (j, limit) in raw.limits.iter().enumerate() {
        let Some(limit) = descriptor_limit(issues, &format!("{at}.limits[{j}]"), limit) else {
            continue;
        };
        let shadow = limit.is_shadow() || raw.shadow_mode;
        limits.push(limit.with_shadow(shadow));
    }
    if limits.is_empty() && !raw.unlimited {
        return None;
    }
    Some(Rule {
        path: path.to_owned(),
        limits,
        kind: if raw.unlimited {
            RuleKind::Unlimited
        } else {
            RuleKind::Limited
        },
        name: raw.name.clone(),
        replaces: raw.replaces.clone(),
        shadow: raw.shadow_mode,
    })
}

/// One limit of a descriptor: what the rate limit service can apply, which never sees a request's key parts, its
/// answer or its end.
fn descriptor_limit(issues: &mut Issues, at: &str, limit: &RawLimit) -> Option<Limit> {
    if limit.key.is_some() {
        issues.add(
            format!("{at}.key"),
            "a descriptor's limits are keyed by the descriptor's entries: remove key",
        );
        return None;
    }
    let settings = limit_settings(issues, at, limit)?;
    if let Some(kind) = settings.counts.tokens() {
        issues.add(
            format!("{at}.counts"),
            format_args!(
                "{} counts what answers report, and the rate limit service never sees an answer: count requests",
                kind.name()
            ),
        );
        return None;
    }
    if settings.counts.statuses().is_some() {
        issues.add(
            format!("{at}.counts"),
            "a limit that counts answers by status needs to see the answer, and the rate limit service never \
             does: count requests",
        );
        return None;
    }
    if let LeakyMode::Delay { .. } = leaky_mode(&settings.limit) {
        issues.add(
            format!("{at}.mode"),
            "the rate limit service answers at once and cannot hold a request: use mode: reject",
        );
        return None;
    }
    if settings.limit.algorithm().holds_slots() {
        issues.add(
            format!("{at}.algorithm"),
            "the rate limit service never sees a request end, so it could never release a slot: concurrency \
             limits belong on the gateway's routes",
        );
        return None;
    }
    Some(settings.limit)
}

fn leaky_mode(limit: &Limit) -> LeakyMode {
    match limit.algorithm() {
        crate::limiter::Algorithm::LeakyBucket { mode, .. } => *mode,
        _ => LeakyMode::Reject,
    }
}

/// What an entry's value must be: a `*` makes a pattern (`share_threshold` only there).
fn value_match(
    issues: &mut Issues,
    at: &str,
    key: &str,
    value: Option<&str>,
    share_threshold: bool,
) -> Option<ValueMatch> {
    if key.is_empty() {
        issues.add(format!("{at}.key"), "a descriptor needs a key");
        return None;
    }
    let is_pattern = value.is_some_and(|v| v.contains('*'));
    if share_threshold && !is_pattern {
        issues.add(
            format!("{at}.share_threshold"),
            "share_threshold needs a value with '*' (the values it matches share one count)",
        );
        return None;
    }
    Some(match value {
        None | Some("") => ValueMatch::Any,
        Some(v) if is_pattern => ValueMatch::Pattern {
            pattern: v.to_owned(),
            shared: share_threshold,
        },
        Some(v) => ValueMatch::Exact(v.to_owned()),
    })
}

/// One step of a rule's path: `key` or `key_value`, as envoyproxy/ratelimit names descriptors.
fn step(key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) if !value.is_empty() => format!("{key}_{value}"),
        _ => key.to_owned(),
    }
}

/// Two descriptors of one level with the same key and value could never both be reached.
fn unique_level(issues: &mut Issues, at: &str, level: &[Node], key: &str, value: Option<&str>) {
    let value = value.filter(|v| !v.is_empty());
    let taken = level.iter().any(|node| {
        node.key == key
            && match (&node.value, value) {
                (ValueMatch::Any, None) => true,
                (ValueMatch::Exact(v) | ValueMatch::Pattern { pattern: v, .. }, Some(value)) => {
                    v == value
                }
                _ => false,
            }
    });
    if taken {
        issues.add(
            format!("{at}.key"),
            format_args!("duplicate descriptor {:?} at this level", step(key, value)),
        );
    }
}

/// `replaces` names are not empty and not the rule's own name.
fn check_replaces<'a>(
    issues: &mut Issues,
    own: Option<&str>,
    replaces: impl Iterator<Item = &'a str>,
    path: impl Fn(usize) -> String,
) {
    for (j, name) in replaces.enumerate() {
        if name.is_empty() {
            issues.add(path(j), "a replaced rule needs a name");
        } else if own == Some(name) {
            issues.add(path(j), "a rule cannot replace itself");
        }
    }
}

/// An envoyproxy/ratelimit file's domain, its problems on its own paths (`descriptors[0].rate_limit.unit`).
pub(crate) fn ratelimit_file(
    issues: &mut Issues,
    raw: &RawRatelimitFile,
    file: &Path,
) -> Option<Domain> {
    let before = issues.count();
    if raw.domain.is_empty() {
        issues.add("domain", "a file needs a domain");
    } else {
        check_domain_name(issues, "domain", &raw.domain);
    }
    let descriptors = descriptors(issues, "descriptors", "", &raw.descriptors);
    (issues.count() == before).then(|| Domain {
        name: raw.domain.clone(),
        descriptors,
        file: Some(file.to_owned()),
    })
}

/// `rate_limit:` of an envoyproxy/ratelimit descriptor: `requests_per_unit` per aligned window of one `unit`, a
/// fixed window; 0 refuses everything; `unlimited` never limits.
fn envoy_rule(
    issues: &mut Issues,
    at: &str,
    path: &str,
    raw: &RawEnvoyRateLimit,
    shadow: bool,
) -> Option<Rule> {
    let before = issues.count();
    check_replaces(
        issues,
        raw.name.as_deref(),
        raw.replaces.iter().map(|r| r.name.as_str()),
        |j| format!("{at}.replaces[{j}].name"),
    );
    let unit = match (&raw.unit, raw.unlimited) {
        (Some(_), true) => {
            issues.add(format!("{at}.unit"), "an unlimited rate limit has no unit");
            None
        }
        (None, true) => None,
        (None, false) => {
            issues.add(
                format!("{at}.unit"),
                "a rate limit needs a unit (second, minute, hour, day, week, month or year)",
            );
            None
        }
        (Some(text), false) => {
            let unit = Unit::parse(text);
            if unit.is_none() {
                issues.add(
                    format!("{at}.unit"),
                    format_args!(
                        "invalid unit {text:?} (use second, minute, hour, day, week, month or year)"
                    ),
                );
            }
            unit
        }
    };
    if !raw.unlimited && raw.requests_per_unit.is_none() {
        issues.add(
            format!("{at}.requests_per_unit"),
            "a rate limit needs requests_per_unit",
        );
    }
    if issues.count() != before {
        return None;
    }
    let name = raw.name.clone().filter(|n| !n.is_empty());
    let (kind, limits) = match (raw.unlimited, unit, raw.requests_per_unit) {
        (true, _, _) => (RuleKind::Unlimited, Vec::new()),
        (false, Some(unit), Some(0)) => (RuleKind::Blocked(unit), Vec::new()),
        (false, Some(unit), Some(requests)) => {
            let limit_name = key_safe(name.as_deref().unwrap_or(path));
            let limit = issues.check(
                format!("{at}.requests_per_unit"),
                unit.fixed_window(&limit_name, requests),
            )?;
            (RuleKind::Limited, vec![limit.with_shadow(shadow)])
        }
        _ => return None,
    };
    Some(Rule {
        path: path.to_owned(),
        limits,
        kind,
        name,
        replaces: raw.replaces.iter().map(|r| r.name.clone()).collect(),
        shadow,
    })
}

/// A rule's path or name as a limit name: it stands in store keys and in `RateLimit-Policy`'s quoted names, so
/// anything but letters, digits, `_`, `.` and `-` becomes `_`.
fn key_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The envoyproxy/ratelimit files of `dir`: `*.yaml` and `*.yml`, not those whose name starts with `.`, in name
/// order.
pub(crate) fn ratelimit_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| n.starts_with('.'));
            let yaml = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e == "yaml" || e == "yml");
            !hidden && yaml && path.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}
