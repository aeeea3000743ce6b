//! An HTTP/1.1 upstream written on raw TCP, for what a well-behaved server never does: closing a keep-alive
//! connection after a response without `Connection: close`, or closing under a request without answering it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the upstream does with one request, told which connection it came on and how many that connection
/// answered before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `200 ok`, and the connection stays open.
    KeepOpen,
    /// `200 ok` without `Connection: close`, then the connection is closed.
    ThenClose,
    /// Close the connection without a byte of answer.
    Drop,
}

/// A running raw upstream.
pub struct RawUpstream {
    pub addr: SocketAddr,
    /// The request line of every request received, in order.
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RawUpstream {
    /// Starts an upstream answering each request as `policy(connection number, requests answered on it)` says
    /// (both from 0).
    pub async fn start(policy: fn(usize, usize) -> Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            let mut connections = 0;
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, connections, policy, seen.clone()));
                connections += 1;
            }
        });
        Self {
            addr,
            requests,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests with this method arrived.
    pub fn received(&self, method: &str) -> usize {
        let prefix = format!("{method} ");
        self.requests
            .lock()
            .expect("requests")
            .iter()
            .filter(|line| line.starts_with(&prefix))
            .count()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut stream: TcpStream,
    connection: usize,
    policy: fn(usize, usize) -> Answer,
    requests: Arc<Mutex<Vec<String>>>,
) {
    let mut pending = Vec::new();
    let mut buffer = [0u8; 4096];
    for answered in 0.. {
        let head_end = loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
            }
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
        pending.drain(..head_end);
        let line = head.lines().next().unwrap_or_default().to_owned();
        requests.lock().expect("requests").push(line);
        let length: usize = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.trim().parse().ok())
            .unwrap_or(0);
        while pending.len() < length {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
            }
        }
        pending.drain(..length);
        let answer = policy(connection, answered);
        if answer == Answer::Drop {
            return;
        }
        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        if stream.write_all(reply).await.is_err() || answer == Answer::ThenClose {
            return;
        }
    }
}
