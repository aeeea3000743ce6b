//! Header rewriting for proxying: hop-by-hop fields removed both ways; of the client-address fields
//! (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`) only the believed one kept, from trusted proxies only, and extended
//! with the peer; `X-Forwarded-*` and `Via`.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

use crate::key::{believed_hops, ClientIpHeader};

/// The pseudonym tollgate uses in `Via`.
pub const VIA: &str = "tollgate";

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

// The values tollgate writes, made once: `HeaderValue::from_static` called on the request path checks each byte of
// its text every time.
static HTTP: HeaderValue = HeaderValue::from_static("http");
static TRAILERS: HeaderValue = HeaderValue::from_static("trailers");
static VIA_09: HeaderValue = HeaderValue::from_static("0.9 tollgate");
static VIA_10: HeaderValue = HeaderValue::from_static("1.0 tollgate");
static VIA_11: HeaderValue = HeaderValue::from_static("1.1 tollgate");
static VIA_2: HeaderValue = HeaderValue::from_static("2 tollgate");
static VIA_3: HeaderValue = HeaderValue::from_static("3 tollgate");

/// What the gateway knows about the hop a request came over.
#[derive(Debug, Clone, Copy)]
pub struct ForwardedFacts<'a> {
    /// The TCP peer.
    pub peer: IpAddr,
    /// Whether the peer is a trusted proxy, whose `X-Forwarded-*` are kept and extended.
    pub peer_trusted: bool,
    /// `client_ip.header`: the client-address field believed from trusted proxies; the other two are dropped.
    pub believed: ClientIpHeader,
    /// The host the client asked for, if any, as routing reads it (lower case, without its port).
    pub host: Option<&'a str>,
    /// The request's `Host` field, when it has one: the authority the client asked for, port included.
    /// `X-Forwarded-Host` is a share of it, neither checked nor copied again.
    pub host_field: Option<&'a HeaderValue>,
    /// The client's HTTP version, for `Via`.
    pub version: Version,
    /// `client_ip.forwarded`: add tollgate's element to `Forwarded` (RFC 7239).
    pub write_forwarded: bool,
    /// The gateway reads the answer's trailers (a route's `usage: header:<name>`): the upstream is told so with
    /// `TE: trailers`, without which a server may drop them (hyper's HTTP/1 server does).
    pub reads_trailers: bool,
    /// An `x-request-id` made by the gateway and not among the request's fields: written with the hop's fields.
    pub request_id: Option<&'a HeaderValue>,
}

/// The hop-by-hop fields every message loses, whether or not `Connection` names them (RFC 9110 §7.6.1). `Trailer`
/// is not one: it announces the trailer fields of the message, which go end to end.
const HOP_BY_HOP: [&HeaderName; 6] = [
    &header::CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &header::TE,
    &header::TRANSFER_ENCODING,
    &header::UPGRADE,
];

/// The position of `name` in `HOP_BY_HOP`, if it is one of them (the two lists must keep one order:
/// `any_one_hop_by_hop_field_is_found_and_removed` fails otherwise).
fn hop_by_hop_index(name: &str) -> Option<usize> {
    // Matching the (lowercase) text is one length switch and at most one comparison; `HeaderName` equality
    // would compare against each of the six in turn.
    match name {
        "connection" => Some(0),
        "keep-alive" => Some(1),
        "proxy-connection" => Some(2),
        "te" => Some(3),
        "transfer-encoding" => Some(4),
        "upgrade" => Some(5),
        _ => None,
    }
}

/// Whether a `Connection` token (any case) is `close` or one of the six hop-by-hop names, which are removed anyway.
fn names_no_other_field(token: &str) -> bool {
    let same = |known: &str| known.len() == token.len() && known.eq_ignore_ascii_case(token);
    same("close") || HOP_BY_HOP.iter().any(|name| same(name.as_str()))
}

