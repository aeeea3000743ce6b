//! The validation's promises, through `crate::config`'s parsing: every problem reported at once, located.

use std::path::Path;
use std::time::Duration;

use crate::config::{parse_with_env, BackendKind, Config, ConfigError};

fn parse(text: &str) -> Result<Config, ConfigError> {
    parse_with_env(text, Path::new("t.yaml"), |_| None)
}

/// `path: message` of every problem, in file order.
fn problems(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("expected problems in:\n{text}"),
        Err(err) => err
            .problems()
            .iter()
            .map(|p| format!("{}: {}", p.path(), p.message()))
            .collect(),
    }
}

/// A valid route around one limit written by the test.
fn with_limit(limit: &str) -> String {
    format!(
        "routes:\n  - name: r\n    respond: {{ status: 204 }}\n    limits:\n      - name: l\n{}",
        limit
            .lines()
            .map(|line| format!("        {line}\n"))
            .collect::<String>()
    )
}

#[test]
fn an_empty_file_is_all_defaults() {
    let config = parse("").unwrap();
    assert_eq!(config.listen, Some("0.0.0.0:8080".parse().unwrap()));
    assert_eq!(config.admin.listen, "127.0.0.1:9901".parse().unwrap());
    assert_eq!(config.store.backend, BackendKind::Memory);
    assert_eq!(config.store.url, "redis://127.0.0.1:6379");
    assert_eq!(config.store.timeout, Duration::from_millis(25));
    assert_eq!(config.server.max_header_bytes, 65_536);
    assert_eq!(config.server.shutdown_grace, Duration::from_secs(30));
    assert!(config.routes.is_empty());
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = r#"listen: localhost:8080
client_ip:
  trusted_proxies: [10.0.0.0/8, 192.168.1.300, "::1"]
upstreams:
  api:
    targets: ["ftp://api.internal:21", "http://ok:80"]
  empty: {}
  secure:
    targets: ["https://api.internal"]
    tls: { ca_file: missing-ca.pem, cert_file: client.pem }
routes:
  - name: api
    match: { path: api, methods: [get, FETCH] }
    upstream: nowhere
    deny_status: 200
  - name: api
    upstream: api
    respond: { status: 200 }
  - name: "bad name"
    respond: { status: 700, headers: { "x bad": v } }
    limits:
      - name: a
        key: [ip, cookie:session]
        algorithm: sliding_window
        limit: 10
        rate: 10/s
      - name: a
        algorithm: token_bucket
        rate: 10/0s
        burst: 0
"#;
    assert_eq!(
        problems(text),
        [
            r#"listen: invalid address "localhost:8080" (use IP:PORT, e.g. 0.0.0.0:8080)"#,
            r#"client_ip.trusted_proxies[1]: invalid CIDR "192.168.1.300" (use a network like 10.0.0.0/8 or an address like 10.0.0.1)"#,
            r#"upstreams.api.targets[0]: invalid upstream URL "ftp://api.internal:21" (use http://host:port[/path] or https://...)"#,
            r#"upstreams.empty.targets: needs at least one target (e.g. targets: ["http://127.0.0.1:3000"])"#,
            r#"upstreams.secure.tls.ca_file: cannot read missing-ca.pem: No such file or directory (os error 2)"#,
            r#"routes[0].match.path: must start with "/" (got "api")"#,
            r#"routes[0].match.methods[1]: unknown HTTP method "FETCH" (use GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, CONNECT, TRACE)"#,
            r#"routes[0].upstream: unknown upstream "nowhere" (defined: api, empty, secure)"#,
            r#"routes[0].deny_status: must be a 4xx or 5xx status (got 200)"#,
            r#"routes[1].name: duplicate route name "api" (first used at routes[0])"#,
            r#"routes[1]: has both upstream and respond (a route either forwards or answers: keep one)"#,
            r#"routes[2].name: route name "bad name" may only contain letters, digits, '_', '.' and '-' (it becomes part of Redis keys)"#,
            r#"routes[2].respond.status: invalid status 700 (use 100 to 599)"#,
            r#"routes[2].respond.headers.x bad: invalid header name "x bad""#,
            // A missing field is placed on its limit, which starts before the key.
            r#"routes[2].limits[0].period: required by sliding_window (it takes limit and period)"#,
            r#"routes[2].limits[0].key[1]: unknown key part "cookie:session" (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan, client_cert)"#,
            r#"routes[2].limits[0].rate: rate is not used by sliding_window (it takes limit and period)"#,
            r#"routes[2].limits[1].name: duplicate limit name "a" (first used at routes[2].limits[0])"#,
            r#"routes[2].limits[1].rate: invalid rate "10/0s": rate period must be greater than 0"#,
            r#"routes[2].limits[1].burst: must be greater than 0"#,
        ]
    );
}

