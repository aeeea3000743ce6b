//! The canonical request (see the README's security model): the one method, host and path that routing, keys, allowlists and forwarding
//! all use, built once per request; and the refusals of requests that have no single reading.

use std::borrow::Cow;

use http::header::{HeaderMap, HeaderValue, HOST};
use http::{Method, StatusCode, Uri, Version};
use thiserror::Error;

use super::matcher::RequestTarget;
use super::path::{normalize_path_with, without_parameters, PathError, PathRules};

/// The methods of RFC 9110 §9 and PATCH: a case variant of one of them (`post`) is refused, since routes and
/// upstreams would each decide for themselves whether it is that method.
const STANDARD_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// One reading of a request's target, shared by everything that looks at it: it owns the strings normalisation made
/// (a path rewritten, a host lower-cased), which routing ([`target`](Self::target)) and admission
/// ([`RequestFacts`](crate::key::RequestFacts)) borrow rather than copy. Kept apart from those views because they
/// also borrow the request's method and fields, and the request is handed on by value once admitted while this
/// reading (the path the upstream gets) lives on.
#[derive(Debug, Clone)]
pub struct CanonicalRequest<'a> {
    /// The normalised path (see [`normalize_path_with`]): what the upstream receives; routes match it without its
    /// parameters ([`route_path`](Self::route_path)).
    pub path: Cow<'a, str>,
    /// The host the request is for, lower-cased, without port or trailing dot: the authority of an absolute-form
    /// target (or HTTP/2's `:authority`), else the `Host` field.
    pub host: Option<String>,
    /// The `Host` the upstream must get when it differs from the field the client sent: the target's authority
    /// (absolute form, HTTP/2), or a `Host` written another way (upper case, trailing dot). `None` when the
    /// client's field is already canonical, as it nearly always is.
    pub host_field: Option<HeaderValue>,
    /// The client's own `Host` field, when it sent one (sharing its bytes): read here once, so that nothing after
    /// routing looks the field up again.
    pub client_host: Option<HeaderValue>,
    /// The raw query string, if any, as the target has it (key parts decode its parameters as they read them).
    pub query: Option<&'a str>,
    /// [`path`](Self::path) without the `;` parameters of its segments, when it has any (nearly no path does):
    /// made once, with the rest of the reading, for routing and keys to borrow.
    params_removed: Option<String>,
}

/// Why a request has no single reading, and is refused before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Refusal {
    /// The path has no normal form (see [`PathError`]).
    #[error(transparent)]
    Path(#[from] PathError),
    /// HTTP/1.1 without `Host` (RFC 9112 §3.2).
    #[error("an HTTP/1.1 request needs exactly one Host field")]
    MissingHost,
    /// More than one `Host` field line.
    #[error("more than one Host field")]
    DuplicateHost,
    /// A `Host` (or target authority) that is not a host with an optional port.
    #[error("the Host field is not a valid host")]
    BadHost,
    /// HTTP/2's `:authority` and `Host` name different hosts (RFC 9113 §8.3.1).
    #[error("the Host field and the request target name different hosts")]
    HostMismatch,
    /// A case variant of a standard method (`post`, `Get`).
    #[error("methods are case-sensitive: a case variant of a standard method is not allowed")]
    MethodCase,
    /// CONNECT, which no route names.
    #[error("CONNECT is not proxied")]
    ConnectNotRouted,
    /// A header or query parameter that a limit keys on occurs more than once.
    #[error("a header or query parameter used as a rate-limit key occurs more than once")]
    AmbiguousKey,
}

// === impl CanonicalRequest ===

impl<'a> CanonicalRequest<'a> {
    /// The canonical reading of a request head as it came off the wire, or why it has none.
    pub fn new(
        method: &Method,
        version: Version,
        uri: &'a Uri,
        headers: &HeaderMap,
    ) -> Result<Self, Refusal> {
        Self::with_rules(method, version, uri, headers, PathRules::default())
    }

    /// [`new`](Self::new) with the gateway's `rules` for paths.
    pub fn with_rules(
        method: &Method,
        version: Version,
        uri: &'a Uri,
        headers: &HeaderMap,
        rules: PathRules,
    ) -> Result<Self, Refusal> {
        Self::read(
            method,
            version,
            uri,
            headers,
            version == Version::HTTP_11,
            rules,
        )
    }

    /// The path routes match and keys count: [`path`](Self::path) without the `;` parameters of its segments.
    pub fn route_path(&self) -> &str {
        self.params_removed.as_deref().unwrap_or(&self.path)
    }

