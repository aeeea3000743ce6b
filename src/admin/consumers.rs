//! The consumers' runtime settings (see docs/configuration.md, "Consumers and plans"): plan, per-limit overrides, blocked, API keys issued and revoked;
//! each change logged as an audit line (target `tollgate::audit`) with who made it, the record before and after.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{Admin, AdminError, Who};
use crate::config::consumer_id;
use crate::consumers::directory::{ConsumerRecord, Directory, LimitOverride};
use crate::consumers::{overridden, Consumers, Plan};
use crate::key::{KeyPart, RequestFacts};

/// The body of `PUT /consumers/{id}`: a record without its keys (issued with `POST .../keys`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct SettingsBody {
    plan: Option<String>,
    overrides: BTreeMap<String, LimitOverride>,
    blocked: bool,
}

/// One line of a `POST /consumers:import` body: a consumer and its whole record, keys included (as their
/// SHA-256 digests), as `GET /consumers` lists them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportLine {
    consumer: String,
    record: ConsumerRecord,
}

/// `GET /consumers/{id}?plan=NAME`: the plan whose limits to show when the consumer has no runtime plan (a
/// token's claim, say; a static key's plan is found without it).
#[derive(Debug, Deserialize)]
pub(super) struct PlanQuery {
    plan: Option<String>,
}

/// `GET /consumers?after=ID&limit=N`: a page of the listing.
#[derive(Debug, Deserialize)]
pub(super) struct PageQuery {
    after: Option<String>,
    limit: Option<usize>,
}

/// Records per page of `GET /consumers` unless `?limit=` says otherwise, and the most it may say.
const PAGE: usize = 100;
const MAX_PAGE: usize = 1_000;

/// A record as the admin API shows it: keys by id and issue time, without their digests.
#[derive(Debug, Serialize)]
struct Shown<'a> {
    plan: Option<&'a str>,
    overrides: &'a BTreeMap<String, LimitOverride>,
    blocked: bool,
    keys: Vec<ShownKey<'a>>,
}

#[derive(Debug, Serialize)]
struct ShownKey<'a> {
    id: &'a str,
    created_ms: u64,
}

/// `PUT /consumers/{id}`: sets the consumer's plan, overrides and blocked flag (its keys stay).
pub(super) async fn put(
    State(admin): State<Admin>,
    Path(id): Path<String>,
    Who(who): Who,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, AdminError> {
    let (consumers, directory) = admin.consumers(&headers, &id)?;
    let settings: SettingsBody = strict_body(&body).map_err(|error| {
        let hint = if error.to_string().contains("`keys`") {
            " (keys are issued with POST /consumers/{id}/keys)"
        } else {
            ""
        };
        AdminError::BadRequest("invalid_body", format!("{error}{hint}"))
    })?;
    let record = ConsumerRecord {
        plan: settings.plan,
        overrides: settings.overrides,
        blocked: settings.blocked,
        keys: Vec::new(),
    };
    consumers
        .check_record(&record)
        .map_err(|why| AdminError::BadRequest("invalid_settings", why))?;
    let before = directory.put(&id, record).await?;
    let after = directory.read(&id).await?;
    audit(&who, "consumer.put", &id, before.as_ref(), after.as_ref());
    Ok(Json(json!({
        "consumer": id,
        "created": before.is_none(),
        "settings": after.as_ref().map(shown),
    })))
}

/// `POST /consumers:import`: sets the whole records of many consumers at once, from a body of one JSON object per
/// line (NDJSON), each `{"consumer":…,"record":…}` as `GET /consumers` lists them. Every line is checked as
/// `PUT /consumers/{id}/record` checks its body before anything is set: one bad line is a 400 naming it, and
/// nothing changes.
pub(super) async fn import(
    State(admin): State<Admin>,
    Who(who): Who,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, AdminError> {
    admin.authorize(&headers)?;
    let consumers = admin.gateway.consumers().ok_or(AdminError::NoConsumers)?;
    let text = std::str::from_utf8(&body)
        .map_err(|error| AdminError::BadRequest("invalid_body", error.to_string()))?;
    let directory = consumers.directory();
    let mut records = Vec::new();
    // Each record's line, and each key's, for the errors found after every line is read.
    let mut lines = Vec::new();
    let mut keys = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let at = |number: usize, code: &'static str, why: String| {
        AdminError::BadRequest(code, format!("line {}: {why}", number + 1))
    };
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let at = |code: &'static str, why: String| at(number, code, why);
        let ImportLine { consumer, record } =
            strict_body(line.as_bytes()).map_err(|error| at("invalid_body", error))?;
        consumer_id(&consumer).map_err(|why| at("invalid_consumer_id", why))?;
        if !seen.insert(consumer.clone()) {
            return Err(at(
                "duplicate_consumer",
                format!("consumer {consumer:?} is on an earlier line too"),
            ));
        }
        consumers
            .check_record(&record)
            .map_err(|why| at("invalid_settings", why))?;
        check_keys(&record).map_err(|why| at("invalid_keys", why))?;
        keys.extend(record.key_digests().map(|digest| (digest, records.len())));
        lines.push(number);
        records.push((consumer, record));
    }
    // Asked of the store for all lines at once: a cache knows only some of the keys.
    let digests: Vec<[u8; 32]> = keys.iter().map(|(digest, _)| *digest).collect();
    let holders = directory.key_holders(&digests).await?;
    let mut key_owners = std::collections::HashMap::new();
    for ((digest, index), holder) in keys.iter().zip(holders) {
        let consumer = &records[*index].0;
        let held = holder.filter(|holder| **holder != **consumer);
        let owner = held.as_deref().or(key_owners
            .get(digest)
            .map(|&i: &usize| records[i].0.as_str()));
        if let Some(owner) = owner {
            return Err(at(
                lines[*index],
                "invalid_keys",
                format!("a key of this record is consumer {owner:?}'s"),
            ));
        }
        key_owners.insert(*digest, *index);
    }
    let imported = directory.import(records).await?;
    tracing::info!(
        target: "tollgate::audit",
        who,
        what = "consumer.import",
        consumers = imported,
        "consumer settings imported through the admin API"
    );
    Ok(Json(json!({ "imported": imported })))
}

