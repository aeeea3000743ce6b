//! Reads what an answer reports it cost as its body goes by: a JSON body's `usage`, the usage events of a
//! server-sent event stream, or a number in a header or trailer, chosen from the route's format and the answer's
//! head. It holds at most one `usage` object and one short event, however long the answer.

use std::sync::LazyLock;

use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue};
use memchr::memmem::Finder;

use super::json::{Places, UsageScanner};
use super::reported::{Dialect, Reported, Usage, MAX_COUNT};
use super::settings::UsageFormat;
use super::sse::{SseParser, SseSink};

/// How the reader reads this answer.
#[derive(Debug)]
enum Mode {
    /// A JSON body: the last top-level `usage` object.
    Json(UsageScanner),
    /// An event stream: each dispatched event's `usage` refines the counts so far.
    Sse(Box<SseReading>),
    /// The header or trailer named.
    Header(HeaderName),
    /// A body whose bytes are not the JSON or events they encode (compressed): nothing can be read from it.
    Unreadable,
}

/// An event stream's parser and the scanner of the current event's data.
#[derive(Debug)]
struct SseReading {
    parser: SseParser,
    events: EventUsage,
}

/// The current event's usage, kept when the event is dispatched.
///
/// Most events of a stream carry a few words of the answer and no usage. An event is held (up to
/// [`HELD_EVENT_BYTES`]) rather than scanned as it comes, and scanned at its end only if it could name `usage`: a
/// JSON key that reads `usage` is written with those letters or with a `\u` escape. A longer event is scanned as
/// it comes, from its held start on.
#[derive(Debug)]
struct EventUsage {
    scanner: UsageScanner,
    /// The current event's data while it is held (not scanned yet).
    held: Vec<u8>,
    /// The current event is being scanned as it comes.
    scanning: bool,
    reported: Reported,
    any: bool,
}

/// The longest event held before it is scanned: a stream's memory for it (streamed answers' events are a few
/// hundred bytes; a longer one is scanned as it comes).
const HELD_EVENT_BYTES: usize = 4 * 1024;

/// The reading of one answer's usage. Made from the answer's head, fed its body and trailers; [`UsageReader::usage`]
/// says what was reported so far, and [`UsageReader::finish`] completes the reading at the body's end.
#[derive(Debug)]
pub struct UsageReader {
    dialect: Dialect,
    mode: Mode,
    /// The counts read so far (JSON bodies and headers: the last report; streams: merged at each event).
    reported: Reported,
    any: bool,
    header_total: Option<u64>,
}

// === impl UsageReader ===

impl UsageReader {
    /// The reader of an answer with these headers on a route with `format`. A body whose `Content-Encoding` is not
    /// `identity` is not read (its usage is missing): routes that read usage should ask the upstream for
    /// uncompressed answers (`accept-encoding: identity`).
    pub fn new(format: &UsageFormat, headers: &HeaderMap) -> Self {
        let dialect = match format {
            UsageFormat::Anthropic => Dialect::Anthropic,
            UsageFormat::OpenAi | UsageFormat::Header(_) => Dialect::OpenAi,
        };
        let mut reader = Self {
            dialect,
            mode: Mode::Unreadable,
            reported: Reported::default(),
            any: false,
            header_total: None,
        };
        reader.mode = match format {
            UsageFormat::Header(name) => {
                reader.header_total = header_count(headers, name);
                Mode::Header(name.clone())
            }
            UsageFormat::OpenAi | UsageFormat::Anthropic if !identity(headers) => Mode::Unreadable,
            UsageFormat::OpenAi | UsageFormat::Anthropic if event_stream(headers) => {
                Mode::Sse(Box::new(SseReading {
                    parser: SseParser::new(),
                    events: EventUsage {
                        scanner: UsageScanner::new(Places::TopAndNested),
                        held: Vec::new(),
                        scanning: false,
                        reported: Reported::default(),
                        any: false,
                    },
                }))
            }
            UsageFormat::OpenAi | UsageFormat::Anthropic => {
                Mode::Json(UsageScanner::new(Places::Top))
            }
        };
        reader
    }

    /// The body's next bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        match &mut self.mode {
            Mode::Json(scanner) => {
                scanner.feed(bytes);
                if let Some(found) = scanner.take_found() {
                    self.reported = found;
                    self.any = true;
                }
            }
            Mode::Sse(reading) => {
                reading.parser.feed(bytes, &mut reading.events);
                self.take_events();
            }
            Mode::Header(_) | Mode::Unreadable => {}
        }
    }

    /// The answer's trailers.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        if let Mode::Header(name) = &self.mode {
            if let Some(total) = header_count(trailers, name) {
                self.header_total = Some(total);
            }
        }
    }

    /// The body ended (not cut): a stream's last event, if no blank line followed it, counts.
    pub fn finish(&mut self) {
        if let Mode::Sse(reading) = &mut self.mode {
            reading.parser.finish(&mut reading.events);
            self.take_events();
        }
    }

    /// Whether the usage is whole before the body ends: a header's number, read with the head.
    pub fn is_whole(&self) -> bool {
        matches!(self.mode, Mode::Header(_)) && self.header_total.is_some()
    }

    /// Whether more of the body could tell more of the usage (not a compressed body's).
    pub fn may_learn_more(&self) -> bool {
        !matches!(self.mode, Mode::Unreadable)
    }

    /// What the answer reported so far ([`Usage::MISSING`] if nothing).
    pub fn usage(&self) -> Usage {
        if let Mode::Header(_) = self.mode {
            return self.header_total.map_or(Usage::MISSING, Usage::total);
        }
        if !self.any {
            return Usage::MISSING;
        }
        self.reported.usage(self.dialect)
    }

    fn take_events(&mut self) {
        if let Mode::Sse(reading) = &mut self.mode {
            if std::mem::take(&mut reading.events.any) {
                self.reported
                    .merge(std::mem::take(&mut reading.events.reported));
                self.any = true;
            }
        }
    }
}

