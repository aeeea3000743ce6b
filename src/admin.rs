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
use sha2::{Digest, Sha256};

use crate::admission::LimitSettings;
use crate::config::AdminSettings;
use crate::gateway::Gateway;
use crate::limiter::store::{LimitCheck, StoreError};
use crate::limiter::Backend;

/// The admin API's routes. With a `token`, `/limits/...` requires `Authorization: Bearer <token>`; health,
/// readiness and metrics stay open for probes and scrapers. `/readyz` answers 200 while degraded.
pub fn router(gateway: Arc<Gateway>, token: Option<String>) -> Router {
    build(gateway, token, StatusCode::OK)
}

/// The admin API as `settings` say: [`router`] with their token, and their `readyz_degraded_status`.
pub fn router_for(gateway: Arc<Gateway>, settings: &AdminSettings) -> Router {
    let degraded = StatusCode::from_u16(settings.readyz_degraded_status).unwrap_or(StatusCode::OK);
    build(gateway, settings.token.clone(), degraded)
}

fn build(gateway: Arc<Gateway>, token: Option<String>, degraded_status: StatusCode) -> Router {
    let state = Admin {
        gateway,
        token: token.map(|token| TokenDigest::of(&token)),
        degraded_status,
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
    /// The digest of `admin.token`: the token itself is not kept.
    token: Option<TokenDigest>,
    /// What `/readyz` answers while the store is degraded.
    degraded_status: StatusCode,
}

/// The SHA-256 digest of a token. Tokens are compared by their digests, which have one length whatever the
/// tokens' lengths, so neither a length nor a matching prefix can be told from the time a refusal takes.
// No `PartialEq`: `==` may stop at the first differing byte; `matches` does not.
#[derive(Clone, Copy)]
struct TokenDigest([u8; 32]);

#[derive(Debug, Deserialize)]
struct KeyQuery {
    key: Option<String>,
}

/// The truth about the store (design §8): `"status": "ready"` only once a limiter call has succeeded and while they
/// keep succeeding; otherwise `"degraded"` with the `reason` (Redis's own words where it gave any) and the
/// `on_error` policy that answers meanwhile (under `deny` limited requests then get 503). `warnings` name what puts
/// limits at risk although calls succeed. 200 either way (the gateway still serves) unless
/// `admin.readyz_degraded_status` says otherwise for degraded.
async fn readyz(State(admin): State<Admin>) -> impl IntoResponse {
    let limiter = admin.gateway.limiter();
    let store = match limiter.backend() {
        Backend::Memory => "memory",
        Backend::Redis(_) => "redis",
    };
    let readiness = limiter.readiness();
    let mut body = json!({
        "status": if readiness.ready { "ready" } else { "degraded" },
        "store": store,
        "fallback_active": limiter.fallback_active(),
        "on_error": limiter.on_error().to_string(),
    });
    if let Some(reason) = readiness.reason {
        body["reason"] = json!(reason);
    }
    if !readiness.warnings.is_empty() {
        body["warnings"] = json!(readiness.warnings);
    }
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        admin.degraded_status
    };
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
        if presented.is_some_and(|p| token.matches(&TokenDigest::of(p))) {
            Ok(())
        } else {
            Err(AdminError::Unauthorized)
        }
    }
}

// === impl TokenDigest ===

impl TokenDigest {
    fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Compares all 32 bytes whatever differs, with no early return: the time taken says nothing of where the
    /// digests differ (and a digest's differences say nothing of the token's).
    fn matches(&self, presented: &Self) -> bool {
        let difference = self
            .0
            .iter()
            .zip(&presented.0)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(difference) == 0
    }
}

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(..)")
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_by_digest_whatever_their_lengths() {
        let token = TokenDigest::of("s3cret-token");
        assert!(token.matches(&TokenDigest::of("s3cret-token")));
        for wrong in [
            "",
            "s",
            "s3cret",
            "s3cret-toke",
            "s3cret-tokenX",
            "S3cret-token",
            "s3cret-token\0",
        ] {
            assert!(!token.matches(&TokenDigest::of(wrong)), "{wrong:?}");
        }
        // Digests of one length for tokens of any length: nothing to stop early on.
        assert_eq!(
            TokenDigest::of("").0.len(),
            TokenDigest::of(&"x".repeat(1000)).0.len()
        );
        assert_eq!(format!("{token:?}"), "TokenDigest(..)");
    }
}
