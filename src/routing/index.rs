//! An index over the routes' hosts, exact paths and path prefixes: the first route that matches a request, found
//! among the few routes that could match it instead of by testing every route before it.
//!
//! The index only narrows: each candidate is still tested by its own [`Matcher`], in route order, so the index
//! answers what the linear scan answers as long as every route that matches a request is among its candidates.
//! Keys are therefore folded more generously than any matching rule (ASCII case, trailing slashes, `;` parameters
//! with the dot segments they hide), and a request is looked up under each spelling a rule could compare.

use std::borrow::Cow;
use std::collections::HashMap;

use foldhash::fast::RandomState;
use smallvec::SmallVec;

use super::matcher::{HostPattern, Matcher, RequestTarget};

/// The routes of a config, indexed by host and path; route numbers are positions in the route list.
#[derive(Debug, Default)]
pub struct RouteIndex {
    /// Routes without a host condition, or with one the index does not narrow on (`*`, `*x.com`).
    any_host: PathIndex,
    /// `host: api.example.com`, by host.
    hosts: HashMap<Box<str>, PathIndex, RandomState>,
    /// `host: *.example.com`, by `.example.com`.
    host_suffixes: HashMap<Box<str>, PathIndex, RandomState>,
}

/// The routes of one host group, by path.
#[derive(Debug, Default)]
struct PathIndex {
    /// Routes without a path condition (or with the prefix `/`): candidates for every path.
    any_path: Vec<u32>,
    /// `path:`, by folded path (a route with both `path` and `path_prefix` is here).
    exact: HashMap<Box<str>, Vec<u32>, RandomState>,
    /// `path_prefix:`, by folded prefix: a request's candidates are those of each of its whole-segment prefixes.
    prefixes: HashMap<Box<str>, Vec<u32>, RandomState>,
}

/// Candidate lists of one request: each sorted by route number.
type Candidates<'a> = SmallVec<[&'a [u32]; 8]>;

// === impl RouteIndex ===

impl RouteIndex {
    /// Indexes `routes`, numbered by their position.
    pub fn new<'a>(routes: impl IntoIterator<Item = &'a Matcher>) -> Self {
        let mut index = Self::default();
        for (number, matcher) in routes.into_iter().enumerate() {
            let Ok(number) = u32::try_from(number) else {
                break;
            };
            let group = match matcher.host_pattern() {
                Some(HostPattern::Exact(host)) => {
                    index.hosts.entry(host.as_str().into()).or_default()
                }
                Some(HostPattern::Suffix(suffix)) if suffix.starts_with('.') => index
                    .host_suffixes
                    .entry(suffix.as_str().into())
                    .or_default(),
                _ => &mut index.any_host,
            };
            group.insert(number, matcher);
        }
        index
    }

    /// The first route (by number) among the candidates for `target` for which `matches` holds.
    pub fn first_match(
        &self,
        target: &RequestTarget<'_>,
        mut matches: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        let keys = PathKeys::of(target.path);
        let mut lists = Candidates::new();
        self.any_host.candidates(&keys, &mut lists);
        if let Some(host) = target.host {
            if let Some(group) = self.hosts.get(host) {
                group.candidates(&keys, &mut lists);
            }
            if !self.host_suffixes.is_empty() {
                for (at, _) in host.match_indices('.') {
                    if let Some(group) = self.host_suffixes.get(&host[at..]) {
                        group.candidates(&keys, &mut lists);
                    }
                }
            }
        }
        first_in_order(&mut lists, &mut matches)
    }
}

/// Walks the union of `lists` in ascending route order (a route may be in several) until `matches` holds.
fn first_in_order(
    lists: &mut Candidates<'_>,
    matches: &mut impl FnMut(usize) -> bool,
) -> Option<usize> {
    loop {
        let next = lists
            .iter()
            .filter_map(|list| list.first())
            .min()
            .copied()?;
        if matches(next as usize) {
            return Some(next as usize);
        }
        for list in lists.iter_mut() {
            if list.first() == Some(&next) {
                *list = &list[1..];
            }
        }
    }
}

