//! Reads what an answer reports it cost as its body goes by: a JSON body's `usage`, the usage events of a
//! server-sent event stream, or a number in a header or trailer, chosen from the route's format and the answer's
//! head. It holds at most one `usage` object and one short event, however long the answer.

use std::sync::LazyLock;

use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue};
use memchr::memmem::Finder;

use super::json::{Places, UsageScanner};
use super::reported::{Dialect, Reported, Usage};
use super::sse::{SseParser, SseSink};

/// How a route's answers report what they cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageFormat {
    /// OpenAI chat completions or Responses, JSON or streamed (and the servers that answer as they do).
    OpenAi,
    /// Anthropic messages, JSON or streamed.
    Anthropic,
    /// A whole number in this response header, or in a trailer of that name: counted as the total.
    Header(HeaderName),
}

/// A `usage.format` that names no format tollgate reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a usage format: openai, anthropic or header:<name>")]
pub struct UsageFormatError(String);

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

// === impl UsageFormat ===

impl std::str::FromStr for UsageFormat {
    type Err = UsageFormatError;

    /// `openai`, `anthropic` or `header:<name>` (a field name, any case).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "openai" => Ok(Self::OpenAi),
            "anthropic" => Ok(Self::Anthropic),
            _ => text
                .strip_prefix("header:")
                .and_then(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
                .map(Self::Header)
                .ok_or_else(|| UsageFormatError(text.to_owned())),
        }
    }
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

