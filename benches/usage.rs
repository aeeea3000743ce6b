//! Criterion benches of reading an LLM answer's usage as it passes (per MiB of answer: an OpenAI event stream, an
//! Anthropic one, a large JSON body) and of reading and rewriting a request body for its cost.
//!
//! Run with `cargo bench --bench usage` (about twenty seconds). The throughput criterion prints is bytes of answer
//! (or of request body) per second.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{HeaderMap, HeaderValue};
use tollgate::usage::{read_request, rewrite_request, Dialect, Rewrites, UsageFormat, UsageReader};

/// The frame size an upstream's body arrives in, about.
const FRAME: usize = 16 * 1024;

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

/// `unit` repeated to about a MiB, then `end`.
fn mib(unit: &str, end: &str) -> Vec<u8> {
    let mut out = unit.repeat((1 << 20) / unit.len());
    out.push_str(end);
    out.into_bytes()
}

fn read_all(format: &UsageFormat, head: &HeaderMap, body: &[u8]) -> Option<u64> {
    let mut reader = UsageReader::new(format, head);
    for frame in body.chunks(FRAME) {
        reader.feed(frame);
    }
    reader.finish();
    reader.usage().total_tokens
}

fn answers(c: &mut Criterion) {
    let mut sse = HeaderMap::new();
    sse.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    let mut json = HeaderMap::new();
    json.insert("content-type", HeaderValue::from_static("application/json"));
    let openai = mib(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4.1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\ndata: [DONE]\n\n",
    );
    let anthropic = mib(
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" word\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":5,\"output_tokens\":15}}\n\n",
    );
    let mut embeddings = b"{\"object\":\"list\",\"data\":[".to_vec();
    embeddings.extend(mib("{\"object\":\"embedding\",\"index\":0,\"embedding\":[0.0023064255,-0.009327292,-0.0028842222]},", ""));
    embeddings.extend_from_slice(b"{}],\"usage\":{\"prompt_tokens\":8,\"total_tokens\":8}}");

    let mut group = c.benchmark_group("usage_answer_per_mib");
    for (name, format, head, body) in [
        ("openai_sse", UsageFormat::OpenAi, &sse, &openai),
        ("anthropic_sse", UsageFormat::Anthropic, &sse, &anthropic),
        ("json_body", UsageFormat::OpenAi, &json, &embeddings),
    ] {
        assert!(
            read_all(&format, head, body).is_some(),
            "{name} reads a usage"
        );
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| read_all(&format, head, black_box(body)))
        });
    }
    group.finish();
}

fn requests(c: &mut Criterion) {
    let content = "lorem ipsum ".repeat(8 * 1024);
    let body = format!(
        r#"{{"model":"gpt-4.1","messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"{content}"}}],"max_tokens":100000,"stream":true}}"#
    );
    let rewrites = Rewrites {
        completion_cap: Some(4096),
        completion_when_absent: Some(1024),
        inject_stream_usage: true,
    };
    let mut group = c.benchmark_group("usage_request_100k");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("read", |b| {
        b.iter(|| read_request(Dialect::OpenAi, black_box(body.as_bytes())))
    });
    group.bench_function("rewrite", |b| {
        b.iter(|| rewrite_request(Dialect::OpenAi, black_box(body.as_bytes()), &rewrites))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = quick();
    targets = answers, requests
}
criterion_main!(benches);
