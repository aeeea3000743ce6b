//! The Redis store's health: why connections fail, outages logged once each, risky eviction policies.

use std::collections::HashMap;
use std::sync::Arc;

use fred::prelude::*;
use fred::types::CustomCommand;

/// What the pool last heard of its connections: why the last attempt to connect failed, in Redis's own words,
/// until one succeeds (requests only ever see "not connected", as they fail fast); and, from the last connection,
/// whether Redis may evict tollgate's keys.
#[derive(Debug, Default)]
pub(super) struct Link {
    cause: std::sync::Mutex<Option<String>>,
    eviction: std::sync::Mutex<Option<String>>,
    /// What was logged of the outage under way, by the connections or by the limiter's calls.
    outage: std::sync::Mutex<OutageLog>,
}

/// An outage as logged: when it began and the reasons already told, each once.
///
/// Outages that follow each other closely are one episode in the log: a reason told in the last
/// [`QUIET_AFTER_RECOVERY`] is not told again, and an outage that told nothing ends without a line. A Cluster slot
/// on the move fails the calls on that slot while the others succeed, which would otherwise log a failure and a
/// recovery per request.
#[derive(Debug, Default)]
struct OutageLog {
    since: Option<std::time::Instant>,
    logged: Vec<String>,
    /// Whether the outage under way has logged a line (so its end gets one).
    told: bool,
    /// When the last outage ended.
    recovered: Option<std::time::Instant>,
}

/// How a failure is told in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    /// The first line of an outage.
    First,
    /// Another reason during the same outage.
    Still,
}

impl OutageLog {
    /// A call failed for `reason` at `now`: the line to log, if any.
    fn failure(&mut self, reason: &str, now: std::time::Instant) -> Option<Told> {
        let first = self.since.is_none();
        if first {
            self.since = Some(now);
            let episode_over = self
                .recovered
                .is_none_or(|at| now.saturating_duration_since(at) >= QUIET_AFTER_RECOVERY);
            if episode_over {
                self.logged.clear();
            }
        }
        if self.logged.iter().any(|logged| logged == reason)
            || self.logged.len() >= MAX_LOGGED_REASONS
        {
            return None;
        }
        self.logged.push(reason.to_owned());
        self.told = true;
        Some(if first { Told::First } else { Told::Still })
    }

    /// Calls succeed again at `now`: how long the outage lasted, if it was told (its end is then told too).
    fn recovery(&mut self, now: std::time::Instant) -> Option<std::time::Duration> {
        let since = self.since.take()?;
        self.recovered = Some(now);
        std::mem::take(&mut self.told).then(|| now.saturating_duration_since(since))
    }
}

/// How long after an outage's end its reasons stay told.
const QUIET_AFTER_RECOVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Distinct failure reasons logged per outage at most: each is news once, a Redis alternating between a few is
/// not worth a line each time, and a reason that changes on every call (it never should) cannot flood the log.
const MAX_LOGGED_REASONS: usize = 8;

// === impl Link ===

impl Link {
    /// Follows the connection events of `clients`, and reads the eviction policy each time the first connects.
    pub(super) fn listen(self: &Arc<Self>, clients: &[Client]) {
        if let Some(first) = clients.first() {
            let (link, client) = (Arc::clone(self), first.clone());
            let _checks = first.on_reconnect(move |_| {
                let (link, client) = (Arc::clone(&link), client.clone());
                async move {
                    link.check_eviction(&client).await;
                    Ok(())
                }
            });
        }
        for client in clients {
            let link = Arc::clone(self);
            let _errors = client.on_error(move |(error, server)| {
                link.failed(&error, server.as_ref());
                async { Ok(()) }
            });
            let link = Arc::clone(self);
            let _reconnects = client.on_reconnect(move |_| {
                link.set(None);
                link.log_recovery();
                async { Ok(()) }
            });
        }
    }

    /// Remembers why a connection failed, and logs it once per outage (with the limiter's failures: see
    /// [`RedisStore::log_failure`]). A connection that closed says nothing of why (Redis stopped, a network cut,
    /// `CLIENT KILL`): the next attempt to connect will, and meanwhile the cause already known stays.
    fn failed(&self, error: &Error, server: Option<&Server>) {
        let server = server.map_or_else(String::new, |s| format!(" ({s})"));
        tracing::debug!("redis connection failed{server}: {error}");
        if !closed_without_cause(error) {
            let cause = format!("{}{server}", plain_words(error.details()));
            self.log_failure(&cause, "");
            self.set(Some(cause));
        } else if self.lock().is_none() {
            self.set(Some(format!("connection to redis lost{server}")));
        }
    }

    /// Logs `reason` at WARN unless this outage logged it already; the outage's first line also says
    /// `consequence` (what requests get meanwhile), when given.
    pub(super) fn log_failure(&self, reason: &str, consequence: &str) {
        let told = self.log().failure(reason, std::time::Instant::now());
        match (told, consequence.is_empty()) {
            (None, _) => {}
            (Some(Told::First), true) => tracing::warn!("redis failed: {reason}"),
            (Some(Told::First), false) => tracing::warn!("redis failed: {reason}; {consequence}"),
            (Some(Told::Still), _) => tracing::warn!("redis still failing: {reason}"),
        }
    }

