//! The `tollgate` binary: command line, start-up, signals.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use clap::{Parser, Subcommand, ValueEnum};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

use tollgate::config::{self, Config};
use tollgate::gateway::{self, Gateway};
use tollgate::limiter::{Backend, OnError};
use tollgate::telemetry::access::{self, LineFormat};

// glibc's malloc weighed heavily on the gateway's CPU under load; mimalloc handles a proxy's many small,
// short-lived allocations far more cheaply.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The version and what the build was made from (build.rs): `0.2.0 (commit 1a2b3c4d5e6f, modified)`.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TOLLGATE_BUILD"), ")");

/// A rate-limiting HTTP reverse proxy with limits shared through Redis.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version = VERSION, about)]
struct Cli {
    /// The config file.
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_CONFIG",
        default_value = "gateway.yaml"
    )]
    config: PathBuf,
    /// Log output format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Validate the config, print what was understood, exit 0 (valid) or 2 (invalid).
    Check,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Pretty,
    Json,
}

/// Exit code for an invalid config or invalid arguments (clap uses 2 for the latter too).
const EXIT_INVALID: u8 = 2;
/// Exit code for any other start-up failure.
const EXIT_FAILURE: u8 = 1;
/// How often the config file is checked for changes.
const CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    // Before anything uses jsonwebtoken: its crypto is chosen once per process.
    tollgate::consumers::jwt::use_ring_for_signatures();
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let loaded_file;
    // Read once: the file watch compares later contents with what was loaded here, not with what the file holds
    // by the time it starts (a change made meanwhile would be missed for good).
    let config = match config::load_with_text(&cli.config) {
        Ok((config, text)) => {
            loaded_file = text;
            config
        }
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    match cli.command.unwrap_or(Command::Run) {
        Command::Check => {
            print!("{}", config::summary::render(&config));
            ExitCode::SUCCESS
        }
        Command::Run => {
            raise_open_files_limit();
            let runtime = match runtime_builder().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => {
                    eprintln!("tollgate: cannot start the async runtime: {error}");
                    return ExitCode::from(EXIT_FAILURE);
                }
            };
            runtime.block_on(run(config, loaded_file))
        }
    }
}

/// The async runtime: a multi-threaded one (a worker per core, or `TOKIO_WORKER_THREADS`), except with exactly
/// one worker, where a single-threaded runtime does the same work without waking a second thread: the accept
/// loop and every connection then share one thread.
fn runtime_builder() -> tokio::runtime::Builder {
    match std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("1") => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
}

/// Raises the soft limit on open files to the hard limit, and logs both: every client and upstream connection holds
/// a descriptor, and services often start with a soft limit of 1024 or less (256 held connections stopped new
/// requests), while the hard limit is far higher.
fn raise_open_files_limit() {
    let (soft, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open files limit");
            return;
        }
    };
    if soft >= hard {
        tracing::info!(soft, hard, "open files limit");
        return;
    }
    match rlimit::increase_nofile_limit(hard) {
        Ok(raised) => tracing::info!(soft = raised, hard, was = soft, "open files limit raised"),
        Err(error) => tracing::warn!(%error, soft, hard, "cannot raise the open files limit"),
    }
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let filter = quiet_per_connection(filter, std::env::var("RUST_LOG").unwrap_or_default());
    // Colours only for a person at a terminal: a file or a pipe (journald, docker logs, a collector) would keep
    // the escape codes as text. NO_COLOR (https://no-color.org), when set and not empty, turns them off anywhere.
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr()) && !no_color;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    // The access line, one per request, is written by hand in the same format: a tenth of the instructions of
    // tracing-subscriber's field-by-field formatting. Colours stay with tracing-subscriber.
    if !colours {
        access::write_directly(match format {
            LogFormat::Pretty => LineFormat::Plain,
            LogFormat::Json => LineFormat::Json,
        });
    }
}

/// Keeps the libraries that would log per connection at `error`, unless `RUST_LOG` names them: fred warns of every
/// closed connection in its own words ("Connection closed"), where the limiter names each Redis outage once with
/// its cause; rustls warns of every client that sends an IP address as its server name (wrk, curl and many
/// libraries do when given `https://127.0.0.1`), which cost more than the handshake itself under load.
fn quiet_per_connection(mut filter: EnvFilter, asked: String) -> EnvFilter {
    for library in ["fred", "rustls"] {
        if !asked.contains(library) {
            if let Ok(directive) = format!("{library}=error").parse() {
                filter = filter.add_directive(directive);
            }
        }
    }
    filter
}

