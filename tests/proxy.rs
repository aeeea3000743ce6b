//! Proxying end to end: what reaches the upstream, what comes back, and the gateway's own error answers.

mod common;

use common::http_client::{client, raw};
use common::raw_upstream::{Answer, RawUpstream};
use common::upstream::Upstream;
use common::{start_gateway, ReservedPort};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn yaml(targets: &[String], upstream_timeout: &str) -> String {
    let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    format!(
        r#"listen: 127.0.0.1:0
store:
  backend: memory
upstreams:
  backend:
    targets: [{}]
    timeout: {upstream_timeout}
routes:
  - name: demo
    match: {{ path_prefix: /demo }}
    respond: {{ status: 200, body: "hello from tollgate\n" }}
  - name: api
    match: {{ path_prefix: /api, methods: [GET, POST] }}
    upstream: backend
"#,
        targets.join(", ")
    )
}

async fn json(response: reqwest::Response) -> Value {
    serde_json::from_str(&response.text().await.expect("body")).expect("json body")
}

#[tokio::test]
async fn forwards_method_path_query_body_and_forwarding_headers() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let response = client()
        .post(gateway.url("/api/items/../orders?limit=3&x=%20y"))
        .header("host", "shop.example.test")
        .header("connection", "x-secret")
        .header("x-secret", "hop-by-hop")
        .header("x-custom", "kept")
        .body("order-body")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["via"], "1.1 tollgate");
    let echo = json(response).await;
    assert_eq!(echo["method"], "POST");
    assert_eq!(
        echo["path"], "/api/orders",
        "dot segments resolved before forwarding"
    );
    assert_eq!(echo["query"], "limit=3&x=%20y");
    assert_eq!(echo["body"], "order-body");
    let headers = &echo["headers"];
    assert_eq!(headers["host"], "shop.example.test", "Host is preserved");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-forwarded-host"], "shop.example.test");
    assert_eq!(headers["via"], "1.1 tollgate");
    assert_eq!(headers["x-custom"], "kept");
    assert!(
        headers.get("x-secret").is_none(),
        "fields named by Connection are hop-by-hop"
    );
}

