//! What every instance sharing a Redis is told over publish/subscribe: the keys reset, and the slots freed on full
//! keys that requests may be waiting for.

use std::time::Duration;

use fred::prelude::*;
use tokio::sync::broadcast::error::RecvError;

use super::connection::client_builder;
use super::RedisStore;
use crate::store::StoreError;

/// The channel resets are announced on unless [`RedisStore::with_reset_channel`] names another.
pub const DEFAULT_RESET_CHANNEL: &str = "tollgate:resets";

/// The channel freed slots are announced on unless [`RedisStore::with_key_prefix`] names another.
pub const DEFAULT_SLOTS_CHANNEL: &str = "tollgate:slots";

/// What [`RedisStore::on_announcement`] hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announcement<'a> {
    /// An instance reset this key.
    Reset(&'a str),
    /// A slot of this key (a `concurrency` limit's with a queue, full until then) was released.
    Released(&'a str),
    /// Announcements may have been missed (the subscriber reconnected, or fell behind): any key may have been reset,
    /// any slot released.
    MaybeMissed,
}

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

    /// Calls `forget` with each key reset by any instance on this Redis (see
    /// [`on_announcement`](Self::on_announcement)), until `forget` returns false.
    pub fn on_reset(
        &self,
        forget: impl Fn(ResetNotice<'_>) -> bool + Send + 'static,
    ) -> Result<(), StoreError> {
        self.on_announcement(move |heard| match heard {
            Announcement::Reset(key) => forget(ResetNotice::Key(key)),
            Announcement::MaybeMissed => forget(ResetNotice::MaybeMissed),
            Announcement::Released(_) => true,
        })
    }

    /// Calls `hear` with each key reset and each slot freed by any instance on this Redis, heard on one subscriber
    /// connection of its own, until `hear` returns false. The subscriptions are made again after every
    /// reconnection, and [`Announcement::MaybeMissed`] then says that what was announced meanwhile went unheard.
    pub fn on_announcement(
        &self,
        hear: impl Fn(Announcement<'_>) -> bool + Send + 'static,
    ) -> Result<(), StoreError> {
        let subscriber =
            client_builder(self.connection.config.clone()).build_subscriber_client()?;
        let channel = self.reset_channel.to_string();
        let slots = match self.connection.slots_channel.get() {
            Some(channel) => channel.as_str().map(|c| c.to_string()),
            None => None,
        }
        .unwrap_or_else(|| DEFAULT_SLOTS_CHANNEL.to_owned());
        let _connection = subscriber.connect();
        let _resubscriptions = subscriber.manage_subscriptions();
        tokio::spawn(async move {
            let mut messages = subscriber.message_rx();
            let mut reconnections = subscriber.reconnect_rx();
            // Only a subscription that succeeded is made again on reconnection, so the first is retried until it
            // does: Redis may not be up yet, or an ACL user may lack the channel until an operator grants it. Resets
            // first; freed slots apart, so that a user granted only the resets' channel still hears resets (waiting
            // requests then find slots by their own timer).
            let mut refusals = Refusals::default();
            while let Err(error) = subscriber.subscribe(channel.as_str()).await {
                refusals.failed(&error, &channel, "resets");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let (mut hearing_slots, mut slot_refusals) = (false, Refusals::default());
            let mut slots_retry = tokio::time::interval(Duration::from_secs(1));
            loop {
                let go_on = tokio::select! {
                    message = messages.recv() => match message {
                        Ok(message) => match message.value.as_str() {
                            Some(key) if *message.channel == *slots => {
                                hear(Announcement::Released(&key))
                            }
                            Some(key) => hear(Announcement::Reset(&key)),
                            None => true,
                        },
                        Err(RecvError::Lagged(_)) => hear(Announcement::MaybeMissed),
                        Err(RecvError::Closed) => false,
                    },
                    // Down for a while: whatever was announced meanwhile went unheard.
                    reconnected = reconnections.recv() => match reconnected {
                        Ok(_) | Err(RecvError::Lagged(_)) => hear(Announcement::MaybeMissed),
                        Err(RecvError::Closed) => false,
                    },
                    _ = slots_retry.tick(), if !hearing_slots => {
                        match subscriber.subscribe(slots.as_str()).await {
                            Ok(()) => hearing_slots = true,
                            Err(error) => slot_refusals.failed(&error, &slots, "freed slots"),
                        }
                        true
                    }
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

/// A subscription that failed, logged at WARN once if Redis itself refused it (an ACL denying the channel), else
/// at DEBUG: Redis being down is reported by the pool already.
#[derive(Debug, Default)]
struct Refusals {
    warned: bool,
}

impl Refusals {
    fn failed(&mut self, error: &fred::error::Error, channel: &str, what: &str) {
        let unreachable = matches!(
            error.kind(),
            ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Timeout | ErrorKind::Backpressure
        );
        if unreachable || std::mem::replace(&mut self.warned, true) {
            tracing::debug!(%error, %channel, "subscribing to {what} failed; retrying");
        } else {
            tracing::warn!(%error, %channel, "cannot hear other instances' {what}; retrying");
        }
    }
}
