//! Forwarding headers, peers, trusted networks and request parts into client addresses, key values and store keys.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use tollgate::key::{
    store_key, ClientIpResolver, KeyPart, KeySpec, MissingKey, RequestFacts, MAX_PLAIN_KEY_LEN,
};

#[derive(Arbitrary, Debug)]
struct Input {
    peer: Addr,
    trusted: Vec<Net>,
    forwarded: Vec<Header>,
    xff: Vec<Header>,
    /// Headers a key may name; `header:x-k0` .. `header:x-k3` pick them.
    extra: Vec<(u8, Vec<u8>)>,
    parts: Vec<Part>,
    method: u8,
    path: String,
    host: Option<String>,
    query: Option<String>,
    /// Stand-ins for config names: validation keeps them to letters, digits, `_ . -`, and the prefix free of braces.
    prefix: String,
    route: String,
    limit: String,
    /// A value straight to `store_key`, so the digest rule is fuzzed on strings no request could produce too.
    raw_value: String,
    /// `client_ip.ipv6_prefix`, taken modulo 129.
    ipv6_prefix: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Addr {
    V4([u8; 4]),
    V6([u8; 16]),
    /// `::ffff:a.b.c.d`, which must count as the IPv4 address it carries.
    Mapped([u8; 4]),
}

#[derive(Arbitrary, Debug)]
struct Net {
    addr: Addr,
    len: u8,
}

/// One header line: either hops the target writes in the forms proxies use, so that the walk goes deep, or raw
/// bytes, so that malformed values are covered.
#[derive(Arbitrary, Debug)]
enum Header {
    Hops(Vec<Hop>),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Hop {
    addr: Addr,
    port: Option<u16>,
    quoted: bool,
    /// Another `Forwarded` pair before `for=`, such as `proto=https`.
    pair_before: bool,
}

#[derive(Arbitrary, Debug)]
enum Part {
    Ip,
    Route,
    Method,
    Path,
    Host,
    Header(u8),
    Query(String),
    /// Text through the config's parser, which must refuse what it cannot use.
    Parsed(String),
}

const KEY_HEADERS: &[&str] = &["x-k0", "x-k1", "x-k2", "x-k3"];

const METHODS: &[Method] = &[Method::GET, Method::POST, Method::DELETE, Method::OPTIONS];

impl Addr {
    fn ip(self) -> IpAddr {
        match self {
            Addr::V4(b) => IpAddr::V4(Ipv4Addr::from(b)),
            Addr::V6(b) => IpAddr::V6(Ipv6Addr::from(b)),
            Addr::Mapped(b) => IpAddr::V6(Ipv4Addr::from(b).to_ipv6_mapped()),
        }
    }