/// Removes the hop-by-hop fields of RFC 9110 §7.6.1: `Connection` and every field it names, `Keep-Alive`,
/// `Proxy-Connection`, `TE`, `Transfer-Encoding` and `Upgrade`.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let mut present = 0u16;
    let mut names_fields = false;
    for (name, value) in headers.iter() {
        if let Some(index) = hop_by_hop_index(name.as_str()) {
            present |= 1 << index;
            // Nearly every upstream answer says `Connection: keep-alive`, which names no field: told from its bytes
            // here, where the general reading would look the field up again and split it as a list.
            names_fields |= index == 0 && !is_keep_alive_or_close(value);
        }
    }
    if names_fields {
        remove_connection_named(headers, false);
    }
    remove_present_hop_by_hop(headers, present);
}

/// Whether a `Connection` field line is `keep-alive` or `close` alone (any case), naming no field.
fn is_keep_alive_or_close(value: &HeaderValue) -> bool {
    let value = value.as_bytes();
    // Nearly every one is written `keep-alive`: one comparison, before the case-blind ones.
    value == b"keep-alive"
        || value.eq_ignore_ascii_case(b"keep-alive")
        || value.eq_ignore_ascii_case(b"close")
}

/// What a client may not send the upstream in a field's name: the rules applied to every request as it arrives,
/// before tollgate reads or writes anything (see [`clean_client_fields`]).
#[derive(Debug, Clone, Default)]
pub struct ClientFieldRules {
    /// `server.underscores_in_headers`: keep field names with `_` (except the protected spellings).
    pub keep_underscores: bool,
    /// Names that tollgate writes or reads identity from, beyond the fixed ones (those tollgate writes for the upstream): the consumer
    /// headers. A name with `_` that reads as one of them with `_` as `-` is always dropped.
    pub protected: Vec<HeaderName>,
}

/// The fields tollgate writes for the upstream, which no client spelling may stand for.
const PROTECTED: [&str; 8] = [
    "host",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
    "via",
    "x-request-id",
    "x-real-ip",
];

/// Cleans a request's fields as it arrives, before routing, keys and everything tollgate writes for the upstream:
/// - the fields its `Connection` names are removed now (never `Host`, which it was routed on), so that they can
///   only be fields the client sent: what tollgate writes later survives any `Connection`, and what the limits
///   count is what the upstream gets;
/// - field names with `_` are dropped (unless `rules.keep_underscores`, and then only the spellings that read as a
///   protected field with `_` as `-`): Rack, WSGI and CGI upstreams read `X_Consumer_Id` as `X-Consumer-Id`.
///
/// One pass over the names finds neither in nearly every request.
pub fn clean_client_fields(headers: &mut HeaderMap, rules: &ClientFieldRules) {
    let mut connection = false;
    let mut underscore = false;
    for name in headers.keys() {
        let name = name.as_str();
        connection |= name == "connection";
        underscore |= name.as_bytes().contains(&b'_');
    }
    if connection {
        remove_connection_named(headers, true);
    }
    if underscore {
        drop_underscored(headers, rules);
    }
}

/// Removes the fields named by `Connection` (the six hop-by-hop fields are left to
/// [`remove_present_hop_by_hop`]); with `keep_host`, never `Host`.
#[cold]
fn remove_connection_named(headers: &mut HeaderMap, keep_host: bool) {
    // The usual tokens (`keep-alive`, `close`) name no field besides the six, and are recognised from their text
    // without parsing a `HeaderName` or collecting anything.
    let mut named: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        let Ok(value) = value.to_str() else {
            continue;
        };
        for token in value.split(',').map(str::trim) {
            if token.is_empty() || names_no_other_field(token) {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                if !(keep_host && name == header::HOST) {
                    named.push(name);
                }
            }
        }
    }
    for name in named {
        headers.remove(name);
    }
}

/// Drops the field names with `_` that `rules` do not keep.
#[cold]
fn drop_underscored(headers: &mut HeaderMap, rules: &ClientFieldRules) {
    let dropped: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            let name = name.as_str();
            name.contains('_') && (!rules.keep_underscores || reads_as_protected(name, rules))
        })
        .cloned()
        .collect();
    for name in dropped {
        headers.remove(name);
    }
}

