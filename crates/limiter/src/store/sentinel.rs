//! Follows Sentinel failovers as they happen: every sentinel's `+switch-master` announcement names the new primary.
//!
//! Without it, the pool learns of a failover only when the old primary refuses a write (`READONLY`), and the old
//! primary keeps accepting writes until a sentinel reconfigures it, which it does at its next `INFO` poll of that
//! server, up to 10 s later. Meanwhile instances that reconnected for other reasons count on the new primary and
//! the others on the old one, whose counts are then lost when it resynchronises as a replica.

use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::config::{Config as FredConfig, ServerConfig};
use tokio::sync::broadcast::error::RecvError;

/// The channel on which a sentinel announces a new primary:
/// `<service> <old host> <old port> <new host> <new port>`.
const SWITCH_CHANNEL: &str = "+switch-master";

/// Subscribes to `+switch-master` on every sentinel of `config` (a Sentinel configuration; otherwise nothing
/// happens) and calls `switched` with the new primary of `config`'s service each time one announces it, until
/// `switched` returns false. Each sentinel has a subscriber connection of its own, so that one being down does
/// not hide the announcement of another, and a sentinel slower to learn of the failover announces it later.
pub(super) fn follow_failovers(
    config: &FredConfig,
    client_builder: impl Fn(FredConfig) -> Builder,
    switched: impl Fn(&Server) -> bool + Clone + Send + 'static,
) -> Result<(), Error> {
    let ServerConfig::Sentinel {
        hosts,
        service_name,
        username,
        password,
    } = &config.server
    else {
        return Ok(());
    };
    for sentinel in hosts {
        let sentinel_config = FredConfig {
            server: ServerConfig::Centralized {
                server: sentinel.clone(),
            },
            username: username.clone(),
            password: password.clone(),
            tls: config.tls.clone(),
            ..FredConfig::default()
        };
        let subscriber = client_builder(sentinel_config).build_subscriber_client()?;
        tokio::spawn(listen(
            subscriber,
            sentinel.clone(),
            service_name.clone(),
            switched.clone(),
        ));
    }
    Ok(())
}

async fn listen(
    subscriber: SubscriberClient,
    sentinel: Server,
    service: String,
    switched: impl Fn(&Server) -> bool,
) {
    let _connection = subscriber.connect();
    let _resubscriptions = subscriber.manage_subscriptions();
    let mut messages = subscriber.message_rx();
    // Only a subscription that succeeded is made again on reconnection: the first is retried until it does.
    while let Err(error) = subscriber.subscribe(SWITCH_CHANNEL).await {
        tracing::debug!(%error, %sentinel, "subscribing to failover announcements failed; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    loop {
        match messages.recv().await {
            Ok(message) => {
                let Some(primary) = message
                    .value
                    .as_str()
                    .and_then(|text| new_primary(&text, &service))
                else {
                    continue;
                };
                tracing::info!(%sentinel, %primary, "sentinel announced a new primary");
                if !switched(&primary) {
                    break;
                }
            }
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => break,
        }
    }
    let _ = subscriber.quit().await;
}

/// The new primary announced by a `+switch-master` message, if it is about `service`.
fn new_primary(message: &str, service: &str) -> Option<Server> {
    let mut fields = message.split_ascii_whitespace();
    if fields.next()? != service {
        return None;
    }
    let (_old_host, _old_port) = (fields.next()?, fields.next()?);
    let host = fields.next()?;
    let port = fields.next()?.parse().ok()?;
    Some(Server::new(host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_names_the_new_primary_of_its_service_only() {
        let announced = new_primary("cache 10.0.0.1 6379 10.0.0.2 6380", "cache").expect("parsed");
        assert_eq!((&*announced.host, announced.port), ("10.0.0.2", 6380));
        assert!(new_primary("other 10.0.0.1 6379 10.0.0.2 6380", "cache").is_none());
        assert!(new_primary("cache 10.0.0.1 6379 10.0.0.2", "cache").is_none());
        assert!(new_primary("cache 10.0.0.1 6379 10.0.0.2 port", "cache").is_none());
    }
}
