//! The HTTP listener: accepts connections, applies the server limits, serves HTTP/1.1 and h2c, and drains
//! in-flight requests on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use thiserror::Error;
use tokio::net::TcpListener;

use super::Gateway;
use crate::config::ServerSettings;

/// Why serving stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// In-flight requests did not finish within the grace period.
    #[error("{0} connections still open after the shutdown grace period")]
    GraceExpired(usize),
}

/// Serves `gateway` on `listener` until `shutdown` completes, then stops accepting and gives in-flight requests
/// up to `settings.shutdown_grace` to finish.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    settings: &ServerSettings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: keep serving the connections we have.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        let service = service_fn(move |request: hyper::Request<Incoming>| {
            let gateway = gateway.clone();
            async move { Ok::<_, Infallible>(gateway.handle(request.map(Body::new), peer).await) }
        });
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }

    drop(listener);
    tracing::info!(grace = ?settings.shutdown_grace, "draining in-flight requests");
    let open = graceful.count();
    match tokio::time::timeout(settings.shutdown_grace, graceful.shutdown()).await {
        Ok(()) => Ok(()),
        Err(_) => Err(ServeError::GraceExpired(open)),
    }
}
