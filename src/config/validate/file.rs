//! The whole file: each section validated in turn into a [`Config`], or every problem found.

use std::path::Path;

use super::admin::admin;
use super::checks::socket_addr;
use super::client_ip::client_ip;
use super::issues::{Issue, Issues};
use super::routes::routes;
use super::secrets::secret_api_keys;
use super::server::server;
use super::store::store;
use super::upstreams::upstreams;
use crate::config::model::*;
use crate::config::raw::*;

/// Who reads a config file, which decides what a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reader {
    /// The gateway: every route forwards or answers.
    Gateway,
    /// Tower layers: a route may be limits only, since the layer limits whatever service it wraps.
    Layers,
}

/// Validates a whole file. `source` is recorded in the config for messages and reloads.
pub(crate) fn validate(
    raw: RawConfig,
    source: &Path,
    reader: Reader,
) -> Result<Config, Vec<Issue>> {
    let mut issues = Issues::default();
    let listen = socket_addr(&mut issues, "listen", &raw.listen);
    let admin = admin(&mut issues, &raw.admin);
    let store = store(&mut issues, &raw.store);
    let client_ip = client_ip(&mut issues, &raw.client_ip);
    let server = server(&mut issues, &raw.server);
    // Relative file names in the config (certificates) are relative to its folder.
    let folder = source.parent().unwrap_or(Path::new(""));
    let upstreams = upstreams(&mut issues, &raw.upstreams, folder);
    let consumers = raw
        .consumers
        .as_ref()
        .and_then(|block| crate::config::consumers::consumers(&mut issues, block, folder));
    let routes = routes(
        &mut issues,
        &raw.routes,
        &raw.upstreams,
        raw.consumers.is_some(),
        reader,
    );
    let rls = raw
        .rls
        .as_ref()
        .and_then(|block| crate::config::rls::rls(&mut issues, block, folder));
    let (Some(listen), Some(admin), Some(store), Some(client_ip), Some(server)) =
        (listen, admin, store, client_ip, server)
    else {
        return Err(issues.into_vec());
    };
    if store.backend == crate::limiter::BackendKind::Redis {
        slots_need_memory(&mut issues, &routes, consumers.as_ref());
    }
    if issues.count() > 0 {
        return Err(issues.into_vec());
    }
    let (mut routes, mut consumers) = (routes, consumers);
    secret_api_keys(&mut routes, consumers.as_mut());
    Ok(Config {
        source: source.to_owned(),
        listen,
        admin,
        store,
        client_ip,
        server,
        upstreams,
        routes,
        consumers,
        rls,
    })
}

/// Concurrency limits are kept by the in-process store only, for now: on Redis each would need a lease.
fn slots_need_memory(
    issues: &mut Issues,
    routes: &[crate::config::RouteSettings],
    consumers: Option<&crate::consumers::ConsumersSettings>,
) {
    let message = "concurrency limits need store.backend: memory for now";
    for (i, route) in routes.iter().enumerate() {
        for (j, settings) in route.limits.iter().enumerate() {
            if settings.limit.algorithm().holds_slots() {
                issues.add(format!("routes[{i}].limits[{j}].algorithm"), message);
            }
        }
    }
    for (name, plan) in consumers
        .iter()
        .flat_map(|c| c.plans.iter().map(|p| (&p.name, p)))
    {
        for (j, settings) in plan.limits.iter().enumerate() {
            if settings.limit.algorithm().holds_slots() {
                issues.add(
                    format!("consumers.plans.{name}.limits[{j}].algorithm"),
                    message,
                );
            }
        }
    }
}
