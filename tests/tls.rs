//! HTTPS on the gateway's TLS listener, with certificates made in the test and the clients people use: curl over
//! HTTP/1.1 and HTTP/2, `openssl s_client` for SNI, versions and client certificates; limits refuse over TLS as
//! in clear; bad `tls:` files are located errors.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::binary::{Tollgate, BIN};
use common::http_client::{client, metrics_text};
use common::pki::{Issued, TestCa};
use common::redis::RedisServer;
use common::tls_client::{self, exchange};
use common::upstream::Upstream;

/// A CA, a certificate for `api.test` and `*.api.test` (the default) and one for `other.test`.
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
    api: Issued,
    other: Issued,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new(dir.path(), "server");
        let api = ca.issue("api", &["api.test", "*.api.test"]);
        let other = ca.issue("other", &["other.test"]);
        Self {
            dir,
            ca,
            api,
            other,
        }
    }

    /// A `tls:` block on a free port with both certificates (api first), and `extra` lines indented by two spaces.
    fn tls_block(&self, extra: &str) -> String {
        format!(
            "tls:\n  listen: 127.0.0.1:0\n  certificates:\n    - {{ cert: {}, key: {} }}\n    - {{ cert: {}, key: {}, hosts: [other.test] }}\n{extra}",
            self.api.cert_file.display(),
            self.api.key_file.display(),
            self.other.cert_file.display(),
            self.other.key_file.display(),
        )
    }

    /// Writes `yaml` as `name` in the test's folder.
    fn write(&self, name: &str, yaml: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, yaml).expect("write config");
        path
    }
}

/// A gateway with a clear-text and an HTTPS listener, forwarding `/api` to `upstream`, with `limits` on it and
/// `tls_extra` in its `tls:` block.
fn gateway(pki: &Pki, upstream: &Upstream, tls_extra: &str, more: &str) -> Tollgate {
    gateway_on(pki, upstream, tls_extra, more, None)
}

