//! The descriptor tree of each domain, and how a request's descriptor finds its rule in it: as envoyproxy/ratelimit
//! documents its matching (key, optional value, nesting, the most specific match at each level).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::unit::Unit;
use crate::limiter::Limit;

/// `rls:` of the config: Envoy's rate limit service.
#[derive(Debug, Clone)]
pub struct RlsSettings {
    /// Where the gRPC listener binds.
    pub listen: SocketAddr,
    /// The domains, from the config file and `config_dir`.
    pub domains: Vec<Domain>,
    /// The folder of envoyproxy/ratelimit files read, if any.
    pub config_dir: Option<PathBuf>,
    /// What a request answers when the store fails and `store.on_error` is `deny`.
    pub when_unavailable: WhenUnavailable,
    /// Whether `response_headers_to_add` also carries `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    pub x_ratelimit_headers: bool,
    /// Which names the rate-limit fields of `response_headers_to_add` go by (`rls.headers`).
    pub headers: HeaderNames,
    /// Whether the gRPC health check says NOT_SERVING while the store is degraded (default: SERVING, as the
    /// service still answers by `on_error`).
    pub health_follows_store: bool,
}

/// The names the rate-limit fields of an answer go by (`rls.headers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderNames {
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`, with `Retry-After` when refused: what tollgate's own
    /// answers carry.
    #[default]
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (the draft's third version), the names
    /// envoyproxy/ratelimit sends with `LIMIT_RESPONSE_HEADERS_ENABLED`, so that a migration keeps what clients read.
    Draft03,
}

/// The answer to a request the store could not decide, under `store.on_error: deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenUnavailable {
    /// The gRPC status UNAVAILABLE: Envoy then applies its filter's `failure_mode_deny`.
    #[default]
    Unavailable,
    /// `OVER_LIMIT`: Envoy refuses the request (429).
    OverLimit,
}

/// One domain: a container of descriptor rules, named in every request.
#[derive(Debug, Clone)]
pub struct Domain {
    /// The name requests give.
    pub name: String,
    /// The top level of descriptors.
    pub descriptors: Vec<Node>,
    /// The envoyproxy/ratelimit file it was read from; `None` for the config file's `rls.domains`.
    pub file: Option<PathBuf>,
}

/// One descriptor of the tree: what one entry of a request's descriptor must be to reach it.
#[derive(Debug, Clone)]
pub struct Node {
    /// The entry's key.
    pub key: String,
    /// What the entry's value must be.
    pub value: ValueMatch,
    /// The rule of a descriptor that ends here, if any.
    pub rule: Option<Rule>,
    /// The next level, for descriptors with more entries.
    pub descriptors: Vec<Node>,
}

/// What an entry's value must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// Any value; each value is counted apart.
    Any,
    /// Exactly this value.
    Exact(String),
    /// A pattern with `*` (any run of characters, possibly empty); `shared`: every value matching it is counted
    /// under the pattern itself (envoyproxy/ratelimit's `share_threshold`).
    Pattern {
        /// The pattern as written.
        pattern: String,
        /// Counted under one key for every matching value.
        shared: bool,
    },
}

/// What applies to a descriptor that ends at a node.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The node's path, `key_value.key` as envoyproxy/ratelimit names it: what `tollgate check` and logs show.
    pub path: String,
    /// The limits, all checked (every algorithm; an envoyproxy/ratelimit file gives one fixed window).
    pub limits: Vec<Limit>,
    /// What the rule does besides its limits.
    pub kind: RuleKind,
    /// The name other rules' `replaces` refer to.
    pub name: Option<String>,
    /// The names of the rules this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// Decided and counted, never enforced: the request is answered OK whatever its limits say.
    pub shadow: bool,
}

/// A rule's nature beyond its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// Its limits decide.
    Limited,
    /// Never limited, never sent to the store (`unlimited: true`).
    Unlimited,
    /// Always over the limit (`requests_per_unit: 0` per this unit).
    Blocked(Unit),
}