/// `GET /consumers/{id}`: the runtime settings, the keys (ids and issue times), and the state of each limit of
/// the consumer's plan, consuming nothing.
pub(super) async fn show(
    State(admin): State<Admin>,
    Path(id): Path<String>,
    Query(query): Query<PlanQuery>,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    let (consumers, directory) = admin.consumers(&headers, &id)?;
    let record = directory.read(&id).await?;
    let plan_name = plan_of(&consumers, record.as_ref(), &id, query.plan);
    let plan = match &plan_name {
        Some(name) => Some(plan_named(&consumers, name)?),
        None => None,
    };
    let mut limits = Vec::new();
    if let Some(plan) = plan {
        for settings in &plan.limits {
            limits
                .push(limit_state(&admin, &consumers, record.as_ref(), &id, plan, settings).await?);
        }
    }
    Ok(Json(json!({
        "consumer": id,
        "settings": record.as_ref().map(shown),
        "plan": plan_name,
        "limits": limits,
    })))
}

/// `GET /consumers/{id}/limits/{limit}`: the state of one limit of the consumer's plan, with its override
/// applied, consuming nothing.
pub(super) async fn show_limit(
    State(admin): State<Admin>,
    Path((id, limit)): Path<(String, String)>,
    Query(query): Query<PlanQuery>,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    let (consumers, directory) = admin.consumers(&headers, &id)?;
    let record = directory.read(&id).await?;
    let (plan, settings) = plan_limit(&consumers, record.as_ref(), &id, query.plan, &limit)?;
    let state = limit_state(&admin, &consumers, record.as_ref(), &id, plan, settings).await?;
    Ok(Json(json!({
        "consumer": id,
        "plan": plan.name,
        "limit": state,
    })))
}

