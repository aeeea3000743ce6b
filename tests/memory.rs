//! Memory that must stay flat as the work grows, counted by a counting allocator (live bytes, not time): histogram
//! samples without scrapes, bytes per route, bytes per idle connection.

mod common;

use std::alloc::System;
use std::time::Duration;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// One measurement at a time: the counts are process-wide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Bytes allocated and not yet freed, by the whole process.
fn live_bytes() -> i64 {
    let stats = ALLOCATOR.stats();
    stats.bytes_allocated as i64 - stats.bytes_deallocated as i64
}

/// A config of `routes` routes, each with a path prefix, an upstream and a per-address limit: the common shape.
fn routes_yaml(routes: usize) -> String {
    let mut yaml = String::from(
        "store:\n  backend: memory\nupstreams:\n  backend:\n    targets: [\"http://127.0.0.1:9\"]\nroutes:\n",
    );
    for i in 0..routes {
        yaml.push_str(&format!(
            "  - name: route-{i}\n    match: {{ path_prefix: /r{i} }}\n    upstream: backend\n    limits:\n      - name: per-ip\n        key: [ip]\n        algorithm: fixed_window\n        limit: 100\n        period: 1m\n"
        ));
    }
    yaml
}

/// Live bytes held by a compiled config of `routes` routes (parsed and compiled; kept until measured).
fn bytes_held_by_routes(routes: usize) -> i64 {
    let yaml = routes_yaml(routes);
    let before = live_bytes();
    let config = common::config(&yaml);
    let compiled = tollgate::gateway::CompiledConfig::new(&config, None);
    drop(config);
    let held = live_bytes() - before;
    drop(compiled);
    held
}

#[tokio::test]
async fn the_request_path_s_histograms_hold_no_samples() {
    let _serial = SERIAL.lock().await;
    let metrics = tollgate::telemetry::prometheus().expect("recorder");
    for name in [
        "tollgate_upstream_duration_seconds",
        "tollgate_store_duration_seconds",
    ] {
        let histogram = metrics::histogram!(name, "route" => "counted");
        let baseline = live_bytes();
        for i in 0..1_000_000u32 {
            histogram.record(f64::from(i % 1000) / 1000.0);
        }
        let grown = live_bytes().saturating_sub(baseline);
        assert!(
            grown < 100_000,
            "{name}: {grown} bytes grown for 1M samples"
        );
        let count = format!("{name}_count{{route=\"counted\"}} 1000000\n");
        assert!(metrics.render().contains(&count), "{name}: not counted");
    }
}

#[tokio::test]
async fn histogram_samples_are_released_without_a_scrape() {
    let _serial = SERIAL.lock().await;
    tollgate::telemetry::prometheus().expect("recorder");
    // A histogram the exporter keeps (the request path's own are counted as they come, below).
    let histogram = metrics::histogram!("tollgate_queue_wait_seconds", "route" => "unscraped");
    let baseline = live_bytes();
    for round in 0..2 {
        // 1M samples are 8 MB while held: only the upkeep folds them into buckets, and nobody scrapes here.
        for i in 0..1_000_000u32 {
            histogram.record(f64::from(i % 1000) / 1000.0);
        }
        let grown = live_bytes() - baseline;
        assert!(
            grown > 4_000_000,
            "round {round}: samples not held? {grown} bytes"
        );
        // Traffic goes on at a trickle, as it does on a gateway: the recorder frees the blocks it folded once no
        // thread can still be reading them, which recording threads establish as they pass.
        let released = common::eventually(Duration::from_secs(20), async || {
            for i in 0..1000u32 {
                histogram.record(f64::from(i) / 1000.0);
            }
            live_bytes() - baseline < 1_000_000
        })
        .await;
        assert!(
            released.is_some(),
            "round {round}: {} bytes still held after the upkeep interval",
            live_bytes() - baseline
        );
    }
}

#[tokio::test]
async fn a_route_holds_at_most_5_kb() {
    let _serial = SERIAL.lock().await;
    tollgate::telemetry::prometheus().expect("recorder");
    let one = bytes_held_by_routes(1);
    let thousand = bytes_held_by_routes(1000);
    let per_route = (thousand - one) / 999;
    eprintln!("bytes per route at 1,000 routes: {per_route}");
    assert!(per_route <= 5 * 1024, "{per_route} bytes per route");
}

/// Allocations and bytes allocated by `changes` consumer changes on a directory of `size` consumers.
async fn cost_of_changes(size: usize, changes: usize) -> (usize, usize) {
    use tollgate::consumers::directory::{ConsumerRecord, Directory};
    let record = |plan: &str| ConsumerRecord {
        plan: Some(plan.to_owned()),
        ..ConsumerRecord::default()
    };
    let directory = Directory::in_memory();
    let records = (0..size)
        .map(|i| (format!("user-{i}"), record("free")))
        .collect();
    directory.import(records).await.expect("import");
    assert_eq!(directory.len(), size);
    let before = ALLOCATOR.stats();
    for i in 0..changes {
        directory
            .put(
                &format!("user-{}", i * 7 % size),
                record(&format!("plan-{i}")),
            )
            .await
            .expect("put");
    }
    let after = ALLOCATOR.stats();
    (
        after.allocations - before.allocations,
        after.bytes_allocated - before.bytes_allocated,
    )
}

