//! The gateway on a listener: `server`'s connections, each request handed to the gateway's request path.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::handler::{handle_on, InMap};
use super::Gateway;
use crate::config::ServerSettings;
use crate::head_lines::HeadLines;
use crate::proxy::ClientBody;
use crate::server::{self, ServeError};
use crate::tls::Acceptor;

/// The gateway's listeners: clear-text HTTP, HTTPS, or both.
#[derive(Debug, Default)]
pub struct Listeners {
    /// `listen:`
    pub plain: Option<TcpListener>,
    /// `tls.listen:` and the TLS settings its handshakes use.
    pub tls: Option<(TcpListener, Arc<Acceptor>)>,
}

/// Serves `gateway` on `listeners` until `shutdown` completes, then stops accepting on all of them at once and gives
/// in-flight requests up to `settings.shutdown_grace` to finish.
pub async fn serve(
    listeners: Listeners,
    gateway: Arc<Gateway>,
    settings: &ServerSettings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let connections = server::Settings {
        header_read_timeout: settings.header_read_timeout,
        keepalive_timeout: settings.keepalive_timeout,
        max_header_bytes: settings.max_header_bytes,
        shutdown_grace: settings.shutdown_grace,
    };
    let served = Served {
        gateway: Arc::clone(&gateway),
        body_read_timeout: settings.body_read_timeout,
    };
    // One signal closes both listeners.
    let (closing, closed) = watch::channel(false);
    let close = || {
        let mut closed = closed.clone();
        async move {
            let _ = closed.wait_for(|closed| *closed).await;
        }
    };
    let signal = async move {
        shutdown.await;
        let _ = closing.send(true);
    };
    let plain = async {
        match listeners.plain {
            Some(listener) => {
                let shutdown = gateway.shutdown();
                server::serve(listener, served.clone(), &connections, shutdown, close()).await
            }
            None => Ok(()),
        }
    };
    let tls = async {
        match listeners.tls {
            Some((listener, acceptor)) => {
                let shutdown = gateway.shutdown();
                let served = served.clone();
                let acceptor: Arc<dyn server::TlsConfig> = acceptor;
                server::serve_tls(listener, acceptor, served, &connections, shutdown, close()).await
            }
            None => Ok(()),
        }
    };
    let ((), plain, tls) = tokio::join!(signal, plain, tls);
    plain.and(tls)
}

/// The gateway as the server's handler: with `server.body_read_timeout`, which each request's body is held to.
#[derive(Debug, Clone)]
struct Served {
    gateway: Arc<Gateway>,
    body_read_timeout: Duration,
}

impl server::Handler for Served {
    type Body = Body;

    /// The gateway's request future itself (see `handle_on`), with the body prepared inside it.
    #[inline]
    fn handle(
        served: Option<Self>,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static {
        let (gateway, body_read_timeout) = match served {
            Some(Served {
                gateway,
                body_read_timeout,
            }) => (Some(gateway), body_read_timeout),
            // A head over the limit: its body is never read.
            None => (None, Duration::ZERO),
        };
        // The body's errors are marked as the client's, so that they are never taken for an upstream failure, and
        // its reading is held to `server.body_read_timeout`. Wrapped inside the future: a request made here and
        // moved in would be copied with the future where it is built.
        let prepare = move |request: Request<Incoming>| {
            request.map(|body| Body::new(ClientBody::new(body, body_read_timeout)))
        };
        handle_on(gateway, request, peer, prepare, InMap)
    }

    /// As `handle`, for a request read whole: nothing left to read, nothing to time.
    #[inline]
    fn handle_whole(
        served: Self,
        request: Request<Bytes>,
        peer: SocketAddr,
        lines: Vec<u8>,
    ) -> impl Future<Output = Result<(Response<Body>, Vec<u8>), Infallible>> + Send + 'static {
        let gateway = Some(served.gateway);
        // Its answer's head is written by the server itself: the rate-limit fields and `x-request-id` go as head
        // lines.
        let prepare = |request: Request<Bytes>| {
            request.map(|body| {
                if body.is_empty() {
                    Body::empty()
                } else {
                    Body::from(body)
                }
            })
        };
        handle_on(
            gateway,
            request,
            peer,
            prepare,
            HeadLines::from_buffer(lines),
        )
    }
}
