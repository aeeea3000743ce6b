//! Request heads as a client writes them, parsed as hyper parses them, through the canonical request (method, host,
//! path), routing, key extraction and the headers sent upstream: no panic, and one reading of every request.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};
use libfuzzer_sys::fuzz_target;
use tollgate::config;
use tollgate::gateway::Gateway;
use tollgate::key::ClientIpHeader;
use tollgate::limiter::RateLimiter;
use tollgate::proxy::{clean_client_fields, prepare_request, ClientFieldRules, ForwardedFacts};
use tollgate::routing::{normalize_path, CanonicalRequest};

/// Routes of every kind that reads the request: a path prefix keyed by address, keys on a header, a query
/// parameter, the host, the method and the path, an allowlist, a host route, a method route. All answer
/// themselves, so nothing leaves the process; limits are high, so that routing and keying are what is exercised.
const CONFIG: &str = r#"
store:
  backend: memory
  max_keys: 10000
client_ip:
  trusted_proxies: [127.0.0.0/8]
routes:
  - name: api
    match: { path_prefix: /api }
    respond: { status: 200 }
    limits:
      - { name: per-ip, key: ip, algorithm: sliding_log, limit: 1000000, period: 1m }
  - name: keyed
    match: { path_prefix: /keyed }
    respond: { status: 200 }
    limits:
      - name: per-key
        key: [header:x-api-key, query:k, host, method, path]
        missing: skip
        algorithm: token_bucket
        rate: 1000000/s
        burst: 1000000
  - name: internal
    match: { path_prefix: /internal }
    allow: [10.0.0.0/8, "2001:db8::/32"]
    respond: { status: 200 }
    limits:
      - { name: closed, key: ip, algorithm: fixed_window, limit: 1000000, period: 1s }
  - name: limited-host
    match: { host: limited.example }
    respond: { status: 200 }
  - name: login
    match: { path_prefix: /login, methods: [POST] }
    respond: { status: 200 }
  - name: rest
    match: { path_prefix: / }
    respond: { status: 200 }
"#;

/// The hop-by-hop fields (RFC 9110 §7.6.1) that never reach an upstream as the client sent them (`TE` goes on as
/// `trailers` alone, when the client lists it).
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

struct Harness {
    runtime: tokio::runtime::Runtime,
    gateway: Gateway,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let config =
            config::parse(CONFIG, Path::new("fuzz.yaml")).expect("the fuzz config is valid");
        let gateway = {
            let _entered = runtime.enter();
            let limiter = RateLimiter::from_settings(&config.store).expect("memory store");
            Gateway::new(&config, Arc::new(limiter))
        };
        Harness { runtime, gateway }
    })
}

/// The normalised path, or `None` for a target that is not a path. One place to follow `normalize_path`'s
/// signature.
fn normalize(path: &str) -> Option<String> {
    normalize_path(path).ok().map(|normal| normal.into_owned())
}

/// The request the upstream gets from a canonical reading, as far as its reading goes: the same method and
/// version, the normalised path (with the query) in origin form, and the canonical `Host` (the client's own when
/// it was already canonical).
fn forwarded(request: &Request<()>, path: &str, host_field: Option<&HeaderValue>) -> Request<()> {
    let target = match request.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut upstream = Request::new(());
    *upstream.method_mut() = request.method().clone();
    *upstream.version_mut() = request.version();
    *upstream.uri_mut() =
        Uri::try_from(target).expect("a normalised path and a query that parsed are a target");
    *upstream.headers_mut() = request.headers().clone();
    if let Some(host) = host_field {
        upstream.headers_mut().insert(header::HOST, host.clone());
    }
    upstream
}

