//! A refusal's answer in an LLM provider's error shape (OpenAI's, Anthropic's), so that the provider's SDKs show it
//! (with the `llm` feature, whose routes name a provider).
//!
//! tollgate's own body (`{"error": code, ...facts}`) is rewritten, never built a second way: [`answer`]
//! (super::answer) makes every refusal's body once, and a route whose `usage.format` names a provider has it put in
//! that provider's shape here, its facts kept as extra members and said in the message.

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use serde_json::{Map, Value};

use super::policy::Policy;
use crate::usage::Dialect;

/// `retry-after-ms`: the wait in milliseconds, which the OpenAI and Anthropic SDKs prefer to `Retry-After`.
static RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

/// `refused`, tollgate's answer to a refusal on `policy`'s route, in the error shape of the provider the route's
/// `usage.format` names; as it is on every other route.
pub(super) fn provider_shaped(
    policy: Option<&Policy>,
    refused: Response<Value>,
) -> Response<Value> {
    match policy
        .and_then(Policy::usage)
        .and_then(|usage| usage.provider())
    {
        None => refused,
        Some(dialect) => {
            let (mut parts, body) = refused.into_parts();
            let body = shaped(dialect, parts.status, &mut parts.headers, body);
            Response::from_parts(parts, body)
        }
    }
}

/// `body`, tollgate's answer to a refusal with `status`, in `dialect`'s error shape; `headers` get `retry-after-ms`
/// beside a `Retry-After`. A body that is not tollgate's object is left as it is.
fn shaped(dialect: Dialect, status: StatusCode, headers: &mut HeaderMap, body: Value) -> Value {
    let Value::Object(mut facts) = body else {
        return body;
    };
    let code = match facts.shift_remove("error") {
        Some(Value::String(code)) => code,
        _ => String::from("refused"),
    };
    let message = match facts.shift_remove("message") {
        Some(Value::String(message)) => Some(message),
        _ => None,
    };
    let retry_after_ms = facts.get("retry_after_ms").and_then(Value::as_u64);
    if headers.contains_key(RETRY_AFTER) {
        let seconds = headers
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
        // The body's figure is the exact wait; `Retry-After` is it rounded up to whole seconds.
        if let Some(ms) = retry_after_ms.or(seconds.map(|s| s.saturating_mul(1000))) {
            headers.insert(RETRY_AFTER_MS.clone(), HeaderValue::from(ms.max(1)));
        }
    }
    let message = sentence(&code, message, &facts);
    let mut error = Map::new();
    match dialect {
        Dialect::OpenAi => {
            // OpenAI's own code for a rate limit, which clients test `e.code` against.
            let code = if code == "rate_limited" {
                String::from("rate_limit_exceeded")
            } else {
                code
            };
            error.insert("message".into(), Value::String(message));
            error.insert("type".into(), Value::from(openai_type(status)));
            error.insert("param".into(), Value::Null);
            error.insert("code".into(), Value::String(code));
            error.extend(facts);
            let mut shaped = Map::new();
            shaped.insert("error".into(), Value::Object(error));
            Value::Object(shaped)
        }
        Dialect::Anthropic => {
            error.insert("type".into(), Value::from(anthropic_type(status)));
            error.insert("message".into(), Value::String(message));
            error.insert("code".into(), Value::String(code));
            error.extend(facts);
            let mut shaped = Map::new();
            shaped.insert("type".into(), Value::from("error"));
            shaped.insert("error".into(), Value::Object(error));
            Value::Object(shaped)
        }
    }
}

/// OpenAI's error `type` for a refusal with `status`.
fn openai_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        429 => "rate_limit_exceeded",
        500.. => "server_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error `type` for a refusal with `status` (its documented errors, by status).
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        500.. => "api_error",
        _ => "invalid_request_error",
    }
}

/// The message an SDK shows for the refusal `code`: what tollgate's body said, with its facts in words.
fn sentence(code: &str, message: Option<String>, facts: &Map<String, Value>) -> String {
    let fact = |name: &str| match facts.get(name) {
        Some(Value::String(text)) => text.clone(),
        Some(value) => value.to_string(),
        None => String::from("?"),
    };
    let wait = || {
        facts
            .get("retry_after_ms")
            .and_then(Value::as_u64)
            .map_or(String::new(), |ms| {
                format!(" Please try again in {}.", seconds(ms))
            })
    };
    match code {
        "rate_limited" => format!(
            "Rate limit reached for limit {} of route {} (tollgate).{}",
            fact("limit"),
            fact("route"),
            wait()
        ),
        "reservation_too_large" => format!(
            "{} (limit {}: the request reserves {} tokens, the limit holds {}; tollgate)",
            message.unwrap_or_default(),
            fact("limit"),
            fact("reserved"),
            fact("capacity")
        ),
        "too_many_failed_credentials" => format!(
            "Too many failed credentials from this address (tollgate).{}",
            wait()
        ),
        "limiter_unavailable" => format!(
            "The rate limiter of route {} is unavailable (tollgate). Please try again in 1s.",
            fact("route")
        ),
        "unauthorized" | "forbidden" => {
            format!("Refused by tollgate: {code} ({}).", fact("reason"))
        }
        _ => match message {
            Some(message) => format!("{message} (tollgate: {code})"),
            None => format!("Refused by tollgate: {code}."),
        },
    }
}

/// `ms` as OpenAI writes a wait in its messages: `20ms`, `2.412s`.
fn seconds(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (whole, rest) = (ms / 1000, ms % 1000);
    if rest == 0 {
        format!("{whole}s")
    } else {
        let fraction = format!("{rest:03}");
        format!("{whole}.{}s", fraction.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rate_limit_speaks_each_dialect_with_its_facts() {
        let tollgate = json!({"error": "rate_limited", "route": "chat", "limit": "tpm", "retry_after_ms": 2412});
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from(3));
        let openai = shaped(
            Dialect::OpenAi,
            StatusCode::TOO_MANY_REQUESTS,
            &mut headers,
            tollgate.clone(),
        );
        assert_eq!(
            openai,
            json!({"error": {"message": "Rate limit reached for limit tpm of route chat (tollgate). Please try again in 2.412s.",
                "type": "rate_limit_exceeded", "param": null, "code": "rate_limit_exceeded",
                "route": "chat", "limit": "tpm", "retry_after_ms": 2412}})
        );
        assert_eq!(headers[&RETRY_AFTER_MS], "2412");
        let anthropic = shaped(
            Dialect::Anthropic,
            StatusCode::TOO_MANY_REQUESTS,
            &mut HeaderMap::new(),
            tollgate,
        );
        // Written in the provider's order, tollgate's facts after in theirs.
        assert_eq!(
            anthropic.to_string(),
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit reached for limit tpm of route chat (tollgate). Please try again in 2.412s.","code":"rate_limited","route":"chat","limit":"tpm","retry_after_ms":2412}}"#
        );
        let blocked = json!({"error": "forbidden", "reason": "consumer_blocked"});
        let anthropic = shaped(
            Dialect::Anthropic,
            StatusCode::FORBIDDEN,
            &mut HeaderMap::new(),
            blocked,
        );
        assert_eq!(anthropic["error"]["type"], "permission_error");
        assert_eq!(
            anthropic["error"]["message"],
            "Refused by tollgate: forbidden (consumer_blocked)."
        );
    }

    #[test]
    fn waits_are_written_as_openai_writes_them() {
        assert_eq!(seconds(20), "20ms");
        assert_eq!(seconds(6000), "6s");
        assert_eq!(seconds(2410), "2.41s");
    }
}
