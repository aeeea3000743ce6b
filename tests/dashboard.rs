//! What the admin listener shows an operator live: `GET /stats` on the running binary (decisions per second by
//! route and limit, responses, the store), behind the admin token, and `GET /dashboard` read in a real browser
//! (headless Chromium, which scripts/test.sh installs) while the gateway is under load: the flooding key first in
//! its limit's top list, among light ones.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::binary::Tollgate;
use common::http_client::{client, json_answer};
use common::redis::RedisServer;
use serde_json::Value;

const TOKEN: &str = "dashboard-test-token-0123456789";

fn start(dir: &tempfile::TempDir) -> Tollgate {
    start_on(dir, None)
}

/// The gateway on `redis`, or on the in-process store.
fn start_on(dir: &tempfile::TempDir, redis: Option<&RedisServer>) -> Tollgate {
    let path = dir.path().join("gateway.yaml");
    let store = common::store_yaml(redis);
    let yaml = format!(
        r#"listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}
store:
{store}routes:
  - name: api
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per_ip, key: ip, algorithm: fixed_window, limit: 5, period: 1h }}
      - {{ name: trial, key: ip, algorithm: fixed_window, limit: 1, period: 1h, shadow: true }}
  - name: users
    match: {{ path_prefix: /users }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per_user, key: "header:x-user", algorithm: fixed_window, limit: 3, period: 1h }}
"#
    );
    std::fs::write(&path, yaml).expect("write config");
    Tollgate::run(&path)
}

async fn stats(tollgate: &Tollgate) -> Value {
    let (status, body) = json_answer(
        client()
            .get(tollgate.admin_url("/stats"))
            .header("authorization", format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn send(tollgate: &Tollgate, requests: usize) {
    for _ in 0..requests {
        client()
            .get(tollgate.url("/api"))
            .send()
            .await
            .expect("request");
    }
}

fn limit<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["decisions"]
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|d| d["route"] == "api" && d["limit"] == name)
        })
        .unwrap_or_else(|| panic!("no api/{name} in {stats}"))
}

#[tokio::test]
async fn stats_give_decisions_per_second_by_route_and_limit_and_the_store_s_state() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start(&dir);
    let (status, _) = json_answer(client().get(tollgate.admin_url("/stats"))).await;
    assert_eq!(status, 401, "the stats need the admin token");

    stats(&tollgate).await;
    send(&tollgate, 20).await;
    // Rates are differences between samples, taken at most once a second.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let after = stats(&tollgate).await;
    let per_ip = limit(&after, "per_ip");
    let per_second = |field: &str| per_ip[field].as_f64().unwrap_or_default();
    assert!(per_second("allowed_per_second") > 0.0, "{per_ip}");
    // 15 of the 20 denied by per_ip: three times the 5 allowed, whatever the interval was.
    let ratio = per_second("denied_per_second") / per_second("allowed_per_second");
    assert!((ratio - 3.0).abs() < 1e-6, "{per_ip}");
    assert_eq!(
        per_ip["history"]["denied"].as_array().map(Vec::len),
        Some(1)
    );
    let trial = limit(&after, "trial");
    assert!(
        trial["shadow_denied_per_second"]
            .as_f64()
            .unwrap_or_default()
            > 0.0,
        "{trial}"
    );
    assert!(
        after["requests_per_second"]["api"]
            .as_f64()
            .unwrap_or_default()
            > 0.0,
        "{after}"
    );
    assert_eq!(after["store"]["readiness"]["store"], "memory", "{after}");
    assert_eq!(after["store"]["fallback_active"], false, "{after}");

    // A quiet second: the rates fall to zero, the history keeps the burst.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let quiet = stats(&tollgate).await;
    let per_ip = limit(&quiet, "per_ip");
    assert_eq!(per_ip["denied_per_second"], 0.0, "{per_ip}");
    assert_eq!(
        per_ip["history"]["denied"].as_array().map(Vec::len),
        Some(2)
    );
}