// === impl EventUsage ===

impl EventUsage {
    /// Scans the held start of the event, and the rest of it as it comes.
    fn scan_from_here(&mut self) {
        self.scanning = true;
        self.scanner.feed(&self.held);
        self.held.clear();
    }
}

/// Whether an event's data could name a `usage` key: with its letters, or escaped.
fn may_name_usage(data: &[u8]) -> bool {
    static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("usage"));
    static ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\\u"));
    USAGE.find(data).is_some() || ESCAPE.find(data).is_some()
}

impl SseSink for EventUsage {
    fn data(&mut self, piece: &[u8]) {
        if self.scanning {
            self.scanner.feed(piece);
        } else if self.held.len() + piece.len() <= HELD_EVENT_BYTES {
            self.held.extend_from_slice(piece);
        } else {
            self.scan_from_here();
            self.scanner.feed(piece);
        }
    }

    fn end(&mut self, dispatched: bool) {
        if !self.scanning {
            if !may_name_usage(&self.held) {
                self.held.clear();
                return;
            }
            self.scan_from_here();
        }
        self.scanning = false;
        if let Some(found) = self.scanner.take_found() {
            // An event cut off by the stream's end without its blank line is dispatched by `finish` only.
            if dispatched {
                self.reported.merge(found);
                self.any = true;
            }
        }
        self.scanner.reset();
    }
}

/// Asks the upstream for an answer whose usage can be read as it passes: `accept-encoding: identity` in place of
/// what the client accepts (the official clients ask for gzip, and a compressed answer is not read). For the
/// request forwarded on a route that reads usage from the body.
pub fn accept_readable_answers(headers: &mut HeaderMap) {
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
}

/// Whether the body's bytes are as sent (no `Content-Encoding`, or `identity`).
fn identity(headers: &HeaderMap) -> bool {
    headers.get_all(CONTENT_ENCODING).iter().all(|value| {
        value.to_str().is_ok_and(|value| {
            value
                .split(',')
                .all(|coding| coding.trim().eq_ignore_ascii_case("identity"))
        })
    })
}

/// Whether the answer is a server-sent event stream.
fn event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The whole number in the field `name` (the last, if repeated): ASCII digits only, no sign, no fraction, below
/// [`MAX_COUNT`] (a larger one is no usage).
fn header_count(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let value = headers.get_all(name).iter().next_back()?;
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|count| *count < MAX_COUNT)
}

#[cfg(test)]
mod tests;

/// The answers the official `openai` and `anthropic` Python clients read, as `bench/llm_clients.py` recorded them
/// with the usage each client read (Anthropic's cached prompt counted as input).
#[cfg(test)]
mod recorded {
    use http::{HeaderMap, HeaderValue};

    use super::{UsageFormat, UsageReader};
    use crate::usage::Usage;

    macro_rules! recorded {
        ($name:literal, $response:literal) => {
            (
                $name,
                &include_bytes!(concat!("../../tests/fixtures/llm/", $name, $response))[..],
                include_str!(concat!("../../tests/fixtures/llm/", $name, ".usage.json")),
            )
        };
    }

    #[test]
    fn each_recorded_answer_reads_as_its_client_read_it_in_any_pieces() {
        let answers = [
            recorded!("openai_chat", ".response.json"),
            recorded!("openai_chat_stream", ".response.sse"),
            recorded!("openai_responses", ".response.json"),
            recorded!("openai_responses_stream", ".response.sse"),
            recorded!("anthropic_messages", ".response.json"),
            recorded!("anthropic_messages_stream", ".response.sse"),
        ];
        for (name, response, usage) in answers {
            let usage: serde_json::Value = serde_json::from_str(usage).expect("JSON");
            let expected = Usage {
                input_tokens: usage["input_tokens"].as_u64(),
                output_tokens: usage["output_tokens"].as_u64(),
                total_tokens: usage["total_tokens"].as_u64(),
            };
            let format = if name.starts_with("anthropic") {
                UsageFormat::Anthropic
            } else {
                UsageFormat::OpenAi
            };
            let mut head = HeaderMap::new();
            let content_type = if name.ends_with("_stream") {
                "text/event-stream; charset=utf-8"
            } else {
                "application/json"
            };
            head.insert("content-type", HeaderValue::from_static(content_type));
            for size in [1, 7, 64, response.len()] {
                let mut reader = UsageReader::new(&format, &head);
                for piece in response.chunks(size) {
                    reader.feed(piece);
                }
                reader.finish();
                assert_eq!(reader.usage(), expected, "{name} in pieces of {size}");
            }
        }
    }
}
