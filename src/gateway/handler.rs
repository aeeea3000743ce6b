//! The request path: route, key, limiter, then the route's action or a refusal.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::body::Body;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, Version};

use super::compiled::{Action, CompiledConfig, Route};
use super::reloads::{Reload, Reloads};
use super::responses;
use crate::admission::{
    answer, Arrival, LimitSet, LimitSettings, NoReservation, Refusal, RequestView,
};
use crate::config::Config;
use crate::consumers::directory::Directory;
use crate::consumers::Consumers;
use crate::head_lines::HeadLines;
use crate::limiter::RateLimiter;
use crate::proxy::{ForwardedFacts, ProxyError};
use crate::routing::{self, CanonicalRequest};
use crate::server::Shutdown;
use crate::telemetry::access::AccessLine;
use crate::telemetry::trace::Tracer;
use crate::top_keys::LimitTop;
use crate::trail::{Trail, UpstreamCall};

/// The gateway: a compiled config (replaced atomically on reload) and the limiter (kept across reloads, so
/// counters survive them).
#[derive(Debug)]
pub struct Gateway {
    compiled: ArcSwap<CompiledConfig>,
    limiter: Arc<RateLimiter>,
    /// The consumers' runtime settings (see docs/configuration.md, "Consumers and plans"), made with the first config that has a `consumers:` block
    /// and kept across reloads, like the limiter.
    directory: parking_lot::Mutex<Option<Arc<Directory>>>,
    /// The config file's content last loaded (applied or refused), by SIGHUP or the file watch: each knows what
    /// the other loaded, so the watch does not load again what a SIGHUP just did.
    loaded_file: parking_lot::Mutex<Option<Arc<[u8]>>>,
    /// Where the gateway stands in its shutdown (draining or not).
    shutdown: Shutdown,
    /// Where sampled spans go, with `telemetry.otlp` (read at start: a reload does not move it).
    tracer: Option<Arc<Tracer>>,
    /// The last reloads tried, for `/stats`.
    reloads: Reloads,
}

// === impl Gateway ===

impl Gateway {
    /// A gateway running `config` with `limiter`.
    pub fn new(config: &Config, limiter: Arc<RateLimiter>) -> Self {
        let directory = config.consumers.as_ref().map(|_| directory_on(config));
        Self {
            compiled: ArcSwap::from_pointee(CompiledConfig::new(config, directory.as_ref())),
            limiter,
            directory: parking_lot::Mutex::new(directory),
            loaded_file: parking_lot::Mutex::new(None),
            shutdown: Shutdown::default(),
            reloads: Reloads::default(),
            tracer: tracer_for(config),
        }
    }

    /// A gateway running `config` with `limiter` whose routes make `work` for every admitted request, to run when
    /// its answer ends (the seam's tests).
    #[cfg(test)]
    pub(crate) fn with_after_answer(
        config: &Config,
        limiter: Arc<RateLimiter>,
        work: impl Fn() -> Box<dyn crate::admission::AfterAnswer> + Send + Sync + 'static,
    ) -> Self {
        let work = Arc::new(work);
        let mut compiled = CompiledConfig::new(config, None);
        for route in &mut compiled.routes {
            let work = Arc::clone(&work);
            route.policy = route.policy.clone().with_after_answer(move || work());
        }
        let gateway = Self::new(config, limiter);
        gateway.compiled.store(Arc::new(compiled));
        gateway
    }

    /// Where the gateway stands in its shutdown: the signal handler begins draining through it, `/readyz`
    /// reads it.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// A gateway running `config` with `limiter`, whose consumers' runtime settings are `directory`'s.
    pub fn with_directory(
        config: &Config,
        limiter: Arc<RateLimiter>,
        directory: Arc<Directory>,
    ) -> Self {
        Self {
            compiled: ArcSwap::from_pointee(CompiledConfig::new(config, Some(&directory))),
            limiter,
            directory: parking_lot::Mutex::new(Some(directory)),
            loaded_file: parking_lot::Mutex::new(None),
            shutdown: Shutdown::default(),
            reloads: Reloads::default(),
            tracer: tracer_for(config),
        }
    }

    /// Replaces the running config; requests in flight finish with the old one, but those waiting for a slot are
    /// admitted by the new config's `max`.
    pub fn reload(&self, config: &Config) {
        let directory = self.directory_for(config);
        let compiled = CompiledConfig::new(config, directory.as_ref());
        compiled.keep_top_keys_of(&self.compiled.load());
        let maxes: Vec<(String, u64)> = compiled
            .routes
            .iter()
            .flat_map(|route| route.policy.slot_maxes())
            .collect();
        self.compiled.store(Arc::new(compiled));
        self.limiter.slot_queues().set_running_max(maxes);
    }

