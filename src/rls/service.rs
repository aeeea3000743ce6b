//! The gRPC service Envoy calls (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`), its listener with
//! `grpc.health.v1`, its metrics, and its reloads.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService as EnvoyRateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use smallvec::SmallVec;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;

use super::answer::from_envoy_unit;
use super::decide::{decide, Decided, Descriptor, Found};
use super::domains::{Domain, RlsSettings};
use super::refusal::{self, Answering, Code};
use crate::admission::{DecisionCounters, Refusal};
use crate::limiter::RateLimiter;

/// How often the health check looks at the store, when it follows it.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Envoy's rate limit service over tollgate's limiter: the domains of the running config (replaced whole on a
/// reload) and the store every instance shares.
#[derive(Debug)]
pub struct RateLimitService {
    tables: ArcSwap<Tables>,
    limiter: Arc<RateLimiter>,
    key_prefix: String,
    /// `tollgate_rls_request_duration_seconds`, registered once.
    duration: metrics::Histogram,
    /// True once the process drains: the health check answers NOT_SERVING from then on.
    draining: watch::Sender<bool>,
}

/// The running `rls:` section, with each domain's counters registered once.
#[derive(Debug)]
struct Tables {
    domains: HashMap<String, Entry>,
    answering: Answering,
    health_follows_store: bool,
    /// The folder of envoyproxy/ratelimit files the domains were read from, if any.
    config_dir: Option<PathBuf>,
    /// The counters of requests to domains not configured (labelled `domain=""`: their names are the callers').
    unknown: Counters,
}

#[derive(Debug)]
struct Entry {
    domain: Domain,
    counters: Counters,
    /// `tollgate_decisions_total` of each rule's limits: by the rule's path, then the limit's name.
    decisions: ByName<ByName<DecisionCounters>>,
}

/// Looked up on every request: a fast hash (the names are the config's, not the callers').
type ByName<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// `tollgate_rls_requests_total{domain,code}` and `tollgate_rls_shadow_denied_total{domain}` of one domain.
#[derive(Debug)]
struct Counters {
    /// `tollgate_rls_requests_total` of each [`Code`], at its index in [`Code::ALL`].
    requests: [metrics::Counter; Code::ALL.len()],
    shadow_denied: metrics::Counter,
}

// === impl RateLimitService ===

impl RateLimitService {
    /// The service for `settings`, deciding with `limiter` under store keys that start with `key_prefix`.
    pub fn new(settings: &RlsSettings, key_prefix: &str, limiter: Arc<RateLimiter>) -> Self {
        Self {
            tables: ArcSwap::from_pointee(Tables::new(settings)),
            limiter,
            key_prefix: key_prefix.to_owned(),
            duration: metrics::histogram!("tollgate_rls_request_duration_seconds"),
            draining: watch::Sender::new(false),
        }
    }

    /// Starts draining: the health check answers NOT_SERVING from now on, so that Envoy (and Kubernetes) stop
    /// sending to this instance while it still answers; the listener closes when [`serve`]'s `shutdown` completes.
    pub fn begin_draining(&self) {
        self.draining.send_replace(true);
    }

    /// Whether the process drains.
    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Runs `settings` from now on (the listener's address needs a restart); the store and its counts stay.
    pub fn reload(&self, settings: &RlsSettings) {
        self.tables.store(Arc::new(Tables::new(settings)));
    }

    /// The folder of envoyproxy/ratelimit files the running domains were read from, if any.
    pub fn config_dir(&self) -> Option<PathBuf> {
        self.tables.load().config_dir.clone()
    }

    /// The names of the domains served.
    pub fn domain_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tables.load().domains.keys().cloned().collect();
        names.sort();
        names
    }

