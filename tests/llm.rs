//! Token budgets for LLM APIs, through the gateway to a real upstream that reports usage: a request reserves an
//! upper bound before it is forwarded (all-or-nothing with the route's other limits), and settles to what its
//! answer reported once it ends, on every ending, both stores, two gateways sharing Redis.

mod common;

use std::time::Duration;

use common::config_builder::ConfigBuilder;
use common::llm_upstream::LlmUpstream;
use common::redis::RedisServer;
use common::{eventually, gateways_sharing, serve_admin, start_gateway, store_yaml, TestGateway};
use serde_json::{json, Value};

/// A config with one upstream at `upstream` and the route `chat` on `/`, with `usage` and `limits` (each written
/// as a route's fields, indented by four spaces).
fn config(redis: Option<&RedisServer>, upstream: &str, usage: &str, limits: &str) -> String {
    ConfigBuilder::new()
        .store(redis)
        .upstream("llm", upstream)
        .route("chat", "/")
        .to("llm")
        .route_yaml(usage)
        .limits_yaml(limits)
        .build()
}

/// The usage block of an OpenAI route reserving `prompt` (a number or body_bytes) and the request's `max_tokens`
/// capped at 200 (100 when it names none).
fn openai(prompt: &str) -> String {
    format!(
        "    usage:\n      format: openai\n      reserve: {{ prompt: {prompt}, completion: max_tokens, completion_default: 100, completion_cap: 200 }}\n      stream_usage: inject\n"
    )
}

/// One limit `tpm` counting `counts`, keyed by client address, holding `limit` in one fixed window of 20000 days
/// (2024-10-04 to 2079-07-08 on Redis's clock), which no test outlives.
fn tokens_per_window(counts: &str, limit: u64) -> String {
    format!(
        "      - {{ name: tpm, key: ip, algorithm: fixed_window, limit: {limit}, period: 20000d, counts: {counts} }}\n"
    )
}