    /// The consumer directory, made on the store of the first config that needs one: in Redis when the store
    /// is, so that every instance sees the admin API's changes.
    fn directory_for(&self, config: &Config) -> Option<Arc<Directory>> {
        config.consumers.as_ref()?;
        let mut directory = self.directory.lock();
        Some(Arc::clone(
            directory.get_or_insert_with(|| directory_on(config)),
        ))
    }

    /// Notes a reload tried now: `refused` for that reason, or applied.
    pub fn record_reload(&self, refused: Option<&str>) {
        self.reloads.push(refused);
    }

    /// The last reloads tried (ten at most), the newest first.
    pub fn last_reloads(&self) -> Vec<Reload> {
        self.reloads.last()
    }

    /// The names of the running config's routes, in order.
    pub fn route_names(&self) -> Vec<String> {
        let compiled = self.compiled.load();
        compiled.routes.iter().map(|r| r.name.clone()).collect()
    }

    /// The config file's content last loaded, by SIGHUP or the file watch (`None` before either looked).
    pub fn loaded_file(&self) -> Option<Arc<[u8]>> {
        self.loaded_file.lock().clone()
    }

    /// Records `content` as the config file's content last loaded, whether it was applied or refused.
    pub fn set_loaded_file(&self, content: Arc<[u8]>) {
        *self.loaded_file.lock() = Some(content);
    }

    /// The bits of an IPv6 client address that key it, in the running config (`client_ip.ipv6_prefix`).
    pub fn ipv6_prefix(&self) -> u8 {
        self.compiled.load().client_ip.ipv6_prefix()
    }

    /// The limits of the route named `route` in the running config.
    pub fn limit_set(&self, route: &str) -> Option<LimitSet> {
        let compiled = self.compiled.load();
        compiled
            .routes
            .iter()
            .find(|r| r.name == route)
            .map(|r| r.policy.limits().clone())
    }

    /// Hands `visit` every limit of the running config's routes (their plans' too) with its top keys, route by
    /// route in order.
    pub fn visit_tops(&self, mut visit: impl FnMut(&str, &LimitSettings, &LimitTop)) {
        let compiled = self.compiled.load();
        for route in &compiled.routes {
            for (settings, top) in route.policy.tops() {
                visit(&route.name, settings, top);
            }
        }
    }

    /// The running config's consumers and plans, if it has a `consumers:` block.
    pub fn consumers(&self) -> Option<Arc<Consumers>> {
        self.compiled.load().consumers.clone()
    }

    /// The running config's upstreams, in its order.
    pub fn upstreams(&self) -> Vec<Arc<crate::proxy::Upstream>> {
        self.compiled.load().upstreams.clone()
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    /// A request that may open a WebSocket tunnel (hyper marks it for an upgrade) carries a hold on the server's
    /// drain, which the tunnel keeps for as long as it is open: it outlives the HTTP connection the drain watched,
    /// and gets the grace period too.
    #[cold]
    #[inline(never)]
    fn hold_tunnel(&self, request: &mut Request<Body>) {
        if let Some(hold) = self.shutdown.drain_hold() {
            request
                .extensions_mut()
                .insert(crate::proxy::TunnelHold::new(hold));
        }
    }

    /// Answers one request from `peer`: with an `x-request-id` (generated when absent, passed upstream and
    /// returned), counted in `tollgate_requests_total` and written to the access log.
    pub fn handle(
        &self,
        request: Request<Body>,
        peer: SocketAddr,
    ) -> impl std::future::Future<Output = Response<Body>> + Send + use<'_> {
        let answered = handle_on(Some(self), request, peer, std::convert::identity, InMap);
        async move {
            match answered.await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    }

    /// The answers given before any route: `server.health_path` (the store's readiness, as `/readyz`), and 413 for
    /// a declared body over `server.max_body_bytes` (a streamed one is held to it as it is read).
    #[inline]
    fn answer_before_routing(
        &self,
        compiled: &CompiledConfig,
        request: &mut Request<Body>,
    ) -> Option<Response<Body>> {
        if let Some((path, degraded)) = &compiled.health {
            if request.uri().path() == path {
                let (status, body) = responses::readiness(self, *degraded);
                return Some(crate::admission::json_response(status, &body));
            }
        }
        let max = compiled.max_body_bytes?;
        let declared = request
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|length| length > max) {
            return Some(responses::body_too_large(request.version()));
        }
        let body = std::mem::take(request.body_mut());
        *request.body_mut() = Body::new(crate::proxy::LimitedBody::new(body, max));
        None
    }

