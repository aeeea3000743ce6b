//! An axum app whose routes are limited as the routes of a config file say, one tower layer per route.
//!
//! Run it with (`PORT` changes the port, default 3000):
//!
//! ```sh
//! cargo run --example layers_from_config
//! ```
//!
//! then `curl -i localhost:3000/search` six times (a burst of 5, then 429) and `curl -i localhost:3000/api/hello`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use tollgate::layer::RateLimitLayer;
use tollgate::limiter::RateLimiter;

/// A gateway config's format (docs/configuration.md), usually a file read with `config::load_for_layers`. For
/// layers a route needs no `match`, `upstream` or `respond`: the layer limits whatever it wraps.
const LIMITS: &str = r#"
store: { backend: memory }        # or redis, with its url, timeout and on_error
client_ip: { trusted_proxies: [10.0.0.0/8] }
routes:
  - name: api
    limits:
      - { name: per-ip, key: ip, algorithm: sliding_window, limit: 100, period: 1m }
  - name: search
    limits:
      - { name: per-ip, key: ip, algorithm: token_bucket, rate: 1/s, burst: 5 }
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();

    // Checked as the gateway checks a file: a mistake is reported as `limits.yaml:LINE:COLUMN: field: ...`.
    let config = tollgate::config::parse_for_layers(LIMITS, Path::new("limits.yaml"))?;
    // One store for every layer of the config (with Redis, one set of connections).
    let limiter = Arc::new(RateLimiter::from_settings(&config.store)?);
    let api = RateLimitLayer::from_route(&config, "api")?
        .limiter(Arc::clone(&limiter))
        .build()?;
    let search = RateLimitLayer::from_route(&config, "search")?
        .limiter(limiter)
        .build()?;

    // Each route under its own layer: separate budgets, separate store keys.
    let app = Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .route_layer(api)
        .merge(
            Router::new()
                .route("/search", get(|| async { "results\n" }))
                .route_layer(search),
        );

    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |port| port.parse())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
