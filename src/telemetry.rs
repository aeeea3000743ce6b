//! Prometheus metrics: the process-wide recorder and the series of design §8, with buckets sized for a limiter
//! (sub-millisecond store calls) and for upstreams (milliseconds to seconds).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Store calls on loopback take well under a millisecond; the timeout is typically 25 ms.
const STORE_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];
/// Upstream responses: from a cache hit to a slow report.
const UPSTREAM_BUCKETS: &[f64] = &[
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process and returns its handle (`None` if another recorder was
/// installed first, e.g. by an application embedding the tower layer).
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("tollgate_store_duration_seconds".into()),
                    STORE_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("tollgate_upstream_duration_seconds".into()),
                        UPSTREAM_BUCKETS,
                    )
                });
            match builder.map(|b| b.install_recorder()) {
                Ok(Ok(handle)) => {
                    describe();
                    Some(handle)
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "metrics recorder not installed");
                    None
                }
                Err(error) => {
                    tracing::warn!(%error, "metrics buckets rejected");
                    None
                }
            }
        })
        .as_ref()
}

fn describe() {
    metrics::describe_counter!(
        "tollgate_requests_total",
        "Requests answered, by route and status."
    );
    metrics::describe_counter!(
        "tollgate_decisions_total",
        "Limit decisions, by route, limit and decision (allowed, denied, shadow_denied)."
    );
    metrics::describe_histogram!(
        "tollgate_store_duration_seconds",
        metrics::Unit::Seconds,
        "Time of one limiter call to Redis."
    );
    metrics::describe_counter!(
        "tollgate_store_errors_total",
        "Redis calls that failed or timed out."
    );
    metrics::describe_gauge!(
        "tollgate_store_fallback",
        "1 while requests are decided by the on_error policy because Redis failed."
    );
    metrics::describe_histogram!(
        "tollgate_upstream_duration_seconds",
        metrics::Unit::Seconds,
        "Time to the upstream's response head, by route."
    );
}
