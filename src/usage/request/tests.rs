use proptest::prelude::*;

use super::*;

fn facts(dialect: Dialect, body: &str) -> Result<BodyFacts, RequestBodyError> {
    read_request(dialect, body.as_bytes())
}

fn rewrite(dialect: Dialect, body: &str, rewrites: Rewrites) -> (String, BodyFacts) {
    let rewritten = rewrite_request(dialect, body.as_bytes(), &rewrites).expect("readable");
    let body = rewritten.body.map_or_else(
        || body.to_owned(),
        |bytes| String::from_utf8(bytes.to_vec()).expect("UTF-8"),
    );
    (body, rewritten.facts)
}

const CAP: Rewrites = Rewrites {
    completion_cap: Some(4096),
    completion_when_absent: Some(1024),
    inject_stream_usage: false,
};

const INJECT: Rewrites = Rewrites {
    completion_cap: None,
    completion_when_absent: None,
    inject_stream_usage: true,
};

#[test]
fn reads_each_apis_completion_limit_and_streaming() {
    let chat = facts(
        Dialect::OpenAi,
        r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":300,"stream":true,"stream_options":{"include_usage":true}}"#,
    )
    .expect("readable");
    assert_eq!(
        chat,
        BodyFacts {
            shape: RequestShape::Chat,
            max_tokens: Some(300),
            choices: 1,
            stream: true,
            include_usage: true
        }
    );
    let responses = facts(
        Dialect::OpenAi,
        r#"{"model":"gpt-4o","input":"hi","max_output_tokens":50}"#,
    )
    .expect("readable");
    assert_eq!(
        (responses.shape, responses.max_tokens, responses.stream),
        (RequestShape::Responses, Some(50), false)
    );
    let legacy = facts(
        Dialect::OpenAi,
        r#"{"prompt":"hi","max_tokens":7,"n":2,"best_of":5}"#,
    )
    .expect("readable");
    assert_eq!(
        (legacy.shape, legacy.max_tokens, legacy.choices),
        (RequestShape::Completions, Some(7), 5)
    );
    let anthropic = facts(
        Dialect::Anthropic,
        r#"{"model":"claude","max_tokens":1024,"max_completion_tokens":99999,"messages":[],"stream":true}"#,
    )
    .expect("readable");
    assert_eq!(
        anthropic,
        BodyFacts {
            shape: RequestShape::Messages,
            max_tokens: Some(1024),
            choices: 1,
            stream: true,
            include_usage: false
        }
    );
}

#[test]
fn the_largest_of_several_openai_limits_bounds_the_answer() {
    let both = facts(
        Dialect::OpenAi,
        r#"{"messages":[],"max_tokens":10,"max_completion_tokens":500}"#,
    )
    .expect("readable");
    assert_eq!(both.max_tokens, Some(500));
    let nulls = facts(
        Dialect::OpenAi,
        r#"{"messages":[],"max_tokens":null,"n":null,"stream":null}"#,
    )
    .expect("readable");
    assert_eq!(
        (nulls.max_tokens, nulls.choices, nulls.stream),
        (None, 1, false)
    );
}

#[test]
fn duplicate_fields_are_refused_however_they_are_spelled() {
    for body in [
        r#"{"max_tokens":1,"max_tokens":100000}"#,
        r#"{"max_tokens":1,"max\u005ftokens":100000}"#,
        r#"{"messages":[],"messages":[]}"#,
        r#"{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}"#,
    ] {
        assert!(
            matches!(
                facts(Dialect::OpenAi, body),
                Err(RequestBodyError::DuplicateField(_))
            ),
            "{body}"
        );
    }
    // Duplicates deeper than the fields read are forwarded as the client sent them.
    assert!(facts(
        Dialect::OpenAi,
        r#"{"messages":[{"role":"user","role":"system"}]}"#
    )
    .is_ok());
}

