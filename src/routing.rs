//! Route matching: which configured route takes a request (first match wins), and the path normalisation that
//! matching and forwarding rely on.

use std::borrow::Cow;

use http::Method;

use crate::config::RouteMatch;

/// The compiled conditions of one route.
#[derive(Debug, Clone)]
pub struct Matcher {
    path_prefix: Option<String>,
    path: Option<String>,
    methods: Vec<Method>,
    host: Option<HostPattern>,
}

#[derive(Debug, Clone)]
enum HostPattern {
    Exact(String),
    /// `*.example.com`: any subdomain of `.example.com` (stored with the leading dot).
    Suffix(String),
}

/// The parts of a request that routes match on.
#[derive(Debug, Clone, Copy)]
pub struct RequestTarget<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The host, lower-cased, without port.
    pub host: Option<&'a str>,
    /// The normalised path (see [`normalize_path`]).
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
        }
    }

    /// Whether every condition holds for `target`.
    pub fn matches(&self, target: &RequestTarget<'_>) -> bool {
        if !self.methods.is_empty() && !self.methods.contains(target.method) {
            return false;
        }
        if let Some(path) = &self.path {
            if target.path != path {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix {
            if !prefix_matches(prefix, target.path) {
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

/// Prefixes match whole segments: `/api` takes `/api` and `/api/v1`, not `/apiary`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Resolves `.` and `..` segments and merges repeated slashes, so that `/api/../admin` is matched (and forwarded)
/// as `/admin`: a route cannot be bypassed by a path the upstream would normalise differently.
///
/// Returns `None` for a path that does not start with `/` (such as `*`).
pub fn normalize_path(path: &str) -> Option<Cow<'_, str>> {
    if !path.starts_with('/') {
        return None;
    }
    if is_clean(path) {
        return Some(Cow::Borrowed(path));
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/').skip(1) {
        if segment.is_empty() || is_current(segment.as_bytes()) {
            continue;
        }
        if is_dot_segment(segment.as_bytes()) {
            segments.pop();
        } else {
            segments.push(segment);
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    // Keep a trailing slash: `/a/b/` and `/a/b` may be different resources upstream.
    if path.ends_with('/') || out.is_empty() {
        out.push('/');
    }
    Some(Cow::Owned(out))
}

/// Whether `path` (starting with `/`) has neither an empty segment before its last (`//`) nor a dot segment: one
/// pass over the bytes, since nearly every path is clean and this runs for every request.
fn is_clean(path: &str) -> bool {
    let mut rest = &path.as_bytes()[1..];
    loop {
        let (segment, next) = match rest.iter().position(|&b| b == b'/') {
            Some(slash) => (&rest[..slash], Some(&rest[slash + 1..])),
            None => (rest, None),
        };
        if is_dot_segment(segment) {
            return false;
        }
        match next {
            Some(_) if segment.is_empty() => return false,
            Some(next) => rest = next,
            None => return true,
        }
    }
}

/// `.` in any spelling (`.`, `%2e`, `%2E`).
fn is_current(segment: &[u8]) -> bool {
    strip_dot(segment) == Some(&[])
}

/// `.` or `..` in any spelling: the one rule for both deciding to clean and cleaning, so that no encoded form
/// (`.%2e`, `%2E.`, `%2e%2E`) can be recognised by one and missed by the other.
fn is_dot_segment(segment: &[u8]) -> bool {
    match strip_dot(segment) {
        Some([]) => true,
        Some(rest) => strip_dot(rest) == Some(&[]),
        None => false,
    }
}

/// `segment` without its leading dot (`.`, `%2e` or `%2E`), if it starts with one. Runs for every segment of
/// every request: no allocation.
fn strip_dot(segment: &[u8]) -> Option<&[u8]> {
    match segment {
        [b'.', rest @ ..] | [b'%', b'2', b'e' | b'E', rest @ ..] => Some(rest),
        _ => None,
    }
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
        assert!(matcher(Some("/"), None, &[], None).matches(&target(
            &Method::GET,
            None,
            "/anything"
        )));
    }

    #[test]
    fn methods_path_and_host_must_all_hold() {
        let m = matcher(None, Some("/login"), &[Method::POST], Some("*.example.com"));
        assert!(m.matches(&target(&Method::POST, Some("api.example.com"), "/login")));
        assert!(!m.matches(&target(&Method::GET, Some("api.example.com"), "/login")));
        assert!(!m.matches(&target(&Method::POST, Some("example.com"), "/login")));
        assert!(!m.matches(&target(&Method::POST, Some("api.example.com"), "/login/x")));
    }

    #[test]
    fn dot_segments_are_resolved_before_matching() {
        assert_eq!(normalize_path("/api/../admin").as_deref(), Some("/admin"));
        assert_eq!(
            normalize_path("/api/%2E%2E/admin").as_deref(),
            Some("/admin")
        );
        assert_eq!(normalize_path("//a/./b/").as_deref(), Some("/a/b/"));
        assert_eq!(normalize_path("/../..").as_deref(), Some("/"));
        assert_eq!(
            normalize_path("/plain/path").as_deref(),
            Some("/plain/path")
        );
        assert_eq!(normalize_path("*"), None);
    }

    /// Every concatenation of up to `up_to` of `pieces` (repeats allowed), the empty one included.
    fn sequences(pieces: &[&str], up_to: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = all.clone();
        for _ in 0..up_to {
            last = last
                .iter()
                .flat_map(|start| pieces.iter().map(move |piece| format!("{start}{piece}")))
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    #[test]
    fn a_path_is_clean_exactly_when_it_has_no_double_slash_and_no_dot_segment() {
        // Every path of up to four segments from a few shapes, against the definition written the slow way.
        let segments = ["/", "/a", "/bc", "/.", "/..", "/%2E", "/.a", "/%2e%2e"];
        for path in sequences(&segments, 4).iter().filter(|p| !p.is_empty()) {
            let expected = !path.contains("//")
                && !path
                    .split('/')
                    .any(|segment| is_dot_segment(segment.as_bytes()));
            assert_eq!(is_clean(path), expected, "{path:?}");
            if expected {
                assert!(matches!(normalize_path(path), Some(Cow::Borrowed(p)) if p == path));
            }
        }
    }

    #[test]
    fn every_spelling_of_dot_and_dot_dot_is_a_dot_segment_and_nothing_else_is() {
        // Every segment of up to three pieces drawn from the spellings of a dot and their near misses, against the
        // definition: the segment decodes (`%2e` in either case to `.`) to exactly `.` or `..`.
        let pieces = [".", "%2e", "%2E", "%2", "%", "2e", "e", "a", "%2f"];
        let decodes_to_dots = |segment: &str| {
            let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
            decoded == "." || decoded == ".."
        };
        for segment in &sequences(&pieces, 3) {
            assert_eq!(
                is_dot_segment(segment.as_bytes()),
                decodes_to_dots(segment),
                "{segment:?}"
            );
            let current = matches!(segment.to_ascii_lowercase().as_str(), "." | "%2e");
            assert_eq!(is_current(segment.as_bytes()), current, "{segment:?}");
        }
    }
}
