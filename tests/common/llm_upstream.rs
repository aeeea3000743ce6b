//! A real LLM-API-like upstream on a free loopback port: answers OpenAI chat completions and Anthropic messages, as
//! JSON or streamed (server-sent events), with the usage the test asks for, and keeps every request body it received.
//!
//! The usage it reports is `x-test-input` and `x-test-output` (request headers; default 5 and 10), or on OpenAI's
//! path the `usage` object given whole as the text of `x-test-usage` (any JSON: huge, negative, a string).
//! `x-test-output: max` spends all the body lets it write: its largest completion limit (`max_tokens`,
//! `max_completion_tokens`), as a server that reads JSON whatever the `Content-Type` would. Paths:
//! - `/v1/chat/completions`: OpenAI; streamed when the body says `"stream": true`, ending with the usage chunk only
//!   when it asks for it (`stream_options.include_usage`).
//! - `/v1/messages`: Anthropic; streamed when asked, input in `message_start`, output in the last `message_delta`.
//! - `/header`: the total in the response header `x-tokens`.
//! - `/trailer`: the total in the trailer `x-tokens` (announced by `Trailer: x-tokens`), which hyper's server sends
//!   over HTTP/1.1 only to a request with `TE: trailers`.
//! - `/v1/embeddings`, `/v1/moderations`: OpenAI's answers, the embeddings' usage with its input alone.
//! - `/v1/messages/count_tokens`: Anthropic's count (`input_tokens`, no usage), `/v1/messages/batches` a batch.
//! - `/nousage/chat/completions`: a JSON answer without usage.
//! - `/fail/chat/completions`: 500 with a JSON error body.
//! - `/cut/chat/completions`, `/cut/messages`: a stream that sends its first events (Anthropic's `message_start`
//!   carries the input) and then nothing, held open until the client leaves.
//! - `/gated/chat/completions`: an OpenAI stream that sends its first event, waits until the test calls
//!   [`LlmUpstream::release`], then sends `x-test-mib` MiB (default 0) of content events of 16 KiB each and the
//!   usage chunk.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use futures_util::stream::{self, StreamExt};
use http::HeaderMap;
use http_body::Frame;
use http_body_util::StreamBody;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What the upstream received and reported.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Per request: its path, headers and body.
    pub requests: Vec<(String, HeaderMap, Bytes)>,
    /// The tokens reported in answers that were sent whole: input, output.
    pub reported: Vec<(u64, u64)>,
}

/// A running LLM upstream.
pub struct LlmUpstream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// What the handlers share with the test.
struct Shared {
    received: Mutex<Received>,
    /// One permit per gated stream the test let go on.
    gate: Semaphore,
}

