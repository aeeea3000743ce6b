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
    metrics::describe_counter!(
        "tollgate_store_full_total",
        "Requests with a new key that the full in-process store had no room for (store.when_full decided them)."
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
    metrics::describe_gauge!(
        "tollgate_websocket_tunnels",
        "WebSocket connections open through the gateway now, by upstream."
    );
    metrics::describe_counter!(
        "tollgate_jwt_verifications_total",
        "JWTs verified by signature (not served by the token cache), by result: ok or the refusal reason."
    );
    metrics::describe_counter!(
        "tollgate_jwks_fetches_total",
        "Fetches of jwks_url documents, by result: ok, or error (no answer, not a JWKS, no usable key)."
    );
}

/// The per-route series of the request path, registered once when the config is compiled: looking a series up
/// by its labels on every request (allocating the label strings, hashing them) cost more than the rest of the
/// metrics work together.
///
/// Handles registered before a recorder is installed stay inert, so the binary installs its recorder first.
#[derive(Debug)]
pub struct RouteMetrics {
    route: String,
    /// `tollgate_requests_total{route,status}`, registered on first use of each status.
    requests: Box<[OnceLock<metrics::Counter>]>,
    /// `tollgate_upstream_duration_seconds{route}`.
    upstream_duration: metrics::Histogram,
}

/// Status codes `100..=999` have a slot in `RouteMetrics::requests`.
const FIRST_STATUS: u16 = 100;
const STATUSES: usize = 900;

impl RouteMetrics {
    /// The series of `route` (`"none"` for requests no route matched).
    pub fn new(route: &str) -> Self {
        Self {
            route: route.to_owned(),
            requests: (0..STATUSES).map(|_| OnceLock::new()).collect(),
            upstream_duration: metrics::histogram!(
                "tollgate_upstream_duration_seconds",
                "route" => route.to_owned()
            ),
        }
    }

    /// Counts one request answered with `status`.
    pub fn count_request(&self, status: http::StatusCode) {
        let code = status.as_u16();
        match self
            .requests
            .get(usize::from(code.wrapping_sub(FIRST_STATUS)))
        {
            Some(slot) => slot
                .get_or_init(|| self.requests_counter(status))
                .increment(1),
            None => self.requests_counter(status).increment(1),
        }
    }

    /// Records the time to an upstream's response head.
    pub fn record_upstream(&self, elapsed: std::time::Duration) {
        self.upstream_duration.record(elapsed.as_secs_f64());
    }

    fn requests_counter(&self, status: http::StatusCode) -> metrics::Counter {
        metrics::counter!(
            "tollgate_requests_total",
            "route" => self.route.clone(),
            "status" => status.as_str().to_owned()
        )
    }
}
