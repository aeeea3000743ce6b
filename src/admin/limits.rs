//! The state of one limit for one key: read without consuming, or reset.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Admin, AdminError};
use crate::admission::LimitSettings;
use crate::key::{push_client_key, KeyPart, KeySpec};
use crate::limiter::{Algorithm, Decision};

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
    let (store_key, settings, counted) =
        admin.locate(&headers, &route, &limit, query.key.as_deref())?;
    let decision = admin.peek(&store_key, &settings.limit).await?;
    if settings.limit.algorithm().holds_slots() {
        // Slots in flight, and which instance holds them (a crashed one's until its leases end): counted from what
        // the store holds, not from what `max` leaves, which a reload may have lowered below them.
        let limiter = admin.gateway.limiter();
        let holders = limiter
            .slot_holders(&store_key)
            .await
            .map_err(AdminError::Store)?;
        let held: u64 = holders.values().sum();
        return Ok(Json(json!({
            "route": route,
            "limit": limit,
            "key": query.key,
            "counted_key": counted,
            "store_key": store_key,
            "algorithm": settings.limit.algorithm().name(),
            "capacity": decision.limit,
            "remaining": decision.remaining,
            "would_admit": decision.allowed,
            "held": held,
            "holders": holders,
            "instance": limiter.instance(),
            // Requests of this instance waiting for a slot of the key (`queue:`).
            "waiting": limiter.slot_queues().waiting(&store_key),
        })));
    }
    let shown = json!({
        "route": route,
        "limit": limit,
        "key": query.key,
        "counted_key": counted,
        "store_key": store_key,
        "algorithm": settings.limit.algorithm().name(),
        "counts": settings.counts.to_string(),
    });
    let now_ms = admin.gateway.limiter().local().now_ms();
    let shown = with_window(shown, settings.limit.algorithm(), now_ms);
    Ok(Json(with_state(shown, &decision)))
}

/// `shown` (an object) with what `decision` says of the key's state, as every peek shows it.
pub(super) fn with_state(mut shown: Value, decision: &Decision) -> Value {
    if let Value::Object(fields) = &mut shown {
        fields.insert("capacity".into(), decision.limit.into());
        fields.insert("remaining".into(), decision.remaining.into());
        // Past the capacity while the key owes (answers that spent more than they reserved).
        fields.insert("used".into(), decision.used().into());
        fields.insert("owed".into(), decision.owed.into());
        fields.insert("would_admit".into(), decision.allowed.into());
        fields.insert("retry_after_ms".into(), decision.retry_after_ms.into());
        fields.insert("reset_after_ms".into(), decision.reset_after_ms.into());
    }
    shown
}

/// `shown` (an object) with the calendar window `now_ms` falls in, for a limit on a calendar: its unit and zone,
/// its start and end as the zone's local times and in ms since the epoch.
pub(super) fn with_window(mut shown: Value, algorithm: &Algorithm, now_ms: i64) -> Value {
    let (Some(calendar), Value::Object(fields)) = (algorithm.calendar(), &mut shown) else {
        return shown;
    };
    let window = calendar.window_at(now_ms);
    fields.insert(
        "window".into(),
        json!({
            "calendar": calendar.unit().name(),
            "timezone": calendar.timezone(),
            "start": calendar.local_time(window.start_ms),
            "end": calendar.local_time(window.end_ms),
            "start_ms": window.start_ms,
            "end_ms": window.end_ms,
        }),
    );
    shown
}

/// `DELETE /limits/{route}/{limit}?key=VALUE`: forgets that key's state, so its next request starts afresh.
pub(super) async fn reset_limit(
    State(admin): State<Admin>,
    Path((route, limit)): Path<(String, String)>,
    Query(query): Query<KeyQuery>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, AdminError> {
    let (store_key, _, _) = admin.locate(&headers, &route, &limit, query.key.as_deref())?;
    let existed = admin.reset(&store_key).await?;
    tracing::info!(%route, %limit, %store_key, existed, "limit reset through the admin API");
    Ok(Json(
        json!({"reset": true, "existed": existed, "store_key": store_key}),
    ))
}

impl Admin {
    /// Checks the token, then finds the limit, the key value requests with `key` are counted under (see
    /// [`counted_value`]) and its store key.
    fn locate(
        &self,
        headers: &HeaderMap,
        route: &str,
        limit: &str,
        key: Option<&str>,
    ) -> Result<(String, LimitSettings, String), AdminError> {
        self.authorize(headers)?;
        let key = key
            .filter(|k| !k.is_empty())
            .ok_or(AdminError::MissingKey)?;
        let limits = self
            .gateway
            .limit_set(route)
            .ok_or_else(|| AdminError::UnknownRoute(route.to_owned()))?;
        let settings = limits
            .limits()
            .find(|s| s.limit.name() == limit)
            .ok_or_else(|| AdminError::UnknownLimit(limit.to_owned()))?;
        let counted = counted_value(&settings.key, key, self.gateway.ipv6_prefix());
        let (store_key, settings) = limits
            .key_for(limit, &counted)
            .ok_or_else(|| AdminError::UnknownLimit(limit.to_owned()))?;
        Ok((store_key, settings.clone(), counted))
    }
}

/// The key value that requests `key` describes are counted under: a client address where the limit keys by `ip`
/// (the whole value, or its part at the place of `ip` in a composite key, parts joined by a `|` no `\` escapes),
/// or where an address stands for the client's own key (a one-part key the client writes, whose own values that
/// read as addresses are marked with a `\`), is taken to what the gateway counts, an IPv6 address to its
/// `client_ip.ipv6_prefix` network (`::1` → `::/64`). Anything else, and a network given as such, is the value as
/// written; the whole is digested where the key is secret.
fn counted_value(spec: &KeySpec, key: &str, ipv6_prefix: u8) -> String {
    let as_client = |text: &str, out: &mut String| match text.parse::<std::net::IpAddr>() {
        Ok(ip) => push_client_key(out, ip, ipv6_prefix),
        Err(_) => out.push_str(text),
    };
    let mut counted = String::with_capacity(key.len());
    let parts = spec.parts();
    let texts = key_parts(key);
    if texts.len() == parts.len() {
        for (i, (part, text)) in parts.iter().zip(texts).enumerate() {
            if i > 0 {
                counted.push('|');
            }
            match part {
                KeyPart::Ip => as_client(text, &mut counted),
                part if parts.len() == 1 && part.is_client_text() => as_client(text, &mut counted),
                _ => counted.push_str(text),
            }
        }
    } else {
        // Fewer parts than the limit's: the value a request missing one is counted under (`missing: ip`).
        as_client(key, &mut counted);
    }
    // A credential is looked up by what the store holds of it, its digest.
    spec.sealed(&counted)
}

/// The parts of a key value as requests build it: split at each `|` that no `\` escapes.
fn key_parts(key: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (at, c) in key.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '|' => {
                parts.push(&key[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&key[start..]);
    parts
}
