//! The docs' promises read out of the markdown and checked against the program: the README's tour and
//! docs/operations.md's admin API examples run as their commands are written (curl against the binary running the
//! shipped gateway.yaml, with a real Redis), every row of docs/responses.md's tables of refusals and of the
//! gateway's own answers provoked, the metrics table against the series the source registers, every YAML example
//! read as a config, and docs/library.md's programs against examples/. Editing the docs without the program, or
//! the program without the docs, fails here.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use axum::Router;
use common::binary::{Tollgate, BIN};
use common::h2::{h2_frame, GET_API_BLOCK, H2_PREFACE};
use common::redis::RedisServer;
use common::ReservedPort;
use serde_json::Value;

/// The repository's root: the README and the shipped config are read from there.
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// One command of a documented shell block with what the docs say it prints: the `# ...` lines under it, and
/// the claims of the comment beside it (a status, a JSON body).
#[derive(Debug)]
struct Step {
    command: String,
    /// The lines shown under the command, without their `# `.
    output: Vec<String>,
    /// The comment beside the command, continuation lines included.
    beside: String,
}

/// The ```sh blocks of `text`, each with the prose before it.
fn shell_blocks(text: &str) -> Vec<(String, Vec<Step>)> {
    let mut blocks = Vec::new();
    let mut prose = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```sh" {
            prose.push_str(line);
            prose.push('\n');
            continue;
        }
        let mut steps: Vec<Step> = Vec::new();
        // Whether `# ` lines now belong to the last command (no blank line since it).
        let mut open = false;
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            let trimmed = line.trim_start();
            if trimmed.is_empty() {
                open = false;
            } else if let Some(comment) = trimmed.strip_prefix('#') {
                let comment = comment.strip_prefix(' ').unwrap_or(comment);
                match steps.last_mut() {
                    // Indented: the comment beside the command goes on.
                    Some(step) if open && line.starts_with(' ') => {
                        step.beside.push(' ');
                        step.beside.push_str(comment.trim());
                    }
                    Some(step) if open => step.output.push(comment.to_owned()),
                    // A comment before any command says what follows.
                    _ => {}
                }
            } else {
                let (command, beside) = match line.find(" # ") {
                    Some(at) => (&line[..at], line[at + 3..].trim()),
                    None => (line, ""),
                };
                steps.push(Step {
                    command: command.trim().to_owned(),
                    output: Vec::new(),
                    beside: beside.to_owned(),
                });
                open = true;
            }
        }
        blocks.push((std::mem::take(&mut prose), steps));
    }
    blocks
}

/// The text of `markdown` from the heading `heading` to the next heading of its level.
fn section<'a>(markdown: &'a str, heading: &str) -> &'a str {
    let start = markdown
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let level = heading.split(' ').next().unwrap_or("##");
    let body = &markdown[start + heading.len() + 2..];
    let end = body.find(&format!("\n{level} ")).unwrap_or(body.len());
    &body[..end]
}

/// Whether `actual` is what the docs show as `documented`: equal, except where the value cannot be known in
/// advance. A documented string ending in `...` stands for any string beginning in its form (see [`same_form`]);
/// an identifier (`id`) for one of the same form; times (`retry_after_ms`, `created_ms`) for any number.
fn json_matches(documented: &Value, actual: &Value, field: &str) -> bool {
    match (documented, actual) {
        (Value::String(shown), Value::String(got)) => {
            if let Some(start) = shown.strip_suffix("...") {
                got.get(..start.len())
                    .is_some_and(|got| same_form(start, got))
            } else if field == "id" {
                same_form(shown, got)
            } else {
                shown == got
            }
        }
        (Value::Number(_), Value::Number(_)) if field.ends_with("_ms") => true,
        (Value::Object(shown), Value::Object(got)) => {
            shown.len() == got.len()
                && shown
                    .iter()
                    .zip(got)
                    .all(|((k1, v1), (k2, v2))| k1 == k2 && json_matches(v1, v2, k1))
        }
        _ => documented == actual,
    }
}

/// `got` has `shown`'s form: the same length, and the same characters except hex digits for hex digits (a
/// request id, a key id).
fn same_form(shown: &str, got: &str) -> bool {
    shown.len() == got.len()
        && shown.chars().zip(got.chars()).all(|(s, g)| {
            s == g || (s.is_ascii_hexdigit() && g.is_ascii_hexdigit() && !g.is_ascii_uppercase())
        })
}

/// Checks what a command printed against the lines the docs show under it: the status line and the fields as
/// written (a `date` of any time, an `x-request-id` of the same form, `content-length` the body's), a JSON body
/// by [`json_matches`], any other line equal.
fn check_output(step: &Step, printed: &str) -> Result<(), String> {
    let printed: Vec<&str> = printed.trim_end().lines().collect();
    let shown: Vec<&str> = step.output.iter().map(|l| l.trim_end()).collect();
    let body_len = printed
        .iter()
        .position(|l| l.is_empty())
        .and_then(|blank| printed.get(blank + 1..))
        .map(|body| body.join("\n").len());
    let mismatch = || {
        format!(
            "`{}` printed:\n{}\nthe docs show:\n{}",
            step.command,
            printed.join("\n"),
            shown.join("\n")
        )
    };
    if printed.len() != shown.len() {
        return Err(mismatch());
    }
    for (shown, got) in shown.iter().zip(&printed) {
        let fits = match (shown.split_once(": "), got.split_once(": ")) {
            _ if shown.starts_with('{') => {
                match (serde_json::from_str(shown), serde_json::from_str(got)) {
                    (Ok(documented), Ok(actual)) => json_matches(&documented, &actual, ""),
                    _ => false,
                }
            }
            (Some((name, value)), Some((got_name, got_value))) if name == got_name => match name {
                // `Thu, 26 Nov 2026 06:46:29 GMT`
                "date" => got_value.len() == value.len() && got_value.ends_with(" GMT"),
                "x-request-id" => same_form(value, got_value),
                "content-length" => body_len.map(|n| n.to_string()).as_deref() == Some(got_value),
                _ => value == got_value,
            },
            _ => shown == got,
        };
        if !fits {
            return Err(mismatch());
        }
    }
    Ok(())
}

