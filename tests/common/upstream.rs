//! A real upstream HTTP (or HTTPS) server on a free loopback port that echoes what it received and counts requests.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::routing::any;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use http::HeaderValue;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::pki::Issued;

/// A running upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Starts the upstream. a path ending in `/slow` answers after 3 s; every other path echoes the request as JSON:
    /// `{"method", "path", "query", "headers": {name: value}, "body"}` (a header's lines joined by `\n`).
    pub async fn start() -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let app = Router::new().fallback(any(echo)).with_state(hits.clone());
        let (listener, addr, connections) = counted_listener().await;
        let accepted = connections.clone();
        let listener = listener.tap_io(move |_| {
            accepted.fetch_add(1, Ordering::SeqCst);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            hits,
            connections,
            task,
        }
    }

    /// The same upstream over TLS, presenting `server`'s certificate, and when `client_ca` is given requiring a
    /// client certificate signed by it. The echo's headers also carry what the TLS handshake showed:
    /// `x-test-sni` (the server name the client asked for, or `-`) and `x-test-client-cert` (`yes` or `no`).
    pub async fn start_tls(server: &Issued, client_ca: Option<&Path>) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let app = Router::new().fallback(any(echo)).with_state(hits.clone());
        let tls = serve_tls(app, server, client_ca).await;
        Self {
            addr: tls.addr,
            hits,
            connections: tls.connections,
            task: tls.task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A router served over TLS on a free loopback port.
pub struct TlsServer {
    pub addr: SocketAddr,
    /// TCP connections accepted so far, handshakes that failed included.
    pub connections: Arc<AtomicUsize>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Serves `app` over TLS (HTTP/1.1 with upgrades, or HTTP/2), presenting `server`'s certificate and, when
/// `client_ca` is given, requiring a client certificate signed by it. Each request carries what its connection's
/// handshake showed: `x-test-sni` (the server name the client asked for, or `-`) and `x-test-client-cert` (`yes`
/// or `no`).
pub async fn serve_tls(app: Router, server: &Issued, client_ca: Option<&Path>) -> TlsServer {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(server, client_ca)));
    let (listener, addr, connections) = counted_listener().await;
    let accepted = connections.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A refused handshake (untrusted client, no client certificate) just closes the connection.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (_, session) = tls.get_ref();
                let sni = session.server_name().unwrap_or("-").to_owned();
                let client_cert = if session.peer_certificates().is_some() {
                    "yes"
                } else {
                    "no"
                };
                let app = app.map_request(move |mut request: http::Request<Incoming>| {
                    let headers = request.headers_mut();
                    headers.insert("x-test-sni", sni.parse().expect("sni header"));
                    headers.insert("x-test-client-cert", HeaderValue::from_static(client_cert));
                    request
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(
                        TokioIo::new(tls),
                        TowerToHyperService::new(app),
                    )
                    .await;
            });
        }
    });
    TlsServer {
        addr,
        connections,
        task,
    }
}

/// A listener on a free loopback port, its address, and the counter its accepted connections are to be counted in.
async fn counted_listener() -> (TcpListener, SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("upstream addr");
    (listener, addr, Arc::new(AtomicUsize::new(0)))
}

fn server_config(server: &Issued, client_ca: Option<&Path>) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_file_iter(&server.cert_file)
        .expect("cert file")
        .collect::<Result<Vec<_>, _>>()
        .expect("cert pem");
    let key = PrivateKeyDer::from_pem_file(&server.key_file).expect("key pem");
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).expect("client ca file") {
                roots.add(cert.expect("client ca pem")).expect("client ca");
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder
        .with_single_cert(chain, key)
        .expect("server certificate")
}

async fn echo(State(hits): State<Arc<AtomicUsize>>, request: Request) -> Json<Value> {
    hits.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let request = Request::from_parts(parts, ());
    if request.uri().path().ends_with("/slow") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // A header sent on several lines is echoed as its lines joined by newlines, so that tests can tell one line
    // from several.
    let mut headers = Map::new();
    for (name, value) in request.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        let joined = match headers.get(name.as_str()).and_then(Value::as_str) {
            Some(earlier) => format!("{earlier}\n{value}"),
            None => value,
        };
        headers.insert(name.as_str().to_owned(), Value::from(joined));
    }
    Json(json!({
        "method": request.method().as_str(),
        "path": request.uri().path(),
        "query": request.uri().query(),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }))
}
