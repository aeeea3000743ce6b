//! Limiting keys: which client a request belongs to (its address, seen through trusted proxies, or a header, a
//! query parameter, the route...) and the store key that holds its state.

use std::fmt;
use std::net::IpAddr;

use http::{HeaderMap, HeaderName, Method};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// Key values longer than this are replaced by their digest, so clients cannot grow store keys.
pub const MAX_PLAIN_KEY_LEN: usize = 64;

/// One component of a limiting key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The client's address (see [`ClientIpResolver`]).
    Ip,
    /// The route's name: one shared bucket for every client of the route.
    Route,
    /// The request method.
    Method,
    /// The request path, without the query.
    Path,
    /// The request host, lower-cased, without port.
    Host,
    /// The value of a request header.
    Header(HeaderName),
    /// The value of a query parameter (percent-decoded).
    Query(String),
}

/// What a limit does when a key part is absent from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Key the request by the client address instead.
    #[default]
    Ip,
    /// Do not apply this limit to the request.
    Skip,
}

/// How a limit builds its key from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    parts: Vec<KeyPart>,
    missing: MissingKey,
}

/// What the key of a request may be built from.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The client address, already resolved through trusted proxies.
    pub client_ip: IpAddr,
    /// The matched route's name.
    pub route: &'a str,
    /// The request method.
    pub method: &'a Method,
    /// The request path.
    pub path: &'a str,
    /// The request host without port, if any.
    pub host: Option<&'a str>,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The raw query string, if any.
    pub query: Option<&'a str>,
}

/// Finds the client address: the peer, or, when the peer is a trusted proxy, the nearest untrusted address of
/// `Forwarded` / `X-Forwarded-For`, walking from the right past trusted hops.
#[derive(Debug, Clone, Default)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
}

/// Why a key part could not be parsed from the config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyPartError {
    /// Not one of the known parts.
    #[error("unknown key part {0:?} (use ip, route, method, path, host, header:NAME, query:NAME)")]
    Unknown(String),
    /// `header:` with an invalid header name.
    #[error("invalid header name in key part {0:?}")]
    BadHeader(String),
    /// `header:` or `query:` without a name.
    #[error("key part {0:?} needs a name after the colon")]
    MissingName(String),
}

// === impl KeyPart ===

impl KeyPart {
    /// Parses `ip`, `route`, `method`, `path`, `host`, `header:NAME` or `query:NAME`.
    pub fn parse(text: &str) -> Result<Self, KeyPartError> {
        let text = text.trim();
        if let Some(name) = text.strip_prefix("header:") {
            if name.is_empty() {
                return Err(KeyPartError::MissingName(text.to_owned()));
            }
            return HeaderName::from_bytes(name.as_bytes())
                .map(KeyPart::Header)
                .map_err(|_| KeyPartError::BadHeader(text.to_owned()));
        }
        if let Some(name) = text.strip_prefix("query:") {
            if name.is_empty() {
                return Err(KeyPartError::MissingName(text.to_owned()));
            }
            return Ok(KeyPart::Query(name.to_owned()));
        }
        match text {
            "ip" => Ok(KeyPart::Ip),
            "route" => Ok(KeyPart::Route),
            "method" => Ok(KeyPart::Method),
            "path" => Ok(KeyPart::Path),
            "host" => Ok(KeyPart::Host),
            other => Err(KeyPartError::Unknown(other.to_owned())),
        }
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Ip => f.write_str("ip"),
            KeyPart::Route => f.write_str("route"),
            KeyPart::Method => f.write_str("method"),
            KeyPart::Path => f.write_str("path"),
            KeyPart::Host => f.write_str("host"),
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Query(name) => write!(f, "query:{name}"),
        }
    }
}

// === impl KeySpec ===

impl KeySpec {
    /// A key made of `parts` (at least one), falling back as `missing` says when a part is absent.
    pub fn new(parts: Vec<KeyPart>, missing: MissingKey) -> Self {
        let parts = if parts.is_empty() {
            vec![KeyPart::Ip]
        } else {
            parts
        };
        Self { parts, missing }
    }

    /// The key parts.
    pub fn parts(&self) -> &[KeyPart] {
        &self.parts
    }

    /// What happens when a part is absent.
    pub fn missing(&self) -> MissingKey {
        self.missing
    }