#[tokio::test]
async fn trailers_reach_a_client_that_takes_them() {
    // hyper's server sends trailers over HTTP/1.1 only to a request with `TE: trailers`, as announced by `Trailer`.
    let upstream = common::llm_upstream::LlmUpstream::start().await;
    let gateway = start_gateway(
        &yaml(&[upstream.url()], "5s").replace("path_prefix: /api", "path_prefix: /"),
    )
    .await;
    let request = |te: &str| {
        format!("POST /trailer HTTP/1.1\r\nhost: x\r\n{te}x-test-input: 2\r\nx-test-output: 3\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    };
    let taken = raw(gateway.addr, request("te: trailers\r\n").as_bytes()).await;
    assert!(
        taken
            .to_ascii_lowercase()
            .ends_with("\r\n0\r\nx-tokens: 5\r\n\r\n"),
        "{taken}"
    );
    let not_taken = raw(gateway.addr, request("").as_bytes()).await;
    assert!(not_taken.ends_with("\r\n0\r\n\r\n"), "{not_taken}");
}

#[tokio::test]
async fn forwarded_host_fields_keep_the_port_the_client_asked_for() {
    let upstream = Upstream::start().await;
    let yaml =
        yaml(&[upstream.url()], "5s").replace("routes:", "client_ip:\n  forwarded: true\nroutes:");
    let gateway = start_gateway(&yaml).await;
    let response = client()
        .get(gateway.url("/api/x"))
        .header("host", "shop.example.test:8443")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let echo = json(response).await;
    let headers = &echo["headers"];
    assert_eq!(
        headers["x-forwarded-host"], "shop.example.test:8443",
        "{headers}"
    );
    let forwarded = headers["forwarded"].as_str().unwrap_or("");
    assert!(
        forwarded.ends_with(";host=\"shop.example.test:8443\""),
        "{forwarded}"
    );
}

#[tokio::test]
async fn an_upstream_that_does_not_pass_the_host_header_gets_its_own_host() {
    let first = Upstream::start().await;
    let second = Upstream::start().await;
    let yaml = yaml(&[first.url(), format!("{}/v2", second.url())], "5s").replace(
        "    timeout: 5s\n",
        "    timeout: 5s\n    pass_host_header: false\n",
    );
    assert!(yaml.contains("pass_host_header: false"), "{yaml}");
    let gateway = start_gateway(&yaml).await;
    let client = client();
    let mut hosts = Vec::new();
    for _ in 0..2 {
        let response = client
            .get(gateway.url("/api/x"))
            .header("host", "shop.example.test")
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200);
        let echo = json(response).await;
        // The requested host still reaches the upstream, as X-Forwarded-Host.
        assert_eq!(echo["headers"]["x-forwarded-host"], "shop.example.test");
        hosts.push(echo["headers"]["host"].as_str().expect("host").to_owned());
    }
    hosts.sort();
    let mut expected = vec![first.addr.to_string(), second.addr.to_string()];
    expected.sort();
    assert_eq!(hosts, expected, "each target's own host and port");
}

#[tokio::test]
async fn round_robin_over_targets() {
    let first = Upstream::start().await;
    let second = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[first.url(), second.url()], "5s")).await;
    let client = client();
    for _ in 0..10 {
        assert_eq!(
            client
                .get(gateway.url("/api"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    assert_eq!((first.hits(), second.hits()), (5, 5));
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_reused() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let client = client();
    for i in 0..20 {
        let request = if i % 2 == 0 {
            client.get(gateway.url("/api/items"))
        } else {
            client.post(gateway.url("/api/items")).body("a body")
        };
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap();
    }
    assert_eq!(upstream.hits(), 20);
    assert_eq!(
        upstream.connections(),
        1,
        "one after another, the requests share one upstream connection"
    );
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_the_gateway_keeps_serving() {
    // Held but not listening: connections are refused, and nothing else can listen there meanwhile.
    let reserved = ReservedPort::new();
    let dead = format!("http://{}", reserved.addr());
    let gateway = start_gateway(&yaml(&[dead], "5s")).await;
    let client = client();
    for _ in 0..3 {
        let response = client.get(gateway.url("/api/x")).send().await.unwrap();
        assert_eq!(response.status(), 502);
        assert_eq!(response.headers()["content-type"], "application/json");
        let body = json(response).await;
        assert_eq!(body["error"], "upstream_unreachable");
        assert_eq!(body["route"], "api");
    }
    let demo = client.get(gateway.url("/demo")).send().await.unwrap();
    assert_eq!(demo.status(), 200);
    assert_eq!(demo.text().await.unwrap(), "hello from tollgate\n");
}

#[tokio::test]
async fn slow_upstream_is_504() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "300ms")).await;
    let response = client().get(gateway.url("/api/slow")).send().await.unwrap();
    assert_eq!(response.status(), 504);
    assert_eq!(json(response).await["error"], "upstream_timeout");
}

#[tokio::test]
async fn among_many_routes_the_first_that_matches_answers() {
    // Enough routes for the gateway to find them through its index: hosts, exact paths and prefixes mixed, a
    // catch-all last, and an early route that shadows a later one.
    let mut yaml = String::from("store:\n  backend: memory\nroutes:\n");
    let mut route = |name: &str, condition: &str| {
        yaml.push_str(&format!(
            "  - name: {name}\n    match: {{ {condition} }}\n    respond: {{ status: 200, body: \"{name}\" }}\n"
        ));
    };
    for i in 0..50 {
        route(&format!("prefix-{i}"), &format!("path_prefix: /p{i}"));
    }
    route("shadowing", "path_prefix: /shadow");
    route("shadowed", "path: /shadow/x");
    route("login", "path: /login");
    route("by-host", "host: \"*.example.com\", path_prefix: /h");
    route("everything", "path_prefix: /");
    let gateway = start_gateway(&yaml).await;
    let client = client();
    for (host, path, expected) in [
        (None, "/p49/x", "prefix-49"),
        (None, "/p4", "prefix-4"),
        (None, "/p499", "everything"),
        (None, "/shadow/x", "shadowing"),
        (None, "/login", "login"),
        (Some("api.example.com"), "/h/1", "by-host"),
        (Some("example.com"), "/h/1", "everything"),
    ] {
        let mut request = client.get(gateway.url(path));
        if let Some(host) = host {
            request = request.header("host", host);
        }
        let body = request.send().await.unwrap().text().await.unwrap();
        assert_eq!(body, expected, "{host:?} {path}");
    }
}

#[tokio::test]
async fn unknown_paths_and_methods_get_404_json() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let client = client();
    let response = client.get(gateway.url("/nowhere")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    let body = json(response).await;
    assert_eq!(body["error"], "no_route");
    assert_eq!(body["path"], "/nowhere");
    // /api takes GET and POST only; /apiary is not under /api.
    assert_eq!(
        client
            .delete(gateway.url("/api"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        client
            .get(gateway.url("/apiary"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn absolute_form_target_is_never_proxied_elsewhere() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    // Names a host that is not the upstream: tollgate must use only the route's configured target.
    let response = raw(
        gateway.addr,
        b"GET http://elsewhere.invalid/api/latest?x=1 HTTP/1.1\r\nHost: elsewhere.invalid\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"path\":\"/api/latest\""), "{response}");
    assert_eq!(upstream.hits(), 1);
}

#[tokio::test]
async fn request_target_that_is_not_a_path_is_400() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let response = raw(
        gateway.addr,
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
}

#[tokio::test]
async fn h2c_prior_knowledge_is_proxied() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    for _ in 0..2 {
        let response = h2
            .get(gateway.url("/api/items"))
            .send()
            .await
            .expect("request");
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        assert_eq!(response.status(), 200);
        let echo = json(response).await;
        assert_eq!(echo["path"], "/api/items");
    }
    assert_eq!(upstream.hits(), 2);
}

#[tokio::test]
async fn a_request_whose_first_byte_arrives_alone_is_still_http1() {
    // "P" could open the HTTP/2 preface ("PRI * HTTP/2.0..."): the gateway must wait for more before choosing.
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let mut stream = tokio::net::TcpStream::connect(gateway.addr)
        .await
        .expect("connect");
    stream.write_all(b"P").await.expect("write");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stream
        .write_all(
            b"OST /api/x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        )
        .await
        .expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        stream.read_to_end(&mut response),
    )
    .await
    .expect("answered within 5 s")
    .expect("read");
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response:.200}");
    assert!(response.contains(r#""body":"hi""#), "{response}");
    assert_eq!(upstream.hits(), 1);
}

/// Sends `n` GETs to `url` from each of `clients` concurrent clients; returns the statuses that were not 200.
async fn concurrent_gets(url: &str, clients: usize, n: usize) -> Vec<u16> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let url = url.to_owned();
        tasks.spawn(async move {
            let client = client();
            let mut failed = Vec::new();
            for _ in 0..n {
                let status = client.get(&url).send().await.expect("request").status();
                if status != 200 {
                    failed.push(status.as_u16());
                }
            }
            failed
        });
    }
    let mut failed = Vec::new();
    while let Some(done) = tasks.join_next().await {
        failed.extend(done.expect("client task"));
    }
    failed
}

// Several threads, as the binary runs: on one, the connection's task always sees the close before the next request
// takes the connection, and the race never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_closing_after_every_response_without_saying_so_causes_no_502() {
    let upstream = RawUpstream::start(|_, _| Answer::ThenClose).await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let failed = concurrent_gets(&gateway.url("/api/x"), 4, 75).await;
    assert_eq!(failed, Vec::<u16>::new(), "of 300 GETs");
}

#[tokio::test]
async fn a_get_a_reused_connection_closed_under_is_sent_again_once_on_a_new_one() {
    // Each connection answers its first request and closes under the next without a byte of answer.
    let upstream = RawUpstream::start(|_, answered| match answered {
        0 => Answer::KeepOpen,
        _ => Answer::Drop,
    })
    .await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let client = client();
    for i in 0..5 {
        let response = client
            .get(gateway.url("/api/x"))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "GET {i}");
    }
    assert_eq!(
        upstream.received("GET"),
        1 + 2 * 4,
        "every GET after the first went twice"
    );
}

#[tokio::test]
async fn a_request_is_never_sent_a_third_time_nor_a_post_a_second() {
    // Only the first connection answers, and only its first request.
    let upstream = RawUpstream::start(|connection, answered| match (connection, answered) {
        (0, 0) => Answer::KeepOpen,
        _ => Answer::Drop,
    })
    .await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let client = client();
    let url = gateway.url("/api/x");
    assert_eq!(client.get(&url).send().await.expect("GET").status(), 200);
    let again = client.get(&url).send().await.expect("GET");
    assert_eq!(again.status(), 502, "the new connection failed too");
    assert_eq!(upstream.received("GET"), 3, "sent again once, not twice");

    let upstream = RawUpstream::start(|_, answered| match answered {
        0 => Answer::KeepOpen,
        _ => Answer::Drop,
    })
    .await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let url = gateway.url("/api/x");
    assert_eq!(client.get(&url).send().await.expect("GET").status(), 200);
    let post = client.post(&url).body("order").send().await.expect("POST");
    assert_eq!(post.status(), 502, "a POST on a stale connection");
    assert_eq!(upstream.received("POST"), 1, "never sent twice");
}

#[tokio::test]
async fn a_get_that_a_reused_connection_closed_under_goes_again_on_a_new_one() {
    // Each connection answers two requests and closes under the third without a byte of answer.
    fn third_dropped(_: usize, answered: usize) -> Answer {
        match answered {
            0 | 1 => Answer::KeepOpen,
            _ => Answer::Drop,
        }
    }
    let client = client();
    let upstream = RawUpstream::start(third_dropped).await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let url = gateway.url("/api/x");
    for _ in 0..2 {
        assert_eq!(client.get(&url).send().await.expect("GET").status(), 200);
    }
    // Idle past a target's possible idle timeout: the request is ready to go again.
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    assert_eq!(client.get(&url).send().await.expect("GET").status(), 200);
    assert_eq!(upstream.received("GET"), 4);

    let upstream = RawUpstream::start(third_dropped).await;
    let gateway = start_gateway(&yaml(&[upstream.url()], "5s")).await;
    let url = gateway.url("/api/x");
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(
            client
                .get(&url)
                .send()
                .await
                .expect("GET")
                .status()
                .as_u16(),
        );
    }
    // Busy connections too: the third and the fifth go again, each on a new connection (the exchange borrows the
    // request, so no copy has to be made beforehand on the chance of a close).
    assert_eq!(statuses, [200; 6]);
    assert_eq!(upstream.received("GET"), 8, "the third and the fifth twice");
}