    /// Does what `route` does with an admitted `request`: answers it directly, or forwards it upstream. `Err` is
    /// the answer to a failure (the client's body, the upstream).
    ///
    /// Not an `async fn`, which would keep a second copy of the request in its future (see `Policy::serve`).
    #[allow(clippy::manual_async_fn)]
    fn act<'a>(
        &'a self,
        compiled: &'a CompiledConfig,
        route: &'a Route,
        mut request: Request<Body>,
        canonical: &'a CanonicalRequest<'a>,
        peer: SocketAddr,
        request_id: Option<&'a HeaderValue>,
    ) -> impl std::future::Future<Output = Result<Response<Body>, Response<Body>>> + use<'a> {
        async move {
            match &route.action {
                Action::Respond(direct) => {
                    // Read first, so that malformed framing is 400 here as on an upstream route.
                    if let Some(reading) = crate::proxy::discard(request.into_body()) {
                        if let Err(error) = reading.await {
                            return Err(responses::client_body_failed(&error));
                        }
                    }
                    let mut response = Response::new(Body::from(direct.body.clone()));
                    *response.status_mut() = direct.status;
                    for (name, value) in &direct.headers {
                        response.headers_mut().append(name.clone(), value.clone());
                    }
                    Ok(response)
                }
                Action::Upstream(upstream) => {
                    // X-Forwarded-Host and Forwarded's host= say the authority the client asked for, port included
                    // (`shop.example:8443`), as the Host field now holds it (the canonical one written for it, else
                    // the client's, both read by the canonical reading): an upstream building its own URLs needs the
                    // port. Routing and keys use the host without it.
                    let forwarded = ForwardedFacts {
                        peer: peer.ip(),
                        peer_trusted: compiled.client_ip.is_trusted(peer.ip()),
                        believed: compiled.client_ip.header(),
                        host: canonical.host.as_deref(),
                        host_field: canonical
                            .host_field
                            .as_ref()
                            .or(canonical.client_host.as_ref()),
                        version: request.version(),
                        write_forwarded: compiled.write_forwarded,
                        reads_trailers: route
                            .policy
                            .usage()
                            .is_some_and(|usage| usage.reads_trailers()),
                        request_id,
                    };
                    // Only the trail is held across the wait: every request's future has room for what is.
                    let trail = Trail::of(&request).cloned();
                    if let Some(trail) = &trail {
                        upstream_span(trail, &mut request);
                    }
                    // One reading for the upstream's deadline and its time (tokio's clock, which tests can pause).
                    let started = tokio::time::Instant::now();
                    let result = upstream
                        .forward(request, &canonical.path, &forwarded, started)
                        .await;
                    if !matches!(result, Err(ProxyError::ClientBody(_))) {
                        let elapsed = started.elapsed();
                        route.metrics.record_upstream(elapsed);
                        if let Some(trail) = trail {
                            let status = result.as_ref().ok().map(|r| r.status().as_u16());
                            trail.note_upstream_answer(elapsed, status);
                        }
                    }
                    result.map_err(|error| proxy_failure(route, &error))
                }
            }
        }
    }
}

