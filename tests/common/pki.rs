//! Test certificates: a CA made for one test and the server or client certificates it signs, as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority of its own, its certificate written to `<dir>/<name>-ca.pem`.
pub struct TestCa {
    key: KeyPair,
    cert: Certificate,
    dir: PathBuf,
    name: String,
    /// The CA certificate's PEM file: what a peer trusts.
    pub ca_file: PathBuf,
}

/// A certificate signed by a [`TestCa`] and its private key, as PEM files.
pub struct Issued {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate().expect("ca key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, format!("tollgate test CA {name}"));
        let cert = params.self_signed(&key).expect("ca cert");
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, cert.pem()).expect("write ca pem");
        Self {
            key,
            cert,
            dir: dir.to_owned(),
            name: name.to_owned(),
            ca_file,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses; the first is also the common name), written to
    /// `<dir>/<name>-<stem>-cert.pem` and `-key.pem`.
    pub fn issue(&self, stem: &str, names: &[&str]) -> Issued {
        self.issue_with(stem, names, KeyPair::generate().expect("key"), None)
    }

    /// [`issue`](Self::issue) with `key` (ECDSA P-256 by default; Ed25519, or an RSA key read from PEM), and when
    /// `not_after` is given, valid until then (in the past: expired).
    pub fn issue_with(
        &self,
        stem: &str,
        names: &[&str],
        key: KeyPair,
        not_after: Option<(i32, u8, u8)>,
    ) -> Issued {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or(stem));
        if let Some((year, month, day)) = not_after {
            params.not_before = rcgen::date_time_ymd(year - 1, month, day);
            params.not_after = rcgen::date_time_ymd(year, month, day);
        }
        self.sign(stem, params, key)
    }

    /// A client certificate whose subject is `subject`, in DER order (the most general first, as `O` before `CN`),
    /// without alternative names, written as [`issue`](Self::issue) writes.
    pub fn issue_client(&self, stem: &str, subject: &[(DnType, &str)]) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        self.sign(stem, params, KeyPair::generate().expect("key"))
    }

    /// `params` signed by this CA for `key`, written to `<dir>/<name>-<stem>-cert.pem` and `-key.pem`.
    fn sign(&self, stem: &str, params: CertificateParams, key: KeyPair) -> Issued {
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed cert");
        let write = |suffix: &str, pem: String| {
            let path = self.dir.join(format!("{}-{stem}-{suffix}", self.name));
            std::fs::write(&path, pem).expect("write pem");
            path
        };
        Issued {
            cert_file: write("cert.pem", cert.pem()),
            key_file: write("key.pem", key.serialize_pem()),
        }
    }
}
