//! The admin listener: liveness, readiness (is the store answering, or which fallback is active), Prometheus
//! metrics.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::gateway::Gateway;
use crate::limiter::{Backend, OnError};

/// The admin API's routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(gateway)
}

/// 200 while requests can be decided: by the store, or by a fallback that still serves (`on_error: local` or
/// `allow`; the body says which). 503 while Redis is down under `on_error: deny`, since every limited request is
/// then refused and a load balancer should prefer another instance.
async fn readyz(State(gateway): State<Arc<Gateway>>) -> impl IntoResponse {
    let limiter = gateway.limiter();
    let store = match limiter.backend() {
        Backend::Memory => "memory",
        Backend::Redis(_) => "redis",
    };
    let fallback = limiter.fallback_active();
    let (status, state) = match (fallback, limiter.on_error()) {
        (false, _) => (StatusCode::OK, "ready"),
        (true, OnError::Deny) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        (true, _) => (StatusCode::OK, "degraded"),
    };
    let body = json!({
        "status": state,
        "store": store,
        "fallback_active": fallback,
        "on_error": limiter.on_error().to_string(),
    });
    (status, Json(body))
}

/// Prometheus text format.
async fn metrics() -> impl IntoResponse {
    match crate::telemetry::prometheus() {
        Some(handle) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            "# metrics recorder not installed\n".to_owned(),
        ),
    }
}