/// The rule a descriptor found, and how its entries stand in the store key.
#[derive(Debug, Clone, Copy)]
pub struct Matched<'d> {
    /// The rule.
    pub rule: &'d Rule,
    /// Per entry, up to 8 deep: the pattern that stands for the value in the key (`share_threshold`), if any.
    pub shared: [Option<&'d str>; MAX_SHARED_DEPTH],
}

/// How deep a `share_threshold` pattern may stand and still share its key (deeper ones count each value apart).
pub const MAX_SHARED_DEPTH: usize = 8;

// === impl Domain ===

impl Domain {
    /// The rule a descriptor with `entries` (key, value) finds: at each level the node whose key and value equal
    /// the entry's, else the first whose pattern matches the value, else the one with the key alone. The rule
    /// applies only at the level of the descriptor's last entry: a descriptor longer or shorter than the path
    /// to a rule finds none. There is no going back: a more specific node without the next level ends the
    /// search even where a less specific one has it.
    pub fn rule_for<'d>(&'d self, entries: &[(&str, &str)]) -> Option<Matched<'d>> {
        let mut level = self.descriptors.as_slice();
        let mut shared = [None; MAX_SHARED_DEPTH];
        let (last, leading) = entries.split_last()?;
        for (depth, &(key, value)) in leading.iter().enumerate() {
            let node = find(level, key, value)?;
            note_shared(&mut shared, depth, node);
            level = node.descriptors.as_slice();
        }
        let node = find(level, last.0, last.1)?;
        note_shared(&mut shared, leading.len(), node);
        node.rule.as_ref().map(|rule| Matched { rule, shared })
    }

    /// Every rule of the domain, depth first in file order.
    pub fn rules(&self) -> Vec<&Rule> {
        fn walk<'d>(nodes: &'d [Node], out: &mut Vec<&'d Rule>) {
            for node in nodes {
                if let Some(rule) = &node.rule {
                    out.push(rule);
                }
                walk(&node.descriptors, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.descriptors, &mut out);
        out
    }
}

/// The most specific node of `level` for one entry (see [`Domain::rule_for`]). Levels are short (a few
/// descriptors), so a scan beats hashing the entry.
fn find<'d>(level: &'d [Node], key: &str, value: &str) -> Option<&'d Node> {
    let with_key = || level.iter().filter(move |node| node.key == key);
    with_key()
        .find(|node| matches!(&node.value, ValueMatch::Exact(v) if v == value))
        .or_else(|| {
            with_key().find(|node| match &node.value {
                ValueMatch::Pattern { pattern, .. } => pattern_matches(pattern, value),
                _ => false,
            })
        })
        .or_else(|| with_key().find(|node| node.value == ValueMatch::Any))
}

fn note_shared<'d>(shared: &mut [Option<&'d str>; MAX_SHARED_DEPTH], depth: usize, node: &'d Node) {
    if let (
        Some(slot),
        ValueMatch::Pattern {
            pattern,
            shared: true,
        },
    ) = (shared.get_mut(depth), &node.value)
    {
        *slot = Some(pattern.as_str());
    }
}

