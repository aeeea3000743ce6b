//! The state of one limit for one key: read without consuming, or reset.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::{Admin, AdminError};
use crate::admission::LimitSettings;

#[derive(Debug, Deserialize)]
pub(super) struct KeyQuery {
    key: Option<String>,
}

/// `GET /limits/{route}/{limit}?key=VALUE`: the state of that limit for that key, consuming nothing.
pub(super) async fn peek_limit(
    State(admin): State<Admin>,
    Path((route, limit)): Path<(String, String)>,
    Query(query): Query<KeyQuery>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, AdminError> {
    let (store_key, settings) = admin.locate(&headers, &route, &limit, query.key.as_deref())?;
    let decision = admin.peek(&store_key, &settings.limit).await?;
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
pub(super) async fn reset_limit(
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
}
