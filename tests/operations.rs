//! Operations: config reloads (file change and SIGHUP) that are atomic and keep counters, refused broken configs,
//! and graceful shutdown on SIGTERM.

mod common;

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::{Tollgate, BIN};
use common::config_builder::ConfigBuilder;
use common::h2::{h2_frame, H2_PREFACE};
use common::http_client::{client, json_answer, metrics_text};
use common::upstream::Upstream;
use common::{eventually, start_gateway_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::reload::{Polled, Watcher};

fn limits_yaml(limit: u64, body: &str) -> String {
    ConfigBuilder::new()
        .admin()
        .route_at("version", "/version")
        .respond(200, body)
        .route("demo", "/demo")
        .respond(200, body)
        .limit(
            "per-ip",
            "ip",
            &format!("algorithm: sliding_log, limit: {limit}, period: 1m"),
        )
        .build()
}

fn write(path: &std::path::Path, text: &str) {
    // Written to a temporary file and renamed, as editors and config managers do: never half a file.
    let tmp = path.with_extension("tmp");
    std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .expect("write config");
    std::fs::rename(&tmp, path).expect("rename config");
}

async fn statuses(url: &str, n: usize) -> Vec<u16> {
    let client = client();
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            client
                .get(url)
                .send()
                .await
                .expect("request")
                .status()
                .as_u16(),
        );
    }
    out
}

/// Polls until `url` answers with `body`, or panics after `within`.
async fn wait_for_body(url: &str, body: &str, within: Duration) {
    let client = client();
    let answered = eventually(within, async || match client.get(url).send().await {
        Ok(response) => response.text().await.ok().as_deref() == Some(body),
        Err(_) => false,
    })
    .await;
    assert!(answered.is_some(), "{url} never answered {body:?}");
}

#[tokio::test]
async fn file_change_reloads_atomically_and_keeps_counters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    write(&path, &limits_yaml(3, "v1"));
    let gateway = start_gateway_with(tollgate::config::load(&path).unwrap()).await;
    // The watch's polls, driven one by one: each change is seen, then loaded once it has stayed the same.
    let mut watcher = Watcher::new(Arc::clone(&gateway.gateway), path.clone());
    let url = gateway.url("/demo");
    assert_eq!(statuses(&url, 2).await, [200, 200]);

    // Raise the limit to 5: the two requests already made still count.
    write(&path, &limits_yaml(5, "v2"));
    assert_eq!(watcher.poll().await, Polled::Settling);
    assert_eq!(watcher.poll().await, Polled::Reloaded);
    let after = statuses(&url, 5).await;
    assert_eq!(
        after,
        [200, 200, 200, 429, 429],
        "5 in total across the reload"
    );

    // A broken config is refused and the running one stays.
    write(&path, "routes:\n  - name: demo\n    match: { path_prefix: /demo }\n    respond: { status: 200, body: v3 }\n    limits:\n      - name: x\n        algorithm: sliding_log\n        limit: 1\n        period: soon\n");
    assert_eq!(watcher.poll().await, Polled::Settling);
    assert_eq!(watcher.poll().await, Polled::Refused);
    let response = client().get(&url).send().await.unwrap();
    assert_eq!(response.status(), 429, "still limited by the v2 config");
    assert_eq!(response.headers()["x-ratelimit-limit"], "5");
}

/// Runs tollgate on the config at `path`, with `workers` runtime threads (`TOKIO_WORKER_THREADS`; one worker
/// selects the single-threaded runtime) or the default of one per core; returns it once it listens.
fn spawn(path: &std::path::Path, workers: Option<&str>) -> Tollgate {
    let mut command = Tollgate::command(path);
    match workers {
        Some(workers) => command.env("TOKIO_WORKER_THREADS", workers),
        None => command.env_remove("TOKIO_WORKER_THREADS"),
    };
    command.env("RUST_LOG", "warn");
    Tollgate::spawn(command)
}

