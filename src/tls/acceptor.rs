//! The HTTPS listener's rustls settings, built from `tls:` and built again on reload, which the server's handshakes
//! read.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use rustls::server::{ProducesTickets, WebPkiClientVerifier};
use rustls::version::{TLS12, TLS13};
use rustls::{ServerConfig, SupportedProtocolVersion};

use super::resolve::ByName;
use super::subject::client_certificate;
use super::Certificate;
use super::{TlsSettings, TlsVersion};
use crate::proxy::roots_from_file;
use crate::server::{ClientMark, TlsConfig};

/// A problem with the `tls:` block's files, on the field at fault (`tls.certificates[0].key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsProblem {
    pub field: String,
    pub message: String,
}

/// The TLS settings every new handshake uses, replaced whole on reload (connections open keep theirs).
#[derive(Debug)]
pub struct Acceptor {
    current: ArcSwap<Loaded>,
}

/// What one reading of `tls:` made.
#[derive(Debug)]
struct Loaded {
    config: Arc<ServerConfig>,
    certificates: Arc<Vec<Certificate>>,
    /// The files they were read from, which the config watch reads too: a renewal in place reloads.
    files: Arc<Vec<PathBuf>>,
}

// === impl Acceptor ===

impl Acceptor {
    /// Reads the files of `settings`; every problem found, located, when they cannot serve.
    pub fn new(settings: &TlsSettings) -> Result<Self, Vec<TlsProblem>> {
        let loaded = load(settings)?;
        export_expiry(&loaded.certificates);
        Ok(Self {
            current: ArcSwap::from_pointee(loaded),
        })
    }

    /// Reads the files of `settings` again: new handshakes use them from now on. On a problem the settings in
    /// use stay, and the problems are returned for the log.
    pub fn reload(&self, settings: &TlsSettings) -> Result<(), Vec<TlsProblem>> {
        let loaded = load(settings)?;
        export_expiry(&loaded.certificates);
        self.current.store(Arc::new(loaded));
        Ok(())
    }

    /// The files the certificates in use were read from (chains, keys, the client CA).
    pub fn files(&self) -> Arc<Vec<PathBuf>> {
        Arc::clone(&self.current.load().files)
    }

    /// The certificates presented now, in file order.
    pub fn certificates(&self) -> Arc<Vec<Certificate>> {
        Arc::clone(&self.current.load().certificates)
    }
}

impl TlsConfig for Acceptor {
    fn current(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.current.load().config)
    }

    /// Each request carries the certificate's subject and common name (`key: client_cert`, the `mtls` identifier).
    fn client_mark(&self, certificate: &[u8]) -> Option<ClientMark> {
        let certificate = Arc::new(client_certificate(certificate)?);
        Some(Arc::new(move |extensions: &mut http::Extensions| {
            extensions.insert(Arc::clone(&certificate));
        }))
    }
}

/// Checks the files of `settings` as loading them would (for validation): every problem, located.
pub fn check(settings: &TlsSettings) -> Result<Vec<Certificate>, Vec<TlsProblem>> {
    load(settings).map(|loaded| loaded.certificates.to_vec())
}

/// The rustls settings of `settings`: its certificates by SNI, HTTP/2 and HTTP/1.1 by ALPN, the versions from
/// `min_version`, and client certificates required when it has a `client_ca`.
fn load(settings: &TlsSettings) -> Result<Loaded, Vec<TlsProblem>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut problems = Vec::new();
    let mut certificates = Vec::new();
    for (i, files) in settings.certificates.iter().enumerate() {
        match Certificate::load(files, &provider) {
            Ok(certificate) => certificates.push(certificate),
            Err(error) => problems.push(TlsProblem {
                field: format!("tls.certificates[{i}].{}", error.field),
                message: error.message,
            }),
        }
    }
    let verifier = settings.client_ca.as_ref().and_then(|path| {
        let problem = |message: String| TlsProblem {
            field: "tls.client_ca".to_owned(),
            message,
        };
        let built = roots_from_file(path, "client_ca")
            .map_err(|error| problem(error.message))
            .and_then(|roots| {
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                    .build()
                    .map_err(|error| problem(format!("{}: {error}", path.display())))
            });
        built.map_err(|problem| problems.push(problem)).ok()
    });
    if !problems.is_empty() {
        return Err(problems);
    }
    let versions: &[&SupportedProtocolVersion] = match settings.min_version {
        TlsVersion::V1_2 => &[&TLS13, &TLS12],
        TlsVersion::V1_3 => &[&TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|error| {
            vec![TlsProblem {
                field: "tls.min_version".to_owned(),
                message: error.to_string(),
            }]
        })?;
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let certificates = Arc::new(certificates);
    let mut config = builder.with_cert_resolver(Arc::new(ByName(certificates.to_vec())));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if let Some(ticketer) = ticketer() {
        config.ticketer = ticketer;
    }
    Ok(Loaded {
        config: Arc::new(config),
        certificates,
        files: Arc::new(settings.files()),
    })
}

/// The process's session tickets (stateless resumption, as nginx's `ssl_session_tickets` by default): a client
/// that comes back resumes without the certificate's signature and checks, also after a reload, which keeps the
/// ticketer. rustls's keys are random and rotate every six hours; `None` (no tickets, full handshakes) when the
/// system's random source failed.
fn ticketer() -> Option<Arc<dyn ProducesTickets>> {
    static TICKETER: OnceLock<Option<Arc<dyn ProducesTickets>>> = OnceLock::new();
    TICKETER
        .get_or_init(|| {
            rustls::crypto::ring::Ticketer::new()
                .map_err(|error| tracing::warn!(%error, "TLS session tickets off: every client handshakes in full"))
                .ok()
        })
        .clone()
}

/// `tollgate_tls_certificate_expiry_seconds{name}`: when each certificate expires, in Unix seconds.
fn export_expiry(certificates: &[Certificate]) {
    for certificate in certificates {
        // Unix seconds fit a gauge's f64 exactly.
        #[allow(clippy::cast_precision_loss)]
        let expiry = certificate.not_after as f64;
        metrics::gauge!("tollgate_tls_certificate_expiry_seconds", "name" => certificate.label().to_owned())
            .set(expiry);
    }
}