/// Whether `value` matches `pattern`, each `*` standing for any run of characters (possibly empty).
pub fn pattern_matches(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return value.is_empty();
    };
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let middle: Vec<&str> = parts.collect();
    let Some((last, middle)) = middle.split_last() else {
        // No `*`: the whole value.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

    fn rule(path: &str) -> Option<Rule> {
        let limit = Limit::new(
            path,
            Algorithm::FixedWindow {
                limit: 10,
                period_ms: 1000,
            },
            1,
        )
        .ok()?;
        Some(Rule {
            path: path.to_owned(),
            limits: vec![limit],
            kind: RuleKind::Limited,
            name: None,
            replaces: Vec::new(),
            shadow: false,
        })
    }

    fn node(key: &str, value: ValueMatch, ruled: bool, descriptors: Vec<Node>) -> Node {
        let path = match &value {
            ValueMatch::Any => key.to_owned(),
            ValueMatch::Exact(v) | ValueMatch::Pattern { pattern: v, .. } => format!("{key}_{v}"),
        };
        Node {
            key: key.to_owned(),
            rule: if ruled { rule(&path) } else { None },
            value,
            descriptors,
        }
    }

    fn exact(v: &str) -> ValueMatch {
        ValueMatch::Exact(v.to_owned())
    }

    /// envoyproxy/ratelimit's documented examples 2 and 3, side by side.
    fn domain() -> Domain {
        Domain {
            name: "d".into(),
            file: None,
            descriptors: vec![
                node(
                    "message_type",
                    exact("marketing"),
                    false,
                    vec![node("to_number", ValueMatch::Any, true, vec![])],
                ),
                node("to_number", ValueMatch::Any, true, vec![]),
                node("remote_address", ValueMatch::Any, true, vec![]),
                node("remote_address", exact("50.0.0.5"), true, vec![]),
                node(
                    "path",
                    ValueMatch::Pattern {
                        pattern: "/api/*/action".into(),
                        shared: true,
                    },
                    true,
                    vec![],
                ),
            ],
        }
    }

    fn path_of(domain: &Domain, entries: &[(&str, &str)]) -> Option<String> {
        domain.rule_for(entries).map(|m| m.rule.path.clone())
    }

    #[test]
    fn the_most_specific_node_of_each_level_is_taken() {
        let d = domain();
        assert_eq!(
            path_of(&d, &[("remote_address", "50.0.0.5")]).as_deref(),
            Some("remote_address_50.0.0.5")
        );
        assert_eq!(
            path_of(&d, &[("remote_address", "50.0.0.1")]).as_deref(),
            Some("remote_address")
        );
        assert_eq!(
            path_of(
                &d,
                &[("message_type", "marketing"), ("to_number", "2061111111")]
            )
            .as_deref(),
            Some("to_number")
        );
        assert_eq!(
            path_of(&d, &[("to_number", "2061111111")]).as_deref(),
            Some("to_number")
        );
    }

    #[test]
    fn a_descriptor_must_end_where_a_rule_is() {
        let d = domain();
        // Longer than the path to the rule, shorter than it, or through a level that is not there.
        assert!(path_of(&d, &[("remote_address", "1.2.3.4"), ("x", "y")]).is_none());
        assert!(path_of(&d, &[("message_type", "marketing")]).is_none());
        assert!(path_of(&d, &[("message_type", "other"), ("to_number", "1")]).is_none());
        assert!(path_of(&d, &[("unknown", "1")]).is_none());
        assert!(path_of(&d, &[]).is_none());
    }

    #[test]
    fn a_shared_pattern_stands_for_the_value() {
        let d = domain();
        let matched = d.rule_for(&[("path", "/api/7/action")]).expect("matches");
        assert_eq!(matched.shared[0], Some("/api/*/action"));
        assert!(d.rule_for(&[("path", "/api/7/other")]).is_none());
    }

    #[test]
    fn patterns_match_as_documented() {
        for (pattern, value, expected) in [
            ("value*", "value1", true),
            ("value*", "value", true),
            ("value*", "valu", false),
            ("/api/*/action", "/api/123/action", true),
            ("/api/*/action", "/api/123/other", false),
            (
                "/api/*/resource/*/action",
                "/api/v1/resource/9/action",
                true,
            ),
            ("/api/*/resource/*/action", "/api/v1/resource/action", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*", "", true),
            ("plain", "plain", true),
            ("plain", "plainer", false),
        ] {
            assert_eq!(
                pattern_matches(pattern, value),
                expected,
                "{pattern} ~ {value}"
            );
        }
    }

    proptest::proptest! {
        /// A pattern built from a value by replacing any one slice with `*` always matches it.
        #[test]
        fn a_value_matches_any_pattern_cut_from_it(value in "[a-c/]{0,12}", a in 0usize..13, b in 0usize..13) {
            let (start, end) = (a.min(b).min(value.len()), a.max(b).min(value.len()));
            let pattern = format!("{}*{}", &value[..start], &value[end..]);
            proptest::prop_assert!(pattern_matches(&pattern, &value), "{} ~ {}", pattern, value);
        }
    }
}
