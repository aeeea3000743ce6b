//! The admin listener: liveness, readiness (is the store answering, or which fallback is active), Prometheus
//! metrics, and the state of one limit for one key (read without consuming, or reset), behind a bearer token.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::config::LimitSettings;
use crate::gateway::Gateway;
use crate::limiter::store::{LimitCheck, StoreError};
use crate::limiter::Backend;

/// The admin API's routes. With a `token`, `/limits/...` requires `Authorization: Bearer <token>`; health,
/// readiness and metrics stay open for probes and scrapers.
pub fn router(gateway: Arc<Gateway>, token: Option<String>) -> Router {
    let state = Admin {
        gateway,
        token: token.map(Arc::from),
    };
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route(
            "/limits/{route}/{limit}",
            get(peek_limit).delete(reset_limit),
        )
        .with_state(state)
}

#[derive(Debug, Clone)]
struct Admin {
    gateway: Arc<Gateway>,
    token: Option<Arc<str>>,
}

#[derive(Debug, Deserialize)]
struct KeyQuery {
    key: Option<String>,
}

/// 200 while the process can answer: the store answers (`"status": "ready"`), or Redis failed and the
/// `on_error` policy answers instead (`"status": "degraded"`, `"fallback_active": true`, and the policy: under
/// `deny` limited requests then get 503, which the body makes visible to whoever watches readiness).
async fn readyz(State(admin): State<Admin>) -> impl IntoResponse {
    let limiter = admin.gateway.limiter();
    let store = match limiter.backend() {
        Backend::Memory => "memory",
        Backend::Redis(_) => "redis",
    };
    let fallback = limiter.fallback_active();
    let state = if fallback { "degraded" } else { "ready" };
    let body = json!({
        "status": state,
        "store": store,
        "fallback_active": fallback,
        "on_error": limiter.on_error().to_string(),
    });
    (StatusCode::OK, Json(body))
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

/// Why an admin request failed; mapped to its HTTP answer in one place.
#[derive(Debug)]
enum AdminError {
    Unauthorized,
    MissingKey,
    UnknownRoute(String),
    UnknownLimit(String),
    Store(StoreError),
}

/// `GET /limits/{route}/{limit}?key=VALUE`: the state of that limit for that key, consuming nothing.
async fn peek_limit(
    State(admin): State<Admin>,
    Path((route, limit)): Path<(String, String)>,
    Query(query): Query<KeyQuery>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, AdminError> {
    let (store_key, settings) = admin.locate(&headers, &route, &limit, query.key.as_deref())?;
    let check = LimitCheck {
        key: &store_key,
        limit: &settings.limit,
    };
    let decision = admin
        .gateway
        .limiter()
        .peek(check)
        .await
        .map_err(AdminError::Store)?;
    Ok(Json(json!({
        "route": route,
        "limit": limit,
        "key": query.key,
        "store_key": store_key,
        "algorithm": settings.limit.algorithm().name(),
        "capacity": decision.limit,
        "remaining": decision.remaining,
        "would_admit": decision.allowed,
        "retry_after_ms": decision.retry_after_ms,
        "reset_after_ms": decision.reset_after_ms,
    })))
}

/// `DELETE /limits/{route}/{limit}?key=VALUE`: forgets that key's state, so its next request starts afresh.
async fn reset_limit(
    State(admin): State<Admin>,
    Path((route, limit)): Path<(String, String)>,
    Query(query): Query<KeyQuery>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, AdminError> {
    let (store_key, _) = admin.locate(&headers, &route, &limit, query.key.as_deref())?;
    let existed = admin
        .gateway
        .limiter()
        .reset(&store_key)
        .await
        .map_err(AdminError::Store)?;
    tracing::info!(%route, %limit, %store_key, existed, "limit reset through the admin API");
    Ok(Json(
        json!({"reset": true, "existed": existed, "store_key": store_key}),
    ))
}

impl Admin {
    /// Checks the token, then finds the limit and the store key for `key`.
    fn locate(
        &self,
        headers: &HeaderMap,
        route: &str,
        limit: &str,
        key: Option<&str>,
    ) -> Result<(String, LimitSettings), AdminError> {
        self.authorize(headers)?;
        let key = key
            .filter(|k| !k.is_empty())
            .ok_or(AdminError::MissingKey)?;
        let limits = self
            .gateway
            .limit_set(route)
            .ok_or_else(|| AdminError::UnknownRoute(route.to_owned()))?;
        let (store_key, settings) = limits
            .key_for(limit, key)
            .ok_or_else(|| AdminError::UnknownLimit(limit.to_owned()))?;
        Ok((store_key, settings.clone()))
    }

    fn authorize(&self, headers: &HeaderMap) -> Result<(), AdminError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if presented.is_some_and(|p| constant_time_eq(p.as_bytes(), token.as_bytes())) {
            Ok(())
        } else {
            Err(AdminError::Unauthorized)
        }
    }
}

/// Compares without stopping at the first difference, so response times do not reveal the token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, code, detail) = match self {
            AdminError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Authorization: Bearer <admin.token>".to_owned(),
            ),
            AdminError::MissingKey => (
                StatusCode::BAD_REQUEST,
                "missing_key",
                "give the key value as ?key=VALUE".to_owned(),
            ),
            AdminError::UnknownRoute(route) => (StatusCode::NOT_FOUND, "unknown_route", route),
            AdminError::UnknownLimit(limit) => (StatusCode::NOT_FOUND, "unknown_limit", limit),
            AdminError::Store(error) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                error.to_string(),
            ),
        };
        let mut response = (status, Json(json!({"error": code, "detail": detail}))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