/// The whole number in the field `name` (the last, if repeated): ASCII digits only, no sign, no fraction.
fn header_count(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let value = headers.get_all(name).iter().next_back()?;
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        map
    }

    fn sse() -> HeaderMap {
        headers(&[("content-type", "text/event-stream; charset=utf-8")])
    }

    fn read(format: &UsageFormat, head: &HeaderMap, pieces: &[&[u8]]) -> Usage {
        let mut reader = UsageReader::new(format, head);
        for piece in pieces {
            reader.feed(piece);
        }
        reader.finish();
        reader.usage()
    }

    fn usage(input: u64, output: u64, total: u64) -> Usage {
        Usage {
            input_tokens: Some(input),
            output_tokens: Some(output),
            total_tokens: Some(total),
        }
    }

    /// An OpenAI chat completion streamed with `stream_options.include_usage`: every chunk has `usage: null`, the
    /// last before `[DONE]` has empty choices and the usage.
    pub(crate) const OPENAI_STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello \\\"usage\\\":{\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    );

    /// An Anthropic message streamed: input in `message_start`, cumulative output in `message_delta`.
    pub(crate) const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\r\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\r\n\r\n",
        "event: content_block_start\r\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n",
        "event: ping\r\n",
        "data: {\"type\": \"ping\"}\r\n\r\n",
        "event: content_block_delta\r\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\r\n\r\n",
        "event: content_block_stop\r\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\r\n\r\n",
        "event: message_delta\r\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\r\n\r\n",
        "event: message_stop\r\n",
        "data: {\"type\":\"message_stop\"}\r\n\r\n",
    );

    /// A Responses API stream: `response.created` has `usage: null`, `response.completed` the usage.
    pub(crate) const RESPONSES_STREAM: &str = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":36,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":87,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":123}}}\n\n",
    );

    #[test]
    fn openai_stream_reads_the_usage_chunk() {
        assert_eq!(
            read(&UsageFormat::OpenAi, &sse(), &[OPENAI_STREAM.as_bytes()]),
            usage(9, 12, 21)
        );
    }

    #[test]
    fn openai_stream_without_include_usage_reports_nothing() {
        let stream = OPENAI_STREAM.replace("\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21,\"prompt_tokens_details\":{\"cached_tokens\":0}}", "\"usage\":null");
        assert!(read(&UsageFormat::OpenAi, &sse(), &[stream.as_bytes()]).is_missing());
    }

    #[test]
    fn anthropic_stream_reads_input_from_the_start_and_output_from_the_last_delta() {
        assert_eq!(
            read(
                &UsageFormat::Anthropic,
                &sse(),
                &[ANTHROPIC_STREAM.as_bytes()]
            ),
            usage(125, 15, 140)
        );
    }

    #[test]
    fn responses_stream_reads_the_completed_event() {
        assert_eq!(
            read(&UsageFormat::OpenAi, &sse(), &[RESPONSES_STREAM.as_bytes()]),
            usage(36, 87, 123)
        );
    }

    #[test]
    fn a_stream_cut_mid_event_reports_what_the_events_before_it_said() {
        let cut = ANTHROPIC_STREAM
            .find("event: message_delta")
            .expect("delta")
            + 60;
        let mut reader = UsageReader::new(&UsageFormat::Anthropic, &sse());
        reader.feed(&ANTHROPIC_STREAM.as_bytes()[..cut]);
        let so_far = reader.usage();
        assert_eq!(so_far.input_tokens, Some(125));
        assert_eq!(so_far.output_tokens, Some(1));
    }

    #[test]
    fn a_usage_event_without_its_blank_line_counts_at_the_end_only() {
        let stream =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}";
        let mut reader = UsageReader::new(&UsageFormat::OpenAi, &sse());
        reader.feed(stream.as_bytes());
        assert!(reader.usage().is_missing());
        reader.finish();
        assert_eq!(reader.usage(), usage(1, 2, 3));
    }

    #[test]
    fn events_are_scanned_only_when_they_may_name_usage_and_long_ones_as_they_come() {
        assert!(!may_name_usage(
            br#"{"choices":[{"delta":{"content":"use it"}}]}"#
        ));
        assert!(may_name_usage(br#"{"choices":[],"usage":null}"#));
        assert!(may_name_usage(br#"{"us\u0061ge":{}}"#));
        let long = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":4}}}}\n\n",
            "x".repeat(3 * HELD_EVENT_BYTES)
        );
        for size in [1, 100, HELD_EVENT_BYTES - 1, long.len()] {
            let pieces: Vec<&[u8]> = long.as_bytes().chunks(size).collect();
            assert_eq!(
                read(&UsageFormat::OpenAi, &sse(), &pieces),
                usage(3, 4, 7),
                "pieces of {size}"
            );
        }
        let mut reader = UsageReader::new(&UsageFormat::OpenAi, &sse());
        reader.feed(long.as_bytes());
        let Mode::Sse(reading) = &reader.mode else {
            panic!("an event stream is read as one")
        };
        assert!(reading.events.held.capacity() <= 2 * HELD_EVENT_BYTES);
    }

    #[test]
    fn json_answers_read_their_usage() {
        let json = headers(&[("content-type", "application/json")]);
        let chat = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        assert_eq!(
            read(&UsageFormat::OpenAi, &json, &[chat.as_bytes()]),
            usage(5, 7, 12)
        );
        let message = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":0,"output_tokens":20}}"#;
        assert_eq!(
            read(&UsageFormat::Anthropic, &json, &[message.as_bytes()]),
            usage(15, 20, 35)
        );
        // No content type at all: read as JSON.
        assert_eq!(
            read(&UsageFormat::OpenAi, &HeaderMap::new(), &[chat.as_bytes()]),
            usage(5, 7, 12)
        );
    }

    #[test]
    fn a_large_json_answer_is_read_without_holding_it() {
        let json = headers(&[("content-type", "application/json")]);
        let mut reader = UsageReader::new(&UsageFormat::OpenAi, &json);
        reader.feed(b"{\"data\":[");
        let item = b"{\"embedding\":[0.1,0.2,0.3,0.4],\"index\":0,\"object\":\"embedding\"},";
        for _ in 0..100_000 {
            reader.feed(item);
        }
        reader.feed(b"{}],\"usage\":{\"prompt_tokens\":8,\"total_tokens\":8}}");
        reader.finish();
        assert_eq!(reader.usage().total_tokens, Some(8));
        assert_eq!(reader.usage().input_tokens, Some(8));
    }

    #[test]
    fn a_compressed_answer_is_not_read() {
        let gzip = headers(&[
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ]);
        let chat = r#"{"usage":{"prompt_tokens":5,"completion_tokens":7}}"#;
        assert!(read(&UsageFormat::OpenAi, &gzip, &[chat.as_bytes()]).is_missing());
        let identity = headers(&[("content-encoding", "identity")]);
        assert!(!read(&UsageFormat::OpenAi, &identity, &[chat.as_bytes()]).is_missing());
    }

    #[test]
    fn usage_formats_are_read_from_their_names() {
        assert_eq!("openai".parse(), Ok(UsageFormat::OpenAi));
        assert_eq!("anthropic".parse(), Ok(UsageFormat::Anthropic));
        assert_eq!(
            "header:X-Tokens-Used".parse(),
            Ok(UsageFormat::Header(HeaderName::from_static(
                "x-tokens-used"
            )))
        );
        for bad in ["OpenAI", "header:", "header:bad name", "gemini", ""] {
            assert!(bad.parse::<UsageFormat>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_request_asking_for_gzip_asks_for_identity_instead() {
        let mut request = headers(&[
            ("accept-encoding", "gzip, deflate"),
            ("accept-encoding", "br"),
        ]);
        accept_readable_answers(&mut request);
        let values: Vec<_> = request.get_all("accept-encoding").iter().collect();
        assert_eq!(values, vec![HeaderValue::from_static("identity")]);
    }

    #[test]
    fn header_format_reads_the_header_or_a_later_trailer() {
        let name = HeaderName::from_static("x-tokens-used");
        let format = UsageFormat::Header(name.clone());
        let mut reader = UsageReader::new(&format, &headers(&[("x-tokens-used", " 42 ")]));
        reader.feed(b"{\"usage\":{\"prompt_tokens\":5}}");
        assert_eq!(reader.usage(), Usage::total(42));
        reader.trailers(&headers(&[("x-tokens-used", "50")]));
        reader.finish();
        assert_eq!(reader.usage(), Usage::total(50));
        for bad in ["-1", "1.5", "1e3", "", "18446744073709551616", "+3", "0x10"] {
            let reader = UsageReader::new(&format, &headers(&[("x-tokens-used", bad)]));
            assert!(reader.usage().is_missing(), "{bad:?}");
        }
        let reader = UsageReader::new(&format, &HeaderMap::new());
        assert!(reader.usage().is_missing());
    }

    fn split<'a>(bytes: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for cut in cuts {
            pieces.push(&bytes[from..cut]);
            from = cut;
        }
        pieces.push(&bytes[from..]);
        pieces
    }

    /// A generated stream of the three APIs' framings: events in any order, any line end, comments, pings,
    /// multi-line data, and `usage` objects at the places each API puts them.
    fn stream_strategy() -> impl Strategy<Value = String> {
        let line_end = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
        let count = 0u64..100_000;
        let event = prop_oneof![
            (count.clone(), count.clone()).prop_map(|(input, output)| format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{input},\"completion_tokens\":{output}}}}}"
            )),
            Just("data: {\"choices\":[{\"delta\":{\"content\":\"usage: {\\\"x\\\"}\"}}],\"usage\":null}".to_owned()),
            count.clone().prop_map(|input| format!(
                "event: message_start\u{0}data: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{input},\"output_tokens\":1}}}}}}"
            )),
            count.clone().prop_map(|output| format!(
                "event: message_delta\u{0}data: {{\"type\":\"message_delta\",\u{0}data: \"usage\":{{\"output_tokens\":{output}}}}}"
            )),
            (count.clone(), count.clone()).prop_map(|(input, output)| format!(
                "event: response.completed\u{0}data: {{\"response\":{{\"output\":[],\"usage\":{{\"input_tokens\":{input},\"output_tokens\":{output}}}}}}}"
            )),
            // Longer than an event is held: scanned as it comes.
            (count.clone(), count.clone()).prop_map(|(input, output)| format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}],\"usage\":{{\"prompt_tokens\":{input},\"completion_tokens\":{output}}}}}",
                "words ".repeat(HELD_EVENT_BYTES / 5)
            )),
            // A key that reads `usage` only once unescaped.
            (count.clone(), count.clone()).prop_map(|(input, output)| format!(
                "data: {{\"choices\":[],\"us\\u0061ge\":{{\"prompt_tokens\":{input},\"completion_tokens\":{output}}}}}"
            )),
            Just(": keep-alive".to_owned()),
            Just("event: ping\u{0}data: {\"type\": \"ping\"}".to_owned()),
            Just("data: [DONE]".to_owned()),
        ];
        (
            proptest::collection::vec((event, line_end), 0..10),
            any::<bool>(),
        )
            .prop_map(|(events, last_blank)| {
                let mut stream = String::new();
                let count = events.len();
                for (index, (event, end)) in events.into_iter().enumerate() {
                    // `\0` marks a line break inside one event.
                    stream.push_str(&event.replace('\u{0}', end));
                    stream.push_str(end);
                    if last_blank || index + 1 < count {
                        stream.push_str(end);
                    }
                }
                stream
            })
    }

    proptest! {
        #[test]
        fn any_split_of_a_stream_reads_the_usage_of_the_whole(
            stream in stream_strategy(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
            anthropic in any::<bool>(),
        ) {
            let format = if anthropic { UsageFormat::Anthropic } else { UsageFormat::OpenAi };
            let whole = read(&format, &sse(), &[stream.as_bytes()]);
            prop_assert_eq!(read(&format, &sse(), &split(stream.as_bytes(), &cuts)), whole);
            let bytes: Vec<&[u8]> = stream.as_bytes().chunks(1).collect();
            prop_assert_eq!(read(&format, &sse(), &bytes), whole);
        }

        #[test]
        fn a_stream_reads_the_last_report_of_each_count(stream in stream_strategy()) {
            // The expected counts, from the events as a client parses them with serde_json.
            let mut parser = SseParser::new();
            let mut recorder = crate::proxy::usage::sse::tests::Recorder::default();
            parser.feed(stream.as_bytes(), &mut recorder);
            parser.finish(&mut recorder);
            let (mut input, mut output) = (None, None);
            for (_, data) in &recorder.events {
                let Ok(value) = serde_json::from_str::<serde_json::Value>(data) else { continue };
                for usage in [&value["usage"], &value["message"]["usage"], &value["response"]["usage"]] {
                    if let Some(found) = usage["prompt_tokens"].as_u64().or(usage["input_tokens"].as_u64()) {
                        input = Some(found);
                    }
                    if let Some(found) = usage["completion_tokens"].as_u64().or(usage["output_tokens"].as_u64()) {
                        output = Some(found);
                    }
                }
            }
            let read = read(&UsageFormat::OpenAi, &sse(), &[stream.as_bytes()]);
            prop_assert_eq!(read.input_tokens, input);
            prop_assert_eq!(read.output_tokens, output);
        }
    }
}

/// The answers the official `openai` and `anthropic` Python clients read, as `bench/llm_clients.py` recorded them
/// with the usage each client read (Anthropic's cached prompt counted as input).
#[cfg(test)]
mod recorded {
    use http::{HeaderMap, HeaderValue};

    use super::{UsageFormat, UsageReader};
    use crate::proxy::usage::Usage;

    macro_rules! recorded {
        ($name:literal, $response:literal) => {
            (
                $name,
                &include_bytes!(concat!("../../../tests/fixtures/llm/", $name, $response))[..],
                include_str!(concat!(
                    "../../../tests/fixtures/llm/",
                    $name,
                    ".usage.json"
                )),
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
