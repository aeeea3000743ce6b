//! An axum API whose callers are named by API key, each on a plan, limited by tollgate's tower layer.
//!
//! Run it with (`PORT` changes the port, default 3000):
//!
//! ```sh
//! cargo run --example api_key_plans
//! ```
//!
//! then `curl -i -H 'x-api-key: demo-free-key' localhost:3000/api/hello` six times (the free plan's 5 a minute,
//! then 429), with `demo-pro-key`, and without a key (401).

use std::net::SocketAddr;
use std::path::Path;

use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use tollgate::consumers::{ConsumerMode, ConsumersSettings};
use tollgate::layer::RateLimitLayer;

/// What goes under `consumers:` in a gateway config (docs/configuration.md, "Consumers and plans").
const CONSUMERS: &str = r#"
identify:
  - api_key: { header: x-api-key }
keys:                 # only a key's SHA-256 is written: `printf %s demo-free-key | sha256sum`
  - { key: "sha256:9f8cfdb17116bf0e2a44e071454f25594cb9b8737bf331e6a2f0b30550572f29", consumer: alice, plan: free }
  - { key: "sha256:1fbfd5e2a34698deb796eb78add256a067ec065519b8329b1eb85f5e2ef906d4", consumer: bob, plan: pro }
forward: { consumer: X-Consumer-Id, plan: X-Consumer-Plan }
plans:
  free:
    limits:
      - { name: per-minute, key: consumer, algorithm: sliding_window, limit: 5, period: 1m }
  pro:
    limits:
      - { name: per-minute, key: consumer, algorithm: sliding_window, limit: 100, period: 1m }
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();

    // Checked as a config file's block is: a mistake is reported as `consumers.yaml:LINE:COLUMN: field: ...`.
    let consumers = ConsumersSettings::from_yaml(CONSUMERS, Path::new("consumers.yaml"))?;
    // `Required`: a request without a valid key is refused (401) before the handler runs.
    let plans = RateLimitLayer::builder()
        .memory_store()
        .scope("api")
        .consumers(consumers, ConsumerMode::Required)
        .build()?;

    let app = Router::new()
        .route("/api/hello", get(hello))
        .route_layer(plans);

    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |port| port.parse())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}

/// The layer names the caller in the `forward` headers; copies a client sent were dropped, so they can be believed.
async fn hello(headers: HeaderMap) -> String {
    let field = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("?")
            .to_owned()
    };
    format!(
        "hello {}, on the {} plan\n",
        field("x-consumer-id"),
        field("x-consumer-plan")
    )
}