fn signal(process: &Tollgate, name: &str) {
    let status = Command::new("kill")
        .args([name, &process.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// docs/operations.md, "Memory of idle connections": the allocator asks the kernel for no transparent huge pages,
/// which `khugepaged` would fill in behind a sparse heap (RSS growing while the gateway idles). A mapping
/// advised `MADV_HUGEPAGE` shows the `hg` flag in `/proc/PID/smaps`; mimalloc built with them advises its arena.
#[tokio::test]
async fn the_heap_asks_for_no_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    write(&path, &limits_yaml(1_000, "ok"));
    let process = spawn(&path, Some("1"));
    let url = process.url("/version");
    // Some requests, so that the heap holds what serving allocates.
    assert!(statuses(&url, 20).await.iter().all(|&status| status == 200));
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", process.pid())).expect("smaps");
    let flags: Vec<&str> = smaps
        .lines()
        .filter_map(|line| line.strip_prefix("VmFlags:"))
        .collect();
    assert!(!flags.is_empty(), "no VmFlags in smaps");
    let advised: Vec<&&str> = flags
        .iter()
        .filter(|flags| flags.split_whitespace().any(|flag| flag == "hg"))
        .collect();
    assert!(
        advised.is_empty(),
        "mappings advised MADV_HUGEPAGE: {advised:?}"
    );
}

#[tokio::test]
async fn sighup_reloads_the_running_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    write(&path, &limits_yaml(3, "before"));
    // On the single-threaded runtime: signals and the reload must not depend on a second thread.
    let process = spawn(&path, Some("1"));
    let url = process.url("/version");
    wait_for_body(&url, "before", Duration::from_secs(5)).await;

    write(&path, &limits_yaml(3, "after"));
    signal(&process, "-HUP");
    wait_for_body(&url, "after", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_then_exits_0() {
    sigterm_drains(None).await;
}

#[tokio::test]
async fn sigterm_drains_on_the_single_threaded_runtime_too() {
    sigterm_drains(Some("1")).await;
}

async fn sigterm_drains(workers: Option<&str>) {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    let yaml = ConfigBuilder::new()
        .admin()
        .top("server:\n  shutdown_grace: 10s\n")
        .upstream("backend", &upstream.url())
        .route("api", "/api")
        .to("backend")
        .build();
    write(&path, &yaml);
    let mut process = spawn(&path, workers);
    let url = process.url("/api/slow");

    // The upstream answers /slow after 3 s: the request is in flight when SIGTERM arrives.
    let in_flight =
        tokio::spawn(async move { client().get(url).send().await.map(|r| r.status().as_u16()) });
    let reached = eventually(Duration::from_secs(5), async || upstream.hits() > 0).await;
    assert!(
        reached.is_some(),
        "the slow request never reached the upstream"
    );
    signal(&process, "-TERM");

    assert_eq!(
        in_flight
            .await
            .expect("task")
            .expect("in-flight request completed"),
        200
    );
    let mut status = None;
    let exited = eventually(Duration::from_secs(10), async || {
        status = process.process.0.try_wait().expect("wait");
        status.is_some()
    })
    .await;
    assert!(exited.is_some(), "tollgate did not exit after SIGTERM");
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    assert!(
        std::net::TcpStream::connect(process.listen).is_err(),
        "no longer accepting"
    );
}

/// A gateway process with a direct-response route `/hello`, an admin listener, and `server` settings.
fn draining_gateway(dir: &tempfile::TempDir, server: &str) -> Tollgate {
    let path = dir.path().join("gateway.yaml");
    let yaml = ConfigBuilder::new()
        .admin()
        .top(&format!("server:\n{server}\n"))
        .route("hello", "/hello")
        .respond(200, "hello")
        .build();
    write(&path, &yaml);
    spawn(&path, None)
}

/// `GET /readyz`: its status and JSON body.
async fn readyz(process: &Tollgate) -> (u16, serde_json::Value) {
    let (status, body) = json_answer(client().get(process.admin_url("/readyz"))).await;
    assert!(
        body.is_object(),
        "/readyz answered {status} without a JSON object"
    );
    (status, body)
}

#[tokio::test]
async fn on_sigterm_readiness_fails_first_and_the_listener_serves_on_for_the_delay() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A delay a loaded machine cannot outrun between the signal and the checks below.
    let mut process = draining_gateway(&dir, "  shutdown_delay: 10s\n  shutdown_grace: 5s");
    let url = process.url("/hello");
    assert_eq!(readyz(&process).await.0, 200);
    let admin = process.admin_url("");
    assert!(!metrics_text(&admin).await.contains("tollgate_draining"));
    // A keep-alive client, connected before the signal.
    let kept = client();
    assert_eq!(kept.get(&url).send().await.expect("before").status(), 200);

    signal(&process, "-TERM");
    let (status, body) = readyz(&process).await;
    let draining = eventually(Duration::from_secs(2), async || {
        readyz(&process).await.1["status"] == "draining"
    })
    .await;
    assert!(draining.is_some(), "readyz: {status} {body}");
    assert_eq!(readyz(&process).await.0, 503);
    let metrics = metrics_text(&admin).await;
    assert!(
        metrics.lines().any(|line| line == "tollgate_draining 1"),
        "{metrics}"
    );
    // Still served meanwhile, on the kept connection and on new ones, each answer telling HTTP/1 clients to go.
    let served = kept.get(&url).send().await.expect("during the delay");
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["connection"], "close");
    let fresh = client().get(&url).send().await.expect("a new connection");
    assert_eq!(fresh.status(), 200);
    assert_eq!(fresh.headers()["connection"], "close");
    assert!(
        process.process.0.try_wait().expect("wait").is_none(),
        "still running during the delay"
    );

    let mut status = None;
    let exited = eventually(Duration::from_secs(30), async || {
        status = process.process.0.try_wait().expect("wait");
        status.is_some()
    })
    .await;
    assert!(exited.is_some(), "tollgate did not exit after the delay");
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    // The drain's first line names its delay, its grace and the connections open then: the kept one.
    let log = process.log();
    let began = log
        .lines()
        .find(|line| line.contains("draining: /readyz answers 503 draining"))
        .unwrap_or_else(|| panic!("no line for the drain's start:\n{log}"));
    assert!(
        began.contains("delay=10s")
            && began.contains("grace=5s")
            && began.contains("connections=1"),
        "{began}"
    );
}

#[tokio::test]
async fn a_second_sigterm_ends_the_drain_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut process = draining_gateway(&dir, "  shutdown_delay: 1h\n  shutdown_grace: 1h");
    // Sent as soon as the gateway says it listens: the signal begins the drain, it does not end the process.
    signal(&process, "-TERM");
    let draining = eventually(Duration::from_secs(5), async || {
        readyz(&process).await.1["status"] == "draining"
    })
    .await;
    assert!(draining.is_some());
    signal(&process, "-TERM");
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(10)).await,
        Some(0),
        "an hour's delay was not cut short"
    );
    // Nothing was open: the cut cut nothing, and the log does not say otherwise.
    let log = process.log();
    assert!(log.contains("drained: every connection finished"), "{log}");
}

