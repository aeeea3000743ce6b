//! `tls:` as the gateway runs it: the HTTPS listener's address, its certificates' files, mutual TLS, the oldest
//! version.

use std::net::SocketAddr;
use std::path::PathBuf;

/// `tls:`: the HTTPS listener and what it presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Where HTTPS is served (HTTP/2 and HTTP/1.1, chosen by ALPN).
    pub listen: SocketAddr,
    /// Chosen by the name the client asks for (SNI); the first serves every other name, and clients without SNI.
    pub certificates: Vec<CertificateFiles>,
    /// Mutual TLS: clients must present a certificate signed by one of these (a PEM file).
    pub client_ca: Option<PathBuf>,
    /// The oldest TLS version accepted.
    pub min_version: TlsVersion,
}

// === impl TlsSettings ===

impl TlsSettings {
    /// Every file the listener reads: each certificate chain and key, and the client CA.
    pub fn files(&self) -> Vec<PathBuf> {
        self.certificates
            .iter()
            .flat_map(|entry| [entry.cert.clone(), entry.key.clone()])
            .chain(self.client_ca.clone())
            .collect()
    }
}

/// One entry of `tls.certificates`, its files resolved against the config file's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// The PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// Its PEM private key (RSA, ECDSA or Ed25519).
    pub key: PathBuf,
    /// The names it serves (`*.example.com` for one label); empty: the DNS names in the certificate.
    pub hosts: Vec<String>,
}

/// `tls.min_version`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3 (the default).
    #[default]
    V1_2,
    /// TLS 1.3 only.
    V1_3,
}
