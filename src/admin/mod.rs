//! The admin listener: liveness, readiness and metrics (open), live stats, each limit's top keys, the state of one
//! limit for one key, the upstream targets' health and the consumers' runtime settings (behind a bearer token).

mod consumers;
mod dashboard;
mod health;
mod limits;
mod stats;
mod top;
mod upstreams;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::AdminSettings;
use crate::consumers::directory::DirectoryError;
use crate::gateway::Gateway;
use crate::limiter::store::StoreError;

/// The admin API's routes. With a `token`, `/limits/...`, `/upstreams`, `/stats`, `/top` and `/consumers/...` require
/// `Authorization: Bearer <token>`; health, readiness and metrics stay open for probes and scrapers. `/readyz`
/// answers 200 while degraded.
///
/// Audit lines name the admin client's address when the router is served with
/// `into_make_service_with_connect_info::<SocketAddr>()`, as the gateway does.
pub fn router(gateway: Arc<Gateway>, token: Option<String>) -> Router {
    build(gateway, token, StatusCode::OK)
}

/// The admin API as `settings` say: [`router`] with their token, and their `readyz_degraded_status`.
pub fn router_for(gateway: Arc<Gateway>, settings: &AdminSettings) -> Router {
    let degraded = StatusCode::from_u16(settings.readyz_degraded_status).unwrap_or(StatusCode::OK);
    build(gateway, settings.token.clone(), degraded)
}

/// The largest `POST /consumers:import` body: a million consumers with a key each is about 250 MB.
const IMPORT_MAX_BYTES: usize = 1 << 30;

fn build(gateway: Arc<Gateway>, token: Option<String>, degraded_status: StatusCode) -> Router {
    let state = Admin {
        gateway,
        token: token.map(|token| TokenDigest::of(&token)),
        degraded_status,
        stats: Arc::default(),
    };
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/stats", get(stats::stats))
        .route("/upstreams", get(upstreams::upstreams))
        .route("/top", get(top::top))
        .route("/dashboard", get(dashboard::page))
        .route(
            "/limits/{route}/{limit}",
            get(limits::peek_limit).delete(limits::reset_limit),
        )
        .route(
            "/consumers/{id}",
            get(consumers::show)
                .put(consumers::put)
                .delete(consumers::remove),
        )
        .route("/consumers", get(consumers::list))
        .route("/consumers/{id}/record", put(consumers::restore))
        .route(
            "/consumers/{id}/limits/{limit}",
            get(consumers::show_limit).delete(consumers::reset_limit),
        )
        .route(
            "/consumers:import",
            post(consumers::import).layer(DefaultBodyLimit::max(IMPORT_MAX_BYTES)),
        )
        .route("/consumers/{id}/keys", post(consumers::add_key))
        .route(
            "/consumers/{id}/keys/{key_id}",
            delete(consumers::revoke_key),
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
    /// `/stats`'s samples.
    stats: Arc<stats::Stats>,
}

/// The SHA-256 digest of a token. Tokens are compared by their digests, which have one length whatever the
/// tokens' lengths, so neither a length nor a matching prefix can be told from the time a refusal takes.
// No `PartialEq`: `==` may stop at the first differing byte; `matches` does not.
#[derive(Clone, Copy)]
struct TokenDigest([u8; 32]);

/// Who made an admin call, for audit lines: the client's address, when the listener records it.
#[derive(Debug)]
struct Who(String);

/// Why an admin request failed; mapped to its HTTP answer in one place.
#[derive(Debug)]
enum AdminError {
    Unauthorized,
    MissingKey,
    UnknownRoute(String),
    UnknownLimit(String),
    Store(StoreError),
    /// The request is malformed: a bad consumer id or body, an unknown plan or plan limit, an override that
    /// does not fit (400, with its error code).
    BadRequest(&'static str, String),
    /// Nothing by that name (404, with its error code).
    NotFound(&'static str, String),
    /// The running config has no `consumers:` block.
    NoConsumers,
    Directory(DirectoryError),
}

// === impl Admin ===

impl Admin {
    /// The state of `limit` under `key`, consuming nothing.
    async fn peek(
        &self,
        key: &str,
        limit: &crate::limiter::Limit,
    ) -> Result<crate::limiter::Decision, AdminError> {
        let check = crate::limiter::store::LimitCheck { key, limit };
        self.gateway
            .limiter()
            .peek(check)
            .await
            .map_err(AdminError::Store)
    }

    /// Forgets the state under `key`; whether there was one.
    async fn reset(&self, key: &str) -> Result<bool, AdminError> {
        let limiter = self.gateway.limiter();
        limiter.reset(key).await.map_err(AdminError::Store)
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

// === impl Who ===

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let address = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(
                || "unknown".to_owned(),
                |ConnectInfo(peer)| peer.to_string(),
            );
        Ok(Self(address))
    }
}

// === impl AdminError ===

impl From<DirectoryError> for AdminError {
    fn from(error: DirectoryError) -> Self {
        Self::Directory(error)
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
            AdminError::BadRequest(code, detail) => (StatusCode::BAD_REQUEST, code, detail),
            AdminError::NotFound(code, detail) => (StatusCode::NOT_FOUND, code, detail),
            AdminError::NoConsumers => (
                StatusCode::NOT_FOUND,
                "consumers_not_configured",
                "the running config has no consumers: block".to_owned(),
            ),
            AdminError::Directory(error) => {
                let (status, code) = match &error {
                    // The gateway always has the Redis store: `NoRedis` is a library build's.
                    DirectoryError::Unavailable(_) | DirectoryError::NoRedis => {
                        (StatusCode::SERVICE_UNAVAILABLE, "directory_unavailable")
                    }
                    DirectoryError::Unreadable { .. } => {
                        (StatusCode::CONFLICT, "unreadable_record")
                    }
                    DirectoryError::Contended(_) => (StatusCode::CONFLICT, "contended"),
                    DirectoryError::Random(_) => {
                        (StatusCode::INTERNAL_SERVER_ERROR, "no_randomness")
                    }
                };
                (status, code, error.to_string())
            }
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
