//! Config reloads: on demand (SIGHUP) and when the file's content changes. Atomic: the new config replaces the
//! old one whole, and a config that fails validation leaves the running one in place.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{self, ConfigError};
use crate::gateway::Gateway;

/// Loads `path` and, if it is valid, makes it the running config of `gateway`.
///
/// Routes, limits, upstreams and client-address settings change; `listen`, `admin`, `store` and `server` need a
/// restart. The limiter and its counters are kept, so unchanged keys keep their state.
pub fn reload(gateway: &Gateway, path: &Path) -> Result<(), ConfigError> {
    let config = config::load(path)?;
    gateway.reload(&config);
    tracing::info!(file = %path.display(), routes = config.routes.len(), "config reloaded");
    Ok(())
}

/// Watches `path` and reloads `gateway` whenever the file's content changes, checking every `interval`.
///
/// Polling the content (not inotify) also sees editors that replace the file and Kubernetes ConfigMap symlink
/// swaps, and never reloads for a touch that changed nothing.
pub async fn watch(gateway: Arc<Gateway>, path: PathBuf, interval: Duration) {
    let mut last = std::fs::read(&path).ok();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let current = tokio::fs::read(&path).await.ok();
        if current.is_none() || current == last {
            continue;
        }
        last = current;
        if let Err(error) = reload(&gateway, &path) {
            tracing::error!("config change refused, the running config stays:\n{error}");
        }
    }
}
