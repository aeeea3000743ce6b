//! Key specs: the parts a limit's key is built from, and the key value of one request.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;

use http::{HeaderMap, HeaderName, Method};
use sha2::{Digest, Sha256};

use super::client_cert::ClientCertificate;
use super::client_ip::push_ip_text;

/// One component of a limiting key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The client's address (see [`ClientIpResolver`](super::ClientIpResolver)).
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
    /// The consumer id (see docs/configuration.md, "Consumers and plans"); absent for anonymous callers.
    Consumer,
    /// The caller's plan name; absent when no plan applies.
    Plan,
    /// The subject of the connection's verified client certificate, as RFC 4514 writes it; absent without one
    /// (see [`ClientCertificate`]).
    ClientCert,
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
    /// The value is a credential, or made from one: it is digested before it reaches a store key, a log line or
    /// the admin API (see [`KeySpec::secret`]).
    secret: bool,
}

/// Headers whose values are credentials wherever they are sent: a key made from one is always secret.
const CREDENTIAL_HEADERS: [HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::header::PROXY_AUTHORIZATION,
    http::header::COOKIE,
];

/// One request as every step after routing reads it: admission builds it once per request (from the canonical
/// request, the client address and the route's policy), keys are built from it, callers identified from it, and the
/// limits' work kept for after the answer takes its keys from it. It borrows: the normalised strings from the
/// [`CanonicalRequest`](crate::routing::CanonicalRequest) that owns them, the method and fields from the request,
/// the route's parts from its policy; nothing is copied per request. Copy: identifying a caller makes a second
/// value with the caller's parts filled in.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The client address, resolved through trusted proxies: the `ip` key part, allowlists, failed credentials.
    pub client_ip: IpAddr,
    /// The bits of an IPv6 client address that key it (`client_ip.ipv6_prefix`): 64 keys each /64.
    pub ipv6_prefix: u8,
    /// The matched route's name (a layer's scope): the `route` key part.
    pub route: &'a str,
    /// The request method: the `method` key part.
    pub method: &'a Method,
    /// The request path as routes match it (normalised, without `;` parameters): the `path` key part, and which
    /// endpoint of an LLM API is called.
    pub path: &'a str,
    /// Whether the route matches paths in any case: a `path` part is then counted in lower case. A trailing `/` is
    /// never counted (`/login/` is `/login` to routes).
    pub path_any_case: bool,
    /// The request host, lower-cased, without port, if any: the `host` key part.
    pub host: Option<&'a str>,
    /// The request's fields (cleaned of what `Connection` names): `header:` key parts and credentials.
    pub headers: &'a HeaderMap,
    /// The raw query string, if any: `query:` key parts and credentials sent as parameters.
    pub query: Option<&'a str>,
    /// The consumer id, once admission has identified the caller: the `consumer` key part.
    pub consumer: Option<&'a str>,
    /// The caller's plan name, once admission has identified the caller: the `plan` key part.
    pub plan: Option<&'a str>,
    /// The connection's verified client certificate (mutual TLS), if any: the `client_cert` key part and the
    /// `mtls` identifier.
    pub client_cert: Option<&'a ClientCertificate>,
}

// === impl RequestFacts ===

#[cfg(test)]
impl<'a> RequestFacts<'a> {
    /// A `GET /` on route `api` from `client_ip` with `headers` and `query`, no host and no caller.
    pub(crate) fn get(client_ip: &str, headers: &'a HeaderMap, query: Option<&'a str>) -> Self {
        RequestFacts {
            client_ip: client_ip.parse().expect("ip"),
            ipv6_prefix: 64,
            route: "api",
            method: &Method::GET,
            path: "/",
            path_any_case: false,
            host: None,
            headers,
            query,
            consumer: None,
            plan: None,
            client_cert: None,
        }
    }
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
    #[error(
        "unknown key part {0:?} (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan, client_cert)"
    )]
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
    /// Whether the client writes this part's value as it likes: a header, a query parameter, the host, or a
    /// certificate's subject (its CA vouches for the certificate, not for what the subject looks like).
    pub fn is_client_text(&self) -> bool {
        matches!(
            self,
            Self::Header(_) | Self::Query(_) | Self::Host | Self::ClientCert
        )
    }

    /// Parses `ip`, `route`, `method`, `path`, `host`, `header:NAME`, `query:NAME`, `consumer`, `plan` or
    /// `client_cert`.
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
            "consumer" => Ok(KeyPart::Consumer),
            "plan" => Ok(KeyPart::Plan),
            "client_cert" => Ok(KeyPart::ClientCert),
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
            KeyPart::Consumer => f.write_str("consumer"),
            KeyPart::Plan => f.write_str("plan"),
            KeyPart::ClientCert => f.write_str("client_cert"),
        }
    }
}