    /// The key value of a request, or `None` when the limit does not apply to it (`missing: skip`).
    ///
    /// Parts are joined with `|`. The value is not yet safe for a store key: see [`store_key`].
    pub fn value(&self, facts: &RequestFacts<'_>) -> Option<String> {
        let mut value = String::new();
        self.push_value(facts, &mut value).then_some(value)
    }

    /// Appends the key value of a request to `out`, as [`value`](Self::value) builds it but without a string of
    /// its own; false, with `out` as it was, when the limit does not apply.
    pub fn push_value(&self, facts: &RequestFacts<'_>, out: &mut String) -> bool {
        let start = out.len();
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            if !push_part(part, facts, out) {
                out.truncate(start);
                return match self.missing {
                    MissingKey::Skip => false,
                    MissingKey::Ip => {
                        push_ip_text(out, facts.client_ip);
                        true
                    }
                };
            }
        }
        true
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            write!(f, "{part}")?;
        }
        Ok(())
    }
}

/// Appends the value of one key part; false when the request has none (the part's text may be left behind).
fn push_part(part: &KeyPart, facts: &RequestFacts<'_>, out: &mut String) -> bool {
    let text = match part {
        KeyPart::Ip => {
            push_ip_text(out, facts.client_ip);
            return true;
        }
        KeyPart::Route => facts.route,
        KeyPart::Method => facts.method.as_str(),
        KeyPart::Path => facts.path,
        KeyPart::Host => match facts.host {
            Some(host) if !host.is_empty() => host,
            _ => return false,
        },
        KeyPart::Header(name) => {
            let Some(value) = facts.headers.get(name) else {
                return false;
            };
            let text = String::from_utf8_lossy(value.as_bytes());
            let trimmed = text.trim();
            out.push_str(trimmed);
            return !trimmed.is_empty();
        }
        KeyPart::Query(name) => {
            let value = facts.query.and_then(|query| {
                form_urlencoded::parse(query.as_bytes())
                    .find(|(k, _)| k == name.as_str())
                    .map(|(_, v)| v)
            });
            return match value {
                Some(v) if !v.is_empty() => {
                    out.push_str(&v);
                    true
                }
                _ => false,
            };
        }
    };
    out.push_str(text);
    true
}

/// The host a request asked for, lower-cased and without port: the authority of the request target (absolute
/// form, HTTP/2's `:authority`), else the `Host` header. Used for routing and for the `host` key part.
pub fn request_host(uri: &http::Uri, headers: &HeaderMap) -> Option<String> {
    let text = match uri.authority() {
        Some(authority) => return Some(authority.host().to_ascii_lowercase()),
        None => headers.get(http::header::HOST)?.to_str().ok()?,
    };
    // The usual `Host: name[:port]`, already in lower case, is taken as it is; anything else goes through the
    // full authority parser (brackets, user info, case).
    if let Some(host) = plain_host(text) {
        return Some(host.to_owned());
    }
    let authority = text.parse::<http::uri::Authority>().ok()?;
    Some(authority.host().to_ascii_lowercase())
}

/// The host of `text` when it is a lower-case name or IPv4 address (`a-z`, `0-9`, `-`, `.`) with an optional port
/// of up to five digits: what the authority parser would return for it.
fn plain_host(text: &str) -> Option<&str> {
    let (host, port) = match text.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let port_ok =
        port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    (host_ok && port_ok).then_some(host)
}

/// The store key of one limit for one key value: `<prefix><route>:<limit>:{<value>}`.
///
/// The braces make the value the Redis Cluster hash tag. A value longer than [`MAX_PLAIN_KEY_LEN`] bytes, or with
/// `{`, `}` or control characters, is replaced by its SHA-256 hex digest, so that clients can
/// neither grow keys nor choose the cluster slot.
pub fn store_key(prefix: &str, route: &str, limit: &str, value: &str) -> String {
    let mut key =
        String::with_capacity(prefix.len() + route.len() + limit.len() + 4 + value.len().min(64));
    push_head(&mut key, prefix, route, limit);
    push_value(&mut key, value);
    key
}

/// The part of [`store_key`] before the value, `<prefix><route>:<limit>:{`: the same for every request, so
/// built once per limit.
pub fn key_head(prefix: &str, route: &str, limit: &str) -> String {
    let mut head = String::with_capacity(prefix.len() + route.len() + limit.len() + 3);
    push_head(&mut head, prefix, route, limit);
    head
}