/// A gateway process proxying `/api` to `upstream` (whose `/slow` answers after 3 s), with `server` settings.
fn proxying_gateway(dir: &tempfile::TempDir, server: &str, upstream: &Upstream) -> Tollgate {
    let path = dir.path().join("gateway.yaml");
    let yaml = ConfigBuilder::new()
        .admin()
        .top(&format!("server:\n{server}\n"))
        .upstream("backend", &upstream.url())
        .route("api", "/api")
        .to("backend")
        .build();
    write(&path, &yaml);
    spawn(&path, None)
}

/// Waits at most `within` for `process` to exit; its exit code.
async fn exit_code(process: &mut Tollgate, within: Duration) -> Option<i32> {
    let mut status = None;
    let exited = eventually(within, async || {
        status = process.process.0.try_wait().expect("wait");
        status.is_some()
    })
    .await;
    assert!(
        exited.is_some(),
        "tollgate did not exit:\n{}",
        process.log()
    );
    status.and_then(|s| s.code())
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_when_the_listener_closes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut process = draining_gateway(&dir, "  shutdown_delay: 0s\n  shutdown_grace: 1h");
    let answered = async || {
        let mut kept = tokio::net::TcpStream::connect(process.listen)
            .await
            .expect("connect");
        kept.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("write");
        let mut answer = [0u8; 1024];
        let read = kept.read(&mut answer).await.expect("read");
        let head = String::from_utf8_lossy(&answer[..read]).into_owned();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("connection: close"),
            "{head}"
        );
        kept
    };
    // One idle for longer than the second after which a connection rests with its socket alone, one just
    // answered.
    let rested = answered().await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let kept = answered().await;

    // Idle between requests when the drain begins: closed with the listener, and nothing holds the exit for the
    // hour of grace.
    signal(&process, "-TERM");
    for mut idle in [rested, kept] {
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut rest)).await;
        assert!(
            matches!(closed, Ok(Ok(_))),
            "the idle connection was not closed: {closed:?}"
        );
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(10)).await,
        Some(0)
    );
    assert!(
        process.log().contains("drained: every connection finished"),
        "{}",
        process.log()
    );
}