    /// Decides one request of Envoy's.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        let descriptors =
            descriptors(request).map_err(|reason| refusal::status(&Refusal::Invalid(reason)))?;
        let tables = self.tables.load();
        let entry = tables.domains.get(&request.domain);
        let counters = entry.map_or(&tables.unknown, |entry| &entry.counters);
        let decided = decide(
            entry.map(|entry| &entry.domain),
            &descriptors,
            &self.key_prefix,
            &self.limiter,
        )
        .await;
        if decided.limits_decided() {
            count_shadow_denials(&decided, &counters.shadow_denied);
            if let Some(entry) = entry {
                entry.count_decisions(&decided);
            }
        }
        counters.requests[refusal::code(&decided) as usize].increment(1);
        let answer = refusal::answer(&decided, tables.answering);
        self.duration.record(started.elapsed().as_secs_f64());
        answer
    }
}

/// The request's descriptors as the decision takes them: each one's hits (its own `hits_addend`, else the
/// request's, at least 1) and Envoy's limit override; refused when it names no domain or no descriptor, or an
/// override in no known unit (the reason, as [`Refusal::Invalid`] says it).
fn descriptors(request: &RateLimitRequest) -> Result<Vec<Descriptor<'_>>, &'static str> {
    if request.domain.is_empty() {
        return Err("rate limit domain must not be empty");
    }
    if request.descriptors.is_empty() {
        return Err("rate limit descriptor list must not be empty");
    }
    let request_hits = u64::from(request.hits_addend.max(1));
    request
        .descriptors
        .iter()
        .map(|descriptor| {
            let limit_override = match &descriptor.limit {
                None => None,
                Some(limit) => {
                    let unit = from_envoy_unit(limit.unit)
                        .ok_or("a descriptor's limit override needs a known unit")?;
                    Some((u64::from(limit.requests_per_unit), unit))
                }
            };
            Ok(Descriptor {
                entries: descriptor
                    .entries
                    .iter()
                    .map(|entry| (entry.key.as_str(), entry.value.as_str()))
                    .collect::<SmallVec<_>>(),
                hits: descriptor
                    .hits_addend
                    .as_ref()
                    .map_or(request_hits, |hits| hits.value),
                limit_override,
            })
        })
        .collect()
}

/// Counts each shadow limit (or shadow rule that refuses everything) that would have refused the request.
fn count_shadow_denials(decided: &Decided<'_>, counter: &metrics::Counter) {
    let limits = decided.checked.iter().filter(|checked| {
        checked.limit.is_shadow()
            && (checked.impossible || checked.decision.is_some_and(|d| !d.allowed))
    });
    let blocked = decided
        .found
        .iter()
        .filter(|found| matches!(found, Found::Blocked { rule: Some(rule), .. } if rule.shadow));
    let denials = limits.count() + blocked.count();
    if denials > 0 {
        counter.increment(denials as u64);
    }
}

#[tonic::async_trait]
impl EnvoyRateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        RateLimitService::should_rate_limit(self, request.get_ref())
            .await
            .map(Response::new)
    }
}

// === impl Tables ===

impl Tables {
    fn new(settings: &RlsSettings) -> Self {
        let domains = settings
            .domains
            .iter()
            .map(|domain| {
                let entry = Entry {
                    domain: domain.clone(),
                    counters: Counters::new(&domain.name),
                    decisions: decision_counters(domain),
                };
                (domain.name.clone(), entry)
            })
            .collect();
        Self {
            domains,
            answering: Answering {
                when_unavailable: settings.when_unavailable,
                x_ratelimit_headers: settings.x_ratelimit_headers,
                headers: settings.headers,
            },
            health_follows_store: settings.health_follows_store,
            config_dir: settings.config_dir.clone(),
            unknown: Counters::new(""),
        }
    }
}

// === impl Entry ===

