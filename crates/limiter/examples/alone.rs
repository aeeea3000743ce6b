//! The limiter without the gateway: two limits on one client, checked all-or-nothing, in process or on Redis.
//!
//! Run with: `cargo run -p tollgate-limiter --example alone` (in process), or with a Redis URL as its argument
//! (`cargo run -p tollgate-limiter --example alone -- redis://127.0.0.1:6379`) to share the limits with every
//! process that uses the same Redis.

use std::error::Error;

use tollgate_limiter::store::LimitCheck;
use tollgate_limiter::{Algorithm, Limit, Rate, RateLimiter, StoreSettings};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let settings = match std::env::args().nth(1) {
        Some(url) => StoreSettings::redis(url),
        None => StoreSettings::default(),
    };
    let limiter = RateLimiter::from_settings(&settings)?;
    // A burst of 3, then one request a second; and no more than 5 a minute whatever the burst.
    let per_second = Limit::new(
        "per-second",
        Algorithm::Gcra {
            rate: Rate::new(1, 1_000)?,
            burst: 3,
        },
        1,
    )?;
    let per_minute = Limit::new(
        "per-minute",
        Algorithm::SlidingWindow {
            limit: 5,
            period_ms: 60_000,
        },
        1,
    )?;
    let client = "203.0.113.7";
    let (second_key, minute_key) = (
        format!("example:per-second:{{{client}}}"),
        format!("example:per-minute:{{{client}}}"),
    );
    let checks = [
        LimitCheck {
            key: &second_key,
            limit: &per_second,
        },
        LimitCheck {
            key: &minute_key,
            limit: &per_minute,
        },
    ];
    for request in 1..=5 {
        let outcome = limiter.check(&checks).await?;
        match outcome.most_restrictive().map(|i| outcome.decisions[i]) {
            Some(decision) if outcome.allowed => println!(
                "request {request}: admitted, {} left of {}",
                decision.remaining, decision.limit
            ),
            Some(decision) => println!(
                "request {request}: refused, retry in {} ms",
                decision.retry_after_ms
            ),
            // No store could decide and `on_error` admitted it.
            None => println!("request {request}: admitted without a decision"),
        }
    }
    Ok(())
}
