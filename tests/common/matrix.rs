//! One behaviour written once, run against each store: a test per store, so that `cargo test` names the one
//! that failed.

/// Makes, for `async fn body(redis: Option<&RedisServer>)` in the calling module, a module `name` of two tests:
/// `name::in_memory` runs `body(None)`, `name::on_redis` runs `body(Some(&redis))` on a fresh `redis-server`.
/// The test attribute's arguments may follow: `crate::each_store!(name, body, flavor = "multi_thread")`.
#[macro_export]
macro_rules! each_store {
    ($(#[$meta:meta])* $name:ident, $body:ident $(, $($flavor:tt)+)?) => {
        $(#[$meta])*
        mod $name {
            #[tokio::test$(($($flavor)+))?]
            async fn in_memory() {
                super::$body(None).await;
            }

            #[tokio::test$(($($flavor)+))?]
            async fn on_redis() {
                let redis = $crate::common::redis::RedisServer::start();
                super::$body(Some(&redis)).await;
            }
        }
    };
}