#[tokio::test]
async fn an_http_1_0_upstream_is_answered_to_clients_as_http_1_1_on_a_kept_connection() {
    // An upstream that speaks HTTP/1.0: one response per connection, then close.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let _ = stream
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    let gateway = start_gateway(&yaml(&[format!("http://{addr}")], "5s")).await;
    // Two requests on one connection: the proxy speaks its own version to its client (RFC 9110 §6.2), so the
    // upstream's 1.0 neither shows nor ends the client's keep-alive connection.
    let answer = raw(
        gateway.addr,
        b"GET /api/a HTTP/1.1\r\nHost: x\r\n\r\nGET /api/b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 2, "{answer}");
    assert!(!answer.contains("HTTP/1.0"), "{answer}");
    assert!(answer.contains("via: 1.0 tollgate"), "{answer}");
}

#[tokio::test]
async fn health_path_answers_readiness_on_the_main_listener_before_any_route() {
    let upstream = Upstream::start().await;
    let yaml = yaml(&[upstream.url()], "5s").replace(
        "routes:",
        "server:\n  health_path: /lb-health\nroutes:\n  - name: all\n    match: { path_prefix: / }\n    respond: { status: 418 }",
    );
    let gateway = start_gateway(&yaml).await;
    let response = client()
        .get(gateway.url("/lb-health"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let body = json(response).await;
    assert_eq!(body["status"], "ready", "{body}");
    assert_eq!(body["store"], "memory", "{body}");
    // Anything else is routed as before.
    let response = client()
        .get(gateway.url("/lb-health/x"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 418);
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn bodies_over_max_body_bytes_are_413_declared_or_streamed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let yaml =
        yaml(&[upstream.url()], "5s").replace("routes:", "server:\n  max_body_bytes: 10\nroutes:");
    let gateway = start_gateway(&yaml).await;
    let send = |body: &'static str, path: &'static str| {
        let url = gateway.url(path);
        async move { client().post(url).body(body).send().await.expect("request") }
    };
    // Declared: refused before any route or upstream.
    let response = send("12345678901", "/api/x").await;
    assert_eq!(response.status(), 413);
    let body = json(response).await;
    assert_eq!(body["error"], "body_too_large", "{body}");
    assert_eq!(upstream.hits(), 0);
    assert_eq!(send("1234567890", "/api/x").await.status(), 200);
    // Streamed (chunked, no length): cut off as it grows past the limit, on an upstream route and a direct one.
    for path in ["/api/x", "/demo"] {
        let mut stream = tokio::net::TcpStream::connect(gateway.addr)
            .await
            .expect("connect");
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
             8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(answer.contains("body_too_large"), "{path}: {answer}");
    }
}

/// An upstream that answers every request with rate-limit fields and a request id of its own.
async fn upstream_with_its_own_rate_limit_fields() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let Ok(n) = stream.read(&mut buffer).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    read.extend_from_slice(&buffer[..n]);
                    // Each request's head, and the body a POST of this test sends ("abc").
                    while let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&read[..end]).to_lowercase();
                        let body = if head.contains("content-length: 3") {
                            3
                        } else {
                            0
                        };
                        if read.len() < end + 4 + body {
                            break;
                        }
                        read.drain(..end + 4 + body);
                        let answer = "HTTP/1.1 200 OK\r\nX-RateLimit-Limit: 999\r\nx-ratelimit-remaining: 998\r\n\
                                      RateLimit: \"theirs\";r=998;t=1\r\nratelimit-policy: \"theirs\";q=999;w=1\r\n\
                                      X-Request-Id: theirs\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_upstream_s_own_rate_limit_fields_and_request_id_give_way_to_the_gateway_s() {
    let upstream = upstream_with_its_own_rate_limit_fields().await;
    let gateway = start_gateway(&format!(
        r#"listen: 127.0.0.1:0
store:
  backend: memory
upstreams:
  backend:
    targets: ["http://{upstream}"]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits:
      - {{ name: per-ip, key: ip, algorithm: fixed_window, limit: 10, period: 1m }}
"#
    ))
    .await;
    let client = client();
    // A GET (which the server reads and answers itself) and a POST with a body (which hyper serves).
    for (i, request) in [
        client.get(gateway.url("/api/a")),
        client.post(gateway.url("/api/b")).body("abc"),
    ]
    .map(|request| request.header("x-request-id", "client-7"))
    .into_iter()
    .enumerate()
    {
        let response = request.send().await.expect("answered");
        assert_eq!(response.status(), 200);
        let headers = response.headers();
        let all = |name: &str| -> Vec<String> {
            headers
                .get_all(name)
                .iter()
                .map(|value| value.to_str().expect("text").to_owned())
                .collect()
        };
        assert_eq!(all("x-ratelimit-limit"), ["10"], "request {i}");
        assert_eq!(all("x-request-id"), ["client-7"], "request {i}");
        assert_eq!(
            all("x-ratelimit-remaining"),
            [(9 - i).to_string()],
            "request {i}"
        );
        assert_eq!(
            all("ratelimit-policy"),
            ["\"per-ip\";q=10;w=60"],
            "request {i}"
        );
        let rate_limit = all("ratelimit");
        assert_eq!(rate_limit.len(), 1, "request {i}: {rate_limit:?}");
        assert!(
            rate_limit[0].starts_with("\"per-ip\";r="),
            "request {i}: {rate_limit:?}"
        );
        assert_eq!(response.text().await.expect("body"), "ok");
    }
}