/// What the limit `limit` (`route/limit`, or a limit of route `chat`) has left for 127.0.0.1, read through the admin
/// API.
async fn remaining(admin: &str, limit: &str) -> u64 {
    let limit = if limit.contains('/') {
        limit.to_owned()
    } else {
        format!("chat/{limit}")
    };
    let url = format!("{admin}/limits/{limit}?key=127.0.0.1");
    let (_, state) = common::http_client::json_answer(common::http_client::client().get(url)).await;
    state["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("remaining in {state}"))
}

/// Waits until `limit` has `expected` left (settling runs after the answer, off the client's path).
async fn settles_to(admin: &str, limit: &str, expected: u64) {
    let mut last = None;
    let settled = eventually(Duration::from_secs(5), async || {
        let now = remaining(admin, limit).await;
        last = Some(now);
        now == expected
    })
    .await;
    assert!(
        settled.is_some(),
        "{limit}: expected {expected} left, last read {last:?}"
    );
}

/// POSTs `body` to `path` with the usage the upstream is to report; the status and the whole body as text.
async fn post(
    gateway: &TestGateway,
    path: &str,
    body: &Value,
    input: u64,
    output: u64,
) -> (u16, reqwest::header::HeaderMap, String) {
    let client = common::http_client::client();
    let response = reporting(&client, &gateway.url(path), body, (input, output))
        .send()
        .await
        .expect("gateway answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap_or_default())
}

/// A POST of `body` (JSON) to `url`, the upstream to report `input` and `output` tokens.
fn reporting(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    (input, output): (u64, u64),
) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .header("x-test-input", input.to_string())
        .header("x-test-output", output.to_string())
        .body(body.to_string())
}

fn chat(max_tokens: u64) -> Value {
    json!({"model": "gpt-4.1", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": max_tokens})
}

#[tokio::test]
async fn each_ending_settles_as_its_answer_reported() {
    tollgate::telemetry::prometheus();
    let upstream = LlmUpstream::start().await;
    // A route name of its own: the metrics are the process's, shared with the other tests.
    let yaml = config(
        None,
        &upstream.url(),
        &openai("100"),
        &tokens_per_window("total_tokens", 100_000),
    )
    .replace("name: chat", "name: endings")
    .replace(
        "stream_usage: inject\n",
        "stream_usage: inject\n      read_on_timeout: 1s\n",
    );
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let mut used = 0;

    // JSON: what the body's usage said (a 300-token reservation: prompt 100, max_tokens 200).
    let (status, _, _) = post(&gateway, "/v1/chat/completions", &chat(200), 7, 3).await;
    assert_eq!(status, 200);
    used += 10;
    settles_to(&admin, "endings/tpm", 100_000 - used).await;

    // An OpenAI stream that asks for its usage.
    let mut streamed = chat(200);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, _, text) = post(&gateway, "/v1/chat/completions", &streamed, 11, 4).await;
    assert_eq!(status, 200);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    used += 15;
    settles_to(&admin, "endings/tpm", 100_000 - used).await;

    // An OpenAI stream that does not ask: stream_usage inject asks for it, and the stream reports it.
    streamed["stream_options"] = Value::Null;
    let (status, _, _) = post(&gateway, "/v1/chat/completions", &streamed, 2, 2).await;
    assert_eq!(status, 200);
    assert_eq!(
        upstream.last_body()["stream_options"]["include_usage"],
        json!(true)
    );
    used += 4;
    settles_to(&admin, "endings/tpm", 100_000 - used).await;

    // No usage in the answer: settled at the reservation (300).
    let (status, _, _) = post(&gateway, "/nousage/chat/completions", &chat(200), 1, 1).await;
    assert_eq!(status, 200);
    used += 300;
    settles_to(&admin, "endings/tpm", 100_000 - used).await;
    let metrics = common::http_client::metrics_text(&admin).await;
    assert!(
        metrics.contains("tollgate_usage_missing_total{route=\"endings\"} 1"),
        "{metrics}"
    );

    // A 5xx: everything given back.
    let (status, _, _) = post(&gateway, "/fail/chat/completions", &chat(200), 1, 1).await;
    assert_eq!(status, 500);
    settles_to(&admin, "endings/tpm", 100_000 - used).await;

    // A client gone mid-stream, the stream reporting nothing by read_on_timeout: the whole reservation (300).
    let response = common::http_client::client()
        .post(gateway.url("/cut/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(200).to_string())
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(response.status(), 200);
    let mut response = response;
    let first = response.chunk().await.expect("a chunk").expect("data");
    assert!(!first.is_empty());
    drop(response);
    used += 300;
    settles_to(&admin, "endings/tpm", 100_000 - used).await;
    // Settling at the reservation leaves the limit as the reservation did: the tokens counted say when it ran.
    let total = "tollgate_tokens_total{route=\"endings\",kind=\"total\"}";
    series_reaches(&admin, total, used).await;
}

#[tokio::test]
async fn anthropic_and_header_answers_settle_as_they_report() {
    let upstream = LlmUpstream::start().await;
    let usage = "    usage:\n      format: anthropic\n      reserve: { prompt: body_bytes, completion: max_tokens, completion_cap: 500 }\n      read_on_timeout: 1s\n";
    let limits = format!(
        "{}      - {{ name: out, key: ip, algorithm: sliding_window, limit: 5000, period: 1h, counts: output_tokens }}\n",
        tokens_per_window("input_tokens", 5000)
    );
    let gateway = start_gateway(&config(None, &upstream.url(), usage, &limits)).await;
    let admin = serve_admin(&gateway, None).await;
    let message = json!({"model": "claude", "max_tokens": 400, "messages": [{"role": "user", "content": "Hi"}]});
    let (status, _, _) = post(&gateway, "/v1/messages", &message, 30, 20).await;
    assert_eq!(status, 200);
    settles_to(&admin, "tpm", 5000 - 30).await;
    settles_to(&admin, "out", 5000 - 20).await;

    let mut streamed = message.clone();
    streamed["stream"] = json!(true);
    let (status, _, _) = post(&gateway, "/v1/messages", &streamed, 12, 40).await;
    assert_eq!(status, 200);
    settles_to(&admin, "tpm", 5000 - 42).await;
    settles_to(&admin, "out", 5000 - 60).await;

    // Cut after message_start, the rest never coming: the whole reservation once read_on_timeout has passed (the
    // body's bytes and max_tokens 400), never less than message_start reported.
    let response = common::http_client::client()
        .post(gateway.url("/cut/messages"))
        .header("content-type", "application/json")
        .header("x-test-input", "8")
        .body(streamed.to_string())
        .send()
        .await
        .expect("gateway answers");
    let mut response = response;
    response.chunk().await.expect("a chunk").expect("data");
    drop(response);
    let prompt = streamed.to_string().len() as u64;
    settles_to(&admin, "tpm", 5000 - 42 - prompt).await;
    settles_to(&admin, "out", 5000 - 60 - 400).await;

    // A number in a header.
    let (gateway, admin) = reading_x_tokens(&upstream).await;
    let (status, _, _) = post(&gateway, "/header", &json!({}), 3, 4).await;
    assert_eq!(status, 200);
    settles_to(&admin, "tpm", 1000 - 7).await;
}

/// A gateway in front of `upstream` whose route reads its usage from `x-tokens` (a header or a trailer), reserving
/// 110, with a limit `tpm` of 1000 tokens an hour; and its admin API's URL.
async fn reading_x_tokens(upstream: &LlmUpstream) -> (TestGateway, String) {
    let usage = "    usage:\n      format: header:x-tokens\n      reserve: { prompt: 10, completion: 100 }\n";
    let yaml = config(
        None,
        &upstream.url(),
        usage,
        &tokens_per_window("total_tokens", 1000),
    );
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    (gateway, admin)
}

#[tokio::test]
async fn usage_in_a_trailer_is_asked_for_read_settled_and_passed_on_to_clients_that_take_it() {
    use http_body_util::BodyExt;
    let upstream = LlmUpstream::start().await;
    let (gateway, admin) = reading_x_tokens(&upstream).await;
    // An HTTP/1.1 client that takes no trailers: the gateway asks for them, as it reads them.
    let (status, _, body) = post(&gateway, "/trailer", &json!({}), 3, 4).await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let received = upstream.received();
    let (_, headers, _) = received.requests.last().expect("a request");
    assert_eq!(headers["te"], "trailers");
    settles_to(&admin, "tpm", 1000 - 7).await;

    // An HTTP/1.1 client that takes trailers gets the upstream's, announced by its Trailer field.
    let request = "POST /trailer HTTP/1.1\r\nhost: x\r\nte: trailers\r\nx-test-input: 1\r\nx-test-output: 1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    let answer = common::http_client::raw(gateway.addr, request.as_bytes()).await;
    let lower = answer.to_ascii_lowercase();
    assert!(
        lower.contains("\r\ntrailer: x-tokens\r\n")
            && lower.ends_with("\r\n0\r\nx-tokens: 2\r\n\r\n"),
        "{answer}"
    );
    settles_to(&admin, "tpm", 1000 - 9).await;

    // An HTTP/2 client gets the trailer as the upstream sent it, and its usage is settled too.
    let stream = tokio::net::TcpStream::connect(gateway.addr)
        .await
        .expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2c handshake");
    tokio::spawn(connection);
    let request = http::Request::post(gateway.url("/trailer"))
        .header("x-test-input", "20")
        .header("x-test-output", "30")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .expect("request");
    let response = sender.send_request(request).await.expect("an answer");
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.expect("a body");
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers["x-tokens"], "50");
    assert_eq!(&collected.to_bytes()[..], b"ok");
    settles_to(&admin, "tpm", 1000 - 59).await;
}

#[tokio::test]
async fn an_unreachable_upstream_gives_the_reservation_back() {
    let closed = common::ReservedPort::new();
    let yaml = config(
        None,
        &format!("http://{}", closed.addr()),
        &openai("100"),
        &tokens_per_window("total_tokens", 1000),
    );
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let (status, _, _) = post(&gateway, "/v1/chat/completions", &chat(200), 1, 1).await;
    assert_eq!(status, 502);
    settles_to(&admin, "tpm", 1000).await;
}

/// The exactness promise on `redis` (two gateways) or in memory: with reservations that bound what the upstream
/// reports, what it reported for the admitted requests never exceeds the limit, however many run at once.
async fn reported_usage_stays_within_the_limit(redis: Option<&RedisServer>) {
    let upstream = LlmUpstream::start().await;
    let yaml = config(
        redis,
        &upstream.url(),
        &openai("body_bytes"),
        "      - { name: tpm, key: ip, algorithm: sliding_window, limit: 2000, period: 20000d, counts: total_tokens }\n      - { name: rpm, key: ip, algorithm: fixed_window, limit: 1000, period: 20000d }\n",
    );
    let gateways = gateways_sharing(&yaml, redis).await;
    let admin = serve_admin(&gateways[0], None).await;
    // Bodies of different lengths, as real prompts are: each request reserves its own amount (about 90 to 210
    // bytes, and 150) and reports 40 + 150.
    let bodies: Vec<Value> = (0..120)
        .map(|i| {
            let mut body = chat(150);
            body["messages"][0]["content"] = json!("x".repeat(i));
            body
        })
        .collect();
    let mut after_first = 0;
    for wave in 0..3 {
        let mut requests = Vec::new();
        for i in 0..40 {
            let gateway = &gateways[i % gateways.len()];
            requests.push(post(
                gateway,
                "/v1/chat/completions",
                &bodies[wave * 40 + i],
                40,
                150,
            ));
        }
        let answers = futures_util::future::join_all(requests).await;
        let statuses: Vec<u16> = answers.iter().map(|(status, _, _)| *status).collect();
        assert!(
            statuses.iter().all(|s| *s == 200 || *s == 429),
            "wave {wave}: {statuses:?}"
        );
        if wave == 0 {
            assert!(
                statuses.contains(&200) && statuses.contains(&429),
                "{statuses:?}"
            );
        }
        let reported = reported(&upstream);
        assert!(
            reported <= 2000,
            "wave {wave}: the upstream reported {reported}"
        );
        // The next wave finds what the answers left.
        settles_to(&admin, "tpm", 2000 - reported).await;
        if wave == 0 {
            after_first = reported;
        }
    }
    // Refunds made room after the first wave.
    let reported = reported(&upstream);
    assert!(
        reported > after_first,
        "reported {reported}, {after_first} after the first wave"
    );
}

/// The tokens the upstream reported in all its whole answers.
fn reported(upstream: &LlmUpstream) -> u64 {
    upstream
        .received()
        .reported
        .iter()
        .map(|(input, output)| input + output)
        .sum()
}

crate::each_store!(
    reported_usage_never_exceeds_the_limit,
    reported_usage_stays_within_the_limit
);

/// With an upstream that spends more than reserved, the overshoot is the debt, and the next request waits exactly
/// until it is paid.
async fn an_overspend_is_a_debt_the_next_request_waits_for(redis: Option<&RedisServer>) {
    let upstream = LlmUpstream::start().await;
    let usage = "    usage:\n      format: openai\n      reserve: { prompt: 0, completion: 10 }\n";
    // 100 output tokens a minute: one token every 600 ms.
    let limits = "      - { name: out, key: ip, algorithm: token_bucket, rate: 100/1m, burst: 100, counts: output_tokens }\n";
    let gateways = gateways_sharing(&config(redis, &upstream.url(), usage, limits), redis).await;
    let (status, _, _) = post(&gateways[0], "/v1/chat/completions", &chat(10), 1, 130).await;
    assert_eq!(status, 200);
    // Reserved 10, spent 130: the bucket is 30 in debt. The next request (10) waits for 40 tokens: 24 s.
    let last = gateways.last().expect("a gateway");
    let mut denial = None;
    let waited = eventually(Duration::from_secs(5), async || {
        let (status, headers, body) = post(last, "/v1/chat/completions", &chat(10), 1, 1).await;
        denial = Some((status, headers, body));
        status == 429
    })
    .await;
    let (_, headers, body) = denial.expect("an answer");
    assert!(waited.is_some(), "not refused: {body}");
    // In OpenAI's shape, tollgate's facts beside its members.
    let body: Value = serde_json::from_str(&body).expect("json");
    let retry_after_ms = body["error"]["retry_after_ms"]
        .as_u64()
        .expect("retry_after_ms");
    assert!(
        (23_000..=24_000).contains(&retry_after_ms),
        "retry_after_ms {retry_after_ms}"
    );
    assert_eq!(headers["retry-after"], "24");
    assert_eq!(headers["retry-after-ms"], retry_after_ms.to_string());
    assert_eq!(body["error"]["limit"], "out");
}

crate::each_store!(
    an_overspend_is_a_debt,
    an_overspend_is_a_debt_the_next_request_waits_for
);

/// An answer that spent more than its reservation leaves the key in debt, and the admin API shows it as used past
/// the capacity (363 of 300), on every algorithm that counts tokens: the route's limits and the consumer's plan.
async fn the_admin_api_shows_a_debt_as_used_past_the_capacity(redis: Option<&RedisServer>) {
    let upstream = LlmUpstream::start().await;
    let yaml = format!(
        r#"store:
{}consumers:
  identify: [ {{ api_key: {{ header: x-api-key }} }} ]
  keys: [ {{ key: k1, consumer: acme, plan: pro }} ]
  plans:
    pro:
      limits:
        - {{ name: daily, key: consumer, algorithm: fixed_window, limit: 300, period: 20000d, counts: total_tokens }}
upstreams:
  llm: {{ targets: ["{}"] }}
routes:
  - name: chat
    match: {{ path_prefix: / }}
    upstream: llm
    consumers: required
    usage:
      format: openai
      reserve: {{ prompt: 0, completion: 10 }}
    limits:
      - {{ name: fixed, key: consumer, algorithm: fixed_window, limit: 300, period: 20000d, counts: total_tokens }}
      - {{ name: sliding, key: consumer, algorithm: sliding_window, limit: 300, period: 20000d, counts: total_tokens }}
      - {{ name: log, key: consumer, algorithm: sliding_log, limit: 300, period: 1h, counts: total_tokens }}
      - {{ name: bucket, key: consumer, algorithm: token_bucket, rate: 300/1h, burst: 300, counts: total_tokens }}
      - {{ name: gcra, key: consumer, algorithm: gcra, rate: 300/1h, burst: 300, counts: total_tokens }}
      - {{ name: meter, key: consumer, algorithm: leaky_bucket, rate: 300/1h, burst: 300, counts: total_tokens }}
"#,
        store_yaml(redis),
        upstream.url()
    );
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let client = common::http_client::client();
    let response = reporting(
        &client,
        &gateway.url("/v1/chat/completions"),
        &chat(10),
        (300, 63),
    )
    .header("x-api-key", "k1")
    .send()
    .await
    .expect("answer");
    assert_eq!(response.status(), 200);
    response.text().await.expect("body");

    for limit in ["fixed", "sliding", "log", "bucket", "gcra", "meter"] {
        let url = format!("{admin}/limits/chat/{limit}?key=acme");
        let mut last = Value::Null;
        let settled = eventually(Duration::from_secs(5), async || {
            last = common::http_client::json_answer(client.get(&url)).await.1;
            last["used"] == 363
        })
        .await;
        assert!(settled.is_some(), "{limit}: {last}");
        assert_eq!(last["capacity"], 300, "{limit}: {last}");
        assert_eq!(last["remaining"], 0, "{limit}: {last}");
        assert_eq!(last["owed"], 63, "{limit}: {last}");
        assert_eq!(last["would_admit"], false, "{limit}: {last}");
    }
    let (_, consumer) =
        common::http_client::json_answer(client.get(format!("{admin}/consumers/acme"))).await;
    let daily = consumer["limits"]
        .as_array()
        .and_then(|limits| limits.iter().find(|l| l["name"] == "daily"))
        .unwrap_or_else(|| panic!("the plan's limit in {consumer}"));
    assert_eq!(daily["used"], 363, "{daily}");
    assert_eq!(daily["owed"], 63, "{daily}");
}

crate::each_store!(
    the_admin_api_shows_a_debt,
    the_admin_api_shows_a_debt_as_used_past_the_capacity
);

#[tokio::test]
async fn an_answer_that_used_less_leaves_the_rest_on_every_algorithm() {
    let upstream = LlmUpstream::start().await;
    let redis = RedisServer::start();
    let algorithms = [
        "algorithm: fixed_window, limit: 1000, period: 20000d",
        "algorithm: sliding_window, limit: 1000, period: 20000d",
        "algorithm: sliding_log, limit: 1000, period: 1h",
        "algorithm: token_bucket, rate: 1000/1h, burst: 1000",
        "algorithm: gcra, rate: 1000/1h, burst: 1000",
        "algorithm: leaky_bucket, rate: 1000/1h, burst: 1000",
    ];
    for store in [None, Some(&redis)] {
        for algorithm in algorithms {
            let limits =
                format!("      - {{ name: tpm, key: ip, {algorithm}, counts: total_tokens }}\n");
            let gateway =
                start_gateway(&config(store, &upstream.url(), &openai("100"), &limits)).await;
            let admin = serve_admin(&gateway, None).await;
            let _ = reqwest::Client::new()
                .delete(format!("{admin}/limits/chat/tpm?key=127.0.0.1"))
                .send()
                .await;
            // Reserves 300, reports 15.
            let (status, _, _) = post(&gateway, "/v1/chat/completions", &chat(200), 5, 10).await;
            assert_eq!(status, 200, "{algorithm}");
            let settled = eventually(Duration::from_secs(5), async || {
                (984..=985).contains(&remaining(&admin, "tpm").await)
            })
            .await;
            assert!(
                settled.is_some(),
                "{algorithm} on {}: {} left",
                if store.is_some() { "redis" } else { "memory" },
                remaining(&admin, "tpm").await
            );
        }
    }
}

#[tokio::test]
async fn the_forwarded_body_is_capped_and_asks_for_the_stream_usage() {
    let upstream = LlmUpstream::start().await;
    let yaml = config(
        None,
        &upstream.url(),
        &openai("body_bytes"),
        &tokens_per_window("output_tokens", 100_000),
    );
    let gateway = start_gateway(&yaml).await;
    let (status, _, _) = post(&gateway, "/v1/chat/completions", &chat(5000), 1, 1).await;
    assert_eq!(status, 200);
    let forwarded = upstream.last_body();
    assert_eq!(forwarded["max_tokens"], json!(200), "{forwarded}");
    assert!(forwarded.get("stream_options").is_none(), "{forwarded}");
    let received = upstream.received();
    let (_, headers, body) = received.requests.last().expect("a request");
    assert_eq!(headers["content-length"], body.len().to_string().as_str());
    assert_eq!(headers["accept-encoding"], "identity");

    // No limit named: the default is written in, so that what is reserved bounds what may be written.
    let mut unbounded = chat(1);
    unbounded
        .as_object_mut()
        .expect("object")
        .remove("max_tokens");
    unbounded["stream"] = json!(true);
    let (status, _, _) = post(&gateway, "/v1/chat/completions", &unbounded, 1, 1).await;
    assert_eq!(status, 200);
    let forwarded = upstream.last_body();
    assert_eq!(
        forwarded["max_completion_tokens"],
        json!(100),
        "{forwarded}"
    );
    assert_eq!(forwarded["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn a_body_past_max_request_bytes_is_413_and_a_reservation_past_the_limit_too() {
    let upstream = LlmUpstream::start().await;
    let usage = "    usage:\n      format: openai\n      reserve: { completion: max_tokens, completion_default: 100 }\n      max_request_bytes: 200\n";
    let yaml = config(
        None,
        &upstream.url(),
        usage,
        &tokens_per_window("total_tokens", 1000),
    );
    let gateway = start_gateway(&yaml).await;
    let mut large = chat(10);
    large["messages"][0]["content"] = json!("x".repeat(300));
    let (status, _, body) = post(&gateway, "/v1/chat/completions", &large, 1, 1).await;
    assert_eq!(status, 413);
    let body: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["error"]["code"], "body_too_large", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    // Streamed without a declared length: read up to the bound, then refused.
    let text = large.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{text}\r\n0\r\n\r\n",
        text.len()
    );
    let answer = common::http_client::raw(gateway.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(upstream.received().requests.len(), 0, "nothing forwarded");

    // max_tokens 5000 (no cap): more than the limit could ever hold.
    let (status, _, body) = post(&gateway, "/v1/chat/completions", &chat(5000), 1, 1).await;
    assert_eq!(status, 413);
    let body: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["error"]["code"], "reservation_too_large", "{body}");
    assert_eq!(body["error"]["limit"], "tpm");
    assert_eq!(body["error"]["capacity"], 1000);

    // A body that is not JSON cannot be bounded: 400.
    let response = common::http_client::client()
        .post(gateway.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn answers_carry_the_token_fields_and_the_admin_api_shows_tokens() {
    let upstream = LlmUpstream::start().await;
    let yaml = format!(
        r#"store:
  backend: memory
consumers:
  identify: [ {{ api_key: {{ header: x-api-key }} }} ]
  keys: [ {{ key: k1, consumer: acme, plan: pro }} ]
  plans:
    pro:
      limits:
        - {{ name: daily, key: consumer, algorithm: fixed_window, limit: 50000, period: 1d, counts: total_tokens }}
upstreams:
  llm: {{ targets: ["{}"] }}
routes:
  - name: plain
    match: {{ path_prefix: /plain }}
    consumers: required
    respond: {{ status: 200 }}
  - name: chat
    match: {{ path_prefix: / }}
    upstream: llm
    consumers: required
{}    limits:
      - {{ name: rpm, key: consumer, algorithm: fixed_window, limit: 10, period: 1h }}
      - {{ name: tpm, key: consumer, algorithm: fixed_window, limit: 20000, period: 1h, counts: total_tokens }}
"#,
        upstream.url(),
        openai("100")
    );
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let response = common::http_client::client()
        .post(gateway.url("/v1/chat/completions"))
        .header("x-api-key", "k1")
        .header("content-type", "application/json")
        .body(chat(200).to_string())
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    response.text().await.expect("body");
    // rpm (9 left) explains the request; tpm (20000 - 300) is the tightest token limit.
    assert_eq!(headers["x-ratelimit-remaining"], "9");
    assert_eq!(headers["x-ratelimit-limit-tokens"], "20000");
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "19700");
    let reset = headers["x-ratelimit-reset-tokens"].to_str().expect("text");
    assert!(reset.ends_with('s'), "{reset}");
    let rate_limit = headers["ratelimit"].to_str().expect("text");
    assert!(
        rate_limit.starts_with("\"rpm\";r=9;t=") && rate_limit.contains(", \"tpm\";r=19700;t="),
        "{rate_limit}"
    );
    let policy = headers["ratelimit-policy"].to_str().expect("text");
    assert!(
        policy.contains("\"tpm\";q=20000;w=3600") && policy.contains("\"pro.daily\";q=50000"),
        "{policy}"
    );

    // The plan's token limit does not apply where the route reads no usage: nothing reserved, nothing said.
    let response = common::http_client::client()
        .get(gateway.url("/plain"))
        .header("x-api-key", "k1")
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-ratelimit-limit-tokens").is_none());
    let policy = response.headers().get("ratelimit-policy");
    assert!(policy.is_none(), "{policy:?}");

    // Settled (15 reported): the route's limit and the consumer's plan limit show the tokens used.
    let url = format!("{admin}/limits/chat/tpm?key=acme");
    let settled = eventually(Duration::from_secs(5), async || {
        let (_, state) =
            common::http_client::json_answer(common::http_client::client().get(&url)).await;
        state["used"] == 15
    })
    .await;
    assert!(settled.is_some());
    let (_, state) =
        common::http_client::json_answer(common::http_client::client().get(&url)).await;
    assert_eq!(state["counts"], "total_tokens", "{state}");
    let (_, consumer) = common::http_client::json_answer(
        common::http_client::client().get(format!("{admin}/consumers/acme")),
    )
    .await;
    let text = consumer.to_string();
    assert!(
        text.contains("\"counts\":\"total_tokens\"") && text.contains("\"used\":15"),
        "{text}"
    );
    // A per-consumer override of the plan's token limit: 250 a day, less than this request's 300.
    let response = common::http_client::client()
        .put(format!("{admin}/consumers/acme"))
        .header("content-type", "application/json")
        .body(r#"{"plan":"pro","overrides":{"daily":{"limit":250}}}"#)
        .send()
        .await
        .expect("admin answers");
    assert!(response.status().is_success(), "{}", response.status());
    let response = common::http_client::client()
        .post(gateway.url("/v1/chat/completions"))
        .header("x-api-key", "k1")
        .header("content-type", "application/json")
        .body(chat(200).to_string())
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status(), 413);
    let refused: Value = serde_json::from_str(&response.text().await.expect("body")).expect("json");
    assert_eq!(refused["error"]["limit"], "pro.daily", "{refused}");
    assert_eq!(refused["error"]["capacity"], 250, "{refused}");
}

/// A streamed request to `/gated/chat/completions` at `url` (the upstream holds it after its first event until released),
/// the upstream to report `input` and `output` after `mib` MiB of content; its answer, once its head came.
async fn gated_stream(
    client: &reqwest::Client,
    url: &str,
    usage: (u64, u64),
    mib: u64,
) -> reqwest::Response {
    let mut streamed = chat(200);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let response = reporting(client, url, &streamed, usage)
        .header("x-test-mib", mib.to_string())
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(response.status(), 200);
    response
}

/// The first piece of `response`'s body: it must come while the upstream sends nothing more (it waits for the test
/// to have it), so a gateway holding back the first bytes would never deliver it.
async fn first_piece(response: &mut reqwest::Response) -> bytes::Bytes {
    let first = tokio::time::timeout(Duration::from_secs(30), response.chunk())
        .await
        .expect("the first event came alone, not held back for more")
        .expect("a piece")
        .expect("not the end");
    assert!(first.starts_with(b"data: "), "{first:?}");
    first
}

/// The resident memory of process `pid`, in KiB (VmRSS in /proc/PID/status).
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"))
}

#[tokio::test]
async fn a_100_mib_stream_passes_unbuffered_with_flat_memory_and_settles_its_last_event() {
    const MIB: u64 = 1024 * 1024;
    const STREAMED_MIB: u64 = 100;
    let upstream = LlmUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.yaml");
    let yaml = config(
        None,
        &upstream.url(),
        &openai("100"),
        &tokens_per_window("total_tokens", 1_000_000),
    );
    let yaml = format!("admin:\n  listen: 127.0.0.1:0\n{yaml}");
    std::fs::write(&path, yaml).expect("config");
    // One worker thread: what is measured is what the gateway holds, not what the allocator has yet to take back
    // from frees made on another thread than the allocation's (with several workers, mimalloc 2 lets those build
    // up, then returns them at once: a sawtooth of up to about 40 MB over this stream).
    let mut command = common::binary::Tollgate::command(&path);
    command.env("TOKIO_WORKER_THREADS", "1");
    let gateway = common::binary::Tollgate::spawn(command);
    let pid = gateway.pid();
    // No overall timeout: 100 MiB through a debug build takes what it takes.
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let url = gateway.url("/gated/chat/completions");
    let mut response = gated_stream(&client, &url, (1_000, 2_000), STREAMED_MIB).await;
    let first = first_piece(&mut response).await;
    upstream.release();

    let mut received = first.len() as u64;
    let mut end = first.to_vec();
    let (mut baseline, mut peak) = (None, 0);
    let mut next_sample = MIB;
    while let Some(piece) = response.chunk().await.expect("the stream goes on") {
        received += piece.len() as u64;
        end.extend_from_slice(&piece);
        end.drain(..end.len().saturating_sub(512));
        if received >= next_sample {
            let rss = resident_kib(pid);
            baseline.get_or_insert(rss);
            peak = peak.max(rss);
            next_sample += MIB;
        }
    }
    assert!(received >= STREAMED_MIB * MIB, "{received} bytes");
    let end = String::from_utf8_lossy(&end);
    assert!(
        end.contains("\"total_tokens\":3000") && end.ends_with("data: [DONE]\n\n"),
        "{end}"
    );
    // Flat: what the gateway holds after the first MiB is what it holds while the other 99 pass.
    let baseline = baseline.expect("sampled");
    assert!(
        peak <= baseline + 32 * 1024,
        "resident memory rose from {baseline} KiB to {peak} KiB while {STREAMED_MIB} MiB streamed"
    );
    // The usage in the last event is what was settled (1,000 + 2,000 of 300 reserved).
    let admin = format!("http://{}", gateway.admin);
    settles_to(&admin, "tpm", 1_000_000 - 3_000).await;
}

/// A streamed answer whose settlement finds Redis gone (killed between admission and the answer's end) under
/// `on_error`: the client gets the whole answer, the failure is counted; returns what decides the next request.
async fn settling_while_redis_is_gone(on_error: &str) -> (TestGateway, LlmUpstream, String) {
    tollgate::telemetry::prometheus();
    let mut redis = RedisServer::start();
    let upstream = LlmUpstream::start().await;
    let yaml = config(
        Some(&redis),
        &upstream.url(),
        &openai("100"),
        &tokens_per_window("total_tokens", 1_000),
    )
    .replace("on_error: deny", &format!("on_error: {on_error}"));
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let failed_before = settlements_failed(&admin).await;
    // Reserves 300 (prompt 100, max_tokens 200), reports 600: 300 owed.
    let client = common::http_client::client();
    let url = gateway.url("/gated/chat/completions");
    let mut response = gated_stream(&client, &url, (100, 500), 0).await;
    first_piece(&mut response).await;
    redis.kill();
    upstream.release();
    let rest = tokio::time::timeout(Duration::from_secs(30), response.text())
        .await
        .expect("the answer ends although its settlement cannot")
        .expect("the whole answer");
    assert!(
        rest.contains("\"total_tokens\":600") && rest.ends_with("data: [DONE]\n\n"),
        "{on_error}: {rest}"
    );
    let counted = eventually(Duration::from_secs(10), async || {
        settlements_failed(&admin).await > failed_before
    })
    .await;
    assert!(
        counted.is_some(),
        "{on_error}: the failed settlement is counted"
    );
    (gateway, upstream, admin)
}

/// `tollgate_settlements_failed_total` as the admin listener at `admin` shows it (0 before any).
async fn settlements_failed(admin: &str) -> u64 {
    common::http_client::metrics_text(admin)
        .await
        .lines()
        .find_map(|line| line.strip_prefix("tollgate_settlements_failed_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_settlement_finding_redis_gone_lands_in_the_fallback_under_on_error_local() {
    let (gateway, _upstream, _admin) = settling_while_redis_is_gone("local").await;
    // Decided by the fallback now: it owes the 300 the answer spent beyond its reservation, and this request's 300
    // come on top (700 left without the debt).
    let (status, headers, _) = post(&gateway, "/v1/chat/completions", &chat(200), 7, 3).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "400");
}

#[tokio::test]
async fn a_settlement_finding_redis_gone_is_counted_under_on_error_allow_and_deny() {
    for on_error in ["allow", "deny"] {
        settling_while_redis_is_gone(on_error).await;
    }
}

/// The value of the series `series` (its name and labels as the exposition writes them) in `metrics`, 0 if absent.
fn series_value(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until the series `series` of the gateway whose admin API is at `admin` reads `expected`.
async fn series_reaches(admin: &str, series: &str, expected: u64) {
    let mut last = None;
    let reached = eventually(Duration::from_secs(10), async || {
        let now = series_value(&common::http_client::metrics_text(admin).await, series);
        last = Some(now);
        now == expected
    })
    .await;
    assert!(
        reached.is_some(),
        "{series}: expected {expected}, last read {last:?}"
    );
}

/// Reported counts outside 0..2^53 (huge, negative, fractional, strings) are no usage: each answer is settled at
/// its reservation (300) and counted as missing, none gives anything back, and the tokens counted never go down.
async fn untrusted_counts_settle_at_the_reservation(redis: Option<&RedisServer>, route: &str) {
    tollgate::telemetry::prometheus();
    let upstream = LlmUpstream::start().await;
    let yaml = config(
        redis,
        &upstream.url(),
        &openai("100"),
        &tokens_per_window("total_tokens", 100_000),
    )
    .replace("name: chat", &format!("name: {route}"));
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let limit = format!("{route}/tpm");
    let (status, _, _) = post(&gateway, "/v1/chat/completions", &chat(200), 60, 35).await;
    assert_eq!(status, 200);
    let mut used = 95;
    settles_to(&admin, &limit, 100_000 - used).await;
    let untrusted = [
        r#"{"prompt_tokens":10,"completion_tokens":5,"total_tokens":18446744073709461616}"#,
        r#"{"prompt_tokens":10,"completion_tokens":18446744073709551615}"#,
        r#"{"prompt_tokens":-50,"completion_tokens":5,"total_tokens":-45}"#,
        r#"{"prompt_tokens":10.5,"completion_tokens":5,"total_tokens":15.5}"#,
        r#"{"prompt_tokens":"10","completion_tokens":"5","total_tokens":"15"}"#,
        r#"{"prompt_tokens":9007199254740992,"completion_tokens":0}"#,
    ];
    let missing = format!("tollgate_usage_missing_total{{route=\"{route}\"}}");
    let total = format!("tollgate_tokens_total{{route=\"{route}\",kind=\"total\"}}");
    let client = common::http_client::client();
    for (i, usage) in untrusted.into_iter().enumerate() {
        let response = client
            .post(gateway.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-test-usage", usage)
            .body(chat(200).to_string())
            .send()
            .await
            .expect("gateway answers");
        assert_eq!(response.status(), 200, "{usage}");
        response.bytes().await.expect("whole answer");
        used += 300;
        settles_to(&admin, &limit, 100_000 - used).await;
        let metrics = common::http_client::metrics_text(&admin).await;
        assert_eq!(series_value(&metrics, &missing), i as u64 + 1, "{usage}");
        assert_eq!(series_value(&metrics, &total), used, "{usage}");
    }
}

#[tokio::test]
async fn untrusted_counts_are_no_usage_in_memory() {
    untrusted_counts_settle_at_the_reservation(None, "numbers_memory").await;
}

#[tokio::test]
async fn untrusted_counts_are_no_usage_on_redis() {
    let redis = RedisServer::start();
    untrusted_counts_settle_at_the_reservation(Some(&redis), "numbers_redis").await;
}

/// The label is not the body: 20 concurrent JSON requests labelled `text/plain` asking for 50,000 tokens each, on a
/// 100,000-token limit, at an upstream that reads JSON whatever the header and writes all it is allowed: each body
/// is read, capped at 10,000 and reserved as such, so the tokens spent stay within the limit. Then each other label
/// (or none) is read alike, and a real form is forwarded byte for byte, reserving its bytes and the default.
async fn json_bodies_are_bounded_whatever_their_label(redis: Option<&RedisServer>) {
    let upstream = LlmUpstream::start().await;
    let usage = "    usage:\n      format: openai\n      reserve: { prompt: body_bytes, completion: max_tokens, completion_default: 1000, completion_cap: 10000 }\n";
    let yaml = config(
        redis,
        &upstream.url(),
        usage,
        &tokens_per_window("total_tokens", 100_000),
    );
    let gateways = gateways_sharing(&yaml, redis).await;
    let admin = serve_admin(&gateways[0], None).await;
    let client = common::http_client::client();
    let requests = (0..20).map(|i| {
        client
            .post(gateways[i % gateways.len()].url("/v1/chat/completions"))
            .header("content-type", "text/plain")
            .header("x-test-input", "100")
            .header("x-test-output", "max")
            .body(chat(50_000).to_string())
            .send()
    });
    let answers = futures_util::future::join_all(requests).await;
    let statuses: Vec<u16> = answers
        .iter()
        .map(|answer| answer.as_ref().expect("answers").status().as_u16())
        .collect();
    let admitted = statuses.iter().filter(|status| **status == 200).count();
    assert!(
        (1..20).contains(&admitted) && statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    let spent = reported(&upstream);
    assert!(
        spent <= 100_000,
        "spent {spent} of 100,000 ({admitted} admitted)"
    );
    for (_, headers, body) in upstream.received().requests {
        let body: Value = serde_json::from_slice(&body).expect("JSON forwarded");
        assert_eq!(body["max_tokens"], json!(10_000));
        assert_eq!(headers["content-type"], "application/json");
    }
    eprintln!(
        "20 concurrent text/plain requests: {admitted} admitted, {spent} tokens spent of 100,000"
    );
    settles_to(&admin, "tpm", 100_000 - spent).await;

    let labels = [
        Some("text/json"),
        Some("application/octet-stream"),
        Some("multipart/form-data; boundary=x"),
        Some("application / json"),
        None,
    ];
    for label in labels {
        let mut request = client
            .post(gateways[0].url("/v1/chat/completions"))
            .header("x-test-output", "max")
            .body(format!(" \r\n{}", chat(50_000)));
        if let Some(label) = label {
            request = request.header("content-type", label);
        }
        let before = upstream.received().requests.len();
        let status = request.send().await.expect("answers").status();
        let received = upstream.received().requests;
        if status == 200 {
            let body: Value = serde_json::from_slice(&received[before].2).expect("JSON");
            assert_eq!(body["max_tokens"], json!(10_000), "{label:?}");
        } else {
            assert_eq!(status, 429, "{label:?}");
            assert_eq!(received.len(), before, "{label:?}: refused, not forwarded");
        }
    }

    // A real form: forwarded as it is, reserving its bytes and the default (1,000).
    let form =
        "--x\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--x--\r\n";
    let left = remaining(&admin, "tpm").await;
    let answer = client
        .post(gateways[0].url("/v1/completions"))
        .header("content-type", "multipart/form-data; boundary=x")
        .body(form)
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status(), 404, "the upstream has no such path");
    let reserved = form.len() as u64 + 1000;
    assert_eq!(
        answer.headers()["x-ratelimit-remaining-tokens"],
        (left - reserved).to_string().as_str()
    );
    let (_, headers, body) = upstream.received().requests.pop().expect("forwarded");
    assert_eq!(&body[..], form.as_bytes());
    assert_eq!(headers["content-type"], "multipart/form-data; boundary=x");
    // A 4xx without usage gives its reservation back; what was asked shows in the limit's fields.
    settles_to(&admin, "tpm", left).await;
}

crate::each_store!(
    json_bodies_are_bounded_whatever_their_label,
    json_bodies_are_bounded_whatever_their_label
);

/// Leaving early is not cheap: 15 clients each read the first event of a stream and leave before its usage; the
/// upstream sends the rest only once they are gone (a concurrency limit's `tollgate_in_flight` says when), and
/// tollgate reads on and settles each at what the upstream reported (129 + 3,903, more than the 300 reserved). A
/// stream whose usage comes past `read_on_bytes` (1 MiB), or never (`read_on_timeout: 1s`), settles at its whole
/// reservation.
async fn leaving_early_settles_what_the_upstream_reported(
    redis: Option<&RedisServer>,
    route: &str,
) {
    tollgate::telemetry::prometheus();
    let upstream = LlmUpstream::start().await;
    let usage = openai("100").replace(
        "stream_usage: inject\n",
        "stream_usage: inject\n      read_on_timeout: 1s\n",
    );
    let limits = format!(
        "{}      - {{ name: streams, key: ip, algorithm: concurrency, max: 100 }}\n",
        tokens_per_window("total_tokens", 1_000_000)
    );
    let yaml = config(redis, &upstream.url(), &usage, &limits)
        .replace("name: chat", &format!("name: {route}"));
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let limit = format!("{route}/tpm");
    let in_flight = format!("tollgate_in_flight{{route=\"{route}\",limit=\"streams\"}}");
    let all_left = async || {
        let gone = eventually(Duration::from_secs(10), async || {
            let metrics = common::http_client::metrics_text(&admin).await;
            series_value(&metrics, &in_flight) == 0
        })
        .await;
        assert!(gone.is_some(), "the clients' answers ended");
    };
    let client = common::http_client::client();
    for _ in 0..15 {
        let url = gateway.url("/gated/chat/completions");
        let mut response = gated_stream(&client, &url, (129, 3903), 0).await;
        first_piece(&mut response).await;
        drop(response);
    }
    all_left().await;
    for _ in 0..15 {
        upstream.release();
    }
    let mut used = 15 * 4032;
    settles_to(&admin, &limit, 1_000_000 - used).await;
    let spent = reported(&upstream);
    assert_eq!(spent, used);
    eprintln!("15 streams left early: the upstream spent {spent}, counted {used}");
    let missing = format!("tollgate_usage_missing_total{{route=\"{route}\"}}");

    // The usage past read_on_bytes: the whole reservation.
    let url = gateway.url("/gated/chat/completions");
    let mut response = gated_stream(&client, &url, (129, 3903), 2).await;
    first_piece(&mut response).await;
    drop(response);
    all_left().await;
    upstream.release();
    used += 300;
    series_reaches(&admin, &missing, 1).await;
    settles_to(&admin, &limit, 1_000_000 - used).await;

    // No usage ever (the stream is held open): the whole reservation once read_on_timeout has passed.
    let mut response = client
        .post(gateway.url("/cut/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(200).to_string())
        .send()
        .await
        .expect("gateway answers");
    response.chunk().await.expect("a chunk").expect("data");
    drop(response);
    used += 300;
    series_reaches(&admin, &missing, 2).await;
    settles_to(&admin, &limit, 1_000_000 - used).await;
    let total = format!("tollgate_tokens_total{{route=\"{route}\",kind=\"total\"}}");
    series_reaches(&admin, &total, used).await;
}

#[tokio::test]
async fn leaving_early_settles_what_the_upstream_reported_in_memory() {
    leaving_early_settles_what_the_upstream_reported(None, "early_memory").await;
}

#[tokio::test]
async fn leaving_early_settles_what_the_upstream_reported_on_redis() {
    let redis = RedisServer::start();
    leaving_early_settles_what_the_upstream_reported(Some(&redis), "early_redis").await;
}

/// A gateway in front of `upstream` with an Anthropic route on `/v1/messages` (completions capped at 500) before an
/// OpenAI route `chat` on `/v1/` (`openai("body_bytes")`, its `usage` block then given `extra` lines), each with a
/// `tpm` limit of 100,000 tokens an hour per address; and its admin API's URL.
async fn two_providers(
    redis: Option<&RedisServer>,
    upstream: &LlmUpstream,
    extra: &str,
) -> (Vec<TestGateway>, String) {
    let tpm = tokens_per_window("total_tokens", 100_000);
    let yaml = format!(
        "store:\n{}upstreams:\n  llm: {{ targets: [\"{}\"] }}\nroutes:\n  - name: anthropic\n    match: {{ path_prefix: /v1/messages }}\n    upstream: llm\n    usage:\n      format: anthropic\n      reserve: {{ prompt: body_bytes, completion: max_tokens, completion_cap: 500 }}\n    limits:\n{tpm}  - name: chat\n    match: {{ path_prefix: /v1/ }}\n    upstream: llm\n{}{extra}    limits:\n{tpm}",
        store_yaml(redis),
        upstream.url(),
        openai("body_bytes"),
    );
    let gateways = gateways_sharing(&yaml, redis).await;
    let admin = serve_admin(&gateways[0], None).await;
    (gateways, admin)
}

/// POSTs `text` as it is (JSON) to `path`, the upstream to report `input` and `output`; the status, and what the
/// answer says is left of the tightest token limit once this request's reservation was taken.
async fn post_text(
    gateway: &TestGateway,
    path: &str,
    text: &str,
    input: u64,
    output: u64,
) -> (u16, u64) {
    let response = common::http_client::client()
        .post(gateway.url(path))
        .header("content-type", "application/json")
        .header("x-test-input", input.to_string())
        .header("x-test-output", output.to_string())
        .body(text.to_owned())
        .send()
        .await
        .expect("gateway answers");
    let status = response.status().as_u16();
    let left = response.headers()["x-ratelimit-remaining-tokens"]
        .to_str()
        .expect("text")
        .parse()
        .expect("a number");
    response.text().await.expect("a body");
    (status, left)
}

/// The path and body of the last request the upstream received.
fn last_received(upstream: &LlmUpstream) -> (String, String) {
    let received = upstream.received();
    let (path, _, body) = received.requests.last().expect("a request");
    (
        path.clone(),
        String::from_utf8(body.to_vec()).expect("UTF-8"),
    )
}

/// Only the endpoints that take a completion bound are rewritten and reserve a completion: on a `/v1/` route,
/// embeddings and moderations (OpenAI), a token count and a batch (Anthropic) arrive byte for byte and reserve
/// their bytes alone, while chat completions and messages are still capped and reserve their cap.
async fn only_endpoints_with_a_bound_are_rewritten_and_reserve_it(redis: Option<&RedisServer>) {
    let upstream = LlmUpstream::start().await;
    let (gateways, admin) = two_providers(redis, &upstream, "").await;
    let last = gateways.last().expect("a gateway");
    let mut left = 100_000;

    // Embeddings: as sent (no max_output_tokens written in), reserving the body's bytes, settled at what it reported.
    let embeddings =
        r#"{ "input" : ["hello",  "world"], "model":"text-embedding-3-small", "dimensions": 2 }"#;
    let (status, reserved_left) = post_text(&gateways[0], "/v1/embeddings", embeddings, 3, 0).await;
    assert_eq!(status, 200);
    assert_eq!(
        last_received(&upstream),
        ("/v1/embeddings".to_owned(), embeddings.to_owned())
    );
    assert_eq!(reserved_left, left - embeddings.len() as u64);
    left -= 3;
    settles_to(&admin, "chat/tpm", left).await;

    // Moderations report no usage: settled at the reservation, the body's bytes and nothing more.
    let moderations = r#"{"input": "a sentence to judge", "model": "omni-moderation-latest"}"#;
    let (status, _) = post_text(last, "/v1/moderations", moderations, 3, 0).await;
    assert_eq!(status, 200);
    assert_eq!(last_received(&upstream).1, moderations);
    left -= moderations.len() as u64;
    settles_to(&admin, "chat/tpm", left).await;

    // Chat completions on the same route: capped at 200 and reserving it.
    let (status, reserved_left) =
        post_text(last, "/v1/chat/completions", &chat(5000).to_string(), 7, 3).await;
    assert_eq!(status, 200);
    let (path, forwarded) = last_received(&upstream);
    assert_eq!(path, "/v1/chat/completions");
    assert!(forwarded.contains(r#""max_tokens":200"#), "{forwarded}");
    assert_eq!(reserved_left, left - forwarded.len() as u64 - 200);
    left -= 10;
    settles_to(&admin, "chat/tpm", left).await;

    // Anthropic's token count and batches: as sent, their bytes alone (neither reports usage: settled at that).
    let mut anthropic_left = 100_000;
    let count =
        r#"{"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "Hello"}]}"#;
    let batch = r#"{"requests": [{"custom_id": "a", "params": {"model": "claude-sonnet-4-5", "max_tokens": 5000, "messages": []}}]}"#;
    for (path, text) in [
        ("/v1/messages/count_tokens", count),
        ("/v1/messages/batches", batch),
    ] {
        let (status, reserved_left) = post_text(&gateways[0], path, text, 9, 0).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(last_received(&upstream), (path.to_owned(), text.to_owned()));
        assert_eq!(reserved_left, anthropic_left - text.len() as u64, "{path}");
        anthropic_left -= text.len() as u64;
        settles_to(&admin, "anthropic/tpm", anthropic_left).await;
    }
    // Messages: capped at 500, and reserving it.
    let message = json!({"model": "claude-sonnet-4-5", "max_tokens": 5000, "messages": [{"role": "user", "content": "Hello"}]});
    let (status, reserved_left) =
        post_text(last, "/v1/messages", &message.to_string(), 20, 30).await;
    assert_eq!(status, 200);
    let (_, forwarded) = last_received(&upstream);
    assert!(forwarded.contains(r#""max_tokens":500"#), "{forwarded}");
    assert_eq!(reserved_left, anthropic_left - forwarded.len() as u64 - 500);
    settles_to(&admin, "anthropic/tpm", anthropic_left - 50).await;
}

crate::each_store!(
    only_endpoints_with_a_bound_are_rewritten_and_reserve_it,
    only_endpoints_with_a_bound_are_rewritten_and_reserve_it
);

/// `usage.endpoints` replaces the defaults: with `[/embeddings]`, chat completions pass as sent (uncapped) and
/// reserve their bytes alone, and embeddings are bounded.
#[tokio::test]
async fn usage_endpoints_says_which_endpoints_take_a_bound() {
    let upstream = LlmUpstream::start().await;
    let (gateways, admin) =
        two_providers(None, &upstream, "      endpoints: [/embeddings]\n").await;
    let text = chat(5000).to_string();
    let (status, reserved_left) =
        post_text(&gateways[0], "/v1/chat/completions", &text, 7, 3).await;
    assert_eq!(status, 200);
    assert_eq!(last_received(&upstream).1, text);
    assert_eq!(reserved_left, 100_000 - text.len() as u64);
    settles_to(&admin, "chat/tpm", 100_000 - 10).await;

    let embeddings = r#"{"input": "hello", "model": "text-embedding-3-small"}"#;
    let (status, reserved_left) = post_text(&gateways[0], "/v1/embeddings", embeddings, 3, 0).await;
    assert_eq!(status, 200);
    let forwarded = last_received(&upstream).1;
    assert!(
        forwarded.contains(r#""max_output_tokens":100"#),
        "{forwarded}"
    );
    assert_eq!(reserved_left, 100_000 - 10 - forwarded.len() as u64 - 100);
}

/// A gateway whose three token routes (Anthropic on `/v1/messages`, OpenAI on `/v1/`, a `header:x-tokens` route on
/// `/h/`) need an API key (`k1`, consumer acme) and allow one request per consumer in a window of 20000 days.
async fn refusing(redis: Option<&RedisServer>, upstream: &LlmUpstream) -> TestGateway {
    let route = |name: &str, prefix: &str, usage: &str| {
        format!("  - name: {name}\n    match: {{ path_prefix: {prefix} }}\n    upstream: llm\n    consumers: required\n    usage: {usage}\n    limits:\n      - {{ name: hourly, key: consumer, algorithm: fixed_window, limit: 1, period: 20000d }}\n")
    };
    let yaml = format!(
        "store:\n{}consumers:\n  identify: [ {{ api_key: {{ header: x-api-key }} }} ]\n  keys: [ {{ key: k1, consumer: acme }} ]\nupstreams:\n  llm: {{ targets: [\"{}\"] }}\nroutes:\n{}{}{}",
        store_yaml(redis),
        upstream.url(),
        route("anthropic", "/v1/messages", "{ format: anthropic, reserve: { completion_cap: 500 }, max_request_bytes: 2000 }"),
        route("openai", "/v1/", "{ format: openai, reserve: { completion_default: 100 }, max_request_bytes: 2000 }"),
        route("header", "/h/", "{ format: \"header:x-tokens\", reserve: { completion: 10 } }"),
    );
    start_gateway(&yaml).await
}

/// POSTs `body` to `path`, with the API key `k1` when `key`; the status, the fields and the JSON body.
async fn refused(
    gateway: &TestGateway,
    path: &str,
    key: bool,
    body: String,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = common::http_client::client()
        .post(gateway.url(path))
        .header("content-type", "application/json")
        .body(body);
    if key {
        request = request.header("x-api-key", "k1");
    }
    let response = request.send().await.expect("gateway answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("a body");
    let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON: {text}"));
    (status, headers, body)
}

/// The gateway's refusals on a token route speak the provider's dialect, so that its SDK shows them: OpenAI's
/// `{"error": {message, type, param, code}}` and Anthropic's `{"type": "error", "error": {type, message}}`, with
/// tollgate's facts beside and `retry-after-ms` beside `Retry-After`; a route with a `header:` format keeps
/// tollgate's own body.
async fn refusals_speak_the_providers_dialect(redis: Option<&RedisServer>) {
    let upstream = LlmUpstream::start().await;
    let gateway = refusing(redis, &upstream).await;
    let message = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "Hello"}]}).to_string();
    let large = format!("{{\"model\": \"x\", \"input\": \"{}\"}}", "x".repeat(3000));

    // OpenAI: a rate limit.
    let (status, _, _) =
        refused(&gateway, "/v1/chat/completions", true, chat(10).to_string()).await;
    assert_eq!(status, 200);
    let (status, headers, body) =
        refused(&gateway, "/v1/chat/completions", true, chat(10).to_string()).await;
    assert_eq!(status, 429);
    assert_eq!(headers["content-type"], "application/json");
    let error = &body["error"];
    let retry_after_ms = error["retry_after_ms"].as_u64().expect("retry_after_ms");
    let text = error["message"].as_str().expect("a message");
    assert!(text.contains("hourly") && text.contains("openai"), "{text}");
    assert_eq!(
        body,
        json!({"error": {"message": text, "type": "rate_limit_exceeded", "param": null, "code": "rate_limit_exceeded",
            "route": "openai", "limit": "hourly", "retry_after_ms": retry_after_ms}})
    );
    assert_eq!(headers["retry-after-ms"], retry_after_ms.to_string());
    assert_eq!(
        headers["retry-after"],
        retry_after_ms.div_ceil(1000).to_string()
    );
    // A missing key, a body past max_request_bytes, a body that is not JSON.
    for (path, key, text, status, code) in [
        (
            "/v1/chat/completions",
            false,
            chat(10).to_string(),
            401,
            "unauthorized",
        ),
        ("/v1/embeddings", true, large.clone(), 413, "body_too_large"),
        (
            "/v1/chat/completions",
            true,
            "{not json".to_owned(),
            400,
            "bad_request",
        ),
    ] {
        let (got, _, body) = refused(&gateway, path, key, text).await;
        assert_eq!(
            (got, &body["error"]["type"], &body["error"]["code"]),
            (status, &json!("invalid_request_error"), &json!(code)),
            "{body}"
        );
        assert_eq!(body["error"]["param"], Value::Null, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }

    // Anthropic: a rate limit.
    let (status, _, _) = refused(&gateway, "/v1/messages", true, message.clone()).await;
    assert_eq!(status, 200);
    let (status, headers, body) = refused(&gateway, "/v1/messages", true, message.clone()).await;
    assert_eq!(status, 429);
    let error = &body["error"];
    let retry_after_ms = error["retry_after_ms"].as_u64().expect("retry_after_ms");
    let text = error["message"].as_str().expect("a message");
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": text, "code": "rate_limited",
            "route": "anthropic", "limit": "hourly", "retry_after_ms": retry_after_ms}})
    );
    assert_eq!(headers["retry-after-ms"], retry_after_ms.to_string());
    for (key, text, status, kind) in [
        (false, message.clone(), 401, "authentication_error"),
        (true, large, 413, "request_too_large"),
        (true, "{not json".to_owned(), 400, "invalid_request_error"),
    ] {
        let (got, _, body) = refused(&gateway, "/v1/messages", key, text).await;
        assert_eq!(
            (got, &body["type"], &body["error"]["type"]),
            (status, &json!("error"), &json!(kind)),
            "{body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }

    // A route whose format names no provider: tollgate's own body, as on any route.
    let (status, _, _) = refused(&gateway, "/h/x", true, "{}".to_owned()).await;
    assert_eq!(status, 404, "the upstream's");
    let (status, headers, body) = refused(&gateway, "/h/x", true, "{}".to_owned()).await;
    assert_eq!(status, 429);
    let retry_after_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert_eq!(
        body,
        json!({"error": "rate_limited", "route": "header", "limit": "hourly", "retry_after_ms": retry_after_ms})
    );
    assert!(headers.get("retry-after-ms").is_none());

    // A blocked consumer: 403, OpenAI's invalid_request_error, Anthropic's permission_error.
    let admin = serve_admin(&gateway, None).await;
    let blocked = common::http_client::client()
        .put(format!("{admin}/consumers/acme"))
        .header("content-type", "application/json")
        .body(r#"{"blocked":true}"#)
        .send()
        .await
        .expect("admin answers");
    assert_eq!(blocked.status(), 200);
    let mut last = Value::Null;
    let refused_403 = eventually(Duration::from_secs(5), async || {
        let (status, _, body) = refused(&gateway, "/v1/messages", true, message.clone()).await;
        last = body;
        status == 403
    })
    .await;
    assert!(refused_403.is_some(), "not blocked: {last}");
    assert_eq!(last["error"]["type"], "permission_error", "{last}");
    let (status, _, body) =
        refused(&gateway, "/v1/chat/completions", true, chat(10).to_string()).await;
    assert_eq!(status, 403);
    assert_eq!(
        (
            &body["error"]["type"],
            &body["error"]["code"],
            &body["error"]["reason"]
        ),
        (
            &json!("invalid_request_error"),
            &json!("forbidden"),
            &json!("consumer_blocked")
        ),
        "{body}"
    );
}

crate::each_store!(
    refusals_speak_the_providers_dialect,
    refusals_speak_the_providers_dialect
);
