//! A test config written in Rust: the store, upstreams and routes a test names, the YAML skeleton written once.
//!
//! ```ignore
//! let yaml = ConfigBuilder::new()
//!     .store(redis.as_ref())
//!     .upstream("backend", &upstream.url())
//!     .route("api", "/api")
//!     .to("backend")
//!     .limit("per-ip", "ip", "algorithm: sliding_log, limit: 3, period: 1m")
//!     .build();
//! ```
//! Tests about the YAML text itself (located errors, the docs' examples) keep writing it by hand.

use std::fmt::Write;

use tollgate::config::Config;

use super::redis::RedisServer;

/// A config under construction; [`build`](Self::build) writes its YAML. Route settings (`to`, `respond`, `limit`,
/// `route_yaml`) apply to the last route added.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    store: String,
    top: String,
    upstreams: String,
    routes: Vec<Route>,
}

#[derive(Debug, Clone)]
struct Route {
    name: String,
    /// The `match:` mapping's entries (`path_prefix: /api`).
    matcher: String,
    /// `upstream: NAME` or `respond: {...}`.
    target: String,
    /// Further route fields, each line indented by four spaces.
    extra: String,
    /// List items, each line indented by six spaces.
    limits: String,
}

// === impl ConfigBuilder ===

impl Default for ConfigBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigBuilder {
    /// No routes, on the in-process store.
    pub fn new() -> Self {
        Self {
            store: super::store_yaml(None),
            top: String::new(),
            upstreams: String::new(),
            routes: Vec::new(),
        }
    }

    /// On `redis` ([`store_yaml`](super::store_yaml)'s settings), or in memory when `None`.
    pub fn store(mut self, redis: Option<&RedisServer>) -> Self {
        self.store = super::store_yaml(redis);
        self
    }

    /// The `store:` entries as written (each indented by two spaces).
    pub fn store_yaml(mut self, entries: &str) -> Self {
        self.store = entries.to_owned();
        self
    }

    /// An admin listener on a free port.
    pub fn admin(self) -> Self {
        self.top("admin:\n  listen: 127.0.0.1:0\n")
    }

    /// A top-level block as written (`server:`, `client_ip:`, `consumers:`...), ending with a newline.
    pub fn top(mut self, block: &str) -> Self {
        self.top.push_str(block);
        self
    }

    /// An upstream `name` with one target, `url`.
    pub fn upstream(mut self, name: &str, url: &str) -> Self {
        let _ = writeln!(self.upstreams, "  {name}: {{ targets: [\"{url}\"] }}");
        self
    }

    /// An upstream `name` with one target, `url`, and `settings` as a flow mapping's entries (`timeout: 1s`).
    pub fn upstream_with(mut self, name: &str, url: &str, settings: &str) -> Self {
        let _ = writeln!(
            self.upstreams,
            "  {name}: {{ targets: [\"{url}\"], {settings} }}"
        );
        self
    }

    /// A route `name` matching the path prefix `prefix`; it answers 200 itself until [`to`](Self::to) names an
    /// upstream.
    pub fn route(self, name: &str, prefix: &str) -> Self {
        self.route_matching(name, &format!("path_prefix: {prefix}"))
    }

    /// A route `name` matching the path `path` alone (`match: { path: ... }`).
    pub fn route_at(self, name: &str, path: &str) -> Self {
        self.route_matching(name, &format!("path: {path}"))
    }

    /// A route `name` whose `match:` mapping has `entries` as written.
    pub fn route_matching(mut self, name: &str, entries: &str) -> Self {
        self.routes.push(Route {
            name: name.to_owned(),
            matcher: entries.to_owned(),
            target: "respond: { status: 200 }".to_owned(),
            extra: String::new(),
            limits: String::new(),
        });
        self
    }

    /// The last route forwards to the upstream `upstream`.
    pub fn to(mut self, upstream: &str) -> Self {
        self.last().target = format!("upstream: {upstream}");
        self
    }

    /// The last route answers `status` with `body` itself.
    pub fn respond(mut self, status: u16, body: &str) -> Self {
        self.last().target = format!("respond: {{ status: {status}, body: \"{body}\" }}");
        self
    }

    /// A limit of the last route: `name` keyed by `key`, with `params` as a flow mapping's entries
    /// (`algorithm: fixed_window, limit: 5, period: 1h`).
    pub fn limit(mut self, name: &str, key: &str, params: &str) -> Self {
        let _ = writeln!(
            self.last().limits,
            "      - {{ name: {name}, key: {key}, {params} }}"
        );
        self
    }

    /// Limits of the last route as written: list items indented by six spaces.
    pub fn limits_yaml(mut self, items: &str) -> Self {
        self.last().limits.push_str(items);
        self
    }

    /// Further fields of the last route as written (`usage:`, `consumers: required`...), indented by four spaces.
    pub fn route_yaml(mut self, fields: &str) -> Self {
        self.last().extra.push_str(fields);
        self
    }

    /// The config's YAML.
    pub fn build(&self) -> String {
        let mut yaml = format!("listen: 127.0.0.1:0\nstore:\n{}{}", self.store, self.top);
        if !self.upstreams.is_empty() {
            let _ = write!(yaml, "upstreams:\n{}", self.upstreams);
        }
        yaml.push_str("routes:\n");
        for route in &self.routes {
            let _ = write!(
                yaml,
                "  - name: {}\n    match: {{ {} }}\n    {}\n{}",
                route.name, route.matcher, route.target, route.extra
            );
            if !route.limits.is_empty() {
                let _ = write!(yaml, "    limits:\n{}", route.limits);
            }
        }
        yaml
    }

    /// The config, parsed (panicking with the located errors if it is invalid).
    pub fn config(&self) -> Config {
        super::config(&self.build())
    }

    fn last(&mut self) -> &mut Route {
        self.routes
            .last_mut()
            .expect("a route setting comes after .route()")
    }
}
