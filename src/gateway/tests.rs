//! The work admission keeps for after the answer runs once on every ending of an answer the gateway gives: an
//! upstream's body read to its end, cut by the client, broken by the upstream; an upstream unreachable; a request
//! abandoned before the upstream answered; a direct answer; never for a refusal.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Gateway;
use crate::admission::recording::Endings;
use crate::admission::Ending;
use crate::limiter::{RateLimiter, StoreSettings};

/// An HTTP/1.1 upstream on a free port that answers by path: `/whole` a whole body, `/stream` one chunk then
/// nothing (the connection held), `/broken` 4 of 100 bytes then the connection closed, `/empty` 204, anything else
/// never.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head);
                let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
                let answer: &[u8] = match path.as_str() {
                    "/whole" => b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nwhole",
                    "/stream" => {
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\npart\r\n"
                    }
                    "/broken" => b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart",
                    "/empty" => b"HTTP/1.1 204 No Content\r\n\r\n",
                    _ => b"",
                };
                if socket.write_all(answer).await.is_err() || path == "/broken" {
                    return;
                }
                // Held open until the gateway lets go.
                let _ = socket.read(&mut buffer).await;
            });
        }
    });
    address
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address").port()
}

/// A gateway with a direct route, a route to nowhere and a route to `upstream`, each with a limit of `limit`
/// requests a minute, recording how each admitted answer ends into `endings`.
async fn gateway(upstream: SocketAddr, limit: u64, endings: &Endings) -> Gateway {
    let yaml = format!(
        r#"
upstreams:
  up: {{ targets: ["http://{upstream}"] }}
  gone: {{ targets: ["http://127.0.0.1:{gone}"] }}
routes:
  - name: direct
    match: {{ path: /direct }}
    respond: {{ status: 200, body: "direct" }}
    limits: [ {{ name: per-ip, key: ip, algorithm: fixed_window, limit: {limit}, period: 1m }} ]
  - name: gone
    match: {{ path: /gone }}
    upstream: gone
    limits: [ {{ name: per-ip, key: ip, algorithm: fixed_window, limit: {limit}, period: 1m }} ]
  - name: up
    match: {{ path_prefix: / }}
    upstream: up
    limits: [ {{ name: per-ip, key: ip, algorithm: fixed_window, limit: {limit}, period: 1m }} ]
"#,
        gone = closed_port().await,
    );
    let config = crate::config::parse(&yaml, Path::new("seam.yaml")).expect("config");
    let limiter = Arc::new(RateLimiter::from_settings(&StoreSettings::default()).expect("limiter"));
    let endings = endings.clone();
    Gateway::with_after_answer(&config, limiter, move || endings.work())
}

fn request(path: &str) -> Request<Body> {
    Request::get(path)
        .header("host", "seam.test")
        .body(Body::empty())
        .expect("request")
}

const PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 40000);

#[tokio::test]
async fn the_work_kept_for_after_the_answer_runs_once_on_each_ending_in_the_gateway() {
    let endings = Endings::default();
    let gateway = gateway(upstream().await, 100, &endings).await;

    let response = gateway.handle(request("/whole"), PEER).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(endings.take().is_empty(), "the answer has not ended yet");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&body[..], b"whole");
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);

    let response = gateway.handle(request("/stream"), PEER).await;
    let mut body = response.into_body();
    body.frame().await.expect("a frame").expect("data");
    drop(body);
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Cut)]);

    let response = gateway.handle(request("/broken"), PEER).await;
    assert!(response.into_body().collect().await.is_err());
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Failed)]);

    let response = gateway.handle(request("/gone"), PEER).await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(endings.take(), [(None, Ending::Failed)]);

    let never = gateway.handle(request("/never"), PEER);
    assert!(tokio::time::timeout(Duration::from_millis(100), never)
        .await
        .is_err());
    assert_eq!(endings.take(), [(None, Ending::Cut)]);

    // Answers without a body are whole once the server lets them go, read or not.
    let response = gateway.handle(request("/empty"), PEER).await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    drop(response);
    assert_eq!(
        endings.take(),
        [(Some(StatusCode::NO_CONTENT), Ending::Complete)]
    );

    let response = gateway.handle(request("/direct"), PEER).await;
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&body[..], b"direct");
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);
}

#[tokio::test]
async fn a_refused_request_keeps_nothing_for_after_the_answer_in_the_gateway() {
    let endings = Endings::default();
    let gateway = gateway(upstream().await, 1, &endings).await;
    let admitted = gateway.handle(request("/direct"), PEER).await;
    admitted.into_body().collect().await.expect("body");
    assert_eq!(endings.take(), [(Some(StatusCode::OK), Ending::Complete)]);

    let refused = gateway.handle(request("/direct"), PEER).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    refused.into_body().collect().await.expect("body");
    assert!(endings.take().is_empty(), "a refusal settles nothing");
}
