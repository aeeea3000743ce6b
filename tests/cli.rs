//! The `tollgate` binary: `check`, exit codes, located config errors, and several processes sharing one Redis.

mod common;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use common::binary::{Tollgate, BIN};
use common::eventually;
use common::http_client::client;
use common::redis::RedisServer;
use common::upstream::Upstream;

fn write_config(dir: &tempfile::TempDir, name: &str, yaml: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    let mut file = std::fs::File::create(&path).expect("create config");
    file.write_all(yaml.as_bytes()).expect("write config");
    path
}

fn tollgate(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .expect("run tollgate")
}

#[test]
fn check_reports_a_located_error_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "\
store:
  backend: memory
routes:
  - name: demo
    match: { path_prefix: /demo }
    respond: { status: 200 }
    limits:
      - name: per-ip
        key: ip
        algorithm: sliding_window
        limit: 10
        period: 1 minute
";
    let path = write_config(&dir, "broken.yaml", yaml);
    let output = tollgate(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!(
        "{}:12:9: routes[0].limits[0].period: invalid duration \"1 minute\" (use 250ms, 1s, 1m, 1h, 1d)",
        path.display()
    );
    assert!(
        stderr.contains(&expected),
        "stderr:\n{stderr}\nexpected:\n{expected}"
    );
}

#[test]
fn an_hs256_secret_shorter_than_the_hash_is_a_located_error() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "consumers:\n  identify:\n    - jwt: { algorithms: [HS256], secret_env: TEST_JWT_SECRET }\n";
    let path = write_config(&dir, "jwt.yaml", yaml);
    let check = |secret: &str| {
        Command::new(BIN)
            .args(["check", "--config", path.to_str().unwrap()])
            .env("TEST_JWT_SECRET", secret)
            .output()
            .expect("run tollgate")
    };
    let short = check("twelve-bytes");
    assert_eq!(short.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert!(
        stderr.contains("jwt.yaml:3:35: consumers.identify[0].jwt.secret_env: the secret in TEST_JWT_SECRET is 12 bytes; HS256 needs at least 32"),
        "{stderr}"
    );
    assert_eq!(check(&"s".repeat(32)).status.code(), Some(0));
}

#[test]
fn unknown_keys_are_rejected_with_their_location() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "store:\n  backend: memory\n  timout: 25ms\n";
    let path = write_config(&dir, "typo.yaml", yaml);
    let output = tollgate(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("typo.yaml:3:"), "{stderr}");
    assert!(stderr.contains("timout"), "{stderr}");
}

#[test]
fn numbers_past_what_the_stores_carry_exactly_are_located_errors() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let yaml = r#"store: { backend: memory }
routes:
  - name: a
    match: { path_prefix: /a }
    respond: { status: 200, body: "ok" }
    limits:
      - { name: huge, key: ip, algorithm: fixed_window, limit: 9223372036854775807, period: 1m }
      - { name: long, key: ip, algorithm: fixed_window, limit: 10, period: 106751991168d }
      - { name: log, key: ip, algorithm: sliding_log, limit: 1000000, period: 1m, cost: 1000000 }
"#;
    let path = write_config(&dir, "big.yaml", yaml);
    let output = tollgate(&["check", "--config", path.to_str().expect("utf-8 path")]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for expected in [
        "big.yaml:7:9: routes[0].limits[0]: limit is too large: 9223372036854775807 exceeds 4503599627370496",
        "big.yaml:8:9: routes[0].limits[1]: period (in ms) is too large",
        "big.yaml:9:9: routes[0].limits[2]: limit 1000000 is too large for sliding_log",
        "use sliding_window",
    ] {
        assert!(stderr.contains(expected), "{stderr}\nexpected: {expected}");
    }
}