/// [`Gateway::handle`] for a request read from a connection: `prepare` makes the request the gateway reads (its
/// body's errors marked as the client's), and no gateway (`None`) means its head was over
/// `server.max_header_bytes`. The server's request future is this one (returned by the gateway's
/// [`Handler`](crate::server::Handler)), and not a second one around `Gateway::handle`'s: hyper copies each
/// request's future whole, and every level of futures is copied again where it is built.
///
/// `form` says where the answer's own fields go (see [`AnswerForm`]).
///
/// Not an `async fn`, which would keep a second copy of the request in its future (see `Policy::serve`).
#[allow(clippy::manual_async_fn)]
pub(super) fn handle_on<G, B, P, A>(
    gateway: Option<G>,
    request: Request<B>,
    peer: SocketAddr,
    prepare: P,
    mut form: A,
) -> impl std::future::Future<Output = Result<A::Answer, Infallible>> + Send + use<G, B, P, A>
where
    G: std::ops::Deref<Target = Gateway> + Send,
    B: Send,
    P: FnOnce(Request<B>) -> Request<Body> + Send,
    A: AnswerForm,
{
    async move {
        // Borrowed, not moved out: a moved-out `Arc` would be a second copy held across the await.
        let Some(gateway) = gateway.as_deref() else {
            return Ok(form.answer(responses::head_too_large(request.version())));
        };
        let mut request = prepare(request);
        let compiled = gateway.compiled.load_full();
        if request
            .extensions()
            .get::<hyper::upgrade::OnUpgrade>()
            .is_some()
        {
            gateway.hold_tunnel(&mut request);
        }
        // Before anything reads or writes a field: what `Connection` names is the client's own fields, never
        // tollgate's.
        crate::proxy::clean_client_fields(request.headers_mut(), &compiled.client_fields);
        // An id made here goes upstream as a line of the head the proxy writes, not through the request's map.
        let Arrival {
            request_id,
            client_ip,
            id_left_out,
        } = Arrival::leaving_id_out(&mut request, peer.ip(), &compiled.client_ip);
        let access = AccessLine::begin(
            &mut request,
            client_ip,
            peer.ip(),
            &request_id,
            gateway.tracer.as_ref(),
        );
        let http1 = request.version() <= Version::HTTP_11;
        // Routed, limited and answered here, not in a future of its own: the request, moved into one, was copied
        // twice more (into it, and it into this one). Everything below reads the request through its canonical form
        // (see the README's security model): the route is matched on, the keys are built from and the upstream
        // receives the same method, host and path.
        let (route, mut response) = 'routed: {
            if let Some(early) = gateway.answer_before_routing(&compiled, &mut request) {
                break 'routed (None, early);
            }
            // The request goes upstream by value while its path is still needed: a clone of the target shares its
            // bytes, where an owned path would be a copy.
            let uri = request.uri().clone();
            let (canonical, route) = match read(&compiled, &request, &uri) {
                Ok(reading) => reading,
                Err(refusal) => break 'routed (None, answer(refusal.into(), None)),
            };
            let Some(route) = route else {
                let path = canonical.path.into_owned();
                break 'routed (None, answer(Refusal::NoRoute { path }, None));
            };
            if let Some(field) = &canonical.host_field {
                request
                    .headers_mut()
                    .insert(http::header::HOST, field.clone());
            }
            let id_to_write = id_left_out.then_some(&request_id);
            let forward =
                |request| gateway.act(&compiled, route, request, &canonical, peer, id_to_write);
            let served = match route.policy.usage() {
                // Nothing to decide (no limits, no consumers): forwarded from here, as `serve` would at once. Its
                // future, holding the request and then the forwarding's, is a level the request is not moved through.
                None if route.policy.decides_nothing() => forward(request).await,
                None => {
                    route
                        .policy
                        .serve(
                            &gateway.limiter,
                            &canonical,
                            client_ip,
                            request,
                            NoReservation,
                            forward,
                            form.lines(),
                        )
                        .await
                }
                // Boxed: a route without usage: carries no room for a body's reading and its reservation.
                Some(usage) => {
                    let serving: super::usage::Serving<'_> = Box::pin(super::usage::serve(
                        &gateway.limiter,
                        &route.policy,
                        usage,
                        &canonical,
                        client_ip,
                        request,
                        forward,
                    ));
                    serving.await
                }
            };
            // A failure's answer (an upstream unreachable, a client body that broke) is the gateway's own: it carries
            // no rate-limit fields.
            (Some(route), served.unwrap_or_else(|failure| failure))
        };
        let status = response.status();
        route
            .map_or(&compiled.unmatched, |r| &r.metrics)
            .count_request(status);
        if let Some(access) = access {
            response = access.follow(route.map(|r| r.name.as_str()), response);
        }
        match form.lines() {
            Some(lines) => {
                crate::admission::add_request_id_line(response.headers_mut(), lines, &request_id)
            }
            None => crate::admission::set_request_id(response.headers_mut(), request_id),
        }
        // Draining: a keep-alive client is told to reconnect, by then to an instance the balancer still sends to.
        if http1 && gateway.shutdown.is_draining() {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Ok(form.answer(response))
    }
}

/// Where an entry point takes an answer's own fields (its rate-limit fields and `x-request-id`): in its map
/// ([`InMap`]), or written ahead as [`HeadLines`] for the server that writes the answer's head itself, which then
/// come back beside the answer.
pub(super) trait AnswerForm: Send {
    /// What the entry point gets.
    type Answer;

    /// The head lines to write the fields into, if the entry point takes them so.
    fn lines(&mut self) -> Option<&mut HeadLines>;

    fn answer(self, response: Response<Body>) -> Self::Answer;
}

/// The answer's fields in its map.
pub(super) struct InMap;

impl AnswerForm for InMap {
    type Answer = Response<Body>;

    #[inline]
    fn lines(&mut self) -> Option<&mut HeadLines> {
        None
    }

    #[inline]
    fn answer(self, response: Response<Body>) -> Response<Body> {
        response
    }
}

