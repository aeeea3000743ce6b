//! A large consumer directory in Redis across a restart: an instance that starts while it reads the directory
//! whole answers valid runtime keys from its first request (each looked up in Redis's key index), says
//! `starting` on `/readyz` until the read is done, and refuses unknown keys; a directory written before the key
//! index is indexed by the first instance that reads it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::Tollgate;
use common::http_client::{client, json_answer};
use common::redis::RedisServer;
use serde_json::Value;
use tollgate::consumers::{api_key_digest, digest_hex};

const TOKEN: &str = "admin-s3cret";
/// Consumers imported: enough that a debug build reads them for well over a second.
const CONSUMERS: usize = 100_000;

/// The gateway's config on `redis`: runtime API keys required on `/api`.
fn config(redis: &RedisServer) -> String {
    format!(
        r#"listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}
store:
{store}consumers:
  identify:
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