fn push_head(key: &mut String, prefix: &str, route: &str, limit: &str) {
    key.push_str(prefix);
    key.push_str(route);
    key.push(':');
    key.push_str(limit);
    key.push_str(":{");
}

/// [`store_key`] from its [`key_head`] and the key value.
pub fn key_with_head(head: &str, value: &str) -> String {
    let mut key = String::with_capacity(head.len() + value.len().min(64) + 1);
    key.push_str(head);
    push_value(&mut key, value);
    key
}

/// Ends a store key with the value (or its digest) and the closing brace.
fn push_value(key: &mut String, value: &str) {
    let value_start = key.len();
    key.push_str(value);
    seal_key(key, value_start);
}

/// Ends a store key whose value was written from `value_start` on: replaces the value by its digest when it may
/// not stand in a key as it is (see [`store_key`]), then closes the brace.
pub fn seal_key(key: &mut String, value_start: usize) {
    let value = &key[value_start..];
    // Printable ASCII without braces, the usual address or token, is checked a byte at a time; anything else
    // character by character, where non-ASCII control characters also call for the digest.
    let printable_ascii = value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'{' && b != b'}');
    let needs_digest = value.len() > MAX_PLAIN_KEY_LEN
        || (!printable_ascii
            && value
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_control()));
    if needs_digest {
        let digest = Sha256::digest(value.as_bytes());
        key.truncate(value_start);
        for byte in digest {
            key.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
            key.push(char::from(HEX_DIGITS[usize::from(byte & 0xf)]));
        }
    }
    key.push('}');
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

// === impl ClientIpResolver ===

impl ClientIpResolver {
    /// A resolver that believes forwarding headers only from peers within `trusted`.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        Self { trusted }
    }

    /// The client address of a request from `peer`.
    ///
    /// Headers are believed only when the peer is trusted. `Forwarded` is preferred to `X-Forwarded-For` when both
    /// are present. Walking from the nearest hop outwards, trusted hops are skipped and the first untrusted address
    /// is the client; a malformed entry stops the walk at the last address known good (a trusted proxy wrote what
    /// follows it, but nobody vouches for the malformed value).
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return peer;
        }
        let forwarded: Vec<&str> = headers
            .get_all(http::header::FORWARDED)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let hops: Vec<Option<IpAddr>> = if !forwarded.is_empty() {
            forwarded
                .iter()
                .flat_map(|v| v.split(','))
                .map(forwarded_for)
                .collect()
        } else {
            headers
                .get_all("x-forwarded-for")
                .iter()
                .flat_map(|v| match v.to_str() {
                    Ok(s) => s
                        .split(',')
                        .map(|hop| parse_ip(hop.trim()))
                        .collect::<Vec<_>>(),
                    Err(_) => vec![None],
                })
                .collect()
        };
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            match hop {
                Some(ip) => {
                    client = ip;
                    if !self.is_trusted(ip) {
                        return ip;
                    }
                }
                None => return client,
            }
        }
        client
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }
}

/// The address as text, as `Display` writes it; IPv4 without the formatting machinery, which showed in profiles
/// (an address is written for every `ip` key part and every `X-Forwarded-For`).
pub fn ip_text(ip: IpAddr) -> String {
    let mut text = String::with_capacity(15);
    push_ip_text(&mut text, ip);
    text
}

/// Appends [`ip_text`] of `ip` to `out`.
pub fn push_ip_text(out: &mut String, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        use fmt::Write;
        let _ = write!(out, "{ip}");
        return;
    };
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) are the IPv4 client they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses an address as proxies write it: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sock) = text.parse::<std::net::SocketAddr>() {
        return Some(canonical(sock.ip()));
    }
    let inner = text.strip_prefix('[')?.split(']').next()?;
    inner.parse::<IpAddr>().ok().map(canonical)
}