#[test]
fn problems_are_printed_with_file_line_and_column() {
    let text = "store:\n  timeout: 0s\nroutes:\n  - name: r\n    respond: {}\n    limits:\n      - name: l\n        algorithm: sliding_log\n        limit: 5\n        period: 1.5s\n";
    assert_eq!(
            parse(text).unwrap_err().to_string(),
            concat!(
                "t.yaml:2:3: store.timeout: must be greater than 0 (got \"0s\")\n",
                "t.yaml:10:9: routes[0].limits[0].period: invalid duration \"1.5s\" (use 250ms, 1s, 1m, 1h, 1d)",
            )
        );
}

#[test]
fn a_per_limit_key_share_larger_than_the_store_is_a_located_error() {
    let text = "store:\n  backend: memory\n  max_keys: 1000\n  max_keys_per_limit: 1001\nroutes:\n  - name: r\n    respond: {}\n";
    assert_eq!(
            parse(text).unwrap_err().to_string(),
            "t.yaml:4:3: store.max_keys_per_limit: must be at most store.max_keys (1000), got 1001: it is one \
             limit's share of the store (equal to max_keys lets one limit fill it)"
        );
    // Equal is the whole store; the default is a quarter of whatever max_keys is.
    let equal = text.replace("1001", "1000");
    assert_eq!(parse(&equal).unwrap().store.max_keys_per_limit, 1000);
    let default =
        "store:\n  backend: memory\n  max_keys: 10\nroutes:\n  - name: r\n    respond: {}\n";
    assert_eq!(parse(default).unwrap().store.max_keys_per_limit, 3);
}

#[test]
fn zero_periods_and_costs_are_refused() {
    assert_eq!(
        problems(&with_limit(
            "algorithm: sliding_window\nlimit: 0\nperiod: 0s\ncost: 0"
        )),
        [
            "routes[0].limits[0].limit: must be greater than 0",
            r#"routes[0].limits[0].period: must be greater than 0 (got "0s")"#,
            "routes[0].limits[0].cost: must be greater than 0",
        ]
    );
}

#[test]
fn limit_construction_errors_are_reported_on_the_limit() {
    assert_eq!(
            problems(&with_limit(
                "algorithm: token_bucket\nrate: 1/s\nburst: 2\ncost: 3"
            )),
            ["routes[0].limits[0]: cost 3 is larger than the capacity 2: no request could ever be admitted"]
        );
}