// === impl PathIndex ===

impl PathIndex {
    fn insert(&mut self, number: u32, matcher: &Matcher) {
        if let Some(path) = matcher.exact_path() {
            for key in PathKeys::of(path).spellings() {
                push_once(self.exact.entry(key.into()).or_default(), number);
            }
            return;
        }
        match matcher.prefix() {
            Some(prefix) if !prefix.trim_end_matches('/').is_empty() => {
                for key in PathKeys::of(prefix).spellings() {
                    let list = if key == "/" {
                        &mut self.any_path
                    } else {
                        self.prefixes.entry(key.into()).or_default()
                    };
                    push_once(list, number);
                }
            }
            _ => self.any_path.push(number),
        }
    }

    fn candidates<'a>(&'a self, keys: &PathKeys<'_>, lists: &mut Candidates<'a>) {
        if !self.any_path.is_empty() {
            lists.push(&self.any_path);
        }
        for key in keys.spellings() {
            if let Some(list) = self.exact.get(key) {
                lists.push(list);
            }
            if self.prefixes.is_empty() {
                continue;
            }
            // Every whole-segment prefix of the path: `/a/b` is under `/a` and `/a/b`.
            for (at, _) in key.match_indices('/').skip(1) {
                if let Some(list) = self.prefixes.get(&key[..at]) {
                    lists.push(list);
                }
            }
            if let Some(list) = self.prefixes.get(key) {
                lists.push(list);
            }
        }
    }
}

/// Route numbers are pushed in ascending order; one route may fold to the same key twice.
fn push_once(list: &mut Vec<u32>, number: u32) {
    if list.last() != Some(&number) {
        list.push(number);
    }
}

/// The spellings under which a path is indexed or looked up: ASCII case folded and trailing slashes dropped; and,
/// when it has `;` parameters, also with them removed from every segment and the dot segments that uncovers
/// resolved (`/x/..;/login` is then `/login`).
#[derive(Debug)]
struct PathKeys<'p> {
    plain: Cow<'p, str>,
    without_parameters: Option<String>,
}

impl<'p> PathKeys<'p> {
    fn of(path: &'p str) -> Self {
        let trimmed = path.trim_end_matches('/');
        let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
        let plain = if trimmed.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(trimmed.to_ascii_lowercase())
        } else {
            Cow::Borrowed(trimmed)
        };
        let without_parameters = plain.contains(';').then(|| without_parameters(&plain));
        Self {
            plain,
            without_parameters,
        }
    }

    fn spellings(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.plain.as_ref()).chain(self.without_parameters.as_deref())
    }
}

/// `path` with `;...` cut from every segment, empty segments dropped and dot segments resolved.
fn without_parameters(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        let segment = segment.split(';').next().unwrap_or_default();
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    if segments.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(path.len());
    for segment in segments {
        out.push('/');
        out.push_str(segment);
    }
    out
}

#[cfg(test)]
mod tests {
    use http::Method;
    use proptest::prelude::*;

    use super::*;
    use crate::routing::RouteMatch;

    fn linear(matchers: &[Matcher], target: &RequestTarget<'_>) -> Option<usize> {
        matchers.iter().position(|m| m.matches(target))
    }

    fn indexed(matchers: &[Matcher], target: &RequestTarget<'_>) -> Option<usize> {
        RouteIndex::new(matchers).first_match(target, |i| matchers[i].matches(target))
    }