// === impl KeySpec ===

impl KeySpec {
    /// A key made of `parts` (at least one), falling back as `missing` says when a part is absent. Secret when a
    /// part is a credential header (`Authorization`, `Proxy-Authorization`, `Cookie`).
    pub fn new(parts: Vec<KeyPart>, missing: MissingKey) -> Self {
        let parts = if parts.is_empty() {
            vec![KeyPart::Ip]
        } else {
            parts
        };
        let secret = parts
            .iter()
            .any(|part| matches!(part, KeyPart::Header(name) if CREDENTIAL_HEADERS.contains(name)));
        Self {
            parts,
            missing,
            secret,
        }
    }

    /// This key, secret (`yes`) or as it was: a secret key's values are replaced by their SHA-256 (64 hex digits)
    /// as they are built, so that a credential never stands in a store key, a log line or an admin answer. Set for
    /// a limit's `secret: true` and for keys made from the consumers' API key header or parameter.
    pub fn secret(mut self, yes: bool) -> Self {
        self.secret |= yes;
        self
    }

    /// Whether the key's values are digested (see [`secret`](Self::secret)).
    pub fn is_secret(&self) -> bool {
        self.secret
    }

    /// `value`, a key value as written by an operator (the admin API's `?key=`), as this key stores it: its digest
    /// when the key is secret.
    pub fn sealed(&self, value: &str) -> String {
        let mut out = value.to_owned();
        if self.secret {
            digest_from(&mut out, 0);
        }
        out
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
    /// Parts are joined with `|`, a `|` or `\` inside a part written `\|` or `\\`, so that no two requests' parts
    /// make one value. A key of one part the client writes (a header, a query parameter, the host, a certificate's
    /// subject) whose value reads as an address, or starts with `\`, is written after a `\`: it is never the key
    /// `missing: ip` gives a client by its address. The value is not yet safe for a store key: see
    /// [`store_key`](super::store_key()).
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
        let applies = self.push_plain_value(facts, out)?;
        if applies && self.secret {
            digest_from(out, start);
        }
        Ok(applies)
    }

    /// Ends a store key whose value this spec wrote from `value_start` on, as [`seal_key`](super::seal_key) does:
    /// a client's address alone is always short printable text, which needs no look.
    pub fn seal(&self, key: &mut String, value_start: usize) {
        if !self.secret && matches!(self.parts[..], [KeyPart::Ip]) {
            key.push('}');
        } else {
            super::seal_key(key, value_start);
        }
    }

