//! Resets told to every instance sharing a Redis, over publish/subscribe.

use std::time::Duration;

use fred::prelude::*;
use tokio::sync::broadcast::error::RecvError;

use super::connection::client_builder;
use super::RedisStore;
use crate::limiter::store::StoreError;

/// The channel resets are announced on unless [`RedisStore::with_reset_channel`] names another.
pub const DEFAULT_RESET_CHANNEL: &str = "tollgate:resets";

/// What [`RedisStore::on_reset`] hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetNotice<'a> {
    /// An instance reset this key.
    Key(&'a str),
    /// Announcements may have been missed (the subscriber reconnected, or fell behind): any key may have been reset.
    MaybeMissed,
}

// === impl RedisStore ===

impl RedisStore {
    /// Deletes the state of `key`; true if there was any. Then publishes `key` on the reset channel, so that every
    /// instance listening ([`on_reset`](Self::on_reset)), this one included, forgets what it remembers of the key
    /// in-process.
    pub async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        let client = self.connection.pool.next();
        let deleted: i64 = client.del(key).await?;
        // The key is reset in Redis whatever happens here: a failed announcement (an ACL user without the
        // channel, say) is worth a warning, not a failed reset.
        let announced: Result<i64, _> = client.publish(&*self.reset_channel, key).await;
        if let Err(error) = announced {
            tracing::warn!(%error, channel = %self.reset_channel, "reset not announced to other instances");
        }
        Ok(deleted > 0)
    }

    /// Calls `forget` with each key reset by any instance on this Redis, heard on a subscriber connection of its
    /// own, until `forget` returns false. The subscription is made again after every reconnection, and
    /// [`ResetNotice::MaybeMissed`] then says that resets announced meanwhile were not heard.
    pub fn on_reset(
        &self,
        forget: impl Fn(ResetNotice<'_>) -> bool + Send + 'static,
    ) -> Result<(), StoreError> {
        let subscriber =
            client_builder(self.connection.config.clone()).build_subscriber_client()?;
        let channel = self.reset_channel.to_string();
        let _connection = subscriber.connect();
        let _resubscriptions = subscriber.manage_subscriptions();
        tokio::spawn(async move {
            let mut messages = subscriber.message_rx();
            let mut reconnections = subscriber.reconnect_rx();
            // Only a subscription that succeeded is made again on reconnection, so the first is retried until it
            // does: Redis may not be up yet, or an ACL user may lack the channel until an operator grants it.
            let mut warned = false;
            while let Err(error) = subscriber.subscribe(channel.as_str()).await {
                // Redis being down is reported by the pool already; a refusal by Redis itself is news.
                let unreachable = matches!(
                    error.kind(),
                    ErrorKind::IO
                        | ErrorKind::Canceled
                        | ErrorKind::Timeout
                        | ErrorKind::Backpressure
                );
                if unreachable || std::mem::replace(&mut warned, true) {
                    tracing::debug!(%error, %channel, "subscribing to resets failed; retrying");
                } else {
                    tracing::warn!(%error, %channel, "cannot hear other instances' resets; retrying");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            loop {
                let go_on = tokio::select! {
                    message = messages.recv() => match message {
                        Ok(message) => match message.value.as_str() {
                            Some(key) => forget(ResetNotice::Key(&key)),
                            None => true,
                        },
                        Err(RecvError::Lagged(_)) => forget(ResetNotice::MaybeMissed),
                        Err(RecvError::Closed) => false,
                    },
                    // Down for a while: whatever was announced meanwhile went unheard.
                    reconnected = reconnections.recv() => match reconnected {
                        Ok(_) | Err(RecvError::Lagged(_)) => forget(ResetNotice::MaybeMissed),
                        Err(RecvError::Closed) => false,
                    },
                };
                if !go_on {
                    break;
                }
            }
            let _ = subscriber.quit().await;
        });
        Ok(())
    }
}