    /// Segments that exercise every folding rule: case, `;` parameters, dot segments, segment boundaries.
    fn segment() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "a",
            "A",
            "b",
            "ab",
            "api",
            "API",
            "v1",
            "a;x=1",
            "..;",
            "..",
            ".",
            ";p",
            "caf%C3%A9",
        ])
    }

    fn path() -> impl Strategy<Value = String> {
        (prop::collection::vec(segment(), 0..4), any::<bool>()).prop_map(|(segments, slash)| {
            let mut path: String = segments.iter().map(|s| format!("/{s}")).collect();
            if path.is_empty() || slash {
                path.push('/');
            }
            path
        })
    }

    fn host_condition() -> impl Strategy<Value = Option<&'static str>> {
        prop::sample::select(vec![
            None,
            Some("a.com"),
            Some("b.a.com"),
            Some("*.a.com"),
            Some("*a.com"),
            Some("*"),
            Some("B.A.COM"),
        ])
    }

    fn request_host() -> impl Strategy<Value = Option<&'static str>> {
        prop::sample::select(vec![
            None,
            Some("a.com"),
            Some("b.a.com"),
            Some("c.b.a.com"),
            Some("xa.com"),
            Some("other.org"),
        ])
    }

    fn method() -> impl Strategy<Value = Method> {
        prop::sample::select(vec![Method::GET, Method::POST, Method::DELETE])
    }

    fn route() -> impl Strategy<Value = RouteMatch> {
        (
            prop::option::of(path()),
            prop::option::of(path()),
            prop::collection::vec(method(), 0..2),
            host_condition(),
            any::<bool>(),
        )
            .prop_map(
                |(prefix, exact, methods, host, case_sensitive)| RouteMatch {
                    path_prefix: prefix,
                    path: exact,
                    methods,
                    host: host.map(str::to_owned),
                    case_sensitive,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the route table and the request, the index picks the route the linear scan picks.
        #[test]
        fn the_index_picks_the_route_the_linear_scan_picks(
            routes in prop::collection::vec(route(), 0..40),
            requests in prop::collection::vec((method(), request_host(), path()), 1..20),
        ) {
            let matchers: Vec<Matcher> = routes.iter().map(Matcher::new).collect();
            let index = RouteIndex::new(&matchers);
            for (method, host, path) in &requests {
                let target = RequestTarget { method, host: *host, path };
                let found = index.first_match(&target, |i| matchers[i].matches(&target));
                prop_assert_eq!(found, linear(&matchers, &target), "{:?} {:?} {}", method, host, path);
            }
        }
    }

    #[test]
    fn the_last_of_many_routes_is_found_among_few_candidates() {
        let matchers: Vec<Matcher> = (0..10_000)
            .map(|i| {
                Matcher::new(&RouteMatch {
                    path_prefix: Some(format!("/r{i}")),
                    ..RouteMatch::default()
                })
            })
            .collect();
        let index = RouteIndex::new(&matchers);
        let target = RequestTarget {
            method: &Method::GET,
            host: None,
            path: "/r9999/x",
        };
        let mut tested = 0;
        let found = index.first_match(&target, |i| {
            tested += 1;
            matchers[i].matches(&target)
        });
        assert_eq!(found, Some(9999));
        assert_eq!(tested, 1, "only the route under /r9999 is a candidate");
        assert_eq!(indexed(&matchers, &target), linear(&matchers, &target));
    }

    #[test]
    fn first_match_wins_across_hosts_paths_and_prefixes() {
        let spec = |prefix: Option<&str>, path: Option<&str>, host: Option<&str>| {
            Matcher::new(&RouteMatch {
                path_prefix: prefix.map(str::to_owned),
                path: path.map(str::to_owned),
                host: host.map(str::to_owned),
                ..RouteMatch::default()
            })
        };
        let matchers = vec![
            spec(Some("/api/v1"), None, Some("*.example.com")),
            spec(None, Some("/login"), None),
            spec(Some("/api"), None, Some("api.example.com")),
            spec(Some("/"), None, None),
        ];
        let at = |host, path| {
            indexed(
                &matchers,
                &RequestTarget {
                    method: &Method::GET,
                    host,
                    path,
                },
            )
        };
        assert_eq!(at(Some("api.example.com"), "/api/v1/x"), Some(0));
        assert_eq!(at(Some("api.example.com"), "/api/v2"), Some(2));
        assert_eq!(at(Some("example.com"), "/api/v1"), Some(3));
        assert_eq!(at(None, "/login"), Some(1));
        assert_eq!(at(None, "/other"), Some(3));
    }
}
