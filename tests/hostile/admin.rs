//! An exposed admin API: refused on a public address without a token, and tokens of another length or with the
//! right prefix refused.

use crate::common;
use crate::common::http_client::client;
use crate::common::start_gateway;
use crate::common::upstream::Upstream;
use crate::yaml;

#[test]
fn admin_on_a_public_address_without_token_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exposed.yaml");
    // Refused before binding anything: port 0 would do if it did bind.
    let yaml = "listen: 127.0.0.1:0\nadmin:\n  listen: 0.0.0.0:0\nstore:\n  backend: memory\n";
    std::fs::write(&path, yaml).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["run", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("admin.token"), "{stderr}");
}

#[tokio::test]
async fn admin_token_of_another_length_or_with_the_right_prefix_is_401() {
    const TOKEN: &str = "s3cret-admin-token";
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    let admin = common::serve_admin(&gateway, Some(TOKEN)).await;
    let client = client();
    let url = format!("{admin}/limits/api/per-ip?key=1.2.3.4");
    let longer = format!("{TOKEN}{}", "x".repeat(1000));
    for wrong in [
        "s",
        "s3cret-admin-toke",
        "s3cret-admin-tokenX",
        "s3cret-admin-tokeN",
        &longer,
    ] {
        let response = client.get(&url).bearer_auth(wrong).send().await.unwrap();
        assert_eq!(response.status(), 401, "{wrong:.30}");
    }
    let response = client.get(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(response.status(), 200);
}
