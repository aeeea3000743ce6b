//! The admin listener: liveness, readiness (is the store answering, or the fallback active).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::gateway::Gateway;
use crate::limiter::Backend;

/// The admin API's routes.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .with_state(gateway)
}

/// 200 while requests can be decided: by the store, or by the fallback (the body says which).
async fn readyz(State(gateway): State<Arc<Gateway>>) -> impl IntoResponse {
    let limiter = gateway.limiter();
    let store = match limiter.backend() {
        Backend::Memory => "memory",
        Backend::Redis(_) => "redis",
    };
    let fallback = limiter.fallback_active();
    let body = json!({
        "status": if fallback { "degraded" } else { "ready" },
        "store": store,
        "fallback_active": fallback,
    });
    (StatusCode::OK, Json(body))
}