    /// What routes match of the request whose method is `method`: a borrow of this reading.
    pub fn target<'t>(&'t self, method: &'t Method) -> RequestTarget<'t> {
        RequestTarget {
            method,
            host: self.host.as_deref(),
            path: self.route_path(),
        }
    }

    /// The canonical reading of a request that a server has already accepted, for the tower layer: the same as
    /// [`new`](Self::new) but for HTTP/1.1's `Host` requirement, which is the server's to enforce (and which
    /// requests built in-process, `Request::get("/x")`, never meet).
    pub fn of_accepted(
        method: &Method,
        version: Version,
        uri: &'a Uri,
        headers: &HeaderMap,
    ) -> Result<Self, Refusal> {
        Self::read(method, version, uri, headers, false, PathRules::default())
    }

    fn read(
        method: &Method,
        version: Version,
        uri: &'a Uri,
        headers: &HeaderMap,
        host_required: bool,
        rules: PathRules,
    ) -> Result<Self, Refusal> {
        if is_case_variant(method) {
            return Err(Refusal::MethodCase);
        }
        let path = normalize_path_with(uri.path(), rules)?;
        let HostReading {
            host,
            host_field,
            client_host,
        } = read_host(version, uri, headers, host_required)?;
        let params_removed = match without_parameters(&path) {
            Cow::Borrowed(_) => None,
            Cow::Owned(stripped) => Some(stripped),
        };
        Ok(Self {
            path,
            host,
            host_field,
            client_host,
            query: uri.query(),
            params_removed,
        })
    }
}

// === impl Refusal ===

impl Refusal {
    /// The status it is answered with: 405 for CONNECT, 400 for the rest.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::ConnectNotRouted => StatusCode::METHOD_NOT_ALLOWED,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The `error` of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::ConnectNotRouted => "method_not_allowed",
            Refusal::AmbiguousKey => "ambiguous_key",
            _ => "bad_request",
        }
    }
}

/// Whether `method` is a standard method written in another case. A standard method's text is all upper case, as
/// is nearly every request's: a few byte checks, then nothing to compare.
fn is_case_variant(method: &Method) -> bool {
    let text = method.as_str();
    if text.bytes().all(|b| b.is_ascii_uppercase()) {
        return false;
    }
    STANDARD_METHODS
        .iter()
        .any(|name| name.eq_ignore_ascii_case(text))
}

/// The request's host (lower case, no port, no trailing dot) and, when the upstream must get another `Host` than
/// the client sent, that field.
///
/// - More than one `Host` line is refused, and so is none when `host_required` (HTTP/1.1 off the wire, RFC 9112
///   §3.2).
/// - The target's authority (absolute form, HTTP/2 `:authority`) is the host, and the `Host` the upstream gets
///   (RFC 9112 §3.2.2: a received `Host` is replaced). Over HTTP/2 a `Host` naming another host is refused.
pub fn canonical_host(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
    host_required: bool,
) -> Result<(Option<String>, Option<HeaderValue>), Refusal> {
    read_host(version, uri, headers, host_required).map(|read| (read.host, read.host_field))
}

/// The host parts of a request's canonical reading (see [`CanonicalRequest`]'s fields of the same names).
struct HostReading {
    host: Option<String>,
    host_field: Option<HeaderValue>,
    client_host: Option<HeaderValue>,
}

/// [`canonical_host`], with the client's own `Host` field (cloned, sharing its bytes).
fn read_host(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
    host_required: bool,
) -> Result<HostReading, Refusal> {
    let mut lines = headers.get_all(HOST).iter();
    let field = lines.next();
    if lines.next().is_some() {
        return Err(Refusal::DuplicateHost);
    }
    if field.is_none() && host_required {
        return Err(Refusal::MissingHost);
    }
    if let Some(authority) = uri.authority() {
        let (host, canonical) = parse_authority(authority.as_str())?;
        if version == Version::HTTP_2 {
            if let Some(field) = field {
                let (field_host, _) = host_of_field(field)?;
                if field_host.as_deref() != Some(host.as_str()) {
                    return Err(Refusal::HostMismatch);
                }
            }
        }
        let value = HeaderValue::from_str(&canonical).map_err(|_| Refusal::BadHost)?;
        return Ok(HostReading {
            host: Some(host),
            host_field: Some(value),
            client_host: field.cloned(),
        });
    }
    let (host, host_field) = match field {
        Some(field) => host_of_field(field)?,
        None => (None, None),
    };
    Ok(HostReading {
        host,
        host_field,
        client_host: field.cloned(),
    })
}