const H2_DATA: u8 = 0x0;
const H2_HEADERS: u8 = 0x1;
const H2_SETTINGS: u8 = 0x4;
const H2_PING: u8 = 0x6;
const H2_GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// Reads the next HTTP/2 frame: its type, flags, stream and payload; `None` once the server closed.
async fn read_h2_frame(stream: &mut tokio::net::TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await.ok()?;
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await.ok()?;
    let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    Some((header[3], header[4], id, payload))
}

#[tokio::test]
async fn on_sigterm_an_h2c_connection_gets_goaway_and_its_stream_in_flight_completes() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut process = proxying_gateway(
        &dir,
        "  shutdown_delay: 0s\n  shutdown_grace: 30s",
        &upstream,
    );
    // h2c with prior knowledge, frame by frame: `GET /api/slow` (answered after 3 s) on stream 1. The header block
    // is HPACK without indexing or Huffman: :method GET, :scheme http, :path, :authority a.
    let path = b"/api/slow";
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend([0x01, 0x01, b'a']);
    let mut h2 = tokio::net::TcpStream::connect(process.listen)
        .await
        .expect("connect");
    let mut opening = [H2_PREFACE, &h2_frame(H2_SETTINGS, 0, 0, &[])].concat();
    opening.extend(h2_frame(H2_HEADERS, END_STREAM | END_HEADERS, 1, &block));
    h2.write_all(&opening).await.expect("write");
    let reached = eventually(Duration::from_secs(5), async || upstream.hits() > 0).await;
    assert!(
        reached.is_some(),
        "the slow request never reached the upstream"
    );

    signal(&process, "-TERM");
    // What the server sends from now on, in order: a GOAWAY (NO_ERROR) before the stream's answer ends.
    let mut events = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some((kind, flags, id, payload)) = read_h2_frame(&mut h2).await {
            match kind {
                H2_SETTINGS if flags & ACK == 0 => {
                    let ack = h2_frame(H2_SETTINGS, ACK, 0, &[]);
                    h2.write_all(&ack).await.expect("settings ack");
                }
                H2_PING if flags & ACK == 0 => {
                    let ack = h2_frame(H2_PING, ACK, 0, &payload);
                    h2.write_all(&ack).await.expect("ping ack");
                }
                H2_GOAWAY => {
                    let error =
                        u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                    events.push(format!("goaway {error}"));
                }
                H2_HEADERS if id == 1 => events.push(format!("headers {:#x}", payload[0])),
                H2_DATA if id == 1 && flags & END_STREAM != 0 => events.push("end".to_owned()),
                _ => {}
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the connection stayed open: {events:?}");
    let goaway = events.iter().position(|e| e == "goaway 0");
    let answered = events.iter().position(|e| e == "headers 0x88");
    let ended = events.iter().position(|e| e == "end");
    assert!(
        goaway.is_some() && answered.is_some() && ended.is_some(),
        "GOAWAY, then 200 and the stream's end: {events:?}"
    );
    assert!(
        goaway < ended,
        "GOAWAY came only after the stream: {events:?}"
    );
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(10)).await,
        Some(0)
    );
    assert!(
        process.log().contains("drained: every connection finished"),
        "{}",
        process.log()
    );
}

#[tokio::test]
async fn a_request_still_running_when_the_grace_period_ends_is_cut_and_the_log_counts_it() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    // The upstream answers /slow after 3 s; the grace period ends long before.
    let mut process = proxying_gateway(
        &dir,
        "  shutdown_delay: 0s\n  shutdown_grace: 500ms",
        &upstream,
    );
    let url = process.url("/api/slow");
    let in_flight = tokio::spawn(async move { client().get(url).send().await?.text().await });
    let reached = eventually(Duration::from_secs(5), async || upstream.hits() > 0).await;
    assert!(
        reached.is_some(),
        "the slow request never reached the upstream"
    );

    signal(&process, "-TERM");
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(10)).await,
        Some(0)
    );
    let answer = in_flight.await.expect("task");
    assert!(answer.is_err(), "the request was not cut: {answer:?}");
    let log = process.log();
    let cut = log
        .lines()
        .find(|line| line.contains("drain ended with connections still open"))
        .unwrap_or_else(|| panic!("no line for the cut:\n{log}"));
    assert!(cut.contains("finished=0") && cut.contains("cut=1"), "{cut}");
}