    /// [`push_value`](Self::push_value) before a secret value is digested.
    fn push_plain_value(
        &self,
        facts: &RequestFacts<'_>,
        out: &mut String,
    ) -> Result<bool, AmbiguousKey> {
        let start = out.len();
        let joined = self.parts.len() > 1;
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            let part_start = out.len();
            match push_part(part, facts, out) {
                PartValue::Present if joined => escape_from(out, part_start),
                PartValue::Present => {
                    if part.is_client_text() && passes_for_an_address(&out[part_start..]) {
                        out.insert(part_start, ADDRESS_MARK);
                    }
                }
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

/// What a one-part key the client writes is preceded by when it reads as an address, or starts with this mark (see
/// [`KeySpec::value`]).
const ADDRESS_MARK: char = '\\';

/// Writes `out[from..]`, one part of a key of several, with `\` before each `|` and `\`: the join is then read one
/// way only (`a|b` + `c` is `a\|b|c`, never `a` + `b|c`).
fn escape_from(out: &mut String, from: usize) {
    if !out[from..].contains(['|', '\\']) {
        return;
    }
    let part = out.split_off(from);
    push_escaped(out, &part, &['|']);
}

/// Appends `text` with a `\` before each of `separators` and before `\` itself: text joined with those separators
/// is then read one way only (key parts here, a rate limit service descriptor's entries too).
pub fn push_escaped(out: &mut String, text: &str, separators: &[char]) {
    for c in text.chars() {
        if c == '\\' || separators.contains(&c) {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Whether a one-part key's value could be taken for the key `missing: ip` writes for an address (`192.0.2.7`,
/// `2001:db8:1:2::/64`), or for one so marked: an address, an address and a prefix length, or text starting with
/// [`ADDRESS_MARK`].
fn passes_for_an_address(value: &str) -> bool {
    if value.starts_with(ADDRESS_MARK) {
        return true;
    }
    // The longest address text with a prefix is 49 bytes; an API key or a tenant name fails the first test at once.
    if value.len() > 49
        || !value
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || matches!(b, b'.' | b':' | b'/'))
    {
        return false;
    }
    let address = value.split_once('/').map_or(value, |(address, length)| {
        if length.parse::<u8>().is_ok() {
            address
        } else {
            ""
        }
    });
    address.parse::<IpAddr>().is_ok()
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
        KeyPart::Path => {
            let path = match facts.path.strip_suffix('/') {
                Some(rest) if !rest.is_empty() => rest,
                _ => facts.path,
            };
            if facts.path_any_case {
                out.extend(path.chars().map(|c| c.to_ascii_lowercase()));
            } else {
                out.push_str(path);
            }
            return PartValue::Present;
        }
        KeyPart::Host => match facts.host {
            Some(host) if !host.is_empty() => host,
            _ => return PartValue::Absent,
        },
        KeyPart::Consumer => match facts.consumer {
            Some(consumer) => consumer,
            None => return PartValue::Absent,
        },
        KeyPart::Plan => match facts.plan {
            Some(plan) => plan,
            None => return PartValue::Absent,
        },
        // An empty subject (a certificate named only by its alternative names) is no value: every such client
        // would share one key.
        KeyPart::ClientCert => match facts.client_cert.map(ClientCertificate::subject) {
            Some(subject) if !subject.is_empty() => subject,
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
            let trimmed = trimmed_value(value.as_bytes());
            if trimmed.is_empty() {
                return PartValue::Absent;
            }
            push_key_text(out, trimmed);
            return PartValue::Present;
        }
        KeyPart::Query(name) => {
            return match query_parameter(facts.query, name) {
                QueryParameter::Ambiguous => PartValue::Ambiguous,
                QueryParameter::One(v) if !v.is_empty() => {
                    push_key_text(out, &v);
                    PartValue::Present
                }
                _ => PartValue::Absent,
            };
        }
    };
    out.push_str(text);
    PartValue::Present
}

/// A header value without its surrounding whitespace: Unicode whitespace when it is UTF-8, ASCII whitespace when
/// it is not (its bytes are then kept as they are, see [`push_key_text`]).
pub fn trimmed_value(bytes: &[u8]) -> &[u8] {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.trim().as_bytes(),
        Err(_) => bytes.trim_ascii(),
    }
}

/// Marks a key value written as the SHA-256 of its bytes: the replacement character, which a lossy decoding would
/// have left where the bytes that are not UTF-8 stood.
pub const BYTES_MARK: char = '\u{FFFD}';

/// Appends `bytes`, a value read from a request, as key text: the text itself when it is UTF-8, otherwise
/// [`BYTES_MARK`] and the SHA-256 of the bytes in hex. A lossy decoding would make `z\xff`, `z\xfe` and `z\xfd`
/// one key, `z\u{FFFD}`; a digest of the bytes keeps two byte strings two keys. Text that itself starts with the
/// mark is written as its digest too, so that no value can be written as another's digest.
pub fn push_key_text(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.starts_with(BYTES_MARK) => out.push_str(text),
        _ => {
            out.push(BYTES_MARK);
            let start = out.len();
            push_hex_digest(out, bytes);
            debug_assert_eq!(out.len() - start, 64);
        }
    }
}

/// What a query holds of one parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryParameter<'q> {
    /// No parameter of that name.
    Absent,
    /// Exactly one, its value decoded (possibly empty): bytes, since a `%XX` escape may make them anything.
    One(Cow<'q, [u8]>),
    /// More than one, under any spelling of the name.
    Ambiguous,
}

/// The parameter `name` of `query` as any upstream framework might read it, so that no spelling counts apart from
/// the one counted: parameters are split on `&` and `;` (older CGI and Java servers split on both), names are
/// decoded (`%6B` is `k`, `+` a space), compared without regard to ASCII case, and a trailing `[]` is ignored (PHP
/// and Rails read `k[]=a` as `k`). More than one match is [`QueryParameter::Ambiguous`].
pub fn query_parameter<'q>(query: Option<&'q str>, name: &str) -> QueryParameter<'q> {
    let Some(query) = query else {
        return QueryParameter::Absent;
    };
    let mut found = QueryParameter::Absent;
    for pair in query.split(['&', ';']) {
        if !names_parameter(pair, name) {
            continue;
        }
        if found != QueryParameter::Absent {
            return QueryParameter::Ambiguous;
        }
        let raw_value = pair.split_once('=').map_or("", |(_, value)| value);
        found = QueryParameter::One(decode_component(raw_value));
    }
    found
}