/// Checks the claims of the comment beside a command: a status (a word of three digits, `404` or `401:`) is
/// what curl printed (`-w '%{http_code}'`) or the status line's, a JSON object is the body.
fn check_beside(step: &Step, printed: &str) -> Result<(), String> {
    let printed = printed.trim_end();
    let (head, body) = match printed.split_once("\n\n") {
        Some((head, body)) if printed.starts_with("HTTP/") => (head, body),
        _ if printed.starts_with("HTTP/") => (printed, ""),
        _ => ("", printed),
    };
    let status = step.beside.split_whitespace().find_map(|word| {
        let word = word.trim_end_matches([':', ',', ';']);
        (word.len() == 3 && word.bytes().all(|b| b.is_ascii_digit())).then_some(word)
    });
    if let Some(status) = status {
        let got = if head.is_empty() {
            body
        } else {
            head.split(' ').nth(1).unwrap_or("")
        };
        if got != status {
            return Err(format!(
                "`{}`: the docs say {status}, it printed:\n{printed}",
                step.command
            ));
        }
    }
    if let (Some(start), Some(end)) = (step.beside.find('{'), step.beside.rfind('}')) {
        let documented: Value = serde_json::from_str(&step.beside[start..=end])
            .map_err(|e| format!("`{}`: the JSON beside it: {e}", step.command))?;
        let fits =
            serde_json::from_str(body).is_ok_and(|actual| json_matches(&documented, &actual, ""));
        if !fits {
            return Err(format!(
                "`{}`: the docs say {documented}, it printed:\n{printed}",
                step.command
            ));
        }
    }
    Ok(())
}

