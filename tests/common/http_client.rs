//! A plain HTTP client for tests, a raw-socket sender for requests no client library would send, and the admin
//! listener's metrics.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A client without proxies or retries, with a short timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(64)
        .build()
        .expect("client")
}

/// The status of a GET of `url` with the API key `key` in `x-api-key`.
pub async fn status_with_key(url: String, key: &str) -> u16 {
    client()
        .get(url)
        .header("x-api-key", key)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

/// Sends `request`: the answer's status, and its body as JSON (`Null` when it is not JSON).
pub async fn json_answer(request: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// Sends raw bytes to `addr` and returns everything read until the server closes or 5 s pass.
pub async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buffer)).await;
    String::from_utf8_lossy(&buffer).into_owned()
}

/// The Prometheus text of the admin listener at `admin` (`http://127.0.0.1:PORT`).
pub async fn metrics_text(admin: &str) -> String {
    client()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}

/// The body of `GET /readyz` on the admin listener at `admin` (empty when it could not be read).
pub async fn readyz_text(admin: &str) -> String {
    let response = client()
        .get(format!("{admin}/readyz"))
        .send()
        .await
        .expect("readyz");
    response.text().await.unwrap_or_default()
}

/// `tollgate_store_evicted_keys_total` as the admin listener at `admin` says it (0 while never incremented).
pub async fn evicted_keys_counted(admin: &str) -> f64 {
    metrics_text(admin)
        .await
        .lines()
        .find(|line| line.starts_with("tollgate_store_evicted_keys_total "))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Reads one HTTP/1.1 answer from `stream`: its head and the body its `content-length` announces, without waiting
/// for the connection to close (or what came before it closed).
pub async fn read_answer<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                break;
            }
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => answer.extend_from_slice(&buffer[..read]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}
