//! `GET /upstreams`: each upstream's targets and their passive health (up, skipped and until when, the last
//! failure), behind the admin token.

use std::time::UNIX_EPOCH;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::{Admin, AdminError};
use crate::proxy::HealthView;

/// `GET /upstreams`.
pub(super) async fn upstreams(
    State(admin): State<Admin>,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    admin.authorize(&headers)?;
    Ok(Json(json!({ "upstreams": health(&admin) })))
}

/// Each upstream with its targets' health, as `/upstreams` and `/stats` show it.
pub(super) fn health(admin: &Admin) -> Vec<Value> {
    admin
        .gateway
        .upstreams()
        .iter()
        .map(|upstream| {
            let targets: Vec<Value> = upstream
                .health()
                .into_iter()
                .map(|(target, view)| target_json(target, &view))
                .collect();
            json!({ "name": upstream.name(), "targets": targets })
        })
        .collect()
}

/// Brings `tollgate_upstream_target_up` up to date before a scrape: a target's skip ends when its `fail_timeout`
/// passes, with no request needed to notice.
pub(super) fn refresh_gauges(admin: &Admin) {
    for upstream in admin.gateway.upstreams() {
        drop(upstream.health());
    }
}

fn target_json(target: &str, view: &HealthView) -> Value {
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    json!({
        "target": target,
        "state": view.state,
        "up": view.down_for.is_none(),
        "fails": view.fails,
        "down_for_ms": view.down_for.map(millis),
        "down_until_unix_ms": view
            .down_until
            .and_then(|until| until.duration_since(UNIX_EPOCH).ok())
            .map(millis),
        "last_failure": view.last_failure.map(|(failure, ago)| json!({
            "reason": failure.as_str(),
            "ago_ms": millis(ago),
        })),
    })
}
