//! `GET /top?route=R&limit=L&n=20`: the heaviest keys of one limit over the last minute and the last five, as this
//! instance counted them; and the few of every limit that `/stats` shows.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Admin, AdminError};
use crate::admission::LimitSettings;
use crate::top_keys::{self, LimitTop, Window, COUNTERS, WATCH};

/// Keys per limit when `n` is not given.
const DEFAULT_N: usize = 20;
/// Keys per limit in `/stats`.
const STATS_N: usize = 5;
/// Consumers nearest their plan's limits in `/stats`, all plans together.
const NEAREST_N: usize = 10;

#[derive(Debug, Deserialize)]
pub(super) struct TopQuery {
    route: Option<String>,
    limit: Option<String>,
    /// As text, so that a bad one is this API's 400 and not the extractor's.
    n: Option<String>,
}

/// `GET /top` (behind the admin token).
pub(super) async fn top(
    State(admin): State<Admin>,
    Query(query): Query<TopQuery>,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    admin.authorize(&headers)?;
    let wanted = |given: Option<String>, name: &str| {
        given.filter(|text| !text.is_empty()).ok_or_else(|| {
            AdminError::BadRequest(
                "missing_parameter",
                format!("give the {name} as ?{name}=NAME"),
            )
        })
    };
    let route = wanted(query.route, "route")?;
    let limit = wanted(query.limit, "limit")?;
    let n = keys_wanted(query.n.as_deref())?;
    let now_ms = top_keys::now_ms();
    WATCH.look(now_ms);
    let (mut limits, mut shown) = (None::<Vec<String>>, None);
    admin.gateway.visit_tops(|at, settings, top| {
        if at != route {
            return;
        }
        let name = settings.limit.name();
        if name == limit {
            shown = Some(limit_top(at, settings, top, now_ms, n));
        }
        limits.get_or_insert_with(Vec::new).push(name.to_owned());
    });
    match (shown, limits) {
        (Some(shown), _) => Ok(Json(shown)),
        (None, Some(limits)) => Err(AdminError::NotFound(
            "unknown_limit",
            format!(
                "route {route:?} has no limit named {limit:?}; its limits: {}",
                limits.join(", ")
            ),
        )),
        (None, None) => Err(AdminError::NotFound(
            "unknown_route",
            format!("no route named {route:?} has limits in the running config"),
        )),
    }
}

/// The few heaviest keys of every limit that counted a request in the last five minutes, for `/stats`; someone
/// looks from now on.
pub(super) fn for_stats(admin: &Admin) -> Value {
    let now_ms = top_keys::now_ms();
    WATCH.look(now_ms);
    let mut all = Vec::new();
    admin.gateway.visit_tops(|route, settings, top| {
        let shown = limit_top(route, settings, top, now_ms, STATS_N);
        if shown["five_minutes"]["events"] != 0 {
            all.push(shown);
        }
    });
    Value::Array(all)
}

/// The consumers nearest their plan's limits in the last minute, of every route, the largest share first: each
/// (limit, consumer) once, at its largest share.
pub(super) fn nearest_for_stats(admin: &Admin) -> Value {
    let now_ms = top_keys::now_ms();
    let mut all: Vec<(f64, Value)> = Vec::new();
    admin.gateway.visit_tops(|route, settings, top| {
        for near in top.nearest(now_ms) {
            let shown = json!({
                "route": route,
                "limit": settings.limit.name(),
                "key": near.key,
                "digests": settings.key.is_secret(),
                "used": near.used,
                "capacity": near.capacity,
                "share": near.share(),
                "at_ms": near.at_ms,
            });
            all.push((near.share(), shown));
        }
    });
    all.sort_by(|(a, _), (b, _)| b.total_cmp(a));
    let mut seen = std::collections::HashSet::new();
    let nearest: Vec<Value> = all
        .into_iter()
        .map(|(_, shown)| shown)
        .filter(|shown| seen.insert(format!("{}\0{}", shown["limit"], shown["key"])))
        .take(NEAREST_N)
        .collect();
    Value::Array(nearest)
}

/// `n`: 1 to the counters a limit keeps.
fn keys_wanted(n: Option<&str>) -> Result<usize, AdminError> {
    let Some(text) = n else {
        return Ok(DEFAULT_N);
    };
    match text.parse::<usize>() {
        Ok(n) if (1..=COUNTERS).contains(&n) => Ok(n),
        _ => Err(AdminError::BadRequest(
            "bad_n",
            format!("n is a number of keys from 1 to {COUNTERS}, not {text:?}"),
        )),
    }
}

/// One limit's `n` heaviest keys at `now_ms`, with what the reader needs to read them.
fn limit_top(
    route: &str,
    settings: &LimitSettings,
    top: &LimitTop,
    now_ms: i64,
    n: usize,
) -> Value {
    let seen = top.top(now_ms, n);
    json!({
        "route": route,
        "limit": settings.limit.name(),
        "key": settings.key.to_string(),
        // The key's values are credentials or made from one: shown as their SHA-256, as the store holds them.
        "digests": settings.key.is_secret(),
        "shadow": settings.limit.is_shadow(),
        "counters": COUNTERS,
        "admissions_counted_since_ms": WATCH.since_ms(),
        "one_minute": window(&seen.one_minute),
        "five_minutes": window(&seen.five_minutes),
    })
}

fn window(window: &Window) -> Value {
    let keys: Vec<Value> = window
        .keys
        .iter()
        .map(|(key, counts)| {
            json!({
                "key": key,
                "admitted": counts.admitted,
                "denied": counts.denied,
                "error": counts.error,
            })
        })
        .collect();
    json!({"events": window.events, "keys": keys})
}
