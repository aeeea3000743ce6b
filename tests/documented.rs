//! The docs' promises read out of the markdown and checked against the program: the README's tour run as its
//! commands are written (curl against the binary running the shipped gateway.yaml, with a real Redis and a real
//! upstream), and every row of docs/responses.md's table of refusals sent to a gateway. Editing the docs without
//! the program, or the program without the docs, fails here.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use axum::Router;
use common::binary::{Tollgate, BIN};
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
