//! From the raw file to the validated [`Config`], collecting every problem instead of stopping at the first.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use ipnet::IpNet;

use super::consumers::PLAN_KEY_SCOPE;
use super::limits::limit_settings;
use super::model::*;
use super::raw::*;
use super::units::parse_duration;
use crate::consumers::{CredentialSource, IdentifierSettings};
use crate::key::KeyPart;
use crate::limiter::store::WhenFull;
use crate::limiter::OnError;
use crate::proxy::{TlsFiles, UpstreamTls};

/// Redis URL schemes the store understands.
/// `rediss` variants are the same deployments over TLS.
const REDIS_SCHEMES: [&str; 6] = [
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
];

/// Methods a route may name. Extension methods are refused: a misspelt `GTE` would otherwise match nothing, silently.
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
];

/// A problem on one field, before it is given a place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issue {
    /// `routes[1].limits[0].period`, or `""` for the whole file.
    pub path: String,
    pub message: String,
}

/// The problems found so far.
#[derive(Debug, Default)]
pub(crate) struct Issues(Vec<Issue>);

// === impl Issues ===

impl Issues {
    pub(crate) fn add(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.0.push(Issue {
            path: path.into(),
            message: message.to_string(),
        });
    }

    /// The value, or `None` with the error recorded on `path`.
    pub(crate) fn check<T, E: fmt::Display>(
        &mut self,
        path: impl Into<String>,
        result: Result<T, E>,
    ) -> Option<T> {
        result.map_err(|e| self.add(path, e)).ok()
    }

    pub(crate) fn count(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn into_vec(self) -> Vec<Issue> {
        self.0
    }
}

impl fmt::Display for Issues {
    /// `path: message`, joined by `; ` (for problems reported outside a file, e.g. by the admin API).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.0.iter().enumerate() {
            let separator = if i == 0 { "" } else { "; " };
            write!(f, "{separator}{}: {}", issue.path, issue.message)?;
        }
        Ok(())
    }
}

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
        .and_then(|block| super::consumers::consumers(&mut issues, block, folder));
    let routes = routes(
        &mut issues,
        &raw.routes,
        &raw.upstreams,
        raw.consumers.is_some(),
        reader,
    );
    let (Some(listen), Some(admin), Some(store), Some(client_ip), Some(server)) =
        (listen, admin, store, client_ip, server)
    else {
        return Err(issues.0);
    };
    if issues.count() > 0 {
        return Err(issues.0);
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
    })
}

/// Marks secret every limit keyed by where the consumers' API keys are sent (`key: header:x-api-key` beside
/// `api_key: { header: x-api-key }`): those values are keys to an account, never to stand in a store key or a log.
pub(crate) fn secret_api_keys(
    routes: &mut [RouteSettings],
    consumers: Option<&mut ConsumersSettings>,
) {
    let Some(consumers) = consumers else {
        return;
    };
    let sources = credential_sources(consumers);
    let plan_limits = consumers
        .plans
        .iter_mut()
        .flat_map(|plan| plan.limits.iter_mut());
    let route_limits = routes.iter_mut().flat_map(|route| route.limits.iter_mut());
    mark_secret(plan_limits.chain(route_limits), &sources);
}

/// [`secret_api_keys`] for limits outside a config: the tower layer's own, beside `consumers`.
pub(crate) fn mark_credential_keys<'a>(
    limits: impl Iterator<Item = &'a mut LimitSettings>,
    consumers: &ConsumersSettings,
) {
    mark_secret(limits, &credential_sources(consumers));
}

/// Where the consumers' API-key identifiers read keys.
fn credential_sources(consumers: &ConsumersSettings) -> Vec<CredentialSource> {
    consumers
        .identify
        .iter()
        .filter_map(|identifier| match identifier {
            IdentifierSettings::ApiKey(source) => Some(source.clone()),
            IdentifierSettings::Jwt(_) => None,
        })
        .collect()
}

/// Marks secret each of `limits` with a key part read from one of `sources`.
fn mark_secret<'a>(
    limits: impl Iterator<Item = &'a mut LimitSettings>,
    sources: &[CredentialSource],
) {
    let carries_a_key = |part: &KeyPart| {
        sources.iter().any(|source| match (source, part) {
            (CredentialSource::Header(header), KeyPart::Header(name)) => header == name,
            (CredentialSource::Query(query), KeyPart::Query(name)) => query
                .trim_end_matches("[]")
                .eq_ignore_ascii_case(name.trim_end_matches("[]")),
            _ => false,
        })
    };
    for settings in limits {
        if settings.key.parts().iter().any(carries_a_key) {
            settings.key = settings.key.clone().secret(true);
        }
    }
}

// === top-level sections ===