impl Entry {
    /// `tollgate_decisions_total` as the HTTP routes count it: every limit of an admitted request counts as
    /// allowed; of a refused request only the refusing limits count; a shadow limit that refuses counts as
    /// `shadow_denied` whatever the request's fate. Not counted: limits the store was not asked about (`on_error:
    /// allow` during an outage), rules that refuse everything (they have no limit), and Envoy's limit overrides
    /// (named after the request's values, they would make a series per value).
    fn count_decisions(&self, decided: &Decided<'_>) {
        for checked in &decided.checked {
            let Some(Found::Limited(Some(rule))) = decided.found.get(checked.descriptor) else {
                continue;
            };
            let Some(counters) = self
                .decisions
                .get(&rule.path)
                .and_then(|limits| limits.get(checked.limit.name()))
            else {
                continue;
            };
            // A limit the store was not asked about (`on_error: allow`) decided nothing.
            if checked.decision.is_none() && !checked.impossible {
                continue;
            }
            let refuses = checked.impossible || checked.decision.is_some_and(|d| !d.allowed);
            counters.count(checked.limit.is_shadow(), !decided.over_limit(), refuses);
        }
    }
}

/// The counters of every limit of every rule of `domain`, registered (at 0) as the HTTP routes' are: by the rule's
/// path, then the limit's name.
fn decision_counters(domain: &Domain) -> ByName<ByName<DecisionCounters>> {
    let route = format!("rls:{}", domain.name);
    domain
        .rules()
        .into_iter()
        .map(|rule| {
            let limits = rule
                .limits
                .iter()
                .map(|limit| {
                    let counters = DecisionCounters::new(&[
                        ("route", &route),
                        ("descriptor", &rule.path),
                        ("limit", limit.name()),
                    ]);
                    (limit.name().to_owned(), counters)
                })
                .collect();
            (rule.path.clone(), limits)
        })
        .collect()
}

// === impl Counters ===

impl Counters {
    fn new(domain: &str) -> Self {
        let requests = |code: &'static str| {
            metrics::counter!(
                "tollgate_rls_requests_total",
                "domain" => domain.to_owned(),
                "code" => code,
            )
        };
        Self {
            requests: Code::ALL.map(|code| requests(code.label())),
            shadow_denied: metrics::counter!(
                "tollgate_rls_shadow_denied_total",
                "domain" => domain.to_owned(),
            ),
        }
    }
}

/// Serves `service` and `grpc.health.v1` on `listener` (HTTP/2, gRPC) until `shutdown` completes; then the
/// listener closes at once, every connection is sent GOAWAY, and this completes once the calls in flight are
/// answered and the connections closed. The health check answers SERVING; NOT_SERVING once the service drains
/// ([`RateLimitService::begin_draining`]) and, with `rls.health_follows_store`, while the store is degraded.
pub async fn serve(
    listener: TcpListener,
    service: Arc<RateLimitService>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<RateLimitService>>()
        .await;
    tokio::spawn(follow_health(reporter, Arc::downgrade(&service)));
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::from_arc(service))
        .serve_with_incoming_shutdown(
            // Answers are a few hundred bytes each: without TCP_NODELAY, Nagle's algorithm could hold one back
            // until the previous one is acknowledged, on a call Envoy waits for before it serves the request.
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

/// Keeps the health check's answer to what `service` stands for: checked every [`HEALTH_INTERVAL`] and at once
/// when the drain begins. Ends with the service.
async fn follow_health(
    reporter: tonic_health::server::HealthReporter,
    service: std::sync::Weak<RateLimitService>,
) {
    let Some(mut draining) = service.upgrade().map(|s| s.draining.subscribe()) else {
        return;
    };
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    let mut last = ServingStatus::Serving;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = draining.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let Some(service) = service.upgrade() else {
            return;
        };
        let follows = service.tables.load().health_follows_store;
        let status = if service.is_draining() || (follows && !service.limiter.readiness().ready) {
            ServingStatus::NotServing
        } else {
            ServingStatus::Serving
        };
        drop(service);
        if status != last {
            for name in [
                "",
                <RateLimitServiceServer<RateLimitService> as tonic::server::NamedService>::NAME,
            ] {
                reporter.set_service_status(name, status).await;
            }
            last = status;
        }
    }
}
