//! Route matchers: the compiled `match:` of one route, tested against the canonical request.

use http::Method;

use super::path::normalize_path;

/// What a route matches (its `match:` in the config). Every given condition must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// Path prefix, matched on whole segments (`/api` takes `/api` and `/api/x`, not `/apix`).
    pub path_prefix: Option<String>,
    /// Exact path (a trailing `/` aside).
    pub path: Option<String>,
    /// Allowed methods; empty means any.
    pub methods: Vec<Method>,
    /// Host, case-insensitive, without port; `*.example.com` matches any subdomain.
    pub host: Option<String>,
    /// Paths compared with regard to ASCII case (by default they are not).
    pub case_sensitive: bool,
}

/// The compiled conditions of one route.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// Normalised, without a trailing `/` (`/` itself stays).
    path_prefix: Option<String>,
    /// Normalised, without a trailing `/` (`/` itself stays).
    path: Option<String>,
    methods: Vec<Method>,
    host: Option<HostPattern>,
    /// `case_sensitive: true`: paths compared byte for byte. By default ASCII case is ignored, since many upstreams
    /// serve `/API` as `/api`, and a case-sensitive route would let `/API` past its limits to them.
    case_sensitive: bool,
}

#[derive(Debug, Clone)]
pub(super) enum HostPattern {
    Exact(String),
    /// `*.example.com`: any subdomain of `.example.com` (stored with the leading dot).
    Suffix(String),
}

/// The parts of a request that routes match on: a borrow of the canonical request (its host and the path
/// [`route_path`](super::CanonicalRequest::route_path) gives) and of the request's method, made for the match alone
/// ([`CanonicalRequest::target`](super::CanonicalRequest::target)).
#[derive(Debug, Clone, Copy)]
pub struct RequestTarget<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The host, lower-cased, without port.
    pub host: Option<&'a str>,
    /// The normalised path without parameters (see
    /// [`CanonicalRequest::route_path`](super::CanonicalRequest::route_path)).
    pub path: &'a str,
}

// === impl Matcher ===

impl Matcher {
    /// Compiles a route's `match:`.
    pub fn new(spec: &RouteMatch) -> Self {
        // The config's paths in the requests' spelling (`/café` as `/caf%C3%A9`), a trailing `/` aside: `/api/` and
        // `/api` mean the same subtree.
        let compile = |p: &String| {
            let normal = normalize_path(p).map_or_else(|_| p.clone(), |n| n.into_owned());
            without_trailing_slash(&normal).to_owned()
        };
        let host = spec.host.as_ref().map(|h| {
            let h = h.to_ascii_lowercase();
            match h.strip_prefix('*') {
                Some(suffix) => HostPattern::Suffix(suffix.to_owned()),
                None => HostPattern::Exact(h),
            }
        });
        Self {
            path_prefix: spec.path_prefix.as_ref().map(compile),
            path: spec.path.as_ref().map(compile),
            methods: spec.methods.clone(),
            host,
            case_sensitive: spec.case_sensitive,
        }
    }

    /// Whether the route names `method` (an empty list names every method but CONNECT, which is never proxied
    /// unless asked for).
    pub fn names_method(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Whether paths are matched with regard to case (`case_sensitive: true`); otherwise a `path` key part
    /// counts them in lower case.
    pub fn is_case_sensitive(&self) -> bool {
        self.case_sensitive
    }

    /// Whether every condition holds for `target`.
    pub fn matches(&self, target: &RequestTarget<'_>) -> bool {
        if !self.methods.is_empty() && !self.methods.contains(target.method) {
            return false;
        }
        if let Some(path) = &self.path {
            let given = without_trailing_slash(target.path);
            let same = if self.case_sensitive {
                given == path
            } else {
                given.eq_ignore_ascii_case(path)
            };
            if !same {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix {
            if !prefix_matches(prefix, target.path, self.case_sensitive) {
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

/// `path` without its trailing `/`, unless it is `/`.
pub(crate) fn without_trailing_slash(path: &str) -> &str {
    match path.strip_suffix('/') {
        Some(rest) if !rest.is_empty() => rest,
        _ => path,
    }
}

/// Prefixes match whole segments: `/api` takes `/api`, `/api/` and `/api/v1`, not `/apiary`.
fn prefix_matches(prefix: &str, path: &str, case_sensitive: bool) -> bool {
    if prefix == "/" {
        return true;
    }
    let Some(head) = path.get(..prefix.len()) else {
        return false;
    };
    let same = if case_sensitive {
        head == prefix
    } else {
        head.eq_ignore_ascii_case(prefix)
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
            case_sensitive: false,
        })
    }

    fn target<'a>(method: &'a Method, host: Option<&'a str>, path: &'a str) -> RequestTarget<'a> {
        RequestTarget { method, host, path }
    }

    #[test]
    fn prefix_matches_whole_segments() {
        let m = matcher(Some("/api"), None, &[], None);
        assert!(m.matches(&target(&Method::GET, None, "/api")));
        assert!(m.matches(&target(&Method::GET, None, "/api/")));
        assert!(m.matches(&target(&Method::GET, None, "/api/v1/x")));
        assert!(!m.matches(&target(&Method::GET, None, "/apiary")));
        assert!(!m.matches(&target(&Method::GET, None, "/ap")));
        assert!(matcher(Some("/"), None, &[], None).matches(&target(
            &Method::GET,
            None,
            "/anything"
        )));
    }

    #[test]
    fn paths_match_in_any_case_and_with_a_trailing_slash_unless_case_sensitive() {
        let m = matcher(Some("/api"), None, &[], None);
        for path in ["/api", "/API/x", "/Api/v1"] {
            assert!(m.matches(&target(&Method::GET, None, path)), "{path}");
        }
        assert!(!m.matches(&target(&Method::GET, None, "/APIary")));
        // A multi-byte character where the prefix would end is no match, and no panic.
        assert!(!m.matches(&target(&Method::GET, None, "/ap\u{e9}")));
        let exact = matcher(None, Some("/login/"), &[], None);
        for path in ["/login", "/LOGIN", "/login/", "/Login/"] {
            assert!(exact.matches(&target(&Method::POST, None, path)), "{path}");
        }
        assert!(!exact.matches(&target(&Method::POST, None, "/login/x")));
        let strict = Matcher::new(&RouteMatch {
            path: Some("/login".into()),
            case_sensitive: true,
            ..RouteMatch::default()
        });
        assert!(strict.matches(&target(&Method::POST, None, "/login/")));
        assert!(!strict.matches(&target(&Method::POST, None, "/LOGIN")));
    }

    #[test]
    fn config_paths_are_read_in_the_requests_spelling() {
        let m = matcher(Some("/caf\u{e9}"), None, &[], None);
        assert!(m.matches(&target(&Method::GET, None, "/caf%C3%A9/x")));
        let m = matcher(None, Some("/v1/items%3Apurge"), &[], None);
        assert!(m.matches(&target(&Method::GET, None, "/v1/items:purge")));
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
