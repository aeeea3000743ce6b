//! The `routes:` section: names, matches, the action (upstream or respond), limits, allowlists, consumers.

use http::{HeaderName, HeaderValue, Method, StatusCode};

use super::checks::{check_name, networks, unique_names};
use super::file::Reader;
use super::issues::Issues;
use crate::config::limits::limit_list;
use crate::config::model::*;
use crate::config::raw::*;
use crate::key::{TokenKind, PLAN_KEY_SCOPE};
use crate::usage::{
    CompletionBound, Endpoints, PromptBound, UsageFormat, DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_READ_ON_BYTES, DEFAULT_READ_ON_TIMEOUT,
};

/// Methods a route may name. Extension methods are refused: a misspelt `GTE` would otherwise match nothing, silently.
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
];

pub(super) fn routes(
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
    let limits = limit_list(issues, at, &raw.limits);
    let deny_status = deny_status(issues, &format!("{at}.deny_status"), raw.deny_status);
    let allow = networks(issues, &format!("{at}.allow"), &raw.allow);
    let usage = raw
        .usage
        .as_ref()
        .and_then(|usage| route_usage(issues, &format!("{at}.usage"), usage, reader));
    counted_tokens(issues, at, raw);
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
        usage,
    })
}

/// Why a build without the `llm` feature refuses a route's `usage:` and the limits that count tokens.
const NO_LLM: &str = "this build of tollgate has no LLM token budgets (its `llm` feature is off)";

/// `usage:` of a route: the format, the reservation's bounds, the stream rewrite and the body's bound.
fn route_usage(
    issues: &mut Issues,
    at: &str,
    raw: &RawUsage,
    reader: Reader,
) -> Option<UsageSettings> {
    let before = issues.count();
    if !cfg!(feature = "llm") {
        // Refused, never served without its token limits, which would then limit nothing.
        issues.add(at, NO_LLM);
        return None;
    }
    if reader == Reader::Layers {
        issues.add(
            at,
            "is read by the gateway only: the tower layer does not read request bodies",
        );
    }
    let format = match raw.format.as_deref() {
        None => {
            issues.add(
                format!("{at}.format"),
                "is required: openai, anthropic or header:<name>",
            );
            None
        }
        Some(text) => issues.check(format!("{at}.format"), text.parse::<UsageFormat>()),
    };
    let reserve = &raw.reserve;
    let (prompt, completion) = usage_reserve(issues, at, reserve);
    let inject_stream_usage =
        stream_usage(issues, at, raw.stream_usage.as_deref(), format.as_ref());
    let max_request_bytes = raw.max_request_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BYTES);
    if max_request_bytes == 0 {
        issues.add(format!("{at}.max_request_bytes"), "must be greater than 0");
    }
    let read_on_bytes = raw.read_on_bytes.unwrap_or(DEFAULT_READ_ON_BYTES);
    let read_on_timeout = match raw.read_on_timeout.as_deref() {
        None => Some(DEFAULT_READ_ON_TIMEOUT),
        Some(text) => {
            super::checks::positive_duration(issues, &format!("{at}.read_on_timeout"), text)
        }
    };
    let endpoints = match (&raw.endpoints, &format) {
        (Some(suffixes), _) => endpoints(issues, &format!("{at}.endpoints"), suffixes),
        (None, Some(format)) => Some(Endpoints::of(format)),
        (None, None) => None,
    };
    if issues.count() != before {
        return None;
    }
    Some(UsageSettings {
        endpoints: endpoints?,
        format: format?,
        prompt: prompt?,
        completion: completion?,
        completion_default: reserve.completion_default,
        completion_cap: reserve.completion_cap,
        inject_stream_usage,
        max_request_bytes,
        read_on_bytes,
        read_on_timeout: read_on_timeout?,
    })
}