#[test]
fn check_prints_routes_and_limits_of_the_shipped_config() {
    let output = tollgate(&[
        "check",
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.yaml"),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in ["demo", "api", "token_bucket", "per-ip"] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

/// The README shows `tollgate check`'s output for the shipped config: it is what the binary prints, byte for byte,
/// run from the repository with none of the config's variables set.
#[test]
fn the_readme_check_output_is_what_check_prints() {
    let repo = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{repo}/README.md")).expect("README.md");
    let command = "$ ./target/release/tollgate check --config gateway.yaml\n";
    let start = readme
        .find(command)
        .expect("the check example in README.md")
        + command.len();
    let documented = &readme[start..start + readme[start..].find("```").expect("end of block")];
    let mut check = Command::new(BIN);
    check
        .args(["check", "--config", "gateway.yaml"])
        .current_dir(repo);
    for variable in [
        "TOLLGATE_CONFIG",
        "TOLLGATE_LISTEN",
        "TOLLGATE_ADMIN_LISTEN",
        "TOLLGATE_ADMIN_TOKEN",
        "REDIS_URL",
        "UPSTREAM_URL",
    ] {
        check.env_remove(variable);
    }
    let output = check.output().expect("run tollgate check");
    assert_eq!(String::from_utf8_lossy(&output.stdout), documented);
}

#[test]
fn version_says_what_the_build_was_made_from() {
    let output = tollgate(&["--version"]);
    assert!(output.status.success());
    let printed = String::from_utf8_lossy(&output.stdout);
    // The test builds are debug builds: build.rs records a commit only in release builds (docs/operations.md).
    assert_eq!(
        printed.trim(),
        format!(
            "tollgate {} (debug build, no commit recorded)",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// Runs `git args` in `dir`.
fn git(dir: &std::path::Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@127.0.0.1"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git")
        .status;
    assert!(status.success(), "git {args:?}");
}

#[test]
fn a_release_build_records_its_commit_and_whether_its_sources_were_modified() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("build-script");
    // The rustc beside the cargo running the tests (rustup puts both on the PATH).
    let compiled = Command::new("rustc")
        .args(["--edition", "2021", "-o"])
        .arg(&script)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/build.rs"))
        .status()
        .expect("run rustc");
    assert!(compiled.success());
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("src")).expect("src");
    let recorded = |profile: &str| -> String {
        let output = Command::new(&script)
            .current_dir(&tree)
            .env("PROFILE", profile)
            .output()
            .expect("run the build script");
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        printed
            .lines()
            .find_map(|line| line.strip_prefix("cargo:rustc-env=TOLLGATE_BUILD="))
            .expect("TOLLGATE_BUILD set")
            .to_owned()
    };
    assert_eq!(recorded("release"), "no git commit");
    std::fs::write(tree.join("src/main.rs"), "fn main() {}\n").expect("write");
    git(&tree, &["init", "-q"]);
    git(&tree, &["add", "."]);
    git(&tree, &["commit", "-q", "-m", "one"]);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&tree)
        .output()
        .expect("rev-parse");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert_eq!(recorded("release"), format!("commit {head}"));
    // A doc changed leaves the binary's sources as committed; a source changed does not.
    std::fs::write(tree.join("README.md"), "notes\n").expect("write");
    git(&tree, &["add", "README.md"]);
    assert_eq!(recorded("release"), format!("commit {head}"));
    std::fs::write(tree.join("src/main.rs"), "fn main() { }\n").expect("write");
    assert_eq!(recorded("release"), format!("commit {head}, modified"));
    assert_eq!(recorded("debug"), "debug build, no commit recorded");
}

#[test]
fn missing_config_file_exits_2_and_bad_arguments_exit_2() {
    let output = tollgate(&["check", "--config", "/nonexistent/tollgate.yaml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/tollgate.yaml"));
    assert_eq!(tollgate(&["--no-such-flag"]).status.code(), Some(2));
}

#[test]
fn port_in_use_exits_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nadmin:\n  listen: 127.0.0.1:0\nstore:\n  backend: memory\nroutes: []\n"
    );
    let path = write_config(&dir, "busy.yaml", &yaml);
    let output = tollgate(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn access_log_writes_one_json_line_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nstore:\n  backend: memory\nroutes:\n  - name: demo\n    match: { path_prefix: /demo }\n    respond: { status: 200, body: hi }\n";
    let path = write_config(&dir, "access.yaml", yaml);
    let mut command = Tollgate::command(&path);
    command
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info");
    let gateway = Tollgate::spawn(command);
    let response = client()
        .get(gateway.url("/demo/x"))
        .header("x-request-id", "abc123")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let access_lines = || -> Vec<serde_json::Value> {
        gateway
            .log()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["target"] == "tollgate::access")
            .collect()
    };
    eventually(Duration::from_secs(10), async || !access_lines().is_empty()).await;
    let lines = access_lines();
    assert_eq!(lines.len(), 1, "{}", gateway.log());
    let fields = &lines[0]["fields"];
    assert_eq!(fields["method"], "GET");
    assert_eq!(fields["path"], "/demo/x");
    assert_eq!(fields["route"], "demo");
    assert_eq!(fields["status"], 200);
    assert_eq!(fields["client"], "127.0.0.1");
    assert_eq!(fields["request_id"], "abc123");
    let duration = fields["duration_us"].as_u64().expect("duration_us, whole");
    assert!((1..10_000_000).contains(&duration), "{duration}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut processes = Vec::new();
    for i in 0..3 {
        let yaml = format!(
            r#"listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
store:
  backend: redis
  url: {redis}
  timeout: 1s
  on_error: deny
upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits:
      - name: global
        key: route
        algorithm: sliding_log
        limit: 100
        period: 1m
"#,
            redis = redis.url(),
            upstream = upstream.url(),
        );
        let path = write_config(&dir, &format!("g{i}.yaml"), &yaml);
        let mut command = Tollgate::command(&path);
        command.env("RUST_LOG", "warn");
        processes.push(Tollgate::spawn(command));
    }

    // 300 requests, 100 to each process, 25 at a time per process.
    let client = client();
    let mut tasks = Vec::new();
    for process in &processes {
        for _ in 0..25 {
            let client = client.clone();
            let url = process.url("/api");
            tasks.push(tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..4 {
                    let url = url.clone();
                    statuses.push(
                        client
                            .get(url)
                            .send()
                            .await
                            .expect("request")
                            .status()
                            .as_u16(),
                    );
                }
                statuses
            }));
        }
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(statuses.len(), 300);
    assert_eq!(admitted, 100, "statuses: {statuses:?}");
    assert_eq!(denied, 200);
    assert_eq!(upstream.hits(), 100);
}

