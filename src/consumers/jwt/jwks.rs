//! JWKS documents: read from a file at start, or fetched over http(s) and refreshed by a background task.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::http1;
use hyper::rt::{Read, Write};
use hyper_util::rt::TokioIo;
use jsonwebtoken::Algorithm;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::keys::KeySet;
use super::rejection::JwtSetupError;
use super::verifier::Shared;
use crate::proxy::{TlsDialer, TlsFiles, UpstreamTls};

/// A JWKS is a few KB; a larger answer is not one.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// One fetch (connect, TLS, request, body) gives up after this long.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries after a failed fetch start at this and double up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where a JWKS is fetched from, resolved once: the address to dial, TLS for `https`, the request target.
pub(crate) struct JwksUrl {
    url: Uri,
    host: String,
    port: u16,
    tls: Option<TlsDialer>,
}

/// The background fetches of one verifier's JWKS URL. The task holds the verifier weakly, and the verifier aborts
/// it when dropped (a reload builds a new verifier; the old one's task must not live on).
pub(crate) struct Refresher {
    pub url: JwksUrl,
    pub every: Duration,
    pub asked: Arc<Notify>,
    pub verifier: Weak<Shared>,
}

/// Aborts a spawned task when dropped.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub tokio::task::AbortHandle);

// === reading ===

/// The keys of the JWKS file at `path` usable with `algorithms`; the error names the file.
pub(crate) fn read_file(
    path: &Path,
    algorithms: &[Algorithm],
    generation: u64,
) -> Result<KeySet, JwtSetupError> {
    let json = std::fs::read(path).map_err(|source| JwtSetupError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    KeySet::from_jwks(&json, algorithms, generation).map_err(|message| JwtSetupError::InvalidFile {
        path: path.to_owned(),
        message,
    })
}

/// The last JWKS document fetched from `url` in this process, if any.
///
/// A config reload builds new verifiers: one for a URL an old one fetched starts with those keys, not with none.
/// Without them it would refuse every token as `keys_unavailable` until its own first fetch, and for as long as
/// the identity provider is down, although the process had the keys a moment before.
pub(crate) fn remembered(url: &Uri) -> Option<Bytes> {
    fetched().lock().get(&url.to_string()).cloned()
}

fn remember(url: &Uri, json: &Bytes) {
    fetched().lock().insert(url.to_string(), json.clone());
}

/// One document per URL configured since the process started: a handful.
fn fetched() -> &'static Mutex<HashMap<String, Bytes>> {
    static FETCHED: OnceLock<Mutex<HashMap<String, Bytes>>> = OnceLock::new();
    FETCHED.get_or_init(Mutex::default)
}

// === impl JwksUrl ===

impl JwksUrl {
    /// Checks that `url` can be fetched: `http` or `https` with a host; `https` trusts the system's roots.
    pub fn new(url: &Uri) -> Result<Self, JwtSetupError> {
        let invalid = |message: String| JwtSetupError::InvalidUrl {
            url: url.to_string(),
            message,
        };
        let https = match url.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(invalid("the scheme must be http or https".to_owned())),
        };
        let host = url
            .host()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| invalid("no host".to_owned()))?;
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let tls = UpstreamTls::load(TlsFiles::default(), None)
                .map_err(|error| invalid(error.message))?;
            Some(tls.dialer(host).map_err(invalid)?)
        } else {
            None
        };
        Ok(Self {
            url: url.clone(),
            // An IPv6 literal's brackets belong to the URL, not to the address dialled.
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            tls,
        })
    }

    /// The document, or why not (for the log).
    pub async fn fetch(&self) -> Result<Bytes, String> {
        match tokio::time::timeout(FETCH_TIMEOUT, self.fetch_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {FETCH_TIMEOUT:?}")),
        }
    }

    async fn fetch_unbounded(&self) -> Result<Bytes, String> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|error| format!("cannot connect: {error}"))?;
        match &self.tls {
            None => self.exchange(TokioIo::new(tcp)).await,
            Some(tls) => {
                let stream = tls
                    .handshake(tcp)
                    .await
                    .map_err(|error| format!("TLS handshake failed: {error}"))?;
                self.exchange(TokioIo::new(stream)).await
            }
        }
    }

    /// One GET on a connection of its own: a fetch every few minutes does not need a pool.
    async fn exchange<T>(&self, io: T) -> Result<Bytes, String>
    where
        T: Read + Write + Unpin + Send + 'static,
    {
        let (mut sender, connection) = http1::handshake::<_, Empty<Bytes>>(io)
            .await
            .map_err(|error| format!("HTTP handshake failed: {error}"))?;
        let connection = tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "JWKS connection closed with an error");
            }
        });
        let target = self
            .url
            .path_and_query()
            .map_or("/", |target| target.as_str());
        let authority = self.url.authority().map_or("", |a| a.as_str());
        let request = Request::get(target)
            .header(header::HOST, authority)
            .header(header::ACCEPT, "application/json, application/jwk-set+json")
            .header(
                header::USER_AGENT,
                concat!("tollgate/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::new())
            .map_err(|error| format!("invalid request: {error}"))?;
        let result = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|error| format!("request failed: {error}"))?;
            if response.status() != StatusCode::OK {
                return Err(format!("answered {}", response.status()));
            }
            Limited::new(response.into_body(), MAX_JWKS_BYTES)
                .collect()
                .await
                .map(|body| body.to_bytes())
                .map_err(|error| format!("reading the body failed: {error}"))
        }
        .await;
        connection.abort();
        result
    }
}

impl std::fmt::Debug for JwksUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksUrl")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

// === impl Refresher ===

impl Refresher {
    /// Fetches until the verifier is gone: every `every` after a success, sooner when asked (a token named an
    /// unknown `kid`), with a growing backoff after a failure. A failed refresh keeps the keys already held.
    pub async fn run(self) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let wait = match self.url.fetch().await {
                Ok(json) => {
                    let Some(verifier) = self.verifier.upgrade() else {
                        return;
                    };
                    match verifier.install_jwks(&json) {
                        Ok(()) => {
                            metrics::counter!("tollgate_jwks_fetches_total", "result" => "ok")
                                .increment(1);
                            remember(&self.url.url, &json);
                            backoff = FIRST_BACKOFF;
                            self.every
                        }
                        Err(why) => {
                            metrics::counter!("tollgate_jwks_fetches_total", "result" => "error")
                                .increment(1);
                            tracing::warn!(url = %self.url.url, %why, "JWKS refused; will retry (keys already held stay in use)");
                            next_backoff(&mut backoff)
                        }
                    }
                }
                Err(why) => {
                    metrics::counter!("tollgate_jwks_fetches_total", "result" => "error")
                        .increment(1);
                    tracing::warn!(url = %self.url.url, %why, "JWKS fetch failed; will retry (keys already held stay in use)");
                    next_backoff(&mut backoff)
                }
            };
            if self.verifier.strong_count() == 0 {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.asked.notified() => {}
            }
        }
    }
}

/// The wait before the next try, doubling the one after it up to `MAX_BACKOFF`.
fn next_backoff(backoff: &mut Duration) -> Duration {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    wait
}

// === impl AbortOnDrop ===

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