/// Whether `name` (lower case, with `_`) reads as a protected field when each `_` is `-`.
fn reads_as_protected(name: &str, rules: &ClientFieldRules) -> bool {
    let same = |protected: &str| {
        protected.len() == name.len()
            && protected
                .bytes()
                .zip(name.bytes())
                .all(|(p, n)| p == n || (p == b'-' && n == b'_'))
    };
    PROTECTED.iter().any(|p| same(p)) || rules.protected.iter().any(|p| same(p.as_str()))
}

/// Which of the six hop-by-hop fields (bits 0-5, in `HOP_BY_HOP`'s order), of the client-address fields that
/// only trusted proxies may send (`CLIENT_ADDRESS_FIELDS`) and of the `X-Forwarded-*` fields tollgate writes
/// `headers` holds: one pass over the few fields present, since each lookup or removal hashes its name and most
/// messages carry none of them.
fn scan(headers: &HeaderMap) -> u16 {
    let mut present = 0u16;
    for name in headers.keys() {
        let name = name.as_str();
        if let Some(index) = hop_by_hop_index(name) {
            present |= 1 << index;
        } else {
            present |= match name {
                "forwarded" | "x-real-ip" => CLIENT_ADDRESS_FIELDS,
                "x-forwarded-for" => X_FORWARDED_FOR_FIELD,
                "x-forwarded-proto" => X_FORWARDED_PROTO_FIELD,
                "x-forwarded-host" => X_FORWARDED_HOST_FIELD,
                _ => 0,
            };
        }
    }
    present
}

/// The bits of [`scan`] for the six hop-by-hop fields.
const HOP_BY_HOP_FIELDS: u16 = (1 << HOP_BY_HOP.len()) - 1;

/// The bit of [`scan`] for `Forwarded` or `X-Real-IP`.
const CLIENT_ADDRESS_FIELDS: u16 = 1 << 7;

/// The bits of [`scan`] for the `X-Forwarded-*` fields tollgate writes.
const X_FORWARDED_FOR_FIELD: u16 = 1 << 8;
const X_FORWARDED_PROTO_FIELD: u16 = 1 << 9;
const X_FORWARDED_HOST_FIELD: u16 = 1 << 10;

/// The bit of [`scan`] for `TE`.
const TE_FIELD: u16 = 1 << 3;

/// Whether a `TE` field of `headers` lists `trailers` (any case, with or without parameters).
#[cold]
fn lists_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let name = coding.split(';').next().unwrap_or_default().trim();
            name.eq_ignore_ascii_case("trailers")
        })
}

/// Removes the six hop-by-hop fields [`scan`] found (most upstream responses carry `Connection: keep-alive`); the
/// fields `Connection` names are the callers' to remove.
fn remove_present_hop_by_hop(headers: &mut HeaderMap, present: u16) {
    if present & HOP_BY_HOP_FIELDS == 0 {
        return;
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << index) != 0 {
            headers.remove(*name);
        }
    }
}

/// Prepares request headers for the upstream: the hop-by-hop fields go (the fields the client's `Connection` named
/// went as it arrived, [`clean_client_fields`], before tollgate wrote its own).
///
/// The client-address fields say who the client is, and the upstream must read the client tollgate counted:
/// - from a trusted proxy, `X-Forwarded-For` is the believed field's list of hops (every field line, as one list,
///   RFC 9110 §5.3; `Forwarded`'s `for=` values, or `X-Real-IP`'s address) ending with the peer; the believed field
///   itself is kept as the proxy wrote it, and the other two of `X-Forwarded-For`, `Forwarded` and `X-Real-IP` are
///   dropped, since the proxy passed them through from the client; the other `X-Forwarded-*` are kept;
/// - from anyone else, all three are dropped and `X-Forwarded-For` is the peer alone, since nobody vouches for what
///   a client claims about itself.
///
/// With `write_forwarded`, `Forwarded` gets tollgate's element for the peer too (appended to a believed one, else
/// alone).
pub fn prepare_request(headers: &mut HeaderMap, facts: &ForwardedFacts<'_>) {
    prepare_request_fields(headers, facts).insert_into(headers);
}

