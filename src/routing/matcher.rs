//! Route matchers: the compiled `match:` of one route, tested against the canonical request.

use http::Method;

/// What a route matches (its `match:` in the config). Every given condition must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// Path prefix, matched on whole segments (`/api` takes `/api` and `/api/x`, not `/apix`).
    pub path_prefix: Option<String>,
    /// Exact path.
    pub path: Option<String>,
    /// Allowed methods; empty means any.
    pub methods: Vec<Method>,
    /// Host, case-insensitive, without port; `*.example.com` matches any subdomain.
    pub host: Option<String>,
    /// Paths compared without regard to ASCII case.
    pub case_insensitive: bool,
}

/// The compiled conditions of one route.
#[derive(Debug, Clone)]
pub struct Matcher {
    path_prefix: Option<String>,
    path: Option<String>,
    methods: Vec<Method>,
    host: Option<HostPattern>,
    /// `case_insensitive: true`: paths compared without regard to ASCII case, for upstreams that serve `/API` as
    /// `/api` (a case-sensitive route would let `/API` past its limits to them).
    case_insensitive: bool,
}

#[derive(Debug, Clone)]
pub(super) enum HostPattern {
    Exact(String),
    /// `*.example.com`: any subdomain of `.example.com` (stored with the leading dot).
    Suffix(String),
}

/// The parts of a request that routes match on, all from the canonical request.
#[derive(Debug, Clone, Copy)]
pub struct RequestTarget<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The host, lower-cased, without port.
    pub host: Option<&'a str>,
    /// The normalised path (see [`normalize_path`](super::normalize_path)).
    pub path: &'a str,
}

// === impl Matcher ===

impl Matcher {
    /// Compiles a route's `match:`.
    pub fn new(spec: &RouteMatch) -> Self {
        let prefix = spec.path_prefix.as_ref().map(|p| {
            // `/api/` and `/api` mean the same subtree.
            let trimmed = p.trim_end_matches('/');
            if trimmed.is_empty() {
                "/".to_owned()
            } else {
                trimmed.to_owned()
            }
        });
        let host = spec.host.as_ref().map(|h| {
            let h = h.to_ascii_lowercase();
            match h.strip_prefix('*') {
                Some(suffix) => HostPattern::Suffix(suffix.to_owned()),
                None => HostPattern::Exact(h),
            }
        });
        Self {
            path_prefix: prefix,
            path: spec.path.clone(),
            methods: spec.methods.clone(),
            host,
            case_insensitive: spec.case_insensitive,
        }
    }

    /// Whether the route names `method` (an empty list names every method but CONNECT, which is never proxied
    /// unless asked for).
    pub fn names_method(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Whether paths are matched without regard to case.
    pub fn is_case_insensitive(&self) -> bool {
        self.case_insensitive
    }

    /// Whether every condition holds for `target`.
    pub fn matches(&self, target: &RequestTarget<'_>) -> bool {
        if !self.methods.is_empty() && !self.methods.contains(target.method) {
            return false;
        }
        if let Some(path) = &self.path {
            let same = if self.case_insensitive {
                target.path.eq_ignore_ascii_case(path)
            } else {
                target.path == path
            };
            if !same {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix {
            if !prefix_matches(prefix, target.path, self.case_insensitive) {
                return false;
            }
        }
        match &self.host {
            None => true,
            Some(HostPattern::Exact(h)) => target.host == Some(h.as_str()),
            Some(HostPattern::Suffix(s)) => target
                .host
                .is_some_and(|h| h.len() > s.len() && h.ends_with(s.as_str())),
        }
    }
}

// === the conditions, for the route index ===

impl Matcher {
    pub(super) fn exact_path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    pub(super) fn prefix(&self) -> Option<&str> {
        self.path_prefix.as_deref()
    }

    pub(super) fn host_pattern(&self) -> Option<&HostPattern> {
        self.host.as_ref()
    }
}

/// Prefixes match whole segments: `/api` takes `/api` and `/api/v1`, not `/apiary`.
fn prefix_matches(prefix: &str, path: &str, case_insensitive: bool) -> bool {
    if prefix == "/" {
        return true;
    }
    let Some(head) = path.get(..prefix.len()) else {
        return false;
    };
    let same = if case_insensitive {
        head.eq_ignore_ascii_case(prefix)
    } else {
        head == prefix
    };
    let rest = &path[prefix.len()..];
    same && (rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(
        prefix: Option<&str>,
        path: Option<&str>,
        methods: &[Method],
        host: Option<&str>,
    ) -> Matcher {
        Matcher::new(&RouteMatch {
            path_prefix: prefix.map(str::to_owned),
            path: path.map(str::to_owned),
            methods: methods.to_vec(),
            host: host.map(str::to_owned),
            case_insensitive: false,
        })
    }

    fn target<'a>(method: &'a Method, host: Option<&'a str>, path: &'a str) -> RequestTarget<'a> {
        RequestTarget { method, host, path }
    }

    #[test]
    fn prefix_matches_whole_segments() {
        let m = matcher(Some("/api"), None, &[], None);
        assert!(m.matches(&target(&Method::GET, None, "/api")));
        assert!(m.matches(&target(&Method::GET, None, "/api/v1/x")));
        assert!(!m.matches(&target(&Method::GET, None, "/apiary")));
        assert!(!m.matches(&target(&Method::GET, None, "/API/x")));
        assert!(!m.matches(&target(&Method::GET, None, "/ap")));
        assert!(matcher(Some("/"), None, &[], None).matches(&target(
            &Method::GET,
            None,
            "/anything"
        )));
    }

    #[test]
    fn case_insensitive_routes_take_every_spelling() {
        let m = Matcher::new(&RouteMatch {
            path_prefix: Some("/api".into()),
            case_insensitive: true,
            ..RouteMatch::default()
        });
        for path in ["/api", "/API/x", "/Api/v1"] {
            assert!(m.matches(&target(&Method::GET, None, path)), "{path}");
        }
        assert!(!m.matches(&target(&Method::GET, None, "/APIary")));
        // A multi-byte character where the prefix would end is no match, and no panic.
        assert!(!m.matches(&target(&Method::GET, None, "/ap\u{e9}")));
        let exact = Matcher::new(&RouteMatch {
            path: Some("/login".into()),
            case_insensitive: true,
            ..RouteMatch::default()
        });
        assert!(exact.matches(&target(&Method::POST, None, "/LOGIN")));
    }

    #[test]
    fn methods_path_and_host_must_all_hold() {
        let m = matcher(None, Some("/login"), &[Method::POST], Some("*.example.com"));
        assert!(m.matches(&target(&Method::POST, Some("api.example.com"), "/login")));
        assert!(!m.matches(&target(&Method::GET, Some("api.example.com"), "/login")));
        assert!(!m.matches(&target(&Method::POST, Some("example.com"), "/login")));
        assert!(!m.matches(&target(&Method::POST, Some("api.example.com"), "/login/x")));
    }
}