fn admin(issues: &mut Issues, raw: &RawAdmin) -> Option<AdminSettings> {
    let listen = socket_addr(issues, "admin.listen", &raw.listen)?;
    let token = raw.token.clone().filter(|t| !t.is_empty());
    // A client's `Authorization` header cannot carry them (its value is trimmed), so such a token never matches:
    // usually a newline from a secret file or an environment variable.
    if token.as_deref().is_some_and(|t| t.trim() != t) {
        issues.add(
            "admin.token",
            "has leading or trailing whitespace, which no client can send: remove it",
        );
        return None;
    }
    // The admin API can reset limits: reachable from other hosts, it must not be open to them.
    if token.is_none() && !listen.ip().is_loopback() {
        issues.add(
            "admin.token",
            "required when admin.listen is not a loopback address",
        );
        return None;
    }
    let status = u16::try_from(raw.readyz_degraded_status)
        .ok()
        .filter(|s| (200..=599).contains(s))
        .ok_or_else(|| {
            format!(
                "must be an HTTP status from 200 to 599 (got {}): 200 keeps the instance in rotation, 503 takes it out",
                raw.readyz_degraded_status
            )
        });
    let readyz_degraded_status = issues.check("admin.readyz_degraded_status", status)?;
    Some(AdminSettings {
        listen,
        token,
        readyz_degraded_status,
    })
}

fn store(issues: &mut Issues, raw: &RawStore) -> Option<StoreSettings> {
    let before = issues.count();
    let backend = match raw.backend {
        RawBackend::Redis => {
            check_redis_url(issues, &raw.url);
            BackendKind::Redis
        }
        RawBackend::Memory => BackendKind::Memory,
    };
    let timeout = positive_duration(issues, "store.timeout", &raw.timeout);
    // The prefix precedes the `{value}` hash tag; a brace in it would move every key to one cluster slot.
    if raw.key_prefix.contains(['{', '}']) {
        issues.add(
            "store.key_prefix",
            "must not contain '{' or '}' (they would change the Redis Cluster hash slot of every key)",
        );
    }
    let max_keys = positive_count(issues, "store.max_keys", raw.max_keys);
    let pool_size = positive_count(issues, "store.pool_size", raw.pool_size);
    // One limit may not take the whole store: a quarter of it unless said otherwise.
    let max_keys_per_limit = match raw.max_keys_per_limit {
        Some(count) => positive_count(issues, "store.max_keys_per_limit", count),
        None => max_keys.map(|keys| keys.div_ceil(4)),
    };
    // A share larger than the store is a share of nothing: a mistake (often max_keys lowered alone), not a wish.
    if let (Some(per_limit), Some(total)) = (max_keys_per_limit, max_keys) {
        if per_limit > total {
            issues.add(
                "store.max_keys_per_limit",
                format!(
                    "must be at most store.max_keys ({total}), got {per_limit}: it is one limit's share of the \
                     store (equal to max_keys lets one limit fill it)"
                ),
            );
        }
    }
    let on_error = match raw.on_error {
        RawOnError::Allow => OnError::Allow,
        RawOnError::Deny => OnError::Deny,
        RawOnError::Local => OnError::Local,
    };
    if issues.count() != before {
        return None;
    }
    Some(StoreSettings {
        backend,
        url: raw.url.clone(),
        timeout: timeout?,
        on_error,
        key_prefix: raw.key_prefix.clone(),
        max_keys: max_keys?,
        when_full: match raw.when_full {
            RawWhenFull::Deny => WhenFull::Deny,
            RawWhenFull::Allow => WhenFull::Allow,
        },
        pool_size: pool_size?,
        max_keys_per_limit: max_keys_per_limit?,
    })
}

fn check_redis_url(issues: &mut Issues, url: &str) {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !scheme.is_some_and(|s| REDIS_SCHEMES.contains(&s)) {
        issues.add(
            "store.url",
            format_args!(
                "invalid Redis URL {url:?} (use redis://, redis-cluster:// or redis-sentinel://, or rediss… for TLS)"
            ),
        );
        return;
    }
    // The store parses the URL the same way when it connects: fail at `tollgate check`, not at start-up.
    if let Err(e) = fred::types::config::Config::from_url(url) {
        issues.add("store.url", format_args!("invalid Redis URL {url:?}: {e}"));
    }
}

fn client_ip(issues: &mut Issues, raw: &RawClientIp) -> Option<ClientIpSettings> {
    let trusted_proxies = networks(issues, "client_ip.trusted_proxies", &raw.trusted_proxies)?;
    let ipv6_prefix = match raw.ipv6_prefix {
        None => ClientIpSettings::default().ipv6_prefix,
        Some(bits @ 1..=128) => u8::try_from(bits).ok()?,
        Some(bits) => {
            issues.add(
                "client_ip.ipv6_prefix",
                format_args!("must be between 1 and 128 bits (got {bits}; 64 keys each /64, 128 each address)"),
            );
            return None;
        }
    };
    Some(ClientIpSettings {
        trusted_proxies,
        ipv6_prefix,
        forwarded: raw.forwarded,
        header: match raw.header {
            RawClientIpHeader::XForwardedFor => ClientIpHeader::XForwardedFor,
            RawClientIpHeader::Forwarded => ClientIpHeader::Forwarded,
            RawClientIpHeader::XRealIp => ClientIpHeader::XRealIp,
        },
    })
}

/// A list of CIDRs (or plain addresses) at `at`; `None` if any is invalid.
fn networks(issues: &mut Issues, at: &str, texts: &[String]) -> Option<Vec<IpNet>> {
    let before = issues.count();
    let nets: Vec<IpNet> = texts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let net = parse_net(text).ok_or_else(|| {
                format!("invalid CIDR {text:?} (use a network like 10.0.0.0/8 or an address like 10.0.0.1)")
            });
            issues.check(format!("{at}[{i}]"), net)
        })
        .collect();
    (issues.count() == before).then_some(nets)
}