/// Runs the gateway on `config`, loaded from `loaded_file` (the config file's text as read).
async fn run(config: Config, loaded_file: String) -> ExitCode {
    tollgate::telemetry::prometheus();
    let limiter = match connect_store(&config).await {
        Ok(limiter) => limiter,
        Err(code) => return code,
    };

    let listeners = match bind_listeners(&config).await {
        Ok(listeners) => listeners,
        Err(code) => return code,
    };
    let admin_listener = match TcpListener::bind(config.admin.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "tollgate: cannot listen on {} (admin): {error}",
                config.admin.listen
            );
            return ExitCode::from(EXIT_FAILURE);
        }
    };

    // The addresses bound, not the configured ones: a port of 0 is chosen by the system (tests read them here).
    let admin_addr = admin_listener
        .local_addr()
        .map_or(config.admin.listen, |a| a);
    let gateway = Arc::new(Gateway::new(&config, limiter.clone()));
    gateway.set_loaded_file(loaded_file.into_bytes().into());
    spawn_admin(admin_listener, &gateway, &config);
    // When the listeners close (after the drain's delay): the rate limit service's closes with the gateway's.
    let (closing, closed) = tokio::sync::watch::channel(None::<Instant>);
    let (rls, rls_served) = match &config.rls {
        None => (None, None),
        Some(settings) => match start_rls(settings, &config, &limiter, closed.clone()).await {
            Ok((service, served)) => (Some(service), Some(served)),
            Err(code) => return code,
        },
    };
    tokio::spawn(purge_expired_keys(limiter));
    let tls = listeners.tls.as_ref().map(|(_, tls)| Arc::clone(tls));
    tokio::spawn(reload_on_sighup(
        gateway.clone(),
        rls.clone(),
        tls.clone(),
        config.source.clone(),
    ));
    let mut watcher = tollgate::reload::Watcher::new(gateway.clone(), config.source.clone());
    if let Some(rls) = &rls {
        watcher = watcher.serving_rls(Arc::clone(rls));
    }
    if let Some(tls) = tls {
        watcher = watcher.serving_tls(tls);
    }
    tokio::spawn(tollgate::reload::watch_with(watcher, CONFIG_POLL_INTERVAL));

    // Signals are watched before the line that says the gateway listens: a SIGTERM sent as soon as it listens
    // must begin the drain, not end the process by the signal's default action.
    let shutdown = shutdown_sequence(gateway.clone(), rls, &config.server, closing);
    let bound = |listener: &TcpListener| listener.local_addr().ok().map(|a| a.to_string());
    let listen = listeners.plain.as_ref().and_then(bound).unwrap_or_default();
    let tls = listeners
        .tls
        .as_ref()
        .and_then(|(listener, _)| bound(listener))
        .unwrap_or_default();
    tracing::info!(%listen, %tls, admin = %admin_addr, routes = config.routes.len(), version = VERSION, "tollgate listening");
    let served = gateway::serve(listeners, gateway.clone(), &config.server, shutdown).await;
    if let Some(rls_served) = rls_served {
        let closed_at = *closed.borrow();
        let deadline = closed_at.unwrap_or_else(Instant::now) + config.server.shutdown_grace;
        rls_drained(rls_served, deadline, &gateway).await;
    }
    match served {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::warn!(%error, "stopped before every request finished");
            ExitCode::SUCCESS
        }
    }
}

/// The listeners of `config`: clear-text, HTTPS with its certificates read, or both; `Err` with the exit code when
/// one cannot be bound or the certificates read.
async fn bind_listeners(config: &Config) -> Result<gateway::Listeners, ExitCode> {
    let bind = |address: SocketAddr, what: &'static str| async move {
        TcpListener::bind(address).await.map_err(|error| {
            eprintln!("tollgate: cannot listen on {address}{what}: {error}");
            ExitCode::from(EXIT_FAILURE)
        })
    };
    let plain = match config.listen {
        Some(address) => Some(bind(address, "").await?),
        None => None,
    };
    let tls = match &config.tls {
        Some(settings) => {
            // Read at validation already: a failure here is a file changed since.
            let acceptor = tollgate::tls::Acceptor::new(settings).map_err(|problems| {
                for problem in problems {
                    eprintln!("tollgate: {}: {}", problem.field, problem.message);
                }
                ExitCode::from(EXIT_FAILURE)
            })?;
            Some((bind(settings.listen, " (tls)").await?, Arc::new(acceptor)))
        }
        None => None,
    };
    Ok(gateway::Listeners { plain, tls })
}

