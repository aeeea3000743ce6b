//! Paths and query keys under every spelling: one path for percent-escapes, trailing slashes and case, escaped
//! slashes, backslashes, NUL and invalid UTF-8 refused, one bucket per query key.

use crate::common::start_gateway;
use crate::common::upstream::Upstream;
use crate::{echoed, inner_yaml, send};

#[tokio::test]
async fn a_percent_encoded_path_is_the_same_path() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    for _ in 0..5 {
        let (status, _) = send(
            gateway.addr,
            "GET /api/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status, 200);
    }
    for spelling in [
        "/%61pi/x",
        "/%61%70%69/x",
        "/API/../api/x",
        "/x/%2e%2e/api/x",
        "//api//x",
    ] {
        let request = format!("GET {spelling} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        assert_eq!(
            send(gateway.addr, &request).await.0,
            429,
            "{spelling} evaded /api"
        );
    }
    // The catch-all forwards the normalised path, never a spelling the upstream would read as another route's.
    let (status, body) = send(
        gateway.addr,
        "GET /%7Efree/%3f/%41 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&body)["path"], "/~free/%3F/A");
    let (status, _) = send(
        gateway.addr,
        "GET /a%zz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 400);
}

fn paths_yaml(upstream: &str, server: &str) -> String {
    format!(
        r#"server:
  header_read_timeout: 2s
{server}upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: login
    match: {{ path: /login, methods: [POST] }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 2, period: 1m }}]
  - name: purge
    match: {{ path: "/v1/items:purge" }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: cafe
    match: {{ path_prefix: "/caf\u00e9" }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: strict
    match: {{ path_prefix: /Strict, case_sensitive: true }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: per-path
    match: {{ path_prefix: /files }}
    upstream: backend
    limits: [{{ name: per-path, key: [path], algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: catch-all
    match: {{ path_prefix: / }}
    upstream: backend
"#
    )
}

async fn get(addr: std::net::SocketAddr, method: &str, target: &str) -> (u16, String) {
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    send(addr, &request).await
}

#[tokio::test]
async fn a_path_matches_with_its_trailing_slash_case_and_parameters_ignored() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&paths_yaml(&upstream.url(), "")).await;
    assert_eq!(get(gateway.addr, "POST", "/login").await.0, 200);
    let (status, body) = get(gateway.addr, "POST", "/login;jsessionid=1").await;
    assert_eq!(status, 200);
    // Forwarded faithfully: the upstream gets the canonical path, parameters and all.
    assert_eq!(echoed(&body)["path"], "/login;jsessionid=1");
    for spelling in [
        "/login/",
        "/LOGIN",
        "/Login;x=1/",
        "/x/..;/login",
        "/x/..;y/login;z",
    ] {
        assert_eq!(
            get(gateway.addr, "POST", spelling).await.0,
            429,
            "{spelling} evaded path: /login"
        );
    }
    // A path key counts every spelling as one path.
    assert_eq!(get(gateway.addr, "GET", "/files/a").await.0, 200);
    for spelling in ["/files/a/", "/FILES/A", "/files/a;v=2", "/files/%61"] {
        assert_eq!(
            get(gateway.addr, "GET", spelling).await.0,
            429,
            "{spelling}"
        );
    }
    // case_sensitive: true opts out of case folding, and only of it.
    assert_eq!(get(gateway.addr, "GET", "/Strict/x").await.0, 200);
    assert_eq!(get(gateway.addr, "GET", "/Strict/x/").await.0, 429);
    let (status, body) = get(gateway.addr, "GET", "/strict/x").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn escapes_and_utf8_are_one_path_and_forwarded_canonical() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&paths_yaml(&upstream.url(), "")).await;
    assert_eq!(get(gateway.addr, "GET", "/v1/items%3Apurge").await.0, 200);
    assert_eq!(get(gateway.addr, "GET", "/v1/items:purge").await.0, 429);
    let (status, body) = get(gateway.addr, "GET", "/caf\u{e9}/./x").await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&body)["path"], "/caf%C3%A9/x");
    for spelling in ["/caf%C3%A9/x", "/caf%c3%a9", "/CAF%C3%A9/y"] {
        assert_eq!(
            get(gateway.addr, "GET", spelling).await.0,
            429,
            "{spelling}"
        );
    }
    // What must stay escaped reaches the upstream escaped, in one spelling.
    let (status, body) = get(gateway.addr, "GET", "/other/a%7cb|c/%21%40").await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&body)["path"], "/other/a%7Cb%7Cc/!@");
}

#[tokio::test]
async fn escaped_slashes_backslashes_nul_and_invalid_utf8_are_refused() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&paths_yaml(&upstream.url(), "")).await;
    for target in [
        "/files/a%2Fb",
        "/files/a%2fb",
        "/files/a%5Cb",
        "/files/a\\b",
        "/files/a%00",
        "/files/caf%E9",
        "/files/%C3%28",
    ] {
        let (status, body) = get(gateway.addr, "GET", target).await;
        assert_eq!(status, 400, "{target}: {body}");
        assert!(body.contains("\"bad_request\""), "{body}");
    }
    assert_eq!(upstream.hits(), 0);

    let keeping = start_gateway(&paths_yaml(&upstream.url(), "  escaped_slashes: keep\n")).await;
    let (status, body) = get(keeping.addr, "GET", "/files/a%2fb").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body)["path"], "/files/a%2Fb");
    assert_eq!(get(keeping.addr, "GET", "/files/a%5Cb").await.0, 400);
}

#[tokio::test]
async fn a_query_key_is_one_bucket_under_every_spelling_and_ambiguous_when_repeated() {
    let upstream = Upstream::start().await;
    let yaml =
        inner_yaml(&upstream.url()).replace("key: [header:x-api-key]", "key: [\"query:tenant\"]");
    let gateway = start_gateway(&yaml).await;
    let at = |query: &str| {
        format!("GET /keyed?{query} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    };
    for _ in 0..3 {
        assert_eq!(send(gateway.addr, &at("tenant=t")).await.0, 200);
    }
    for spelling in [
        "x=1;tenant=t",
        "TENANT=t",
        "tenant[]=t",
        "%74enant=t",
        "Tenant%5B%5D=t",
    ] {
        assert_eq!(
            send(gateway.addr, &at(spelling)).await.0,
            429,
            "{spelling} is a fresh bucket"
        );
    }
    for repeated in [
        "tenant=u&TENANT=v",
        "tenant=u;tenant=v",
        "tenant=u&tenant[]=v",
    ] {
        let (status, body) = send(gateway.addr, &at(repeated)).await;
        assert_eq!(status, 400, "{repeated}: {body}");
        assert!(body.contains("\"ambiguous_key\""), "{body}");
    }
    assert_eq!(upstream.hits(), 3);
}
