//! Hostile input, one module per what it attacks: the connection's clocks, framing, forwarding fields, paths,
//! keys and the admin API. One test binary; the helpers two modules share are here.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod clocks;
mod forwarding;
mod framing;
mod keys;
mod paths;

use crate::common::http_client::raw;

/// A gateway whose route `/api` on `upstream` admits 3 a minute per client address, with `extra` under `server:`
/// (a 500 ms head timeout, 16 KiB heads).
pub(crate) fn yaml(upstream: &str, extra: &str) -> String {
    format!(
        r#"server:
  header_read_timeout: 500ms
  max_header_bytes: 16384
{extra}upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits:
      - name: per-ip
        key: ip
        algorithm: sliding_log
        limit: 3
        period: 1m
"#
    )
}

// === one view of the request, through two gateways ===
//
// An "inner" gateway trusting 127.0.0.1 as a proxy, with the routes a login-protecting deployment has, and a
// "front" gateway trusting nobody that proxies everything to it. The upstream echoes what it received.

pub(crate) fn inner_yaml(upstream: &str) -> String {
    format!(
        r#"client_ip:
  trusted_proxies: [127.0.0.1/32]
upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: login
    match: {{ path: /login, methods: [POST] }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 2, period: 1m }}]
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 5, period: 1m }}]
  - name: internal
    match: {{ path_prefix: /internal }}
    upstream: backend
    allow: [10.0.0.0/8]
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: keyed
    match: {{ path_prefix: /keyed }}
    upstream: backend
    limits: [{{ name: per-key, key: [header:x-api-key], algorithm: sliding_log, limit: 3, period: 1m }}]
  - name: limited-host
    match: {{ host: limited.example }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: catch-all
    match: {{ path_prefix: / }}
    upstream: backend
"#
    )
}

pub(crate) fn front_yaml(inner: std::net::SocketAddr) -> String {
    format!(
        "upstreams:\n  inner:\n    targets: [\"http://{inner}\"]\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: inner\n"
    )
}

/// Sends one raw request (which must end its head with `Connection: close`) and returns the status and the body.
pub(crate) async fn send(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let response = raw(addr, request.as_bytes()).await;
    let status = response
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned());
    (status, body)
}

/// The echoed request in a 200's body.
pub(crate) fn echoed(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not an echo: {body}"))
}
