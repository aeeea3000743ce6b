//! One certificate of `tls.certificates`: its chain and key read and checked together, its names and expiry.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;

use super::x509::{facts, format_utc};
use super::CertificateFiles;
use crate::proxy::{certificates, private_key, TlsFieldError};

/// A certificate ready to present.
#[derive(Debug, Clone)]
pub struct Certificate {
    pub(crate) key: Arc<CertifiedKey>,
    /// The names it serves: its `hosts`, or else the DNS names in it.
    pub names: Vec<String>,
    /// When it expires, in seconds since the Unix epoch.
    pub not_after: i64,
    /// The chain's file, as the config names it.
    pub file: String,
}

// === impl Certificate ===

impl Certificate {
    /// Reads `files`: the chain (`cert`) and the key (`key`) must go together, and the certificate must not have
    /// expired. The error names the field at fault.
    pub fn load(
        files: &CertificateFiles,
        provider: &CryptoProvider,
    ) -> Result<Self, TlsFieldError> {
        let chain = certificates(&files.cert, "cert")?;
        let key = private_key(&files.key, "key")?;
        let facts = facts(&chain[0]).ok_or_else(|| TlsFieldError {
            field: "cert",
            message: format!("{}: not an X.509 certificate", files.cert.display()),
        })?;
        let key = CertifiedKey::from_der(chain, key, provider).map_err(|error| {
            let why = match error {
                rustls::Error::InconsistentKeys(_) => {
                    "its public key is not the certificate's".to_owned()
                }
                other => other.to_string(),
            };
            TlsFieldError {
                field: "key",
                message: format!(
                    "{} does not go with cert {} ({why})",
                    files.key.display(),
                    files.cert.display()
                ),
            }
        })?;
        if facts.not_after < unix_now() {
            return Err(TlsFieldError {
                field: "cert",
                message: format!(
                    "{} expired on {}",
                    files.cert.display(),
                    format_utc(facts.not_after)
                ),
            });
        }
        let names = if files.hosts.is_empty() {
            facts.dns_names
        } else {
            files.hosts.clone()
        };
        Ok(Self {
            key: Arc::new(key),
            names: names.iter().map(|name| name.to_ascii_lowercase()).collect(),
            not_after: facts.not_after,
            file: files.cert.display().to_string(),
        })
    }

    /// Its expiry as `YYYY-MM-DDTHH:MM:SSZ`.
    pub fn expires(&self) -> String {
        format_utc(self.not_after)
    }

    /// Whether `name` (lower case) is one of its names.
    pub(crate) fn named(&self, name: &str) -> bool {
        self.names.iter().any(|pattern| pattern == name)
    }

    /// Whether one of its `*.rest` names covers `name` (lower case): `rest` with one more label in front.
    pub(crate) fn covers(&self, name: &str) -> bool {
        let Some((label, rest)) = name.split_once('.') else {
            return false;
        };
        !label.is_empty()
            && self
                .names
                .iter()
                .any(|pattern| pattern.strip_prefix("*.") == Some(rest))
    }

    /// What names it in metrics: its first name, or its file when it has none.
    pub fn label(&self) -> &str {
        self.names.first().map_or(&self.file, String::as_str)
    }
}

/// Seconds since the Unix epoch now.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}