#[test]
fn pretty_logs_to_a_pipe_carry_no_colour_codes() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        &dir,
        "plain.yaml",
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nstore:\n  backend: memory\nroutes:\n  - name: r\n    match: { path_prefix: / }\n    respond: { status: 200 }\n",
    );
    for no_color in [None, Some("1")] {
        let mut command = Command::new(BIN);
        command
            .args(["run", "--config"])
            .arg(&config)
            .env_remove("TOLLGATE_CONFIG")
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        match no_color {
            Some(value) => command.env("NO_COLOR", value),
            None => command.env_remove("NO_COLOR"),
        };
        let mut child = command.spawn().expect("spawn tollgate");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let listening = line.contains("tollgate listening");
            lines.push(line);
            if listening {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let text = lines.join("\n");
        assert!(text.contains("tollgate listening"), "{text}");
        // stderr is a pipe here, as under docker, systemd or a log shipper: no escape codes in the text.
        assert!(!text.contains('\u{1b}'), "NO_COLOR={no_color:?}: {text:?}");
    }
}

/// The lines of docs/configuration.md's error example, as `tollgate check` prints them for the files it describes:
/// the shipped gateway.yaml with the reported field's value written `1 minute`, and a file with `store:` misspelt
/// on its second line.
#[test]
fn the_documented_error_examples_are_what_check_prints() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs =
        std::fs::read_to_string(repo.join("docs/configuration.md")).expect("configuration.md");
    let documented = |prefix: &str| -> String {
        docs.lines()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting {prefix:?} in docs/configuration.md"))
            .to_owned()
    };
    let dir = tempfile::tempdir().expect("tempdir");

    let example = documented("gateway.yaml:");
    let mut place = example.splitn(4, ':').skip(1);
    let line: usize = place
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a line number");
    let column: usize = place.next().and_then(|n| n.parse().ok()).expect("a column");
    let shipped = std::fs::read_to_string(repo.join("gateway.yaml")).expect("gateway.yaml");
    let mut lines: Vec<String> = shipped.lines().map(str::to_owned).collect();
    let field = &lines[line - 1][column - 1..];
    let (name, _) = field
        .split_once(':')
        .expect("a field at the documented place");
    // The value after `name: ` ends at a space, a comma, a brace or a comment.
    let after = name.len() + 2;
    let value_end = field[after..]
        .find([' ', ',', '}', '#'])
        .map_or(field.len(), |end| after + end);
    let rewritten = format!(
        "{}{name}: 1 minute{}",
        &lines[line - 1][..column - 1],
        &field[value_end..]
    );
    lines[line - 1] = rewritten;
    std::fs::write(dir.path().join("gateway.yaml"), lines.join("\n") + "\n").expect("write");
    let bad = "listen: 127.0.0.1:8080\nstroe:\n  backend: memory\n";
    std::fs::write(dir.path().join("bad.yaml"), bad).expect("write");

    for (file, expected) in [
        ("gateway.yaml", example),
        ("bad.yaml", documented("bad.yaml:")),
    ] {
        let output = Command::new(BIN)
            .args(["check", "--config", file])
            .current_dir(dir.path())
            .env_remove("TOLLGATE_CONFIG")
            .output()
            .expect("run tollgate check");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.lines().any(|l| l == expected),
            "documented:\n{expected}\nprinted:\n{stderr}"
        );
    }
}