/// The request as hyper's HTTP/1 server would build it from `bytes`, or `None` for what it would refuse (400) or
/// still be waiting for.
fn parse(bytes: &[u8]) -> Option<Request<()>> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut head = httparse::Request::new(&mut fields);
    let httparse::Status::Complete(_) = head.parse(bytes).ok()? else {
        return None;
    };
    let mut request = Request::new(());
    *request.method_mut() = Method::from_bytes(head.method?.as_bytes()).ok()?;
    *request.uri_mut() = Uri::try_from(head.path?).ok()?;
    *request.version_mut() = match head.version? {
        0 => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let headers = request.headers_mut();
    for field in head.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        headers.append(name, HeaderValue::from_bytes(field.value).ok()?);
    }
    Some(request)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, head)) = data.split_first() else {
        return;
    };
    let Some(mut request) = parse(head) else {
        return;
    };
    // As the request arrives: the fields its `Connection` names go (never `Host`), and so do names with `_`.
    let hosts_before = request.headers().get_all(header::HOST).iter().count();
    clean_client_fields(request.headers_mut(), &ClientFieldRules::default());
    assert_eq!(
        request.headers().get_all(header::HOST).iter().count(),
        hosts_before,
        "Connection removed Host"
    );
    assert!(
        request.headers().keys().all(|name| !name.as_str().contains('_')),
        "a name with _ survived: {:?}",
        request.headers()
    );
    // The low bits pick the peer; bit 2 asks for tollgate's own `Forwarded` element (`client_ip.forwarded`); bits
    // 3-4 the field believed from trusted proxies (`client_ip.header`).
    let peer = match which % 3 {
        0 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        1 => IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
        _ => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7)),
    };

    // The canonical reading: a refusal is a 400 or a 405; an accepted request has a normalised path that
    // normalising again leaves as it is, and the request the upstream gets reads the same way again.
    let canonical = CanonicalRequest::new(
        request.method(),
        request.version(),
        request.uri(),
        request.headers(),
    );
    let host = match &canonical {
        Err(refusal) => {
            assert!(
                matches!(refusal.status().as_u16(), 400 | 405),
                "{refusal:?}"
            );
            None
        }
        Ok(canonical) => {
            let path = canonical.path.as_ref();
            assert!(path.starts_with('/'), "{:?} -> {path:?}", request.uri());
            assert_eq!(
                normalize(path).as_deref(),
                Some(path),
                "not a fixed point: {:?}",
                request.uri()
            );
            let upstream = forwarded(&request, path, canonical.host_field.as_ref());
            let again = CanonicalRequest::new(
                upstream.method(),
                upstream.version(),
                upstream.uri(),
                upstream.headers(),
            )
            .unwrap_or_else(|refusal| {
                panic!("the forwarded request is refused ({refusal:?}): {upstream:?}")
            });
            assert_eq!(again.path, canonical.path, "{request:?} -> {upstream:?}");
            assert_eq!(again.host, canonical.host, "{request:?} -> {upstream:?}");
            canonical.host.clone()
        }
    };

    // The headers sent upstream: no hop-by-hop field survives, whatever `Connection` names; the client-address
    // fields end with the peer, and from an untrusted peer say nothing else.
    let mut upstream = request.headers().clone();
    let trusted = peer.is_loopback();
    let facts = ForwardedFacts {
        peer,
        peer_trusted: trusted,
        believed: match (which >> 3) % 3 {
            0 => ClientIpHeader::XForwardedFor,
            1 => ClientIpHeader::Forwarded,
            _ => ClientIpHeader::XRealIp,
        },
        host: host.as_deref(),
        host_field: None,
        version: request.version(),
        write_forwarded: which & 4 != 0,
        reads_trailers: false,
        request_id: None,
    };
    prepare_request(&mut upstream, &facts);
    for name in HOP_BY_HOP {
        let trailers = name == "te"
            && upstream.get_all(name).iter().all(|value| value == "trailers")
            && upstream.get_all(name).iter().count() == 1;
        assert!(
            !upstream.contains_key(name) || trailers,
            "{name} forwarded: {upstream:?}"
        );
    }
    assert!(upstream.contains_key(header::VIA), "{upstream:?}");
    let forwarded_for: Vec<_> = upstream.get_all("x-forwarded-for").iter().collect();
    assert_eq!(forwarded_for.len(), 1, "{upstream:?}");
    let forwarded_for = String::from_utf8_lossy(forwarded_for[0].as_bytes());
    let peer_text = peer.to_string();
    assert!(
        forwarded_for.ends_with(&peer_text),
        "X-Forwarded-For {forwarded_for:?} does not end with the peer {peer}"
    );
    // Of the other two client-address fields, only the believed one from a trusted peer reaches the upstream.
    if !(trusted && facts.believed == ClientIpHeader::XRealIp) {
        assert!(!upstream.contains_key("x-real-ip"), "{upstream:?}");
    }
    if !(trusted && facts.believed == ClientIpHeader::Forwarded) {
        let forwarded: Vec<_> = upstream.get_all(header::FORWARDED).iter().collect();
        assert_eq!(
            forwarded.len(),
            usize::from(facts.write_forwarded),
            "{upstream:?}"
        );
    }
    if !trusted {
        assert_eq!(forwarded_for, peer_text);
        assert!(!upstream.contains_key("x-real-ip"), "{upstream:?}");
        let forwarded: Vec<_> = upstream.get_all(header::FORWARDED).iter().collect();
        assert_eq!(
            forwarded.len(),
            usize::from(facts.write_forwarded),
            "{upstream:?}"
        );
    }

    // The whole request path, from routing to the route's answer: never a panic, never a server error (the
    // routes answer themselves and the memory store cannot fail).
    let harness = harness();
    let response = harness.runtime.block_on(harness.gateway.handle(
        request.map(|()| Body::empty()),
        SocketAddr::new(peer, 40_000),
    ));
    assert!(
        !response.status().is_server_error(),
        "{} for {:?}",
        response.status(),
        String::from_utf8_lossy(head)
    );
});