impl AnswerForm for HeadLines {
    /// The answer, and the bytes of its head lines.
    type Answer = (Response<Body>, Vec<u8>);

    #[inline]
    fn lines(&mut self) -> Option<&mut HeadLines> {
        Some(self)
    }

    #[inline]
    fn answer(self, response: Response<Body>) -> (Response<Body>, Vec<u8>) {
        (response, self.into_buffer())
    }
}

/// The tracer of `config`'s `telemetry.otlp`, when it has one and a runtime runs its exporter.
fn tracer_for(config: &Config) -> Option<Arc<Tracer>> {
    let settings = config.telemetry.otlp.as_ref()?;
    if tokio::runtime::Handle::try_current().is_err() {
        tracing::warn!("telemetry.otlp: no runtime to export spans on; traces are off");
        return None;
    }
    Some(Arc::new(Tracer::start(settings)))
}

/// Starts the span of the request sent upstream, on a sampled trace: named in the `traceparent` the upstream gets.
#[cold]
fn upstream_span(trail: &Trail, request: &mut Request<Body>) {
    let Some(server) = trail.span() else {
        return;
    };
    let span = server.child();
    crate::telemetry::trace::propagate(request.headers_mut(), &span);
    trail.note_upstream_call(UpstreamCall {
        span,
        start: std::time::SystemTime::now(),
        status: None,
    });
}

/// The consumer directory that goes with `config`'s store: in its Redis when it is one, holding the consumers
/// `consumers.cache` says. Made once: it outlives reloads (so does its cache size).
fn directory_on(config: &Config) -> Arc<Directory> {
    let cache = config
        .consumers
        .as_ref()
        .and_then(|consumers| consumers.cache);
    Directory::from_settings_cached(&config.store, cache).unwrap_or_else(|error| {
        tracing::error!(%error, "consumer directory: keeping runtime settings in this process only");
        Directory::in_memory()
    })
}

impl Gateway {
    /// How the running config reads `request` from `peer`: its route, client, allowlist verdict and keys, by the
    /// same steps as the request path (admission's, on the route that takes it); or the refusal the request path
    /// answers it with. For tools and tests that check that a request and the request forwarded for it read the
    /// same (see the README's security model).
    pub fn view<B>(
        &self,
        request: &Request<B>,
        peer: SocketAddr,
    ) -> Result<RequestView, routing::Refusal> {
        let compiled = self.compiled.load();
        // The fields as the request path reads them: cleaned as they arrive. A copy: a tool's, never the path's.
        let mut cleaned = Request::new(());
        *cleaned.method_mut() = request.method().clone();
        *cleaned.uri_mut() = request.uri().clone();
        *cleaned.version_mut() = request.version();
        *cleaned.headers_mut() = request.headers().clone();
        crate::proxy::clean_client_fields(cleaned.headers_mut(), &compiled.client_fields);
        let request = &cleaned;
        let client_ip = compiled.client_ip.resolve(peer.ip(), request.headers());
        let (canonical, route) = read(&compiled, request, request.uri())?;
        match route {
            None => Ok(RequestView::unrouted(client_ip)),
            Some(route) => route
                .policy
                .view(&canonical, client_ip, request)
                .map_err(|_| routing::Refusal::AmbiguousKey),
        }
    }
}

/// The first steps of every request: its canonical form and the route that takes it, or why it is refused.
fn read<'r, 'u, B>(
    compiled: &'r CompiledConfig,
    request: &Request<B>,
    uri: &'u http::Uri,
) -> Result<(CanonicalRequest<'u>, Option<&'r Route>), routing::Refusal> {
    // Before the target is read: `CONNECT host:port` has no path, and is 405 as any CONNECT no route names.
    if request.method() == Method::CONNECT && !compiled.routes_connect {
        return Err(routing::Refusal::ConnectNotRouted);
    }
    let canonical = CanonicalRequest::with_rules(
        request.method(),
        request.version(),
        uri,
        request.headers(),
        compiled.path_rules,
    )?;
    let route = compiled.route_for(&canonical.target(request.method()));
    Ok((canonical, route))
}

fn proxy_failure(route: &Route, error: &ProxyError) -> Response<Body> {
    if let ProxyError::ClientBody(_) = error {
        // The client's fault, not the upstream's: no warning, and not counted against the upstream.
        tracing::debug!(route = %route.name, %error, "request body failed");
        return responses::client_body_failed(error);
    }
    tracing::warn!(route = %route.name, %error, "upstream failed");
    match error {
        ProxyError::Timeout { .. } => responses::gateway_timeout(&route.name),
        _ => responses::bad_gateway(&route.name),
    }
}