/// The store of `config`, waiting up to 2 s for Redis to answer and saying plainly what happens while it does not;
/// `Err` with the exit code when the store settings cannot make one.
async fn connect_store(config: &Config) -> Result<Arc<tollgate::limiter::RateLimiter>, ExitCode> {
    let limiter = match tollgate::limiter::RateLimiter::from_settings(&config.store) {
        Ok(limiter) => Arc::new(limiter),
        Err(error) => {
            eprintln!("{}: store.url: {error}", config.source.display());
            return Err(ExitCode::from(EXIT_INVALID));
        }
    };
    if let Backend::Redis(redis) = limiter.backend() {
        if redis.wait_connected(Duration::from_secs(2)).await {
            tracing::info!(url = %config::summary::redact(&config.store.url), "connected to redis");
        } else {
            let consequence = match config.store.on_error {
                OnError::Local => {
                    "limits are enforced by this instance alone (in-process store) until it answers"
                }
                OnError::Allow => "requests are admitted UNLIMITED until it answers",
                OnError::Deny => "requests are refused with 503 until it answers",
            };
            tracing::warn!(
                url = %config::summary::redact(&config.store.url),
                "REDIS IS UNREACHABLE: {consequence} (store.on_error: {})",
                config.store.on_error
            );
        }
    }
    Ok(limiter)
}

/// Serves the admin API on `admin_listener`, with descriptors held back for it: out of descriptors, health checks
/// and metrics still answer.
fn spawn_admin(admin_listener: TcpListener, gateway: &Arc<Gateway>, config: &Config) {
    let admin = tollgate::admin::router_for(Arc::clone(gateway), &config.admin);
    let reserve = tollgate::server::Reserve::new(tollgate::server::ADMIN_RESERVE);
    let admin_listener =
        tollgate::server::AdminListener::new(admin_listener, reserve).tap_io(|_| {});
    tokio::spawn(async move {
        // With the client's address, which the audit lines of consumer changes name.
        let admin = admin.into_make_service_with_connect_info::<std::net::SocketAddr>();
        if let Err(error) = axum::serve(admin_listener, admin).await {
            tracing::error!(%error, "admin listener failed");
        }
    });
}

/// Waits for the rate limit service's calls in flight until `deadline` (the gateway's grace period) or a second
/// signal, and says when they are cut.
async fn rls_drained(served: tokio::task::JoinHandle<()>, deadline: Instant, gateway: &Gateway) {
    let finished = tokio::select! {
        biased;
        _ = served => true,
        () = tokio::time::sleep_until(deadline.into()) => false,
        () = gateway.shutdown().cut_requested() => false,
    };
    if !finished {
        tracing::warn!(
            "rate limit service calls still in flight after the grace period: they are cut"
        );
    }
}

/// Completes when the listener must close: on SIGINT or SIGTERM readiness fails (`draining`, and the rate limit
/// service's health check NOT_SERVING), and the listeners serve on for `server.shutdown_delay` so that balancers
/// see the failed check first; then `closing` tells the rate limit service's listener when it closed. A second
/// signal ends the delay, and later the grace period, at once. The signals are watched from this call on.
fn shutdown_sequence(
    gateway: Arc<Gateway>,
    rls: Option<Arc<tollgate::rls::RateLimitService>>,
    server: &tollgate::config::ServerSettings,
    closing: tokio::sync::watch::Sender<Option<Instant>>,
) -> impl std::future::Future<Output = ()> {
    let (delay, grace) = (server.shutdown_delay, server.shutdown_grace);
    let mut signals = ShutdownSignals::watch();
    async move {
        signals.recv().await;
        gateway.shutdown().begin();
        if let Some(rls) = &rls {
            rls.begin_draining();
        }
        tracing::info!(
            ?delay,
            ?grace,
            connections = gateway.shutdown().open_connections(),
            "draining: /readyz answers 503 draining; serving on for the delay, then closing the listener"
        );
        let cutter = gateway.clone();
        // The same watch: a second signal sent before this task first runs is not lost.
        tokio::spawn(async move {
            signals.recv().await;
            tracing::warn!("second shutdown signal: ending the drain now");
            cutter.shutdown().cut();
        });
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = gateway.shutdown().cut_requested() => {}
        }
        closing.send_replace(Some(Instant::now()));
    }
}

