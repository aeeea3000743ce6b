//! `tls:`, the HTTPS listener: its address, certificates chosen by SNI, mutual TLS and the oldest version, each file
//! read as the listener would read it so that a bad one is a located error.

use std::path::Path;

use serde::Deserialize;

use super::raw::scalar_text;
use super::validate::{socket_addr, Issues};
use crate::config::{CertificateFiles, TlsSettings, TlsVersion};

/// `tls:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub listen: String,
    #[serde(default)]
    pub certificates: Vec<RawCertificate>,
    #[serde(default)]
    pub client_ca: Option<String>,
    #[serde(default = "default_min_version", deserialize_with = "scalar_text")]
    pub min_version: String,
}

/// One entry of `tls.certificates`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCertificate {
    pub cert: String,
    pub key: String,
    #[serde(default)]
    pub hosts: Vec<String>,
}

fn default_min_version() -> String {
    "1.2".to_owned()
}

/// `tls:` validated, its files resolved against `folder` and read.
pub(crate) fn tls(issues: &mut Issues, raw: &RawTls, folder: &Path) -> Option<TlsSettings> {
    let before = issues.count();
    let listen = socket_addr(issues, "tls.listen", &raw.listen);
    let min_version = match raw.min_version.trim() {
        "1.2" => Some(TlsVersion::V1_2),
        "1.3" => Some(TlsVersion::V1_3),
        other => {
            issues.add(
                "tls.min_version",
                format!("unknown TLS version {other:?} (use \"1.2\" or \"1.3\")"),
            );
            None
        }
    };
    if raw.certificates.is_empty() {
        issues.add(
            "tls.certificates",
            "HTTPS needs at least one certificate ({ cert: FILE, key: FILE })",
        );
    }
    let certificates = raw
        .certificates
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            for (j, host) in entry.hosts.iter().enumerate() {
                check_host(issues, &format!("tls.certificates[{i}].hosts[{j}]"), host);
            }
            CertificateFiles {
                cert: folder.join(&entry.cert),
                key: folder.join(&entry.key),
                hosts: entry.hosts.clone(),
            }
        })
        .collect();
    if issues.count() != before {
        return None;
    }
    let settings = TlsSettings {
        listen: listen?,
        certificates,
        client_ca: raw.client_ca.as_ref().map(|file| folder.join(file)),
        min_version: min_version?,
    };
    read_files(issues, &settings);
    (issues.count() == before).then_some(settings)
}

/// A name of `hosts`: a DNS name, or `*.` and one.
fn check_host(issues: &mut Issues, at: &str, host: &str) {
    let name = host.strip_prefix("*.").unwrap_or(host);
    let valid = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        issues.add(
            at,
            format!("invalid host name {host:?} (a DNS name, or *. and one: *.example.com)"),
        );
    }
}

/// The certificates, keys and client CA read as the listener reads them: unreadable, mismatched and expired files
/// are found at `check` and at reload, not at the first handshake.
#[cfg(feature = "gateway")]
fn read_files(issues: &mut Issues, settings: &TlsSettings) {
    if let Err(problems) = crate::tls::check(settings) {
        for problem in problems {
            issues.add(problem.field, problem.message);
        }
    }
}

/// Without the gateway there is no HTTPS listener to serve `tls:`.
#[cfg(not(feature = "gateway"))]
fn read_files(issues: &mut Issues, _settings: &TlsSettings) {
    issues.add(
        "tls",
        "this build has no HTTPS listener (the `gateway` feature serves tls:)",
    );
}