/// A network, or a plain address meaning just that host (/32 or /128).
fn parse_net(text: &str) -> Option<IpNet> {
    let text = text.trim();
    text.parse::<IpNet>()
        .map(|net| net.trunc())
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .ok()
}

fn server(issues: &mut Issues, raw: &RawServer) -> Option<ServerSettings> {
    let header_read_timeout = positive_duration(
        issues,
        "server.header_read_timeout",
        &raw.header_read_timeout,
    );
    let keepalive_timeout =
        positive_duration(issues, "server.keepalive_timeout", &raw.keepalive_timeout);
    let body_read_timeout =
        positive_duration(issues, "server.body_read_timeout", &raw.body_read_timeout);
    let max_header_bytes = positive_count(issues, "server.max_header_bytes", raw.max_header_bytes);
    let health_path = raw.health_path.as_deref().map(str::trim);
    if health_path.is_some_and(|path| !path.starts_with('/') || path.contains(['?', '#', ' '])) {
        issues.add(
            "server.health_path",
            "must be a path starting with / (e.g. /healthz), without query",
        );
    }
    let max_body_bytes = match raw.max_body_bytes {
        Some(0) => {
            issues.add(
                "server.max_body_bytes",
                "must be greater than 0 (omit it for no limit)",
            );
            None
        }
        other => other,
    };
    // Zero grace is legitimate: stop at once.
    let shutdown_grace = duration(issues, "server.shutdown_grace", &raw.shutdown_grace);
    // Zero too: readiness fails and the listener closes at once.
    let shutdown_delay = duration(issues, "server.shutdown_delay", &raw.shutdown_delay);
    Some(ServerSettings {
        header_read_timeout: header_read_timeout?,
        keepalive_timeout: keepalive_timeout?,
        body_read_timeout: body_read_timeout?,
        health_path: health_path.map(str::to_owned),
        max_body_bytes,
        max_header_bytes: max_header_bytes?,
        shutdown_grace: shutdown_grace?,
        shutdown_delay: shutdown_delay?,
        underscores_in_headers: raw.underscores_in_headers,
        keep_escaped_slashes: raw.escaped_slashes == RawEscapedSlashes::Keep,
    })
}

// === upstreams ===

fn upstreams(
    issues: &mut Issues,
    raw: &Ordered<RawUpstream>,
    folder: &Path,
) -> Vec<UpstreamSettings> {
    raw.0
        .iter()
        .filter_map(|(name, upstream)| upstream_settings(issues, name, upstream, folder))
        .collect()
}

fn upstream_settings(
    issues: &mut Issues,
    name: &str,
    raw: &RawUpstream,
    folder: &Path,
) -> Option<UpstreamSettings> {
    let at = format!("upstreams.{name}");
    if name.is_empty() {
        issues.add(&at, "an upstream needs a name");
    }
    if raw.targets.is_empty() {
        issues.add(
            format!("{at}.targets"),
            "needs at least one target (e.g. targets: [\"http://127.0.0.1:3000\"])",
        );
    }
    let targets: Vec<Uri> = raw
        .targets
        .iter()
        .enumerate()
        .filter_map(|(i, text)| issues.check(format!("{at}.targets[{i}]"), upstream_target(text)))
        .collect();
    let timeout = positive_duration(issues, &format!("{at}.timeout"), &raw.timeout);
    let connect_timeout = positive_duration(
        issues,
        &format!("{at}.connect_timeout"),
        &raw.connect_timeout,
    );
    if name.is_empty() || targets.len() != raw.targets.len() || targets.is_empty() {
        return None;
    }
    let tls = upstream_tls(issues, &at, raw, &targets, folder)?;
    Some(UpstreamSettings {
        name: name.to_owned(),
        targets,
        timeout: timeout?,
        connect_timeout: connect_timeout?,
        pass_host_header: raw.pass_host_header,
        tls,
    })
}

/// The TLS settings of an upstream with `https` targets (`Ok(None)` without any), loaded now so that a missing or
/// broken certificate file is an error of the config, with its place in the file, and not of the first request.
fn upstream_tls(
    issues: &mut Issues,
    at: &str,
    raw: &RawUpstream,
    targets: &[Uri],
    folder: &Path,
) -> Option<Option<UpstreamTls>> {
    let https = targets.iter().any(|t| t.scheme_str() == Some("https"));
    let block = raw.tls.as_ref();
    if !https {
        if block.is_some() {
            issues.add(
                format!("{at}.tls"),
                "applies to https targets only, and this upstream has none",
            );
            return None;
        }
        return Some(None);
    }
    let file = |name: &Option<String>| name.as_deref().map(|n| folder.join(n));
    let files = block
        .map(|tls| TlsFiles {
            ca_file: file(&tls.ca_file),
            cert_file: file(&tls.cert_file),
            key_file: file(&tls.key_file),
        })
        .unwrap_or_default();
    let server_name = block.and_then(|tls| tls.server_name.as_deref());
    match UpstreamTls::load(files, server_name) {
        Ok(tls) => {
            let before = issues.count();
            for (i, target) in targets.iter().enumerate() {
                if target.scheme_str() == Some("https") {
                    let host = target.host().unwrap_or_default();
                    issues.check(format!("{at}.targets[{i}]"), tls.dialer(host));
                }
            }
            (issues.count() == before).then_some(Some(tls))
        }
        Err(error) => {
            // Without a tls block, a missing system trust store is a problem of the https targets.
            let path = match (block, error.field) {
                (None, _) => format!("{at}.targets"),
                (Some(_), "") => format!("{at}.tls"),
                (Some(_), field) => format!("{at}.tls.{field}"),
            };
            issues.add(path, error.message);
            None
        }
    }
}

