//! Large consumer directories in Redis: an instance that starts while it reads the directory whole answers valid
//! runtime keys from its first request (each looked up in Redis's key index) and says `starting` on `/readyz` until
//! the read is done; with `consumers.cache`, an instance holds at most that many consumers, reads the others
//! through from Redis once each, asks Redis once about a wrong key however often it comes, and hears of a revoked
//! key, a block or a new key within a second, cached or not.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::Tollgate;
use common::http_client::{client, json_answer, metrics_text, status_with_key};
use common::redis::RedisServer;
use serde_json::Value;
use tollgate::consumers::{api_key_digest, digest_hex};

const TOKEN: &str = "admin-s3cret";
/// Consumers imported: enough that a debug build reads them for well over a second.
const CONSUMERS: usize = 100_000;

/// The gateway's config on `redis`: runtime API keys required on `/api`.
fn config(redis: &RedisServer) -> String {
    cached_config(redis, None)
}

/// [`config`], with `consumers.cache` when given.
fn cached_config(redis: &RedisServer, cache: Option<usize>) -> String {
    let cache = cache.map_or(String::new(), |cache| format!("  cache: {cache}\n"));
    format!(
        r#"listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}
store:
{store}consumers:
{cache}  identify:
    - api_key: {{ header: x-api-key }}
  anonymous: reject
  plans:
    pro:
      limits:
        - {{ name: hourly, key: consumer, algorithm: gcra, rate: 100000/1h, burst: 1000 }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    consumers: required
    respond: {{ status: 200, body: "ok" }}
"#,
        store = common::store_yaml(Some(redis))
    )
}

/// The API key of consumer number `i`.
fn key(i: usize) -> String {
    format!("tg_restart_key_{i}")
}

/// One import line: consumer `user-<i>` on `pro`, holding [`key`]`(i)`.
fn import_line(i: usize) -> String {
    let sha256 = digest_hex(&api_key_digest(key(i).as_bytes()));
    format!(
        "{{\"consumer\":\"user-{i}\",\"record\":{{\"plan\":\"pro\",\"keys\":[{{\"id\":\"k_{i}\",\"sha256\":\"{sha256}\",\"created_ms\":1}}]}}}}\n"
    )
}

fn start(config: &std::path::Path) -> Tollgate {
    let mut command = Tollgate::command(config);
    command.env("RUST_LOG", "warn");
    Tollgate::spawn(command)
}

/// `GET /readyz`: its status and `status` field.
async fn readiness(tollgate: &Tollgate) -> (u16, String) {
    let (status, body) = json_answer(client().get(tollgate.admin_url("/readyz"))).await;
    (
        status,
        body["status"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn a_restarted_instance_answers_every_valid_key_while_it_reads_a_large_directory() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, config(&redis)).expect("write config");
    let first = start(&path);
    let body: String = (0..CONSUMERS).map(import_line).collect();
    let (status, answer) = json_answer(
        client()
            .post(first.admin_url("/consumers:import"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .timeout(Duration::from_secs(120))
            .body(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    drop(first);

    // The restart: clients send valid keys from the moment the listener is up.
    let started = Instant::now();
    let tollgate = Arc::new(start(&path));
    let (first_status, first_readiness) = readiness(&tollgate).await;
    let mut clients = Vec::new();
    for worker in 0..8 {
        let tollgate = Arc::clone(&tollgate);
        clients.push(tokio::spawn(async move {
            let http = client();
            let mut answers = Vec::new();
            let mut i = worker * 7919;
            loop {
                i = (i + 104_729) % CONSUMERS;
                let response = http
                    .get(tollgate.url("/api"))
                    .header("x-api-key", key(i))
                    .send()
                    .await
                    .expect("request");
                answers.push((i, response.status().as_u16()));
                if answers.len() >= 400 {
                    return answers;
                }
            }
        }));
    }
    let mut ready_after = None;
    let mut said = vec![(first_status, first_readiness)];
    while started.elapsed() < Duration::from_secs(60) {
        let now = readiness(&tollgate).await;
        said.push(now.clone());
        if now == (200, "ready".to_owned()) {
            ready_after = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut answers = Vec::new();
    for client in clients {
        answers.extend(client.await.expect("client"));
    }
    let refused: Vec<&(usize, u16)> = answers
        .iter()
        .filter(|(_, status)| *status != 200)
        .collect();
    assert!(
        refused.is_empty(),
        "{} of {} requests with valid keys refused (first: {:?}); ready after {ready_after:?}\n{}",
        refused.len(),
        answers.len(),
        &refused[..refused.len().min(5)],
        tollgate.log()
    );
    // Not ready until the directory is read; `starting` (503) once Redis answers the limiter meanwhile.
    assert_ne!(said[0], (200, "ready".to_owned()), "{said:?}");
    assert!(said.contains(&(503, "starting".to_owned())), "{said:?}");
    assert!(ready_after.is_some(), "never ready:\n{}", tollgate.log());

    // Once read, a key nobody holds is refused, and a valid one still passes.
    let http = client();
    let unknown = http
        .get(tollgate.url("/api"))
        .header("x-api-key", "tg_nobody")
        .send()
        .await
        .expect("request");
    assert_eq!(unknown.status().as_u16(), 401);
    let (_, listed) = json_answer(
        http.get(tollgate.admin_url("/consumers?limit=1"))
            .header("authorization", format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(listed["total"], Value::from(CONSUMERS), "{listed}");
    assert_eq!(listed["synced"], Value::Bool(true), "{listed}");
}

/// Starts the binary on `yaml`, in `dir`.
fn start_on(dir: &tempfile::TempDir, name: &str, yaml: &str) -> Tollgate {
    let path = dir.path().join(name);
    std::fs::write(&path, yaml).expect("write config");
    start(&path)
}

/// The status of `GET /api` with API key `key`.
async fn status_with(tollgate: &Tollgate, key: &str) -> u16 {
    status_with_key(tollgate.url("/api"), key).await
}

/// The value of the series `series` (a full name with labels, as the exporter writes it) in `tollgate`'s metrics.
async fn metric(tollgate: &Tollgate, series: &str) -> f64 {
    let text = metrics_text(&format!("http://{}", tollgate.admin)).await;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// An admin call with the token: its status and JSON body.
async fn admin(request: reqwest::RequestBuilder) -> (u16, Value) {
    json_answer(request.header("authorization", format!("Bearer {TOKEN}"))).await
}

#[tokio::test]
async fn a_cache_holds_at_most_its_bound_reads_the_rest_through_and_asks_once_about_a_wrong_key() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start_on(&dir, "cached.yaml", &cached_config(&redis, Some(100)));
    let body: String = (0..1_000).map(import_line).collect();
    let (status, answer) = admin(
        client()
            .post(tollgate.admin_url("/consumers:import"))
            .body(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let found = "tollgate_consumer_directory_lookups_total{result=\"found\"}";
    let absent = "tollgate_consumer_directory_lookups_total{result=\"absent\"}";
    let held = "tollgate_consumer_directory_consumers";

    // Every consumer answers, each read from Redis once; memory holds the bound.
    for i in 0..1_000 {
        assert_eq!(status_with(&tollgate, &key(i)).await, 200, "consumer {i}");
    }
    let looked_up = metric(&tollgate, found).await;
    assert!(looked_up >= 1_000.0, "{looked_up} lookups found a record");
    assert!(metric(&tollgate, held).await <= 100.0);
    // The most recent ones are held: asked again, Redis is not.
    for i in 950..1_000 {
        assert_eq!(status_with(&tollgate, &key(i)).await, 200);
    }
    assert_eq!(metric(&tollgate, found).await, looked_up);

    // A wrong key is looked up once, however often it comes.
    let before = metric(&tollgate, absent).await;
    for _ in 0..50 {
        assert_eq!(status_with(&tollgate, "tg_wrong").await, 401);
    }
    assert_eq!(metric(&tollgate, absent).await - before, 1.0);

    // The listing is Redis's to give; one consumer is read through.
    let (status, answer) = admin(client().get(tollgate.admin_url("/consumers"))).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("listed_in_redis"))
    );
    let (status, shown) = admin(client().get(tollgate.admin_url("/consumers/user-3"))).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["settings"]["plan"], "pro", "{shown}");

    // A key is checked against Redis's whole directory, not the cache's part of it: a record claiming an uncached
    // consumer's key is refused, by import and by restore, and nothing is set.
    let claim = import_line(5).replace("user-5", "user-claimant");
    let (status, answer) = admin(
        client()
            .post(tollgate.admin_url("/consumers:import"))
            .body(format!("{}{claim}", import_line(2_000))),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["detail"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("line 2:") && message.contains("\"user-5\""),
        "{answer}"
    );
    let record: Value = serde_json::from_str(&claim).expect("import line");
    let (status, answer) = admin(
        client()
            .put(tollgate.admin_url("/consumers/user-claimant/record"))
            .body(record["record"].to_string()),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_keys")),
        "{answer}"
    );
    for id in ["user-claimant", "user-2000"] {
        let (status, shown) =
            admin(client().get(tollgate.admin_url(&format!("/consumers/{id}")))).await;
        assert_eq!(status, 200, "{shown}");
        assert!(shown["settings"].is_null(), "{id} was set: {shown}");
    }
    assert_eq!(status_with(&tollgate, &key(5)).await, 200);
}

#[tokio::test]
async fn a_cached_key_revoked_blocked_or_new_on_one_instance_changes_the_others_answer_within_a_second(
) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let one = start_on(&dir, "one.yaml", &cached_config(&redis, Some(10)));
    let other = start_on(&dir, "other.yaml", &cached_config(&redis, Some(10)));
    let within_a_second = async |key: &str, status: u16| {
        common::eventually(Duration::from_secs(1), async || {
            status_with(&other, key).await == status
        })
        .await
        .is_some()
    };

    // A key issued on one, used (and so cached) on the other, then revoked on the one.
    let (status, issued) = admin(client().post(one.admin_url("/consumers/acme/keys"))).await;
    assert_eq!(status, 201, "{issued}");
    let acme_key = issued["key"].as_str().expect("key").to_owned();
    let key_id = issued["id"].as_str().expect("id").to_owned();
    assert_eq!(status_with(&other, &acme_key).await, 200);
    let (status, _) = admin(
        client()
            .put(one.admin_url("/consumers/acme"))
            .body(r#"{"blocked":true}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        within_a_second(&acme_key, 403).await,
        "the block did not reach the cached record"
    );
    let (status, _) = admin(
        client()
            .put(one.admin_url("/consumers/acme"))
            .body(r#"{"blocked":false}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert!(within_a_second(&acme_key, 200).await);
    let (status, _) =
        admin(client().delete(one.admin_url(&format!("/consumers/acme/keys/{key_id}")))).await;
    assert_eq!(status, 200);
    assert!(
        within_a_second(&acme_key, 401).await,
        "the revoked key still passed"
    );

    // A key the other was told is nobody's, then given to a consumer: announced (a record restored), and by an
    // import (counted, not announced: the other forgets what it held at its next check).
    for (id, i, restored) in [("globex", 7, true), ("initech", 8, false)] {
        assert_eq!(status_with(&other, &key(i)).await, 401);
        let line = import_line(i).replace(&format!("user-{i}"), id);
        let (status, answer) = if restored {
            let record: Value = serde_json::from_str(&line).expect("line");
            admin(
                client()
                    .put(one.admin_url(&format!("/consumers/{id}/record")))
                    .body(record["record"].to_string()),
            )
            .await
        } else {
            admin(client().post(one.admin_url("/consumers:import")).body(line)).await
        };
        assert_eq!(status, 200, "{answer}");
        assert!(
            within_a_second(&key(i), 200).await,
            "{id}'s new key was refused"
        );
    }
}