/// Runs a documented command with `sh`, the documented addresses replaced by the gateway's, and returns what it
/// printed (curl's `\r\n` as `\n`).
fn run(command: &str, gateway: &Tollgate) -> Result<String, String> {
    let command = command
        .replace("localhost:8080", &gateway.listen.to_string())
        .replace("localhost:9901", &gateway.admin.to_string());
    let output = Command::new("sh")
        .args(["-c", &command])
        .output()
        .map_err(|e| format!("sh: {e}"))?;
    let printed = String::from_utf8_lossy(&output.stdout).replace("\r\n", "\n");
    if output.status.success() {
        Ok(printed)
    } else {
        Err(format!(
            "`{command}` failed ({}): {printed}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn run_step(step: &Step, gateway: &Tollgate) -> Result<(), String> {
    let printed = run(&step.command, gateway)?;
    if !step.output.is_empty() {
        check_output(step, &printed)?;
    }
    check_beside(step, &printed)
}

/// An upstream answering 200 to everything, on `port` (reserved before, so the gateway's upstream URL names it
/// while nothing listens there yet).
async fn serve_on(port: &ReservedPort) -> tokio::task::JoinHandle<()> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket.bind(port.addr()).expect("bind the reserved port");
    let listener = socket.listen(64).expect("listen");
    let app = Router::new().fallback(|| async { "ok\n" });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

/// The README's tour, run as a newcomer would: the binary with the shipped gateway.yaml (`cargo run -- --config
/// gateway.yaml`, its addresses, Redis and upstream given through the variables the file reads), each command of
/// the tour's shell blocks run with curl, what it prints compared with what the README shows under or beside it.
/// An upstream listens from the block whose prose gives it one (`python3 -m http.server 3000`) on; nothing
/// before. Then, with Redis stopped, `/readyz` says what the README says it says without Redis.
///
/// The first commands depend on time (a burst of 10 refilled at 5 a second, 12 requests in a loop): when the
/// machine is too slow for them they are run again, after the key is reset through the admin API, a few times.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_tour_prints_what_the_readme_shows() {
    let readme = std::fs::read_to_string(Path::new(REPO).join("README.md")).expect("README.md");
    let tour = section(&readme, "## A short tour with curl");
    let blocks = shell_blocks(tour);
    assert!(blocks.len() >= 2, "the tour's shell blocks: {blocks:?}");

    let mut redis = RedisServer::start();
    let upstream_port = ReservedPort::new();
    let mut command = Command::new(BIN);
    command
        .args(["--config", "gateway.yaml"])
        .current_dir(REPO)
        .env("TOLLGATE_LISTEN", "127.0.0.1:0")
        .env("TOLLGATE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("REDIS_URL", redis.url())
        .env("UPSTREAM_URL", format!("http://{}", upstream_port.addr()))
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .env_remove("TOLLGATE_CONFIG");
    let gateway = Tollgate::spawn(command);
    let ready = common::eventually(Duration::from_secs(10), async || {
        run("curl -s localhost:9901/readyz", &gateway).is_ok_and(|body| body.contains("\"ready\""))
    })
    .await;
    assert!(ready.is_some(), "not ready:\n{}", gateway.log());

    let mut upstream = None;
    let mut checked = 0;
    for (prose, steps) in &blocks {
        if prose.contains("http.server 3000") && upstream.is_none() {
            upstream = Some(serve_on(&upstream_port).await);
        }
        let mut attempts = 0;
        let mut index = 0;
        while let Some(step) = steps.get(index) {
            match run_step(step, &gateway) {
                Ok(()) => index += 1,
                // The timed commands come first: start the block again with the key full.
                Err(_) if step.command.contains("/demo") && attempts < 4 => {
                    attempts += 1;
                    run(
                        "curl -s -X DELETE 'localhost:9901/limits/demo/per-ip?key=127.0.0.1'",
                        &gateway,
                    )
                    .expect("reset the demo key");
                    index = 0;
                }
                Err(error) => panic!("{error}\n--- gateway log:\n{}", gateway.log()),
            }
        }
        checked += steps.len();
    }
    assert!(
        upstream.is_some(),
        "no block of the tour gives the api an upstream"
    );
    assert!(checked >= 10, "only {checked} commands found in the tour");

    // "Without Redis, `/readyz` says `{...}`": the code span may wrap.
    let without = tour
        .split_once("Without Redis, `/readyz` says `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(json, _)| json.replace('\n', ""))
        .expect("the README's readiness without Redis");
    let documented: Value = serde_json::from_str(&without).expect("documented JSON");
    redis.kill();
    let degraded = common::eventually(Duration::from_secs(10), async || {
        run("curl -s localhost:9901/readyz", &gateway)
            .ok()
            .and_then(|body| serde_json::from_str(&body).ok())
            .is_some_and(|actual| json_matches(&documented, &actual, ""))
    })
    .await;
    assert!(
        degraded.is_some(),
        "/readyz without Redis: {:?}, the README: {documented}",
        run("curl -s localhost:9901/readyz", &gateway)
    );
}

/// Every Rust block of docs/library.md is an example program shown as it is: the line that introduces the block
/// links `examples/NAME.rs`, and the block is that file, byte for byte. The examples are compiled with the tests,
/// so the page's code cannot rot; a snippet that is not an example fails here.
#[test]
fn the_library_page_shows_each_example_program_as_it_is() {
    let repo = Path::new(REPO);
    let page = std::fs::read_to_string(repo.join("docs/library.md")).expect("docs/library.md");
    let mut shown = Vec::new();
    let mut rest = page.as_str();
    while let Some(start) = rest.find("```rust\n") {
        let before = rest[..start].trim_end();
        let introduction = before.lines().last().unwrap_or("");
        let body = &rest[start + "```rust\n".len()..];
        let end = body.find("\n```").expect("the block's end") + 1;
        let name = introduction
            .split("(../examples/")
            .nth(1)
            .and_then(|link| link.split_once(')'))
            .map(|(file, _)| file)
            .unwrap_or_else(|| {
                panic!("a Rust block of docs/library.md not introduced by a link to its example: {introduction:?}")
            });
        let file = std::fs::read_to_string(repo.join("examples").join(name))
            .unwrap_or_else(|e| panic!("examples/{name}: {e}"));
        assert!(
            body[..end] == file,
            "docs/library.md shows examples/{name} otherwise than it is: copy the file into the page"
        );
        shown.push(name.to_owned());
        rest = &body[end..];
    }
    for example in [
        "ip_limits_redis.rs",
        "api_key_plans.rs",
        "layers_from_config.rs",
    ] {
        assert!(
            shown.iter().any(|name| name == example),
            "{example} is not shown: {shown:?}"
        );
    }
}

// === docs/responses.md, "One reading of every request" ===

/// How the test sends one request of a row of the table of refusals.
enum Send {
    /// HTTP/1.1 bytes to the gateway, whose answer is read.
    Gateway(Vec<u8>),
    /// HTTP/1.1 bytes to the admin listener.
    Admin(Vec<u8>),
    /// HTTP/2 (h2c) bytes to the gateway: the preface, SETTINGS, then a request on stream 1, whose answer is read.
    Http2(Vec<u8>),
    /// HTTP/1.1 bytes to the gateway, then the end of the client's writing, whose answer is read.
    HalfClosed(Vec<u8>),
    /// Bytes to the gateway after which it must close the connection.
    Closed(Vec<u8>),
}

/// The requests the test sends for one row, named by the row's first cell as docs/responses.md writes it, and the
/// backticked words of that cell that name things (settings, fields) rather than show bytes the requests carry.
struct Row {
    request: &'static str,
    /// Whether the upstream may see a request of the row (a body found malformed as it is streamed).
    reaches_upstream: bool,
    names: &'static [&'static str],
    cases: Vec<(&'static str, Send)>,
}

/// `GET {target}` on the gateway, with `extra` header lines.
fn get(target: &str, extra: &str) -> Send {
    Send::Gateway(format!("GET {target} HTTP/1.1\r\nHost: gw\r\n{extra}\r\n").into_bytes())
}

/// The preface and an empty SETTINGS frame.
fn h2_opening() -> Vec<u8> {
    [H2_PREFACE, &h2_frame(0x4, 0, 0, &[])].concat()
}

/// A JWT over `claims` written as given (a member may be named twice), signed with `key`.
fn token(key: &common::jwt::SigningKey, claims: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let header = format!(r#"{{"alg":"RS256","typ":"JWT","kid":"{}"}}"#, key.kid);
    let message = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key.key, key.alg).expect("sign");
    format!("{message}.{signature}")
}

/// The rows of the table as this test reads them: each documented item sent.
fn refusal_rows(jwt: &common::jwt::SigningKey) -> Vec<Row> {
    let exp = common::jwt::now() + 600;
    let bearer = |claims: String| format!("authorization: Bearer {}\r\n", token(jwt, &claims));
    let put = |path: &str, body: &str| {
        Send::Admin(
            format!(
                "PUT {path} HTTP/1.1\r\nHost: admin\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    };
    let mut authority_and_host = GET_API_BLOCK.to_vec();
    // `host: b`: a literal without indexing, its name the static table's entry 38.
    authority_and_host.extend([0x0f, 0x17, 0x01, b'b']);
    let mut unfinished = h2_opening();
    unfinished.extend(h2_frame(0x1, 0x1, 1, &GET_API_BLOCK[..4]));
    let mut h2_answered = h2_opening();
    h2_answered.extend(h2_frame(0x1, 0x1 | 0x4, 1, GET_API_BLOCK));
    // `POST /api` with a first piece of its body, and no more.
    let mut post_block = GET_API_BLOCK.to_vec();
    post_block[0] = 0x83;
    let mut h2_stalled = h2_frame(0x1, 0x4, 1, &post_block);
    h2_stalled.extend(h2_frame(0x0, 0, 1, b"abc"));
    let mut later_unfinished = h2_opening();
    later_unfinished.extend(h2_frame(0x1, 0x1 | 0x4, 1, GET_API_BLOCK));
    later_unfinished.extend(h2_frame(0x1, 0x1, 3, &GET_API_BLOCK[..4]));
    vec![
        Row {
            reaches_upstream: false,
            request: "HTTP/1.1 without `Host`, more than one `Host`, an invalid `Host` (user info, bad port, a name in brackets `[name]`), HTTP/2 `:authority` and `Host` naming different hosts",
            names: &[":authority"],
            cases: vec![
                ("no Host", Send::Gateway(b"GET /api HTTP/1.1\r\n\r\n".to_vec())),
                ("two Hosts", Send::Gateway(b"GET /api HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_vec())),
                ("user info", Send::Gateway(b"GET /api HTTP/1.1\r\nHost: user@a\r\n\r\n".to_vec())),
                ("bad port", Send::Gateway(b"GET /api HTTP/1.1\r\nHost: a:99999\r\n\r\n".to_vec())),
                ("[name]", Send::Gateway(b"GET /api HTTP/1.1\r\nHost: [name]\r\n\r\n".to_vec())),
                ("HTTP/2 :authority a, host b", Send::Http2(h2_frame(0x1, 0x1 | 0x4, 1, &authority_and_host))),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "a case variant of a standard method (`post /login`)",
            names: &[],
            cases: vec![("post /login", Send::Gateway(b"post /login HTTP/1.1\r\nHost: gw\r\n\r\n".to_vec()))],
        },
        Row {
            reaches_upstream: false,
            request: "`CONNECT` (`CONNECT host:port` included), unless a route names it in `methods`",
            names: &["CONNECT host:port", "methods"],
            cases: vec![
                ("CONNECT /api", Send::Gateway(b"CONNECT /api HTTP/1.1\r\nHost: gw\r\n\r\n".to_vec())),
                (
                    "CONNECT example.com:443",
                    Send::Gateway(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n".to_vec()),
                ),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "a JWT whose consumer claim is not a valid consumer id (1 to 128 of `A-Z a-z 0-9 . _ : @ -`, not `.` or `..`), or whose claims name a member twice",
            names: &["A-Z a-z 0-9 . _ : @ -", ".", ".."],
            cases: vec![
                (".", get("/api", &bearer(format!(r#"{{"sub":".","exp":{exp}}}"#)))),
                ("..", get("/api", &bearer(format!(r#"{{"sub":"..","exp":{exp}}}"#)))),
                ("a space", get("/api", &bearer(format!(r#"{{"sub":"a b","exp":{exp}}}"#)))),
                ("129 characters", get("/api", &bearer(format!(r#"{{"sub":"{}","exp":{exp}}}"#, "a".repeat(129))))),
                ("sub twice", get("/api", &bearer(format!(r#"{{"sub":"acme","sub":"root","exp":{exp}}}"#)))),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "an admin body that names a member twice or is not a JSON object, an admin consumer id `.` or `..`",
            names: &[],
            cases: vec![
                ("plan twice", put("/consumers/acme", r#"{"plan":"free","plan":"pro"}"#)),
                ("an array", put("/consumers/acme", "[]")),
                ("a string", put("/consumers/acme", r#""free""#)),
                (".", put("/consumers/.", r#"{"plan":"free"}"#)),
                ("..", put("/consumers/..", r#"{"plan":"free"}"#)),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "a path with a malformed escape (`/a%zz`), or a target that is not a path (`OPTIONS *`)",
            names: &[],
            cases: vec![
                ("/a%zz", get("/a%zz", "")),
                ("OPTIONS *", Send::Gateway(b"OPTIONS * HTTP/1.1\r\nHost: gw\r\n\r\n".to_vec())),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "a path with `%2F` (unless `server.escaped_slashes: keep`), `%5C`, `\\`, `%00`, or escapes that are not UTF-8",
            names: &["server.escaped_slashes: keep"],
            cases: vec![
                ("%2F", get("/api/a%2Fb", "")),
                ("%5C", get("/api/a%5Cb", "")),
                ("\\", get("/api/a\\b", "")),
                ("%00", get("/api/a%00b", "")),
                ("not UTF-8", get("/api/a%C3%28", "")),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "a key header or query parameter, or a credential, sent twice (a query name under any spelling: `k`, `K`, `k[]`, `%6B`, after `&` or `;`)",
            names: &[],
            cases: vec![
                ("key header", get("/api", "x-key: 1\r\nx-key: 2\r\n")),
                ("k", get("/api?k=1&k=2", "")),
                ("K", get("/api?k=1&K=2", "")),
                ("k[]", get("/api?k=1&k[]=2", "")),
                ("%6B", get("/api?k=1&%6B=2", "")),
                (";", get("/api?k=1;k=2", "")),
                ("api key", get("/api", "x-api-key: one\r\nx-api-key: two\r\n")),
                ("bearer", get("/api", "authorization: Bearer a\r\nauthorization: Bearer b\r\n")),
            ],
        },
        Row {
            reaches_upstream: true,
            request: "malformed framing: two different `Content-Length`s; a bad chunk size or a body cut short, found as the body is streamed (the upstream may have had the head)",
            names: &[],
            cases: vec![
                (
                    "chunk size zz",
                    Send::Gateway(b"POST /api HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n".to_vec()),
                ),
                (
                    "Content-Length 3 and 4",
                    Send::Gateway(b"POST /api HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_vec()),
                ),
                (
                    "10 bytes announced, 3 sent",
                    Send::HalfClosed(b"POST /api HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\nabc".to_vec()),
                ),
            ],
        },
        Row {
            reaches_upstream: true,
            request: "a request body that sends nothing more for `server.body_read_timeout` (30s), HTTP/1.1 or HTTP/2 (its upstream request is cancelled)",
            names: &["server.body_read_timeout"],
            cases: vec![
                (
                    "10 bytes announced, 3 sent",
                    Send::Gateway(b"POST /api HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\nabc".to_vec()),
                ),
                ("HTTP/2, a DATA frame and no end", Send::Http2(h2_stalled)),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "a head over `server.max_header_bytes`, however its bytes arrive",
            names: &["server.max_header_bytes"],
            cases: vec![("a 20 KiB field", get("/api", &format!("x-big: {}\r\n", "a".repeat(20_000))))],
        },
        Row {
            reaches_upstream: false,
            request: "a head that does not arrive within `server.header_read_timeout` of its first byte",
            names: &["server.header_read_timeout"],
            cases: vec![("half a head", Send::Closed(b"GET /api HTTP/1.1\r\nHo".to_vec()))],
        },
        Row {
            reaches_upstream: false,
            request: "HTTP/2: an opening (preface, SETTINGS, first request's headers) not finished within `server.header_read_timeout` of the accept, or a later header block (HEADERS without END_HEADERS) not finished within it",
            names: &["server.header_read_timeout"],
            cases: vec![
                ("the preface alone", Send::Closed(H2_PREFACE.to_vec())),
                ("preface and SETTINGS", Send::Closed(h2_opening())),
                ("the first HEADERS without END_HEADERS", Send::Closed(unfinished)),
                ("a later HEADERS without END_HEADERS", Send::Closed(later_unfinished)),
            ],
        },
        Row {
            reaches_upstream: false,
            request: "a keep-alive connection idle for `server.keepalive_timeout` (75s); over HTTP/2, no request in flight for that long",
            names: &["server.keepalive_timeout"],
            cases: vec![
                (
                    "idle after a request",
                    Send::Closed(b"GET /open HTTP/1.1\r\nHost: gw\r\n\r\n".to_vec()),
                ),
                ("HTTP/2, idle after a request", Send::Closed(h2_answered)),
            ],
        },
    ]
}

/// Sends `bytes` (then ends the writing side when `half_close`) and reads one HTTP/1.1 response: its head and the
/// body its `content-length` announces, without waiting for the connection to close.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8], half_close: bool) -> String {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    if half_close {
        stream.shutdown().await.expect("shutdown");
    }
    let read = common::http_client::read_answer(&mut stream);
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .unwrap_or_default()
}

/// The status and the body's `error` and `reason` of an HTTP/1.1 answer.
fn answer(response: &str) -> (String, Value) {
    let status = response.split(' ').nth(1).unwrap_or("").to_owned();
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Sends HTTP/2 `request` frames after the opening and reads stream 1's answer: its status (the `:status` is an
/// indexed static entry, 0x8c for 400) and its body.
async fn h2_answer(addr: std::net::SocketAddr, request: &[u8]) -> (String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(&[h2_opening(), request.to_vec()].concat())
        .await
        .expect("write");
    let (mut status, mut body) = (String::new(), Vec::new());
    loop {
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await.expect("a frame");
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        stream.read_exact(&mut payload).await.expect("a payload");
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        match (header[3], id) {
            (0x4, 0) if header[4] & 0x1 == 0 => {
                stream
                    .write_all(&h2_frame(0x4, 0x1, 0, &[]))
                    .await
                    .expect("ack");
            }
            (0x1, 1) => {
                let indexed = [(0x88, "200"), (0x8c, "400"), (0x8d, "404"), (0x8e, "500")]
                    .iter()
                    .find(|(byte, _)| payload.first() == Some(byte))
                    .map(|(_, code)| (*code).to_owned());
                // Another status is a literal on the name `:status` (static entry 8), with or without indexing, its
                // digits as they are or Huffman-coded (the encoder's choice: 408 comes coded).
                let literal = match payload.as_slice() {
                    [0x48 | 0x08, 0x03, a, b, c, ..] => {
                        Some(String::from_utf8_lossy(&[*a, *b, *c]).into_owned())
                    }
                    [0x48 | 0x08, 0x83, 0x68, 0x0f, 0x7f, ..] => Some("408".to_owned()),
                    _ => None,
                };
                status = indexed
                    .or(literal)
                    .unwrap_or_else(|| format!("? {payload:02x?}"));
                if header[4] & 0x1 != 0 {
                    break;
                }
            }
            (0x0, 1) => {
                body.extend(payload);
                if header[4] & 0x1 != 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Whether the gateway closes the connection after `bytes` within 5 s (its clocks run 1 s here).
async fn closes(addr: std::net::SocketAddr, bytes: &[u8]) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink))
        .await
        .is_ok()
}

/// The backticked words of a table cell outside parentheses, and those inside.
fn backticked(cell: &str) -> (Vec<String>, Vec<String>) {
    let (mut outside, mut inside) = (Vec::new(), Vec::new());
    let mut depth = 0;
    let mut parts = cell.split('`');
    while let Some(text) = parts.next() {
        depth += text.matches('(').count();
        depth -= text.matches(')').count().min(depth);
        if let Some(word) = parts.next() {
            if depth > 0 {
                inside.push(word.to_owned());
            } else {
                outside.push(word.to_owned());
            }
        }
    }
    (outside, inside)
}

/// docs/responses.md's table of refusals, row by row: each request the row describes is sent to a gateway (and
/// its admin listener), and answers with the row's status and one of its body `error`s (and `reason`s); every
/// documented `error` and `reason` is answered by some request, every backticked example of the row is in the
/// bytes sent (or is a setting the row names), and a "connection closed" row closes the connection. A row the
/// test does not know, or a row it knows that the page lost, fails.
#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_in_the_responses_page_is_what_the_gateway_answers() {
    let page = std::fs::read_to_string(Path::new(REPO).join("docs/responses.md"))
        .expect("docs/responses.md");
    let section = section(&page, "## One reading of every request");
    let documented: Vec<Vec<String>> = section
        .lines()
        .filter(|line| line.starts_with("| ") && !line.starts_with("| request |"))
        .map(|line| {
            // Cells split on ` | `: a `\|` inside a cell is not a separator.
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect();
    assert!(documented.len() >= 10, "the table: {documented:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let jwt = common::jwt::rsa_key("k1");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, common::jwt::jwks(&[&jwt])).expect("write the JWKS");
    let upstream = common::upstream::Upstream::start().await;
    let yaml = format!(
        r#"store: {{ backend: memory }}
server: {{ header_read_timeout: 1s, keepalive_timeout: 1s, body_read_timeout: 1s, max_header_bytes: 16384 }}
upstreams:
  backend: {{ targets: ["{upstream}"] }}
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
    - jwt: {{ algorithms: [RS256], jwks_file: "{jwks}" }}
  plans:
    free: {{ limits: [] }}
    pro: {{ limits: [] }}
routes:
  - name: open
    match: {{ path: /open }}
    respond: {{ status: 200 }}
    consumers: off
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits:
      - {{ name: per-key, key: [header:x-key], missing: skip, algorithm: sliding_window, limit: 100, period: 1m }}
      - {{ name: per-k, key: [query:k], missing: skip, algorithm: sliding_window, limit: 100, period: 1m }}
"#,
        upstream = upstream.url(),
        jwks = jwks.display()
    );
    let gateway = common::start_gateway(&yaml).await;
    let admin = common::serve_admin(&gateway, None).await;
    let admin: std::net::SocketAddr = admin
        .trim_start_matches("http://")
        .parse()
        .expect("admin address");

    let rows = refusal_rows(&jwt);
    for row in &rows {
        assert!(
            documented.iter().any(|cells| cells[0] == row.request),
            "docs/responses.md lost this row, or wrote it otherwise:\n{}",
            row.request
        );
    }
    for cells in &documented {
        let [request, status, errors] = &cells[..] else {
            panic!("a row of three cells: {cells:?}");
        };
        let row = rows.iter().find(|row| row.request == request).unwrap_or_else(|| {
            panic!("a row of docs/responses.md this test does not send: write its requests in refusal_rows\n{request}")
        });
        let sent: Vec<u8> = row
            .cases
            .iter()
            .flat_map(|(_, send)| match send {
                Send::Gateway(bytes)
                | Send::Admin(bytes)
                | Send::Http2(bytes)
                | Send::HalfClosed(bytes)
                | Send::Closed(bytes) => bytes.clone(),
            })
            .collect();
        let sent = String::from_utf8_lossy(&sent);
        let (examples, in_parentheses) = backticked(request);
        for example in examples.iter().chain(&in_parentheses) {
            assert!(
                sent.contains(example.as_str()) || row.names.contains(&example.as_str()),
                "`{example}` of the row is in no request the test sends:\n{request}"
            );
        }
        if status.starts_with("connection closed") {
            for (what, send) in &row.cases {
                let Send::Closed(bytes) = send else {
                    panic!("{what}: a closed-connection row sends Send::Closed");
                };
                assert!(
                    closes(gateway.addr, bytes).await,
                    "{what}: still open after 5 s\n{request}"
                );
            }
            continue;
        }
        let hits = settled_hits(&upstream).await;
        let (allowed_errors, allowed_reasons) = backticked(errors);
        let (mut seen_errors, mut seen_reasons) = (Vec::new(), Vec::new());
        for (what, send) in &row.cases {
            let (got_status, body) = match send {
                Send::Gateway(bytes) => answer(&exchange(gateway.addr, bytes, false).await),
                Send::HalfClosed(bytes) => answer(&exchange(gateway.addr, bytes, true).await),
                Send::Admin(bytes) => answer(&exchange(admin, bytes, false).await),
                Send::Http2(bytes) => h2_answer(gateway.addr, bytes).await,
                Send::Closed(_) => panic!("{what}: only a closed-connection row closes"),
            };
            let error = body["error"].as_str().unwrap_or("").to_owned();
            let reason = body["reason"].as_str().map(str::to_owned);
            assert!(
                &got_status == status && allowed_errors.contains(&error),
                "{what}: {got_status} {body}; the page says {status} {errors}\n{request}"
            );
            if !allowed_reasons.is_empty() {
                let reason = reason.unwrap_or_default();
                assert!(
                    allowed_reasons.contains(&reason),
                    "{what}: reason {reason:?}; the page says {errors}"
                );
                seen_reasons.push(reason);
            }
            seen_errors.push(error);
        }
        assert!(
            row.reaches_upstream || settled_hits(&upstream).await == hits,
            "a refused request reached the upstream:\n{request}"
        );
        for documented in allowed_errors.iter().chain(&allowed_reasons) {
            assert!(
                seen_errors.contains(documented) || seen_reasons.contains(documented),
                "no request of the row is answered `{documented}`:\n{request}"
            );
        }
    }
    // The rows' "(75s)" and "(30s)" are the defaults.
    let defaults = common::config("").server;
    for (name, default) in [
        ("keepalive_timeout", defaults.keepalive_timeout),
        ("body_read_timeout", defaults.body_read_timeout),
    ] {
        assert!(
            section.contains(&format!("`server.{name}` ({}s)", default.as_secs())),
            "{name}'s default is {default:?}"
        );
    }
}

/// Every series the program registers (a `"tollgate_..."` name in its source) is a row of docs/operations.md's
/// table of metrics, and every row is a series the program registers.
#[test]
fn the_metrics_table_lists_every_series_the_program_has() {
    fn sources(dir: &Path, into: &mut String) {
        for entry in std::fs::read_dir(dir).expect("read src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, into);
            } else if path.extension().is_some_and(|e| e == "rs") {
                into.push_str(&std::fs::read_to_string(&path).expect("read a source"));
            }
        }
    }
    let mut source = String::new();
    for package in ["src", "crates/limiter/src"] {
        sources(&Path::new(REPO).join(package), &mut source);
    }
    let mut registered: Vec<&str> = source
        .split("\"tollgate_")
        .skip(1)
        .filter_map(|rest| {
            let name = &rest[..rest.find('"')?];
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_')
                .then_some(name)
        })
        .collect();
    registered.sort_unstable();
    registered.dedup();
    let page =
        std::fs::read_to_string(Path::new(REPO).join("docs/operations.md")).expect("operations.md");
    let mut documented: Vec<&str> = section(&page, "## Metrics")
        .lines()
        .filter_map(|line| line.strip_prefix("| `tollgate_")?.split('`').next())
        .collect();
    documented.sort_unstable();
    assert!(registered.len() >= 10, "{registered:?}");
    assert_eq!(
        documented, registered,
        "docs/operations.md's metrics table against the source"
    );
}

// === docs/responses.md, "The gateway's own answers" ===

/// A response read back: status, fields (names in lower case) and the body as JSON.
struct Answer {
    status: String,
    fields: Vec<(String, String)>,
    body: Value,
}

fn parse_answer(text: &str) -> Answer {
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .unwrap_or("")
        .to_owned();
    let fields = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Answer {
        status,
        fields,
        body: serde_json::from_str(body).unwrap_or(Value::Null),
    }
}

/// A gateway on the memory store (or Redis at `store`) for `routes`, with `consumers` and `server` settings.
async fn gateway_for(
    store: &str,
    server: &str,
    consumers: &str,
    routes: &str,
) -> common::TestGateway {
    let yaml = format!("store: {store}\nserver: {server}\n{consumers}\nroutes:\n{routes}");
    common::start_gateway_without_waiting(&yaml).await
}

/// The upstream's hits once none is still landing: a request the gateway forwarded and then refused (a body that
/// stopped coming: 408) can reach the upstream's count after the gateway answered, and must not be taken for the
/// next row's.
async fn settled_hits(upstream: &common::upstream::Upstream) -> usize {
    let mut last = upstream.hits();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = upstream.hits();
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Each row of docs/responses.md's table of the gateway's own answers, provoked: the status, the body (a `...`
/// standing for any text, `N` for any number) and the fields the row names (`with `Name: value``; a name alone
/// for any value) are what the gateway answers, and every answer is JSON. A row the test cannot provoke fails.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateways_own_answers_are_as_the_responses_page_shows() {
    let page = std::fs::read_to_string(Path::new(REPO).join("docs/responses.md"))
        .expect("docs/responses.md");
    let table = section(&page, "## The gateway's own answers");
    let rows: Vec<&str> = table
        .lines()
        .filter(|line| {
            line.starts_with("| ") && line.as_bytes().get(2).is_some_and(u8::is_ascii_digit)
        })
        .collect();
    assert!(rows.len() >= 12, "the table: {rows:?}");

    let upstream = common::upstream::Upstream::start().await;
    let closed = ReservedPort::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let jwt = common::jwt::rsa_key("k1");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, common::jwt::jwks(&[&jwt])).expect("write the JWKS");

    let api_keys = r#"consumers:
  identify: [{ api_key: { header: x-api-key } }]
  keys: [{ key: blocked-key, consumer: blocky }]
  failed_credentials: { limit: 2, period: 1m }"#;
    let main = gateway_for(
        "{ backend: memory }",
        "{ max_body_bytes: 10, body_read_timeout: 1s, max_header_bytes: 16384 }",
        api_keys,
        &format!(
            r#"  - name: required
    match: {{ path: /required }}
    respond: {{ status: 200 }}
    consumers: required
  - name: open
    match: {{ path_prefix: /open }}
    upstream: backend
    limits:
      - {{ name: per-k, key: [query:k], missing: skip, algorithm: sliding_window, limit: 100, period: 1m }}
upstreams:
  backend: {{ targets: ["{}"] }}
"#,
            upstream.url()
        ),
    )
    .await;
    // Failed credentials counted apart, so that the rows may come in any order.
    let failing = gateway_for(
        "{ backend: memory }",
        "{}",
        api_keys,
        "  - { name: open, match: { path_prefix: /open }, respond: { status: 200 } }\n",
    )
    .await;
    let admin = common::serve_admin(&main, None).await;
    let blocked = common::http_client::client()
        .put(format!("{admin}/consumers/blocky"))
        .body(r#"{"blocked":true}"#)
        .send()
        .await
        .expect("block a consumer");
    assert_eq!(blocked.status(), 200);
    let tokens = gateway_for(
        "{ backend: memory }",
        "{}",
        &format!(
            "consumers:\n  identify: [{{ jwt: {{ algorithms: [RS256], jwks_file: \"{}\" }} }}]",
            jwks.display()
        ),
        "  - { name: required, match: { path: /required }, respond: { status: 200 }, consumers: required }\n",
    )
    .await;
    let api = |target: String| {
        format!("  - name: api\n    match: {{ path_prefix: / }}\n    upstream: backend\n    limits: [{{ name: l, key: ip, algorithm: sliding_window, limit: 100, period: 1m }}]\nupstreams:\n  backend: {{ targets: [\"{target}\"], timeout: 1s }}\n")
    };
    let deny = gateway_for(
        &format!(
            "{{ backend: redis, url: \"redis://{}\", on_error: deny }}",
            closed.addr()
        ),
        "{}",
        "",
        &api(upstream.url()),
    )
    .await;
    let unreachable = gateway_for(
        "{ backend: memory }",
        "{}",
        "",
        &api(format!("http://{}", closed.addr())),
    )
    .await;
    let slow = gateway_for("{ backend: memory }", "{}", "", &api(upstream.url())).await;
    // Consumers kept in a Redis that never answers: the directory is never read, and a key cannot be looked up.
    let directory_down = gateway_for(
        &format!("{{ backend: redis, url: \"redis://{}\" }}", closed.addr()),
        "{}",
        "consumers:\n  identify: [{ api_key: { header: x-api-key } }]",
        "  - { name: api, match: { path_prefix: /x }, respond: { status: 200 } }\n",
    )
    .await;

    let get = |target: &str, extra: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: gw\r\n{extra}\r\n").into_bytes()
    };
    let expired = token(
        &jwt,
        &format!(r#"{{"sub":"acme","exp":{}}}"#, common::jwt::now() - 3600),
    );
    let mut checked = Vec::new();
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        let (status, body) = (cells[0], cells[1]);
        let documented_body = body.split('`').nth(1).expect("a body in backticks");
        let documented: Value =
            serde_json::from_str(&documented_body.replace(":N}", ":0}")).expect("the body is JSON");
        let error = documented["error"].as_str().unwrap_or("");
        let reason = documented["reason"].as_str().unwrap_or("");
        let exchange_with = |addr, bytes: Vec<u8>, half_close| async move {
            parse_answer(&exchange(addr, &bytes, half_close).await)
        };
        let got = match (status, error, reason) {
            ("404", "no_route", _) => exchange_with(main.addr, get("/nowhere", ""), false).await,
            ("400", "bad_request", _) => exchange_with(main.addr, get("/open/a%zz", ""), false).await,
            ("405", "method_not_allowed", _) => {
                exchange_with(main.addr, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n".to_vec(), false).await
            }
            ("400", "ambiguous_key", _) => exchange_with(main.addr, get("/open?k=1&k=2", ""), false).await,
            ("401", _, "credential_required") => {
                // The JWT challenge the row names in parentheses.
                let bearer = exchange_with(tokens.addr, get("/required", ""), false).await;
                let challenge = r#"Bearer realm="tollgate""#;
                assert!(body.contains(challenge), "{body}");
                assert!(
                    bearer.fields.iter().any(|(n, v)| n == "www-authenticate" && v == challenge),
                    "{:?}",
                    bearer.fields
                );
                exchange_with(main.addr, get("/required", ""), false).await
            }
            ("401", _, "unknown_key") => {
                let challenge = r#"Bearer realm="tollgate", error="invalid_token", error_description="expired""#;
                assert!(body.contains(&format!("`{challenge}`")), "{body}");
                let refused = exchange_with(
                    tokens.addr,
                    get("/required", &format!("authorization: Bearer {expired}\r\n")),
                    false,
                )
                .await;
                assert_eq!(refused.status, "401");
                assert_eq!(refused.body["reason"], "expired");
                assert!(
                    refused.fields.iter().any(|(n, v)| n == "www-authenticate" && v == challenge),
                    "{:?}",
                    refused.fields
                );
                exchange_with(main.addr, get("/required", "x-api-key: nope\r\n"), false).await
            }
            ("403", _, "consumer_blocked") => {
                exchange_with(main.addr, get("/required", "x-api-key: blocked-key\r\n"), false).await
            }
            ("429", "too_many_failed_credentials", _) => {
                let mut answer = None;
                for i in 0..5 {
                    let got = exchange_with(failing.addr, get("/open", &format!("x-api-key: bad-{i}\r\n")), false).await;
                    if got.status == "429" {
                        answer = Some(got);
                        break;
                    }
                }
                answer.expect("429 after the failed credentials' limit")
            }
            ("413", "body_too_large", _) => {
                exchange_with(main.addr, b"POST /open HTTP/1.1\r\nHost: gw\r\nContent-Length: 20\r\n\r\n01234567890123456789".to_vec(), false).await
            }
            ("408", "body_timeout", _) => {
                exchange_with(main.addr, b"POST /open HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nab".to_vec(), false).await
            }
            ("431", "header_too_large", _) => {
                exchange_with(main.addr, get("/open", &format!("x-big: {}\r\n", "a".repeat(20_000))), false).await
            }
            ("503", "limiter_unavailable", _) => exchange_with(deny.addr, get("/x", ""), false).await,
            ("503", "consumer_directory_unavailable", _) => {
                exchange_with(directory_down.addr, get("/x", "x-api-key: any-key\r\n"), false).await
            }
            ("502", "upstream_unreachable", _) => exchange_with(unreachable.addr, get("/x", ""), false).await,
            ("504", "upstream_timeout", _) => exchange_with(slow.addr, get("/x/slow", ""), false).await,
            other => panic!("a row of the gateway's own answers this test does not provoke: {other:?}\n{row}"),
        };
        assert!(
            got.status == status && json_matches(&documented, &got.body, ""),
            "{status} {documented}: the gateway answered {} {}",
            got.status,
            got.body
        );
        let field = |name: &str| {
            got.fields
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            field("content-type").as_deref(),
            Some("application/json"),
            "{row}"
        );
        // "with `Name: value`" (the first such field of the row) or "with `Name`".
        if let Some((_, rest)) = body.split_once(" with `") {
            let named = rest.split('`').next().unwrap_or("");
            let got_value = field(named.split(':').next().unwrap_or(named));
            match named.split_once(": ") {
                Some((_, value)) => assert_eq!(got_value.as_deref(), Some(value), "{row}"),
                None => assert!(got_value.is_some(), "no {named}: {row}"),
            }
        }
        checked.push(format!("{status} {error}"));
    }
    assert!(checked.len() >= 12, "{checked:?}");
}

// === Config examples ===

/// Every YAML example in README.md and docs/ is a config the gateway accepts, as `tollgate check` would read it
/// (`${TOLLGATE_ADMIN_TOKEN}` set, other variables at their defaults). A route's `limits:` shown alone is read
/// inside a route; an example may name an upstream or a file it does not show (those problems alone are
/// forgiven). A key renamed in the program, or misspelt in the docs, fails here.
#[test]
fn every_config_example_in_the_docs_is_accepted() {
    let repo = Path::new(REPO);
    let mut pages = vec![repo.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(repo.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut checked = 0;
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("a page");
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```yaml\n") {
            let line = text.len() - rest.len() + start;
            let line = text[..line].lines().count() + 1;
            let body = &rest[start + "```yaml\n".len()..];
            let end = body.find("```").expect("the block's end");
            let example = &body[..end];
            rest = &body[end..];
            let text = if example.starts_with("    limits:") {
                format!("routes:\n  - name: r\n    respond: {{}}\n{example}")
            } else {
                example.to_owned()
            };
            let env = |name: &str| (name == "TOLLGATE_ADMIN_TOKEN").then(|| "a-token".to_owned());
            let shown = page.strip_prefix(repo).unwrap_or(&page);
            // Problems read `docs/page.md:LINE+row:column`: the block starts at LINE.
            let name = format!("{}:{line}+", shown.display());
            if let Err(error) = tollgate::config::parse_with_env(&text, Path::new(&name), env) {
                let unforgiven: Vec<String> = error
                    .problems()
                    .iter()
                    .map(ToString::to_string)
                    .filter(|problem| {
                        let elsewhere = problem.contains("unknown upstream")
                            && problem.contains("no upstreams are defined");
                        !elsewhere && !problem.contains("cannot read")
                    })
                    .collect();
                assert!(
                    unforgiven.is_empty() && !error.problems().is_empty(),
                    "the example at {name} is refused:\n{error}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} YAML examples found");
}

// === docs/operations.md, the admin API's worked examples ===

/// `pattern` with `*` standing for any text matches the whole of `text`.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < t.len() {
        if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if i < p.len() && p[i] == t[j] {
            i += 1;
            j += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// What the docs show as a command's output, as a [`glob`] pattern: `…` (what the docs leave out), numbers and
/// hex digests (times, counts, ids, keys) stand for any text.
fn output_pattern(shown: &str) -> String {
    let shown = shown.replace("…(64 hex digits)", "…").replace('…', "*");
    let mut pattern = String::new();
    let mut chars = shown.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            // The whole run of digits and hex letters: a number, a digest, the rest of an id.
            while chars.peek().is_some_and(char::is_ascii_hexdigit) {
                chars.next();
            }
            pattern.push('*');
        } else {
            pattern.push(c);
        }
    }
    pattern
}

/// The first two console blocks of docs/operations.md (reading and resetting a key; a consumer's settings and
/// keys), run as written against the binary with the shipped gateway.yaml (its admin token and Redis given
/// through the variables it reads, 127.0.0.1 trusted as a proxy so that the example's client, 203.0.113.7, has
/// made requests first): each command prints what the page shows, up to times, counts, ids and what the page
/// elides with `…`. An id the page shows (`k_3f9a1c2b`) stands, in later commands, for the one printed.
#[test]
fn the_admin_api_examples_print_what_operations_md_shows() {
    let page =
        std::fs::read_to_string(Path::new(REPO).join("docs/operations.md")).expect("operations.md");
    let blocks: Vec<&str> = page
        .split("```console\n")
        .skip(1)
        .take(2)
        .map(|rest| &rest[..rest.find("```").expect("the block's end")])
        .collect();

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped =
        std::fs::read_to_string(Path::new(REPO).join("gateway.yaml")).expect("gateway.yaml");
    let trusting = shipped.replace("trusted_proxies: []", "trusted_proxies: [127.0.0.1]");
    assert_ne!(trusting, shipped, "gateway.yaml's trusted_proxies line");
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, trusting).expect("write the config");
    let mut command = Command::new(BIN);
    command
        .arg("--config")
        .arg(&config)
        .env("TOLLGATE_LISTEN", "127.0.0.1:0")
        .env("TOLLGATE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("TOLLGATE_ADMIN_TOKEN", "an-admin-token")
        .env("REDIS_URL", redis.url())
        .env("UPSTREAM_URL", "http://127.0.0.1:9")
        .env_remove("TOLLGATE_CONFIG");
    let gateway = Tollgate::spawn(command);
    for _ in 0..3 {
        run(
            "curl -s -o /dev/null -H 'x-forwarded-for: 203.0.113.7' localhost:8080/api/x",
            &gateway,
        )
        .expect("a request from the example's client");
    }

    let mut renamed: Vec<(String, String)> = Vec::new();
    let mut checked = 0;
    for block in blocks {
        // Commands start with `$ ` and go on over lines ending in `\` or `|`; the rest is their output, a long
        // JSON document wrapped onto lines that begin with a space.
        let mut steps: Vec<(String, String)> = Vec::new();
        let mut continued = false;
        for line in block.lines() {
            if let Some(command) = line.strip_prefix("$ ") {
                steps.push((command.to_owned(), String::new()));
            } else if continued {
                let step = steps.last_mut().expect("a command");
                step.0.push('\n');
                step.0.push_str(line);
            } else {
                let step = steps.last_mut().expect("a command before its output");
                step.1.push_str(line.strip_prefix(' ').unwrap_or(line));
            }
            continued = line.ends_with('\\') || line.ends_with('|');
        }
        // The shell has the token the gateway was given, as the operator's would.
        let mut env = "TOLLGATE_ADMIN_TOKEN=an-admin-token; ".to_owned();
        for (command, shown) in steps {
            let mut command = command.clone();
            for (shown_id, printed_id) in &renamed {
                command = command.replace(shown_id.as_str(), printed_id);
            }
            if command.starts_with("H=") {
                // A variable for the commands after it.
                env.push_str(&format!("{command}; "));
                continue;
            }
            let printed =
                run(&format!("{env}{command}"), &gateway).unwrap_or_else(|e| panic!("{e}"));
            let printed = printed.trim_end();
            assert!(
                glob(&output_pattern(&shown), printed),
                "`{command}` printed:\n{printed}\ndocs/operations.md shows:\n{shown}"
            );
            if let (Some(shown_id), Some(printed_id)) = (
                shown
                    .split("\"id\":\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next()),
                printed
                    .split("\"id\":\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next()),
            ) {
                renamed.push((shown_id.to_owned(), printed_id.to_owned()));
            }
            checked += 1;
        }
    }
    assert!(checked >= 7, "only {checked} commands found");
}