/// `http[s]://host[:port][/base-path]`.
fn upstream_target(text: &str) -> Result<Uri, String> {
    let invalid =
        || format!("invalid upstream URL {text:?} (use http://host:port[/path] or https://...)");
    let uri: Uri = text.trim().parse().map_err(|_| invalid())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(invalid());
    }
    let authority = uri.authority().ok_or_else(invalid)?;
    // Credentials in the URL would be sent nowhere (the proxy does not turn them into headers): refuse them.
    if authority.host().is_empty() || authority.as_str().contains('@') || uri.query().is_some() {
        return Err(invalid());
    }
    Ok(uri)
}

// === routes ===

fn routes(
    issues: &mut Issues,
    raw: &[RawRoute],
    upstreams: &Ordered<RawUpstream>,
    has_consumers: bool,
    reader: Reader,
) -> Vec<RouteSettings> {
    unique_names(
        issues,
        "route",
        raw.iter()
            .enumerate()
            .map(|(i, r)| (format!("routes[{i}]"), r.name.as_str())),
    );
    raw.iter()
        .enumerate()
        .filter_map(|(i, route)| {
            route_settings(
                issues,
                &format!("routes[{i}]"),
                route,
                upstreams,
                has_consumers,
                reader,
            )
        })
        .collect()
}

fn route_settings(
    issues: &mut Issues,
    at: &str,
    raw: &RawRoute,
    upstreams: &Ordered<RawUpstream>,
    has_consumers: bool,
    reader: Reader,
) -> Option<RouteSettings> {
    let before = issues.count();
    check_name(issues, &format!("{at}.name"), "route", &raw.name);
    let consumers = route_consumers(issues, at, raw, has_consumers);
    let matcher = route_match(issues, &format!("{at}.match"), &raw.matcher);
    let action = route_action(issues, at, raw, upstreams, reader);
    unique_names(
        issues,
        "limit",
        raw.limits
            .iter()
            .enumerate()
            .map(|(j, l)| (format!("{at}.limits[{j}]"), l.name.as_str())),
    );
    let limits: Vec<LimitSettings> = raw
        .limits
        .iter()
        .enumerate()
        .filter_map(|(j, l)| limit_settings(issues, &format!("{at}.limits[{j}]"), l))
        .collect();
    let deny_status = deny_status(issues, &format!("{at}.deny_status"), raw.deny_status);
    let allow = networks(issues, &format!("{at}.allow"), &raw.allow);
    if issues.count() != before {
        return None;
    }
    Some(RouteSettings {
        name: raw.name.clone(),
        matcher,
        action: action?,
        limits,
        deny_status: deny_status?,
        headers: raw.headers,
        allow: allow?,
        consumers,
    })
}

/// `consumers:` of a route: `optional` by default when the file has a `consumers:` block, `off` otherwise.
fn route_consumers(
    issues: &mut Issues,
    at: &str,
    raw: &RawRoute,
    has_consumers: bool,
) -> ConsumerMode {
    if has_consumers && raw.name == PLAN_KEY_SCOPE {
        issues.add(
            format!("{at}.name"),
            format_args!(
                "the route name {PLAN_KEY_SCOPE:?} is taken by plan limits' store keys when a consumers: block exists"
            ),
        );
    }
    match (raw.consumers, has_consumers) {
        (None, false) | (Some(RawConsumerMode::Off), _) => ConsumerMode::Off,
        (None, true) | (Some(RawConsumerMode::Optional), true) => ConsumerMode::Optional,
        (Some(RawConsumerMode::Required), true) => ConsumerMode::Required,
        (Some(_), false) => {
            issues.add(
                format!("{at}.consumers"),
                "needs a top-level consumers: block saying how requests name their consumer",
            );
            ConsumerMode::Off
        }
    }
}

fn route_match(issues: &mut Issues, at: &str, raw: &RawMatch) -> RouteMatch {
    for (field, value) in [("path_prefix", &raw.path_prefix), ("path", &raw.path)] {
        if let Some(path) = value.as_deref().filter(|p| !p.starts_with('/')) {
            issues.add(
                format!("{at}.{field}"),
                format_args!("must start with \"/\" (got {path:?})"),
            );
        }
        if let Some(Err(error)) = value
            .as_deref()
            .filter(|p| p.starts_with('/'))
            .map(crate::routing::normalize_path)
        {
            issues.add(format!("{at}.{field}"), format_args!("{error}"));
        }
    }
    if raw.case_sensitive && raw.case_insensitive {
        issues.add(
            format!("{at}.case_sensitive"),
            "contradicts case_insensitive: true (paths match in any case unless case_sensitive: true)",
        );
    }
    let mut methods: Vec<Method> = Vec::new();
    for (i, text) in raw.methods.iter().enumerate() {
        let method = issues.check(format!("{at}.methods[{i}]"), method(text));
        if let Some(method) = method.filter(|m| !methods.contains(m)) {
            methods.push(method);
        }
    }
    let host = raw.host.as_deref().and_then(|host| {
        let host = host.trim().to_ascii_lowercase();
        issues.check(format!("{at}.host"), host_pattern(&host).map(|()| host))
    });
    RouteMatch {
        path_prefix: raw.path_prefix.clone(),
        path: raw.path.clone(),
        methods,
        host,
        case_sensitive: raw.case_sensitive,
    }
}