#[tokio::test]
async fn a_consumer_change_costs_the_same_at_100k_consumers_as_at_one() {
    let _serial = SERIAL.lock().await;
    let changes = 100;
    let (small_allocations, small_bytes) = cost_of_changes(1, changes).await;
    let (large_allocations, large_bytes) = cost_of_changes(100_000, changes).await;
    eprintln!(
        "per change: {} allocations / {} bytes at 1 consumer, {} / {} at 100,000",
        small_allocations / changes,
        small_bytes / changes,
        large_allocations / changes,
        large_bytes / changes
    );
    // A copy of the directory per change would be 100,000 entries' worth (megabytes) each time; a persistent
    // map copies only the few nodes on the changed entry's path.
    assert!(
        large_allocations <= small_allocations * 2,
        "{large_allocations} allocations at 100,000 consumers, {small_allocations} at 1"
    );
    assert!(
        large_bytes / changes <= 16 * 1024,
        "{} bytes per change at 100,000 consumers",
        large_bytes / changes
    );
}

/// Bytes allocated (not net: every copy counts) while `f` runs.
fn bytes_allocated_by(f: impl FnOnce()) -> usize {
    let before = ALLOCATOR.stats().bytes_allocated;
    f();
    ALLOCATOR.stats().bytes_allocated - before
}

#[tokio::test]
async fn a_sliding_log_check_copies_a_chunk_or_two_not_the_whole_log() {
    use std::sync::Arc;
    use tollgate::limiter::store::{LimitCheck, MemoryStore};
    use tollgate::limiter::{Algorithm, Limit, ManualClock};
    let _serial = SERIAL.lock().await;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = MemoryStore::new(1_000, clock.clone());
    let log = |cost| {
        let algorithm = Algorithm::SlidingLog {
            limit: 100_000,
            period_ms: 3_600_000,
        };
        Limit::new("log", algorithm, cost).expect("valid")
    };
    let (bulk, one) = (log(1_000), log(1));
    let key = "tollgate:r:log:{k}";
    // 99,000 entries (792 KB of timestamps), a few milliseconds apart.
    for _ in 0..99 {
        clock.advance(3);
        let outcome = store.check(&[LimitCheck { key, limit: &bulk }]);
        assert!(outcome.allowed);
    }
    clock.advance(3);
    let admitted = bytes_allocated_by(|| {
        assert!(store.check(&[LimitCheck { key, limit: &one }]).allowed);
    });
    let denied = bytes_allocated_by(|| {
        assert!(!store.check(&[LimitCheck { key, limit: &bulk }]).allowed);
    });
    // Copying the log would allocate its 792 KB each time.
    assert!(
        admitted < 16 * 1024,
        "an admitted check allocated {admitted} bytes"
    );
    assert!(
        denied < 16 * 1024,
        "a denied check allocated {denied} bytes"
    );
}

/// Reads one response with a `content-length` body from `stream` (blocking), whole.
fn read_response(stream: &mut std::net::TcpStream) {
    use std::io::Read;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .expect("a content-length");
            if bytes.len() >= end + 4 + length {
                assert!(head.starts_with("http/1.1 200"), "{head}");
                return;
            }
        }
        let read = stream.read(&mut chunk).expect("read a response");
        assert!(read > 0, "connection closed mid-response");
        bytes.extend_from_slice(&chunk[..read]);
    }
}

/// `count` keep-alive connections to `addr`, each having made one proxied request and read its answer whole.
async fn idle_connections(addr: std::net::SocketAddr, count: usize) -> Vec<std::net::TcpStream> {
    // Blocking sockets, on a thread of their own: the client side allocates nothing the count would see.
    tokio::task::spawn_blocking(move || {
        let mut streams = Vec::with_capacity(count);
        for _ in 0..count {
            use std::io::Write;
            let mut stream = std::net::TcpStream::connect(addr).expect("connect");
            stream
                .write_all(b"GET /idle HTTP/1.1\r\nHost: a\r\n\r\n")
                .expect("send a request");
            read_response(&mut stream);
            streams.push(stream);
        }
        streams
    })
    .await
    .expect("clients")
}

#[tokio::test]
async fn an_idle_keep_alive_connection_holds_at_most_8_kb() {
    let _serial = SERIAL.lock().await;
    let upstream = common::upstream::Upstream::start().await;
    let gateway = common::start_gateway(&format!(
        "store:\n  backend: memory\nupstreams:\n  backend:\n    targets: [\"{}\"]\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: backend\n",
        upstream.url()
    ))
    .await;
    // A first connection and request set up what every later one shares (the route's metrics, the upstream
    // connection in the pool); it is closed before counting.
    drop(idle_connections(gateway.addr, 1).await);
    common::eventually(Duration::from_secs(5), async || {
        gateway.gateway.shutdown().open_connections() == 0
    })
    .await
    .expect("the first connection closed");
    let count = 1_000;
    let baseline = live_bytes();
    let streams = idle_connections(gateway.addr, count).await;
    let per_connection = || (live_bytes() - baseline) / count as i64;
    // Released a moment after its last answer: a connection busy with back-to-back requests keeps its buffers.
    let rested = common::eventually(Duration::from_secs(10), async || {
        per_connection() <= 8 * 1024
    })
    .await;
    eprintln!(
        "live bytes per idle keep-alive connection at {count}: {} (after {rested:?})",
        per_connection()
    );
    assert!(
        rested.is_some(),
        "{} bytes per idle connection",
        per_connection()
    );
    assert_eq!(gateway.gateway.shutdown().open_connections(), count);
    // Every connection that rested serves its next request.
    tokio::task::spawn_blocking(move || {
        for mut stream in streams {
            use std::io::Write;
            stream
                .write_all(b"GET /again HTTP/1.1\r\nHost: a\r\n\r\n")
                .expect("send a second request");
            read_response(&mut stream);
        }
    })
    .await
    .expect("second requests");
}
