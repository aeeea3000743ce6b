//! A real upstream HTTP server on a free loopback port that echoes what it received and counts requests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::routing::any;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;

/// A running upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Starts the upstream. a path ending in `/slow` answers after 3 s; every other path echoes the request as JSON:
    /// `{"method", "path", "query", "headers": {name: value}, "body"}`.
    pub async fn start() -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let app = Router::new().fallback(any(echo)).with_state(hits.clone());
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        let listener = listener.tap_io(move |_| {
            accepted.fetch_add(1, Ordering::SeqCst);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            hits,
            connections,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo(State(hits): State<Arc<AtomicUsize>>, request: Request) -> Json<Value> {
    hits.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let request = Request::from_parts(parts, ());
    if request.uri().path().ends_with("/slow") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let mut headers = Map::new();
    for (name, value) in request.headers() {
        headers.insert(
            name.as_str().to_owned(),
            Value::from(String::from_utf8_lossy(value.as_bytes()).into_owned()),
        );
    }
    Json(json!({
        "method": request.method().as_str(),
        "path": request.uri().path(),
        "query": request.uri().query(),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }))
}