/// The fields tollgate writes for the upstream about the hop, decided by [`prepare_request_fields`]: written after
/// the request's own fields, straight into its head on the wire ([`HopFields::write`]), or into its map
/// ([`HopFields::insert_into`]). Writing them out without the map spares an insertion each (a hash of a custom
/// name, a probe) and their removal with the map.
#[derive(Debug, Default)]
pub struct HopFields {
    forwarded_for: Option<ForwardedFor>,
    /// `X-Forwarded-Proto: http`.
    proto: bool,
    forwarded_host: Option<HeaderValue>,
    via: Option<&'static HeaderValue>,
    /// The gateway's own request id, when the request's fields do not hold it.
    request_id: Option<HeaderValue>,
}

/// An `X-Forwarded-For` value: the peer alone (the usual case, written out with no text made for it), or a list.
#[derive(Debug)]
enum ForwardedFor {
    Peer(IpAddr),
    List(HeaderValue),
}

impl HopFields {
    /// Sets the fields in `headers`: each replaces any the map holds, but `Via`, which is appended.
    pub fn insert_into(self, headers: &mut HeaderMap) {
        let forwarded_for = match self.forwarded_for {
            Some(ForwardedFor::Peer(peer)) => HeaderValue::try_from(crate::key::ip_text(peer)).ok(),
            Some(ForwardedFor::List(list)) => Some(list),
            None => None,
        };
        if let Some(value) = forwarded_for {
            headers.insert(&X_FORWARDED_FOR, value);
        }
        if self.proto {
            headers.insert(&X_FORWARDED_PROTO, HTTP.clone());
        }
        if let Some(value) = self.forwarded_host {
            headers.insert(&X_FORWARDED_HOST, value);
        }
        if let Some(via) = self.via {
            headers.append(header::VIA, via.clone());
        }
        if let Some(id) = self.request_id {
            headers.insert(&X_REQUEST_ID, id);
        }
    }

    /// Writes the fields as head lines (`name: value\r\n`) into `out`. The request's map holds none of them but
    /// `Via`, whose line comes after the request's own `Via` lines.
    pub fn write(&self, out: &mut Vec<u8>) {
        // Each name with its `: ` is one piece of text, and `X-Forwarded-Proto` is one line.
        match &self.forwarded_for {
            Some(ForwardedFor::Peer(peer)) => {
                out.extend_from_slice(b"x-forwarded-for: ");
                crate::key::push_ip_bytes(out, *peer);
                out.extend_from_slice(b"\r\n");
            }
            Some(ForwardedFor::List(list)) => line(out, b"x-forwarded-for: ", list.as_bytes()),
            None => {}
        }
        if self.proto {
            out.extend_from_slice(b"x-forwarded-proto: http\r\n");
        }
        if let Some(value) = &self.forwarded_host {
            line(out, b"x-forwarded-host: ", value.as_bytes());
        }
        if let Some(via) = self.via {
            line(out, b"via: ", via.as_bytes());
        }
        if let Some(id) = &self.request_id {
            line(out, b"x-request-id: ", id.as_bytes());
        }
    }
}