/// An upstream that answers every request with a chunked body that never ends: `tick\n` every 100 ms, until the
/// connection goes.
async fn endless_stream_upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let start = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                if stream.write_all(start).await.is_err() {
                    return;
                }
                while stream.write_all(b"5\r\ntick\n\r\n").await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_streamed_answer_flows_through_the_grace_period_then_is_cut() {
    let upstream = endless_stream_upstream().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    let yaml = ConfigBuilder::new()
        .admin()
        .top("server:\n  shutdown_delay: 0s\n  shutdown_grace: 2s\n")
        .upstream("backend", &format!("http://{upstream}"))
        .route("api", "/api")
        .to("backend")
        .build();
    write(&path, &yaml);
    let mut process = spawn(&path, None);
    let mut response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(process.url("/api/stream"))
        .send()
        .await
        .expect("the stream's head");
    assert_eq!(response.status(), 200);
    assert!(response.chunk().await.expect("a chunk").is_some());

    signal(&process, "-TERM");
    // The answer goes on flowing once the listener has closed, until the grace period ends and it is cut: never a
    // clean end of the body.
    let mut after_signal = 0;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match response.chunk().await {
                Ok(Some(_)) => after_signal += 1,
                ended => return ended,
            }
        }
    })
    .await
    .expect("the stream outlived the grace period");
    assert!(ended.is_err(), "the body ended cleanly: {ended:?}");
    assert!(
        after_signal >= 3,
        "{after_signal} chunks after the signal:\n{}",
        process.log()
    );
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(10)).await,
        Some(0)
    );
    let log = process.log();
    let cut = log
        .lines()
        .find(|line| line.contains("drain ended with connections still open"))
        .unwrap_or_else(|| panic!("no line for the cut:\n{log}"));
    assert!(cut.contains("finished=0") && cut.contains("cut=1"), "{cut}");
}

/// Three routes: `/version` answering `version`, `/keep` and `/new`; the file is cut at `/keep` or `/new` to
/// make the half-written files of the test.
fn three_routes_yaml(version: &str) -> String {
    format!(
        r#"listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
store:
  backend: memory
routes:
  - name: version
    match: {{ path: /version }}
    respond: {{ status: 200, body: "{version}" }}
  - name: keep
    match: {{ path: /keep }}
    respond: {{ status: 200, body: "kept" }}
  - name: new
    match: {{ path: /new }}
    respond: {{ status: 200, body: "new" }}
"#
    )
}

/// Writes `text` over `path` in place, as `cat >` or an editor saving in place does: truncated first.
fn write_in_place(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write config");
}

#[tokio::test]
async fn a_config_caught_half_written_is_never_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    let first = three_routes_yaml("v1");
    let first = &first[..first.find("  - name: new").expect("new route")];
    write(&path, first);
    let gateway = start_gateway_with(tollgate::config::load(&path).unwrap()).await;
    let mut watcher = tollgate::reload::Watcher::new(Arc::clone(&gateway.gateway), path.clone());
    let client = client();
    let answer = |route: &'static str| {
        let (client, url) = (client.clone(), gateway.url(route));
        async move {
            let response = client.get(url).send().await.expect("request");
            (
                response.status().as_u16(),
                response.text().await.expect("body"),
            )
        }
    };

    // Each poll catches the file at a later point of being written: emptied, then cut before `/keep`, then
    // whole. Both partial files are valid configs with fewer routes; loading either would make /keep 404.
    let whole = three_routes_yaml("v2");
    let halves = [
        "",
        &whole[..whole.find("  - name: keep").expect("keep route")],
    ];
    for (i, half) in halves.into_iter().enumerate() {
        write_in_place(&path, half);
        assert_eq!(watcher.poll().await, Polled::Settling, "poll {i}");
        assert_eq!(answer("/keep").await, (200, "kept".to_owned()), "poll {i}");
    }
    write_in_place(&path, &whole);
    assert_eq!(watcher.poll().await, Polled::Settling);
    assert_eq!(answer("/keep").await, (200, "kept".to_owned()));
    assert_eq!(answer("/version").await.1, "v1", "not yet: seen once");

    assert_eq!(
        watcher.poll().await,
        Polled::Reloaded,
        "the same for two polls"
    );
    assert_eq!(answer("/version").await.1, "v2");
    assert_eq!(answer("/keep").await, (200, "kept".to_owned()));
    assert_eq!(answer("/new").await, (200, "new".to_owned()));
    assert_eq!(watcher.poll().await, Polled::Unchanged);
}

