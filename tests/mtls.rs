//! Mutual TLS as an identity: the verified client certificate's subject as a key part (`key: client_cert`) and its
//! common name as a consumer (`mtls:` identifier), with certificates made in the test, through curl and a rustls
//! client; on both stores.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::binary::Tollgate;
use common::http_client::{client, json_answer};
use common::pki::{Issued, TestCa};
use common::redis::RedisServer;
use common::tls_client::{connect, exchange};
use common::upstream::Upstream;
use rcgen::DnType;

/// The server's CA and certificate (`api.test`), and a second CA that signs the clients' certificates.
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
    server: Issued,
    clients: TestCa,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new(dir.path(), "server");
        let server = ca.issue("api", &["api.test"]);
        let clients = TestCa::new(dir.path(), "clients");
        Self {
            dir,
            ca,
            server,
            clients,
        }
    }

    /// A client certificate for `O=Example, Inc.` and common name `name`.
    fn client(&self, stem: &str, name: &str) -> Issued {
        self.clients.issue_client(
            stem,
            &[
                (DnType::OrganizationName, "Example, Inc."),
                (DnType::CommonName, name),
            ],
        )
    }

    /// A gateway with a clear-text and an HTTPS listener asking for client certificates signed by `clients`, with
    /// `consumers` (a block, or nothing) and the route `api` forwarding `/api` to `upstream` with `route` lines.
    fn gateway(
        &self,
        upstream: &Upstream,
        redis: Option<&RedisServer>,
        consumers: &str,
        route: &str,
    ) -> Tollgate {
        let yaml = format!(
            "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nstore:\n{}tls:\n  listen: 127.0.0.1:0\n  certificates:\n    - {{ cert: {}, key: {} }}\n  client_ca: {}\n{consumers}upstreams:\n  backend: {{ targets: [\"{}\"] }}\nroutes:\n  - name: api\n    match: {{ path_prefix: /api }}\n    upstream: backend\n{route}",
            common::store_yaml(redis),
            self.server.cert_file.display(),
            self.server.key_file.display(),
            self.clients.ca_file.display(),
            upstream.url()
        );
        let path = self.dir.path().join("gateway.yaml");
        std::fs::write(&path, yaml).expect("write config");
        Tollgate::run(&path)
    }

    /// `curl https://api.test:PORT/PATH` presenting `client`'s certificate; the body then the status on the last
    /// line.
    fn curl(&self, tollgate: &Tollgate, path: &str, client: &Issued) -> Output {
        let port = tollgate.tls.expect("a tls listener").port();
        Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&self.ca.ca_file)
            .arg("--cert")
            .arg(&client.cert_file)
            .arg("--key")
            .arg(&client.key_file)
            .args(["--resolve", &format!("api.test:{port}:127.0.0.1")])
            .args(["-w", "\n%{http_code}"])
            .arg(format!("https://api.test:{port}{path}"))
            .output()
            .expect("run curl")
    }

    /// One HTTP/1.1 `GET path` over a new TLS connection presenting `client`: the answer's head and body.
    async fn get(&self, tollgate: &Tollgate, path: &str, client: &Issued) -> String {
        let addr = tollgate.tls.expect("a tls listener");
        let mut stream = connect(addr, &self.ca.ca_file, b"http/1.1", Some(client)).await;
        let request = format!("GET {path} HTTP/1.1\r\nhost: api.test\r\nconnection: close\r\n\r\n");
        exchange(&mut stream, &request).await
    }
}

/// The status curl saw (the last line of [`Pki::curl`]'s output).
fn curl_status(output: &Output) -> u16 {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "curl failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .last()
        .and_then(|line| line.trim().parse().ok())
        .expect("a status")
}

/// The status of an HTTP/1.1 answer.
fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"))
}

/// The subject of the certificate in `file` as `openssl x509 -nameopt RFC2253` (nginx's `$ssl_client_s_dn`)
/// writes it.
fn openssl_subject(file: &Path) -> String {
    let output = Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in"])
        .arg(file)
        .output()
        .expect("run openssl");
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .strip_prefix("subject=")
        .expect("subject=")
        .trim()
        .to_owned()
}

crate::each_store!(
    each_client_certificate_has_its_own_limit,
    limit_by_certificate,
    flavor = "multi_thread",
    worker_threads = 2
);

/// `key: client_cert`, limit 2: alice's third request is refused while bob's pass; her key is her certificate's
/// subject as openssl writes it; a request without a certificate (the clear-text listener) is keyed by its address.
async fn limit_by_certificate(redis: Option<&RedisServer>) {
    let pki = Pki::new();
    let alice = pki.client("alice", "alice");
    let bob = pki.client("bob", "bob");
    let upstream = Upstream::start().await;
    let route = "    limits:\n      - { name: per-cert, key: client_cert, algorithm: fixed_window, limit: 2, period: 1h }\n";
    let tollgate = pki.gateway(&upstream, redis, "", route);

    assert_eq!(curl_status(&pki.curl(&tollgate, "/api/a", &alice)), 200);
    assert_eq!(curl_status(&pki.curl(&tollgate, "/api/a", &alice)), 200);
    assert_eq!(curl_status(&pki.curl(&tollgate, "/api/a", &alice)), 429);
    for _ in 0..2 {
        let answer = pki.get(&tollgate, "/api/b", &bob).await;
        assert_eq!(status(&answer), 200, "{answer}");
    }
    let answer = pki.get(&tollgate, "/api/b", &bob).await;
    assert_eq!(status(&answer), 429, "{answer}");
    // No certificate: the part is missing, and the request keyed by its address (`missing: ip`).
    let plain = client()
        .get(tollgate.url("/api/c"))
        .send()
        .await
        .expect("plain");
    assert_eq!(plain.status(), 200);
    assert_eq!(upstream.hits(), 5);

    let subject = openssl_subject(&alice.cert_file);
    assert_eq!(subject, "CN=alice,O=Example\\, Inc.");
    let url = format!(
        "{}?key={}",
        tollgate.admin_url("/limits/api/per-cert"),
        form_urlencoded::byte_serialize(subject.as_bytes()).collect::<String>()
    );
    let (code, body) = json_answer(client().get(url)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["remaining"], 0, "alice's key is her subject: {body}");
}

