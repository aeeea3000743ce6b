//! Liveness, readiness (is the store answering, or which fallback is active) and Prometheus metrics: open, for
//! probes and scrapers.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::Admin;

/// The truth about the store (see docs/operations.md, "Admin listener"): `"status": "ready"` only once a limiter call has succeeded and while they
/// keep succeeding; otherwise `"degraded"` with the `reason` (Redis's own words where it gave any) and the
/// `on_error` policy that answers meanwhile (under `deny` limited requests then get 503). `warnings` name what puts
/// limits at risk although calls succeed. 200 either way (the gateway still serves) unless
/// `admin.readyz_degraded_status` says otherwise for degraded.
///
/// Once shutdown begins, `"status": "draining"` with 503, whatever the store and `readyz_degraded_status` say: a
/// balancer must stop sending new requests before the listener closes.
pub(super) async fn readyz(State(admin): State<Admin>) -> impl IntoResponse {
    // The same answer as `server.health_path` on the main listener.
    let (status, body) = crate::gateway::readiness(&admin.gateway, admin.degraded_status);
    (status, Json(body))
}

/// Prometheus text format.
pub(super) async fn metrics(State(admin): State<Admin>) -> impl IntoResponse {
    match crate::telemetry::prometheus() {
        Some(handle) => {
            let mut text = handle.render();
            super::upstreams::render_target_up(&admin, &mut text);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                text,
            )
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            "# metrics recorder not installed\n".to_owned(),
        ),
    }
}