/// SIGINT and SIGTERM, watched from the moment this is made: from then on neither ends the process by its default
/// action, and one that comes before [`ShutdownSignals::recv`] is awaited is not lost.
struct ShutdownSignals {
    #[cfg(unix)]
    unix: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl ShutdownSignals {
    fn watch() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let unix = match (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) {
                (Ok(interrupt), Ok(terminate)) => Some((interrupt, terminate)),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%error, "cannot watch SIGINT and SIGTERM; watching Ctrl-C alone");
                    None
                }
            };
            Self { unix }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Completes on the next SIGINT or SIGTERM.
    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some((interrupt, terminate)) = &mut self.unix {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
            tracing::info!("shutdown requested");
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown requested");
    }
}

/// Reloads the config on SIGHUP; a config that fails validation is logged and the running one stays.
///
/// The handler is installed when this is called, not when the task first runs: until then a SIGHUP's default
/// action ends the process, and a reload sent as soon as the gateway listens must not stop it.
fn reload_on_sighup(
    gateway: Arc<Gateway>,
    rls: Option<Arc<tollgate::rls::RateLimitService>>,
    tls: Option<Arc<tollgate::tls::Acceptor>>,
    path: PathBuf,
) -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move {
        #[cfg(unix)]
        {
            let mut hangup = match hangup {
                Ok(hangup) => hangup,
                Err(error) => {
                    tracing::warn!(%error, "cannot watch SIGHUP: reload by changing the file");
                    return;
                }
            };
            while hangup.recv().await.is_some() {
                let reloaded =
                    tollgate::reload::reload_all(&gateway, rls.as_deref(), tls.as_deref(), &path);
                if let Err(error) = reloaded {
                    tracing::error!("config reload refused, the running config stays:\n{error}");
                }
            }
        }
        #[cfg(not(unix))]
        drop((gateway, rls, tls, path));
    }
}

/// Starts Envoy's rate limit service on `settings.listen`. It drains as the gateway does: NOT_SERVING from the
/// signal, its listener closed with the gateway's (`closed`), and the calls in flight answered within the same
/// grace period. `Err` with the exit code when its address cannot be bound.
async fn start_rls(
    settings: &tollgate::rls::RlsSettings,
    config: &Config,
    limiter: &Arc<tollgate::limiter::RateLimiter>,
    closed: tokio::sync::watch::Receiver<Option<Instant>>,
) -> Result<
    (
        Arc<tollgate::rls::RateLimitService>,
        tokio::task::JoinHandle<()>,
    ),
    ExitCode,
> {
    let listener = match TcpListener::bind(settings.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "tollgate: cannot listen on {} (rls): {error}",
                settings.listen
            );
            return Err(ExitCode::from(EXIT_FAILURE));
        }
    };
    let service = Arc::new(tollgate::rls::RateLimitService::new(
        settings,
        &config.store.key_prefix,
        Arc::clone(limiter),
    ));
    let rls_addr = listener.local_addr().map_or(settings.listen, |a| a);
    tracing::info!(listen = %rls_addr, domains = settings.domains.len(), "rate limit service listening");
    let served = tokio::spawn(serve_rls(listener, Arc::clone(&service), closed));
    Ok((service, served))
}

/// Serves Envoy's rate limit service on `listener` until `closed` says the listeners close; completes once the
/// calls in flight then are answered.
async fn serve_rls(
    listener: TcpListener,
    service: Arc<tollgate::rls::RateLimitService>,
    mut closed: tokio::sync::watch::Receiver<Option<Instant>>,
) {
    let closing = async move {
        // The sender lives as long as the drain: a dropped one closes too.
        let _ = closed.wait_for(Option::is_some).await;
    };
    match tollgate::rls::serve(listener, service, closing).await {
        Ok(()) => tracing::info!("rate limit service drained: every call answered"),
        Err(error) => tracing::error!(%error, "rate limit service listener failed"),
    }
}

/// Keeps the in-process store's memory proportional to live keys.
async fn purge_expired_keys(limiter: Arc<tollgate::limiter::RateLimiter>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        limiter.local().purge_expired();
    }
}