impl LlmUpstream {
    pub async fn start() -> Self {
        let shared = Arc::new(Shared {
            received: Mutex::default(),
            gate: Semaphore::new(0),
        });
        let app = Router::new()
            .fallback(any(answer))
            .with_state(shared.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// Lets one `/gated/` stream go on past its first event.
    pub fn release(&self) {
        self.shared.gate.add_permits(1);
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it received and reported so far.
    pub fn received(&self) -> Received {
        self.shared.received.lock().clone()
    }

    /// The body of the last request received.
    pub fn last_body(&self) -> Value {
        let received = self.shared.received.lock();
        let (_, _, body) = received.requests.last().expect("a request");
        serde_json::from_slice(body).expect("a JSON body")
    }
}

impl Drop for LlmUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn count(headers: &HeaderMap, name: &str, default: u64) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(default)
}

async fn answer(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    shared
        .received
        .lock()
        .requests
        .push((path.clone(), parts.headers.clone(), body.clone()));
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let stream = json["stream"] == json!(true);
    let input = count(&parts.headers, "x-test-input", 5);
    let output = match parts.headers.get("x-test-output") {
        Some(value) if value == "max" => ["max_tokens", "max_completion_tokens"]
            .iter()
            .filter_map(|field| json[*field].as_u64())
            .max()
            .unwrap_or(0),
        _ => count(&parts.headers, "x-test-output", 10),
    };
    let reporting = shared.clone();
    let reported = move || reporting.received.lock().reported.push((input, output));
    match path.as_str() {
        "/v1/chat/completions" if stream => {
            let mut events = vec![
                json!({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}),
                json!({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":"stop"}],"usage":null}),
            ];
            if json["stream_options"]["include_usage"] == json!(true) {
                events.push(json!({"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":input,"completion_tokens":output,"total_tokens":input+output}}));
                reported();
            }
            let mut text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
            text.push_str("data: [DONE]\n\n");
            sse(split(text))
        }
        "/v1/chat/completions" => {
            let usage = match parts.headers.get("x-test-usage") {
                Some(raw) => serde_json::from_slice(raw.as_bytes()).expect("x-test-usage is JSON"),
                None => {
                    reported();
                    json!({"prompt_tokens":input,"completion_tokens":output,"total_tokens":input+output})
                }
            };
            json_answer(
                200,
                json!({"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],
                    "usage":usage}),
            )
        }
        "/v1/messages" if stream => {
            reported();
            let text = format!(
                "event: message_start\r\ndata: {}\r\n\r\nevent: content_block_delta\r\ndata: {}\r\n\r\nevent: message_delta\r\ndata: {}\r\n\r\nevent: message_stop\r\ndata: {{\"type\":\"message_stop\"}}\r\n\r\n",
                json!({"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"usage":{"input_tokens":input,"output_tokens":1}}}),
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}),
                json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":output}}),
            );
            sse(split(text))
        }
        "/v1/messages" => {
            reported();
            json_answer(
                200,
                json!({"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn",
                    "usage":{"input_tokens":input,"output_tokens":output}}),
            )
        }
        "/header" => {
            reported();
            Response::builder()
                .header("x-tokens", (input + output).to_string())
                .body(Body::from("ok"))
                .expect("response")
        }
        "/trailer" => {
            reported();
            let mut trailers = HeaderMap::new();
            trailers.insert("x-tokens", (input + output).into());
            let frames = stream::iter([
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"ok"))),
                Ok(Frame::trailers(trailers)),
            ]);
            Response::builder()
                .header("trailer", "x-tokens")
                .body(Body::new(StreamBody::new(frames)))
                .expect("response")
        }
        "/v1/embeddings" => {
            reported();
            json_answer(
                200,
                json!({"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-0.25]}],"model":"e",
                    "usage":{"prompt_tokens":input,"total_tokens":input}}),
            )
        }
        "/v1/moderations" => json_answer(
            200,
            json!({"id":"modr","model":"m","results":[{"flagged":false}]}),
        ),
        "/v1/messages/count_tokens" => json_answer(200, json!({"input_tokens": input})),
        "/v1/messages/batches" => json_answer(
            200,
            json!({"id":"msgbatch_1","type":"message_batch","processing_status":"in_progress"}),
        ),
        "/nousage/chat/completions" => json_answer(200, json!({"id":"c","choices":[]})),
        "/fail/chat/completions" => json_answer(500, json!({"error":{"message":"overloaded"}})),
        "/cut/chat/completions" => held(format!(
            "data: {}\n\n",
            json!({"id":"c","choices":[{"index":0,"delta":{"content":"Hel"}}],"usage":null})
        )),
        "/cut/messages" => held(format!(
            "event: message_start\ndata: {}\n\n",
            json!({"type":"message_start","message":{"usage":{"input_tokens":input,"output_tokens":1}}})
        )),
        "/gated/chat/completions" => {
            let mib = count(&parts.headers, "x-test-mib", 0);
            gated(shared, mib, input, output)
        }
        _ => json_answer(404, json!({"error":"unknown path"})),
    }
}

/// Where a gated stream is.
enum Gated {
    First,
    Waiting,
    /// Content events still to send.
    Filling(u64),
    Usage,
    Done,
}

/// The `/gated/chat/completions` stream: its first event, then (once released) `mib` MiB of 16 KiB events and the usage.
fn gated(shared: Arc<Shared>, mib: u64, input: u64, output: u64) -> Response {
    const EVENT: usize = 16 * 1024;
    let head = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":""#;
    let tail = "\"}}],\"usage\":null}\n\n";
    let filler = Bytes::from(format!(
        "{head}{}{tail}",
        "x".repeat(EVENT - head.len() - tail.len())
    ));
    assert_eq!(filler.len(), EVENT);
    let events = (mib * 1024 * 1024).div_ceil(EVENT as u64);
    let frames = stream::unfold(Gated::First, move |step| {
        let (shared, filler) = (shared.clone(), filler.clone());
        async move {
            let (frame, next) = match step {
                Gated::First => (Bytes::from(format!("data: {}\n\n", json!({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}))), Gated::Waiting),
                Gated::Waiting => {
                    shared.gate.acquire().await.expect("open").forget();
                    (Bytes::new(), Gated::Filling(events))
                }
                Gated::Filling(0) => (Bytes::new(), Gated::Usage),
                Gated::Filling(left) => (filler, Gated::Filling(left - 1)),
                Gated::Usage => {
                    shared.received.lock().reported.push((input, output));
                    let usage = json!({"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":input,"completion_tokens":output,"total_tokens":input+output}});
                    (Bytes::from(format!("data: {usage}\n\ndata: [DONE]\n\n")), Gated::Done)
                }
                Gated::Done => return None,
            };
            Some((Ok::<_, Infallible>(frame), next))
        }
    })
    .filter(|frame| std::future::ready(!matches!(frame, Ok(bytes) if bytes.is_empty())));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(frames))
        .expect("response")
}

fn json_answer(status: u16, body: Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("response")
}

/// `text` cut into pieces of 7 bytes: events split anywhere across writes.
fn split(text: String) -> Vec<Bytes> {
    text.into_bytes()
        .chunks(7)
        .map(Bytes::copy_from_slice)
        .collect()
}

fn sse(pieces: Vec<Bytes>) -> Response {
    let frames = stream::iter(pieces.into_iter().map(Ok::<_, Infallible>));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(frames))
        .expect("response")
}

/// `first`, then a stream that never ends.
fn held(first: String) -> Response {
    let frames = stream::iter([Ok::<_, Infallible>(Bytes::from(first))]).chain(stream::pending());
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(frames))
        .expect("response")
}