#[tokio::test]
async fn the_file_watch_serves_no_404_while_a_config_is_rewritten_in_place() {
    // The watch as the binary runs it, polling every 100 ms, while the file is rewritten in place piece by piece
    // over about 30 ms: /keep, present before and after, must answer 200 at every sample until the new route is
    // served. (The deterministic version is a_config_caught_half_written_is_never_loaded.)
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    let first = three_routes_yaml("v1");
    write(
        &path,
        &first[..first.find("  - name: new").expect("new route")],
    );
    let gateway = start_gateway_with(tollgate::config::load(&path).unwrap()).await;
    tokio::spawn(tollgate::reload::watch(
        Arc::clone(&gateway.gateway),
        path.clone(),
        Duration::from_millis(100),
    ));
    let whole = three_routes_yaml("v2");
    let writer = {
        let path = path.clone();
        tokio::spawn(async move {
            let mut file = std::fs::File::create(&path).expect("truncate config");
            for chunk in whole.as_bytes().chunks(48) {
                file.write_all(chunk).expect("write config");
                file.flush().expect("flush config");
                // Less than a poll apart: each poll may catch the file at another point.
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
        })
    };
    let client = client();
    let started = Instant::now();
    let mut samples = 0;
    loop {
        let keep = client
            .get(gateway.url("/keep"))
            .send()
            .await
            .expect("request");
        assert_eq!(
            keep.status(),
            200,
            "sample {samples}: /keep while the file is written"
        );
        samples += 1;
        let new = client
            .get(gateway.url("/new"))
            .send()
            .await
            .expect("request");
        if new.status() == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the new config was never loaded"
        );
    }
    writer.await.expect("writer");
    assert!(samples > 1, "sampled across the polls");
}

#[tokio::test]
async fn a_reload_that_drops_routes_is_a_warning_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    let yaml = three_routes_yaml("before");
    write(&path, &yaml);
    let process = spawn(&path, None);

    let cut = &yaml[..yaml.find("  - name: keep").expect("keep route")];
    write(&path, cut);
    signal(&process, "-HUP");
    let warning = || {
        process
            .log()
            .lines()
            .find(|line| line.contains("WARN") && line.contains("without routes"))
            .map(str::to_owned)
    };
    let logged = eventually(Duration::from_secs(10), async || warning().is_some()).await;
    assert!(
        logged.is_some(),
        "a WARN line for the dropped routes:\n{}",
        process.log()
    );
    let line = warning().expect("logged");
    assert!(line.contains("keep, new"), "{line}");
}

