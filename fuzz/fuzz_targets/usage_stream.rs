//! Answers' bytes through the usage reader: however a stream or a JSON body is cut into pieces, it reads the same.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::usage::{Usage, UsageFormat, UsageReader};

fn read(format: &UsageFormat, head: &HeaderMap, pieces: &[&[u8]], finish: bool) -> Usage {
    let mut reader = UsageReader::new(format, head);
    for piece in pieces {
        reader.feed(piece);
    }
    if finish {
        reader.finish();
    }
    reader.usage()
}

fuzz_target!(|data: &[u8]| {
    // The first byte: the format (bit 0), an event stream or a JSON body (bit 1), the piece size (the rest).
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let format = if choice & 1 == 0 {
        UsageFormat::OpenAi
    } else {
        UsageFormat::Anthropic
    };
    let mut head = HeaderMap::new();
    let content_type = if choice & 2 == 0 {
        "text/event-stream"
    } else {
        "application/json"
    };
    head.insert("content-type", HeaderValue::from_static(content_type));
    let size = usize::from(choice >> 2) + 1;

    let whole = read(&format, &head, &[body], true);
    let pieces: Vec<&[u8]> = body.chunks(size).collect();
    assert_eq!(
        read(&format, &head, &pieces, true),
        whole,
        "in pieces of {size}"
    );
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(read(&format, &head, &bytes, true), whole, "byte by byte");
    // Cut before its end, an answer reports nothing its whole would not: a report, once read, stays.
    let cut = read(&format, &head, &pieces[..pieces.len() / 2], false);
    if whole.is_missing() {
        assert!(
            cut.is_missing(),
            "{cut:?} read from a prefix of an answer that reports nothing"
        );
    }
});