/// `usage.reserve`: the bounds a request reserves before its answer says what it cost.
fn usage_reserve(
    issues: &mut Issues,
    at: &str,
    reserve: &RawReserve,
) -> (Option<PromptBound>, Option<CompletionBound>) {
    let prompt = match reserve.prompt.as_deref() {
        None | Some("body_bytes") => Some(PromptBound::BodyBytes),
        Some(text) => issues.check(
            format!("{at}.reserve.prompt"),
            tokens(text, "body_bytes").map(PromptBound::Tokens),
        ),
    };
    let completion = match reserve.completion.as_deref() {
        None | Some("max_tokens") => Some(CompletionBound::MaxTokens),
        Some(text) => issues.check(
            format!("{at}.reserve.completion"),
            tokens(text, "max_tokens").map(CompletionBound::Tokens),
        ),
    };
    if completion == Some(CompletionBound::MaxTokens)
        && reserve.completion_default.is_none()
        && reserve.completion_cap.is_none()
    {
        issues.add(
            format!("{at}.reserve"),
            "needs completion_default or completion_cap: a request that names no max_tokens must still have a bound",
        );
    }
    if let (Some(default), Some(cap)) = (reserve.completion_default, reserve.completion_cap) {
        if default > cap {
            issues.add(
                format!("{at}.reserve.completion_default"),
                format_args!("{default} is above completion_cap {cap}"),
            );
        }
    }
    for (field, value) in [
        ("completion_default", reserve.completion_default),
        ("completion_cap", reserve.completion_cap),
    ] {
        if value == Some(0) {
            issues.add(format!("{at}.reserve.{field}"), "must be greater than 0");
        }
    }
    (prompt, completion)
}

/// `usage.stream_usage`: whether OpenAI streams are asked for their usage (`inject`), which only OpenAI's format
/// knows how to ask.
fn stream_usage(
    issues: &mut Issues,
    at: &str,
    value: Option<&str>,
    format: Option<&UsageFormat>,
) -> bool {
    match value {
        None | Some("off") => false,
        Some("inject") => {
            if format.is_some_and(|f| *f != UsageFormat::OpenAi) {
                issues.add(
                    format!("{at}.stream_usage"),
                    "inject asks OpenAI streams for their usage: it needs format: openai",
                );
            }
            true
        }
        Some(other) => {
            issues.add(
                format!("{at}.stream_usage"),
                format_args!("unknown value {other:?} (use inject or off)"),
            );
            false
        }
    }
}

/// `usage.endpoints`: path suffixes of whole segments, each as a path is written (`/chat/completions`; `/` for
/// every path), so that each can match a request path.
fn endpoints(issues: &mut Issues, at: &str, suffixes: &[String]) -> Option<Endpoints> {
    let before = issues.count();
    for (i, suffix) in suffixes.iter().enumerate() {
        let problem = if !suffix.starts_with('/') {
            Some("must start with / (a path suffix of whole segments, like /chat/completions)")
        } else if suffix.len() > 1 && suffix.ends_with('/') {
            Some("must not end with / (a trailing / is ignored in request paths)")
        } else if suffix
            .split('/')
            .skip(1)
            .any(|segment| matches!(segment, "" | "." | ".."))
            && suffix != "/"
        {
            Some("must not have an empty, . or .. segment: request paths are normalised and have none")
        } else if suffix
            .bytes()
            .any(|b| matches!(b, b'?' | b'#' | b';' | b'%' | b'\\') || !b.is_ascii_graphic())
        {
            Some("must be a plain path: no query, fragment, parameters, escapes, spaces or non-ASCII")
        } else {
            None
        };
        if let Some(problem) = problem {
            issues.add(format!("{at}[{i}]"), format_args!("{suffix:?} {problem}"));
        }
    }
    (issues.count() == before).then(|| Endpoints::suffixes(suffixes.iter().cloned()))
}

/// A number of tokens, or `word`.
fn tokens(text: &str, word: &str) -> Result<u64, String> {
    text.parse::<u64>()
        .map_err(|_| format!("{text:?} is neither {word} nor a number of tokens"))
}

/// Limits that count tokens need the route to say how its answers report them, in a form that has that kind.
fn counted_tokens(issues: &mut Issues, at: &str, raw: &RawRoute) {
    let format = raw
        .usage
        .as_ref()
        .and_then(|usage| usage.format.as_deref()?.parse::<UsageFormat>().ok());
    for (j, limit) in raw.limits.iter().enumerate() {
        let Some(RawCounts::Name(name)) = &limit.counts else {
            continue;
        };
        let Some(kind) = TokenKind::from_name(name) else {
            continue;
        };
        let at = format!("{at}.limits[{j}].counts");
        match (raw.usage.as_ref(), &format) {
            _ if !cfg!(feature = "llm") => issues.add(at, format_args!("{name}: {NO_LLM}")),
            (None, _) => issues.add(
                at,
                format_args!(
                    "{name} needs the route's usage: block (how its answers report tokens: format openai, anthropic or header:<name>)"
                ),
            ),
            (_, Some(UsageFormat::Header(header))) if kind != TokenKind::Total => issues.add(
                at,
                format_args!(
                    "format header:{header} reports one number, counted as total_tokens: use counts: total_tokens"
                ),
            ),
            _ => {}
        }
    }
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
