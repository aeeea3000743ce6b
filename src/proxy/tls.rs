//! TLS towards `https` upstreams: the rustls client settings an upstream's `tls:` block compiles into.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The files of an upstream's `tls:` block, resolved against the config file's folder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates trusted instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to upstreams that ask for a client certificate.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

/// How an upstream's `https` targets are reached: whom to trust, what to present, which name to expect.
#[derive(Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
    /// The name sent as SNI and required of the certificate; `None`: each target's own host.
    server_name: Option<ServerName<'static>>,
    files: TlsFiles,
}

/// A problem with one field of a `tls:` block, and which field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFieldError {
    /// `ca_file`, `cert_file`, `key_file` or `server_name`; empty for the block (or the system's roots).
    pub field: &'static str,
    pub message: String,
}

/// What a new connection to one `https` target needs: the shared client settings and the target's server name.
#[derive(Clone)]
pub struct TlsDialer {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

// === impl UpstreamTls ===

impl UpstreamTls {
    /// Reads the certificates and key of `files` and checks `server_name`. Without a `ca_file`, the system's roots
    /// (read once per process; `SSL_CERT_FILE` and `SSL_CERT_DIR` override where from) are trusted.
    pub fn load(files: TlsFiles, server_name: Option<&str>) -> Result<Self, TlsFieldError> {
        let server_name = server_name
            .map(|name| {
                ServerName::try_from(name.to_owned()).map_err(|_| TlsFieldError {
                    field: "server_name",
                    message: format!("invalid server name {name:?} (a DNS name or an IP address)"),
                })
            })
            .transpose()?;
        let builder = client_builder(trusted_roots(files.ca_file.as_deref())?)?;
        let mut config = match (&files.cert_file, &files.key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert_file), Some(key_file)) => {
                let chain = certificates(cert_file, "cert_file")?;
                let key = private_key(key_file, "key_file")?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|error| TlsFieldError {
                        field: "key_file",
                        message: format!(
                            "does not go with cert_file {}: {error}",
                            cert_file.display()
                        ),
                    })?
            }
            (Some(_), None) => return Err(needs("cert_file", "key_file")),
            (None, Some(_)) => return Err(needs("key_file", "cert_file")),
        };
        // HTTP/1.1 is all the gateway speaks towards upstreams.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            server_name,
            files,
        })
    }

    /// The files it was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The dialer for a target whose host is `host`: the name to expect is the host, unless `server_name`
    /// overrides it. Fails when the host can be neither a DNS name nor an IP address in a certificate.
    pub fn dialer(&self, host: &str) -> Result<TlsDialer, String> {
        let server_name = match &self.server_name {
            Some(name) => name.clone(),
            // An IPv6 literal's brackets belong to the URL, not to the address.
            None => ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
                .map_err(|_| {
                    format!("host {host:?} cannot be checked against a certificate; set tls.server_name")
                })?
                .to_owned(),
        };
        Ok(TlsDialer {
            connector: TlsConnector::from(self.config.clone()),
            server_name,
        })
    }
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

// === impl TlsDialer ===

impl TlsDialer {
    /// The TLS handshake over a new TCP connection.
    pub async fn handshake(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        self.connector.connect(self.server_name.clone(), tcp).await
    }
}

impl fmt::Debug for TlsDialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsDialer")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// A client's TLS settings trusting `roots`, presenting no certificate and offering no ALPN protocol (the
/// connector using them sets its own): how tollgate reaches an `https://` trace collector.
pub fn client_config(roots: Arc<RootCertStore>) -> Result<ClientConfig, TlsFieldError> {
    Ok(client_builder(roots)?.with_no_client_auth())
}

fn client_builder(
    roots: Arc<RootCertStore>,
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>, TlsFieldError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsFieldError {
            field: "",
            message: error.to_string(),
        })?
        .with_root_certificates(roots))
}

/// The certificates trusted: those of the PEM file `ca_file`, or the system's roots (read once per process;
/// `SSL_CERT_FILE` and `SSL_CERT_DIR` override where from).
pub fn trusted_roots(ca_file: Option<&Path>) -> Result<Arc<RootCertStore>, TlsFieldError> {
    match ca_file {
        Some(path) => Ok(Arc::new(roots_from_file(path, "ca_file")?)),
        None => system_roots(),
    }
}

// === loading ===

fn needs(given: &'static str, missing: &str) -> TlsFieldError {
    TlsFieldError {
        field: given,
        message: format!("needs {missing} too (a client certificate is its chain and its key)"),
    }
}

pub(crate) fn read(path: &Path, field: &'static str) -> Result<Vec<u8>, TlsFieldError> {
    std::fs::read(path).map_err(|error| TlsFieldError {
        field,
        message: format!("cannot read {}: {error}", path.display()),
    })
}

/// Every certificate in the PEM file at `path`; at least one (also the TLS listener's, `crate::tls`).
pub(crate) fn certificates(
    path: &Path,
    field: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsFieldError> {
    let pem = read(path, field)?;
    let invalid = |detail: String| TlsFieldError {
        field,
        message: format!("{}: {detail}", path.display()),
    };
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid(format!("invalid PEM: {error}")))?;
    if certificates.is_empty() {
        return Err(invalid(
            "no certificate in it (expected PEM \"BEGIN CERTIFICATE\" sections)".to_owned(),
        ));
    }
    Ok(certificates)
}

pub(crate) fn roots_from_file(
    path: &Path,
    field: &'static str,
) -> Result<RootCertStore, TlsFieldError> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path, field)? {
        roots.add(certificate).map_err(|error| TlsFieldError {
            field,
            message: format!("{}: unusable certificate: {error}", path.display()),
        })?;
    }
    Ok(roots)
}

pub(crate) fn private_key(
    path: &Path,
    field: &'static str,
) -> Result<PrivateKeyDer<'static>, TlsFieldError> {
    let pem = read(path, field)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|error| TlsFieldError {
        field,
        message: format!(
            "{}: no private key in it ({error}; expected a PEM PRIVATE KEY section)",
            path.display()
        ),
    })
}

/// The system's trusted roots, read at the first `https` upstream without a `ca_file` and kept for the process.
fn system_roots() -> Result<Arc<RootCertStore>, TlsFieldError> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    let roots = ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!(%error, "skipping unreadable system root certificates");
        }
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(found.certs);
        Arc::new(roots)
    });
    if roots.is_empty() {
        return Err(TlsFieldError {
            field: "ca_file",
            message: "no trusted root certificates found on this system: install them (Debian: ca-certificates) or \
                      set ca_file"
                .to_owned(),
        });
    }
    Ok(roots.clone())
}
