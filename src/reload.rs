//! Config reloads: on demand (SIGHUP) and when the file's content changes. Atomic: the new config replaces the
//! old one whole, and a config that fails validation leaves the running one in place.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{self, Config, ConfigError};
use crate::gateway::Gateway;
use crate::rls::RateLimitService;
use crate::tls::Acceptor;

/// Watches one config file for changes, loading a change only once it has settled.
#[derive(Debug)]
pub struct Watcher {
    gateway: Arc<Gateway>,
    /// Envoy's rate limit service, reloaded with the gateway when it runs.
    rls: Option<Arc<RateLimitService>>,
    /// The HTTPS listener's TLS settings, read again with each reload when it runs.
    tls: Option<Arc<Acceptor>>,
    /// The files the config reads beside itself (the rate limit service's `config_dir`, the HTTPS listener's
    /// certificates and keys) as last loaded, and a different set seen by the last poll: a change there reloads
    /// the config as a change of the file does.
    folder: FolderWatch,
    path: PathBuf,
    /// A different content seen by the last poll, waiting to be seen once more before it is loaded.
    settling: Option<Vec<u8>>,
}

/// Files the config reads beside itself: each file's path and content (envoyproxy/ratelimit files in name order,
/// then the certificates' files in config order).
type Folder = Vec<(PathBuf, Vec<u8>)>;

/// What the watch knows of the files beside the config.
#[derive(Debug, Default)]
struct FolderWatch {
    loaded: Option<Folder>,
    settling: Option<Folder>,
}

/// What one poll of a [`Watcher`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// The file is as last loaded, or unreadable.
    Unchanged,
    /// The file changed since the last poll: it is loaded if the next poll finds it the same.
    Settling,
    /// The change stayed the same for two polls and is now the running config.
    Reloaded,
    /// The change stayed the same for two polls but fails validation: the running config stays.
    Refused,
    /// The change stayed the same for two polls but leaves no routes where the running config has some: taken for
    /// a writer caught half-way (however long it stays), logged at WARN and applied only by SIGHUP.
    Held,
}

/// Loads `path` and, if it is valid, makes it the running config of `gateway`.
///
/// Routes, limits, upstreams and client-address settings change; `listen`, `admin`, `store` and `server` need a
/// restart. The limiter and its counters are kept, so unchanged keys keep their state.
pub fn reload(gateway: &Gateway, path: &Path) -> Result<(), ConfigError> {
    reload_serving(gateway, None, path)
}

/// [`reload`], also for Envoy's rate limit service `rls` when it runs: its domains (and the files of its
/// `config_dir`, read again) change with the rest.
pub fn reload_serving(
    gateway: &Gateway,
    rls: Option<&RateLimitService>,
    path: &Path,
) -> Result<(), ConfigError> {
    reload_all(gateway, rls, None, path)
}

/// [`reload_serving`], also for the HTTPS listener's `tls` when it runs: its certificates, keys and client CA are
/// read again, and new handshakes use them (connections open keep theirs).
pub fn reload_all(
    gateway: &Gateway,
    rls: Option<&RateLimitService>,
    tls: Option<&Acceptor>,
    path: &Path,
) -> Result<(), ConfigError> {
    let content: Arc<[u8]> = std::fs::read(path)
        .map_err(|error| ConfigError::read(path, error))
        .inspect_err(|error| count(gateway, Some(&error.to_string())))?
        .into();
    // The file watch compares with this: what SIGHUP loaded is not loaded again when the watch sees it.
    gateway.set_loaded_file(Arc::clone(&content));
    let config =
        parse(&content, path).inspect_err(|error| count(gateway, Some(&error.to_string())))?;
    apply(gateway, rls, tls, &config, path);
    Ok(())
}

