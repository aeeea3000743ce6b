//! What a config compiles into: matchers, upstream pools, the limiter; swapped atomically on reload.

use std::collections::HashMap;
use std::sync::Arc;

use crate::admission::{LimitSet, Policy, RouteUsage};
use crate::config::{Config, DirectResponse, RouteAction, RouteSettings};
use crate::consumers::directory::Directory;
use crate::consumers::Consumers;
use crate::key::ClientIpResolver;
use crate::proxy::{ClientFieldRules, Upstream};
use crate::routing::{Matcher, PathRules, RequestTarget, RouteIndex};
use crate::telemetry::RouteMetrics;

/// A compiled configuration.
#[derive(Debug)]
pub struct CompiledConfig {
    pub(super) routes: Vec<Route>,
    /// From [`INDEXED_ROUTES`] routes on, the index that finds a request's route among the few that could take it.
    index: Option<RouteIndex>,
    pub(super) client_ip: ClientIpResolver,
    /// `client_ip.forwarded`: whether the upstream gets a `Forwarded` field from tollgate.
    pub(super) write_forwarded: bool,
    /// Whether any route names CONNECT: otherwise it is refused (405) before routing.
    pub(super) routes_connect: bool,
    /// The series of requests no route matched.
    pub(super) unmatched: RouteMetrics,
    /// The `consumers:` block, compiled, when the config has one.
    pub(super) consumers: Option<Arc<Consumers>>,
    /// How paths are read (`server.escaped_slashes`).
    pub(super) path_rules: PathRules,
    /// Which client fields are dropped as a request arrives (`Connection`'s, names with `_`).
    pub(super) client_fields: ClientFieldRules,
    /// `server.health_path` and the status it answers while the store is not ready
    /// (`admin.readyz_degraded_status`).
    pub(super) health: Option<(String, http::StatusCode)>,
    /// `server.max_body_bytes`.
    pub(super) max_body_bytes: Option<u64>,
    /// Every upstream, in the config's order (routes hold them too): what `GET /upstreams` shows.
    pub(super) upstreams: Vec<Arc<Upstream>>,
}

/// From this many routes on they are found through an index; below, testing each in turn costs less than
/// looking the path up.
const INDEXED_ROUTES: usize = 8;

/// A compiled route.
#[derive(Debug)]
pub(super) struct Route {
    pub name: String,
    pub matcher: Matcher,
    pub action: Action,
    /// Its limits, allowlist and fields: what admission decides requests by.
    pub policy: Policy,
    pub metrics: RouteMetrics,
}

#[derive(Debug)]
pub(super) enum Action {
    Upstream(Arc<Upstream>),
    Respond(DirectResponse),
}

// === impl CompiledConfig ===