#[tokio::test]
async fn the_open_files_limit_is_raised_so_300_held_connections_leave_room_for_more() {
    // Started with a soft limit of 256, as some service managers do.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    // Idle keep-alive connections are held by the gateway far longer than the test takes.
    let yaml = three_routes_yaml("v1") + "server:\n  header_read_timeout: 10m\n";
    write(&path, &yaml);
    // 4096, or this process's own hard limit if lower (an unprivileged process cannot raise it).
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).expect("open files limit");
    let hard = hard.min(4096);
    assert!(
        hard >= 512,
        "the test needs a hard open files limit of 512, not {hard}"
    );
    let mut command = Command::new("prlimit");
    command
        .args([
            &format!("--nofile=256:{hard}"),
            BIN,
            "--log-format",
            "json",
            "run",
            "--config",
        ])
        .arg(&path)
        .env("RUST_LOG", "info")
        .env_remove("TOKIO_WORKER_THREADS");
    // Logged at start-up, before the addresses: in the log once the process listens.
    let process = Tollgate::spawn(command);
    let log = process.log();
    let line = log
        .lines()
        .find(|line| line.contains("open files limit"))
        .unwrap_or_else(|| panic!("a log line with the open files limit:\n{log}"));
    let logged: serde_json::Value = serde_json::from_str(line).expect("json log line");
    assert_eq!(
        (
            &logged["fields"]["was"],
            &logged["fields"]["soft"],
            &logged["fields"]["hard"]
        ),
        (&256.into(), &hard.into(), &hard.into()),
        "{line}"
    );
    let listen = process.listen;

    let mut held = Vec::new();
    let hold = async {
        for _ in 0..300 {
            let mut stream = tokio::net::TcpStream::connect(&listen)
                .await
                .expect("connect");
            stream
                .write_all(b"GET /keep HTTP/1.1\r\nHost: t\r\n\r\n")
                .await
                .expect("write");
            let mut answer = Vec::new();
            let mut buffer = [0u8; 1024];
            while !answer.ends_with(b"kept") {
                let n = stream.read(&mut buffer).await.expect("read");
                assert!(n > 0, "closed by the gateway");
                answer.extend_from_slice(&buffer[..n]);
            }
            held.push(stream);
        }
    };
    tokio::time::timeout(Duration::from_secs(20), hold)
        .await
        .expect("300 connections answered and held");
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        client().get(format!("http://{listen}/keep")).send(),
    )
    .await
    .expect("a new request is answered while 300 are held")
    .expect("request");
    assert_eq!(response.status(), 200);
    assert_eq!(held.len(), 300);
}

#[tokio::test]
async fn the_file_watch_never_applies_a_file_that_leaves_no_routes_where_some_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    write(&path, &three_routes_yaml("v1"));
    let gateway = start_gateway_with(tollgate::config::load(&path).unwrap()).await;
    let mut watcher = Watcher::new(Arc::clone(&gateway.gateway), path.clone());
    let version = || async {
        let response = client()
            .get(gateway.url("/version"))
            .send()
            .await
            .expect("request");
        response.status().as_u16()
    };
    // Emptied, or valid with no routes, however long it stays: held, every route still served.
    for (i, text) in ["", "store:\n  backend: memory\nroutes: []\n"]
        .into_iter()
        .enumerate()
    {
        write_in_place(&path, text);
        assert_eq!(watcher.poll().await, Polled::Settling, "file {i}");
        assert_eq!(watcher.poll().await, Polled::Held, "file {i}");
        for _ in 0..3 {
            assert_eq!(watcher.poll().await, Polled::Unchanged, "file {i}");
        }
        assert_eq!(version().await, 200, "file {i}");
    }
    // SIGHUP's reload applies it: asked for, not caught half-way.
    tollgate::reload::reload(&gateway.gateway, &path).expect("reload");
    assert_eq!(version().await, 404);
    // With no routes running, a file with none is nothing to hold back.
    write_in_place(&path, "");
    assert_eq!(watcher.poll().await, Polled::Settling);
    assert_eq!(watcher.poll().await, Polled::Reloaded);
}

#[tokio::test]
async fn an_emptied_config_file_is_a_warning_and_sighup_still_applies_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    write(&path, &three_routes_yaml("v1"));
    let process = spawn(&path, None);
    let url = process.url("/version");
    write_in_place(&path, "");
    let held = || {
        process
            .log()
            .lines()
            .filter(|line| line.contains("WARN") && line.contains("leaves no routes"))
            .count()
    };
    let logged = eventually(Duration::from_secs(10), async || held() == 1).await;
    assert!(logged.is_some(), "one WARN line:\n{}", process.log());
    assert_eq!(
        client().get(&url).send().await.expect("request").status(),
        200
    );
    signal(&process, "-HUP");
    let applied = eventually(Duration::from_secs(5), async || {
        client().get(&url).send().await.expect("request").status() == 404
    })
    .await;
    assert!(applied.is_some(), "SIGHUP applies the emptied file");
    assert_eq!(held(), 1, "logged once:\n{}", process.log());
}