crate::each_store!(
    the_mtls_identifier_names_the_consumer_by_its_certificate,
    consumer_by_certificate,
    flavor = "multi_thread",
    worker_threads = 2
);

/// `mtls: { plan: partner }`: the common name, prefixed `mtls:`, is the consumer the plan's limit counts, the
/// upstream is told of and the admin API blocks; a certificate whose name cannot be a consumer id is 401, and so is a request on the
/// clear-text listener, with no certificate, to a route that requires a consumer.
async fn consumer_by_certificate(redis: Option<&RedisServer>) {
    let pki = Pki::new();
    let alice = pki.client("alice", "alice");
    let bob = pki.client("bob", "bob");
    let spaced = pki.client("spaced", "Alice Smith");
    let upstream = Upstream::start().await;
    let consumers = "consumers:\n  identify:\n    - mtls: { plan: partner }\n  forward: { consumer: X-Consumer-Id, plan: X-Consumer-Plan }\n  plans:\n    partner:\n      limits:\n        - { name: per-consumer, key: consumer, algorithm: fixed_window, limit: 2, period: 1h }\n";
    let tollgate = pki.gateway(&upstream, redis, consumers, "    consumers: required\n");

    for _ in 0..2 {
        let answer = pki.get(&tollgate, "/api/a", &alice).await;
        assert_eq!(status(&answer), 200, "{answer}");
        let body = answer.split_once("\r\n\r\n").expect("a body").1;
        let echoed: serde_json::Value = serde_json::from_str(body).expect("the echo");
        assert_eq!(echoed["headers"]["x-consumer-id"], "mtls:alice", "{echoed}");
        assert_eq!(echoed["headers"]["x-consumer-plan"], "partner", "{echoed}");
    }
    let answer = pki.get(&tollgate, "/api/a", &alice).await;
    assert_eq!(status(&answer), 429, "{answer}");
    assert!(answer.contains("\"partner.per-consumer\""), "{answer}");
    let answer = pki.get(&tollgate, "/api/b", &bob).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(
        answer.contains("\"x-consumer-id\":\"mtls:bob\""),
        "{answer}"
    );

    // The consumer is managed as any other, by its id: blocked, bob is 403.
    let blocked = client()
        .put(tollgate.admin_url("/consumers/mtls:bob"))
        .header("content-type", "application/json")
        .body(r#"{"blocked":true}"#)
        .send()
        .await
        .expect("put");
    assert_eq!(blocked.status(), 200);
    let answer = pki.get(&tollgate, "/api/b", &bob).await;
    assert_eq!(status(&answer), 403, "{answer}");

    let answer = pki.get(&tollgate, "/api/c", &spaced).await;
    assert_eq!(status(&answer), 401, "{answer}");
    assert!(answer.contains("unusable_certificate_name"), "{answer}");
    let (code, body) = json_answer(client().get(tollgate.url("/api/d"))).await;
    assert_eq!(code, 401, "{body}");
    assert_eq!(body["reason"], "credential_required", "{body}");
    assert_eq!(upstream.hits(), 3);
}

/// `tollgate check` of `yaml` written beside the test's certificates: its exit code and output.
fn check(pki: &Pki, yaml: &str) -> (Option<i32>, String, PathBuf) {
    let path = pki.dir.path().join("check.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let output = Command::new(common::binary::BIN)
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

#[test]
fn the_certificate_without_client_ca_is_a_located_error() {
    let pki = Pki::new();
    let tls = format!(
        "tls:\n  listen: 127.0.0.1:8443\n  certificates:\n    - {{ cert: {}, key: {} }}\n",
        pki.server.cert_file.display(),
        pki.server.key_file.display()
    );
    let yaml = format!(
        "{tls}consumers:\n  identify:\n    - api_key: {{ header: x-api-key }}\n    - mtls: {{}}\nroutes:\n  - name: api\n    match: {{ path_prefix: / }}\n    respond: {{ status: 200 }}\n    limits:\n      - {{ name: a, key: [route, client_cert], algorithm: fixed_window, limit: 2, period: 1m }}\n"
    );
    let (code, text, path) = check(&pki, &yaml);
    assert_eq!(code, Some(2), "{text}");
    let file = path.display();
    for expected in [
        format!("{file}:8:7: consumers.identify[1].mtls: reads the client certificate"),
        format!("{file}:14:33: routes[0].limits[0].key[1]: reads the client certificate"),
    ] {
        assert!(text.contains(&expected), "{expected}\nin:\n{text}");
    }
    // With client_ca the same file is valid.
    let with_ca = yaml.replacen(
        "consumers:",
        &format!("  client_ca: {}\nconsumers:", pki.clients.ca_file.display()),
        1,
    );
    let (code, text, _) = check(&pki, &with_ca);
    assert_eq!(code, Some(0), "{text}");
}
