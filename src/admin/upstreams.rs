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

/// Writes `tollgate_upstream_target_up` in the Prometheus text format: a series for each target of the running
/// config's upstreams, read as the scrape asks (a target's skip ends when its `fail_timeout` passes, with no request
/// needed to notice). Written here, not kept in the exporter, so that a target a reload removed leaves no series
/// behind: a last 0 kept for it would hold its alert firing until a restart.
pub(super) fn render_target_up(admin: &Admin, out: &mut String) {
    use std::fmt::Write;
    const NAME: &str = "tollgate_upstream_target_up";
    let upstreams = admin.gateway.upstreams();
    if upstreams.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP {NAME} 1 while an upstream target is tried, 0 while it is skipped after failing (health: \
         max_fails, fail_timeout).\n# TYPE {NAME} gauge"
    );
    for upstream in &upstreams {
        for (target, view) in upstream.health() {
            let _ = writeln!(
                out,
                "{NAME}{{upstream=\"{}\",target=\"{}\"}} {}",
                crate::telemetry::label_value(upstream.name()),
                crate::telemetry::label_value(target),
                u8::from(view.down_for.is_none()),
            );
        }
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