    /// Ends the outage under way, if any, with one line.
    pub(super) fn log_recovery(&self) {
        if let Some(lasted) = self.log().recovery(std::time::Instant::now()) {
            tracing::info!("redis answers again after {lasted:.1?}: limiting is shared again");
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, OutageLog> {
        self.outage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads `maxmemory` and `maxmemory-policy`: a policy that evicts, with a memory limit, may evict tollgate's
    /// keys (all of them have an expiry, so `volatile-*` policies may too), and a limit whose state is evicted
    /// starts afresh: it over-admits. Warned once per policy seen; a Redis that refuses `CONFIG` (an ACL, a managed
    /// service) is not asked again until it reconnects.
    async fn check_eviction(&self, client: &Client) {
        let args: Vec<Value> = ["GET", "maxmemory", "maxmemory-policy"]
            .into_iter()
            .map(Value::from)
            .collect();
        let command = CustomCommand::new_static("CONFIG", None, false);
        let settings: Result<HashMap<String, String>, _> = client.custom(command, args).await;
        let settings = match settings {
            Ok(settings) => settings,
            Err(error) => {
                tracing::debug!(%error, "cannot read redis's maxmemory-policy");
                return;
            }
        };
        let policy = settings.get("maxmemory-policy").map_or("", String::as_str);
        let limited = settings.get("maxmemory").is_some_and(|m| m != "0");
        let warning = (limited && !policy.is_empty() && policy != "noeviction").then(|| {
            format!(
                "maxmemory-policy {policy}: redis may evict limit state when full, and an evicted limit starts \
                 afresh (over-admits); use noeviction"
            )
        });
        let mut eviction = self
            .eviction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if warning != *eviction {
            if let Some(warning) = &warning {
                tracing::warn!("{warning}");
            }
            *eviction = warning;
        }
    }

    pub(super) fn eviction(&self) -> Option<String> {
        self.eviction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, cause: Option<String>) {
        *self.lock() = cause;
    }

    pub(super) fn describe(&self) -> String {
        self.lock()
            .clone()
            .unwrap_or_else(|| "not connected to redis".to_owned())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // A panic elsewhere while holding it left a string: still a cause worth showing.
        self.cause
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An I/O error as fred words it (`Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }`, the
/// `Debug` of the system's error) in the system's words (`Connection refused (os error 111)`), a resolver's
/// (`Custom { kind: Uncategorized, error: "failed to lookup address information: ..." }`) in its own; others
/// unchanged.
pub fn plain_words(details: &str) -> String {
    if let Some(custom) = details.strip_prefix("Custom {") {
        if let Some(start) = custom.find("error: \"") {
            let message = custom[start + 8..]
                .trim_end()
                .trim_end_matches('}')
                .trim_end();
            return message.trim_end_matches('"').replace("\\\"", "\"");
        }
    }
    let field = |name: &str| {
        let start = details.find(name)? + name.len();
        let rest = &details[start..];
        Some(&rest[..rest.find([',', '}'])?])
    };
    match (
        details.starts_with("Os {"),
        field("message: \""),
        field("code: "),
    ) {
        (true, Some(message), Some(code)) => {
            format!(
                "{} (os error {})",
                message.trim().trim_end_matches('"'),
                code.trim()
            )
        }
        _ => details.to_owned(),
    }
}

/// Whether `error` only says that a connection closed (or that a command met a closed one), not why.
fn closed_without_cause(error: &Error) -> bool {
    match error.kind() {
        ErrorKind::Canceled => true,
        ErrorKind::IO => {
            let details = error.details().to_ascii_lowercase();
            details.contains("closed")
                || details.contains("broken pipe")
                || details.contains("reset by peer")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_that_follow_each_other_closely_are_told_once() {
        use std::time::{Duration, Instant};
        let mut log = OutageLog::default();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        // A slot on the move: a failure, a success, a failure... every few milliseconds for a second.
        let mut lines = Vec::new();
        for i in 0..100 {
            lines.extend(
                log.failure("Too many redirections.", at(i * 10))
                    .map(|t| format!("{t:?}")),
            );
            lines.extend(log.recovery(at(i * 10 + 5)).map(|_| "recovered".to_owned()));
        }
        assert_eq!(lines, ["First", "recovered"]);
        // Another reason within the quiet time is told, with its end.
        assert_eq!(log.failure("OOM", at(2_000)), Some(Told::First));
        assert_eq!(log.failure("OOM", at(2_001)), None);
        assert_eq!(log.failure("READONLY", at(2_002)), Some(Told::Still));
        assert!(log.recovery(at(2_100)).is_some());
        // Past it, a new outage with an old reason is told again.
        assert_eq!(
            log.failure("Too many redirections.", at(12_200)),
            Some(Told::First)
        );
        assert_eq!(log.recovery(at(12_300)), Some(Duration::from_millis(100)));
    }

    #[test]
    fn system_errors_are_told_in_the_systems_words() {
        assert_eq!(
            plain_words(
                r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#
            ),
            "Connection refused (os error 111)"
        );
        let wrongpass = "WRONGPASS invalid username-password pair or user is disabled.";
        assert_eq!(plain_words(wrongpass), wrongpass);
        // An unresolvable host, as `tokio::net::lookup_host` fails and fred words it.
        assert_eq!(
            plain_words(
                r#"Custom { kind: Uncategorized, error: "failed to lookup address information: Name or service not known" }"#
            ),
            "failed to lookup address information: Name or service not known"
        );
    }
}