#[tokio::test]
async fn the_file_watch_does_not_load_again_what_a_sighup_just_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    write(&path, &three_routes_yaml("v1"));
    let gateway = start_gateway_with(tollgate::config::load(&path).unwrap()).await;
    let mut watcher = Watcher::new(Arc::clone(&gateway.gateway), path.clone());
    assert_eq!(watcher.poll().await, Polled::Unchanged);

    // An edit, then SIGHUP before the watch has seen it settle: one reload, the SIGHUP's.
    write_in_place(&path, &three_routes_yaml("v2"));
    tollgate::reload::reload(&gateway.gateway, &path).expect("reload");
    for _ in 0..3 {
        assert_eq!(watcher.poll().await, Polled::Unchanged);
    }
    // The same once the watch had seen the edit settling.
    write_in_place(&path, &three_routes_yaml("v3"));
    assert_eq!(watcher.poll().await, Polled::Settling);
    tollgate::reload::reload(&gateway.gateway, &path).expect("reload");
    for _ in 0..3 {
        assert_eq!(watcher.poll().await, Polled::Unchanged);
    }
    // A later edit is still the watch's to load.
    write_in_place(&path, &three_routes_yaml("v4"));
    assert_eq!(watcher.poll().await, Polled::Settling);
    assert_eq!(watcher.poll().await, Polled::Reloaded);
}

/// Sends a GET for `/keep` on a new connection to `addr` and waits up to `within` for its answer; the connection,
/// kept open, if answered.
async fn answered_connection(
    addr: std::net::SocketAddr,
    within: Duration,
) -> Option<tokio::net::TcpStream> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET /keep HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .ok()?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 1024];
    let read = async {
        while !answer.ends_with(b"kept") {
            let n = stream.read(&mut buffer).await.ok()?;
            if n == 0 {
                return None;
            }
            answer.extend_from_slice(&buffer[..n]);
        }
        Some(())
    };
    tokio::time::timeout(within, read).await.ok()??;
    Some(stream)
}

#[tokio::test]
async fn out_of_descriptors_the_admin_listener_answers_and_the_main_one_backs_off_logging_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    let yaml = three_routes_yaml("v1") + "server:\n  header_read_timeout: 10m\n";
    write(&path, &yaml);
    // A soft and hard limit of 64: nothing to raise, and few connections exhaust it.
    let mut command = Command::new("prlimit");
    command
        .args(["--nofile=64:64", BIN, "run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .env_remove("TOKIO_WORKER_THREADS");
    let process = Tollgate::spawn(command);
    let listen = process.listen;

    // Connections held open until one is left unanswered: the gateway has no descriptor left to accept it.
    let mut held = Vec::new();
    let waiting = loop {
        let mut stream = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connect");
        stream
            .write_all(b"GET /keep HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("write");
        let mut buffer = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buffer)).await {
            Ok(Ok(n)) if n > 0 => held.push(stream),
            _ => break stream,
        }
        assert!(held.len() < 200, "the descriptors never ran out");
    };
    assert!(held.len() > 10, "{} connections", held.len());

    // The admin listener answers, again and again, on the descriptors held back for it.
    for i in 0..5 {
        let health = tokio::time::timeout(
            Duration::from_secs(2),
            client().get(process.admin_url("/healthz")).send(),
        )
        .await
        .unwrap_or_else(|_| panic!("/healthz {i} timed out:\n{}", process.log()))
        .expect("healthz");
        assert_eq!(health.status(), 200);
    }
    // One line for the episode, however long it lasts (the accepts back off).
    let lines = |needle: &str| {
        process
            .log()
            .lines()
            .filter(|line| line.contains(needle))
            .count()
    };
    let logged = eventually(Duration::from_secs(5), async || {
        lines("out of file descriptors") == 1
    })
    .await;
    assert!(logged.is_some(), "{}", process.log());
    let more = eventually(Duration::from_millis(1_500), async || {
        lines("out of file descriptors") > 1
    })
    .await;
    assert!(more.is_none(), "logged more than once:\n{}", process.log());

    // Descriptors free again: the waiting connection is served, the episode's end is said once with its count.
    drop(held);
    let mut waiting = waiting;
    let mut buffer = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), waiting.read(&mut buffer))
        .await
        .expect("the waiting connection is served")
        .expect("read");
    assert!(n > 0);
    let ended = eventually(Duration::from_secs(5), async || {
        lines("accepting connections again") == 1
    })
    .await;
    assert!(ended.is_some(), "{}", process.log());
    let end = process
        .log()
        .lines()
        .find(|line| line.contains("accepting connections again"))
        .map(str::to_owned)
        .expect("end line");
    assert!(end.contains("failed="), "{end}");
    assert!(answered_connection(listen, Duration::from_secs(2))
        .await
        .is_some());
}