/// [`gateway`] on `redis` when given, else the in-process store.
fn gateway_on(
    pki: &Pki,
    upstream: &Upstream,
    tls_extra: &str,
    more: &str,
    redis: Option<&RedisServer>,
) -> Tollgate {
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nstore:\n{}{}{more}upstreams:\n  backend: {{ targets: [\"{}\"] }}\nroutes:\n  - name: api\n    match: {{ path_prefix: /api }}\n    upstream: backend\n    limits:\n      - {{ name: per-ip, key: ip, algorithm: fixed_window, limit: 4, period: 1h }}\n",
        common::store_yaml(redis),
        pki.tls_block(tls_extra),
        upstream.url()
    );
    Tollgate::run(&pki.write("gateway.yaml", &yaml))
}

/// `curl` at `https://NAME:PORT/PATH` with NAME resolved to 127.0.0.1 and the test CA trusted, and `args`; the
/// output is the answer's body, then the status and the HTTP version on the last line.
fn curl(pki: &Pki, tollgate: &Tollgate, name: &str, path: &str, args: &[&str]) -> Output {
    let port = tollgate.tls.expect("a tls listener").port();
    Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&pki.ca.ca_file)
        .args(["--resolve", &format!("{name}:{port}:127.0.0.1")])
        .args(["-w", "\n%{http_code} %{http_version}"])
        .args(args)
        .arg(format!("https://{name}:{port}{path}"))
        .output()
        .expect("run curl")
}

/// The last line of curl's output: `STATUS VERSION`.
fn status_and_version(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "curl failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_owned()
}

/// `openssl s_client` against the HTTPS listener with `args`; its output and whether the handshake completed.
fn s_client(tollgate: &Tollgate, args: &[&str]) -> (String, bool) {
    s_client_sending(tollgate, args, None)
}

/// [`s_client`] sending `request` and reading until the gateway closes the connection (which a request with
/// `Connection: close` asks), so that what comes after the handshake, TLS 1.3's session tickets too, is read.
fn s_client_sending(tollgate: &Tollgate, args: &[&str], request: Option<&str>) -> (String, bool) {
    let address = tollgate.tls.expect("a tls listener").to_string();
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &address])
        .args(args)
        .args(request.map(|_| "-ign_eof"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openssl");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(request) = request {
        stdin
            .write_all(request.as_bytes())
            .expect("write the request");
    }
    drop(stdin);
    let output = child.wait_with_output().expect("openssl ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
    .replace(' ', "");
    // s_client exits 0 once it has sent its (empty) input, handshake or not: what it saw says which.
    let completed =
        output.status.success() && text.contains("Verifyreturncode") && !text.contains(":error:");
    (text, completed)
}

/// The value of the Prometheus series `series` (name and labels as written) in `metrics`.
fn series(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Waits up to 5 s for `tollgate_tls_handshake_failures_total{reason}` to read `count` (a failure is counted as its
/// connection closes, a moment after the client sees the close).
async fn assert_failures(tollgate: &Tollgate, reason: &str, count: f64) {
    let admin = format!("http://{}", tollgate.admin);
    let name = format!("tollgate_tls_handshake_failures_total{{reason=\"{reason}\"}}");
    let mut seen = None;
    common::eventually(Duration::from_secs(5), async || {
        seen = series(&metrics_text(&admin).await, &name);
        seen == Some(count)
    })
    .await;
    assert_eq!(seen, Some(count), "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_speaks_http1_and_http2_chosen_by_alpn_and_the_client_address_is_the_tcp_peer() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "");

    let http1 = curl(&pki, &tollgate, "api.test", "/api/one", &["--http1.1"]);
    assert_eq!(status_and_version(&http1), "200 1.1");
    let body = String::from_utf8_lossy(&http1.stdout);
    assert!(body.contains("\"path\":\"/api/one\""), "{body}");
    assert!(
        body.contains("\"x-forwarded-for\":\"127.0.0.1\""),
        "the upstream sees the TCP peer: {body}"
    );
    let http2 = curl(&pki, &tollgate, "api.test", "/api/two", &["--http2"]);
    assert_eq!(status_and_version(&http2), "200 2");
    // A name the wildcard covers is served by the same certificate (curl checks the name against it).
    let wildcard = curl(&pki, &tollgate, "v1.api.test", "/api/three", &["--http2"]);
    assert_eq!(status_and_version(&wildcard), "200 2");
    assert_eq!(upstream.hits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_chooses_the_certificate_and_the_first_serves_unknown_names_and_clients_without_sni() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "");

    let subject = |args: &[&str]| {
        let (text, completed) = s_client(&tollgate, args);
        assert!(completed, "{text}");
        text.lines()
            .find_map(|line| line.strip_prefix("subject=CN="))
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(subject(&["-servername", "other.test"]), "other.test");
    assert_eq!(subject(&["-servername", "api.test"]), "api.test");
    assert_eq!(subject(&["-servername", "v2.api.test"]), "api.test");
    assert_eq!(subject(&["-servername", "unknown.example"]), "api.test");
    assert_eq!(subject(&["-noservername"]), "api.test");
    // curl checks the certificate against the name it asked for: other.test's must be the one presented.
    let other = curl(&pki, &tollgate, "other.test", "/api/x", &[]);
    assert_eq!(status_and_version(&other), "200 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_version_1_3_refuses_a_tls_1_2_client_and_counts_the_failure() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "  min_version: \"1.3\"\n", "");

    let (text, completed) = s_client(&tollgate, &["-tls1_2", "-servername", "api.test"]);
    assert!(!completed, "TLS 1.2 was accepted: {text}");
    let (text, completed) = s_client(&tollgate, &["-tls1_3", "-servername", "api.test"]);
    assert!(completed, "{text}");
    assert_failures(&tollgate, "incompatible", 1.0).await;

    // The default accepts TLS 1.2.
    let default = gateway(&pki, &upstream, "", "");
    let (text, completed) = s_client(&default, &["-tls1_2", "-servername", "api.test"]);
    assert!(completed, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ca_refuses_a_client_without_a_certificate_and_admits_one_signed_by_it() {
    let pki = Pki::new();
    let clients = TestCa::new(pki.dir.path(), "clients");
    let client_cert = clients.issue("alice", &["alice"]);
    let stranger = TestCa::new(pki.dir.path(), "strangers").issue("mallory", &["mallory"]);
    let upstream = Upstream::start().await;
    let extra = format!("  client_ca: {}\n", clients.ca_file.display());
    let tollgate = gateway(&pki, &upstream, &extra, "");

    let without = curl(&pki, &tollgate, "api.test", "/api/x", &[]);
    assert!(!without.status.success(), "admitted without a certificate");
    let with_cert = |issued: &Issued| {
        let (cert, key) = (issued.cert_file.display(), issued.key_file.display());
        curl(
            &pki,
            &tollgate,
            "api.test",
            "/api/x",
            &["--cert", &cert.to_string(), "--key", &key.to_string()],
        )
    };
    assert!(
        !with_cert(&stranger).status.success(),
        "admitted a certificate another CA signed"
    );
    assert_eq!(status_and_version(&with_cert(&client_cert)), "200 2");
    assert_eq!(upstream.hits(), 1);
    for reason in ["no_client_certificate", "bad_client_certificate"] {
        assert_failures(&tollgate, reason, 1.0).await;
    }
}

crate::each_store!(
    a_limit_refuses_over_tls_with_the_same_answer_as_in_clear,
    limit_over_tls,
    flavor = "multi_thread",
    worker_threads = 2
);

/// One limit, one key (the client address) for both listeners: refused over TLS, HTTP/1.1 and HTTP/2, with the
/// status, fields and body it is refused with in clear.
async fn limit_over_tls(redis: Option<&RedisServer>) {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway_on(&pki, &upstream, "", "", redis);
    let clear = || async {
        client()
            .get(tollgate.url("/api/x"))
            .send()
            .await
            .expect("clear request")
    };
    let https = |version: &str| {
        let output = curl(&pki, &tollgate, "api.test", "/api/x", &["-i", version]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    };

    // One key for both listeners: the client address, 127.0.0.1.
    assert_eq!(clear().await.status(), 200);
    assert!(https("--http1.1").starts_with("HTTP/1.1 200"));
    assert!(https("--http2").starts_with("HTTP/2 200"));
    assert_eq!(clear().await.status(), 200);
    let refused = clear().await;
    assert_eq!(refused.status(), 429);
    let mut expected: Vec<String> = refused
        .headers()
        .keys()
        .map(|name| name.as_str().to_owned())
        .filter(|name| name != "date")
        .collect();
    expected.sort();
    let clear_body = refused.text().await.expect("body");
    for version in ["--http1.1", "--http2"] {
        let answer = https(version);
        let (head, body) = answer.split_once("\r\n\r\n").expect("head and body");
        assert!(head.contains(" 429"), "{head}");
        let mut names: Vec<String> = head
            .lines()
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .map(|(name, _)| name.to_ascii_lowercase())
            .filter(|name| name != "date")
            .collect();
        names.sort();
        assert_eq!(names, expected, "{version}: {head}");
        let body = body.rsplit_once('\n').map_or(body, |(body, _)| body);
        assert_eq!(without_wait(body), without_wait(&clear_body), "{version}");
    }
    assert_eq!(upstream.hits(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2load_over_tls_meets_the_limit_exactly_under_concurrent_streams() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "");
    let port = tollgate.tls.expect("a tls listener").port();
    // 200 requests on 4 connections, 10 streams each at once, all from one address: the limit of 4 admits 4.
    let output = Command::new("h2load")
        .args(["-n", "200", "-c", "4", "-m", "10"])
        .arg(format!("https://127.0.0.1:{port}/api/x"))
        .output()
        .expect("run h2load (Debian: nghttp2-client)");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Application protocol: h2"), "{text}");
    assert!(
        // h2load counts a 4xx as failed: every request was answered, none errored.
        text.contains("200 total, 200 started, 200 done, 4 succeeded, 196 failed, 0 errored"),
        "{text}"
    );
    assert!(
        text.contains("status codes: 4 2xx, 0 3xx, 196 4xx, 0 5xx"),
        "{text}"
    );
    assert_eq!(upstream.hits(), 4);
}

/// A refusal's JSON body without `retry_after_ms`, which counts down between two answers.
fn without_wait(body: &str) -> serde_json::Value {
    let mut body: serde_json::Value = serde_json::from_str(body).expect("a JSON refusal");
    body.as_object_mut()
        .expect("an object")
        .remove("retry_after_ms");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_completes_times_out_and_is_counted() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "server:\n  header_read_timeout: 1s\n");

    let started = Instant::now();
    let mut silent = std::net::TcpStream::connect(tollgate.tls.expect("tls")).expect("connect");
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    let read = silent.read(&mut byte);
    assert!(
        matches!(read, Ok(0)) || read.is_err() && started.elapsed() < Duration::from_secs(9),
        "{read:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900)
            && started.elapsed() < Duration::from_secs(5),
        "closed after {:?}",
        started.elapsed()
    );
    // Not TLS at all: refused and counted as such.
    let mut plain = std::net::TcpStream::connect(tollgate.tls.expect("tls")).expect("connect");
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .expect("write");
    let _ = plain.read(&mut byte);
    assert_failures(&tollgate, "timeout", 1.0).await;
    assert_failures(&tollgate, "not_tls", 1.0).await;
    assert!(
        !tollgate.log().contains("handshake"),
        "a handshake failure was logged:\n{}",
        tollgate.log()
    );
    // A client that sends an IP address as its server name (wrk, curl and many libraries do): served, and not
    // logged either (rustls warns of each).
    let (text, completed) = s_client(&tollgate, &["-servername", "127.0.0.1"]);
    assert!(completed, "{text}");
    assert!(
        !tollgate.log().contains("rustls"),
        "a handshake was logged:\n{}",
        tollgate.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_alone_serves_without_a_clear_text_listener_and_exports_each_expiry() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let yaml = format!(
        "admin:\n  listen: 127.0.0.1:0\nstore:\n  backend: memory\n{}upstreams:\n  backend: {{ targets: [\"{}\"] }}\nroutes:\n  - name: api\n    match: {{ path_prefix: /api }}\n    upstream: backend\n",
        pki.tls_block(""),
        upstream.url()
    );
    let tollgate = Tollgate::run(&pki.write("https-only.yaml", &yaml));
    assert_eq!(Some(tollgate.listen), tollgate.tls);
    assert!(
        tollgate.log().contains("listen= "),
        "no clear-text listener:\n{}",
        tollgate.log()
    );
    let output = curl(&pki, &tollgate, "api.test", "/api/x", &[]);
    assert_eq!(status_and_version(&output), "200 2");
    let metrics = metrics_text(&format!("http://{}", tollgate.admin)).await;
    for name in ["api.test", "other.test"] {
        let series_name = format!("tollgate_tls_certificate_expiry_seconds{{name=\"{name}\"}}");
        // rcgen's certificates run to 4096-01-01T00:00:00Z.
        assert_eq!(
            series(&metrics, &series_name),
            Some(67_090_118_400.0),
            "{metrics}"
        );
    }
}

// === config ===

/// `tollgate check` on `yaml`, written in `pki`'s folder: its exit code and what it printed.
fn check(pki: &Pki, yaml: &str) -> (Option<i32>, String, PathBuf) {
    let path = pki.write("check.yaml", yaml);
    let output = Command::new(BIN)
        .args(["check", "--config"])
        .arg(&path)
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .expect("run tollgate check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text, path)
}

/// A config whose `tls:` block has one certificate, `cert` and `key`, and `extra` lines.
fn one_certificate(cert: &Path, key: &Path, extra: &str) -> String {
    format!(
        "store:\n  backend: memory\ntls:\n  listen: 127.0.0.1:8443\n  certificates:\n    - cert: {}\n      key: {}\n{extra}routes:\n  - name: demo\n    match: {{ path_prefix: / }}\n    respond: {{ status: 200 }}\n",
        cert.display(),
        key.display()
    )
}

/// `check` of `yaml` fails with exit 2 and `expected` at `line:column` of the file.
fn assert_located(pki: &Pki, yaml: &str, at: &str, expected: &str) {
    let (code, text, path) = check(pki, yaml);
    assert_eq!(code, Some(2), "{text}");
    let expected = format!("{}:{at}: {expected}", path.display());
    assert!(text.contains(&expected), "expected {expected}\nin:\n{text}");
}

#[test]
fn bad_tls_files_and_versions_are_located_errors() {
    let pki = Pki::new();
    let (cert, key) = (&pki.api.cert_file, &pki.api.key_file);
    let missing = pki.dir.path().join("missing.pem");
    assert_located(
        &pki,
        &one_certificate(&missing, key, ""),
        "6:7",
        &format!(
            "tls.certificates[0].cert: cannot read {}: No such file or directory",
            missing.display()
        ),
    );
    assert_located(
        &pki,
        &one_certificate(cert, &pki.other.key_file, ""),
        "7:7",
        &format!(
            "tls.certificates[0].key: {} does not go with cert {} (its public key is not the certificate's)",
            pki.other.key_file.display(),
            cert.display()
        ),
    );
    let expired = pki.ca.issue_with(
        "expired",
        &["old.test"],
        rcgen::KeyPair::generate().expect("key"),
        Some((2020, 1, 2)),
    );
    assert_located(
        &pki,
        &one_certificate(&expired.cert_file, &expired.key_file, ""),
        "6:7",
        &format!(
            "tls.certificates[0].cert: {} expired on 2020-01-02T00:00:00Z",
            expired.cert_file.display()
        ),
    );
    assert_located(
        &pki,
        &one_certificate(cert, key, "  min_version: \"1.1\"\n"),
        "8:3",
        "tls.min_version: unknown TLS version \"1.1\" (use \"1.2\" or \"1.3\")",
    );
    assert_located(
        &pki,
        &one_certificate(cert, key, &format!("  client_ca: {}\n", missing.display())),
        "8:3",
        &format!("tls.client_ca: cannot read {}", missing.display()),
    );
}

#[test]
fn check_prints_each_certificate_with_its_names_and_expiry_for_rsa_ecdsa_and_ed25519_keys() {
    let pki = Pki::new();
    let ed25519 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519 key");
    let ed = pki
        .ca
        .issue_with("ed", &["ed.test"], ed25519, Some((2090, 3, 4)));
    let rsa_pem = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl genpkey");
    let rsa_key =
        rcgen::KeyPair::from_pem(&String::from_utf8_lossy(&rsa_pem.stdout)).expect("rsa key");
    let rsa = pki
        .ca
        .issue_with("rsa", &["rsa.test"], rsa_key, Some((2080, 5, 6)));
    let yaml = format!(
        "{}    - {{ cert: {}, key: {} }}\n    - {{ cert: {}, key: {} }}\n",
        one_certificate(&pki.api.cert_file, &pki.api.key_file, "")
            .replace("routes:", "TAIL:")
            .split("TAIL:")
            .next()
            .expect("head"),
        ed.cert_file.display(),
        ed.key_file.display(),
        rsa.cert_file.display(),
        rsa.key_file.display(),
    )
        + "routes:\n  - name: demo\n    match: { path_prefix: / }\n    respond: { status: 200 }\n";
    let (code, text, _) = check(&pki, &yaml);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("tls: listen 127.0.0.1:8443   min_version 1.2   no client certificates"),
        "{text}"
    );
    for (file, names, expires) in [
        (
            &pki.api.cert_file,
            "api.test, *.api.test",
            "4096-01-01T00:00:00Z   (default)",
        ),
        (&ed.cert_file, "ed.test", "2090-03-04T00:00:00Z"),
        (&rsa.cert_file, "rsa.test", "2080-05-06T00:00:00Z"),
    ] {
        let line = format!(
            "  certificate {}   names {names}   expires {expires}",
            file.display()
        );
        assert!(text.lines().any(|l| l == line), "{line}\nin:\n{text}");
    }
}

// === reloads ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_certificates_again_and_a_broken_one_leaves_the_old_serving() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "");
    let subject = || served_subject(&tollgate);
    let hangup = || signal(tollgate.pid(), "-HUP");
    assert_eq!(subject(), "api.test");

    // Renewed in place: the same files, a certificate whose first name (its subject) is new.
    pki.ca.issue("api", &["renewed.api.test", "api.test"]);
    hangup();
    let mut seen = String::new();
    common::eventually(Duration::from_secs(5), async || {
        seen = subject();
        seen == "renewed.api.test"
    })
    .await;
    assert_eq!(seen, "renewed.api.test", "{}", tollgate.log());

    // A broken file: the reload is refused and the renewed certificate keeps serving.
    std::fs::write(&pki.api.cert_file, "not a certificate\n").expect("write");
    hangup();
    // The refusal and its reason may reach the log in two writes: wait for the reason itself.
    let reason = format!(
        "tls.certificates[0].cert: {}: no certificate in it",
        pki.api.cert_file.display()
    );
    let refused = common::eventually(Duration::from_secs(5), async || {
        let log = tollgate.log();
        log.contains("config reload refused") && log.contains(&reason)
    })
    .await;
    assert!(refused.is_some(), "{}", tollgate.log());
    assert_eq!(subject(), "renewed.api.test");
    let output = curl(&pki, &tollgate, "api.test", "/api/x", &[]);
    assert_eq!(status_and_version(&output), "200 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_its_session_by_ticket_also_after_a_reload() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "");
    let session = pki.dir.path().join("session.pem");
    let session = session.to_str().expect("a UTF-8 path");
    for (reloads, version) in [(1, "-tls1_3"), (2, "-tls1_2")] {
        let request = "GET /api/x HTTP/1.1\r\nhost: api.test\r\nconnection: close\r\n\r\n";
        let (text, completed) =
            s_client_sending(&tollgate, &[version, "-sess_out", session], Some(request));
        assert!(completed && text.contains("New,"), "{text}");
        // A reload builds the TLS settings afresh: a session kept in the old settings' cache would be lost.
        signal(tollgate.pid(), "-HUP");
        common::eventually(Duration::from_secs(5), async || {
            tollgate.log().matches("config reloaded").count() >= reloads
        })
        .await;
        let (text, completed) = s_client(&tollgate, &[version, "-sess_in", session]);
        assert!(completed, "{text}");
        assert!(text.contains("Reused,"), "{version} not resumed:\n{text}");
    }
}

// === connections ===

/// The subject (`CN`) of the certificate the HTTPS listener serves for `api.test`, as `openssl s_client` reads it.
fn served_subject(tollgate: &Tollgate) -> String {
    let (text, completed) = s_client(tollgate, &["-servername", "api.test"]);
    assert!(completed, "{text}");
    text.lines()
        .find_map(|line| line.strip_prefix("subject=CN="))
        .unwrap_or_default()
        .to_owned()
}

/// A TLS connection to the HTTPS listener asking for `alpn` (nothing when empty), trusting the test CA, with
/// `api.test` as SNI.
async fn tls_connect(
    pki: &Pki,
    tollgate: &Tollgate,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    tls_client::connect(tollgate.tls.expect("tls"), &pki.ca.ca_file, alpn, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_https_keep_alive_connection_lasts_keepalive_timeout_not_header_read_timeout() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let server = "server:\n  header_read_timeout: 1s\n  keepalive_timeout: 60s\n";
    let tollgate = gateway(&pki, &upstream, "", server);
    let mut stream = tls_connect(&pki, &tollgate, b"http/1.1").await;
    let request = "GET /api/x HTTP/1.1\r\nhost: api.test\r\n\r\n";
    let first = exchange(&mut stream, request).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Idle past header_read_timeout, as a balancer's pooled connection is between requests.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = exchange(&mut stream, request).await;
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "closed while idle: {second:?}"
    );
    // A malformed head gets the same JSON refusal as in clear.
    let mut stream = tls_connect(&pki, &tollgate, b"http/1.1").await;
    let bad = exchange(
        &mut stream,
        "GET /api/x HTTP/1.1\r\nhost: api.test\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
    )
    .await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    assert!(bad.contains("\"error\":\"bad_request\""), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_closes_https_connections_as_it_closes_clear_text_ones() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let server = "server:\n  shutdown_delay: 1s\n  shutdown_grace: 5s\n";
    let mut tollgate = gateway(&pki, &upstream, "", server);
    let mut stream = tls_connect(&pki, &tollgate, b"http/1.1").await;
    let request = "GET /api/x HTTP/1.1\r\nhost: api.test\r\n\r\n";
    assert!(exchange(&mut stream, request)
        .await
        .starts_with("HTTP/1.1 200"));
    // Idle, between requests: the drain must close it rather than wait the grace period out for it.
    let mut idle = tls_connect(&pki, &tollgate, b"http/1.1").await;
    assert!(exchange(&mut idle, request)
        .await
        .starts_with("HTTP/1.1 200"));

    let signalled = Instant::now();
    signal(tollgate.pid(), "-TERM");
    common::eventually(Duration::from_secs(5), async || {
        tollgate.log().contains("draining")
    })
    .await;
    // Within the delay the connection is still served, its answer saying it closes.
    let answer = exchange(&mut stream, request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    let started = Instant::now();
    let exited = loop {
        if let Some(status) = tollgate.process.0.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exited.success(), "{exited:?}");
    // The delay (1 s), not the grace (5 s): no connection held the exit.
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "exited {:?} after the signal",
        signalled.elapsed()
    );
    drop(idle);
}

/// A WebSocket upstream on a free loopback port that echoes every text message.
async fn websocket_echo() -> (String, tokio::task::JoinHandle<()>) {
    use axum::extract::ws::{Message, WebSocketUpgrade};
    let app =
        axum::Router::new().fallback(axum::routing::get(|upgrade: WebSocketUpgrade| async move {
            upgrade.on_upgrade(|mut socket| async move {
                while let Some(Ok(Message::Text(text))) = socket.recv().await {
                    if socket.send(Message::Text(text)).await.is_err() {
                        return;
                    }
                }
            })
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

#[tokio::test]
async fn a_websocket_over_tls_is_proxied_and_its_handshakes_are_limited_as_in_clear() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let pki = Pki::new();
    let (echo, _task) = websocket_echo().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nstore:\n  backend: memory\n{}upstreams:\n  ws: {{ targets: [\"{echo}\"] }}\nroutes:\n  - name: chat\n    match: {{ path_prefix: /chat }}\n    upstream: ws\n    limits:\n      - {{ name: per-ip, key: ip, algorithm: fixed_window, limit: 1, period: 1h }}\n",
        pki.tls_block("")
    );
    let tollgate = Tollgate::run(&pki.write("gateway.yaml", &yaml));

    let stream = tls_connect(&pki, &tollgate, b"http/1.1").await;
    let (mut socket, answer) = tokio_tungstenite::client_async("wss://api.test/chat", stream)
        .await
        .expect("the handshake over TLS");
    assert_eq!(answer.status(), 101);
    socket
        .send(Message::Text("over tls".into()))
        .await
        .expect("send");
    let echoed = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .expect("an echo in time")
        .expect("a message")
        .expect("not an error");
    assert_eq!(echoed, Message::Text("over tls".into()));

    // The second handshake from the address is over the limit: refused before any upgrade.
    let stream = tls_connect(&pki, &tollgate, b"http/1.1").await;
    let refused = tokio_tungstenite::client_async("wss://api.test/chat", stream).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 429);
            assert!(response.headers().contains_key("retry-after"));
        }
        other => panic!("expected a 429 over TLS, got {other:?}"),
    }
    socket.close(None).await.expect("close");
}

#[tokio::test]
async fn a_client_that_names_no_protocol_is_served_http1() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "");
    let mut stream = tls_connect(&pki, &tollgate, b"").await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), None);
    let answer = exchange(&mut stream, "GET /api/x HTTP/1.1\r\nhost: api.test\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Two requests on the connection: it is kept alive as any HTTP/1.1 one.
    let answer = exchange(&mut stream, "GET /api/y HTTP/1.1\r\nhost: api.test\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_certificate_renewed_in_place_is_served_without_a_signal() {
    let pki = Pki::new();
    let upstream = Upstream::start().await;
    let tollgate = gateway(&pki, &upstream, "", "");
    let subject = || served_subject(&tollgate);
    assert_eq!(subject(), "api.test");
    // Renewed in place as certbot or cert-manager do: the same files, the config untouched, no SIGHUP.
    pki.ca.issue("api", &["renewed.api.test", "api.test"]);
    let mut seen = String::new();
    common::eventually(Duration::from_secs(15), async || {
        seen = subject();
        seen == "renewed.api.test"
    })
    .await;
    assert_eq!(seen, "renewed.api.test", "{}", tollgate.log());
    // A broken file: logged, and the renewed certificate keeps serving.
    std::fs::write(&pki.api.cert_file, "not a certificate\n").expect("write");
    let refused = common::eventually(Duration::from_secs(15), async || {
        tollgate
            .log()
            .contains("change of the files beside the config refused")
    })
    .await;
    assert!(refused.is_some(), "{}", tollgate.log());
    assert_eq!(subject(), "renewed.api.test");
}

/// Sends `name` (`-HUP`, `-TERM`) to the gateway's process.
fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([name, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}
