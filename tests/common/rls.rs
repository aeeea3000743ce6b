//! Envoy's rate limit service served in this process on a free port, and a tonic client that builds requests as
//! Envoy does.

use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate::config::Config;
use tollgate::rls::RateLimitService;
use tonic::transport::Channel;

/// A rate limit service served on 127.0.0.1 and a free port (the config's `rls.listen` is ignored).
pub struct TestRls {
    pub addr: SocketAddr,
    pub service: Arc<RateLimitService>,
    shutdown: Option<oneshot::Sender<()>>,
}

/// Starts the rate limit service of `config` (in memory on a [`TestClock`](super::clock::TestClock), see
/// [`test_limiter`](super::test_limiter)); with Redis, waits until it is connected when `wait_for_redis`.
pub async fn start_rls_with(config: &Config, wait_for_redis: bool) -> TestRls {
    let (limiter, _clock) = super::test_limiter(&config.store, wait_for_redis).await;
    let settings = config.rls.as_ref().expect("the config has an rls block");
    let service = Arc::new(RateLimitService::new(
        settings,
        &config.store.key_prefix,
        limiter,
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (tx, rx) = oneshot::channel::<()>();
    let served = Arc::clone(&service);
    tokio::spawn(async move {
        let _ = tollgate::rls::serve(listener, served, async {
            let _ = rx.await;
        })
        .await;
    });
    TestRls {
        addr,
        service,
        shutdown: Some(tx),
    }
}

/// Starts the rate limit service of `yaml`, waiting for Redis.
pub async fn start_rls(yaml: &str) -> TestRls {
    start_rls_with(&super::config(yaml), true).await
}

impl TestRls {
    /// A gRPC client of this service.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to the rate limit service")
    }

    /// A channel to this service (for the health client).
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }
}

impl Drop for TestRls {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A descriptor of `entries` (key, value), as Envoy's rate limit actions build them.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// [`descriptor`] with its own `hits_addend`.
pub fn descriptor_taking(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..descriptor(entries)
    }
}

/// A request to `domain` with `descriptors` (request-level `hits_addend` 0: each takes 1 unless it says).
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Sends `request`, panicking on a gRPC error.
pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("a rate limit answer")
        .into_inner()
}

/// Whether the answer is OK (1) rather than OVER_LIMIT (2).
pub fn is_ok(response: &RateLimitResponse) -> bool {
    response.overall_code == 1
}

/// The value of header `name` among the answer's `response_headers_to_add`.
pub fn header<'r>(response: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}
