//! tollgate: a rate-limiting HTTP reverse proxy whose limits hold across every gateway instance through Redis.

pub mod config;
pub mod key;
pub mod limiter;
