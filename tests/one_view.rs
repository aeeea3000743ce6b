//! One view of the request, as a property: for generated requests written every way a client can write them
//! (case, percent-encoding of every kind of character, UTF-8 and invalid UTF-8, dot segments, `;` parameters,
//! trailing slashes, backslashes, query separators and parameter-name spellings, duplicate and absent headers,
//! field names with `_`, `Connection` naming any field, absolute form, chains of proxies), the request the upstream
//! receives, read back by tollgate's own routing and key extraction, gives the same route, the same keys and the
//! same allowlist verdict as the request that was sent, the upstream is told (`X-Consumer-Id`, `X-Consumer-Plan`)
//! the consumer and plan tollgate counted, whatever spelling of the credential or forged copy of those fields came;
//! and a request the gateway refuses is refused with the status its reading names.

mod common;

use std::net::SocketAddr;

use common::http_client::raw;
use common::upstream::Upstream;
use common::{start_gateway, TestGateway};
use http::{HeaderName, HeaderValue, Method, Request, Uri, Version};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Routes of every kind a limit can be evaded on, each limit high enough that nothing is refused for volume; the
/// `everything` limit keys on every part there is.
/// Consumers by an API key in a header or the query; each plan's limit is named after the plan, so that a store key
/// says which plan (and, keyed by consumer, which consumer) a request was counted against.
fn yaml(upstream: &str, trusted: &str, forwarded: bool) -> String {
    format!(
        r#"client_ip:
  trusted_proxies: [{trusted}]
  forwarded: {forwarded}
consumers:
  identify:
    - api_key: {{ header: x-client-key }}
    - api_key: {{ query: api_key }}
  keys:
    - {{ key: alice-key, consumer: alice, plan: pro }}
    - {{ key: bob-key, consumer: bob, plan: free }}
  anonymous: {{ plan: anonymous }}
  forward: {{ consumer: X-Consumer-Id, plan: X-Consumer-Plan }}
  plans:
    anonymous: {{ limits: [{{ name: anonymous-hourly, key: ip, algorithm: sliding_window, limit: 1000000, period: 1h }}] }}
    free: {{ limits: [{{ name: free-hourly, key: consumer, algorithm: sliding_window, limit: 1000000, period: 1h }}] }}
    pro: {{ limits: [{{ name: pro-hourly, key: consumer, algorithm: sliding_window, limit: 1000000, period: 1h }}] }}
upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: login
    match: {{ path: /login, methods: [POST] }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_window, limit: 1000000, period: 1h }}]
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits:
      - {{ name: per-ip, key: ip, algorithm: sliding_window, limit: 1000000, period: 1h }}
      - name: everything
        key: [ip, route, method, path, host, "header:x-api-key", "query:tenant"]
        missing: skip
        algorithm: sliding_window
        limit: 1000000
        period: 1h
  - name: shouty
    match: {{ path_prefix: /shout, case_insensitive: true }}
    upstream: backend
    limits: [{{ name: per-path, key: [path], algorithm: sliding_window, limit: 1000000, period: 1h }}]
  - name: internal
    match: {{ path_prefix: /internal }}
    upstream: backend
    allow: [10.0.0.0/8, "2001:db8:a::/48"]
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_window, limit: 1000000, period: 1h }}]
  - name: keyed
    match: {{ path_prefix: /keyed }}
    upstream: backend
    limits: [{{ name: per-key, key: ["header:x-api-key"], algorithm: sliding_window, limit: 1000000, period: 1h }}]
  - name: limited-host
    match: {{ host: limited.example }}
    upstream: backend
    limits: [{{ name: per-host, key: [host, ip], algorithm: sliding_window, limit: 1000000, period: 1h }}]
  - name: catch-all
    match: {{ path_prefix: / }}
    upstream: backend
"#
    )
}

