//! A library user's axum app limited by tollgate's tower layer, with the in-process store.
//!
//! Run it with:
//!
//! ```sh
//! cargo run --example axum_app
//! ```
//!
//! then follow the curl commands it prints. `PORT` changes the port (default 3000); it listens on 127.0.0.1 only.

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use tollgate::config::parse_rate;
use tollgate::layer::RateLimitLayer;
use tollgate::limiter::Algorithm;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    // The API: per client address a burst of 5 refilled at 1 per second, and per API key 20 a minute (requests
    // without `X-Api-Key` are keyed by their address for that limit too).
    let api_limits = RateLimitLayer::builder()
        .memory_store()
        .scope("api")
        .limit_by(
            "per-ip",
            ["ip"],
            Algorithm::TokenBucket {
                rate: parse_rate("1/s")?,
                burst: 5,
            },
        )
        .limit_by(
            "per-api-key",
            ["header:x-api-key"],
            Algorithm::SlidingWindow {
                limit: 20,
                period_ms: 60_000,
            },
        )
        .build()?;

    let api = Router::new()
        .route("/api/hello", get(|| async { "hello from the api\n" }))
        .route("/api/time", get(time))
        // `route_layer`: requests to unknown paths get their 404 without spending the budget.
        .route_layer(api_limits);
    let app = Router::new()
        .route("/", get(|| async { "unlimited; try /api/hello\n" }))
        .merge(api);

    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 3000,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("try: for i in $(seq 1 7); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/api/hello; done");
    println!("     (5 × 200, then 429: the burst of 5 is spent; it refills at one a second)");
    println!("then, once refilled: curl -i -H 'x-api-key: demo' http://{addr}/api/time   (the rate-limit headers)");

    // The layer finds the client address in `ConnectInfo`: serve with it.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// Seconds since the Unix epoch, as a tiny JSON document.
async fn time() -> axum::Json<serde_json::Value> {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    axum::Json(serde_json::json!({ "unix_seconds": seconds }))
}