fn method(text: &str) -> Result<Method, String> {
    let upper = text.trim().to_ascii_uppercase();
    if !METHODS.contains(&upper.as_str()) {
        return Err(format!(
            "unknown HTTP method {text:?} (use {})",
            METHODS.join(", ")
        ));
    }
    Method::from_bytes(upper.as_bytes()).map_err(|e| e.to_string())
}

/// A host name without scheme or port, optionally `*.` followed by a domain.
fn host_pattern(host: &str) -> Result<(), String> {
    let name = host.strip_prefix("*.").unwrap_or(host);
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "invalid host {host:?} (write a host name without scheme or port, e.g. api.example.com or *.example.com)"
        ))
    }
}

fn route_action(
    issues: &mut Issues,
    at: &str,
    raw: &RawRoute,
    upstreams: &Ordered<RawUpstream>,
    reader: Reader,
) -> Option<RouteAction> {
    match (&raw.upstream, &raw.respond) {
        (None, None) if reader == Reader::Layers => Some(RouteAction::LimitsOnly),
        (Some(_), Some(_)) => {
            issues.add(
                at,
                "has both upstream and respond (a route either forwards or answers: keep one)",
            );
            None
        }
        (None, None) => {
            issues.add(
                at,
                "needs upstream (forward to an upstream) or respond (answer directly); a file for tower layers only is read with config::load_for_layers",
            );
            None
        }
        (Some(name), None) => {
            if upstreams.0.iter().any(|(known, _)| known == name) {
                return Some(RouteAction::Upstream(name.clone()));
            }
            let defined: Vec<&str> = upstreams.0.iter().map(|(n, _)| n.as_str()).collect();
            let hint = if defined.is_empty() {
                "no upstreams are defined".to_owned()
            } else {
                format!("defined: {}", defined.join(", "))
            };
            issues.add(
                format!("{at}.upstream"),
                format_args!("unknown upstream {name:?} ({hint})"),
            );
            None
        }
        (None, Some(respond)) => {
            direct_response(issues, &format!("{at}.respond"), respond).map(RouteAction::Respond)
        }
    }
}

fn direct_response(issues: &mut Issues, at: &str, raw: &RawRespond) -> Option<DirectResponse> {
    // `StatusCode` takes up to 999; HTTP defines classes only up to 5xx, and clients may reject the rest.
    let status = StatusCode::from_u16(raw.status)
        .ok()
        .filter(|_| raw.status <= 599)
        .ok_or_else(|| format!("invalid status {} (use 100 to 599)", raw.status));
    let status = issues.check(format!("{at}.status"), status);
    let before = issues.count();
    let headers: Vec<(HeaderName, HeaderValue)> = raw
        .headers
        .0
        .iter()
        .filter_map(|(name, value)| {
            let header = response_header(name, value);
            issues.check(format!("{at}.headers.{name}"), header)
        })
        .collect();
    if issues.count() != before {
        return None;
    }
    Some(DirectResponse {
        status: status?,
        body: raw.body.clone(),
        headers,
    })
}

fn response_header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("invalid header name {name:?}"))?;
    let value = HeaderValue::from_str(value)
        .map_err(|_| format!("invalid value for header {name} (no control characters)"))?;
    Ok((name, value))
}

fn deny_status(issues: &mut Issues, at: &str, code: u16) -> Option<StatusCode> {
    let status = StatusCode::from_u16(code)
        .ok()
        .filter(|s| s.is_client_error() || s.is_server_error())
        .ok_or_else(|| format!("must be a 4xx or 5xx status (got {code})"));
    issues.check(at, status)
}

// === shared checks ===

/// Route and limit names become parts of Redis keys, so they keep to a small, unambiguous alphabet.
pub(crate) fn check_name(issues: &mut Issues, at: &str, kind: &str, name: &str) {
    if name.is_empty() {
        issues.add(at, format_args!("a {kind} needs a name"));
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        issues.add(
            at,
            format_args!(
                "{kind} name {name:?} may only contain letters, digits, '_', '.' and '-' (it becomes part of Redis keys)"
            ),
        );
    }
}

/// Reports every repeated name on the later entry's `name` field.
pub(crate) fn unique_names<'a>(
    issues: &mut Issues,
    kind: &str,
    entries: impl Iterator<Item = (String, &'a str)>,
) {
    let mut first: HashMap<&str, String> = HashMap::new();
    for (at, name) in entries.filter(|(_, name)| !name.is_empty()) {
        match first.get(name) {
            Some(first_at) => issues.add(
                format!("{at}.name"),
                format_args!("duplicate {kind} name {name:?} (first used at {first_at})"),
            ),
            None => {
                first.insert(name, at);
            }
        }
    }
}

