//! Load for Envoy's rate limit service: one `ShouldRateLimit` call per decision, over concurrent HTTP/2 streams on
//! a few connections, against a tollgate already running; prints decisions per second and latency percentiles.
//! `bench/rls.py` starts tollgate (memory store, then Redis) and runs it; by hand:
//!
//! ```sh
//! cargo bench --bench rls_load -- --addr 127.0.0.1:18091 --duration 10 --concurrency 64 --connections 4
//! ```
//!
//! Each call carries `--descriptors` descriptors for one of `--keys` client addresses (`remote_address`, then
//! `generic_key=d1` + `remote_address`, ...), the addresses taken in turn by each stream. A call counts if it was
//! sent after the warm-up and answered before the end; latency is from sending to the answer, in the client.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

const USAGE: &str = "usage: rls_load --addr HOST:PORT [--domain bench] [--duration 10] [--warmup 2] \
                     [--concurrency 64] [--connections 4] [--keys 10000] [--descriptors 1] [--json]";

/// What to send, and for how long.
#[derive(Debug, Clone)]
struct Options {
    addr: String,
    domain: String,
    duration: Duration,
    warmup: Duration,
    concurrency: usize,
    connections: usize,
    keys: u32,
    descriptors: usize,
    json: bool,
}

/// What one stream saw.
#[derive(Debug, Default)]
struct Seen {
    /// Microseconds from sending to the answer, of each call counted.
    latencies_us: Vec<u32>,
    ok: u64,
    over_limit: u64,
    errors: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.is_empty() {
        // `cargo bench` runs every bench without arguments: nothing to measure without a running tollgate.
        eprintln!("rls_load: no --addr, nothing measured (bench/rls.py starts tollgate and runs this)\n{USAGE}");
        return ExitCode::SUCCESS;
    }
    let options = match parse(&args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("rls_load: {error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut channels = Vec::with_capacity(options.connections);
    for _ in 0..options.connections {
        let channel = match Channel::from_shared(format!("http://{}", options.addr)) {
            Ok(endpoint) => endpoint.connect().await,
            Err(error) => {
                eprintln!("rls_load: --addr {}: {error}", options.addr);
                return ExitCode::from(2);
            }
        };
        match channel {
            Ok(channel) => channels.push(channel),
            Err(error) => {
                eprintln!("rls_load: cannot connect to {}: {error}", options.addr);
                return ExitCode::FAILURE;
            }
        }
    }
    let measured_from = Instant::now() + options.warmup;
    let end = measured_from + options.duration;
    let streams: Vec<_> = (0..options.concurrency)
        .map(|stream| {
            let client = RateLimitServiceClient::new(channels[stream % channels.len()].clone());
            tokio::spawn(load(client, options.clone(), stream, measured_from, end))
        })
        .collect();
    let mut seen = Seen::default();
    for stream in streams {
        match stream.await {
            Ok(one) => {
                seen.latencies_us.extend(one.latencies_us);
                seen.ok += one.ok;
                seen.over_limit += one.over_limit;
                seen.errors += one.errors;
            }
            Err(error) => {
                eprintln!("rls_load: a stream failed: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    report(&options, seen);
    ExitCode::SUCCESS
}

/// One stream: calls one after another until `end`, counting those sent from `measured_from` on.
async fn load(
    mut client: RateLimitServiceClient<Channel>,
    options: Options,
    stream: usize,
    measured_from: Instant,
    end: Instant,
) -> Seen {
    let mut seen = Seen::default();
    let mut key = stream as u32 % options.keys;
    let step = (options.concurrency as u32).max(1);
    loop {
        let request = request(&options, key);
        key = (key + step) % options.keys;
        let sent = Instant::now();
        if sent >= end {
            return seen;
        }
        let answer = client.should_rate_limit(request).await;
        let answered = Instant::now();
        if sent < measured_from || answered > end {
            continue;
        }
        match answer {
            Ok(answer) => {
                let took = answered.duration_since(sent).as_micros();
                seen.latencies_us
                    .push(u32::try_from(took).unwrap_or(u32::MAX));
                if answer.get_ref().overall_code == 1 {
                    seen.ok += 1;
                } else {
                    seen.over_limit += 1;
                }
            }
            Err(_) => seen.errors += 1,
        }
    }
}

/// The request for client address number `key`, with `options.descriptors` descriptors.
fn request(options: &Options, key: u32) -> RateLimitRequest {
    let address = format!(
        "10.{}.{}.{}",
        (key >> 16) & 255,
        (key >> 8) & 255,
        key & 255
    );
    let entry = |key: &str, value: &str| Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    };
    let descriptors = (0..options.descriptors)
        .map(|i| {
            let mut entries = Vec::with_capacity(2);
            if i > 0 {
                entries.push(entry("generic_key", &format!("d{i}")));
            }
            entries.push(entry("remote_address", &address));
            RateLimitDescriptor {
                entries,
                ..RateLimitDescriptor::default()
            }
        })
        .collect();
    RateLimitRequest {
        domain: options.domain.clone(),
        descriptors,
        hits_addend: 0,
    }
}

fn report(options: &Options, mut seen: Seen) {
    seen.latencies_us.sort_unstable();
    let calls = seen.latencies_us.len();
    let at = |quantile: f64| -> f64 {
        if calls == 0 {
            return 0.0;
        }
        let index = ((calls as f64 * quantile).ceil() as usize).clamp(1, calls) - 1;
        f64::from(seen.latencies_us[index]) / 1000.0
    };
    let rate = calls as f64 / options.duration.as_secs_f64();
    let (p50, p99, max) = (at(0.50), at(0.99), at(1.0));
    if options.json {
        let line = serde_json::json!({
            "decisions_per_s": rate.round(),
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max,
            "calls": calls,
            "ok": seen.ok,
            "over_limit": seen.over_limit,
            "errors": seen.errors,
            "concurrency": options.concurrency,
            "connections": options.connections,
            "descriptors": options.descriptors,
        });
        println!("{line}");
    } else {
        println!(
            "{rate:.0} decisions/s   p50 {p50:.3} ms   p99 {p99:.3} ms   max {max:.3} ms   ({calls} calls: {} ok, {} \
             over_limit, {} errors; {} streams on {} connections, {} descriptor(s) per call)",
            seen.ok,
            seen.over_limit,
            seen.errors,
            options.concurrency,
            options.connections,
            options.descriptors
        );
    }
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        addr: String::new(),
        domain: "bench".to_owned(),
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        concurrency: 64,
        connections: 4,
        keys: 10_000,
        descriptors: 1,
        json: false,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "--json" {
            options.json = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || -> Result<u64, String> {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a whole number: {value}"))
        };
        match flag.as_str() {
            "--addr" => options.addr = value.clone(),
            "--domain" => options.domain = value.clone(),
            "--duration" => options.duration = Duration::from_secs(number()?),
            "--warmup" => options.warmup = Duration::from_secs(number()?),
            "--concurrency" => options.concurrency = number()? as usize,
            "--connections" => options.connections = number()? as usize,
            "--keys" => options.keys = u32::try_from(number()?).map_err(|_| "--keys: too many")?,
            "--descriptors" => options.descriptors = number()? as usize,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if options.addr.is_empty() {
        return Err("--addr is needed".to_owned());
    }
    if options.concurrency == 0 || options.connections == 0 || options.keys == 0 {
        return Err("--concurrency, --connections and --keys must be at least 1".to_owned());
    }
    if options.descriptors == 0 || options.duration.is_zero() {
        return Err("--descriptors and --duration must be at least 1".to_owned());
    }
    Ok(options)
}
