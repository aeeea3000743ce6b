//! The answer reader's tests: each API's framing, any chunking, the held events, headers and trailers.

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
    let stream = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}";
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
    for bad in [
        "-1",
        "1.5",
        "1e3",
        "",
        "18446744073709551616",
        "9007199254740992",
        "+3",
        "0x10",
    ] {
        let reader = UsageReader::new(&format, &headers(&[("x-tokens-used", bad)]));
        assert!(reader.usage().is_missing(), "{bad:?}");
    }
    let reader = UsageReader::new(&format, &HeaderMap::new());
    assert!(reader.usage().is_missing());
}

fn split<'a>(bytes: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let cuts = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
    crate::usage::json::cut_at(bytes, cuts)
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
        let mut recorder = crate::usage::sse::tests::Recorder::default();
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
