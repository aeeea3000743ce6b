//! `https` upstreams end to end: the gateway against a real TLS upstream on loopback, with certificates made for
//! each test (trusted through `tls.ca_file`, or through the system's roots with `SSL_CERT_FILE`).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::binary::Tollgate;
use common::http_client::{client, json_answer};
use common::pki::TestCa;
use common::upstream::Upstream;
use common::{start_gateway, TestGateway};
use serde_json::Value;
use tokio::net::TcpListener;

/// `tls:` lines of an upstream, from `(field, value)` pairs.
fn tls_block(fields: &[(&str, &Path)]) -> String {
    if fields.is_empty() {
        return String::new();
    }
    let fields: Vec<String> = fields
        .iter()
        .map(|(field, value)| format!("{field}: {:?}", value.display().to_string()))
        .collect();
    format!("    tls: {{ {} }}\n", fields.join(", "))
}

/// The config of a gateway routing `/api` to `target`, with `tls` (see [`tls_block`]) and `server_name` if any.
fn gateway_yaml(target: &str, tls: &str) -> String {
    format!(
        r#"listen: 127.0.0.1:0
store:
  backend: memory
upstreams:
  secure:
    targets: ["{target}"]
    timeout: 30s
    connect_timeout: 500ms
{tls}routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: secure
"#
    )
}

async fn get(gateway: &TestGateway, path: &str) -> (u16, Value) {
    json_answer(client().get(gateway.url(path))).await
}

#[tokio::test]
async fn requests_reach_an_https_upstream_trusted_through_ca_file_on_one_kept_alive_connection() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "upstream");
    let upstream = Upstream::start_tls(&ca.issue("server", &["127.0.0.1"]), None).await;
    let gateway = start_gateway(&gateway_yaml(
        &format!("{}/base", upstream.https_url()),
        &tls_block(&[("ca_file", &ca.ca_file)]),
    ))
    .await;

    for i in 0..5 {
        let (status, seen) = get(&gateway, &format!("/api/item/{i}?q=1")).await;
        assert_eq!(status, 200, "{seen}");
        assert_eq!(seen["path"], format!("/base/api/item/{i}"));
        assert_eq!(seen["query"], "q=1");
        // rustls sends no SNI for an IP address: the certificate's IP address is what was checked.
        assert_eq!(seen["headers"]["x-test-sni"], "-");
        assert_eq!(seen["headers"]["x-test-client-cert"], "no");
        assert_eq!(seen["headers"]["x-forwarded-for"], "127.0.0.1");
    }
    assert_eq!(upstream.hits(), 5);
    // One TLS handshake: the connection went back to the pool after each response.
    assert_eq!(upstream.connections(), 1);
}

#[tokio::test]
async fn server_name_is_sent_as_sni_and_is_the_name_the_certificate_must_carry() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "upstream");
    let upstream = Upstream::start_tls(&ca.issue("server", &["api.internal"]), None).await;
    let target = upstream.https_url();
    let ca_file = format!("{:?}", ca.ca_file.display().to_string());

    let named = start_gateway(&gateway_yaml(
        &target,
        &format!("    tls: {{ ca_file: {ca_file}, server_name: api.internal }}\n"),
    ))
    .await;
    let (status, seen) = get(&named, "/api/x").await;
    assert_eq!(status, 200, "{seen}");
    assert_eq!(seen["headers"]["x-test-sni"], "api.internal");

    // The target's own host, 127.0.0.1, is not a name on that certificate.
    let unnamed = start_gateway(&gateway_yaml(
        &target,
        &tls_block(&[("ca_file", &ca.ca_file)]),
    ))
    .await;
    let (status, body) = get(&unnamed, "/api/x").await;
    assert_eq!(status, 502);
    assert_eq!(body["error"], "upstream_unreachable");

    let misnamed = start_gateway(&gateway_yaml(
        &target,
        &format!("    tls: {{ ca_file: {ca_file}, server_name: other.internal }}\n"),
    ))
    .await;
    assert_eq!(get(&misnamed, "/api/x").await.0, 502);
    assert_eq!(
        upstream.hits(),
        1,
        "only the request to the right name got through"
    );
}

#[tokio::test]
async fn a_certificate_from_a_ca_not_trusted_gets_a_502_and_the_upstream_no_request() {
    let dir = tempfile::tempdir().expect("temp dir");
    let upstream_ca = TestCa::new(dir.path(), "upstream");
    let other_ca = TestCa::new(dir.path(), "other");
    let upstream = Upstream::start_tls(&upstream_ca.issue("server", &["127.0.0.1"]), None).await;
    let gateway = start_gateway(&gateway_yaml(
        &upstream.https_url(),
        &tls_block(&[("ca_file", &other_ca.ca_file)]),
    ))
    .await;

    for _ in 0..3 {
        let (status, body) = get(&gateway, "/api/x").await;
        assert_eq!(status, 502);
        assert_eq!(body["error"], "upstream_unreachable");
        assert_eq!(body["route"], "api");
    }
    assert_eq!(upstream.hits(), 0);
    // Each request tried a handshake of its own: a failed one is never pooled.
    assert_eq!(upstream.connections(), 3);
}

