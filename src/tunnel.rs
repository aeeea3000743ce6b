//! A WebSocket tunnel's open/closed signal: held by the proxy's tunnel while it is open, awaited by admission's work
//! kept for after the answer. Below both (neither names the other for it), and public as `tollgate::admission`'s.

/// Put in the extensions of a `101 Switching Protocols` answer by what opened its tunnel (the gateway's WebSocket
/// proxying): the answer's body ends with its head, but the request lasts until the tunnel closes, and the work
/// kept for after the answer (a concurrency slot) waits for that. See [`tunnel`].
#[derive(Debug, Clone)]
pub struct TunnelClosed(tokio::sync::watch::Receiver<()>);

/// Held by a tunnel for as long as it is open; dropping it closes the [`TunnelClosed`] it was made with.
#[derive(Debug)]
pub struct TunnelOpen(#[allow(dead_code)] tokio::sync::watch::Sender<()>);

/// A tunnel's two ends: the one it holds while open, the one its answer carries.
pub fn tunnel() -> (TunnelOpen, TunnelClosed) {
    let (open, closed) = tokio::sync::watch::channel(());
    (TunnelOpen(open), TunnelClosed(closed))
}

// === impl TunnelClosed ===

impl TunnelClosed {
    /// Waits until the tunnel closes.
    pub async fn closed(mut self) {
        while self.0.changed().await.is_ok() {}
    }
}
