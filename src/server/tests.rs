//! The server alone, with a handler of its own: it knows nothing of the gateway, and hands each request to the
//! handler it is given, a head over the limit without the handler.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::{serve, Handler, Settings, Shutdown};

/// Answers with the peer it was handed, or 431 when handed no handler; `served-by` says which side of the server
/// read the request (`direct` for a plain one, `hyper` for any other). `/slow` waits, and counts in `CANCELLED`
/// when its future is dropped before it answers.
#[derive(Debug, Clone)]
struct Echo;

/// The `/slow` answers dropped before they were made.
static CANCELLED: AtomicUsize = AtomicUsize::new(0);

/// Counts a drop that came before the answer.
struct Cancelled(bool);

impl Drop for Cancelled {
    fn drop(&mut self) {
        if !self.0 {
            CANCELLED.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Echo {
    async fn answer(
        handler: Option<Self>,
        path: &str,
        peer: SocketAddr,
        served_by: &'static str,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        if path == "/slow" {
            let mut guard = Cancelled(false);
            tokio::time::sleep(Duration::from_secs(2)).await;
            guard.0 = true;
        }
        let mut response = Response::new(Full::new(Bytes::from(peer.ip().to_string())));
        response
            .headers_mut()
            .insert("served-by", HeaderValue::from_static(served_by));
        if handler.is_none() {
            *response.status_mut() = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
        }
        Ok(response)
    }
}

impl Handler for Echo {
    type Body = Full<Bytes>;
    async fn handle(
        handler: Option<Self>,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        Self::answer(handler, request.uri().path(), peer, "hyper").await
    }

    /// Also writes a head line that says the request's path, whether `lines` came empty and whether it came in an
    /// allocation already made (the connection's last answer's).
    async fn handle_whole(
        handler: Self,
        request: Request<Bytes>,
        peer: SocketAddr,
        mut lines: Vec<u8>,
    ) -> Result<(Response<Full<Bytes>>, Vec<u8>), Infallible> {
        let came = match (lines.is_empty(), lines.capacity() > 0) {
            (false, _) => "not empty",
            (true, false) => "empty, new",
            (true, true) => "empty, reused",
        };
        let (path, body) = (request.uri().path(), request.body().len());
        lines.extend_from_slice(format!("x-line: {path} {came}, body {body}\r\n").as_bytes());
        let response = Self::answer(Some(handler), path, peer, "direct").await?;
        Ok((response, lines))
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
    let (address, close, served) = start_echo();

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

/// Starts the server with `Echo` on a free port (heads of at most 1,024 bytes): its address, the sender that stops
/// it, and its task.
fn start_echo() -> (
    SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), super::ServeError>>,
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let address = listener.local_addr().expect("address");
    let settings = Settings {
        header_read_timeout: Duration::from_secs(5),
        keepalive_timeout: Duration::from_secs(5),
        max_header_bytes: 1024,
        shutdown_grace: Duration::from_secs(5),
    };
    let (close, closed) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        let listener = TcpListener::from_std(listener).expect("listener");
        let shutdown = Shutdown::default();
        serve(listener, Echo, &settings, &shutdown, async {
            let _ = closed.await;
        })
        .await
    });
    (address, close, served)
}

/// Writes `requests` (two of them) on `stream` and reads their two answers.
async fn send(stream: &mut TcpStream, requests: &str) -> String {
    stream.write_all(requests.as_bytes()).await.expect("write");
    read_answers(stream, 2).await
}

/// Reads answers from `stream` until `count` of them have come whole (each ends with the peer's address).
async fn read_answers(stream: &mut TcpStream, count: usize) -> String {
    let mut answers = String::new();
    let mut buffer = [0u8; 4096];
    while answers.matches("127.0.0.1").count() < count {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
            .await
            .expect("answered within 5 s")
            .expect("read");
        assert!(read > 0, "closed after: {answers}");
        answers.push_str(std::str::from_utf8(&buffer[..read]).expect("text"));
    }
    answers
}

#[tokio::test]
async fn plain_requests_are_answered_directly_and_any_other_by_hyper_on_the_same_connection() {
    let (address, _close, _served) = start_echo();
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let times = |text: &str, line: &str| text.matches(line).count();
    // Two plain requests sent at once: both answered directly, in order, framed by their length.
    let answers = send(
        &mut stream,
        "GET /a HTTP/1.1\r\nhost: a\r\n\r\nDELETE /b HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(times(&answers, "served-by: direct\r\n"), 2, "{answers}");
    // The handler's head lines go into each head, each answer's into the last one's allocation, emptied.
    let lines = [
        "x-line: /a empty, new, body 0\r\n",
        "x-line: /b empty, reused, body 0\r\n",
    ];
    for line in lines {
        assert_eq!(times(&answers, line), 1, "{answers}");
    }
    assert_eq!(times(&answers, "content-length: 9\r\n"), 2, "{answers}");
    assert_eq!(times(&answers, "\r\ndate: "), 2, "{answers}");

    // A body of declared length that came whole with its head: read here, and given to the handler.
    let answers = send(
        &mut stream,
        "POST /c HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\nabcGET /d HTTP/1.1\r\nhost: a\r\n\r\n",
    )
    .await;
    assert_eq!(times(&answers, "served-by: direct\r\n"), 2, "{answers}");
    let line = "x-line: /c empty, reused, body 3\r\n";
    assert_eq!(times(&answers, line), 1, "{answers}");

    // A chunked body, then a plain request behind it: hyper takes the connection from the body's head on.
    let answers = send(
        &mut stream,
        "POST /e HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
         GET /f HTTP/1.1\r\nhost: a\r\n\r\n",
    )
    .await;
    assert_eq!(times(&answers, "served-by: hyper\r\n"), 2, "{answers}");

    // A body still on its way when its head is read: hyper reads it as it comes.
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(b"POST /g HTTP/1.1\r\nhost: a\r\ncontent-length: 6\r\n\r\nabc")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.write_all(b"def").await.expect("write");
    let answer = read_answers(&mut stream, 1).await;
    assert_eq!(times(&answer, "served-by: hyper\r\n"), 1, "{answer}");

    // Each kind of request that is not plain goes to hyper, on a connection of its own.
    for head in [
        "GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
        "HEAD / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
        "PUT / HTTP/1.1\r\nhost: a\r\nexpect: 100-continue\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    ] {
        let answer = exchange(address, head).await;
        assert!(answer.contains("served-by: hyper\r\n"), "{head:?}: {answer}");
    }
}

#[tokio::test]
async fn a_client_that_leaves_while_its_plain_request_is_answered_cancels_it() {
    let (address, _close, _served) = start_echo();
    let before = CANCELLED.load(Ordering::SeqCst);
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(stream);
    let cancelled = async {
        while CANCELLED.load(Ordering::SeqCst) == before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(1), cancelled)
        .await
        .expect("the answer's future was dropped well before it would have finished");
}
