//! Checks shared by the sections: names, addresses, networks, durations, counts.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;

use super::issues::Issues;
use crate::limiter::parse_duration;

/// A list of CIDRs (or plain addresses) at `at`; `None` if any is invalid.
pub(super) fn networks(issues: &mut Issues, at: &str, texts: &[String]) -> Option<Vec<IpNet>> {
    let before = issues.count();
    let nets: Vec<IpNet> = texts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let net = parse_net(text).ok_or_else(|| {
                format!("invalid CIDR {text:?} (use a network like 10.0.0.0/8 or an address like 10.0.0.1)")
            });
            issues.check(format!("{at}[{i}]"), net)
        })
        .collect();
    (issues.count() == before).then_some(nets)
}

/// A network, or a plain address meaning just that host (/32 or /128).
fn parse_net(text: &str) -> Option<IpNet> {
    let text = text.trim();
    text.parse::<IpNet>()
        .map(|net| net.trunc())
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .ok()
}

/// Route and limit names become parts of Redis keys, so they keep to a small, unambiguous alphabet.
pub(crate) fn check_name(issues: &mut Issues, at: &str, kind: &str, name: &str) {
    if name.is_empty() {
        issues.add(at, format_args!("a {kind} needs a name"));
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        issues.add(
            at,
            format_args!(
                "{kind} name {name:?} may only contain letters, digits, '_', '.' and '-' (it becomes part of Redis keys)"
            ),
        );
    }
}

/// Reports every repeated name on the later entry's `name` field.
pub(crate) fn unique_names<'a>(
    issues: &mut Issues,
    kind: &str,
    entries: impl Iterator<Item = (String, &'a str)>,
) {
    let mut first: HashMap<&str, String> = HashMap::new();
    for (at, name) in entries.filter(|(_, name)| !name.is_empty()) {
        match first.get(name) {
            Some(first_at) => issues.add(
                format!("{at}.name"),
                format_args!("duplicate {kind} name {name:?} (first used at {first_at})"),
            ),
            None => {
                first.insert(name, at);
            }
        }
    }
}

pub(crate) fn socket_addr(issues: &mut Issues, at: &str, text: &str) -> Option<SocketAddr> {
    let addr = text
        .trim()
        .parse::<SocketAddr>()
        .map_err(|_| format!("invalid address {text:?} (use IP:PORT, e.g. 0.0.0.0:8080)"));
    issues.check(at, addr)
}

pub(super) fn duration(issues: &mut Issues, at: &str, text: &str) -> Option<Duration> {
    issues.check(at, parse_duration(text))
}

pub(super) fn positive_duration(issues: &mut Issues, at: &str, text: &str) -> Option<Duration> {
    let value = duration(issues, at, text)?;
    if value.is_zero() {
        issues.add(at, format_args!("must be greater than 0 (got {text:?})"));
        return None;
    }
    Some(value)
}

pub(super) fn positive_count(issues: &mut Issues, at: &str, value: u64) -> Option<usize> {
    let count = usize::try_from(value)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("must be greater than 0 (got {value})"));
    issues.check(at, count)
}