/// One generated request, as the client writes it.
#[derive(Debug, Clone)]
struct Written {
    method: &'static str,
    version: &'static str,
    authority: Option<&'static str>,
    path: String,
    query: Vec<&'static str>,
    headers: Vec<(&'static str, String)>,
    /// Which gateway it is sent to: the one trusting loopback as a proxy, or one of the two trusting nobody
    /// (without and with `client_ip.forwarded`).
    through: usize,
}

impl Written {
    fn target(&self) -> String {
        let mut target = String::new();
        if let Some(authority) = self.authority {
            target.push_str("http://");
            target.push_str(authority);
        }
        target.push_str(&self.path);
        if !self.query.is_empty() {
            target.push('?');
            target.push_str(&self.query.join("&"));
        }
        target
    }

    fn bytes(&self) -> String {
        let mut text = format!(
            "{} {} HTTP/{}\r\n",
            self.method,
            self.target(),
            self.version
        );
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        if self.method.eq_ignore_ascii_case("POST") {
            text.push_str("Content-Length: 0\r\n");
        }
        text.push_str("Connection: close\r\n\r\n");
        text
    }

    /// The same request as an `http::Request`, as the server hands it over.
    fn request(&self) -> Request<()> {
        let version = if self.version == "1.0" {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        let mut request = Request::builder()
            .method(Method::from_bytes(self.method.as_bytes()).expect("token"))
            .uri(self.target().parse::<Uri>().expect("target"))
            .version(version)
            .body(())
            .expect("request");
        for (name, value) in &self.headers {
            request.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        request
    }
}

fn segment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "api",
        "API",
        "%61pi",
        "%41PI",
        "login",
        "internal",
        "keyed",
        "shout",
        "SHOUT",
        "x",
        "%7Ex",
        "%2F",
        "%2f",
        ".",
        "..",
        "%2e",
        "%2E%2e",
        "",
        "v1",
        // Escapes of every kind of reserved character, UTF-8 and not, parameters, backslashes.
        "items%3Apurge",
        "items:purge",
        "%21%24%26%27%28%29%2A%2B%2C%3B%3D%40",
        "%3F%23%5B%5D",
        "a|b",
        "%7c",
        "caf\u{e9}",
        "caf%C3%A9",
        "caf%c3%a9",
        "%C3",
        "caf%E9",
        "%ED%A0%80",
        "LOGIN",
        "login;jsessionid=1",
        "..;",
        "..;x",
        "x;y",
        "%5C",
        "a\\b",
        "%00",
        "%25",
    ])
}

fn address() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "203.0.113.9",
        "198.51.100.7",
        "10.1.2.3",
        "127.0.0.1",
        "2001:db8:1:2::1",
        "2001:db8:1:2::99",
        "2001:db8:a::5",
        "[2001:db8:1:3::1]:443",
    ])
}