impl CompiledConfig {
    /// Compiles a validated config; `directory` holds the consumers' runtime settings when it has a `consumers:`
    /// block.
    pub fn new(config: &Config, directory: Option<&Arc<Directory>>) -> Self {
        let consumers = config.consumers.as_ref().map(|settings| {
            let directory = directory.cloned().unwrap_or_else(Directory::in_memory);
            Arc::new(Consumers::new(
                settings,
                &config.store.key_prefix,
                directory,
            ))
        });
        let upstreams: HashMap<&str, Arc<Upstream>> = config
            .upstreams
            .iter()
            .map(|u| (u.name.as_str(), Arc::new(Upstream::new(u))))
            .collect();
        let in_order = config
            .upstreams
            .iter()
            .filter_map(|u| upstreams.get(u.name.as_str()).cloned())
            .collect();
        let routes: Vec<Route> = config
            .routes
            .iter()
            .filter_map(|route| Route::new(route, config, &upstreams, consumers.as_ref()))
            .collect();
        let routes_connect = routes
            .iter()
            .any(|route: &Route| route.matcher.names_method(&http::Method::CONNECT));
        let client_fields = ClientFieldRules {
            keep_underscores: config.server.underscores_in_headers,
            protected: consumers
                .as_ref()
                .map(|c| {
                    let forward = c.forward();
                    [&forward.consumer, &forward.plan]
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
        };
        let index = (routes.len() >= INDEXED_ROUTES)
            .then(|| RouteIndex::new(routes.iter().map(|route| &route.matcher)));
        Self {
            routes,
            index,
            path_rules: PathRules {
                keep_escaped_slashes: config.server.keep_escaped_slashes,
            },
            client_fields,
            client_ip: ClientIpResolver::new(config.client_ip.trusted_proxies.clone())
                .with_ipv6_prefix(config.client_ip.ipv6_prefix)
                .with_header(config.client_ip.header),
            write_forwarded: config.client_ip.forwarded,
            routes_connect,
            unmatched: RouteMetrics::new("none"),
            consumers,
            health: config.server.health_path.clone().map(|path| {
                let degraded = http::StatusCode::from_u16(config.admin.readyz_degraded_status)
                    .unwrap_or(http::StatusCode::OK);
                (path, degraded)
            }),
            max_body_bytes: config.server.max_body_bytes,
            upstreams: in_order,
        }
    }

    /// Takes over, limit by limit, the top keys `before` (the config a reload replaces) gathered: of each limit
    /// (a plan's too) of a route of the same name, with the same name and the same key.
    pub(super) fn keep_top_keys_of(&self, before: &CompiledConfig) {
        for route in &self.routes {
            let Some(old) = before.routes.iter().find(|old| old.name == route.name) else {
                continue;
            };
            for (settings, top) in route.policy.tops() {
                let same = old.policy.tops().find(|(was, _)| {
                    was.limit.name() == settings.limit.name() && was.key == settings.key
                });
                if let Some((_, before)) = same {
                    top.take_from(before);
                }
            }
        }
    }

    pub(super) fn route_for(&self, target: &RequestTarget<'_>) -> Option<&Route> {
        match &self.index {
            Some(index) => index
                .first_match(target, |i| self.routes[i].matcher.matches(target))
                .map(|i| &self.routes[i]),
            None => self.routes.iter().find(|r| r.matcher.matches(target)),
        }
    }
}

// === impl Route ===

impl Route {
    /// The route `route` of `config`, with its upstream among `upstreams` and the config's `consumers`; `None` for
    /// a route of a file for layers only (nothing to serve).
    fn new(
        route: &RouteSettings,
        config: &Config,
        upstreams: &HashMap<&str, Arc<Upstream>>,
        consumers: Option<&Arc<Consumers>>,
    ) -> Option<Self> {
        let action = match &route.action {
            // Validation guarantees the upstream exists.
            RouteAction::Upstream(name) => {
                Action::Upstream(Arc::clone(upstreams.get(name.as_str())?))
            }
            RouteAction::Respond(direct) => Action::Respond(direct.clone()),
            // A file for layers only: nothing to serve.
            RouteAction::LimitsOnly => return None,
        };
        let mut policy = Policy::new(
            LimitSet::new(
                &route.name,
                &config.store.key_prefix,
                route.limits.clone(),
                route.deny_status,
            ),
            route.allow.clone(),
            route.headers,
        )
        .with_ipv6_prefix(config.client_ip.ipv6_prefix)
        .matching_paths_in_any_case(!route.matcher.case_sensitive);
        if let Some(usage) = &route.usage {
            let usage = RouteUsage::new(&route.name, usage.clone());
            policy = policy.with_usage(Arc::new(usage));
        }
        if let Some(consumers) = consumers {
            policy = policy.with_consumers(
                route.consumers,
                Arc::clone(consumers),
                &config.store.key_prefix,
            );
        }
        Some(Route {
            name: route.name.clone(),
            matcher: Matcher::new(&route.matcher),
            action,
            policy,
            metrics: RouteMetrics::new(&route.name),
        })
    }
}