/// The host of a `Host` field, and the field to send instead when it is not written canonically. An empty field
/// (allowed for targets without an authority) names no host.
fn host_of_field(field: &HeaderValue) -> Result<(Option<String>, Option<HeaderValue>), Refusal> {
    // The usual `Host: name[:port]`, already in lower case, is taken as it is, read in one pass over its bytes
    // (which are ASCII then: no check of the whole value as text first); anything else goes through the full
    // authority parser (brackets, case, a trailing dot).
    if let Some(host) = plain_host(field.as_bytes()) {
        return Ok((Some(host.to_owned()), None));
    }
    let text = field.to_str().map_err(|_| Refusal::BadHost)?;
    if text.is_empty() {
        return Ok((None, None));
    }
    let (host, canonical) = parse_authority(text)?;
    let rewrite = (canonical != text)
        .then(|| HeaderValue::from_str(&canonical))
        .transpose()
        .map_err(|_| Refusal::BadHost)?;
    Ok((Some(host), rewrite))
}

/// The host of `text` when it is a lower-case name or IPv4 address (`a-z`, `0-9`, `-`, `.`, not ending in a dot)
/// with an optional port of up to five digits: already canonical. One pass over the bytes, which finds the `:` as
/// it checks them (a search for it first, then a check of each part, cost every request twice as much).
fn plain_host(text: &[u8]) -> Option<&str> {
    let mut colon = None;
    for (at, &byte) in text.iter().enumerate() {
        match byte {
            b'0'..=b'9' => {}
            b'a'..=b'z' | b'-' | b'.' if colon.is_none() => {}
            b':' if colon.is_none() => colon = Some(at),
            _ => return None,
        }
    }
    let (host, port) = match colon {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    if host.is_empty() || host.ends_with(b".") {
        return None;
    }
    // Digits compared as text: five digits are a port only up to 65535 (no number parsed per request).
    let port_ok =
        port.is_none_or(|p| (1..=5).contains(&p.len()) && (p.len() < 5 || p <= &b"65535"[..]));
    // ASCII, every byte checked above: the text check cannot fail.
    port_ok.then(|| std::str::from_utf8(host).ok()).flatten()
}

/// Parses `host[:port]` into the host (lower case, without the trailing dot of a fully qualified name) and the
/// canonical authority text. User information (`user@host`) and an empty host are refused: no client sends them
/// to a gateway, and upstreams disagree about them.
fn parse_authority(text: &str) -> Result<(String, String), Refusal> {
    if text.contains('@') {
        return Err(Refusal::BadHost);
    }
    let authority = text
        .parse::<http::uri::Authority>()
        .map_err(|_| Refusal::BadHost)?;
    let raw_host = authority.host();
    // Brackets hold an IPv6 address and nothing else (RFC 3986 §3.2.2): `[name]` is no host at all.
    if let Some(inner) = raw_host.strip_prefix('[') {
        let address = inner.strip_suffix(']').ok_or(Refusal::BadHost)?;
        address
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| Refusal::BadHost)?;
    }
    let mut host = raw_host.to_ascii_lowercase();
    if host.ends_with('.') && !host.starts_with('[') {
        host.pop();
    }
    if host.is_empty() || host.ends_with('.') {
        return Err(Refusal::BadHost);
    }
    // Without user information the host starts the text; what follows it must be a port, or nothing.
    let rest = text.get(raw_host.len()..).unwrap_or(":");
    let canonical = match rest.strip_prefix(':') {
        None if rest.is_empty() => host.clone(),
        Some(port) if (1..=5).contains(&port.len()) && port.parse::<u16>().is_ok() => {
            format!("{host}:{port}")
        }
        _ => return Err(Refusal::BadHost),
    };
    Ok((host, canonical))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(version: Version, target: &str, hosts: &[&str]) -> (Version, Uri, HeaderMap) {
        let mut headers = HeaderMap::new();
        for host in hosts {
            headers.append(HOST, HeaderValue::from_str(host).expect("value"));
        }
        (version, target.parse().expect("uri"), headers)
    }

    fn host(version: Version, target: &str, hosts: &[&str]) -> Result<Option<String>, Refusal> {
        let (version, uri, headers) = head(version, target, hosts);
        CanonicalRequest::new(&Method::GET, version, &uri, &headers).map(|c| c.host)
    }

    fn sent_host(version: Version, target: &str, hosts: &[&str]) -> Option<String> {
        let (version, uri, headers) = head(version, target, hosts);
        let (_, field) = canonical_host(version, &uri, &headers, false).expect("valid");
        field
            .map(|v| v.to_str().expect("text").to_owned())
            .or_else(|| hosts.first().map(|h| (*h).to_owned()))
    }

    #[test]
    fn the_host_comes_from_the_target_then_the_field() {
        let v11 = Version::HTTP_11;
        assert_eq!(
            host(v11, "/x", &["api.example.com:8080"]),
            Ok(Some("api.example.com".into()))
        );
        assert_eq!(
            host(v11, "/x", &["API.Example.COM."]),
            Ok(Some("api.example.com".into()))
        );
        assert_eq!(
            host(v11, "/x", &["[2001:db8::1]:443"]),
            Ok(Some("[2001:db8::1]".into()))
        );
        assert_eq!(
            host(v11, "http://free.example/v/x", &["limited.example"]),
            Ok(Some("free.example".into())),
            "an absolute-form target's authority wins over Host"
        );
        assert_eq!(host(Version::HTTP_10, "/x", &[]), Ok(None));
        assert_eq!(host(v11, "/x", &[""]), Ok(None));
    }

    #[test]
    fn the_upstream_gets_the_host_that_was_routed_on() {
        let v11 = Version::HTTP_11;
        assert_eq!(
            sent_host(v11, "/x", &["a.example:81"]).as_deref(),
            Some("a.example:81")
        );
        assert_eq!(
            sent_host(v11, "/x", &["A.Example.:81"]).as_deref(),
            Some("a.example:81")
        );
        assert_eq!(
            sent_host(v11, "http://Free.Example:82/v", &["limited.example"]).as_deref(),
            Some("free.example:82")
        );
        assert_eq!(
            sent_host(Version::HTTP_2, "https://a.example/v", &[]).as_deref(),
            Some("a.example")
        );
    }

    #[test]
    fn requests_without_one_host_are_refused() {
        let v11 = Version::HTTP_11;
        assert_eq!(host(v11, "/x", &[]), Err(Refusal::MissingHost));
        assert_eq!(
            host(v11, "/x", &["a.example", "b.example"]),
            Err(Refusal::DuplicateHost)
        );
        assert_eq!(
            host(v11, "/x", &["a.example", "a.example"]),
            Err(Refusal::DuplicateHost)
        );
        for bad in [
            "a b",
            "user@a.example",
            "a.example:port",
            "a.example:",
            ":80",
            "[::1",
            "[name]",
            "[name]:80",
            "[v1.x]",
            ".",
        ] {
            assert_eq!(host(v11, "/x", &[bad]), Err(Refusal::BadHost), "{bad:?}");
        }
        assert_eq!(
            host(Version::HTTP_2, "https://a.example/x", &["b.example"]),
            Err(Refusal::HostMismatch)
        );
        assert_eq!(
            host(Version::HTTP_2, "https://a.example/x", &["A.example:443"]),
            Ok(Some("a.example".into()))
        );
    }

    #[test]
    fn the_fast_path_and_the_parser_agree_on_plain_hosts() {
        for text in [
            "api.example.com",
            "api.example.com:8080",
            "127.0.0.1:18090",
            "a-b.c",
            "h:65535",
            "h:9",
        ] {
            let (parsed, canonical) = parse_authority(text).expect("valid");
            assert_eq!(
                plain_host(text.as_bytes()),
                Some(parsed.as_str()),
                "{text:?}"
            );
            assert_eq!(canonical, text);
        }
        for text in [
            "API.example.com",
            "a.example.",
            "host:123456",
            "host:12ab",
            "host:65536",
            "host:99999",
            "",
            ":80",
            "host:",
            "host:80:81",
            "a.b:8.0",
            "h\u{e9}.example",
        ] {
            assert_eq!(plain_host(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn case_variants_of_standard_methods_are_refused_and_nothing_else() {
        for name in ["post", "Get", "dElEtE", "connect", "patch"] {
            let method = Method::from_bytes(name.as_bytes()).expect("token");
            assert!(is_case_variant(&method), "{name}");
        }
        for name in ["GET", "POST", "PROPFIND", "purge", "PATCH"] {
            let method = Method::from_bytes(name.as_bytes()).expect("token");
            assert!(!is_case_variant(&method), "{name}");
        }
    }
}