/// The page's DOM once its script has run, as headless Chromium at a phone's width (390 px) builds it, and what
/// Chromium logged (console errors among it). With `screenshot`, also a picture of the page.
fn browse(tollgate: &Tollgate, screenshot: Option<&std::path::Path>) -> (String, String) {
    let url = tollgate.admin_url(&format!("/dashboard#token={TOKEN}"));
    let profile = tempfile::tempdir().expect("profile dir");
    let mut command = std::process::Command::new("chromium");
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=390,900",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args([
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
        ]);
    match screenshot {
        Some(path) => command.arg(format!("--screenshot={}", path.display())),
        None => command.arg("--dump-dom"),
    };
    let output = command
        .arg(url)
        .output()
        .expect("chromium (scripts/test.sh installs Debian's chromium package)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The text of the element with id `id` in `dom` (no nested elements).
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in {dom}"));
    let open = start + dom[start..].find('>').expect("tag end") + 1;
    let close = open + dom[open..].find('<').expect("text end");
    &dom[open..close]
}

/// The numbers in the row of `route` / `limit` of the decisions table: allowed and denied per second.
fn decision_row(dom: &str, route: &str, limit: &str) -> (f64, f64) {
    let start = dom
        .find(&format!("data-route=\"{route}\" data-limit=\"{limit}\""))
        .unwrap_or_else(|| panic!("no row for {route} / {limit} in {dom}"));
    let row = &dom[start..start + dom[start..].find("</tr>").expect("row end")];
    let number = |class: &str| -> f64 {
        let at = row.find(&format!("class=\"num {class}\">")).expect("cell") + class.len() + 13;
        row[at..at + row[at..].find('<').expect("cell end")]
            .parse()
            .expect("a number")
    };
    (number("allowed"), number("denied"))
}