/// `DELETE /consumers/{id}/limits/{limit}`: forgets the consumer's state of one plan limit on every instance (as
/// `DELETE /limits/{route}/{limit}` does for a route limit), so its next request starts afresh.
pub(super) async fn reset_limit(
    State(admin): State<Admin>,
    Path((id, limit)): Path<(String, String)>,
    Query(query): Query<PlanQuery>,
    Who(who): Who,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    let (consumers, directory) = admin.consumers(&headers, &id)?;
    let record = directory.read(&id).await?;
    let (plan, settings) = plan_limit(&consumers, record.as_ref(), &id, query.plan, &limit)?;
    let Some(store_key) = consumer_key(&consumers, settings, &id, &plan.name) else {
        return Err(AdminError::BadRequest(
            "not_per_consumer",
            format!(
                "limit {limit:?} is keyed by {}: its state is per request, not per consumer",
                settings.key
            ),
        ));
    };
    let existed = admin.reset(&store_key).await?;
    tracing::info!(
        target: "tollgate::audit",
        who,
        what = "consumer.limit.reset",
        consumer = id,
        limit,
        %store_key,
        existed,
        "consumer limit reset through the admin API"
    );
    Ok(Json(json!({
        "consumer": id,
        "plan": plan.name,
        "limit": limit,
        "reset": true,
        "existed": existed,
        "store_key": store_key,
    })))
}

/// `GET /consumers?after=ID&limit=N`: every runtime record, whole (keys by id, digest and issue time, never the
/// keys themselves), in order of consumer id, a page at a time: what an operator keeps to re-seed a directory
/// that lost its data with `PUT /consumers/{id}/record`.
pub(super) async fn list(
    State(admin): State<Admin>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    admin.authorize(&headers)?;
    let consumers = admin.gateway.consumers().ok_or(AdminError::NoConsumers)?;
    let directory = consumers.directory();
    if let Some(capacity) = directory.cache_capacity() {
        // Only the most recently used are in memory: the listing is Redis's to give.
        return Err(AdminError::BadRequest(
            "listed_in_redis",
            format!(
                "this instance holds at most {capacity} consumers in memory (consumers.cache); list the directory \
                 from Redis (HSCAN of the records hash, docs/operations.md)"
            ),
        ));
    }
    let limit = query.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE);
    // One more than the page, to know whether another follows: a last page that is full says so with no `next`.
    let mut page = directory.records(query.after.as_deref(), limit + 1);
    let next = (page.len() > limit)
        .then(|| {
            page.truncate(limit);
            page.last().map(|(id, _)| id.to_string())
        })
        .flatten();
    let records: Vec<Value> = page
        .iter()
        .map(|(id, record)| json!({"consumer": &**id, "record": record}))
        .collect();
    Ok(Json(json!({
        "consumers": records,
        "total": directory.len(),
        "next": next,
        "synced": directory.synced(),
        "resets": directory.resets(),
    })))
}