/// Writes the head line `start` (a name and `: `) `value` `\r\n`.
fn line(out: &mut Vec<u8>, start: &[u8], value: &[u8]) {
    out.extend_from_slice(start);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// [`prepare_request`], but the fields tollgate writes about the hop (`X-Forwarded-For`, `X-Forwarded-Proto`,
/// `X-Forwarded-Host`, `Via`, and a request id it made) are returned, not set: the map loses any of the first three that tollgate replaces,
/// and the caller writes them after the request's own fields.
pub fn prepare_request_fields(headers: &mut HeaderMap, facts: &ForwardedFacts<'_>) -> HopFields {
    let present = scan(headers);
    // `TE: trailers` says the trailers will be taken: by the gateway itself, or by a client that asked for them
    // (the gateway passes them on). Its other codings are the client's hop's.
    let asks_trailers =
        facts.reads_trailers || (present & TE_FIELD != 0 && lists_trailers(headers));
    remove_present_hop_by_hop(headers, present);
    if asks_trailers {
        headers.insert(header::TE, TRAILERS.clone());
    }
    let forwarded_for = match (facts.peer_trusted, facts.believed) {
        (false, _) => Ok(ForwardedFor::Peer(facts.peer)),
        (true, ClientIpHeader::XForwardedFor) => {
            let peer = crate::key::ip_text(facts.peer);
            HeaderValue::try_from(extended_list(headers, &X_FORWARDED_FOR, &peer))
                .map(ForwardedFor::List)
        }
        (true, other) => {
            let peer = crate::key::ip_text(facts.peer);
            HeaderValue::try_from(translated_list(headers, other, &peer)).map(ForwardedFor::List)
        }
    };
    let mut fields = HopFields::default();
    if let Ok(value) = forwarded_for {
        if present & X_FORWARDED_FOR_FIELD != 0 {
            headers.remove(&X_FORWARDED_FOR);
        }
        fields.forwarded_for = Some(value);
    }
    if present & CLIENT_ADDRESS_FIELDS != 0 {
        let believed = |field| facts.peer_trusted && facts.believed == field;
        if !believed(ClientIpHeader::Forwarded) {
            headers.remove(header::FORWARDED);
        }
        if !believed(ClientIpHeader::XRealIp) {
            headers.remove(&X_REAL_IP);
        }
    }
    if facts.write_forwarded {
        write_forwarded(headers, facts);
    }
    let proto_present = present & X_FORWARDED_PROTO_FIELD != 0;
    if !(facts.peer_trusted && proto_present) {
        if proto_present {
            headers.remove(&X_FORWARDED_PROTO);
        }
        fields.proto = true;
    }
    let host_present = present & X_FORWARDED_HOST_FIELD != 0;
    if !(facts.peer_trusted && host_present) {
        if host_present {
            headers.remove(&X_FORWARDED_HOST);
        }
        fields.forwarded_host = match facts.host_field {
            Some(field) => Some(field.clone()),
            None => facts.host.and_then(|h| HeaderValue::from_str(h).ok()),
        };
    }
    fields.via = Some(via(facts.version));
    fields.request_id = facts.request_id.cloned();
    fields
}

/// Every field line of `name` joined into one list, with `last` appended: `a, b, last`.
fn extended_list(headers: &HeaderMap, name: &HeaderName, last: &str) -> String {
    let mut list = String::new();
    for line in headers.get_all(name) {
        let Ok(text) = line.to_str() else {
            continue;
        };
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        list.push_str(text);
        list.push_str(", ");
    }
    list.push_str(last);
    list
}

/// The hops of a trusted proxy's `Forwarded` or `X-Real-IP` as an `X-Forwarded-For` list, with `last` appended:
/// the next hop reads the client tollgate read.
#[cold]
fn translated_list(headers: &HeaderMap, field: ClientIpHeader, last: &str) -> String {
    let mut list = String::new();
    for hop in believed_hops(field, headers) {
        // A hop that is no address (obfuscated, malformed) stops the next hop's walk as it stopped this one's.
        let address = !hop.is_empty()
            && hop
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || matches!(b, b'.' | b':' | b'[' | b']'));
        list.push_str(if address { &hop } else { "unknown" });
        list.push_str(", ");
    }
    list.push_str(last);
    list
}

/// Appends tollgate's `Forwarded` element (`for`, `proto`, `host`) to what a trusted proxy sent, or sets it
/// alone.
#[cold]
fn write_forwarded(headers: &mut HeaderMap, facts: &ForwardedFacts<'_>) {
    let for_value = match facts.peer {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("\"[{v6}]\""),
    };
    let mut element = format!("for={for_value};proto=http");
    let field = facts.host_field.and_then(|field| field.to_str().ok());
    if let Some(host) = field.or(facts.host) {
        element.push_str(";host=\"");
        element.push_str(host);
        element.push('"');
    }
    let value = if facts.peer_trusted && facts.believed == ClientIpHeader::Forwarded {
        extended_list(headers, &header::FORWARDED, &element)
    } else {
        element
    };
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(header::FORWARDED, value);
    }
}

