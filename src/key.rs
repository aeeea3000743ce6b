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
    /// The bits of an IPv6 client address that key it (`client_ip.ipv6_prefix`): 64 keys each /64.
    pub ipv6_prefix: u8,
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
#[derive(Debug, Clone)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    /// How many bits of an IPv6 client address key it.
    ipv6_prefix: u8,
}

/// A header or query parameter that a key is built from occurs more than once: which occurrence counts would be
/// a guess, and the upstream might read another one, so the request is refused (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a key part occurs more than once in the request")]
pub struct AmbiguousKey;

/// What a request holds of one key part.
enum PartValue {
    Present,
    Absent,
    Ambiguous,
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

    /// The key value of a request, or `Ok(None)` when the limit does not apply to it (`missing: skip`).
    ///
    /// Parts are joined with `|`. The value is not yet safe for a store key: see [`store_key`].
    pub fn value(&self, facts: &RequestFacts<'_>) -> Result<Option<String>, AmbiguousKey> {
        let mut value = String::new();
        Ok(self.push_value(facts, &mut value)?.then_some(value))
    }

    /// Appends the key value of a request to `out`, as [`value`](Self::value) builds it but without a string of
    /// its own; false, with `out` as it was, when the limit does not apply.
    pub fn push_value(
        &self,
        facts: &RequestFacts<'_>,
        out: &mut String,
    ) -> Result<bool, AmbiguousKey> {
        let start = out.len();
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            match push_part(part, facts, out) {
                PartValue::Present => {}
                PartValue::Ambiguous => {
                    out.truncate(start);
                    return Err(AmbiguousKey);
                }
                PartValue::Absent => {
                    out.truncate(start);
                    return Ok(match self.missing {
                        MissingKey::Skip => false,
                        MissingKey::Ip => {
                            push_client_key(out, facts.client_ip, facts.ipv6_prefix);
                            true
                        }
                    });
                }
            }
        }
        Ok(true)
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

/// Appends the value of one key part (the part's text may be left behind when it is not `Present`).
///
/// A header or query parameter present more than once is `Ambiguous`, even when the copies agree: the request is
/// refused rather than counted on one copy while the upstream reads another. Several field lines of one header
/// are one list (RFC 9110 §5.3), so a second line is a second value.
fn push_part(part: &KeyPart, facts: &RequestFacts<'_>, out: &mut String) -> PartValue {
    let text = match part {
        KeyPart::Ip => {
            push_client_key(out, facts.client_ip, facts.ipv6_prefix);
            return PartValue::Present;
        }
        KeyPart::Route => facts.route,
        KeyPart::Method => facts.method.as_str(),
        KeyPart::Path => facts.path,
        KeyPart::Host => match facts.host {
            Some(host) if !host.is_empty() => host,
            _ => return PartValue::Absent,
        },
        KeyPart::Header(name) => {
            let mut lines = facts.headers.get_all(name).iter();
            let Some(value) = lines.next() else {
                return PartValue::Absent;
            };
            if lines.next().is_some() {
                return PartValue::Ambiguous;
            }
            let text = String::from_utf8_lossy(value.as_bytes());
            let trimmed = text.trim();
            out.push_str(trimmed);
            return if trimmed.is_empty() {
                PartValue::Absent
            } else {
                PartValue::Present
            };
        }
        KeyPart::Query(name) => {
            let mut values = facts.query.into_iter().flat_map(|query| {
                form_urlencoded::parse(query.as_bytes())
                    .filter(|(k, _)| k == name.as_str())
                    .map(|(_, v)| v)
            });
            let value = values.next();
            if values.next().is_some() {
                return PartValue::Ambiguous;
            }
            return match value {
                Some(v) if !v.is_empty() => {
                    out.push_str(&v);
                    PartValue::Present
                }
                _ => PartValue::Absent,
            };
        }
    };
    out.push_str(text);
    PartValue::Present
}

/// Appends the key of a client address: IPv4 as it is, IPv6 as its network of `ipv6_prefix` bits
/// (`2001:db8:1:2::/64`), since one subscriber is given a whole /64 and could otherwise take 2^64 keys.
pub fn push_client_key(out: &mut String, ip: IpAddr, ipv6_prefix: u8) {
    match ip {
        IpAddr::V6(v6) if ipv6_prefix < 128 => {
            use fmt::Write;
            let bits = u128::from(v6);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(ipv6_prefix))
                .unwrap_or(0);
            let network = std::net::Ipv6Addr::from(bits & mask);
            let _ = write!(out, "{network}/{ipv6_prefix}");
        }
        _ => push_ip_text(out, ip),
    }
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
    /// A resolver that believes forwarding headers only from peers within `trusted`, keying IPv6 clients by /64.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        Self {
            trusted,
            ipv6_prefix: 64,
        }
    }

    /// Keys IPv6 clients by their network of `bits` bits (1 to 128; 128 keys each address).
    #[must_use]
    pub fn with_ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.clamp(1, 128);
        self
    }

    /// How many bits of an IPv6 client address key it (see [`RequestFacts::ipv6_prefix`]).
    pub fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
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

    fn facts<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> RequestFacts<'a> {
        RequestFacts {
            client_ip: ip("192.0.2.1"),
            ipv6_prefix: 64,
            route: "api",
            method: &Method::GET,
            path: "/x",
            host: None,
            headers,
            query,
        }
    }

    fn spec(parts: &[&str], missing: MissingKey) -> KeySpec {
        let parts = parts.iter().map(|p| KeyPart::parse(p).unwrap()).collect();
        KeySpec::new(parts, missing)
    }

    #[test]
    fn missing_part_falls_back_or_skips() {
        let headers = HeaderMap::new();
        let facts = facts(&headers, Some("tenant=acme&x=1"));
        let by_header = spec(&["header:x-api-key"], MissingKey::Ip);
        assert_eq!(by_header.value(&facts), Ok(Some("192.0.2.1".into())));
        let skip = spec(&["header:x-api-key"], MissingKey::Skip);
        assert_eq!(skip.value(&facts), Ok(None));
        let mixed = spec(&["route", "query:tenant"], MissingKey::Ip);
        assert_eq!(mixed.value(&facts), Ok(Some("api|acme".into())));
    }

    #[test]
    fn a_key_part_present_twice_is_ambiguous_whatever_the_spelling() {
        let mut headers = HeaderMap::new();
        headers.append("x-api-key", HeaderValue::from_static("other"));
        headers.append("X-Api-Key", HeaderValue::from_static("k1"));
        let by_header = spec(&["header:x-api-key"], MissingKey::Skip);
        assert_eq!(by_header.value(&facts(&headers, None)), Err(AmbiguousKey));
        let by_query = spec(&["query:api_key"], MissingKey::Skip);
        let empty = HeaderMap::new();
        for query in [
            "api_key=a&api_key=b",
            "api_key=a&api%5Fkey=a",
            "api_key=&api_key=b",
        ] {
            assert_eq!(
                by_query.value(&facts(&empty, Some(query))),
                Err(AmbiguousKey),
                "{query}"
            );
        }
        assert_eq!(
            by_query.value(&facts(&empty, Some("api_key=a&other=b"))),
            Ok(Some("a".into()))
        );
        // Ambiguity is refused even when the limit would be skipped for an empty value.
        let mut empty_twice = HeaderMap::new();
        empty_twice.append("x-api-key", HeaderValue::from_static(""));
        empty_twice.append("x-api-key", HeaderValue::from_static(""));
        assert_eq!(
            by_header.value(&facts(&empty_twice, None)),
            Err(AmbiguousKey)
        );
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_prefix() {
        let key = |addr: &str, prefix: u8| {
            let mut out = String::new();
            push_client_key(&mut out, ip(addr), prefix);
            out
        };
        assert_eq!(key("2001:db8:1:2:aaaa::1", 64), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2:bbbb::9", 64), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2:bbbb::9", 48), "2001:db8:1::/48");
        assert_eq!(key("2001:db8:1:2:bbbb::9", 128), "2001:db8:1:2:bbbb::9");
        assert_eq!(key("2001:db8::1", 1), "::/1");
        assert_eq!(key("192.0.2.7", 64), "192.0.2.7");
    }
}
