//! The listener: accepts connections (backing off when out of file descriptors) and hands each to its own task;
//! at shutdown, closes and gives the connections open the grace period.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;

use super::connection::{serve_connection, Builders};
use super::descriptors::{connection_error, out_of_descriptors, Exhaustion};
use super::drain::Drain;
use super::tls::serve_tls_connection;
use super::{Handler, Settings, Shutdown, TlsConfig};

/// Why serving stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// In-flight requests did not finish within the grace period.
    #[error("{0} connections still open after the shutdown grace period")]
    GraceExpired(usize),
}

/// Serves `handler` on `listener` until `close` completes, then stops accepting and gives in-flight requests up to
/// `settings.shutdown_grace` to finish (less if `shutdown` is cut). The connections are counted in `shutdown`.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: H,
    settings: &Settings,
    shutdown: &Shutdown,
    close: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    accept(listener, None, handler, settings, shutdown, close).await
}

/// [`serve`] over TLS: each connection's handshake with the settings `tls` holds then, then served as a clear-text
/// one.
pub async fn serve_tls<H: Handler>(
    listener: TcpListener,
    tls: Arc<dyn TlsConfig>,
    handler: H,
    settings: &Settings,
    shutdown: &Shutdown,
    close: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    accept(listener, Some(tls), handler, settings, shutdown, close).await
}

/// The accept loop of both, then the drain.
async fn accept<H: Handler>(
    listener: TcpListener,
    tls: Option<Arc<dyn TlsConfig>>,
    handler: H,
    settings: &Settings,
    shutdown: &Shutdown,
    close: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let builders = Arc::new(Builders::new(settings));
    let drain = Drain::new();
    shutdown.count(&drain);
    let close = close;
    tokio::pin!(close);

    let mut exhausted: Option<Exhaustion> = None;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    if let Some(episode) = exhausted.take() {
                        episode.end();
                    }
                    accepted
                }
                Err(error) => {
                    // Out of file descriptors: keep serving the connections we have, and back off (logged once
                    // per episode) rather than spin on accepts that fail.
                    let pause = if out_of_descriptors(&error) {
                        match &mut exhausted {
                            Some(episode) => episode.again(),
                            None => exhausted.insert(Exhaustion::begin(&error)).pause(),
                        }
                    } else if connection_error(&error) {
                        continue;
                    } else {
                        tracing::warn!(%error, "accept failed");
                        Duration::from_millis(50)
                    };
                    tokio::select! {
                        () = tokio::time::sleep(pause) => continue,
                        () = &mut close => break,
                    }
                }
            },
            () = &mut close => break,
        };
        let _ = stream.set_nodelay(true);
        let (handler, builders, watcher) = (handler.clone(), builders.clone(), drain.watcher());
        let within = settings.header_read_timeout;
        match &tls {
            None => tokio::spawn(serve_connection(
                stream, peer, handler, builders, watcher, within,
            )),
            Some(tls) => tokio::spawn(serve_tls_connection(
                stream,
                peer,
                handler,
                builders,
                watcher,
                within,
                Arc::clone(tls),
            )),
        };
    }

    drop(listener);
    drain_connections(&drain, settings, shutdown).await
}

/// The listener closed: the connections still open get `shutdown_grace` to finish their requests, or less when a
/// second signal asks for the cut; `Err` with how many were cut.
async fn drain_connections(
    drain: &Drain,
    settings: &Settings,
    shutdown: &Shutdown,
) -> Result<(), ServeError> {
    let open = drain.open();
    tracing::info!(
        connections = open,
        grace = ?settings.shutdown_grace,
        "listener closed: in-flight requests get the grace period"
    );
    let finished = tokio::select! {
        // The connections first: a cut (a second signal) with none left open cuts nothing.
        biased;
        finished = tokio::time::timeout(settings.shutdown_grace, drain.shutdown()) => finished.is_ok(),
        () = shutdown.cut_requested() => false,
    };
    if finished {
        tracing::info!(connections = open, "drained: every connection finished");
        return Ok(());
    }
    let cut = drain.open();
    tracing::warn!(
        finished = open - cut.min(open),
        cut,
        "drain ended with connections still open: they are cut"
    );
    Err(ServeError::GraceExpired(cut))
}
