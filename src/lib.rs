//! tollgate: a rate-limiting HTTP reverse proxy whose limits hold across every gateway instance through Redis.
//!
//! The `tollgate` binary runs the gateway from a `gateway.yaml` (see the README). This library is the same
//! machinery, to embed: its most direct use is [`layer::RateLimitLayer`], a tower layer that puts tollgate's limits
//! and stores in front of any axum or hyper service.
//!
//! ```no_run
//! use std::net::SocketAddr;
//!
//! use axum::{routing::get, Router};
//! use tollgate::config::parse_rate;
//! use tollgate::layer::RateLimitLayer;
//! use tollgate::limiter::Algorithm;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // 10 requests at once per client address, then 5 a second; in this process's memory.
//!     let limits = RateLimitLayer::builder()
//!         .memory_store()
//!         .scope("hello")
//!         .limit_by("per-ip", ["ip"], Algorithm::TokenBucket { rate: parse_rate("5/s")?, burst: 10 })
//!         .build()?;
//!     let app = Router::new().route("/", get(|| async { "hello\n" })).layer(limits);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // The layer keys clients by the address that `ConnectInfo` carries.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! The modules, from the outside in:
// The gateway's own modules are there (and linked) with the `gateway` feature only.
#![cfg_attr(
    feature = "gateway",
    doc = "[`server`] (listeners and connections, each request handed to one handler), [`gateway`] (the request \
           path: admission, then the route's action), [`admin`] (the admin API),"
)]
//! [`layer`] (admission in front of any tower service), [`routing`] (the canonical request and the route table),
//! [`admission`] (the one request path both share: allowlist, keys, one limiter call, refusals, delays, fields),
//! [`key`] (client addresses and limiting keys), [`limiter`] (the algorithms and the Redis and in-process stores,
//! without HTTP), [`usage`] (what a request may cost and what its answer reports it cost, below admission and
//! proxy), [`config`] and [`proxy`].

// The connection task's future holds the Redis store's futures, whose fred types nest deeper than the compiler's default
// of 128 when it proves the task is Send.
#![recursion_limit = "256"]

/// CIDR networks, as `trusted_proxies` and allowlists take them.
pub use ipnet::IpNet;

#[cfg(feature = "gateway")]
pub mod admin;
pub mod admission;
#[cfg(feature = "gateway")]
mod civil;
pub mod config;
pub mod consumers;
#[cfg(feature = "gateway")]
pub mod gateway;
pub mod key;
#[cfg(feature = "layer")]
pub mod layer;
pub use tollgate_limiter as limiter;
pub mod head_lines;
pub mod proxy;
#[cfg(feature = "gateway")]
pub mod reload;
pub mod rls;
pub mod routing;
#[cfg(feature = "gateway")]
pub mod server;
#[cfg(feature = "gateway")]
pub mod telemetry;
pub mod tls;
pub mod top_keys;
pub mod trace_context;
pub mod trail;
mod tunnel;
pub mod usage;
