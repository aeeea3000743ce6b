//! What the gateway tells its operators about itself: Prometheus metrics, the access log and traces.

pub mod access;
mod histograms;
mod metrics;
pub mod trace;

pub(crate) use histograms::escaped as label_value;
pub use metrics::{prometheus, Metrics, RouteMetrics};