#[tokio::test]
async fn a_client_certificate_is_presented_to_an_upstream_that_requires_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let upstream_ca = TestCa::new(dir.path(), "upstream");
    let client_ca = TestCa::new(dir.path(), "clients");
    let client = client_ca.issue("gateway", &["tollgate.internal"]);
    let upstream = Upstream::start_tls(
        &upstream_ca.issue("server", &["127.0.0.1"]),
        Some(&client_ca.ca_file),
    )
    .await;

    let with_cert = start_gateway(&gateway_yaml(
        &upstream.https_url(),
        &tls_block(&[
            ("ca_file", &upstream_ca.ca_file),
            ("cert_file", &client.cert_file),
            ("key_file", &client.key_file),
        ]),
    ))
    .await;
    let (status, seen) = get(&with_cert, "/api/x").await;
    assert_eq!(status, 200, "{seen}");
    assert_eq!(seen["headers"]["x-test-client-cert"], "yes");

    let without_cert = start_gateway(&gateway_yaml(
        &upstream.https_url(),
        &tls_block(&[("ca_file", &upstream_ca.ca_file)]),
    ))
    .await;
    assert_eq!(get(&without_cert, "/api/x").await.0, 502);
    assert_eq!(upstream.hits(), 1);
}

#[tokio::test]
async fn a_handshake_that_never_completes_fails_at_the_connect_timeout_not_the_upstream_timeout() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "upstream");
    // Accepts TCP connections and never says a word.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let target = format!("https://{}", silent.local_addr().expect("address"));
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            connections.push(connection);
        }
    });
    let gateway = start_gateway(&gateway_yaml(
        &target,
        &tls_block(&[("ca_file", &ca.ca_file)]),
    ))
    .await;

    let started = Instant::now();
    let (status, body) = get(&gateway, "/api/x").await;
    // 502 from the 500 ms connect_timeout; the upstream timeout (30 s) would have been a 504.
    assert_eq!(status, 502, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ca_file_the_system_roots_are_trusted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "system");
    let upstream = Upstream::start_tls(&ca.issue("server", &["127.0.0.1"]), None).await;
    let config = dir.path().join("gateway.yaml");
    let yaml = gateway_yaml(&upstream.https_url(), "").replace(
        "listen: 127.0.0.1:0",
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0",
    );
    std::fs::write(&config, yaml).expect("write config");
    // rustls-native-certs reads SSL_CERT_FILE instead of the system's store: here, the test CA.
    let mut command = Tollgate::command(&config);
    command
        .env("SSL_CERT_FILE", &ca.ca_file)
        .env_remove("SSL_CERT_DIR")
        .env("RUST_LOG", "warn");
    let gateway = Tollgate::spawn(command);
    let response = client()
        .get(gateway.url("/api/x"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.hits(), 1);
}

#[test]
fn certificate_files_are_relative_to_the_config_and_their_problems_are_located() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "upstream");
    let client = ca.issue("client", &["tollgate.internal"]);
    let write = |name: &str, tls: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, gateway_yaml("https://127.0.0.1:1", tls)).expect("write config");
        path
    };

    // Relative to the config file's folder, not to the working directory.
    let relative = write("relative.yaml", "    tls: { ca_file: upstream-ca.pem }\n");
    let config = tollgate::config::load(&relative).expect("valid");
    let tls = config.upstreams[0].tls.as_ref().expect("tls settings");
    assert_eq!(tls.files().ca_file.as_deref(), Some(ca.ca_file.as_path()));

    let error = |name: &str, tls: &str| {
        tollgate::config::load(&write(name, tls))
            .expect_err("invalid")
            .to_string()
    };
    let missing = error("missing.yaml", "    tls: { ca_file: nowhere.pem }\n");
    assert!(
        missing.contains("missing.yaml:9:12: upstreams.secure.tls.ca_file: cannot read"),
        "{missing}"
    );
    // A key is not a certificate.
    let key_as_ca = error(
        "key-as-ca.yaml",
        &format!(
            "    tls: {{ ca_file: {:?} }}\n",
            client.key_file.display().to_string()
        ),
    );
    assert!(
        key_as_ca.contains("upstreams.secure.tls.ca_file:")
            && key_as_ca.contains("no certificate in it"),
        "{key_as_ca}"
    );
    let half = error(
        "half.yaml",
        &format!(
            "    tls: {{ cert_file: {:?} }}\n",
            client.cert_file.display().to_string()
        ),
    );
    assert!(
        half.contains("upstreams.secure.tls.cert_file: needs key_file too"),
        "{half}"
    );
    let mismatched = error(
        "mismatched.yaml",
        &format!(
            "    tls: {{ cert_file: {:?}, key_file: {:?} }}\n",
            client.cert_file.display().to_string(),
            ca.issue("other", &["x"]).key_file.display().to_string()
        ),
    );
    assert!(
        mismatched.contains("upstreams.secure.tls.key_file: does not go with cert_file"),
        "{mismatched}"
    );
    let bad_name = error(
        "bad-name.yaml",
        "    tls: { server_name: \"not a name\" }\n",
    );
    assert!(
        bad_name.contains("upstreams.secure.tls.server_name: invalid server name"),
        "{bad_name}"
    );
}

#[test]
fn a_tls_block_on_an_upstream_without_https_targets_is_an_error() {
    let yaml = gateway_yaml(
        "http://127.0.0.1:1",
        "    tls: { server_name: api.internal }\n",
    );
    let error = tollgate::config::parse(&yaml, Path::new("plain.yaml"))
        .expect_err("invalid")
        .to_string();
    assert!(
        error.contains("plain.yaml:9:5: upstreams.secure.tls: applies to https targets only"),
        "{error}"
    );
}
