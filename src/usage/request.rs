//! The request fields that bound an LLM answer's cost (its completion limit, how many answers it asks for, whether
//! it streams), read from the JSON body the client sent, and the rewrites that make the bound hold: a cap on the
//! completion limit and the usage report asked of an OpenAI stream. A rewrite changes only the bytes it must.

use std::fmt;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::reported::Dialect;

/// Which API a request body is for, from the fields it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestShape {
    /// OpenAI chat completions (`messages`).
    Chat,
    /// OpenAI's legacy completions (`prompt`).
    Completions,
    /// OpenAI Responses (`input`).
    Responses,
    /// Anthropic messages.
    Messages,
    /// An OpenAI-dialect body with none of those fields (embeddings have `input` too and read as Responses).
    Other,
}

/// What a request body says of the cost of its answer: the body's facts, not the request's (its method, fields,
/// client, which admission reads as [`crate::key::RequestFacts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyFacts {
    pub shape: RequestShape,
    /// The largest completion limit the body names: OpenAI's `max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`; Anthropic's `max_tokens`. `None` when it names none (or only `null`).
    pub max_tokens: Option<u64>,
    /// How many answers the request has generated: OpenAI's `n` and legacy `best_of` (the larger), else 1. Each is
    /// held to `max_tokens`, so the completion is bounded by their product.
    pub choices: u64,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage: true`.
    pub include_usage: bool,
}

/// Why a request body cannot be read for its cost. Each is the client's fault (400): a body tollgate cannot read
/// exactly is one it cannot bound, and guessing how the upstream reads it is how a budget is overrun.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestBodyError {
    #[error("the request body is not UTF-8 text")]
    NotUtf8,
    #[error("the request body is not JSON: {0}")]
    NotJson(String),
    #[error("the request body is not a JSON object")]
    NotAnObject,
    /// APIs differ on which of two same-named fields they read (most take the last): such a body is refused
    /// rather than read one way here and another upstream.
    #[error("the request body names `{0}` more than once")]
    DuplicateField(String),
    #[error("`{field}` must be {expected}")]
    Field {
        field: &'static str,
        expected: &'static str,
    },
}

/// The rewrites a route asks of the bodies it forwards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rewrites {
    /// A completion limit above this is lowered to it.
    pub completion_cap: Option<u64>,
    /// A request naming no completion limit is given this one (no more than the cap), under the name its API
    /// reads: `max_completion_tokens` (chat), `max_tokens` (legacy completions), `max_output_tokens` (Responses).
    /// Anthropic requires `max_tokens`, so a body without it is refused upstream and left as it is.
    pub completion_when_absent: Option<u64>,
    /// A streamed OpenAI chat or legacy completions request gets `stream_options.include_usage: true` when it does
    /// not ask for it (absent, `null` or `false`), so that its stream ends with the usage.
    pub inject_stream_usage: bool,
}

/// A body after its rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The body to forward, when it changed (else the client's, unchanged); its length is the new
    /// `Content-Length` ([`set_body_length`]).
    pub body: Option<Bytes>,
    /// What the forwarded body says.
    pub facts: BodyFacts,
}

/// The members of a JSON object, each value as its text in the body.
struct Members<'a> {
    /// The object's text, from its `{`.
    object: &'a str,
    entries: Vec<(String, &'a RawValue)>,
}

/// Reads an object's members without reading their values.
struct MembersVisitor;

/// A change to the body: `remove` bytes at `at` replaced with `insert`.
struct Edit {
    at: usize,
    remove: usize,
    insert: String,
}

const COUNT: &str = "a whole number from 0 to 2^64-1, or null";
const BOOLEAN: &str = "true, false or null";
const OPENAI_LIMITS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// What `body` says of its answer's cost, read as an API of `dialect` reads it.
pub fn read_request(dialect: Dialect, body: &[u8]) -> Result<BodyFacts, RequestBodyError> {
    let text = std::str::from_utf8(body).map_err(|_| RequestBodyError::NotUtf8)?;
    let members = Members::parse(text)?;
    facts(dialect, &members)
}

/// `body` with `rewrites` applied, and what it then says.
pub fn rewrite_request(
    dialect: Dialect,
    body: &[u8],
    rewrites: &Rewrites,
) -> Result<Rewritten, RequestBodyError> {
    let text = std::str::from_utf8(body).map_err(|_| RequestBodyError::NotUtf8)?;
    let members = Members::parse(text)?;
    let facts = facts(dialect, &members)?;
    let mut edits = Vec::new();
    if let Some(cap) = rewrites.completion_cap {
        cap_completion(dialect, text, &members, &facts, cap, rewrites, &mut edits)?;
    } else if let Some(absent) = rewrites.completion_when_absent {
        if facts.max_tokens.is_none() {
            set_absent_completion(text, &members, &facts, absent, &mut edits);
        }
    }
    if rewrites.inject_stream_usage
        && dialect == Dialect::OpenAi
        && matches!(facts.shape, RequestShape::Chat | RequestShape::Completions)
        && facts.stream
        && !facts.include_usage
    {
        inject_stream_usage(text, &members, &mut edits)?;
    }
    if edits.is_empty() {
        return Ok(Rewritten { body: None, facts });
    }
    let edited = apply(text, edits);
    // The forwarded body is read again: what it says is what the reservation is made from.
    let facts = read_request(dialect, edited.as_bytes())?;
    Ok(Rewritten {
        body: Some(Bytes::from(edited)),
        facts,
    })
}

/// Sets the headers of a request whose body was replaced by one of `length` bytes.
pub fn set_body_length(headers: &mut HeaderMap, length: usize) {
    headers.remove(TRANSFER_ENCODING);
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
}

fn facts(dialect: Dialect, members: &Members<'_>) -> Result<BodyFacts, RequestBodyError> {
    let limits: &[&'static str] = match dialect {
        Dialect::OpenAi => &OPENAI_LIMITS,
        Dialect::Anthropic => &OPENAI_LIMITS[..1],
    };
    let mut max_tokens = None;
    for &field in limits {
        if let Some(limit) = count(members, field)? {
            max_tokens = max_tokens.max(Some(limit));
        }
    }
    let choices = match dialect {
        Dialect::OpenAi => count(members, "n")?
            .unwrap_or(1)
            .max(count(members, "best_of")?.unwrap_or(1))
            .max(1),
        Dialect::Anthropic => 1,
    };
    let stream = boolean(members, "stream")?.unwrap_or(false);
    let include_usage = match members.get("stream_options") {
        None => false,
        Some(options) if options.get() == "null" => false,
        Some(options) => {
            let options = Members::parse_object(options.get(), "stream_options")?;
            boolean(&options, "include_usage")?.unwrap_or(false)
        }
    };
    let shape = match dialect {
        Dialect::Anthropic => RequestShape::Messages,
        Dialect::OpenAi if members.get("messages").is_some() => RequestShape::Chat,
        Dialect::OpenAi if members.get("input").is_some() => RequestShape::Responses,
        Dialect::OpenAi if members.get("prompt").is_some() => RequestShape::Completions,
        Dialect::OpenAi => RequestShape::Other,
    };
    Ok(BodyFacts {
        shape,
        max_tokens,
        choices,
        stream,
        include_usage,
    })
}

fn count(members: &Members<'_>, field: &'static str) -> Result<Option<u64>, RequestBodyError> {
    members.get(field).map_or(Ok(None), |raw| {
        serde_json::from_str::<Option<u64>>(raw.get()).map_err(|_| RequestBodyError::Field {
            field,
            expected: COUNT,
        })
    })
}

fn boolean(members: &Members<'_>, field: &'static str) -> Result<Option<bool>, RequestBodyError> {
    members.get(field).map_or(Ok(None), |raw| {
        serde_json::from_str::<Option<bool>>(raw.get()).map_err(|_| RequestBodyError::Field {
            field,
            expected: BOOLEAN,
        })
    })
}

fn cap_completion(
    dialect: Dialect,
    text: &str,
    members: &Members<'_>,
    facts: &BodyFacts,
    cap: u64,
    rewrites: &Rewrites,
    edits: &mut Vec<Edit>,
) -> Result<(), RequestBodyError> {
    let limits: &[&'static str] = match dialect {
        Dialect::OpenAi => &OPENAI_LIMITS,
        Dialect::Anthropic => &OPENAI_LIMITS[..1],
    };
    for &field in limits {
        if let (Some(limit), Some(raw)) = (count(members, field)?, members.get(field)) {
            if limit > cap {
                edits.push(Edit {
                    at: offset(text, raw.get()),
                    remove: raw.get().len(),
                    insert: cap.to_string(),
                });
            }
        }
    }
    if facts.max_tokens.is_none() {
        let absent = rewrites.completion_when_absent.unwrap_or(cap).min(cap);
        set_absent_completion(text, members, facts, absent, edits);
    }
    Ok(())
}

fn set_absent_completion(
    text: &str,
    members: &Members<'_>,
    facts: &BodyFacts,
    limit: u64,
    edits: &mut Vec<Edit>,
) {
    let field = match facts.shape {
        RequestShape::Chat => "max_completion_tokens",
        RequestShape::Completions => "max_tokens",
        RequestShape::Responses => "max_output_tokens",
        RequestShape::Messages | RequestShape::Other => return,
    };
    set_member(text, members, field, &limit.to_string(), edits);
}

fn inject_stream_usage(
    text: &str,
    members: &Members<'_>,
    edits: &mut Vec<Edit>,
) -> Result<(), RequestBodyError> {
    match members.get("stream_options") {
        Some(options) if options.get() != "null" => {
            let inner = Members::parse_object(options.get(), "stream_options")?;
            set_member(text, &inner, "include_usage", "true", edits);
        }
        _ => set_member(
            text,
            members,
            "stream_options",
            r#"{"include_usage":true}"#,
            edits,
        ),
    }
    Ok(())
}

/// `field` set to `value` in the object `members` were read from: its value replaced when present (as `null`),
/// else the member added first in the object.
fn set_member(text: &str, members: &Members<'_>, field: &str, value: &str, edits: &mut Vec<Edit>) {
    if let Some(raw) = members.get(field) {
        edits.push(Edit {
            at: offset(text, raw.get()),
            remove: raw.get().len(),
            insert: value.to_owned(),
        });
        return;
    }
    let separator = if members.entries.is_empty() { "" } else { "," };
    edits.push(Edit {
        at: offset(text, members.object) + 1,
        remove: 0,
        insert: format!("\"{field}\":{value}{separator}"),
    });
}

/// Where `part`, a slice of `text`, starts in it.
fn offset(text: &str, part: &str) -> usize {
    (part.as_ptr() as usize).saturating_sub(text.as_ptr() as usize)
}

fn apply(text: &str, mut edits: Vec<Edit>) -> String {
    edits.sort_by_key(|edit| edit.at);
    let extra: usize = edits.iter().map(|edit| edit.insert.len()).sum();
    let mut out = String::with_capacity(text.len() + extra);
    let mut from = 0;
    for edit in edits {
        out.push_str(&text[from..edit.at]);
        out.push_str(&edit.insert);
        from = edit.at + edit.remove;
    }
    out.push_str(&text[from..]);
    out
}

// === impl Members ===

impl<'a> Members<'a> {
    /// The members of the body `text`, which must be one JSON object naming each member once.
    fn parse(text: &'a str) -> Result<Self, RequestBodyError> {
        let object = text.trim_start_matches([' ', '\t', '\n', '\r']);
        if !object.starts_with('{') {
            return match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Ok(_) => Err(RequestBodyError::NotAnObject),
                Err(error) => Err(RequestBodyError::NotJson(error.to_string())),
            };
        }
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let entries = deserializer
            .deserialize_map(MembersVisitor)
            .and_then(|entries| deserializer.end().map(|()| entries))
            .map_err(|error| RequestBodyError::NotJson(error.to_string()))?;
        Self::checked(object, entries)
    }

    /// The members of `field`'s value `raw`, which must be an object naming each member once.
    fn parse_object(raw: &'a str, field: &'static str) -> Result<Self, RequestBodyError> {
        if !raw.starts_with('{') {
            return Err(RequestBodyError::Field {
                field,
                expected: "an object or null",
            });
        }
        let mut deserializer = serde_json::Deserializer::from_str(raw);
        let entries = deserializer
            .deserialize_map(MembersVisitor)
            .map_err(|error| RequestBodyError::NotJson(error.to_string()))?;
        Self::checked(raw, entries)
    }

    fn checked(
        object: &'a str,
        entries: Vec<(String, &'a RawValue)>,
    ) -> Result<Self, RequestBodyError> {
        // Sorted rather than hashed: no hasher to seed per request, and no key a client picks makes it slower.
        let mut keys: Vec<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
        keys.sort_unstable();
        if let Some(pair) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
            // The client's text, shortened: it is echoed in the answer.
            let shown: String = pair[0].chars().take(64).collect();
            return Err(RequestBodyError::DuplicateField(shown));
        }
        Ok(Self { object, entries })
    }

    fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.entries
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
    }
}

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Vec<(String, &'de RawValue)>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value: &'de RawValue = map.next_value()?;
            entries.push((key, value));
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests;
