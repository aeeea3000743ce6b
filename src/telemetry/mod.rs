//! What the gateway tells its operators about itself: Prometheus metrics and the access log.

pub mod access;
mod metrics;

pub use metrics::{prometheus, RouteMetrics};