/// `PUT /consumers/{id}/record`: replaces the consumer's whole record, keys included (their digests), as
/// `GET /consumers` lists it: re-seeds a directory from that listing. The keys' texts are never needed.
pub(super) async fn restore(
    State(admin): State<Admin>,
    Path(id): Path<String>,
    Who(who): Who,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, AdminError> {
    let (consumers, directory) = admin.consumers(&headers, &id)?;
    let record: ConsumerRecord =
        strict_body(&body).map_err(|error| AdminError::BadRequest("invalid_body", error))?;
    consumers
        .check_record(&record)
        .map_err(|why| AdminError::BadRequest("invalid_settings", why))?;
    check_keys(&record).map_err(|why| AdminError::BadRequest("invalid_keys", why))?;
    let digests: Vec<[u8; 32]> = record.key_digests().collect();
    for holder in directory.key_holders(&digests).await? {
        if let Some(owner) = holder.filter(|o| **o != *id) {
            return Err(AdminError::BadRequest(
                "invalid_keys",
                format!("a key of this record is consumer {owner:?}'s"),
            ));
        }
    }
    let before = directory.restore(&id, record).await?;
    let after = directory.read(&id).await?;
    audit(
        &who,
        "consumer.restore",
        &id,
        before.as_ref(),
        after.as_ref(),
    );
    Ok(Json(json!({
        "consumer": id,
        "created": before.is_none(),
        "settings": after.as_ref().map(shown),
    })))
}

/// The keys of a record to restore: ids present and unique, digests 64 hex digits.
fn check_keys(record: &ConsumerRecord) -> Result<(), String> {
    for (i, key) in record.keys.iter().enumerate() {
        if key.id.is_empty() || record.keys[..i].iter().any(|other| other.id == key.id) {
            return Err(format!("keys[{i}].id: empty or repeated ({:?})", key.id));
        }
        if crate::consumers::parse_hex_digest(&key.sha256).is_none() {
            return Err(format!(
                "keys[{i}].sha256: not 64 hex digits (the key's SHA-256 as GET /consumers lists it)"
            ));
        }
    }
    Ok(())
}

/// `DELETE /consumers/{id}`: removes the runtime settings and keys (back to the config and the credential).
pub(super) async fn remove(
    State(admin): State<Admin>,
    Path(id): Path<String>,
    Who(who): Who,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    let (_, directory) = admin.consumers(&headers, &id)?;
    let before = directory
        .delete(&id)
        .await?
        .ok_or_else(|| AdminError::NotFound("unknown_consumer", id.clone()))?;
    audit(&who, "consumer.delete", &id, Some(&before), None);
    Ok(Json(json!({"consumer": id, "deleted": true})))
}

/// `POST /consumers/{id}/keys`: issues a new API key; its text is in this answer only.
pub(super) async fn add_key(
    State(admin): State<Admin>,
    Path(id): Path<String>,
    Who(who): Who,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    let (_, directory) = admin.consumers(&headers, &id)?;
    let before = directory.read(&id).await?;
    let (key, text) = directory.add_key(&id).await?;
    let after = directory.read(&id).await?;
    audit(&who, "key.add", &id, before.as_ref(), after.as_ref());
    let body = json!({
        "consumer": id,
        "id": key.id,
        "key": text,
        "created_ms": key.created_ms,
    });
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    // The key is shown once: no cache may keep a copy.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `DELETE /consumers/{id}/keys/{key_id}`: revokes one key.
pub(super) async fn revoke_key(
    State(admin): State<Admin>,
    Path((id, key_id)): Path<(String, String)>,
    Who(who): Who,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    let (_, directory) = admin.consumers(&headers, &id)?;
    let before = directory.read(&id).await?;
    if !directory.revoke_key(&id, &key_id).await? {
        return Err(AdminError::NotFound("unknown_key", key_id));
    }
    let after = directory.read(&id).await?;
    audit(&who, "key.revoke", &id, before.as_ref(), after.as_ref());
    Ok(Json(json!({"consumer": id, "id": key_id, "revoked": true})))
}

/// An admin body read as `T`: a JSON object in which no member is named twice, at any depth (see
/// [`crate::consumers::json`]).
fn strict_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let value = crate::consumers::json::object(body)?;
    serde_json::from_value(value).map_err(|error| error.to_string())
}

impl Admin {
    /// Checks the token and the consumer id; the running config's consumers and their directory.
    fn consumers(
        &self,
        headers: &HeaderMap,
        id: &str,
    ) -> Result<(Arc<Consumers>, Arc<Directory>), AdminError> {
        self.authorize(headers)?;
        consumer_id(id).map_err(|why| AdminError::BadRequest("invalid_consumer_id", why))?;
        let consumers = self.gateway.consumers().ok_or(AdminError::NoConsumers)?;
        let directory = Arc::clone(consumers.directory());
        Ok((consumers, directory))
    }
}

/// The consumer's plan as requests find it: the runtime plan, then `asked` (a token's claim is known only to its
/// requests), then a static key's.
fn plan_of(
    consumers: &Consumers,
    record: Option<&ConsumerRecord>,
    id: &str,
    asked: Option<String>,
) -> Option<String> {
    record
        .and_then(|record| record.plan.clone())
        .or(asked)
        .or_else(|| consumers.configured_plan(id).map(str::to_owned))
}

/// The consumer's plan and its limit named `limit`: 404 when the consumer has no plan here or the plan no such
/// limit.
fn plan_limit<'c>(
    consumers: &'c Consumers,
    record: Option<&ConsumerRecord>,
    id: &str,
    asked: Option<String>,
    limit: &str,
) -> Result<(&'c Plan, &'c crate::admission::LimitSettings), AdminError> {
    let name = plan_of(consumers, record, id, asked).ok_or_else(|| {
        AdminError::NotFound(
            "no_plan",
            format!("{id} has no runtime or static plan; name the one to use with ?plan=NAME"),
        )
    })?;
    let plan = plan_named(consumers, &name)?;
    let settings = plan
        .limits
        .iter()
        .find(|settings| settings.limit.name() == limit)
        .ok_or_else(|| AdminError::UnknownLimit(limit.to_owned()))?;
    Ok((plan, settings))
}

