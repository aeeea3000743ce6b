//! Request bodies through the LLM request reader and its rewrites: a body is read the same before and after its
//! rewrites but for the fields they set, the completion limit never ends above the cap, and what is refused as
//! read is refused as rewritten.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use tollgate::usage::{read_request, rewrite_request, Dialect, RequestShape, Rewrites};

fuzz_target!(|data: &[u8]| {
    // The first byte: the dialect (bit 0), whether to inject stream usage (bit 1), whether to cap (bit 2), the
    // cap (the rest, times 100).
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let dialect = if choice & 1 == 0 {
        Dialect::OpenAi
    } else {
        Dialect::Anthropic
    };
    let cap = u64::from(choice >> 3) * 100;
    let rewrites = Rewrites {
        completion_cap: (choice & 4 != 0).then_some(cap),
        completion_when_absent: Some(cap / 2),
        inject_stream_usage: choice & 2 != 0,
    };
    let before = match read_request(dialect, body) {
        Ok(facts) => facts,
        Err(_) => {
            assert!(
                rewrite_request(dialect, body, &rewrites).is_err(),
                "refused as read, not as rewritten"
            );
            return;
        }
    };
    let rewritten = rewrite_request(dialect, body, &rewrites).expect("a readable body rewrites");
    let forwarded = rewritten.body.as_deref().unwrap_or(body);
    assert_eq!(
        read_request(dialect, forwarded).expect("the forwarded body reads"),
        rewritten.facts
    );
    if let Some(cap) = rewrites.completion_cap {
        assert!(rewritten.facts.max_tokens.is_none_or(|limit| limit <= cap));
        if let Some(limit) = before.max_tokens {
            assert_eq!(rewritten.facts.max_tokens, Some(limit.min(cap)));
        }
    }
    assert_eq!(rewritten.facts.stream, before.stream);
    assert_eq!(rewritten.facts.choices, before.choices);
    assert_eq!(rewritten.facts.shape, before.shape);
    let injected = rewrites.inject_stream_usage
        && dialect == Dialect::OpenAi
        && before.stream
        && matches!(before.shape, RequestShape::Chat | RequestShape::Completions);
    assert_eq!(
        rewritten.facts.include_usage,
        before.include_usage || injected
    );
    // Every member the rewrites do not set means what the client sent.
    let mut sent: Map<String, Value> =
        serde_json::from_slice(body).expect("read bodies are JSON objects");
    let after: Map<String, Value> =
        serde_json::from_slice(forwarded).expect("forwarded bodies are JSON objects");
    for field in [
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "stream_options",
    ] {
        sent.remove(field);
    }
    for (key, value) in &sent {
        assert_eq!(after.get(key), Some(value), "{key} changed");
    }
    if rewritten.body.is_none() {
        assert_eq!(forwarded, body);
    }
});