#[test]
fn check_prints_server_client_ip_upstreams_token_and_route_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = r#"admin: { listen: 127.0.0.1:9901, token: s3cret }
store: { backend: memory }
server: { keepalive_timeout: 90s, health_path: /lb, max_body_bytes: 1024, shutdown_delay: 5s }
client_ip: { trusted_proxies: [10.0.0.0/8], header: forwarded }
upstreams:
  b: { targets: ["http://10.1.2.3:8000"], timeout: 2s, connect_timeout: 250ms, pass_host_header: false }
routes:
  - name: r
    match: { path_prefix: /r }
    upstream: b
    deny_status: 503
    headers: false
    limits: [{ name: l, key: ip, algorithm: gcra, rate: 1/s, burst: 1 }]
"#;
    let path = write_config(&dir, "full.yaml", yaml);
    let output = tollgate(&["check", "--config", path.to_str().expect("path")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    for expected in [
        "admin 127.0.0.1:9901 (token set)",
        "server: header_read_timeout 10s   keepalive_timeout 90s   body_read_timeout 30s",
        "shutdown_delay 5s   shutdown_grace 30s   health_path /lb   max_body_bytes 1024",
        "client_ip: trusted_proxies 10.0.0.0/8   header forwarded   ipv6_prefix 64",
        "upstream b: http://10.1.2.3:8000/   timeout 2s   connect_timeout 250ms   own Host",
        "upstream b (deny 503) (headers: false)",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

/// The consumers block as `tollgate check` prints it: how callers are identified, the anonymous policy, and each
/// plan's limits with the routes they apply on (a route that requires a credential is not the anonymous plan's).
#[test]
fn check_prints_the_identifiers_and_each_plan_s_limits_with_their_routes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = r#"store: { backend: memory }
consumers:
  identify:
    - api_key: { header: x-api-key }
    - api_key: { query: key }
  anonymous: { plan: free }
  keys:
    - { key: k1, consumer: acme, plan: pro }
  plans:
    free: { limits: [{ name: calls, key: ip, algorithm: fixed_window, limit: 10, period: 1m }] }
    pro:
      limits:
        - { name: calls, key: consumer, algorithm: fixed_window, limit: 100, period: 1m }
        - { name: burst, key: consumer, algorithm: gcra, rate: 5/s, burst: 10 }
    empty: {}
routes:
  - { name: open, match: { path_prefix: /open }, respond: { status: 200 }, consumers: optional }
  - { name: paid, match: { path_prefix: /paid }, respond: { status: 200 }, consumers: required }
"#;
    let path = write_config(&dir, "consumers.yaml", yaml);
    let output = tollgate(&["check", "--config", path.to_str().expect("path")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "consumers: identify api_key header x-api-key, api_key query key   static keys 1   anonymous plan free"
        ),
        "{stdout}"
    );
    let row = |plan: &str, limit: &str| -> Vec<String> {
        stdout
            .lines()
            .map(|line| {
                line.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .find(|words| {
                words.first().map(String::as_str) == Some(plan)
                    && words.get(1).map(String::as_str) == Some(limit)
            })
            .unwrap_or_else(|| panic!("no row {plan} {limit} in:\n{stdout}"))
    };
    // The anonymous plan is used only where a credential is optional; the others wherever callers are identified.
    assert_eq!(
        row("free", "calls").last().map(String::as_str),
        Some("open")
    );
    assert_eq!(row("pro", "calls").last().map(String::as_str), Some("paid"));
    assert!(
        row("pro", "calls").join(" ").ends_with("open, paid"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["burst", "gcra"])),
        "{stdout}"
    );
    assert_eq!(
        row("empty", "(none)").last().map(String::as_str),
        Some("paid")
    );
}