/// `content` (a config file's bytes) as a config.
fn parse(content: &[u8], path: &Path) -> Result<Config, ConfigError> {
    std::str::from_utf8(content)
        .map_err(|e| {
            ConfigError::read(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })
        .and_then(|text| config::parse(text, path))
}

/// `tollgate_config_reloads_total{result="ok"|"error"}`: every reload tried, from SIGHUP or the file watch, so
/// that a config change that did not take can be seen (and alerted on) without reading the log; and the gateway's
/// list of the last reloads, with why one was `refused`, for `/stats`.
fn count(gateway: &Gateway, refused: Option<&str>) {
    let result = if refused.is_none() { "ok" } else { "error" };
    metrics::counter!("tollgate_config_reloads_total", "result" => result).increment(1);
    gateway.record_reload(refused);
}

/// Watches `path` and reloads `gateway` whenever the file's content changes, checking every `interval`.
///
/// Polling the content (not inotify) also sees editors that replace the file and Kubernetes ConfigMap symlink
/// swaps, and never reloads for a touch that changed nothing. A change is loaded only once two polls in a row
/// found the same content, so a file caught half-written (`cat >` truncates first, then writes) is never loaded;
/// nor is a file that leaves no routes where some run, whatever it stays (see [`Polled::Held`]).
pub async fn watch(gateway: Arc<Gateway>, path: PathBuf, interval: Duration) {
    watch_with(Watcher::new(gateway, path), interval).await;
}

/// [`watch`] with a watcher made beforehand (one that also reloads Envoy's rate limit service).
pub async fn watch_with(mut watcher: Watcher, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        watcher.poll().await;
    }
}

// === impl Watcher ===

impl Watcher {
    /// A watcher of `path` for `gateway`, which runs the config the file holds now.
    pub fn new(gateway: Arc<Gateway>, path: PathBuf) -> Self {
        if gateway.loaded_file().is_none() {
            if let Ok(content) = std::fs::read(&path) {
                gateway.set_loaded_file(content.into());
            }
        }
        Self {
            gateway,
            rls: None,
            tls: None,
            folder: FolderWatch::default(),
            path,
            settling: None,
        }
    }

    /// The same watcher, also reloading Envoy's rate limit service `rls`, and the config when the files of its
    /// `config_dir` change (loaded, as the config file is, once they stayed the same for two polls).
    pub fn serving_rls(mut self, rls: Arc<RateLimitService>) -> Self {
        self.rls = Some(rls);
        self.folder.loaded = Some(self.side_files());
        self
    }

    /// The same watcher, also reading the HTTPS listener's certificates again at each reload, and reloading when
    /// their files change (a certificate renewed in place, as certbot or cert-manager do).
    pub fn serving_tls(mut self, tls: Arc<Acceptor>) -> Self {
        self.tls = Some(tls);
        self.folder.loaded = Some(self.side_files());
        self
    }

    /// The files beside the config as they are now.
    fn side_files(&self) -> Folder {
        let dir = self.rls.as_ref().and_then(|rls| rls.config_dir());
        let tls = self.tls.as_ref().map(|tls| tls.files());
        read_side_files(dir.as_deref(), tls.as_deref().map(Vec::as_slice))
    }

    /// Reads the file once; loads its content if the previous poll found the same one and it is not the running
    /// one.
    pub async fn poll(&mut self) -> Polled {
        let Ok(current) = tokio::fs::read(&self.path).await else {
            self.settling = None;
            return Polled::Unchanged;
        };
        // The content last loaded, by this watch or by SIGHUP.
        if self.gateway.loaded_file().as_deref() == Some(current.as_slice()) {
            self.settling = None;
            return self.poll_folder(&current).await;
        }
        if self.settling.as_ref() != Some(&current) {
            self.settling = Some(current);
            return Polled::Settling;
        }
        self.settling = None;
        // What is loaded is what was compared, not a third read that might catch another write.
        let parsed = parse(&current, &self.path);
        self.gateway.set_loaded_file(current.into());
        self.folder.loaded = Some(self.side_files());
        match parsed {
            Ok(config) if config.routes.is_empty() && !self.gateway.route_names().is_empty() => {
                count(
                    &self.gateway,
                    Some("the change leaves no routes where some run: not applied (SIGHUP applies it)"),
                );
                tracing::warn!(
                    file = %self.path.display(),
                    running = self.gateway.route_names().len(),
                    "config change leaves no routes where some run: not applied (an emptied file is taken for a \
                     writer caught half-way); send SIGHUP to apply it"
                );
                Polled::Held
            }
            Ok(config) => {
                self.apply(&config);
                // The new config may name other certificate files.
                self.folder.loaded = Some(self.side_files());
                Polled::Reloaded
            }
            Err(error) => {
                count(&self.gateway, Some(&error.to_string()));
                tracing::error!("config change refused, the running config stays:\n{error}");
                Polled::Refused
            }
        }
    }
}

