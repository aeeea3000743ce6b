//! The whole file: each section validated in turn into a [`Config`], or every problem found.

use std::net::SocketAddr;
use std::path::Path;

use super::admin::admin;
use super::checks::socket_addr;
use super::client_cert::client_cert_needs_client_ca;
use super::client_ip::client_ip;
use super::issues::{Issue, Issues};
use super::routes::routes;
use super::server::server;
use super::store::store;
use super::upstreams::upstreams;
use crate::config::model::*;
use crate::config::raw::*;
use crate::config::secrets::secret_api_keys;

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
    // Clear-text HTTP on 0.0.0.0:8080 unless the file says otherwise, or serves HTTPS alone.
    let listen = match (&raw.listen, &raw.tls) {
        (Some(listen), _) => socket_addr(&mut issues, "listen", listen).map(Some),
        (None, None) => Some(Some(SocketAddr::from(([0, 0, 0, 0], 8080)))),
        (None, Some(_)) => Some(None),
    };
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
    let tls = raw
        .tls
        .as_ref()
        .and_then(|block| crate::config::tls::tls(&mut issues, block, folder));
    let telemetry = crate::config::telemetry::telemetry(&mut issues, &raw.telemetry, folder);
    client_cert_needs_client_ca(&mut issues, &raw);
    let (Some(listen), Some(admin), Some(store), Some(client_ip), Some(server)) =
        (listen, admin, store, client_ip, server)
    else {
        return Err(issues.into_vec());
    };
    if consumers.as_ref().is_some_and(|c| c.cache.is_some()) && store.backend != BackendKind::Redis
    {
        issues.add(
            "consumers.cache",
            "only with store.backend: redis (the in-process directory holds every consumer it has)",
        );
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
        tls,
        telemetry,
    })
}
