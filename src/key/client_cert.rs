//! The verified client certificate a request came with (mutual TLS), as key parts and identifiers read it.

/// What tollgate reads of a connection's verified client certificate, once per connection (the HTTPS listener with
/// `tls.client_ca` reads it after the handshake and hands it to each request of the connection): its subject, the
/// `client_cert` key part, and its common name, which the `mtls` identifier names the consumer by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    subject: Box<str>,
    common_name: Option<Box<str>>,
}

// === impl ClientCertificate ===

impl ClientCertificate {
    /// A certificate whose subject, written as RFC 4514 writes a distinguished name, is `subject`, and whose common
    /// name (the last `CN` of its subject), if any, is `common_name`.
    pub fn new(subject: String, common_name: Option<String>) -> Self {
        Self {
            subject: subject.into_boxed_str(),
            common_name: common_name.map(String::into_boxed_str),
        }
    }

    /// The subject as RFC 4514 writes it (`CN=client-a,O=Example Corp,C=DE`): the `client_cert` key part.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The subject's common name (its last `CN`, the most specific), if it has one.
    pub fn common_name(&self) -> Option<&str> {
        self.common_name.as_deref()
    }
}
