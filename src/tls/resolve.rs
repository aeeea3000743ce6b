//! Choosing the certificate a handshake presents by the name the client asks for (SNI).

use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::Certificate;

/// The certificates of `tls.certificates`, in file order.
#[derive(Debug)]
pub(crate) struct ByName(pub(crate) Vec<Certificate>);

impl ResolvesServerCert for ByName {
    /// A certificate named exactly as asked, else one whose wildcard covers the name, else the first: names nothing
    /// matches and clients that send no name get the first, as nginx's default server.
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let asked = hello.server_name().map(str::to_ascii_lowercase);
        let chosen = asked
            .as_deref()
            .and_then(|name| {
                self.0
                    .iter()
                    .find(|certificate| certificate.named(name))
                    .or_else(|| self.0.iter().find(|certificate| certificate.covers(name)))
            })
            .or_else(|| self.0.first())?;
        Some(Arc::clone(&chosen.key))
    }
}