/// The keys of the top list of `route` / `limit` on the page, in the page's order.
fn top_keys(dom: &str, route: &str, limit: &str) -> Vec<String> {
    let start = dom
        .find(&format!(
            "data-top-route=\"{route}\" data-top-limit=\"{limit}\""
        ))
        .unwrap_or_else(|| panic!("no top list for {route} / {limit} in {dom}"));
    let table = &dom[start..start + dom[start..].find("</table>").expect("table end")];
    table
        .split("data-key=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').expect("attribute end")].to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_the_limits_live_in_a_browser_and_the_store_failing() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start_on(&dir, Some(&redis));
    // Under load (a client flooding the route throughout), with /stats sampled before, as another viewer's polls
    // sample it: the browser's first poll has a sample to count from.
    let flooding = Arc::new(AtomicBool::new(true));
    let flood = tokio::spawn({
        let (url, users, flooding) = (
            tollgate.url("/api"),
            tollgate.url("/users"),
            flooding.clone(),
        );
        async move {
            while flooding.load(Ordering::Relaxed) {
                let _ = client().get(&url).send().await;
                let _ = client()
                    .get(&users)
                    .header("x-user", "flooder")
                    .send()
                    .await;
            }
        }
    });
    stats(&tollgate).await;
    // A few light users beside the flooding one, each under its limit.
    for light in ["light-1", "light-2", "light-3"] {
        for _ in 0..2 {
            client()
                .get(tollgate.url("/users"))
                .header("x-user", light)
                .send()
                .await
                .expect("request");
        }
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    stats(&tollgate).await;
    let (dom, log) = tokio::task::block_in_place(|| browse(&tollgate, None));
    assert!(!log.contains("Uncaught"), "a script error:\n{log}");
    let (allowed, denied) = decision_row(&dom, "api", "per_ip");
    assert!(denied > 0.0, "the flood's denials: {allowed} / {denied}");
    decision_row(&dom, "api", "trial");
    assert_eq!(text_of(&dom, "store"), "redis: ready", "{dom}");
    let users = top_keys(&dom, "users", "per_user");
    assert_eq!(users.first().map(String::as_str), Some("flooder"), "{dom}");
    assert_eq!(users.len(), 4, "the light users too: {users:?}");
    assert!(
        dom.contains("data-fits=\"true\""),
        "wider than a phone: {dom}"
    );
    if let Ok(path) = std::env::var("TOLLGATE_DASHBOARD_SCREENSHOT") {
        tokio::task::block_in_place(|| browse(&tollgate, Some(std::path::Path::new(&path))));
    }

    flooding.store(false, Ordering::Relaxed);
    flood.await.expect("flood");

    // Redis gone: the page says so.
    redis.kill();
    send(&tollgate, 5).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, readiness) = json_answer(client().get(tollgate.admin_url("/readyz"))).await;
        if readiness["status"] == "degraded" || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (dom, log) = tokio::task::block_in_place(|| browse(&tollgate, None));
    assert!(!log.contains("Uncaught"), "a script error:\n{log}");
    let store = text_of(&dom, "store");
    assert!(store.starts_with("redis: degraded"), "{store}");
}

/// Sends `process` the signal `name` (`-HUP`).
fn signal(tollgate: &Tollgate, name: &str) {
    let status = std::process::Command::new("kill")
        .args([name, &tollgate.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_reloads_are_listed_with_why_one_was_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start(&dir);
    let path = dir.path().join("gateway.yaml");
    let good = std::fs::read_to_string(&path).expect("config");
    assert_eq!(
        stats(&tollgate).await["reloads"]["last"],
        serde_json::json!([])
    );

    std::fs::write(&path, good.replace("limit: 5,", "limit: -5,")).expect("write");
    signal(&tollgate, "-HUP");
    let mut last = Value::Null;
    for _ in 0..100 {
        last = stats(&tollgate).await["reloads"]["last"].clone();
        if last.as_array().is_some_and(|all| !all.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last[0]["applied"], false, "{last}");
    // The located error, as the log gives it.
    let error = last[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("gateway.yaml:") && error.contains("limit"),
        "{error}"
    );

    std::fs::write(&path, &good).expect("write");
    signal(&tollgate, "-HUP");
    for _ in 0..100 {
        last = stats(&tollgate).await["reloads"]["last"].clone();
        if last.as_array().is_some_and(|all| all.len() == 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last[0]["applied"], true, "newest first: {last}");
    assert_eq!(last[0]["error"], Value::Null);
    assert_eq!(last[1]["applied"], false);
    assert!(last[0]["at_ms"].as_i64() >= last[1]["at_ms"].as_i64());

    let (dom, log) = tokio::task::block_in_place(|| browse(&tollgate, None));
    assert!(!log.contains("Uncaught"), "a script error:\n{log}");
    let list = &dom[dom.find("id=\"reloads\"").expect("the reloads list")..];
    let list = &list[..list.find("</ul>").expect("list end")];
    let applied = list.find("class=\"applied\"").expect("the applied reload");
    let refused = list.find("class=\"refused\"").expect("the refused reload");
    assert!(applied < refused, "newest first: {list}");
    assert!(list.contains("gateway.yaml:"), "{list}");
}

/// The row of the upstream target `target` in `dom`'s upstream table: its `data-state`.
fn target_state(dom: &str, target: &str) -> String {
    let marker = format!("data-target=\"{target}\" data-state=\"");
    let start = dom
        .find(&marker)
        .unwrap_or_else(|| panic!("no row for {target} in {dom}"))
        + marker.len();
    dom[start..start + dom[start..].find('"').expect("state end")].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_each_upstream_target_up_or_skipped() {
    let upstream = common::upstream::Upstream::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = closed.local_addr().expect("addr");
    drop(closed);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}\nstore:\n  backend: memory\nupstreams:\n  backend:\n    targets: [\"{}\", \"http://{dead}\"]\n    health: {{ max_fails: 1, fail_timeout: 1h }}\nroutes:\n  - name: api\n    match: {{ path_prefix: /api }}\n    upstream: backend\n",
        upstream.url()
    );
    std::fs::write(&path, yaml).expect("write config");
    let tollgate = Tollgate::run(&path);
    // Round robin meets the dead target within two requests; retried on the live one, both answer 200.
    for _ in 0..2 {
        let response = client()
            .get(tollgate.url("/api"))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200);
    }
    let stats = stats(&tollgate).await;
    assert_eq!(stats["upstreams"][0]["name"], "backend", "{stats}");
    let (dom, log) = tokio::task::block_in_place(|| browse(&tollgate, None));
    assert!(!log.contains("Uncaught"), "a script error:\n{log}");
    assert_eq!(target_state(&dom, &upstream.url()), "up", "{dom}");
    assert_eq!(
        target_state(&dom, &format!("http://{dead}")),
        "down",
        "{dom}"
    );
    assert!(
        dom.contains("data-fits=\"true\""),
        "wider than a phone: {dom}"
    );
}
