//! Forged and malformed forwarding fields: client addresses through a front gateway, the host, `X-Forwarded-For`
//! lines, `Connection` stripping what tollgate writes, field names with underscores, the client-IP header.

use crate::common::http_client::client;
use crate::common::start_gateway;
use crate::common::upstream::Upstream;
use crate::{echoed, front_yaml, inner_yaml, send, yaml};

#[tokio::test]
async fn malformed_forwarded_for_from_a_trusted_proxy_falls_back_to_the_last_good_hop() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(
        &upstream.url(),
        "client_ip:\n  trusted_proxies: [127.0.0.1/32]\n",
    ))
    .await;
    let client = client();
    // `garbage` cannot be believed: the client is the hop that wrote it, 127.0.0.1 itself.
    for forged in ["203.0.113.1, garbage", "203.0.113.2, 300.1.1.1", "unknown"] {
        let response = client
            .get(gateway.url("/api"))
            .header("x-forwarded-for", forged)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success() || response.status() == 429);
    }
    // All three shared the 127.0.0.1 bucket of 3.
    let response = client.get(gateway.url("/api")).send().await.unwrap();
    assert_eq!(response.status(), 429);
}

#[tokio::test]
async fn forged_client_addresses_through_a_front_gateway_are_not_believed() {
    let upstream = Upstream::start().await;
    let inner = start_gateway(&inner_yaml(&upstream.url())).await;
    let front = start_gateway(&front_yaml(inner.addr)).await;
    // A new forged address each time: the front must drop it, so the inner keys every request on 127.0.0.1.
    let mut statuses = Vec::new();
    for n in 1..=7 {
        let (status, body) = send(
            front.addr,
            &format!(
                "GET /api/x HTTP/1.1\r\nHost: a\r\nForwarded: for=203.0.113.{n}\r\nX-Real-IP: 203.0.113.{n}\r\nConnection: close\r\n\r\n"
            ),
        )
        .await;
        if status == 200 {
            let headers = &echoed(&body)["headers"];
            assert!(headers.get("forwarded").is_none(), "{headers}");
            assert!(headers.get("x-real-ip").is_none(), "{headers}");
            assert_eq!(
                headers["x-forwarded-for"], "127.0.0.1, 127.0.0.1",
                "{headers}"
            );
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);

    // A forged internal address does not put anyone on the inner allowlist.
    let request =
        "GET /internal HTTP/1.1\r\nHost: a\r\nForwarded: for=10.1.2.3\r\nConnection: close\r\n\r\n";
    assert_eq!(send(front.addr, request).await.0, 200);
    assert_eq!(
        send(front.addr, request).await.0,
        429,
        "allowlisted by a forged Forwarded"
    );
}

#[tokio::test]
async fn the_host_routed_on_is_the_host_forwarded_and_there_is_exactly_one() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    // The absolute-form target names the host: routed as free.example and forwarded as free.example.
    let (status, body) = send(
        gateway.addr,
        "GET http://free.example/v/x HTTP/1.1\r\nHost: limited.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    let headers = &echoed(&body)["headers"];
    assert_eq!(headers["host"], "free.example", "{headers}");
    assert_eq!(headers["x-forwarded-host"], "free.example", "{headers}");

    // limited.example in any spelling takes the host route (limit 1).
    let limited = "GET /v HTTP/1.1\r\nHost: limited.example\r\nConnection: close\r\n\r\n";
    assert_eq!(send(gateway.addr, limited).await.0, 200);
    for spelling in [
        "GET /v HTTP/1.1\r\nHost: LIMITED.example.\r\nConnection: close\r\n\r\n",
        "GET http://limited.example:80/v HTTP/1.1\r\nHost: free.example\r\nConnection: close\r\n\r\n",
    ] {
        assert_eq!(send(gateway.addr, spelling).await.0, 429, "{spelling:?}");
    }

    for (request, why) in [
        ("GET /v HTTP/1.1\r\nHost: free.example\r\nHost: limited.example\r\nConnection: close\r\n\r\n", "two Hosts"),
        ("GET /v HTTP/1.1\r\nConnection: close\r\n\r\n", "no Host"),
        ("GET /v HTTP/1.1\r\nHost: a@limited.example\r\nConnection: close\r\n\r\n", "user info"),
        ("GET /v HTTP/1.1\r\nHost: limited.example:x\r\nConnection: close\r\n\r\n", "bad port"),
        ("GET /v HTTP/1.1\r\nHost: [limited.example]\r\nConnection: close\r\n\r\n", "a name in brackets"),
    ] {
        let (status, body) = send(gateway.addr, request).await;
        assert_eq!(status, 400, "{why}: {body}");
    }
    assert_eq!(upstream.hits(), 2);
}

#[tokio::test]
async fn every_forwarded_for_line_is_one_list_for_keying_and_forwarding() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    // Keyed on the address the whole list ends with (203.0.113.9), which is what the upstream is told, whatever
    // the first line says.
    for first in 1..=5 {
        let request = format!(
            "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.{first}\r\nX-Forwarded-For: 203.0.113.9\r\nConnection: close\r\n\r\n"
        );
        let (status, body) = send(gateway.addr, &request).await;
        assert_eq!(status, 200);
        assert_eq!(
            echoed(&body)["headers"]["x-forwarded-for"],
            format!("198.51.100.{first}, 203.0.113.9, 127.0.0.1")
        );
    }
    let request = "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.77\r\nX-Forwarded-For: 203.0.113.9\r\nConnection: close\r\n\r\n";
    assert_eq!(send(gateway.addr, request).await.0, 429);
}