fn socket_addr(issues: &mut Issues, at: &str, text: &str) -> Option<SocketAddr> {
    let addr = text
        .trim()
        .parse::<SocketAddr>()
        .map_err(|_| format!("invalid address {text:?} (use IP:PORT, e.g. 0.0.0.0:8080)"));
    issues.check(at, addr)
}

fn duration(issues: &mut Issues, at: &str, text: &str) -> Option<Duration> {
    issues.check(at, parse_duration(text))
}

fn positive_duration(issues: &mut Issues, at: &str, text: &str) -> Option<Duration> {
    let value = duration(issues, at, text)?;
    if value.is_zero() {
        issues.add(at, format_args!("must be greater than 0 (got {text:?})"));
        return None;
    }
    Some(value)
}

fn positive_count(issues: &mut Issues, at: &str, value: u64) -> Option<usize> {
    let count = usize::try_from(value)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("must be greater than 0 (got {value})"));
    issues.check(at, count)
}

#[cfg(test)]
// A failed unwrap is a failed test, with the value in the message.
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::{parse_with_env, BackendKind, Config, ConfigError};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        parse_with_env(text, Path::new("t.yaml"), |_| None)
    }

    /// `path: message` of every problem, in file order.
    fn problems(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(_) => panic!("expected problems in:\n{text}"),
            Err(err) => err
                .problems()
                .iter()
                .map(|p| format!("{}: {}", p.path(), p.message()))
                .collect(),
        }
    }

    /// A valid route around one limit written by the test.
    fn with_limit(limit: &str) -> String {
        format!(
            "routes:\n  - name: r\n    respond: {{ status: 204 }}\n    limits:\n      - name: l\n{}",
            limit
                .lines()
                .map(|line| format!("        {line}\n"))
                .collect::<String>()
        )
    }

    #[test]
    fn an_empty_file_is_all_defaults() {
        let config = parse("").unwrap();
        assert_eq!(config.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(config.admin.listen, "127.0.0.1:9901".parse().unwrap());
        assert_eq!(config.store.backend, BackendKind::Memory);
        assert_eq!(config.store.url, "redis://127.0.0.1:6379");
        assert_eq!(config.store.timeout, Duration::from_millis(25));
        assert_eq!(config.server.max_header_bytes, 65_536);
        assert_eq!(config.server.shutdown_grace, Duration::from_secs(30));
        assert!(config.routes.is_empty());
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = r#"listen: localhost:8080
client_ip:
  trusted_proxies: [10.0.0.0/8, 192.168.1.300, "::1"]
upstreams:
  api:
    targets: ["ftp://api.internal:21", "http://ok:80"]
  empty: {}
  secure:
    targets: ["https://api.internal"]
    tls: { ca_file: missing-ca.pem, cert_file: client.pem }
routes:
  - name: api
    match: { path: api, methods: [get, FETCH] }
    upstream: nowhere
    deny_status: 200
  - name: api
    upstream: api
    respond: { status: 200 }
  - name: "bad name"
    respond: { status: 700, headers: { "x bad": v } }
    limits:
      - name: a
        key: [ip, cookie:session]
        algorithm: sliding_window
        limit: 10
        rate: 10/s
      - name: a
        algorithm: token_bucket
        rate: 10/0s
        burst: 0
"#;
        assert_eq!(
            problems(text),
            [
                r#"listen: invalid address "localhost:8080" (use IP:PORT, e.g. 0.0.0.0:8080)"#,
                r#"client_ip.trusted_proxies[1]: invalid CIDR "192.168.1.300" (use a network like 10.0.0.0/8 or an address like 10.0.0.1)"#,
                r#"upstreams.api.targets[0]: invalid upstream URL "ftp://api.internal:21" (use http://host:port[/path] or https://...)"#,
                r#"upstreams.empty.targets: needs at least one target (e.g. targets: ["http://127.0.0.1:3000"])"#,
                r#"upstreams.secure.tls.ca_file: cannot read missing-ca.pem: No such file or directory (os error 2)"#,
                r#"routes[0].match.path: must start with "/" (got "api")"#,
                r#"routes[0].match.methods[1]: unknown HTTP method "FETCH" (use GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, CONNECT, TRACE)"#,
                r#"routes[0].upstream: unknown upstream "nowhere" (defined: api, empty, secure)"#,
                r#"routes[0].deny_status: must be a 4xx or 5xx status (got 200)"#,
                r#"routes[1].name: duplicate route name "api" (first used at routes[0])"#,
                r#"routes[1]: has both upstream and respond (a route either forwards or answers: keep one)"#,
                r#"routes[2].name: route name "bad name" may only contain letters, digits, '_', '.' and '-' (it becomes part of Redis keys)"#,
                r#"routes[2].respond.status: invalid status 700 (use 100 to 599)"#,
                r#"routes[2].respond.headers.x bad: invalid header name "x bad""#,
                // A missing field is placed on its limit, which starts before the key.
                r#"routes[2].limits[0].period: required by sliding_window (it takes limit and period)"#,
                r#"routes[2].limits[0].key[1]: unknown key part "cookie:session" (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan)"#,
                r#"routes[2].limits[0].rate: rate is not used by sliding_window (it takes limit and period)"#,
                r#"routes[2].limits[1].name: duplicate limit name "a" (first used at routes[2].limits[0])"#,
                r#"routes[2].limits[1].rate: invalid rate "10/0s": rate period must be greater than 0"#,
                r#"routes[2].limits[1].burst: must be greater than 0"#,
            ]
        );
    }

    #[test]
    fn problems_are_printed_with_file_line_and_column() {
        let text = "store:\n  timeout: 0s\nroutes:\n  - name: r\n    respond: {}\n    limits:\n      - name: l\n        algorithm: sliding_log\n        limit: 5\n        period: 1.5s\n";
        assert_eq!(
            parse(text).unwrap_err().to_string(),
            concat!(
                "t.yaml:2:3: store.timeout: must be greater than 0 (got \"0s\")\n",
                "t.yaml:10:9: routes[0].limits[0].period: invalid duration \"1.5s\" (use 250ms, 1s, 1m, 1h, 1d)",
            )
        );
    }

    #[test]
    fn a_per_limit_key_share_larger_than_the_store_is_a_located_error() {
        let text = "store:\n  backend: memory\n  max_keys: 1000\n  max_keys_per_limit: 1001\nroutes:\n  - name: r\n    respond: {}\n";
        assert_eq!(
            parse(text).unwrap_err().to_string(),
            "t.yaml:4:3: store.max_keys_per_limit: must be at most store.max_keys (1000), got 1001: it is one \
             limit's share of the store (equal to max_keys lets one limit fill it)"
        );
        // Equal is the whole store; the default is a quarter of whatever max_keys is.
        let equal = text.replace("1001", "1000");
        assert_eq!(parse(&equal).unwrap().store.max_keys_per_limit, 1000);
        let default =
            "store:\n  backend: memory\n  max_keys: 10\nroutes:\n  - name: r\n    respond: {}\n";
        assert_eq!(parse(default).unwrap().store.max_keys_per_limit, 3);
    }

    #[test]
    fn zero_periods_and_costs_are_refused() {
        assert_eq!(
            problems(&with_limit(
                "algorithm: sliding_window\nlimit: 0\nperiod: 0s\ncost: 0"
            )),
            [
                "routes[0].limits[0].limit: must be greater than 0",
                r#"routes[0].limits[0].period: must be greater than 0 (got "0s")"#,
                "routes[0].limits[0].cost: must be greater than 0",
            ]
        );
    }

    #[test]
    fn limit_construction_errors_are_reported_on_the_limit() {
        assert_eq!(
            problems(&with_limit(
                "algorithm: token_bucket\nrate: 1/s\nburst: 2\ncost: 3"
            )),
            ["routes[0].limits[0]: cost 3 is larger than the capacity 2: no request could ever be admitted"]
        );
    }

    #[test]
    fn unknown_algorithms_and_bad_leaky_modes_are_named() {
        assert_eq!(
            problems(&with_limit(
                "algorithm: leaky_bucket\nrate: 1/s\nburst: 2\nmode: delay"
            )),
            [
                "routes[0].limits[0].max_delay: required by mode: delay (the longest a request may be held)"
            ]
        );
        assert_eq!(
            problems(&with_limit(
                "algorithm: leaky_bucket\nrate: 1/s\nburst: 2\nmode: queue"
            )),
            [r#"routes[0].limits[0].mode: invalid mode "queue" (use reject or delay)"#]
        );
        for mode in ["", "mode: reject\n"] {
            assert_eq!(
                problems(&with_limit(&format!(
                    "algorithm: leaky_bucket\nrate: 1/s\nburst: 2\n{mode}max_delay: 2s"
                ))),
                ["routes[0].limits[0].max_delay: only used with mode: delay (add mode: delay to hold requests up to it, or remove it)"],
                "{mode}"
            );
        }
        assert_eq!(
            problems(&with_limit("algorithm: sliding\nlimit: 1\nperiod: 1s")),
            [
                r#"routes[0].limits[0].algorithm: unknown algorithm "sliding" (use sliding_window, sliding_log, token_bucket, fixed_window, gcra, leaky_bucket)"#
            ]
        );
        assert_eq!(
            problems(&with_limit("limit: 1\nperiod: 1s")),
            ["routes[0].limits[0].algorithm: a limit needs an algorithm (use sliding_window, sliding_log, token_bucket, fixed_window, gcra, leaky_bucket)"]
        );
        assert_eq!(
            problems(&with_limit("algorithm: token_bucket\nrate: 1/s\nburst: 2\nmax_delay: 1s")),
            ["routes[0].limits[0].max_delay: max_delay is not used by token_bucket (it takes rate and burst)"]
        );
    }

    #[test]
    fn key_lists_and_missing_policy() {
        let config = parse(&with_limit(
            "key: [route, \"query:tenant\"]\nmissing: skip\nalgorithm: sliding_log\nlimit: 3\nperiod: 1s",
        ))
        .unwrap();
        let key = &config.routes[0].limits[0].key;
        assert_eq!(key.to_string(), "route+query:tenant");
        assert_eq!(key.missing(), crate::key::MissingKey::Skip);
        assert_eq!(
            problems(&with_limit("key: []\nalgorithm: sliding_log\nlimit: 3\nperiod: 1s")),
            ["routes[0].limits[0].key: needs at least one part (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan)"]
        );
    }

    #[test]
    fn admin_token_is_required_off_loopback() {
        assert_eq!(
            parse("admin:\n  listen: 0.0.0.0:9901\n")
                .unwrap_err()
                .to_string(),
            "t.yaml:1:1: admin.token: required when admin.listen is not a loopback address"
        );
        assert_eq!(
            problems("admin:\n  listen: 0.0.0.0:9901\n  token: \"\"\n"),
            ["admin.token: required when admin.listen is not a loopback address"]
        );
        let open = parse("admin:\n  listen: 0.0.0.0:9901\n  token: s3cret\n").unwrap();
        assert_eq!(open.admin.token.as_deref(), Some("s3cret"));
        let local = parse("admin:\n  listen: \"[::1]:9901\"\n  token: \"\"\n").unwrap();
        assert_eq!(local.admin.token, None);
    }

    #[test]
    fn admin_token_with_surrounding_whitespace_is_a_located_error() {
        for token in [
            "\" s3cret\"",
            "\"s3cret \"",
            "\"s3cret\\n\"",
            "\"\\ts3cret\"",
        ] {
            assert_eq!(
                parse(&format!("admin:\n  listen: 127.0.0.1:9901\n  token: {token}\n"))
                    .unwrap_err()
                    .to_string(),
                "t.yaml:3:3: admin.token: has leading or trailing whitespace, which no client can send: remove it",
                "{token}"
            );
        }
        let inner = parse("admin:\n  listen: 127.0.0.1:9901\n  token: \"s3 cret\"\n").unwrap();
        assert_eq!(inner.admin.token.as_deref(), Some("s3 cret"));
    }

    #[test]
    fn redis_url_is_checked_only_for_the_redis_backend() {
        assert_eq!(
            problems("store:\n  backend: redis\n  url: http://cache:6379\n"),
            [
                r#"store.url: invalid Redis URL "http://cache:6379" (use redis://, redis-cluster:// or redis-sentinel://, or rediss… for TLS)"#
            ]
        );
        for url in [
            "redis://127.0.0.1:6379",
            "rediss://cache:6380/1",
            "redis-cluster://a:7000?node=b:7001",
            "redis-sentinel://s:26379/0?sentinelServiceName=main",
        ] {
            let text = format!("store:\n  backend: redis\n  url: \"{url}\"\n");
            assert!(parse(&text).is_ok(), "{url}: {:?}", parse(&text).err());
        }
        assert!(parse("store:\n  backend: memory\n  url: nonsense\n").is_ok());
    }

    #[test]
    fn when_full_defaults_to_deny_and_names_a_wrong_value() {
        use crate::limiter::store::WhenFull;
        assert_eq!(parse("").unwrap().store.when_full, WhenFull::Deny);
        let allow = parse("store:\n  when_full: allow\n").unwrap();
        assert_eq!(allow.store.when_full, WhenFull::Allow);
        let error = parse("store:\n  when_full: maybe\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("t.yaml:2:") && error.contains("when_full"),
            "{error}"
        );
    }

    #[test]
    fn trusted_proxies_take_networks_and_plain_addresses() {
        let config =
            parse("client_ip:\n  trusted_proxies: [10.1.2.3/8, 192.0.2.7, \"2001:db8::1\"]\n")
                .unwrap();
        let nets: Vec<String> = config
            .client_ip
            .trusted_proxies
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(nets, ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::1/128"]);
    }

    #[test]
    fn route_details_are_normalised() {
        let text = "upstreams:\n  b: { targets: [\"http://10.0.0.2:8080/base\"], timeout: 2s, connect_timeout: 250ms }\n  a: { targets: [\"http://10.0.0.1\"] }\nroutes:\n  - name: r.1\n    match: { host: \"*.Example.COM\", methods: [get, Post, GET] }\n    upstream: a\n    headers: false\n    deny_status: 503\n  - name: r_2\n    respond: { status: 404, body: gone, headers: { content-type: text/plain, x-b: \"1\" } }\n";
        let config = parse(text).unwrap();
        let upstreams: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(upstreams, ["b", "a"]);
        assert_eq!(
            config.upstreams[0].connect_timeout,
            Duration::from_millis(250)
        );
        assert_eq!(config.upstreams[0].targets[0].path(), "/base");
        let route = &config.routes[0];
        assert_eq!(route.matcher.host.as_deref(), Some("*.example.com"));
        assert_eq!(
            route.matcher.methods,
            [http::Method::GET, http::Method::POST]
        );
        assert!(!route.headers);
        assert_eq!(route.deny_status, http::StatusCode::SERVICE_UNAVAILABLE);
        let crate::config::RouteAction::Respond(response) = &config.routes[1].action else {
            panic!("r_2 answers directly");
        };
        let headers: Vec<(&str, &str)> = response
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(headers, [("content-type", "text/plain"), ("x-b", "1")]);
    }

    #[test]
    fn durations_written_as_numbers_get_the_duration_message() {
        assert_eq!(
            problems("server:\n  header_read_timeout: 30\n  shutdown_grace: 0s\n"),
            [r#"server.header_read_timeout: invalid duration "30" (use 250ms, 1s, 1m, 1h, 1d)"#]
        );
    }
}