/// The `for=` address of one `Forwarded` element (RFC 7239); `None` when absent, obfuscated or malformed.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
        .and_then(|(_, value)| parse_ip(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn ip_text_writes_addresses_as_display_does() {
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "255.255.255.255",
            "192.0.2.45",
            "::1",
            "2001:db8::ff00:42:8329",
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for n in (0..=u32::MAX).step_by(16_777_259) {
            let ip = IpAddr::from(n.to_be_bytes());
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn resolver() -> ClientIpResolver {
        ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()])
    }

    fn xff(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        assert_eq!(
            resolver().resolve(ip("192.0.2.1"), &xff("203.0.113.9")),
            ip("192.0.2.1")
        );
    }

    #[test]
    fn walks_right_to_left_past_trusted_hops() {
        let headers = xff("198.51.100.7, 203.0.113.9, 10.1.1.1");
        assert_eq!(
            resolver().resolve(ip("10.0.0.1"), &headers),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn malformed_hop_stops_at_last_good_address() {
        let headers = xff("203.0.113.9, not-an-ip, 10.1.1.1");
        assert_eq!(resolver().resolve(ip("10.0.0.1"), &headers), ip("10.1.1.1"));
    }

    #[test]
    fn forwarded_header_is_preferred() {
        let mut headers = xff("198.51.100.7");
        headers.insert(
            http::header::FORWARDED,
            HeaderValue::from_static("for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\""),
        );
        assert_eq!(
            resolver().resolve(ip("10.0.0.1"), &headers),
            ip("2001:db8::1")
        );
    }

    #[test]
    fn long_or_braced_values_are_digested() {
        let plain = store_key("t:", "api", "per-ip", "1.2.3.4");
        assert_eq!(plain, "t:api:per-ip:{1.2.3.4}");
        let braced = store_key("t:", "api", "k", "a}{b");
        // The digest is part of the key in Redis: it must not change between versions.
        assert_eq!(
            braced,
            "t:api:k:{f2a468af3f34e5a6cbb7447bf01c45aa97969d5ec2d53727efbe706e70f8bed2}"
        );
        assert_eq!(key_with_head(&key_head("t:", "api", "k"), "a}{b"), braced);
        let long = store_key("t:", "api", "k", &"x".repeat(10_000));
        assert_eq!(store_key("t:", "api", "k", "café"), "t:api:k:{café}");
        let newline = store_key("t:", "api", "k", "a\nb");
        let next_line = store_key("t:", "api", "k", "a\u{85}b");
        for key in [braced, long, newline, next_line] {
            let value = key
                .strip_prefix("t:api:k:{")
                .unwrap()
                .strip_suffix('}')
                .unwrap();
            assert_eq!(value.len(), 64);
            assert!(value.chars().all(|c| c.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn missing_part_falls_back_or_skips() {
        let headers = HeaderMap::new();
        let facts = RequestFacts {
            client_ip: ip("192.0.2.1"),
            route: "api",
            method: &Method::GET,
            path: "/x",
            host: None,
            headers: &headers,
            query: Some("tenant=acme&x=1"),
        };
        let by_header = KeySpec::new(
            vec![KeyPart::parse("header:x-api-key").unwrap()],
            MissingKey::Ip,
        );
        assert_eq!(by_header.value(&facts).as_deref(), Some("192.0.2.1"));
        let skip = KeySpec::new(
            vec![KeyPart::parse("header:x-api-key").unwrap()],
            MissingKey::Skip,
        );
        assert_eq!(skip.value(&facts), None);
        let mixed = KeySpec::new(
            vec![KeyPart::Route, KeyPart::parse("query:tenant").unwrap()],
            MissingKey::Ip,
        );
        assert_eq!(mixed.value(&facts).as_deref(), Some("api|acme"));
    }

    #[test]
    fn the_request_host_is_the_same_through_the_shortcut_and_the_parser() {
        let parsed = |text: &str| {
            text.parse::<http::uri::Authority>()
                .ok()
                .map(|a| a.host().to_ascii_lowercase())
        };
        for text in [
            "api.example.com",
            "api.example.com:8080",
            "127.0.0.1:18090",
            "API.Example.com",
            "[2001:db8::1]:443",
            "user@host:1",
            "host:",
            "host:123456",
            "host:12ab",
            "",
            "a b",
            ":80",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(
                http::header::HOST,
                HeaderValue::from_str(text).expect("value"),
            );
            let uri: http::Uri = "/path".parse().expect("uri");
            assert_eq!(request_host(&uri, &headers), parsed(text), "{text:?}");
        }
        let absolute: http::Uri = "http://Other.Example:81/x".parse().expect("uri");
        assert_eq!(
            request_host(&absolute, &HeaderMap::new()).as_deref(),
            Some("other.example"),
            "the request target's authority comes first"
        );
    }
}
