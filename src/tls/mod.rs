//! TLS termination on the gateway's HTTPS listener: its settings, certificates and their choice by SNI, and the
//! rustls settings its handshakes use.

#[cfg(feature = "gateway")]
mod acceptor;
#[cfg(feature = "gateway")]
mod certificate;
#[cfg(feature = "gateway")]
mod resolve;
mod settings;
#[cfg(feature = "gateway")]
mod subject;
#[cfg(feature = "gateway")]
mod x509;

#[cfg(feature = "gateway")]
pub use acceptor::{check, Acceptor, TlsProblem};
#[cfg(feature = "gateway")]
pub use certificate::Certificate;
pub use settings::{CertificateFiles, TlsSettings, TlsVersion};
#[cfg(feature = "gateway")]
pub use subject::client_certificate;