    /// The address a client is known by: mapped IPv6 forms collapse to IPv4.
    fn canonical(self) -> IpAddr {
        match self.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        }
    }
}

impl Hop {
    /// The hop as an `X-Forwarded-For` entry or a `Forwarded` element.
    fn render(&self, forwarded: bool) -> String {
        let ip = self.addr.ip();
        let mut text = match (ip, self.port) {
            (IpAddr::V4(v4), Some(port)) => format!("{v4}:{port}"),
            (IpAddr::V6(v6), Some(port)) => format!("[{v6}]:{port}"),
            (IpAddr::V6(v6), None) if forwarded => format!("[{v6}]"),
            (ip, None) => ip.to_string(),
        };
        if !forwarded {
            return text;
        }
        if self.quoted || text.contains(':') {
            text = format!("\"{text}\"");
        }
        if self.pair_before {
            format!("proto=https;for={text}")
        } else {
            format!("for={text}")
        }
    }
}

/// Builds the header map; returns the hops in order when every forwarding header was written from `Hops`, for
/// the model of the walk.
fn headers(input: &Input) -> (HeaderMap, Option<Vec<Addr>>) {
    let mut map = HeaderMap::new();
    // `Forwarded` wins whenever one of its values is text, so the model follows whichever header is used.
    let use_forwarded = !input.forwarded.is_empty();
    let mut model = Some(Vec::new());
    for (name, list, forwarded) in [
        (http::header::FORWARDED, &input.forwarded, true),
        (
            HeaderName::from_static("x-forwarded-for"),
            &input.xff,
            false,
        ),
    ] {
        for header in list {
            let bytes = match header {
                Header::Hops(hops) => {
                    // An empty list renders as an empty value, which the resolver reads as one malformed hop.
                    if forwarded == use_forwarded && hops.is_empty() {
                        model = None;
                    }
                    if forwarded == use_forwarded {
                        if let Some(model) = model.as_mut() {
                            model.extend(hops.iter().map(|h| h.addr));
                        }
                    }
                    let text: Vec<String> = hops.iter().map(|h| h.render(forwarded)).collect();
                    text.join(", ").into_bytes()
                }
                Header::Raw(bytes) => {
                    if forwarded == use_forwarded {
                        model = None;
                    }
                    bytes.clone()
                }
            };
            match HeaderValue::from_bytes(&bytes) {
                Ok(value) => {
                    map.append(name.clone(), value);
                }
                // hyper refuses a request with such a value, so the resolver never sees it; nor can the model.
                Err(_) if forwarded == use_forwarded => model = None,
                Err(_) => {}
            }
        }
    }
    // Without any forwarding header the peer is the client, which the model does not need to say.
    if model.as_ref().is_some_and(|m| m.is_empty()) {
        model = None;
    }
    for (i, value) in &input.extra {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            let name = HeaderName::from_static(KEY_HEADERS[usize::from(*i) % KEY_HEADERS.len()]);
            map.append(name, value);
        }
    }
    (map, model)
}

/// The walk as documented: from the nearest hop outwards, skip trusted ones; the first untrusted is the client,
/// and when all are trusted the farthest is.
fn expected_client(resolver: &ClientIpResolver, hops: &[Addr]) -> Option<IpAddr> {
    let mut client = None;
    for hop in hops.iter().rev() {
        let ip = hop.canonical();
        client = Some(ip);
        if !resolver.is_trusted(ip) {
            break;
        }
    }
    client
}

fn key_part(part: &Part) -> Option<KeyPart> {
    match part {
        Part::Ip => Some(KeyPart::Ip),
        Part::Route => Some(KeyPart::Route),
        Part::Method => Some(KeyPart::Method),
        Part::Path => Some(KeyPart::Path),
        Part::Host => Some(KeyPart::Host),
        Part::Header(i) => {
            let name = KEY_HEADERS[usize::from(*i) % KEY_HEADERS.len()];
            KeyPart::parse(&format!("header:{name}")).ok()
        }
        Part::Query(name) if !name.is_empty() => Some(KeyPart::Query(name.clone())),
        Part::Query(_) => None,
        Part::Parsed(text) => {
            let part = KeyPart::parse(text).ok()?;
            // What parses must print back to something that parses to the same part, as `tollgate check` shows it.
            assert_eq!(
                KeyPart::parse(&part.to_string()).as_ref(),
                Ok(&part),
                "{text:?}"
            );
            Some(part)
        }
    }
}

/// The documented key of a client address: IPv4 as written, IPv6 as its network `net/prefix` unless the prefix
/// is 128.
fn client_key(ip: IpAddr, prefix: u8) -> String {
    match ip {
        IpAddr::V6(v6) if prefix < 128 => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            format!("{}/{prefix}", Ipv6Addr::from(u128::from(v6) & mask))
        }
        _ => ip.to_string(),
    }
}

/// Config names as validation admits them.
fn name(text: &str) -> String {
    let name: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        .take(32)
        .collect();
    if name.is_empty() {
        "r".to_owned()
    } else {
        name
    }
}

