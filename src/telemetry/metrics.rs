//! Prometheus metrics: the process-wide recorder and the series of docs/operations.md, "Admin listener", with buckets sized for a limiter
//! (sub-millisecond store calls) and for upstreams (milliseconds to seconds).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::histograms::{Counted, Layered};

/// Store calls on loopback take well under a millisecond; the timeout is typically 25 ms.
const STORE_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];
/// Upstream responses: from a cache hit to a slow report.
const UPSTREAM_BUCKETS: &[f64] = &[
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How often the recorder's histogram samples are folded into their buckets. Until then each sample is held (8
/// bytes plus its block); a scrape folds them too, but an instance nobody scrapes would otherwise grow without end.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static INSTALLED: OnceLock<Option<Metrics>> = OnceLock::new();

/// The process's metrics, as `GET /metrics` shows them.
pub struct Metrics {
    handle: PrometheusHandle,
    /// The histograms the request path records into, counted apart from the exporter's (see `histograms.rs`).
    counted: Arc<Counted>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Every metric in Prometheus's text format.
    pub fn render(&self) -> String {
        let mut text = self.handle.render();
        self.counted.render(&mut text);
        text
    }
}

/// Installs the Prometheus recorder once per process and returns the metrics (`None` if another recorder was
/// installed first, e.g. by an application embedding the tower layer).
pub fn prometheus() -> Option<&'static Metrics> {
    INSTALLED
        .get_or_init(|| {
            let inner = PrometheusBuilder::new().build_recorder();
            let handle = inner.handle();
            // A rate limit service answer is a store call and a little matching around it.
            let counted = Arc::new(Counted::new(&[
                ("tollgate_store_duration_seconds", STORE_BUCKETS),
                ("tollgate_upstream_duration_seconds", UPSTREAM_BUCKETS),
                ("tollgate_rls_request_duration_seconds", STORE_BUCKETS),
            ]));
            let recorder = Layered {
                inner,
                counted: Arc::clone(&counted),
            };
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    describe();
                    keep_up(handle.clone());
                    Some(Metrics { handle, counted })
                }
                Err(error) => {
                    tracing::warn!(%error, "metrics recorder not installed");
                    None
                }
            }
        })
        .as_ref()
}

/// Runs the recorder's upkeep every [`UPKEEP_INTERVAL`] on a thread of its own: `install_recorder` leaves it to
/// the caller, and a thread serves the binary and an application embedding the layer alike, with or without a
/// tokio runtime at hand.
fn keep_up(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("tollgate-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            handle.run_upkeep();
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "metrics upkeep not started: histogram samples are kept until a scrape");
    }
}

fn describe() {
    metrics::describe_counter!(
        "tollgate_rls_requests_total",
        "Envoy rate limit service requests, by domain (empty for domains not configured) and code (ok, over_limit, unavailable)."
    );
    metrics::describe_counter!(
        "tollgate_rls_shadow_denied_total",
        "Envoy rate limit service shadow-mode limits that would have refused a request, by domain."
    );
    metrics::describe_histogram!(
        "tollgate_rls_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time to decide one Envoy rate limit service request."
    );
    metrics::describe_counter!(
        "tollgate_requests_total",
        "Requests answered, by route and status."
    );
    metrics::describe_counter!(
        "tollgate_tokens_total",
        "Tokens settled on routes with usage:, by route and kind (input, output, total): what answers reported, the reservation where they reported nothing."
    );
    metrics::describe_counter!(
        "tollgate_usage_missing_total",
        "Answers on routes with usage: that reported no usage, settled at their reservation, by route."
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
        "tollgate_settlements_failed_total",
        "Settlements (give-backs and debts of requests whose answers are known) that Redis did not confirm."
    );
    metrics::describe_counter!(
        "tollgate_store_full_total",
        "Requests with a new key that the full in-process store had no room for (store.when_full decided them)."
    );
    metrics::describe_counter!(
        "tollgate_store_evicted_keys_total",
        "Keys Redis evicted (INFO evicted_keys, read once a second): evicted limit state starts afresh and over-admits."
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
        "tollgate_consumer_directory_resets_total",
        "Times the consumer directory in Redis was found to have lost its data (flushed, an empty Redis, a restart without persistence)."
    );
    metrics::describe_counter!(
        "tollgate_jwks_fetches_total",
        "Fetches of jwks_url documents, by result: ok, or error (no answer, not a JWKS, no usable key)."
    );
    metrics::describe_counter!(
        "tollgate_telemetry_dropped_spans_total",
        "Sampled spans not delivered to the OTLP collector: its queue full, or its batch refused or unanswered."
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
    /// `tollgate_requests_total{route,status}` of the statuses this route has answered with, each registered on
    /// first use: a handful of slots rather than one per possible status (900 slots were 22 KB per route, most of
    /// a route's memory, for the few statuses a route ever answers with).
    requests: [OnceLock<(u16, metrics::Counter)>; STATUS_SLOTS],
    /// `tollgate_upstream_duration_seconds{route}`.
    upstream_duration: metrics::Histogram,
}

/// Distinct statuses of one route whose counters are kept at hand; a route answering with more looks the rest up
/// in the recorder's registry (correct, only slower).
const STATUS_SLOTS: usize = 16;

impl RouteMetrics {
    /// The series of `route` (`"none"` for requests no route matched).
    pub fn new(route: &str) -> Self {
        Self {
            route: route.to_owned(),
            requests: std::array::from_fn(|_| OnceLock::new()),
            upstream_duration: metrics::histogram!(
                "tollgate_upstream_duration_seconds",
                "route" => route.to_owned()
            ),
        }
    }

    /// Counts one request answered with `status`.
    pub fn count_request(&self, status: http::StatusCode) {
        let code = status.as_u16();
        // Open addressing: a status keeps the first free slot from its home on; slots are never emptied.
        let home = usize::from(code) % STATUS_SLOTS;
        for probe in 0..STATUS_SLOTS {
            let slot = &self.requests[(home + probe) % STATUS_SLOTS];
            let (held, counter) = slot.get_or_init(|| (code, self.requests_counter(status)));
            if *held == code {
                counter.increment(1);
                return;
            }
        }
        self.requests_counter(status).increment(1);
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