/// Whether `pair`, one `name=value` of a query as written, is the parameter `name` under any spelling
/// [`query_parameter`] reads.
pub fn names_parameter(pair: &str, name: &str) -> bool {
    if pair.is_empty() {
        return false;
    }
    let wanted = name.strip_suffix("[]").unwrap_or(name);
    let raw_name = pair.split_once('=').map_or(pair, |(name, _)| name);
    let decoded = decode_component(raw_name);
    let bare = decoded.strip_suffix(b"[]").unwrap_or(&decoded);
    bare.eq_ignore_ascii_case(wanted.as_bytes())
}

/// A query component as its sender meant it (`application/x-www-form-urlencoded`): `+` is a space, `%XX` a byte;
/// borrowed when there is nothing to decode.
fn decode_component(raw: &str) -> Cow<'_, [u8]> {
    if !raw.contains(['%', '+']) {
        return Cow::Borrowed(raw.as_bytes());
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                if let (Some(high), Some(low)) = (hex(i + 1), hex(i + 2)) {
                    // Two hex digits: below 256.
                    out.push(u8::try_from(high << 4 | low).unwrap_or_default());
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    Cow::Owned(out)
}

/// Replaces `out[start..]` by its SHA-256 in hex.
#[cold]
fn digest_from(out: &mut String, start: usize) {
    let digest = Sha256::digest(&out.as_bytes()[start..]);
    out.truncate(start);
    push_hex(out, &digest);
}

/// Appends the SHA-256 of `bytes` in hex.
#[cold]
fn push_hex_digest(out: &mut String, bytes: &[u8]) {
    push_hex(out, &Sha256::digest(bytes));
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn facts<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> RequestFacts<'a> {
        RequestFacts::get("192.0.2.1", headers, query)
    }

    fn spec(parts: &[&str], missing: MissingKey) -> KeySpec {
        let parts = parts.iter().map(|p| KeyPart::parse(p).unwrap()).collect();
        KeySpec::new(parts, missing)
    }

    /// A key of the client's address alone is closed without a look at its value, and reads as the general
    /// sealing writes it: IPv4, IPv6 by its prefix and whole.
    #[test]
    fn an_address_key_seals_as_any_key_does() {
        let headers = HeaderMap::new();
        let by_ip = spec(&["ip"], MissingKey::Ip);
        for (client, prefix) in [
            ("192.0.2.1", 64),
            ("2001:db8::7", 64),
            ("2001:db8::7", 128),
            ("10.0.0.255", 64),
        ] {
            let facts = RequestFacts {
                ipv6_prefix: prefix,
                ..facts(&headers, None)
            };
            let facts = RequestFacts {
                client_ip: ip(client),
                ..facts
            };
            let mut fast = String::from("rl:api:per-ip:{");
            let start = fast.len();
            assert_eq!(by_ip.push_value(&facts, &mut fast), Ok(true));
            let mut general = fast.clone();
            by_ip.seal(&mut fast, start);
            super::super::seal_key(&mut general, start);
            assert_eq!(fast, general, "{client}/{prefix}");
            assert!(fast.ends_with('}'), "{fast}");
        }
        assert_eq!(
            {
                let mut text = String::new();
                push_client_key(&mut text, ip("10.20.3.255"), 64);
                text
            },
            "10.20.3.255"
        );
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
    fn the_parts_of_a_composite_key_are_read_one_way_only() {
        let pair = spec(&["header:x-a", "query:b"], MissingKey::Skip);
        let value = |a: &'static str, b: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-a", HeaderValue::from_static(a));
            let query = format!("b={b}");
            pair.value(&facts(&headers, Some(&query))).unwrap().unwrap()
        };
        assert_eq!(value("a|b", "c"), r"a\|b|c");
        assert_eq!(value("a", "b%7Cc"), r"a|b\|c");
        assert_eq!(value("a\\", "%7Cb"), r"a\\|\|b");
        assert_eq!(value("a", "%5C%7Cb"), r"a|\\\|b");
        // Nothing else changes, an address among the parts included.
        assert_eq!(value("203.0.113.7", "t-1"), "203.0.113.7|t-1");
    }

    #[test]
    fn a_one_part_client_value_is_never_a_clients_address_key() {
        let by_header = spec(&["header:x-api-key"], MissingKey::Ip);
        let value = |key: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-api-key", HeaderValue::from_static(key));
            by_header.value(&facts(&headers, None)).unwrap().unwrap()
        };
        // What `missing: ip` writes for a client (192.0.2.1 here, or an IPv6 network), marked when written.
        assert_eq!(
            by_header.value(&facts(&HeaderMap::new(), None)),
            Ok(Some("192.0.2.1".into()))
        );
        assert_eq!(value("192.0.2.1"), r"\192.0.2.1");
        assert_eq!(value("2001:db8:1:2::/64"), r"\2001:db8:1:2::/64");
        assert_eq!(value("::1"), r"\::1");
        // A value starting with the mark is marked too: `\192.0.2.1` is not the marked `192.0.2.1`.
        assert_eq!(value(r"\192.0.2.1"), r"\\192.0.2.1");
        // Everything else is as written: tokens, hex, a version number, a prefix length of nothing.
        for plain in [
            "k1",
            "deadbeef",
            "1.2.3",
            "abc:def",
            "10.0.0.1/x",
            "2001:db8::/300",
        ] {
            assert_eq!(value(plain), plain);
        }
        // Parts the client does not write are as they are: a consumer named like an address is the operator's.
        assert!(!KeyPart::Consumer.is_client_text());
        assert!(KeyPart::Host.is_client_text());
    }

    proptest::proptest! {
        /// Whatever the client writes, a one-part key of it is never the key of an address (any address, any IPv6
        /// prefix), and two pairs of values make two composite keys unless they are the same pair.
        #[test]
        fn written_values_name_no_address_and_composite_keys_no_other_pair(
            a in "[0-9a-f:./|\\\\x]{1,12}",
            b in "[0-9a-f:./|\\\\x]{1,12}",
            c in "[0-9a-f:./|\\\\x]{1,12}",
            d in "[0-9a-f:./|\\\\x]{1,12}",
            v4 in proptest::prelude::any::<[u8; 4]>(),
            v6 in proptest::prelude::any::<u128>(),
            prefix in 0u8..=128,
        ) {
            let headers_of = |x: &str, y: &str| {
                let mut headers = HeaderMap::new();
                headers.insert("x-a", HeaderValue::from_str(x).unwrap());
                headers.insert("x-b", HeaderValue::from_str(y).unwrap());
                headers
            };
            let alone = spec(&["header:x-a"], MissingKey::Skip);
            let headers = headers_of(&a, &b);
            let written = alone.value(&facts(&headers, None)).unwrap().unwrap();
            for address in [IpAddr::from(v4), IpAddr::from(std::net::Ipv6Addr::from(v6))] {
                let mut key = String::new();
                push_client_key(&mut key, address, prefix);
                proptest::prop_assert_ne!(&written, &key);
            }
            // The address's key itself, written by the client, too.
            for address in [IpAddr::from(v4), IpAddr::from(std::net::Ipv6Addr::from(v6))] {
                let mut key = String::new();
                push_client_key(&mut key, address, prefix);
                let headers = headers_of(&key, &b);
                proptest::prop_assert_ne!(alone.value(&facts(&headers, None)).unwrap().unwrap(), key);
            }
            let pair = spec(&["header:x-a", "header:x-b"], MissingKey::Skip);
            let (one, other) = (headers_of(&a, &b), headers_of(&c, &d));
            let same = pair.value(&facts(&one, None)) == pair.value(&facts(&other, None));
            proptest::prop_assert_eq!(same, (&a, &b) == (&c, &d));
        }
    }

    #[test]
    fn client_cert_is_the_subject_or_missing() {
        let headers = HeaderMap::new();
        let by_cert = spec(&["client_cert"], MissingKey::Skip);
        assert_eq!(by_cert.value(&facts(&headers, None)), Ok(None));
        let certificate = ClientCertificate::new("CN=a,O=Example".into(), Some("a".into()));
        let with_cert = RequestFacts {
            client_cert: Some(&certificate),
            ..facts(&headers, None)
        };
        assert_eq!(by_cert.value(&with_cert), Ok(Some("CN=a,O=Example".into())));
        let unnamed = ClientCertificate::new(String::new(), None);
        let with_unnamed = RequestFacts {
            client_cert: Some(&unnamed),
            ..facts(&headers, None)
        };
        let or_ip = spec(&["client_cert"], MissingKey::Ip);
        assert_eq!(or_ip.value(&with_unnamed), Ok(Some("192.0.2.1".into())));
        assert_eq!(KeyPart::ClientCert.to_string(), "client_cert");
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
    fn bytes_that_are_not_utf8_are_keyed_by_their_digest() {
        let text = |bytes: &[u8]| {
            let mut out = String::new();
            push_key_text(&mut out, bytes);
            out
        };
        assert_eq!(text(b"acme"), "acme");
        let keys = [
            text(b"z\xff"),
            text(b"z\xfe"),
            text("z\u{FFFD}".as_bytes()),
            text("\u{FFFD}z".as_bytes()),
        ];
        for (i, key) in keys.iter().enumerate() {
            assert!(keys[..i].iter().all(|other| other != key), "{keys:?}");
        }
        assert_eq!(keys[2], "z\u{FFFD}");
        assert!(keys[0].starts_with(BYTES_MARK) && keys[0].len() == 3 + 64);
        assert!(keys[3].starts_with(BYTES_MARK) && keys[3].len() == 3 + 64);
        // Trimmed as sent: Unicode whitespace around text, ASCII whitespace around other bytes.
        assert_eq!(trimmed_value(b" z\xff\t"), b"z\xff");
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", HeaderValue::from_bytes(b"z\xfd").unwrap());
        let by_header = spec(&["header:x-tenant"], MissingKey::Skip);
        assert_eq!(
            by_header.value(&facts(&headers, None)),
            Ok(Some(text(b"z\xfd")))
        );
        let by_query = spec(&["query:tenant"], MissingKey::Skip);
        assert_eq!(
            by_query.value(&facts(&headers, Some("tenant=z%FD"))),
            Ok(Some(text(b"z\xfd")))
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

    #[test]
    fn a_query_parameter_is_read_under_every_spelling_of_its_name() {
        fn one(query: &str) -> QueryParameter<'_> {
            query_parameter(Some(query), "tenant")
        }
        for query in [
            "tenant=a",
            "x=1;tenant=a",
            "TENANT=a",
            "Tenant=a&x=1",
            "tenant[]=a",
            "%74enant=a",
            "tenant%5B%5D=a",
            "x=1&&tenant=a",
        ] {
            assert_eq!(
                one(query),
                QueryParameter::One(Cow::Borrowed(b"a")),
                "{query}"
            );
        }
        assert_eq!(
            one("tenant=a%2Bb+c"),
            QueryParameter::One(Cow::Borrowed(b"a+b c"))
        );
        for query in [
            "tenant=a&TENANT=b",
            "tenant=a;tenant=a",
            "tenant=a&tenant[]=b",
            "%54enant=b&tenant=a",
        ] {
            assert_eq!(one(query), QueryParameter::Ambiguous, "{query}");
        }
        assert_eq!(one("tenants=a&x=tenant"), QueryParameter::Absent);
        assert_eq!(query_parameter(None, "tenant"), QueryParameter::Absent);
    }
}
