//! A rustls client for the gateway's HTTPS listener: a connection trusting a test CA, with a client certificate
//! when given, and one HTTP/1.1 exchange on it written by hand.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::pki::Issued;

/// A TLS connection to `addr` asking for `alpn` (nothing when empty), trusting the CA in `ca_file`, with `api.test`
/// as SNI, presenting `client` when given.
pub async fn connect(
    addr: SocketAddr,
    ca_file: &Path,
    alpn: &[u8],
    client: Option<&Issued>,
) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca_file).expect("ca") {
        roots
            .add(certificate.expect("ca pem"))
            .expect("ca certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some(issued) => {
            let chain = CertificateDer::pem_file_iter(&issued.cert_file)
                .expect("client cert")
                .collect::<Result<Vec<_>, _>>()
                .expect("client cert pem");
            let key = PrivateKeyDer::from_pem_file(&issued.key_file).expect("client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client certificate")
        }
    };
    if !alpn.is_empty() {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("api.test").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake")
}

/// Writes `request` on `stream` and reads one answer (its head and a `content-length` body).
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, request: &str) -> String {
    stream.write_all(request.as_bytes()).await.expect("write");
    super::http_client::read_answer(stream).await
}