#[test]
fn unknown_algorithms_and_bad_leaky_modes_are_named() {
    assert_eq!(
            problems(&with_limit(
                "algorithm: leaky_bucket\nrate: 1/s\nburst: 2\nmode: delay"
            )),
            [
                "routes[0].limits[0].max_delay: required by mode: delay (the longest a request may be held)"
            ]
        );
    assert_eq!(
        problems(&with_limit(
            "algorithm: leaky_bucket\nrate: 1/s\nburst: 2\nmode: queue"
        )),
        [r#"routes[0].limits[0].mode: invalid mode "queue" (use reject or delay)"#]
    );
    for mode in ["", "mode: reject\n"] {
        assert_eq!(
                problems(&with_limit(&format!(
                    "algorithm: leaky_bucket\nrate: 1/s\nburst: 2\n{mode}max_delay: 2s"
                ))),
                ["routes[0].limits[0].max_delay: only used with mode: delay (add mode: delay to hold requests up to it, or remove it)"],
                "{mode}"
            );
    }
    assert_eq!(
        problems(&with_limit("algorithm: sliding\nlimit: 1\nperiod: 1s")),
        [
            r#"routes[0].limits[0].algorithm: unknown algorithm "sliding" (use sliding_window, sliding_log, token_bucket, fixed_window, gcra, leaky_bucket, concurrency)"#
        ]
    );
    assert_eq!(
            problems(&with_limit("limit: 1\nperiod: 1s")),
            ["routes[0].limits[0].algorithm: a limit needs an algorithm (use sliding_window, sliding_log, token_bucket, fixed_window, gcra, leaky_bucket, concurrency)"]
        );
    assert_eq!(
            problems(&with_limit("algorithm: token_bucket\nrate: 1/s\nburst: 2\nmax_delay: 1s")),
            ["routes[0].limits[0].max_delay: max_delay is not used by token_bucket (it takes rate and burst)"]
        );
}

#[test]
fn concurrency_limits_take_max_a_lease_and_a_queue() {
    let queued = parse(&with_limit(
        "algorithm: concurrency\nmax: 4\nqueue: { max_wait: 10s }",
    ))
    .unwrap();
    assert_eq!(
        *queued.routes[0].limits[0].limit.algorithm(),
        crate::limiter::Algorithm::Concurrency {
            max: 4,
            lease_ms: 30_000,
            queue: Some(crate::limiter::SlotQueue {
                max_wait_ms: 10_000,
                max_waiting: 1_000
            })
        }
    );
    let config = parse(&with_limit("algorithm: concurrency\nmax: 2\nlease: 5s")).unwrap();
    assert_eq!(
        *config.routes[0].limits[0].limit.algorithm(),
        crate::limiter::Algorithm::Concurrency {
            max: 2,
            lease_ms: 5_000,
            queue: None
        }
    );
    assert_eq!(
        problems(&with_limit("algorithm: concurrency\nlease: 10s")),
        ["routes[0].limits[0].max: required by concurrency (it takes max, lease and queue)"]
    );
    assert_eq!(
        problems(&with_limit("algorithm: concurrency\nmax: 0\nlimit: 3")),
        [
            "routes[0].limits[0].max: must be greater than 0",
            "routes[0].limits[0].limit: limit is not used by concurrency (it takes max, lease and queue)",
        ]
    );
    assert_eq!(
        problems(&with_limit("algorithm: concurrency\nmax: 2\nlease: 100ms")),
        ["routes[0].limits[0]: lease 100ms is too short: it is renewed every third of it, and must be at least 300ms"]
    );
    assert_eq!(
        problems(&with_limit(
            "algorithm: concurrency\nmax: 2\nqueue: { max_waiting: 0 }"
        )),
        ["routes[0].limits[0].queue.max_wait: required by queue (the longest a request waits for a slot)"]
    );
    assert_eq!(
        problems(&with_limit(
            "algorithm: concurrency\nmax: 2\nqueue: { max_wait: 1s, max_waiting: 0 }"
        )),
        ["routes[0].limits[0].queue.max_waiting: must be greater than 0 (remove queue to refuse at once)"]
    );
    assert_eq!(
        problems(&with_limit(
            "algorithm: gcra\nrate: 1/s\nburst: 2\nqueue: { max_wait: 1s }"
        )),
        ["routes[0].limits[0].queue: queue is not used by gcra (it takes rate and burst)"]
    );
    assert_eq!(
        problems(&with_limit(
            "algorithm: concurrency\nmax: 2\ncounts: { status: [401] }"
        )),
        ["routes[0].limits[0].counts: a concurrency limit counts requests in flight: remove counts"]
    );
}

#[test]
fn key_lists_and_missing_policy() {
    let config = parse(&with_limit(
            "key: [route, \"query:tenant\"]\nmissing: skip\nalgorithm: sliding_log\nlimit: 3\nperiod: 1s",
        ))
        .unwrap();
    let key = &config.routes[0].limits[0].key;
    assert_eq!(key.to_string(), "route+query:tenant");
    assert_eq!(key.missing(), crate::key::MissingKey::Skip);
    assert_eq!(
            problems(&with_limit("key: []\nalgorithm: sliding_log\nlimit: 3\nperiod: 1s")),
            ["routes[0].limits[0].key: needs at least one part (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan, client_cert)"]
        );
}

#[test]
fn admin_token_is_required_off_loopback() {
    assert_eq!(
        parse("admin:\n  listen: 0.0.0.0:9901\n")
            .unwrap_err()
            .to_string(),
        "t.yaml:1:1: admin.token: required when admin.listen is not a loopback address"
    );
    assert_eq!(
        problems("admin:\n  listen: 0.0.0.0:9901\n  token: \"\"\n"),
        ["admin.token: required when admin.listen is not a loopback address"]
    );
    let open = parse("admin:\n  listen: 0.0.0.0:9901\n  token: s3cret\n").unwrap();
    assert_eq!(open.admin.token.as_deref(), Some("s3cret"));
    let local = parse("admin:\n  listen: \"[::1]:9901\"\n  token: \"\"\n").unwrap();
    assert_eq!(local.admin.token, None);
}

#[test]
fn admin_token_with_surrounding_whitespace_is_a_located_error() {
    for token in [
        "\" s3cret\"",
        "\"s3cret \"",
        "\"s3cret\\n\"",
        "\"\\ts3cret\"",
    ] {
        assert_eq!(
                parse(&format!("admin:\n  listen: 127.0.0.1:9901\n  token: {token}\n"))
                    .unwrap_err()
                    .to_string(),
                "t.yaml:3:3: admin.token: has leading or trailing whitespace, which no client can send: remove it",
                "{token}"
            );
    }
    let inner = parse("admin:\n  listen: 127.0.0.1:9901\n  token: \"s3 cret\"\n").unwrap();
    assert_eq!(inner.admin.token.as_deref(), Some("s3 cret"));
}

#[test]
fn redis_url_is_checked_only_for_the_redis_backend() {
    assert_eq!(
        problems("store:\n  backend: redis\n  url: http://cache:6379\n"),
        [
            r#"store.url: invalid Redis URL "http://cache:6379" (use redis://, redis-cluster:// or redis-sentinel://, or rediss… for TLS)"#
        ]
    );
    for url in [
        "redis://127.0.0.1:6379",
        "rediss://cache:6380/1",
        "redis-cluster://a:7000?node=b:7001",
        "redis-sentinel://s:26379/0?sentinelServiceName=main",
    ] {
        let text = format!("store:\n  backend: redis\n  url: \"{url}\"\n");
        assert!(parse(&text).is_ok(), "{url}: {:?}", parse(&text).err());
    }
    assert!(parse("store:\n  backend: memory\n  url: nonsense\n").is_ok());
}

#[test]
fn when_full_defaults_to_deny_and_names_a_wrong_value() {
    use crate::limiter::store::WhenFull;
    assert_eq!(parse("").unwrap().store.when_full, WhenFull::Deny);
    let allow = parse("store:\n  when_full: allow\n").unwrap();
    assert_eq!(allow.store.when_full, WhenFull::Allow);
    let error = parse("store:\n  when_full: maybe\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("t.yaml:2:") && error.contains("when_full"),
        "{error}"
    );
}

#[test]
fn trusted_proxies_take_networks_and_plain_addresses() {
    let config =
        parse("client_ip:\n  trusted_proxies: [10.1.2.3/8, 192.0.2.7, \"2001:db8::1\"]\n").unwrap();
    let nets: Vec<String> = config
        .client_ip
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(nets, ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::1/128"]);
}

#[test]
fn route_details_are_normalised() {
    let text = "upstreams:\n  b: { targets: [\"http://10.0.0.2:8080/base\"], timeout: 2s, connect_timeout: 250ms }\n  a: { targets: [\"http://10.0.0.1\"] }\nroutes:\n  - name: r.1\n    match: { host: \"*.Example.COM\", methods: [get, Post, GET] }\n    upstream: a\n    headers: false\n    deny_status: 503\n  - name: r_2\n    respond: { status: 404, body: gone, headers: { content-type: text/plain, x-b: \"1\" } }\n";
    let config = parse(text).unwrap();
    let upstreams: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(upstreams, ["b", "a"]);
    assert_eq!(
        config.upstreams[0].connect_timeout,
        Duration::from_millis(250)
    );
    assert_eq!(config.upstreams[0].targets[0].path(), "/base");
    let route = &config.routes[0];
    assert_eq!(route.matcher.host.as_deref(), Some("*.example.com"));
    assert_eq!(
        route.matcher.methods,
        [http::Method::GET, http::Method::POST]
    );
    assert!(!route.headers);
    assert_eq!(route.deny_status, http::StatusCode::SERVICE_UNAVAILABLE);
    let crate::config::RouteAction::Respond(response) = &config.routes[1].action else {
        panic!("r_2 answers directly");
    };
    let headers: Vec<(&str, &str)> = response
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
        .collect();
    assert_eq!(headers, [("content-type", "text/plain"), ("x-b", "1")]);
}

#[test]
fn durations_written_as_numbers_get_the_duration_message() {
    assert_eq!(
        problems("server:\n  header_read_timeout: 30\n  shutdown_grace: 0s\n"),
        [r#"server.header_read_timeout: invalid duration "30" (use 250ms, 1s, 1m, 1h, 1d)"#]
    );
}

/// A route to an upstream with `usage` and `limits` written by the test (each indented as a route's field).
fn llm_route(usage: &str, limits: &str) -> String {
    format!(
        "upstreams:\n  llm: {{ targets: [\"http://127.0.0.1:9\"] }}\nroutes:\n  - name: chat\n    upstream: llm\n{usage}    limits:\n{limits}"
    )
}

#[cfg(feature = "llm")]
#[test]
fn a_token_route_reads_its_usage_and_its_limits_counts() {
    let text = llm_route(
        "    usage:\n      format: anthropic\n      reserve: { prompt: 500, completion: max_tokens, completion_cap: 2048 }\n",
        "      - { name: tpm, algorithm: sliding_window, limit: 100000, period: 1m, counts: total_tokens }\n      - { name: out, algorithm: fixed_window, limit: 9000, period: 1d, counts: output_tokens }\n",
    );
    let config = parse(&text).expect("valid");
    let route = &config.routes[0];
    let usage = route.usage.as_ref().expect("usage");
    assert_eq!(usage.format, crate::usage::UsageFormat::Anthropic);
    assert_eq!(usage.prompt, crate::usage::PromptBound::Tokens(500));
    assert_eq!(usage.completion_cap, Some(2048));
    assert_eq!(usage.max_request_bytes, 1 << 20);
    assert!(!usage.inject_stream_usage);
    let kinds: Vec<_> = route.limits.iter().map(|l| l.counts.tokens()).collect();
    use crate::key::TokenKind;
    assert_eq!(kinds, [Some(TokenKind::Total), Some(TokenKind::Output)]);
}

#[cfg(feature = "llm")]
#[test]
fn usage_endpoints_replace_the_formats_and_bad_ones_are_located() {
    use crate::usage::{Endpoints, UsageFormat};
    let tpm = "      - { name: tpm, algorithm: sliding_window, limit: 100000, period: 1m, counts: total_tokens }\n";
    let endpoints = |usage: &str| {
        let config = parse(&llm_route(usage, tpm)).expect("valid");
        config.routes[0]
            .usage
            .as_ref()
            .expect("usage")
            .endpoints
            .clone()
    };
    assert_eq!(
        endpoints("    usage: { format: openai, reserve: { completion_cap: 10 } }\n"),
        Endpoints::of(&UsageFormat::OpenAi)
    );
    assert_eq!(
        endpoints("    usage: { format: anthropic, reserve: { completion_cap: 10 } }\n").as_slice(),
        ["/messages"]
    );
    assert_eq!(
        endpoints("    usage: { format: \"header:x-tokens\", reserve: { completion: 10 } }\n"),
        Endpoints::every()
    );
    assert_eq!(
        endpoints("    usage: { format: openai, reserve: { completion_cap: 10 }, endpoints: [/generate, /] }\n")
            .as_slice(),
        ["/generate", "/"]
    );
    assert!(endpoints(
        "    usage: { format: openai, reserve: { completion_cap: 10 }, endpoints: [] }\n"
    )
    .as_slice()
    .is_empty());
    let text = llm_route(
        "    usage:\n      format: openai\n      reserve: { completion_cap: 10 }\n      endpoints:\n        - chat/completions\n        - /v1/chat/completions/\n        - /v1//x\n        - /x?y\n        - /messages\n",
        tpm,
    );
    assert_eq!(
        parse(&text).unwrap_err().to_string(),
        concat!(
            "t.yaml:10:11: routes[0].usage.endpoints[0]: \"chat/completions\" must start with / (a path suffix of whole segments, like /chat/completions)\n",
            "t.yaml:11:11: routes[0].usage.endpoints[1]: \"/v1/chat/completions/\" must not end with / (a trailing / is ignored in request paths)\n",
            "t.yaml:12:11: routes[0].usage.endpoints[2]: \"/v1//x\" must not have an empty, . or .. segment: request paths are normalised and have none\n",
            "t.yaml:13:11: routes[0].usage.endpoints[3]: \"/x?y\" must be a plain path: no query, fragment, parameters, escapes, spaces or non-ASCII",
        )
    );
}

#[cfg(feature = "llm")]
#[test]
fn bad_usage_values_and_token_counts_without_usage_are_located() {
    let text = llm_route(
        "    usage:\n      format: gemini\n      reserve: { prompt: lots, completion: max_tokens, completion_default: 5000, completion_cap: 4096 }\n      stream_usage: always\n      max_request_bytes: 0\n",
        "      - { name: tpm, algorithm: sliding_window, limit: 100000, period: 1m, counts: tokens }\n",
    );
    assert_eq!(
        problems(&text),
        [
            "routes[0].usage.format: `gemini` is not a usage format: openai, anthropic or header:<name>",
            "routes[0].usage.reserve.prompt: \"lots\" is neither body_bytes nor a number of tokens",
            "routes[0].usage.reserve.completion_default: 5000 is above completion_cap 4096",
            "routes[0].usage.stream_usage: unknown value \"always\" (use inject or off)",
            "routes[0].usage.max_request_bytes: must be greater than 0",
            "routes[0].limits[0].counts: unknown count \"tokens\" (use requests, input_tokens, output_tokens, total_tokens, or { status: [401, 403] })",
        ]
    );
    let text = llm_route(
        "",
        "      - { name: tpm, algorithm: sliding_window, limit: 100000, period: 1m, counts: input_tokens }\n",
    );
    let error = parse(&text).unwrap_err().to_string();
    assert_eq!(
        error,
        "t.yaml:7:76: routes[0].limits[0].counts: input_tokens needs the route's usage: block (how its answers report tokens: format openai, anthropic or header:<name>)"
    );
    let text = llm_route(
        "    usage: { format: \"header:x-tokens\", reserve: { completion: 100 }, stream_usage: inject }\n",
        "      - { name: tpm, algorithm: sliding_window, limit: 100000, period: 1m, counts: output_tokens }\n",
    );
    assert_eq!(
        problems(&text),
        [
            "routes[0].usage.stream_usage: inject asks OpenAI streams for their usage: it needs format: openai",
            "routes[0].limits[0].counts: format header:x-tokens reports one number, counted as total_tokens: use counts: total_tokens",
        ]
    );
    let text = llm_route(
        "    usage: { format: openai }\n",
        "      - { name: tpm, algorithm: sliding_window, limit: 100000, period: 1m, counts: total_tokens }\n",
    );
    assert_eq!(
        problems(&text),
        ["routes[0].usage.reserve: needs completion_default or completion_cap: a request that names no max_tokens must still have a bound"]
    );
}

/// A build without the `llm` feature refuses a route's `usage:` and its limits that count tokens, each at its line,
/// as it refuses `jwt:` without `jwt`: never a route served without its token limits.
#[cfg(not(feature = "llm"))]
#[test]
fn a_build_without_llm_refuses_token_budgets_at_their_lines() {
    let text = llm_route(
        "    usage:\n      format: openai\n      reserve: { completion_cap: 10 }\n",
        "      - { name: rpm, algorithm: gcra, rate: 60/1m, burst: 10 }\n      - { name: tpm, algorithm: sliding_window, limit: 100000, period: 1m, counts: total_tokens }\n",
    );
    assert_eq!(
        parse(&text).unwrap_err().to_string(),
        concat!(
            "t.yaml:6:5: routes[0].usage: this build of tollgate has no LLM token budgets (its `llm` feature is off)\n",
            "t.yaml:11:76: routes[0].limits[1].counts: total_tokens: this build of tollgate has no LLM token budgets (its `llm` feature is off)",
        )
    );
}

/// A build without the `calendar` feature (no time zone database) refuses a calendar window at its line, rather than
/// counting it as some other window.
#[cfg(not(feature = "calendar"))]
#[test]
fn a_build_without_calendar_refuses_calendar_windows_at_their_line() {
    let text = "routes:\n  - name: r\n    respond: {}\n    limits:\n      - name: monthly\n        algorithm: fixed_window\n        limit: 5\n        calendar: month\n";
    assert_eq!(
        parse(text).unwrap_err().to_string(),
        "t.yaml:8:9: routes[0].limits[0].calendar: calendar windows need tollgate built with its `calendar` feature (the time zone database)"
    );
}

/// The one problem of an `rls:` block whose only descriptor has `limit` (written inline).
fn rls_limit_problem(limit: &str) -> String {
    let text = format!(
        "rls:\n  listen: 127.0.0.1:0\n  domains:\n    edge:\n      descriptors:\n        - key: remote_address\n          limits: [ {limit} ]\n"
    );
    let mut found = problems(&text);
    assert_eq!(found.len(), 1, "{found:?}");
    found.remove(0)
}

#[test]
fn a_token_count_in_the_rate_limit_service_is_a_located_error() {
    let found = rls_limit_problem(
        "{ name: tpm, algorithm: fixed_window, limit: 100, period: 1h, counts: total_tokens }",
    );
    assert!(
        found.ends_with(".counts: total_tokens counts what answers report, and the rate limit service never sees an answer: count requests"),
        "{found}"
    );
}

#[test]
fn a_delay_or_a_concurrency_limit_in_the_rate_limit_service_is_a_located_error() {
    let found = rls_limit_problem(
        "{ name: smooth, algorithm: leaky_bucket, rate: 1/s, burst: 2, mode: delay, max_delay: 1s }",
    );
    assert!(
        found.ends_with(".mode: the rate limit service answers at once and cannot hold a request: use mode: reject"),
        "{found}"
    );
    let found = rls_limit_problem("{ name: slots, algorithm: concurrency, max: 4 }");
    assert!(
        found.ends_with(".algorithm: the rate limit service never sees a request end, so it could never release a slot: concurrency limits belong on the gateway's routes"),
        "{found}"
    );
}

#[test]
fn a_status_count_in_the_rate_limit_service_is_a_located_error() {
    let found = rls_limit_problem("{ name: failed, algorithm: sliding_log, limit: 5, period: 15m, counts: { status: [401] } }");
    assert!(
        found.ends_with(".counts: a limit that counts answers by status needs to see the answer, and the rate limit service never does: count requests"),
        "{found}"
    );
}

#[test]
fn rls_headers_name_a_known_set_or_are_a_located_error() {
    let rls = |headers: &str| {
        format!(
            "rls:\n  listen: 127.0.0.1:0\n  headers: {headers}\n  domains:\n    edge:\n      descriptors:\n        - {{ key: k, limits: [ {{ name: l, algorithm: fixed_window, limit: 5, period: 1h }} ] }}\n"
        )
    };
    for known in ["ietf", "draft03"] {
        let parsed = parse(&rls(known));
        assert!(
            parsed.is_ok(),
            "{known}: {:?}",
            parsed.err().map(|e| e.to_string())
        );
    }
    let error = parse(&rls("draft3")).unwrap_err().to_string();
    assert!(
        error.starts_with("t.yaml:3:")
            && error.contains("rls.headers")
            && error.contains("draft03"),
        "{error}"
    );
}

#[test]
fn telemetry_otlp_is_checked_and_its_path_defaults_to_v1_traces() {
    let config = parse("telemetry:\n  otlp:\n    endpoint: http://127.0.0.1:4318\n").unwrap();
    let otlp = config.telemetry.otlp.expect("otlp");
    assert_eq!(otlp.endpoint, "http://127.0.0.1:4318/v1/traces");
    assert_eq!(otlp.service_name, "tollgate");
    assert_eq!(otlp.sample_ratio, 1.0);
    let own_path =
        parse("telemetry:\n  otlp:\n    endpoint: http://collector:4318/otlp/traces\n").unwrap();
    assert_eq!(
        own_path.telemetry.otlp.expect("otlp").endpoint,
        "http://collector:4318/otlp/traces"
    );
    assert_eq!(
        problems(
            "telemetry:\n  otlp:\n    endpoint: collector:4318\n    service_name: \" \"\n    sample_ratio: 1.5\n"
        ),
        vec![
            "telemetry.otlp.endpoint: not an OTLP address (http://HOST:PORT or https:// for OTLP/HTTP, grpc://HOST:PORT or grpcs:// for OTLP/gRPC): \"collector:4318\"",
            "telemetry.otlp.service_name: must not be empty",
            "telemetry.otlp.sample_ratio: must be between 0 and 1 (got 1.5)",
        ]
    );
    assert_eq!(
        problems("telemetry:\n  otlp:\n    endpoint: http://collector:4318\n    ca_file: ca.pem\n"),
        vec!["telemetry.otlp.ca_file: trusts a TLS collector's certificate: the endpoint must be https:// or grpcs://"]
    );
    let unreadable = problems("telemetry:\n  otlp:\n    endpoint: https://collector:4318\n    ca_file: /nonexistent/ca.pem\n");
    assert!(
        unreadable[0].starts_with("telemetry.otlp.ca_file: cannot read /nonexistent/ca.pem"),
        "{unreadable:?}"
    );
    let grpc = parse("telemetry:\n  otlp:\n    endpoint: grpc://127.0.0.1:4317\n").unwrap();
    let grpc = grpc.telemetry.otlp.expect("otlp");
    assert_eq!(grpc.endpoint, "http://127.0.0.1:4317/");
    assert_eq!(grpc.protocol, crate::config::OtlpProtocol::Grpc);
    assert!(parse("").unwrap().telemetry.otlp.is_none());
}

#[test]
fn telemetry_otlp_over_tls_trusts_its_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, params.self_signed(&key).unwrap().pem()).unwrap();
    let otlp = |endpoint: &str| {
        let text = format!(
            "telemetry:\n  otlp:\n    endpoint: {endpoint}\n    ca_file: {}\n",
            ca_file.display()
        );
        parse(&text).unwrap().telemetry.otlp.expect("otlp")
    };
    let https = otlp("https://collector:4318");
    assert_eq!(https.endpoint, "https://collector:4318/v1/traces");
    assert_eq!(https.ca_file.as_deref(), Some(ca_file.as_path()));
    let grpcs = otlp("grpcs://collector:4317");
    assert_eq!(grpcs.endpoint, "https://collector:4317/");
    assert_eq!(grpcs.protocol, crate::config::OtlpProtocol::Grpc);
}

#[test]
fn upstream_health_retry_and_idle_timeout_have_nginx_like_defaults() {
    let config =
        parse("upstreams:\n  a: { targets: [\"http://10.0.0.1\", \"http://10.0.0.2\"] }\n")
            .unwrap();
    let upstream = &config.upstreams[0];
    assert_eq!(upstream.health.max_fails, 1);
    assert_eq!(upstream.health.fail_timeout, Duration::from_secs(10));
    assert_eq!(upstream.attempts, None, "one try per target");
    assert_eq!(upstream.idle_timeout, Duration::from_secs(60));
    let text = "upstreams:\n  a:\n    targets: [\"http://10.0.0.1\"]\n    health: { max_fails: 0, fail_timeout: 1s }\n    retry: { attempts: 3 }\n    idle_timeout: 250ms\n";
    let upstream = &parse(text).unwrap().upstreams[0];
    assert_eq!(upstream.health.max_fails, 0);
    assert_eq!(upstream.attempts.map(|n| n.get()), Some(3));
    assert_eq!(upstream.idle_timeout, Duration::from_millis(250));
}

#[test]
fn bad_upstream_health_retry_and_idle_timeout_are_located_errors() {
    let text = "upstreams:\n  a:\n    targets: [\"http://10.0.0.1\"]\n    health:\n      fail_timeout: 0s\n    retry:\n      attempts: 0\n    idle_timeout: soon\n";
    assert_eq!(
        parse(text).unwrap_err().to_string(),
        concat!(
            "t.yaml:5:7: upstreams.a.health.fail_timeout: must be greater than 0 (got \"0s\")\n",
            "t.yaml:7:7: upstreams.a.retry.attempts: must be at least 1 (tries in all, the first included: 1 means no retry)\n",
            "t.yaml:8:5: upstreams.a.idle_timeout: invalid duration \"soon\" (use 250ms, 1s, 1m, 1h, 1d)",
        )
    );
    let unknown =
        "upstreams:\n  a:\n    targets: [\"http://10.0.0.1\"]\n    health: { max_fail: 2 }\n";
    let error = parse(unknown).unwrap_err().to_string();
    assert!(error.starts_with("t.yaml:4:15: "), "{error}");
    assert!(error.contains("unknown field `max_fail`"), "{error}");
}