fn written() -> impl Strategy<Value = Written> {
    let host = prop::sample::select(vec![
        "limited.example",
        "LIMITED.example.",
        "limited.example:8080",
        "free.example",
        "Free.Example",
        "127.0.0.1",
    ]);
    let forwarded_for = || prop::collection::vec(address(), 1..3).prop_map(|hops| hops.join(", "));
    (
        prop::sample::select(vec!["GET", "POST", "DELETE", "post", "Get"]),
        prop::sample::select(vec!["1.1", "1.1", "1.1", "1.0"]),
        prop::option::weighted(
            0.2,
            prop::sample::select(vec!["limited.example", "free.example:81"]),
        ),
        prop::collection::vec(segment(), 0..5),
        any::<bool>(),
        prop::collection::vec(
            prop::sample::select(vec![
                "tenant=a",
                "tenant=b",
                "page=2",
                "Tenant=c",
                "x=1;tenant=a",
                "TENANT=b",
                "tenant[]=a",
                "%74enant=b",
                "tenant%5B%5D=c",
                // The consumers' query credential, under every spelling of its name.
                "api_key=bob-key",
                "API_KEY=alice-key",
                "api_key[]=bob-key",
                "%61pi_key=alice-key",
                "x=1;api_key=bob-key",
            ]),
            0..3,
        ),
        prop::collection::vec(host, 0..3),
        prop::collection::vec(forwarded_for(), 0..3),
        prop::option::weighted(
            0.3,
            forwarded_for().prop_map(|hops| {
                hops.split(", ")
                    .map(|hop| format!("for=\"{hop}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
        ),
        prop::option::weighted(0.2, address()),
        prop::collection::vec(prop::sample::select(vec!["k1", "k2", " k1 "]), 0..3),
        (
            0..3usize,
            // Fields a client adds to step around: names with `_`, and `Connection` naming any field.
            prop::collection::vec(
                prop::sample::select(vec![
                    ("X_Api_Key", "k9"),
                    ("X_Forwarded_For", "10.9.9.9"),
                    ("X_Real_IP", "10.9.9.9"),
                    ("Connection", "X-Api-Key"),
                    ("Connection", "Host"),
                    ("Connection", "X-Forwarded-For, Forwarded"),
                    ("Connection", "X-Forwarded-Host, Via, X-Request-Id"),
                    ("Connection", "keep-alive, x-real-ip"),
                    // Forged consumer fields, in every spelling, and a Connection naming the real ones.
                    ("X-Consumer-Id", "mallory"),
                    ("x-consumer-id", "alice"),
                    ("X_Consumer_Id", "mallory"),
                    ("X-Consumer-Plan", "pro"),
                    ("X_Consumer_Plan", "enterprise"),
                    ("Connection", "X-Consumer-Id, X-Consumer-Plan"),
                ]),
                0..3,
            ),
            // The consumers' header credential, spelled any way, sometimes twice.
            prop::collection::vec(
                prop::sample::select(vec![
                    ("X-Client-Key", "alice-key"),
                    ("x-client-key", "bob-key"),
                    ("X-CLIENT-KEY", " alice-key "),
                    ("X_Client_Key", "bob-key"),
                ]),
                0..3,
            ),
        ),
    )
        .prop_map(
            |(
                method,
                version,
                authority,
                segments,
                trailing,
                query,
                hosts,
                xff,
                forwarded,
                real_ip,
                keys,
                (through, extra, credentials),
            )| {
                let mut path: String = segments.iter().map(|s| format!("/{s}")).collect();
                if path.is_empty() || trailing {
                    path.push('/');
                }
                let mut headers: Vec<(&'static str, String)> = Vec::new();
                headers.extend(hosts.into_iter().map(|h| ("Host", h.to_owned())));
                headers.extend(xff.into_iter().map(|v| ("X-Forwarded-For", v)));
                headers.extend(forwarded.map(|v| ("Forwarded", v)));
                headers.extend(real_ip.map(|v| ("X-Real-IP", v.to_owned())));
                headers.extend(keys.into_iter().map(|k| ("X-Api-Key", k.to_owned())));
                headers.extend(
                    extra
                        .into_iter()
                        .chain(credentials)
                        .map(|(name, value)| (name, value.to_owned())),
                );
                Written {
                    method,
                    version,
                    authority,
                    path,
                    query,
                    headers,
                    through,
                }
            },
        )
}

/// The request the upstream echoed, rebuilt as the next hop would receive it.
fn received(echo: &serde_json::Value) -> Request<()> {
    let mut target = echo["path"].as_str().expect("path").to_owned();
    if let Some(query) = echo["query"].as_str() {
        target.push('?');
        target.push_str(query);
    }
    let mut request = Request::builder()
        .method(echo["method"].as_str().expect("method"))
        .uri(target)
        .version(Version::HTTP_11)
        .body(())
        .expect("request");
    for (name, value) in echo["headers"].as_object().expect("headers") {
        for line in value.as_str().expect("text").split('\n') {
            request.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(line).expect("value"),
            );
        }
    }
    request
}

/// The plan and consumer a request read as `view` is counted against, from its plan limit's store key
/// (`tollgate:consumer:<plan>-hourly:{<value>}`, the value the consumer id when the limit is keyed by consumer);
/// none for a request counted against no plan (allowlisted).
fn counted_caller(view: &tollgate::gateway::RequestView) -> (Option<String>, Option<String>) {
    let Some(key) = view
        .keys
        .iter()
        .find_map(|key| key.strip_prefix("tollgate:consumer:"))
    else {
        return (None, None);
    };
    let (limit, value) = key.split_once(":{").expect("a plan key");
    let plan = limit
        .strip_suffix("-hourly")
        .expect("a plan limit")
        .to_owned();
    let consumer = (plan != "anonymous").then(|| value.trim_end_matches('}').to_owned());
    (consumer, Some(plan))
}

/// Sends `written` and checks the property for it.
async fn check(
    written: &Written,
    gateways: &[TestGateway; 3],
    next_hop: &TestGateway,
) -> Result<(), TestCaseError> {
    // An HTTP/1.0 request that names no host at all reaches the upstream with the target's own authority as
    // `Host` (HTTP/1.1 requires one): a host the gateway never routed on, by design, so out of this property.
    let names_a_host =
        written.authority.is_some() || written.headers.iter().any(|(name, _)| *name == "Host");
    prop_assume!(names_a_host || written.version == "1.1");
    let gateway = &gateways[written.through];
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("peer");
    let sent_view = gateway.gateway.view(&written.request(), peer);
    let response = raw(gateway.addr, written.bytes().as_bytes()).await;
    let status: u16 = response
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| TestCaseError::fail(format!("no status line: {response:?}")))?;
    let sent_view = match sent_view {
        Err(refusal) => {
            prop_assert_eq!(
                status,
                refusal.status().as_u16(),
                "{:?} refused as {:?}",
                written,
                refusal
            );
            return Ok(());
        }
        Ok(view) => view,
    };
    prop_assert_eq!(
        status,
        200,
        "{:?} read as {:?} but answered {}",
        written,
        sent_view,
        response
    );
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let echo: serde_json::Value =
        serde_json::from_str(body).map_err(|e| TestCaseError::fail(format!("{e}: {body}")))?;
    // The consumer and plan the upstream is told are those counted: one field line each, never the client's own.
    let (consumer, plan) = counted_caller(&sent_view);
    let told = |name: &str| echo["headers"][name].as_str().map(str::to_owned);
    prop_assert_eq!(
        (told("x-consumer-id"), told("x-consumer-plan")),
        (consumer, plan),
        "{:?} read as {:?} was forwarded with {}",
        written,
        sent_view,
        &echo["headers"]
    );
    // The next hop is another tollgate with the same routes, trusting the gateway (on loopback) as a proxy.
    let forwarded = received(&echo);
    let received_view = next_hop.gateway.view(&forwarded, peer).map_err(|refusal| {
        TestCaseError::fail(format!(
            "{written:?}: forwarded as {forwarded:?}, refused: {refusal}"
        ))
    })?;
    prop_assert_eq!(
        &received_view,
        &sent_view,
        "{:?} was forwarded as {:?}",
        written,
        forwarded
    );
    Ok(())
}

#[test]
fn the_forwarded_request_reads_as_the_request_sent() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (_upstream, gateways, next_hop) = runtime.block_on(async {
        let upstream = Upstream::start().await;
        let gateways = [
            start_gateway(&yaml(&upstream.url(), "127.0.0.1/32", false)).await,
            start_gateway(&yaml(&upstream.url(), "", false)).await,
            start_gateway(&yaml(&upstream.url(), "", true)).await,
        ];
        let next_hop = start_gateway(&yaml(&upstream.url(), "127.0.0.1/32", false)).await;
        (upstream, gateways, next_hop)
    });
    let mut runner = TestRunner::new(Config {
        cases: 400,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&written(), |written| {
            runtime.block_on(check(&written, &gateways, &next_hop))
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
}