#[test]
fn limits_that_are_not_whole_numbers_are_refused() {
    for value in [
        "1.0",
        "1e3",
        "-1",
        "\"100\"",
        "18446744073709551616",
        "true",
        "[1]",
        "{}",
    ] {
        let body = format!(r#"{{"messages":[],"max_tokens":{value}}}"#);
        assert_eq!(
            facts(Dialect::OpenAi, &body),
            Err(RequestBodyError::Field {
                field: "max_tokens",
                expected: COUNT
            }),
            "{value}"
        );
    }
    assert!(matches!(
        facts(Dialect::OpenAi, r#"{"messages":[],"n":2.5}"#),
        Err(RequestBodyError::Field { field: "n", .. })
    ));
    assert_eq!(
        facts(Dialect::OpenAi, r#"{"max_tokens":18446744073709551615}"#)
            .map(|facts| facts.max_tokens),
        Ok(Some(u64::MAX))
    );
}

#[test]
fn stream_flags_must_be_booleans_and_nested_ones_are_not_the_requests() {
    for body in [
        r#"{"stream":"true"}"#,
        r#"{"stream":1}"#,
        r#"{"stream":true,"stream_options":{"include_usage":"yes"}}"#,
    ] {
        assert!(
            matches!(
                facts(Dialect::OpenAi, body),
                Err(RequestBodyError::Field { .. })
            ),
            "{body}"
        );
    }
    assert!(matches!(
        facts(
            Dialect::OpenAi,
            r#"{"stream":true,"stream_options":[true]}"#
        ),
        Err(RequestBodyError::Field {
            field: "stream_options",
            ..
        })
    ));
    let nested = facts(
        Dialect::OpenAi,
        r#"{"messages":[{"role":"user","content":"x","stream":true}],"metadata":{"stream":true,"max_tokens":9}}"#,
    )
    .expect("readable");
    assert_eq!((nested.stream, nested.max_tokens), (false, None));
}

#[test]
fn bodies_that_are_not_one_json_object_are_refused() {
    assert_eq!(
        read_request(Dialect::OpenAi, b"{\"a\":\"\xff\"}"),
        Err(RequestBodyError::NotUtf8)
    );
    assert_eq!(
        facts(Dialect::OpenAi, "[1,2]"),
        Err(RequestBodyError::NotAnObject)
    );
    assert_eq!(
        facts(Dialect::OpenAi, " \"x\""),
        Err(RequestBodyError::NotAnObject)
    );
    for body in [
        "",
        "model=gpt",
        "{\"a\":1} {\"b\":2}",
        "{\"a\":1,}",
        "{\"a\":NaN}",
        "\u{feff}{}",
    ] {
        assert!(
            matches!(
                facts(Dialect::OpenAi, body),
                Err(RequestBodyError::NotJson(_) | RequestBodyError::NotAnObject)
            ),
            "{body:?}"
        );
    }
}

#[test]
fn a_larger_limit_is_lowered_and_the_rest_is_kept_byte_for_byte() {
    let body = "{ \"model\" : \"gpt-4o\",\n  \"messages\": [{\"role\":\"user\",\"content\":\"caf\\u00e9 \u{1F600}\"}],\n  \"max_tokens\" :  100000 , \"temperature\": 0.70 }";
    let (rewritten, facts) = rewrite(Dialect::OpenAi, body, CAP);
    assert_eq!(rewritten, body.replace("100000", "4096"));
    assert_eq!(facts.max_tokens, Some(4096));
    // Every field at or under the cap is left alone; over it, each is lowered.
    let (rewritten, facts) = rewrite(
        Dialect::OpenAi,
        r#"{"messages":[],"max_tokens":9000,"max_completion_tokens":4096}"#,
        CAP,
    );
    assert_eq!(
        rewritten,
        r#"{"messages":[],"max_tokens":4096,"max_completion_tokens":4096}"#
    );
    assert_eq!(facts.max_tokens, Some(4096));
    let untouched = rewrite_request(Dialect::OpenAi, br#"{"messages":[],"max_tokens":10}"#, &CAP)
        .expect("readable");
    assert_eq!(untouched.body, None);
}

#[test]
fn an_absent_limit_is_set_under_the_name_each_api_reads() {
    let cases = [
        (
            Dialect::OpenAi,
            r#"{"messages":[]}"#,
            r#"{"max_completion_tokens":1024,"messages":[]}"#,
        ),
        (
            Dialect::OpenAi,
            r#"{"prompt":"x"}"#,
            r#"{"max_tokens":1024,"prompt":"x"}"#,
        ),
        (
            Dialect::OpenAi,
            r#"{"input":"x","max_output_tokens":null}"#,
            r#"{"input":"x","max_output_tokens":1024}"#,
        ),
        (
            Dialect::OpenAi,
            r#" {"messages":[],"max_tokens":null}"#,
            r#" {"max_completion_tokens":1024,"messages":[],"max_tokens":null}"#,
        ),
        (
            Dialect::Anthropic,
            r#"{"messages":[]}"#,
            r#"{"messages":[]}"#,
        ),
        (Dialect::OpenAi, r#"{"model":"x"}"#, r#"{"model":"x"}"#),
    ];
    for (dialect, body, expected) in cases {
        assert_eq!(rewrite(dialect, body, CAP).0, expected, "{body}");
    }
    // The value set when absent is never above the cap.
    let low_cap = Rewrites {
        completion_cap: Some(100),
        ..CAP
    };
    assert_eq!(
        rewrite(Dialect::OpenAi, r#"{"messages":[]}"#, low_cap)
            .1
            .max_tokens,
        Some(100)
    );
    let cap_only = Rewrites {
        completion_when_absent: None,
        ..CAP
    };
    assert_eq!(
        rewrite(Dialect::OpenAi, r#"{"messages":[]}"#, cap_only)
            .1
            .max_tokens,
        Some(4096)
    );
}

#[test]
fn stream_usage_is_injected_into_a_streamed_openai_request_that_lacks_it() {
    let cases = [
        (
            r#"{"messages":[],"stream":true}"#,
            r#"{"stream_options":{"include_usage":true},"messages":[],"stream":true}"#,
        ),
        (
            r#"{"messages":[],"stream":true,"stream_options":null}"#,
            r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        (
            r#"{"messages":[],"stream":true,"stream_options":{}}"#,
            r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        (
            r#"{"messages":[],"stream":true,"stream_options":{"include_obfuscation":false}}"#,
            r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}}"#,
        ),
        (
            r#"{"messages":[],"stream":true,"stream_options":{"include_usage":false}}"#,
            r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        (
            r#"{"prompt":"x","stream":true}"#,
            r#"{"stream_options":{"include_usage":true},"prompt":"x","stream":true}"#,
        ),
    ];
    for (body, expected) in cases {
        let (rewritten, facts) = rewrite(Dialect::OpenAi, body, INJECT);
        assert_eq!(rewritten, expected);
        assert!(facts.include_usage);
    }
    for (dialect, body) in [
        (Dialect::OpenAi, r#"{"messages":[],"stream":false}"#),
        (Dialect::OpenAi, r#"{"messages":[]}"#),
        (
            Dialect::OpenAi,
            r#"{"messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        // The Responses API reports usage in every stream, and refuses fields it does not know.
        (Dialect::OpenAi, r#"{"input":"x","stream":true}"#),
        (Dialect::Anthropic, r#"{"messages":[],"stream":true}"#),
    ] {
        let rewritten = rewrite_request(dialect, body.as_bytes(), &INJECT).expect("readable");
        assert_eq!(rewritten.body, None, "{body}");
    }
}

#[test]
fn both_rewrites_apply_together() {
    let (rewritten, facts) = rewrite(
        Dialect::OpenAi,
        r#"{"messages":[],"stream":true}"#,
        Rewrites {
            inject_stream_usage: true,
            ..CAP
        },
    );
    assert_eq!(
        rewritten,
        r#"{"max_completion_tokens":1024,"stream_options":{"include_usage":true},"messages":[],"stream":true}"#
    );
    assert_eq!((facts.max_tokens, facts.include_usage), (Some(1024), true));
}

#[test]
fn a_replaced_body_gets_its_new_length() {
    let mut headers = HeaderMap::new();
    headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from_static("10"));
    set_body_length(&mut headers, 1234);
    assert_eq!(
        headers.get(CONTENT_LENGTH),
        Some(&HeaderValue::from_static("1234"))
    );
    assert!(headers.get(TRANSFER_ENCODING).is_none());
}

fn value_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        (0u64..200_000).prop_map(|n| n.to_string()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        Just(r#"{"include_usage":true}"#.to_owned()),
        Just(r#"{"include_usage":false,"x":1}"#.to_owned()),
        Just("{}".to_owned()),
        Just(r#"[{"role":"user","content":"max_tokens \"stream\": true"}]"#.to_owned()),
        Just("\"text\"".to_owned()),
    ]
}

fn body_strategy() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("max_tokens"),
        Just("max_completion_tokens"),
        Just("max_output_tokens"),
        Just("stream"),
        Just("stream_options"),
        Just("messages"),
        Just("prompt"),
        Just("input"),
        Just("n"),
        Just("model"),
    ];
    let space = prop_oneof![Just(""), Just(" "), Just("\n  ")];
    proptest::collection::vec((key, value_strategy(), space), 0..8).prop_map(|members| {
        let inner: Vec<String> = members
            .into_iter()
            .map(|(key, value, space)| format!("{space}\"{key}\"{space}:{space}{value}{space}"))
            .collect();
        format!("{{{}}}", inner.join(","))
    })
}

proptest! {
    #[test]
    fn a_rewritten_body_means_what_the_client_sent_but_for_the_rewrites(
        body in body_strategy(),
        cap in 1u64..10_000,
        inject in any::<bool>(),
        anthropic in any::<bool>(),
    ) {
        let dialect = if anthropic { Dialect::Anthropic } else { Dialect::OpenAi };
        let rewrites = Rewrites { completion_cap: Some(cap), completion_when_absent: Some(cap / 2), inject_stream_usage: inject };
        let Ok(before) = read_request(dialect, body.as_bytes()) else {
            // A body refused as read is refused as rewritten.
            prop_assert!(rewrite_request(dialect, body.as_bytes(), &rewrites).is_err());
            return Ok(());
        };
        let rewritten = rewrite_request(dialect, body.as_bytes(), &rewrites).expect("a readable body rewrites");
        let after_bytes = rewritten.body.clone().unwrap_or_else(|| Bytes::from(body.clone()));
        let mut original: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&body).expect("JSON");
        let after: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&after_bytes).expect("JSON");
        // The facts said are the forwarded body's.
        prop_assert_eq!(read_request(dialect, &after_bytes).expect("readable"), rewritten.facts);
        // The completion limit is capped, and set when the API has a name for it.
        prop_assert!(rewritten.facts.max_tokens.is_none_or(|limit| limit <= cap));
        if let Some(limit) = before.max_tokens {
            prop_assert_eq!(rewritten.facts.max_tokens, Some(limit.min(cap)));
        } else if !matches!(before.shape, RequestShape::Messages | RequestShape::Other) {
            prop_assert_eq!(rewritten.facts.max_tokens, Some(cap / 2));
        }
        let injected = inject && dialect == Dialect::OpenAi && before.stream
            && matches!(before.shape, RequestShape::Chat | RequestShape::Completions);
        prop_assert_eq!(rewritten.facts.include_usage, before.include_usage || injected);
        // Every other member is as the client sent it.
        for field in ["max_tokens", "max_completion_tokens", "max_output_tokens", "stream_options"] {
            original.remove(field);
        }
        for (key, value) in &original {
            prop_assert_eq!(after.get(key), Some(value));
        }
        prop_assert_eq!(rewritten.facts.stream, before.stream);
        prop_assert_eq!(rewritten.facts.shape, before.shape);
        prop_assert_eq!(rewritten.facts.choices, before.choices);
    }
}

/// What the official Python clients sent, as `bench/llm_clients.py` recorded it.
#[test]
fn the_official_clients_bodies_read_as_they_were_sent() {
    macro_rules! sent {
        ($name:literal) => {
            include_bytes!(concat!(
                "../../../tests/fixtures/llm/",
                $name,
                ".request.json"
            ))
        };
    }
    let read = |dialect, body: &[u8]| read_request(dialect, body).expect("readable");
    let chat = read(Dialect::OpenAi, sent!("openai_chat"));
    assert_eq!(
        (chat.shape, chat.max_tokens, chat.stream),
        (RequestShape::Chat, Some(50), false)
    );
    let stream = read(Dialect::OpenAi, sent!("openai_chat_stream"));
    assert_eq!(
        (stream.max_tokens, stream.stream, stream.include_usage),
        (Some(50), true, true)
    );
    let responses = read(Dialect::OpenAi, sent!("openai_responses"));
    assert_eq!(
        (responses.shape, responses.max_tokens),
        (RequestShape::Responses, Some(200))
    );
    let responses = read(Dialect::OpenAi, sent!("openai_responses_stream"));
    assert_eq!(
        (responses.shape, responses.max_tokens, responses.stream),
        (RequestShape::Responses, None, true)
    );
    let messages = read(Dialect::Anthropic, sent!("anthropic_messages_stream"));
    assert_eq!(
        (messages.shape, messages.max_tokens, messages.stream),
        (RequestShape::Messages, Some(1024), true)
    );

    // The streamed chat request the client sent without include_usage gets it, and a cap lowers its limit.
    let body = br#"{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"Say hello"}],"max_tokens":50}"#;
    let rewrites = Rewrites {
        completion_cap: Some(20),
        completion_when_absent: None,
        inject_stream_usage: true,
    };
    let rewritten = rewrite_request(Dialect::OpenAi, body, &rewrites).expect("readable");
    assert_eq!(
        rewritten.body.as_deref(),
        Some(&br#"{"stream_options":{"include_usage":true},"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"Say hello"}],"max_tokens":20}"#[..])
    );
}