impl Watcher {
    /// Applies `config`, read from the watched file, to the running gateway and its services.
    fn apply(&self, config: &Config) {
        apply(
            &self.gateway,
            self.rls.as_deref(),
            self.tls.as_deref(),
            config,
            &self.path,
        );
    }

    /// With the config file as loaded: reloads it when the files beside it (the rate limit service's folder, the
    /// certificates) changed and then stayed the same for a poll.
    async fn poll_folder(&mut self, current: &[u8]) -> Polled {
        let dir = self.rls.as_ref().and_then(|rls| rls.config_dir());
        let tls = self.tls.as_ref().map(|tls| tls.files());
        if dir.is_none() && tls.is_none() {
            return Polled::Unchanged;
        }
        let read = move || read_side_files(dir.as_deref(), tls.as_deref().map(Vec::as_slice));
        let Ok(folder) = tokio::task::spawn_blocking(read).await else {
            return Polled::Unchanged;
        };
        if self.folder.loaded.as_ref() == Some(&folder) {
            self.folder.settling = None;
            return Polled::Unchanged;
        }
        if self.folder.settling.as_ref() != Some(&folder) {
            self.folder.settling = Some(folder);
            return Polled::Settling;
        }
        self.folder.settling = None;
        self.folder.loaded = Some(folder);
        match parse(current, &self.path) {
            Ok(config) => {
                self.apply(&config);
                Polled::Reloaded
            }
            Err(error) => {
                count(&self.gateway, Some(&error.to_string()));
                tracing::error!(
                    "change of the files beside the config refused, the running config stays:\n{error}"
                );
                Polled::Refused
            }
        }
    }
}

/// The envoyproxy/ratelimit files of `dir` as the config reads them, then the `tls` files; a folder or file that
/// cannot be read is left out (the reload it leads to says why).
fn read_side_files(dir: Option<&Path>, tls: Option<&[PathBuf]>) -> Folder {
    dir.map(|dir| config::ratelimit_files(dir).unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .chain(tls.unwrap_or_default().iter().cloned())
        .filter_map(|file| std::fs::read(&file).ok().map(|content| (file, content)))
        .collect()
}

/// The HTTPS listener's certificates read again from `config`'s files (which its validation has just read). A file
/// changed since and now broken leaves the ones in use serving.
fn reload_tls(tls: Option<&Acceptor>, config: &Config) {
    match (tls, &config.tls) {
        (Some(tls), Some(settings)) => {
            if let Err(problems) = tls.reload(settings) {
                for problem in problems {
                    tracing::error!(
                        field = %problem.field,
                        "{}: the certificates in use keep serving",
                        problem.message
                    );
                }
            }
        }
        (Some(_), None) => tracing::warn!(
            "config reloaded without tls: the HTTPS listener keeps its certificates until a restart"
        ),
        (None, Some(_)) => tracing::warn!(
            "config reloaded with a tls block: the HTTPS listener starts with the next restart"
        ),
        (None, None) => {}
    }
}

/// Makes `config` the running config; a reload that drops routes says which, at WARN: requests to them now get
/// 404, which is seldom meant.
fn apply(
    gateway: &Gateway,
    rls: Option<&RateLimitService>,
    tls: Option<&Acceptor>,
    config: &Config,
    path: &Path,
) {
    let before = gateway.route_names();
    gateway.reload(config);
    reload_tls(tls, config);
    match (rls, &config.rls) {
        (Some(rls), Some(settings)) => rls.reload(settings),
        (Some(_), None) => tracing::warn!(
            "config reloaded without rls: the rate limit service keeps its domains until a restart"
        ),
        (None, Some(_)) => tracing::warn!(
            "config reloaded with an rls block: the rate limit service starts with the next restart"
        ),
        (None, None) => {}
    }
    count(gateway, None);
    let dropped: Vec<&str> = before
        .iter()
        .map(String::as_str)
        .filter(|name| !config.routes.iter().any(|route| route.name == *name))
        .collect();
    let file = path.display();
    let routes = config.routes.len();
    if dropped.is_empty() {
        tracing::info!(file = %file, routes, "config reloaded");
    } else {
        tracing::warn!(
            file = %file,
            routes,
            before = before.len(),
            dropped = %dropped.join(", "),
            "config reloaded without routes that were running: requests to them now get 404"
        );
    }
}
