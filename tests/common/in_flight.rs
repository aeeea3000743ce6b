//! An upstream that counts the requests in flight at it, keeps the most it ever saw at once, and holds requests
//! until a test lets them go: what proves a concurrency limit from the upstream's side.
//!
//! - `/hold` (any prefix) waits for the gate, then answers `done`;
//! - `/stream` sends a first chunk at once, waits for the gate, then ends the body (in flight until it ends);
//! - `/ws` opens a WebSocket that echoes until the client closes it (in flight while open);
//! - any other path answers `ok` at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use futures_util::{stream, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A running upstream counting what is in flight.
pub struct InFlightUpstream {
    pub addr: SocketAddr,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

struct Counts {
    now: AtomicUsize,
    most: AtomicUsize,
    arrived: AtomicUsize,
    /// The paths of the requests held, in the order they arrived.
    arrivals: Mutex<Vec<String>>,
    /// Requests held wait for a permit of their own; none until the test gives some.
    gate: Semaphore,
}

/// One request in flight, for as long as its handler (or its body, or its socket) lives: also when it is dropped
/// because the gateway gave up on it.
struct InFlight(Arc<Counts>);

impl InFlight {
    fn enter(counts: &Arc<Counts>) -> Self {
        counts.arrived.fetch_add(1, Ordering::SeqCst);
        let now = counts.now.fetch_add(1, Ordering::SeqCst) + 1;
        counts.most.fetch_max(now, Ordering::SeqCst);
        Self(counts.clone())
    }

    async fn held(&self) {
        if let Ok(permit) = self.0.gate.acquire().await {
            permit.forget();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InFlightUpstream {
    pub async fn start() -> Self {
        let counts = Arc::new(Counts {
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            arrived: AtomicUsize::new(0),
            arrivals: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
        });
        let app = Router::new()
            .route("/ws", any(socket))
            .route("/stream", any(streamed))
            .route("/hold", any(held))
            .route("/{*rest}", any(routed))
            .with_state(counts.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, counts, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.counts.now.load(Ordering::SeqCst)
    }

    /// The most requests ever in flight at once.
    pub fn most_in_flight(&self) -> usize {
        self.counts.most.load(Ordering::SeqCst)
    }

    /// Requests that reached the upstream.
    pub fn arrived(&self) -> usize {
        self.counts.arrived.load(Ordering::SeqCst)
    }

    /// The paths of the requests to `/hold` (or `<prefix>/hold`) that arrived, in the order they did.
    pub fn arrivals(&self) -> Vec<String> {
        self.counts.arrivals.lock().expect("arrivals").clone()
    }

    /// Lets `n` held requests (present or to come) go on.
    pub fn release(&self, n: usize) {
        self.counts.gate.add_permits(n);
    }
}

impl Drop for InFlightUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn routed(State(counts): State<Arc<Counts>>, request: Request) -> Response {
    if request.uri().path().ends_with("/hold") {
        return hold_as(counts, request.uri().path()).await;
    }
    let _in_flight = InFlight::enter(&counts);
    "ok".into_response()
}

async fn held(State(counts): State<Arc<Counts>>) -> Response {
    hold_as(counts, "/hold").await
}

async fn hold_as(counts: Arc<Counts>, path: &str) -> Response {
    counts
        .arrivals
        .lock()
        .expect("arrivals")
        .push(path.to_owned());
    let in_flight = InFlight::enter(&counts);
    in_flight.held().await;
    "done".into_response()
}

async fn streamed(State(counts): State<Arc<Counts>>) -> Response {
    let in_flight = InFlight::enter(&counts);
    let first = stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"first\n")) });
    let last = stream::once(async move {
        in_flight.held().await;
        drop(in_flight);
        Ok(Bytes::from_static(b"last\n"))
    });
    Response::new(Body::from_stream(first.chain(last)))
}

async fn socket(State(counts): State<Arc<Counts>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(move |mut socket: WebSocket| async move {
        let _in_flight = InFlight::enter(&counts);
        while let Some(Ok(message)) = socket.recv().await {
            let echo = matches!(message, Message::Text(_) | Message::Binary(_));
            if matches!(message, Message::Close(_)) || (echo && socket.send(message).await.is_err())
            {
                return;
            }
        }
    })
}
