//! What `tollgate check` prints: the store, then one table row per route and limit, as understood.

use std::fmt::Write;

use super::{
    format_duration_ms, BackendKind, Config, LimitSettings, RouteAction, RouteSettings,
    TlsSettings, TlsVersion,
};
#[cfg(feature = "jwt")]
use crate::consumers::jwt::JwtKeySource;
use crate::consumers::{
    Anonymous, ConsumerMode, ConsumersSettings, CredentialSource, IdentifierSettings, Plan,
};
use crate::key::{Counts, MissingKey};
use crate::limiter::{Algorithm, LeakyMode};
use crate::usage::{CompletionBound, PromptBound, UsageFormat, UsageSettings};

/// Renders `config` as a short header and a table of routes, matches, limits and keys.
pub fn render(config: &Config) -> String {
    let mut out = String::new();
    let store = match config.store.backend {
        BackendKind::Memory => format!("memory (max_keys {})", config.store.max_keys),
        BackendKind::Redis => format!(
            "redis {} (timeout {}, on_error {})",
            redact(&config.store.url),
            format_duration_ms(config.store.timeout.as_millis() as u64),
            config.store.on_error
        ),
    };
    let _ = writeln!(out, "{}: valid", config.source.display());
    let token = if config.admin.token.is_some() {
        "token set"
    } else {
        "no token"
    };
    let listen = config.listen.map_or_else(
        || "none (HTTPS only)".to_owned(),
        |listen| listen.to_string(),
    );
    let _ = writeln!(
        out,
        "listen {listen}   admin {} ({token})   store {store}",
        config.admin.listen
    );
    if let Some(tls) = &config.tls {
        out.push_str(&tls_lines(tls));
    }
    out.push_str(&server_line(config));
    out.push_str(&client_ip_line(config));
    for upstream in &config.upstreams {
        out.push_str(&upstream_line(upstream));
    }
    let _ = writeln!(out);

    let mut rows = vec![[
        "ROUTE",
        "MATCH",
        "ACTION",
        "LIMIT",
        "ALGORITHM",
        "PARAMETERS",
        "KEY",
        "COST",
    ]
    .map(str::to_owned)];
    for route in &config.routes {
        rows.extend(route_rows(route));
    }
    out.push_str(&table(&rows));
    for route in &config.routes {
        if let Some(usage) = &route.usage {
            out.push_str(&usage_line(&route.name, usage));
        }
    }
    if let Some(consumers) = &config.consumers {
        out.push('\n');
        out.push_str(&consumers_summary(consumers, &config.routes));
    }
    if let Some(rls) = &config.rls {
        out.push('\n');
        out.push_str(&rls_summary(rls, &config.source));
    }
    out
}

/// `tls:` as understood: the listener, then each certificate's file, the names it serves and when it expires.
fn tls_lines(tls: &TlsSettings) -> String {
    let mut out = String::new();
    let version = match tls.min_version {
        TlsVersion::V1_2 => "1.2",
        TlsVersion::V1_3 => "1.3",
    };
    let clients = tls.client_ca.as_ref().map_or_else(
        || "no client certificates".to_owned(),
        |ca| format!("client certificates signed by {}", ca.display()),
    );
    let _ = writeln!(
        out,
        "tls: listen {}   min_version {version}   {clients}",
        tls.listen
    );
    for (i, line) in certificate_lines(tls).into_iter().enumerate() {
        let default = if i == 0 { "   (default)" } else { "" };
        let _ = writeln!(out, "  certificate {line}{default}");
    }
    out
}