/// A gateway with API-key consumers in front of `upstream`, with `extra` under `server:`.
fn consumers_yaml(upstream: &str, server: &str) -> String {
    format!(
        r#"server:
  header_read_timeout: 2s
{server}upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  keys:
    - {{ key: pro-key-1, consumer: acme, plan: pro }}
  anonymous: {{ plan: anonymous }}
  forward: {{ consumer: X-Consumer-Id, plan: X-Consumer-Plan }}
  plans:
    anonymous:
      limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 100, period: 1h }}]
    pro:
      limits: [{{ name: hourly, key: consumer, algorithm: sliding_log, limit: 100, period: 1h }}]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    consumers: required
"#
    )
}

#[tokio::test]
async fn connection_cannot_strip_the_fields_tollgate_writes() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&consumers_yaml(&upstream.url(), "")).await;
    let (status, body) = send(
        gateway.addr,
        "GET /api/x HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: pro-key-1\r\nX-Secret: 1\r\nX-Request-Id: client-id\r\n\
         Connection: X-Consumer-Id, X-Consumer-Plan, Host, X-Forwarded-For, X-Forwarded-Host\r\n\
         Connection: X-Forwarded-Proto, Via, X-Request-Id, Forwarded, X-Secret\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let headers = &echoed(&body)["headers"];
    assert_eq!(headers["x-consumer-id"], "acme", "{headers}");
    assert_eq!(headers["x-consumer-plan"], "pro", "{headers}");
    assert_eq!(headers["host"], "a.example", "{headers}");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{headers}");
    assert_eq!(headers["x-forwarded-host"], "a.example", "{headers}");
    assert_eq!(headers["x-forwarded-proto"], "http", "{headers}");
    assert_eq!(headers["via"], "1.1 tollgate", "{headers}");
    // The client's own fields named by Connection are gone: its X-Request-Id is replaced by tollgate's.
    assert!(headers.get("x-secret").is_none(), "{headers}");
    let id = headers["x-request-id"].as_str().expect("an id");
    assert!(id != "client-id" && id.len() == 32, "{headers}");
    assert!(headers.get("connection").is_none(), "{headers}");

    // A credential named by Connection is the client's own field, removed before it is read: the request is
    // anonymous, as the upstream (which never sees the key) would take it.
    let (status, _) = send(
        gateway.addr,
        "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: pro-key-1\r\nConnection: x-api-key, close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn field_names_with_underscores_are_dropped_unless_kept() {
    let upstream = Upstream::start().await;
    let request = "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: pro-key-1\r\nX_Consumer_Id: alice\r\n\
                   X_consumer-plan: free\r\nX_Forwarded_For: 10.9.9.9\r\nx_request_id: forged\r\nX_Custom: 1\r\n\
                   Connection: close\r\n\r\n";
    let dropping = start_gateway(&consumers_yaml(&upstream.url(), "")).await;
    let (status, body) = send(dropping.addr, request).await;
    assert_eq!(status, 200, "{body}");
    let headers = echoed(&body)["headers"].clone();
    let underscored: Vec<&String> = headers
        .as_object()
        .expect("fields")
        .keys()
        .filter(|name| name.contains('_'))
        .collect();
    assert!(underscored.is_empty(), "{headers}");
    assert_eq!(headers["x-consumer-id"], "acme", "{headers}");

    let keeping = start_gateway(&consumers_yaml(
        &upstream.url(),
        "  underscores_in_headers: true\n",
    ))
    .await;
    let (status, body) = send(keeping.addr, request).await;
    assert_eq!(status, 200, "{body}");
    let headers = &echoed(&body)["headers"];
    assert_eq!(headers["x_custom"], "1", "{headers}");
    for protected in [
        "x_consumer_id",
        "x_consumer-plan",
        "x_forwarded_for",
        "x_request_id",
    ] {
        assert!(headers.get(protected).is_none(), "{protected}: {headers}");
    }
    assert_eq!(headers["x-consumer-id"], "acme", "{headers}");
}

#[tokio::test]
async fn only_the_client_ip_header_is_believed_so_a_spoofed_field_neither_allowlists_nor_skips_credentials(
) {
    let upstream = Upstream::start().await;
    let fields = [
        ("x-forwarded-for", "X-Forwarded-For: 10.1.2.3"),
        ("forwarded", "Forwarded: for=\"10.1.2.3\""),
        ("x-real-ip", "X-Real-IP: 10.1.2.3"),
    ];
    for (believed, _) in fields {
        let yaml = format!(
            "client_ip:\n  trusted_proxies: [127.0.0.1/32]\n  header: {believed}\n{}",
            consumers_yaml(&upstream.url(), "")
        )
        .replace(
            "    consumers: required\n",
            "    consumers: required\n    allow: [10.0.0.0/8]\n",
        );
        let gateway = start_gateway(&yaml).await;
        for (field, line) in fields {
            let request =
                format!("GET /api/x HTTP/1.1\r\nHost: a\r\n{line}\r\nConnection: close\r\n\r\n");
            let (status, body) = send(gateway.addr, &request).await;
            if field == believed {
                // The proxy's own field: allowlisted, so no credential is asked for.
                assert_eq!(status, 200, "{believed}: {field}: {body}");
                let headers = &echoed(&body)["headers"];
                assert_eq!(
                    headers["x-forwarded-for"], "10.1.2.3, 127.0.0.1",
                    "{headers}"
                );
                for (other, _) in fields {
                    if other != believed && other != "x-forwarded-for" {
                        assert!(headers.get(other).is_none(), "{believed}: {headers}");
                    }
                }
            } else {
                assert_eq!(status, 401, "{believed}: a spoofed {field} was believed");
            }
        }
    }
}
