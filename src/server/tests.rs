//! The server alone, with a handler of its own: it knows nothing of the gateway, and hands each request to the
//! handler it is given, a head over the limit without the handler.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::{serve, Handler, Settings, Shutdown};

/// Answers with the peer it was handed, or 431 when handed no handler.
#[derive(Debug, Clone)]
struct Echo;

impl Handler for Echo {
    type Body = Full<Bytes>;

    async fn handle(
        handler: Option<Self>,
        _request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let mut response = Response::new(Full::new(Bytes::from(peer.ip().to_string())));
        if handler.is_none() {
            *response.status_mut() = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
        }
        Ok(response)
    }

    async fn handle_bodiless(
        handler: Option<Self>,
        _request: Request<()>,
        peer: SocketAddr,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let mut response = Response::new(Full::new(Bytes::from(peer.ip().to_string())));
        if handler.is_none() {
            *response.status_mut() = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
        }
        Ok(response)
    }
}

/// Sends `request` on a new connection to `address` and reads the answer until the server closes.
async fn exchange(address: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .expect("answered within 5 s")
        .expect("read");
    answer
}

#[tokio::test]
async fn each_request_goes_to_the_handler_and_a_head_over_the_limit_without_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let settings = Settings {
        header_read_timeout: Duration::from_secs(5),
        keepalive_timeout: Duration::from_secs(5),
        max_header_bytes: 1024,
        shutdown_grace: Duration::from_secs(5),
    };
    let (close, closed) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        let shutdown = Shutdown::default();
        serve(listener, Echo, &settings, &shutdown, async {
            let _ = closed.await;
        })
        .await
    });

    let answer = exchange(
        address,
        "GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("127.0.0.1"), "{answer}");

    // Whole in one read, so hyper parses it: the server holds the limit against the parsed head.
    let large = format!(
        "GET / HTTP/1.1\r\nhost: a\r\nx-large: {}\r\nconnection: close\r\n\r\n",
        "a".repeat(1100)
    );
    let answer = exchange(address, &large).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");

    close.send(()).expect("close");
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("drained within 5 s")
        .expect("served")
        .expect("every connection finished");
}