/// Prepares response headers for the client.
pub fn prepare_response(headers: &mut HeaderMap, version: Version) {
    remove_hop_by_hop(headers);
    append_via(headers, version);
}

fn append_via(headers: &mut HeaderMap, version: Version) {
    headers.append(header::VIA, via(version).clone());
}

/// Tollgate's `Via` value for a message received in `version`: static values, no formatting per request.
fn via(version: Version) -> &'static HeaderValue {
    match version {
        Version::HTTP_09 => &VIA_09,
        Version::HTTP_10 => &VIA_10,
        Version::HTTP_2 => &VIA_2,
        Version::HTTP_3 => &VIA_3,
        _ => &VIA_11,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(trusted: bool) -> ForwardedFacts<'static> {
        ForwardedFacts {
            peer: "192.0.2.1".parse().unwrap(),
            peer_trusted: trusted,
            believed: ClientIpHeader::XForwardedFor,
            host: Some("api.example.com"),
            host_field: None,
            version: Version::HTTP_11,
            write_forwarded: false,
            reads_trailers: false,
            request_id: None,
        }
    }

    #[test]
    fn a_request_id_the_gateway_made_goes_with_the_hop_s_fields() {
        let id = HeaderValue::from_static("0123abcd");
        let made = ForwardedFacts {
            request_id: Some(&id),
            ..facts(false)
        };
        let mut out = Vec::new();
        prepare_request_fields(&mut HeaderMap::new(), &made).write(&mut out);
        let written = String::from_utf8(out).expect("text");
        assert!(
            written.ends_with("\r\nx-request-id: 0123abcd\r\n"),
            "{written}"
        );
        // Into the map, for the requests hyper's client sends (a WebSocket handshake).
        let mut h = HeaderMap::new();
        prepare_request(&mut h, &made);
        assert_eq!(h["x-request-id"], "0123abcd");
        // None made: none written.
        let mut out = Vec::new();
        prepare_request_fields(&mut HeaderMap::new(), &facts(false)).write(&mut out);
        assert!(!String::from_utf8(out)
            .expect("text")
            .contains("x-request-id"));
    }

    #[test]
    fn the_hop_fields_written_apart_replace_those_the_map_loses() {
        let client = || {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
            h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
            h.insert("x-forwarded-host", HeaderValue::from_static("shop.example"));
            h.insert("via", HeaderValue::from_static("1.0 edge"));
            h
        };
        let written = |h: &mut HeaderMap, trusted| {
            let mut out = Vec::new();
            prepare_request_fields(h, &facts(trusted)).write(&mut out);
            String::from_utf8(out).expect("text")
        };
        // Nobody vouches for an untrusted client's fields: the map loses them, tollgate's are written.
        let mut h = client();
        assert_eq!(
            written(&mut h, false),
            "x-forwarded-for: 192.0.2.1\r\nx-forwarded-proto: http\r\n\
             x-forwarded-host: api.example.com\r\nvia: 1.1 tollgate\r\n"
        );
        assert!(!h.contains_key("x-forwarded-for"));
        assert!(!h.contains_key("x-forwarded-proto"));
        assert!(!h.contains_key("x-forwarded-host"));
        assert_eq!(h["via"], "1.0 edge");
        // A trusted proxy's list is extended, its other X-Forwarded-* kept in the map.
        let mut h = client();
        assert_eq!(
            written(&mut h, true),
            "x-forwarded-for: 203.0.113.9, 192.0.2.1\r\nvia: 1.1 tollgate\r\n"
        );
        assert!(!h.contains_key("x-forwarded-for"));
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "shop.example");
        // Into the map, the same fields as prepare_request sets.
        let (mut apart, mut whole) = (client(), client());
        prepare_request_fields(&mut apart, &facts(false)).insert_into(&mut apart);
        prepare_request(&mut whole, &facts(false));
        assert_eq!(apart, whole);
        assert_eq!(
            whole.get_all("via").iter().collect::<Vec<_>>(),
            ["1.0 edge", "1.1 tollgate"]
        );
    }

    #[test]
    fn connection_named_fields_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        remove_hop_by_hop(&mut h);
        assert!(h.get("x-secret").is_none() && h.get(header::TE).is_none());
        assert!(h.get("x-kept").is_some());
    }

    #[test]
    fn connection_tokens_are_matched_whatever_their_case_and_spacing() {
        let mut h = HeaderMap::new();
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("Keep-Alive ,X-Secret"),
        );
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("close, x-other"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("1"));
        h.insert(
            "close",
            HeaderValue::from_static("kept: `close` is an option, not a field name"),
        );
        h.insert("x-kept", HeaderValue::from_static("1"));
        remove_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["close", "x-kept"]);
    }

    #[test]
    fn a_connection_line_that_names_no_field_is_removed_alone_and_one_beside_it_still_names() {
        for lines in [
            &["keep-alive"][..],
            &["Keep-Alive"],
            &["CLOSE"],
            &["keep-alive", "x-secret"],
            &["x-secret", "close"],
        ] {
            let mut h = HeaderMap::new();
            for line in lines {
                h.append(header::CONNECTION, HeaderValue::from_static(line));
            }
            h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
            h.insert("x-secret", HeaderValue::from_static("1"));
            h.insert("x-kept", HeaderValue::from_static("1"));
            remove_hop_by_hop(&mut h);
            let named = lines.contains(&"x-secret");
            let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
            left.sort_unstable();
            let expected: &[&str] = if named {
                &["x-kept"]
            } else {
                &["x-kept", "x-secret"]
            };
            assert_eq!(left, expected, "{lines:?}");
        }
    }

    #[test]
    fn any_one_hop_by_hop_field_is_found_and_removed() {
        for name in HOP_BY_HOP {
            let mut h = HeaderMap::new();
            h.insert("x-kept", HeaderValue::from_static("1"));
            h.insert(name, HeaderValue::from_static("x"));
            remove_hop_by_hop(&mut h);
            assert!(h.get(name).is_none(), "{name}");
            assert_eq!(h.len(), 1, "{name}");
        }
    }

    #[test]
    fn via_names_the_hop_s_protocol() {
        for (version, via) in [
            (Version::HTTP_10, "1.0 tollgate"),
            (Version::HTTP_11, "1.1 tollgate"),
            (Version::HTTP_2, "2 tollgate"),
        ] {
            let mut h = HeaderMap::new();
            prepare_response(&mut h, version);
            assert_eq!(h[header::VIA], via);
        }
    }

    #[test]
    fn forwarded_for_is_extended_only_from_trusted_peers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        prepare_request(&mut h, &facts(true));
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 192.0.2.1");
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        h.insert("x-forwarded-host", HeaderValue::from_static("evil"));
        prepare_request(&mut h, &facts(false));
        assert_eq!(h["x-forwarded-for"], "192.0.2.1");
        assert_eq!(h["x-forwarded-host"], "api.example.com");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["via"], "1.1 tollgate");
    }

    #[test]
    fn every_forwarded_for_line_is_kept_from_trusted_peers_as_one_list() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("198.51.100.1"));
        h.append(
            "x-forwarded-for",
            HeaderValue::from_static("203.0.113.9, 10.0.0.2"),
        );
        prepare_request(&mut h, &facts(true));
        let lines: Vec<&HeaderValue> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(lines, ["198.51.100.1, 203.0.113.9, 10.0.0.2, 192.0.2.1"]);
    }

    #[test]
    fn the_upstream_is_asked_for_trailers_only_where_they_are_taken() {
        let reading = ForwardedFacts {
            reads_trailers: true,
            ..facts(false)
        };
        for (te, facts, asked) in [
            (None, facts(false), None),
            (Some("deflate"), facts(false), None),
            (
                Some("deflate, Trailers;q=0.5"),
                facts(false),
                Some("trailers"),
            ),
            (None, reading, Some("trailers")),
            (Some("deflate"), reading, Some("trailers")),
        ] {
            let mut h = HeaderMap::new();
            if let Some(te) = te {
                h.insert(header::TE, HeaderValue::from_static(te));
            }
            prepare_request(&mut h, &facts);
            let forwarded = h.get(header::TE).map(|v| v.to_str().unwrap());
            assert_eq!(forwarded, asked, "TE {te:?}");
        }
    }

    #[test]
    fn the_trailer_field_goes_end_to_end() {
        let mut h = HeaderMap::new();
        h.insert(header::TRAILER, HeaderValue::from_static("x-tokens"));
        prepare_response(&mut h, Version::HTTP_11);
        assert_eq!(h[header::TRAILER], "x-tokens");
    }

    #[test]
    fn client_address_fields_from_untrusted_peers_are_replaced() {
        let mut h = HeaderMap::new();
        h.insert(header::FORWARDED, HeaderValue::from_static("for=10.1.2.3"));
        h.insert("x-real-ip", HeaderValue::from_static("10.1.2.3"));
        h.insert("x-forwarded-for", HeaderValue::from_static("10.1.2.3"));
        prepare_request(&mut h, &facts(false));
        assert!(h.get(header::FORWARDED).is_none());
        assert!(h.get("x-real-ip").is_none());
        assert_eq!(h["x-forwarded-for"], "192.0.2.1");

        let mut h = HeaderMap::new();
        h.insert(header::FORWARDED, HeaderValue::from_static("for=10.1.2.3"));
        let mut with_forwarded = facts(false);
        with_forwarded.write_forwarded = true;
        prepare_request(&mut h, &with_forwarded);
        assert_eq!(
            h[header::FORWARDED],
            "for=192.0.2.1;proto=http;host=\"api.example.com\""
        );
    }

    #[test]
    fn forwarded_from_a_trusted_peer_is_kept_and_extended() {
        let mut h = HeaderMap::new();
        h.append(
            header::FORWARDED,
            HeaderValue::from_static("for=198.51.100.1"),
        );
        h.append(
            header::FORWARDED,
            HeaderValue::from_static("for=203.0.113.9"),
        );
        h.insert("x-real-ip", HeaderValue::from_static("203.0.113.9"));
        h.insert("x-forwarded-for", HeaderValue::from_static("10.9.9.9"));
        let mut trusted = facts(true);
        trusted.believed = ClientIpHeader::Forwarded;
        trusted.write_forwarded = true;
        trusted.peer = "2001:db8::7".parse().unwrap();
        prepare_request(&mut h, &trusted);
        assert_eq!(
            h[header::FORWARDED],
            "for=198.51.100.1, for=203.0.113.9, for=\"[2001:db8::7]\";proto=http;host=\"api.example.com\""
        );
        // The other two fields are the client's, passed through by the proxy: dropped, and X-Forwarded-For tells
        // the next hop the client that was read from Forwarded.
        assert!(h.get("x-real-ip").is_none());
        assert_eq!(
            h["x-forwarded-for"],
            "198.51.100.1, 203.0.113.9, 2001:db8::7"
        );
    }

    #[test]
    fn from_a_trusted_peer_only_the_believed_field_is_kept() {
        for (believed, kept) in [
            (ClientIpHeader::XForwardedFor, "x-forwarded-for"),
            (ClientIpHeader::Forwarded, "forwarded"),
            (ClientIpHeader::XRealIp, "x-real-ip"),
        ] {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.1"));
            h.insert(
                header::FORWARDED,
                HeaderValue::from_static("for=203.0.113.2"),
            );
            h.insert("x-real-ip", HeaderValue::from_static("203.0.113.3"));
            let mut trusted = facts(true);
            trusted.believed = believed;
            prepare_request(&mut h, &trusted);
            for field in ["forwarded", "x-real-ip"] {
                assert_eq!(
                    h.contains_key(field),
                    field == kept,
                    "{believed:?}: {field}"
                );
            }
            let client = match believed {
                ClientIpHeader::XForwardedFor => "203.0.113.1",
                ClientIpHeader::Forwarded => "203.0.113.2",
                ClientIpHeader::XRealIp => "203.0.113.3",
            };
            assert_eq!(h["x-forwarded-for"], format!("{client}, 192.0.2.1"));
        }
    }
}
