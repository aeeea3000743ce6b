//! The tower layer for library users: tollgate's limits and stores in front of any axum or hyper service.
#![doc = include_str!("docs.md")]

mod builder;
mod future;
mod rate_limit;
mod service;
#[cfg(test)]
mod tests;

pub use self::builder::{memory_limiter, Builder, LayerError, DEFAULT_MAX_KEYS};
pub use self::future::ResponseFuture;
pub use self::rate_limit::RateLimitLayer;
pub use self::service::RateLimit;
/// The field [`Builder::client_ip_header`] believes from trusted proxies.
pub use crate::key::ClientIpHeader;