/// The store key promises: `<prefix><route>:<limit>:{<tag>}`, the tag the value itself only when it is short and
/// free of braces and control characters, its SHA-256 in hex otherwise.
fn check_store_key(prefix: &str, route: &str, limit: &str, value: &str) {
    let key = store_key(prefix, route, limit, value);
    let head = format!("{prefix}{route}:{limit}:{{");
    let tag = key
        .strip_prefix(&head)
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or_else(|| panic!("{key:?} is not {head:?} + tag + '}}'"));
    assert_eq!(key[prefix.len()..].matches('{').count(), 1, "{key:?}");
    let plain = value.len() <= MAX_PLAIN_KEY_LEN
        && !value
            .chars()
            .any(|c| c == '{' || c == '}' || c.is_control());
    if plain {
        assert_eq!(tag, value, "a plain value was rewritten");
    } else {
        let digest: String = Sha256::digest(value.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(tag, digest, "{value:?} was not replaced by its digest");
    }
    assert!(key.len() <= prefix.len() + route.len() + limit.len() + MAX_PLAIN_KEY_LEN + 4);
}

fuzz_target!(|input: Input| {
    let trusted: Vec<IpNet> = input
        .trusted
        .iter()
        .take(8)
        .filter_map(|net| IpNet::new(net.addr.ip(), net.len).ok())
        .collect();
    let resolver = ClientIpResolver::new(trusted);
    let (headers, model) = headers(&input);
    let peer = input.peer.ip();
    let client = resolver.resolve(peer, &headers);

    if !resolver.is_trusted(peer) {
        // The spoofing guarantee: headers from a peer nobody vouches for change nothing.
        assert_eq!(
            client,
            input.peer.canonical(),
            "untrusted peer {peer} resolved elsewhere"
        );
    } else if let Some(hops) = model {
        let expected = expected_client(&resolver, &hops).unwrap_or(input.peer.canonical());
        assert_eq!(
            client, expected,
            "trusted peer {peer}, hops {hops:?}, headers {headers:?}"
        );
    }
    // A client in mapped form would get a second bucket beside its IPv4 one.
    assert!(
        !matches!(client, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()),
        "mapped address {client} escaped canonicalisation"
    );

    let parts: Vec<KeyPart> = input.parts.iter().take(6).filter_map(key_part).collect();
    let route = name(&input.route);
    let limit = name(&input.limit);
    let prefix: String = input
        .prefix
        .chars()
        .filter(|c| !matches!(c, '{' | '}'))
        .collect();
    let method = &METHODS[usize::from(input.method) % METHODS.len()];
    let ipv6_prefix = input.ipv6_prefix % 129;
    let facts = RequestFacts {
        client_ip: client,
        ipv6_prefix,
        route: &route,
        method,
        path: &input.path,
        path_any_case: false,
        host: input.host.as_deref(),
        headers: &headers,
        query: input.query.as_deref(),
        consumer: None,
        plan: None,
        client_cert: None,
    };
    // A key the client writes alone is never the key its address falls back to: a value that reads as an address
    // is marked, so that a header cannot name another client's address budget.
    let written_alone = matches!(&parts[..], [part] if part.is_client_text());
    let by_ip = KeySpec::new(parts.clone(), MissingKey::Ip).value(&facts);
    let skip = KeySpec::new(parts, MissingKey::Skip).value(&facts);
    // The two policies differ only when a part is absent: then one falls back to the address (an IPv6 client's
    // network of `ipv6_prefix` bits), the other skips. A part that occurs twice is ambiguous under both.
    match (&by_ip, &skip) {
        (Ok(Some(a)), Ok(Some(b))) => {
            assert_eq!(a, b);
            if written_alone {
                assert_ne!(a, &client_key(client, ipv6_prefix), "a written value took an address's key");
            }
        }
        (Ok(Some(a)), Ok(None)) => assert_eq!(a, &client_key(client, ipv6_prefix)),
        (Ok(None), _) => panic!("missing: ip never skips a request"),
        (Err(_), Err(_)) => {}
        _ => panic!("ambiguity depends on the missing policy: {by_ip:?} / {skip:?}"),
    }
    if let Ok(Some(value)) = &by_ip {
        check_store_key(&prefix, &route, &limit, value);
    }
    check_store_key(&prefix, &route, &limit, &input.raw_value);
});