/// One line per certificate: its file, its names and its expiry, read from the files.
#[cfg(feature = "gateway")]
fn certificate_lines(tls: &TlsSettings) -> Vec<String> {
    match crate::tls::check(tls) {
        Ok(certificates) => certificates
            .iter()
            .map(|certificate| {
                format!(
                    "{}   names {}   expires {}",
                    certificate.file,
                    certificate.names.join(", "),
                    certificate.expires()
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Without the gateway the files are not read: their names only.
#[cfg(not(feature = "gateway"))]
fn certificate_lines(tls: &TlsSettings) -> Vec<String> {
    tls.certificates
        .iter()
        .map(|files| files.cert.display().to_string())
        .collect()
}

/// `rls:` as understood: the listener, then one row per limit of every descriptor rule of every domain.
fn rls_summary(rls: &crate::rls::RlsSettings, source: &std::path::Path) -> String {
    use crate::rls::{RuleKind, WhenUnavailable};
    let when_unavailable = match rls.when_unavailable {
        WhenUnavailable::Unavailable => "unavailable",
        WhenUnavailable::OverLimit => "over_limit",
    };
    let mut out = format!(
        "rls: listen {}   domains {}   when_unavailable {when_unavailable}",
        rls.listen,
        rls.domains.len()
    );
    if let Some(dir) = &rls.config_dir {
        let _ = write!(out, "   config_dir {}", dir.display());
    }
    out.push('\n');
    let mut rows = vec![[
        "DOMAIN",
        "DESCRIPTOR",
        "LIMIT",
        "ALGORITHM",
        "PARAMETERS",
        "NOTES",
        "FROM",
    ]
    .map(str::to_owned)];
    for domain in &rls.domains {
        let from = domain
            .file
            .as_deref()
            .unwrap_or(source)
            .display()
            .to_string();
        for rule in domain.rules() {
            let mut notes = Vec::new();
            if rule.shadow {
                notes.push("shadow".to_owned());
            }
            if let Some(name) = &rule.name {
                notes.push(format!("name {name}"));
            }
            if !rule.replaces.is_empty() {
                notes.push(format!("replaces {}", rule.replaces.join(",")));
            }
            let notes = notes.join(", ");
            let row = |limit: &str, algorithm: &str, parameters: String| {
                [
                    domain.name.clone(),
                    rule.path.clone(),
                    limit.to_owned(),
                    algorithm.to_owned(),
                    parameters,
                    notes.clone(),
                    from.clone(),
                ]
            };
            match rule.kind {
                RuleKind::Unlimited => rows.push(row("-", "unlimited", String::new())),
                RuleKind::Blocked(unit) => {
                    rows.push(row("-", "refuses all", format!("0 per {}", unit.name())));
                }
                RuleKind::Limited => {
                    for limit in &rule.limits {
                        rows.push(row(
                            limit.name(),
                            limit.algorithm().name(),
                            parameters(limit.algorithm()),
                        ));
                    }
                }
            }
        }
    }
    out.push_str(&table(&rows));
    out
}

/// `server:` as understood: its clocks and sizes, and what is set of the rest.
fn server_line(config: &Config) -> String {
    let server = &config.server;
    // `0s` as the config says it (a delay of none), not `0ms`.
    let seconds = |d: std::time::Duration| match d.as_millis() {
        0 => "0s".to_owned(),
        ms => format_duration_ms(ms as u64),
    };
    let mut line = format!(
        "server: header_read_timeout {}   keepalive_timeout {}   body_read_timeout {}   max_header_bytes {}   \
         shutdown_delay {}   shutdown_grace {}",
        seconds(server.header_read_timeout),
        seconds(server.keepalive_timeout),
        seconds(server.body_read_timeout),
        server.max_header_bytes,
        seconds(server.shutdown_delay),
        seconds(server.shutdown_grace),
    );
    if let Some(path) = &server.health_path {
        let _ = write!(line, "   health_path {path}");
    }
    if let Some(max) = server.max_body_bytes {
        let _ = write!(line, "   max_body_bytes {max}");
    }
    if server.keep_escaped_slashes {
        line.push_str("   escaped_slashes keep");
    }
    if server.underscores_in_headers {
        line.push_str("   underscores_in_headers");
    }
    line.push('\n');
    line
}

/// `client_ip:` as understood: whom X-Forwarded-For (or the field named) is believed from.
fn client_ip_line(config: &Config) -> String {
    let client_ip = &config.client_ip;
    let trusted = if client_ip.trusted_proxies.is_empty() {
        "none (the client is the TCP peer)".to_owned()
    } else {
        let nets: Vec<String> = client_ip
            .trusted_proxies
            .iter()
            .map(|n| n.to_string())
            .collect();
        nets.join(",")
    };
    let header = match client_ip.header {
        crate::key::ClientIpHeader::XForwardedFor => "x-forwarded-for",
        crate::key::ClientIpHeader::Forwarded => "forwarded",
        crate::key::ClientIpHeader::XRealIp => "x-real-ip",
    };
    let forwarded = if client_ip.forwarded {
        "   writes Forwarded"
    } else {
        ""
    };
    format!(
        "client_ip: trusted_proxies {trusted}   header {header}   ipv6_prefix {}{forwarded}\n",
        client_ip.ipv6_prefix
    )
}

/// Passive health as `tollgate check` shows it.
fn health_text(health: &crate::proxy::HealthSettings) -> String {
    match health.max_fails {
        0 => "health off (max_fails 0)".to_owned(),
        max_fails => format!(
            "health max_fails {max_fails} fail_timeout {}",
            format_duration_ms(health.fail_timeout.as_millis() as u64)
        ),
    }
}

/// One upstream: its targets, clocks, health, retries and TLS.
fn upstream_line(upstream: &crate::proxy::UpstreamSettings) -> String {
    let targets: Vec<String> = upstream.targets.iter().map(|t| t.to_string()).collect();
    let mut line = format!(
        "upstream {}: {}   timeout {}   connect_timeout {}",
        upstream.name,
        targets.join(", "),
        format_duration_ms(upstream.timeout.as_millis() as u64),
        format_duration_ms(upstream.connect_timeout.as_millis() as u64),
    );
    if !upstream.pass_host_header {
        line.push_str("   own Host");
    }
    let _ = write!(
        line,
        "   idle_timeout {}   {}   attempts {}",
        format_duration_ms(upstream.idle_timeout.as_millis() as u64),
        health_text(&upstream.health),
        // Each try goes to another target: never more than there are.
        upstream
            .attempts
            .map_or(upstream.targets.len(), |n| n.get() as usize)
            .min(upstream.targets.len()),
    );
    if let Some(tls) = &upstream.tls {
        let files = tls.files();
        let _ = match &files.ca_file {
            Some(ca) => write!(line, "   tls ca_file {}", ca.display()),
            None => write!(line, "   tls system roots"),
        };
        if let Some(cert) = &files.cert_file {
            let _ = write!(line, ", client cert {}", cert.display());
        }
    }
    line.push('\n');
    line
}

/// The `consumers:` block: how callers are identified, then one row per plan limit with the routes it applies on.
fn consumers_summary(consumers: &ConsumersSettings, routes: &[RouteSettings]) -> String {
    let identify: Vec<String> = consumers.identify.iter().map(identifier_summary).collect();
    let anonymous = match &consumers.anonymous {
        Anonymous::NoPlan => "no plan".to_owned(),
        Anonymous::Plan(plan) => format!("plan {plan}"),
        Anonymous::Reject => "reject (401)".to_owned(),
    };
    let failures = consumers.failed_credentials.map_or(String::new(), |f| {
        format!(
            "   failed credentials {} per {} per address",
            f.limit,
            format_duration_ms(f.period_ms)
        )
    });
    let mut out = format!(
        "consumers: identify {}   static keys {}   anonymous {anonymous}{failures}\n\n",
        if identify.is_empty() {
            "nothing".to_owned()
        } else {
            identify.join(", ")
        },
        consumers.keys.len(),
    );
    let mut rows = vec![[
        "PLAN",
        "LIMIT",
        "ALGORITHM",
        "PARAMETERS",
        "KEY",
        "COST",
        "ROUTES",
    ]
    .map(str::to_owned)];
    for plan in &consumers.plans {
        rows.extend(plan_rows(plan, consumers, routes));
    }
    out.push_str(&table(&rows));
    out
}

/// One way of identifying callers, as `tollgate check` lists it.
fn identifier_summary(identifier: &IdentifierSettings) -> String {
    match identifier {
        IdentifierSettings::ApiKey {
            source: CredentialSource::Header(name),
            ..
        } => format!("api_key header {name}"),
        IdentifierSettings::ApiKey {
            source: CredentialSource::Query(name),
            ..
        } => format!("api_key query {name}"),
        #[cfg(feature = "jwt")]
        IdentifierSettings::Jwt { settings: jwt, .. } => {
            let algorithms: Vec<String> = jwt.algorithms.iter().map(|a| format!("{a:?}")).collect();
            let keys = match &jwt.keys {
                JwtKeySource::File(path) => format!("jwks_file {}", path.display()),
                JwtKeySource::Url { url, .. } => format!("jwks_url {url}"),
                JwtKeySource::Secret(_) => "secret_env".to_owned(),
            };
            format!(
                "jwt {} ({}, {keys}, consumers {:?}...)",
                jwt.header,
                algorithms.join(","),
                jwt.consumer_prefix()
            )
        }
        IdentifierSettings::Mtls {
            consumer_prefix,
            plan,
        } => match plan {
            Some(plan) => format!("mtls (consumers {consumer_prefix:?}..., plan {plan})"),
            None => format!("mtls (consumers {consumer_prefix:?}...)"),
        },
    }
}

/// The rows of one plan's limits, with the routes it is used on.
fn plan_rows(
    plan: &Plan,
    consumers: &ConsumersSettings,
    routes: &[RouteSettings],
) -> Vec<[String; 7]> {
    let mut rows = Vec::new();
    // Anonymous callers never reach a route that requires a credential.
    let anonymous_plan = consumers.anonymous == Anonymous::Plan(plan.name.clone());
    let used_on: Vec<&str> = routes
        .iter()
        .filter(|route| match route.consumers {
            ConsumerMode::Off => false,
            ConsumerMode::Optional => true,
            ConsumerMode::Required => !anonymous_plan,
        })
        .map(|route| route.name.as_str())
        .collect();
    let used_on = if used_on.is_empty() {
        "(none)".to_owned()
    } else {
        used_on.join(", ")
    };
    if plan.limits.is_empty() {
        rows.push([
            plan.name.clone(),
            "(none)".to_owned(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            used_on,
        ]);
        return rows;
    }
    for (i, settings) in plan.limits.iter().enumerate() {
        let first = i == 0;
        rows.push([
            if first {
                plan.name.clone()
            } else {
                String::new()
            },
            settings.limit.name().to_owned(),
            settings.limit.algorithm().name().to_owned(),
            parameters(settings.limit.algorithm()),
            settings.key.to_string(),
            cost(settings),
            if first {
                used_on.clone()
            } else {
                String::new()
            },
        ]);
    }
    rows
}

fn route_rows(route: &RouteSettings) -> Vec<[String; 8]> {
    let mut action = match &route.action {
        RouteAction::Upstream(name) => format!("upstream {name}"),
        RouteAction::Respond(direct) => format!("respond {}", direct.status.as_u16()),
        RouteAction::LimitsOnly => "limits only".to_owned(),
    };
    if route.deny_status.as_u16() != 429 {
        let _ = write!(action, " (deny {})", route.deny_status.as_u16());
    }
    if !route.headers {
        action.push_str(" (headers: false)");
    }
    let mut first = [
        route.name.clone(),
        describe_match(route),
        action,
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    ];
    if route.limits.is_empty() {
        first[3] = "(none)".to_owned();
        return vec![first];
    }
    route
        .limits
        .iter()
        .enumerate()
        .map(|(i, settings)| {
            let mut row = if i == 0 {
                first.clone()
            } else {
                Default::default()
            };
            let key = match settings.key.missing() {
                MissingKey::Ip => settings.key.to_string(),
                MissingKey::Skip => format!("{} (else skip)", settings.key),
            };
            row[3] = if settings.limit.is_shadow() {
                format!("{} (shadow)", settings.limit.name())
            } else {
                settings.limit.name().to_owned()
            };
            row[4] = settings.limit.algorithm().name().to_owned();
            row[5] = parameters(settings.limit.algorithm());
            row[6] = key;
            row[7] = cost(settings);
            row
        })
        .collect()
}

/// What one request costs a limit, and when: `1`, `1 per answer 401, 403` for a limit counting answers, or the
/// tokens its answer reports (reserved before, settled after).
fn cost(settings: &LimitSettings) -> String {
    match &settings.counts {
        Counts::Requests => settings.limit.cost().to_string(),
        Counts::Status(statuses) => format!("{} per answer {statuses}", settings.limit.cost()),
        Counts::Tokens(kind) => format!("{} (reserved, then settled)", kind.name()),
    }
}

/// How a route with `usage:` reads its answers' tokens and what a request reserves.
fn usage_line(route: &str, usage: &UsageSettings) -> String {
    let format = match &usage.format {
        UsageFormat::OpenAi => "openai".to_owned(),
        UsageFormat::Anthropic => "anthropic".to_owned(),
        UsageFormat::Header(name) => format!("header:{name}"),
    };
    let prompt = match usage.prompt {
        PromptBound::BodyBytes => "the body's bytes".to_owned(),
        PromptBound::Tokens(tokens) => tokens.to_string(),
    };
    let completion = match usage.completion {
        CompletionBound::Tokens(tokens) => tokens.to_string(),
        CompletionBound::MaxTokens => {
            let mut text = "max_tokens".to_owned();
            if let Some(default) = usage.completion_default {
                let _ = write!(text, " (else {default})");
            }
            if let Some(cap) = usage.completion_cap {
                let _ = write!(text, " capped at {cap}");
            }
            text.push_str(" per choice");
            text
        }
    };
    let stream = if usage.inject_stream_usage {
        ", stream usage injected"
    } else {
        ""
    };
    let suffixes = usage.endpoints.as_slice();
    let endpoints = if suffixes.iter().any(|suffix| suffix == "/") {
        "every path".to_owned()
    } else if suffixes.is_empty() {
        "no path".to_owned()
    } else {
        format!("paths ending {}", suffixes.join(", "))
    };
    format!(
        "usage of {route}: format {format}, reserves prompt {prompt} + completion {completion} on {endpoints}{stream}, body up to {} bytes\n",
        usage.max_request_bytes
    )
}

fn describe_match(route: &RouteSettings) -> String {
    let m = &route.matcher;
    let mut parts = Vec::new();
    if let Some(p) = &m.path_prefix {
        parts.push(format!("{p}*"));
    }
    if let Some(p) = &m.path {
        parts.push(p.clone());
    }
    if !m.methods.is_empty() {
        let methods: Vec<&str> = m.methods.iter().map(|m| m.as_str()).collect();
        parts.push(methods.join(","));
    }
    if let Some(h) = &m.host {
        parts.push(format!("host {h}"));
    }
    if m.case_sensitive {
        parts.push("(case-sensitive)".to_owned());
    }
    match route.consumers {
        ConsumerMode::Off => {}
        ConsumerMode::Optional => parts.push("(consumers)".to_owned()),
        ConsumerMode::Required => parts.push("(consumers required)".to_owned()),
    }
    if !route.allow.is_empty() {
        let nets: Vec<String> = route.allow.iter().map(|n| n.to_string()).collect();
        parts.push(format!("(allow {})", nets.join(",")));
    }
    if parts.is_empty() {
        "everything".to_owned()
    } else {
        parts.join(" ")
    }
}

fn parameters(algorithm: &Algorithm) -> String {
    match *algorithm {
        Algorithm::FixedWindow { limit, period_ms }
        | Algorithm::SlidingWindow { limit, period_ms }
        | Algorithm::SlidingLog { limit, period_ms } => {
            format!("{limit} per {}", format_duration_ms(period_ms))
        }
        // `10000 per month (Europe/Berlin)`.
        Algorithm::CalendarWindow { limit, calendar } => format!("{limit} per {calendar}"),
        Algorithm::TokenBucket { rate, burst } | Algorithm::Gcra { rate, burst } => {
            format!("rate {rate}, burst {burst}")
        }
        Algorithm::LeakyBucket { rate, burst, mode } => match mode {
            LeakyMode::Reject => format!("rate {rate}, burst {burst}, reject"),
            LeakyMode::Delay { max_delay_ms } => {
                format!(
                    "rate {rate}, burst {burst}, delay ≤ {}",
                    format_duration_ms(max_delay_ms)
                )
            }
        },
        Algorithm::Concurrency {
            max,
            lease_ms,
            queue,
        } => {
            let lease = format_duration_ms(lease_ms);
            match queue {
                None => format!("{max} in flight, lease {lease}"),
                Some(queue) => format!(
                    "{max} in flight, lease {lease}, queue ≤ {} ({} waiting)",
                    format_duration_ms(queue.max_wait_ms),
                    queue.max_waiting
                ),
            }
        }
    }
}

/// Left-aligned columns two spaces apart, without trailing spaces.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The URL without its credentials (user info, and query parameters such as `sentinelPassword`), for output
/// that may be shared.
pub fn redact(url: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let mut out = match (base.find("://"), base.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &base[..scheme_end], &base[at..])
        }
        _ => base.to_owned(),
    };
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if name.to_ascii_lowercase().contains("password") => {
                    format!("{name}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_sensitive_route_says_so() {
        let yaml = "store:\n  backend: memory\nroutes:\n  - name: api\n    match: { path_prefix: /api, case_sensitive: true }\n    respond: { status: 200 }\n";
        let config = super::super::parse(yaml, std::path::Path::new("g.yaml")).unwrap();
        assert_eq!(describe_match(&config.routes[0]), "/api* (case-sensitive)");
    }

    #[test]
    fn a_concurrency_limit_shows_its_slots_and_lease() {
        let yaml = "routes:\n  - name: chat\n    respond: { status: 200 }\n    limits:\n      - { name: in-flight, key: ip, algorithm: concurrency, max: 4, lease: 10s }\n";
        let config = super::super::parse(yaml, std::path::Path::new("g.yaml")).unwrap();
        let text = render(&config);
        assert!(
            text.contains("in-flight  concurrency  4 in flight, lease 10s"),
            "{text}"
        );
    }

    #[test]
    fn renders_one_row_per_limit_in_aligned_columns() {
        let yaml = "store:\n  backend: memory\nroutes:\n  - name: api\n    match: { path_prefix: /api, methods: [GET] }\n    respond: { status: 200 }\n    limits:\n      - name: per-ip\n        algorithm: sliding_window\n        limit: 100\n        period: 1m\n      - name: per-key\n        key: [header:x-api-key]\n        missing: skip\n        algorithm: gcra\n        rate: 1000/1h\n        burst: 50\n  - name: open\n    respond: { status: 204 }\n";
        let config = super::super::parse(yaml, std::path::Path::new("g.yaml")).unwrap();
        let text = render(&config);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "g.yaml: valid");
        // The header: listeners and store, server, client_ip (no upstreams here), then a blank line.
        assert!(lines[2].starts_with("server: "), "{text}");
        assert!(lines[3].starts_with("client_ip: "), "{text}");
        assert!(lines[5].starts_with("ROUTE  MATCH"), "{text}");
        assert!(lines[6].starts_with("api    /api* GET"), "{text}");
        assert!(
            lines[6].contains("per-ip   sliding_window  100 per 1m"),
            "{text}"
        );
        assert!(
            lines[7].contains(
                "per-key  gcra            rate 1000/h, burst 50  header:x-api-key (else skip)"
            ),
            "{text}"
        );
        assert!(lines[8].starts_with("open   everything"), "{text}");
        assert!(lines[8].ends_with("(none)"), "{text}");
    }

    #[test]
    fn plans_are_listed_with_the_routes_they_apply_on() {
        let yaml = r#"consumers:
  identify: [ { api_key: { header: x-api-key } } ]
  keys: [ { key: k1, consumer: acme, plan: pro } ]
  anonymous: { plan: anonymous }
  plans:
    anonymous: { limits: [ { name: per-ip, key: ip, algorithm: sliding_window, limit: 60, period: 1m } ] }
    pro: { limits: [ { name: hourly, key: consumer, algorithm: gcra, rate: 10000/1h, burst: 200 } ] }
routes:
  - { name: open, match: { path_prefix: /open }, respond: { status: 200 } }
  - { name: private, match: { path_prefix: /p }, respond: { status: 200 }, consumers: required }
  - { name: health, match: { path: /healthz }, respond: { status: 200 }, consumers: off }
"#;
        let config = super::super::parse(yaml, std::path::Path::new("g.yaml")).unwrap();
        let text = render(&config);
        assert!(text.contains("/open* (consumers)"), "{text}");
        assert!(text.contains("/p* (consumers required)"), "{text}");
        assert!(
            text.contains("consumers: identify api_key header x-api-key   static keys 1   anonymous plan anonymous"),
            "{text}"
        );
        let plan_rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("PLAN"))
            .collect();
        assert!(
            plan_rows[1].starts_with("anonymous  per-ip  sliding_window  60 per 1m"),
            "{text}"
        );
        assert!(plan_rows[1].ends_with("  open"), "{text}");
        assert!(
            plan_rows[2].starts_with("pro        hourly  gcra"),
            "{text}"
        );
        assert!(plan_rows[2].ends_with("  open, private"), "{text}");
    }

    #[cfg(feature = "llm")]
    #[test]
    fn token_limits_and_the_route_reservation_are_shown() {
        let yaml = r#"upstreams: { llm: { targets: ["http://127.0.0.1:9"] } }
routes:
  - name: chat
    match: { path_prefix: /v1 }
    upstream: llm
    usage:
      format: openai
      reserve: { prompt: body_bytes, completion: max_tokens, completion_default: 1024, completion_cap: 4096 }
      stream_usage: inject
    limits:
      - { name: tpm, key: ip, algorithm: sliding_window, limit: 100000, period: 1m, counts: total_tokens }
      - { name: rpm, key: ip, algorithm: gcra, rate: 60/1m, burst: 10 }
"#;
        let config = super::super::parse(yaml, std::path::Path::new("g.yaml")).unwrap();
        let text = render(&config);
        let tpm = text.lines().find(|l| l.contains("tpm")).expect("tpm's row");
        assert!(
            tpm.ends_with("ip   total_tokens (reserved, then settled)"),
            "{text}"
        );
        assert!(
            text.contains("usage of chat: format openai, reserves prompt the body's bytes + completion max_tokens (else 1024) capped at 4096 per choice on paths ending /chat/completions, /completions, /responses, stream usage injected, body up to 1048576 bytes"),
            "{text}"
        );
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("redis://user:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            redact("redis-sentinel://s:26379/0?sentinelServiceName=main&sentinelPassword=hunter2"),
            "redis-sentinel://s:26379/0?sentinelServiceName=main&sentinelPassword=***"
        );
    }
}
