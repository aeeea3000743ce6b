//! tollgate: a rate-limiting HTTP reverse proxy whose limits hold across every gateway instance through Redis.

pub mod admin;
pub mod config;
pub mod enforcement;
pub mod gateway;
pub mod key;
pub mod limiter;
pub mod proxy;
pub mod reload;
pub mod routing;
pub mod telemetry;