fn plan_named<'c>(consumers: &'c Consumers, name: &str) -> Result<&'c Plan, AdminError> {
    consumers
        .plan_index(name)
        .and_then(|index| consumers.plans().get(index))
        .ok_or_else(|| AdminError::BadRequest("unknown_plan", name.to_owned()))
}

/// The state of one plan limit for the consumer, with its override applied, consuming nothing. A limit keyed by
/// more than the consumer and plan (`[consumer, ip]`) has a state per request, not per consumer: it is named, and
/// `GET /limits` is not the place either, so no state is shown.
async fn limit_state(
    admin: &Admin,
    consumers: &Consumers,
    record: Option<&ConsumerRecord>,
    id: &str,
    plan: &Plan,
    settings: &crate::admission::LimitSettings,
) -> Result<Value, AdminError> {
    let name = settings.limit.name();
    let overriding = record.and_then(|record| record.overrides.get(name));
    let (limit, overridden) = match overriding.map(|o| overridden(&settings.limit, o)) {
        Some(Ok(limit)) => (limit, true),
        // Written for another plan, or by hand: the request path cannot use it either.
        Some(Err(_)) | None => (settings.limit.clone(), false),
    };
    let Some(store_key) = consumer_key(consumers, settings, id, &plan.name) else {
        return Ok(json!({
            "name": name,
            "algorithm": limit.algorithm().name(),
            "keyed_by": settings.key.to_string(),
            "overridden": overridden,
        }));
    };
    let decision = admin.peek(&store_key, &limit).await?;
    let shown = json!({
        "name": name,
        "algorithm": limit.algorithm().name(),
        "counts": settings.counts.to_string(),
        "store_key": store_key,
        "overridden": overridden,
    });
    let now_ms = admin.gateway.limiter().local().now_ms();
    let shown = super::limits::with_window(shown, limit.algorithm(), now_ms);
    Ok(super::limits::with_state(shown, &decision))
}

/// The store key of a plan limit for consumer `id` on `plan`; `None` for a limit keyed by more than the consumer
/// and plan (`[consumer, ip]`), whose state is per request.
fn consumer_key(
    consumers: &Consumers,
    settings: &crate::admission::LimitSettings,
    id: &str,
    plan: &str,
) -> Option<String> {
    let per_consumer = settings
        .key
        .parts()
        .iter()
        .all(|part| matches!(part, KeyPart::Consumer | KeyPart::Plan));
    let value = per_consumer
        .then(|| key_value(settings, id, plan))
        .flatten()?;
    Some(consumers.plan_limit_key(settings.limit.name(), &value))
}

/// The key value a request of consumer `id` on `plan` gets for a limit keyed by consumer and plan parts only.
fn key_value(settings: &crate::admission::LimitSettings, id: &str, plan: &str) -> Option<String> {
    let headers = HeaderMap::new();
    let facts = RequestFacts {
        // Never read: the limit's parts are the consumer and the plan only.
        client_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        ipv6_prefix: 64,
        route: "",
        method: &Method::GET,
        path: "/",
        path_any_case: false,
        host: None,
        headers: &headers,
        query: None,
        consumer: Some(id),
        plan: Some(plan),
        client_cert: None,
    };
    settings.key.value(&facts).ok().flatten()
}

/// A record as shown: keys without digests.
fn shown(record: &ConsumerRecord) -> Shown<'_> {
    Shown {
        plan: record.plan.as_deref(),
        overrides: &record.overrides,
        blocked: record.blocked,
        keys: record
            .keys
            .iter()
            .map(|key| ShownKey {
                id: &key.id,
                created_ms: key.created_ms,
            })
            .collect(),
    }
}

/// One audit line per change: who (the admin client's address), what, the consumer, and the record before and
/// after as JSON (keys by id and digest: the key itself is never kept, so never logged).
fn audit(
    who: &str,
    what: &str,
    id: &str,
    before: Option<&ConsumerRecord>,
    after: Option<&ConsumerRecord>,
) {
    let json = |record: Option<&ConsumerRecord>| {
        record.map_or_else(
            || "null".to_owned(),
            |record| serde_json::to_string(record).unwrap_or_default(),
        )
    };
    tracing::info!(
        target: "tollgate::audit",
        who,
        what,
        consumer = id,
        before = %json(before),
        after = %json(after),
        "consumer settings changed through the admin API"
    );
}
