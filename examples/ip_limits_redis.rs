//! An axum app limited per client address in Redis, deciding in-process while Redis is down.
//!
//! Run it with (Redis at `REDIS_URL`, default `redis://127.0.0.1:6379`; `PORT` changes the port, default 3000):
//!
//! ```sh
//! cargo run --example ip_limits_redis
//! ```
//!
//! then `curl -i localhost:3000/hello` a dozen times (10 pass, then 429), and `curl localhost:3000/ready`; stop
//! Redis and ask again.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tollgate::config::parse_rate;
use tollgate::layer::RateLimitLayer;
use tollgate::limiter::{Algorithm, OnError, RateLimiter, StoreSettings};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // fred, the Redis client, logs a warning of its own for each connection Redis closes; the limiter logs an
    // outage once, with its cause. Keep fred's errors only, as the gateway does (RUST_LOG overrides).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,fred=error".into());
    tracing_subscriber::fmt().with_env_filter(filter).init();

    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    // While Redis fails, decide in this process: each instance then admits up to the limit on its own.
    // `OnError::Deny` answers 503 instead, `OnError::Allow` admits everything.
    let store = StoreSettings {
        on_error: OnError::Local,
        ..StoreSettings::redis(url)
    };
    // Connects in the background: the app serves from its first second, Redis up or not.
    let limiter = Arc::new(RateLimiter::from_settings(&store)?);

    // Per client address: a burst of 10, refilled at 5 a second, shared by every instance on this Redis.
    let per_ip = RateLimitLayer::builder()
        .limiter(Arc::clone(&limiter))
        .scope("hello")
        .limit_by(
            "per-ip",
            ["ip"],
            Algorithm::TokenBucket {
                rate: parse_rate("5/s")?,
                burst: 10,
            },
        )
        .build()?;

    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route_layer(per_ip)
        // Outside the layer: a readiness check that says whether limits are shared.
        .route(
            "/ready",
            get(move || async move {
                let readiness = limiter.readiness();
                match readiness.reason {
                    None if readiness.ready => (StatusCode::OK, "ready\n".to_owned()),
                    reason => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "limits in this process only: {}\n",
                            reason.unwrap_or_default()
                        ),
                    ),
                }
            }),
        );

    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |port| port.parse())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // The layer finds the client address in `ConnectInfo`: serve with it.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
