//! The `server:` section: the listener's timeouts, size limits, health path and shutdown.

use super::checks::{duration, positive_count, positive_duration};
use super::issues::Issues;
use crate::config::model::*;
use crate::config::raw::*;

pub(super) fn server(issues: &mut Issues, raw: &RawServer) -> Option<ServerSettings> {
    let header_read_timeout = positive_duration(
        issues,
        "server.header_read_timeout",
        &raw.header_read_timeout,
    );
    let keepalive_timeout =
        positive_duration(issues, "server.keepalive_timeout", &raw.keepalive_timeout);
    let body_read_timeout =
        positive_duration(issues, "server.body_read_timeout", &raw.body_read_timeout);
    let max_header_bytes = positive_count(issues, "server.max_header_bytes", raw.max_header_bytes);
    let health_path = raw.health_path.as_deref().map(str::trim);
    if health_path.is_some_and(|path| !path.starts_with('/') || path.contains(['?', '#', ' '])) {
        issues.add(
            "server.health_path",
            "must be a path starting with / (e.g. /healthz), without query",
        );
    }
    let max_body_bytes = match raw.max_body_bytes {
        Some(0) => {
            issues.add(
                "server.max_body_bytes",
                "must be greater than 0 (omit it for no limit)",
            );
            None
        }
        other => other,
    };
    // Zero grace is legitimate: stop at once.
    let shutdown_grace = duration(issues, "server.shutdown_grace", &raw.shutdown_grace);
    // Zero too: readiness fails and the listener closes at once.
    let shutdown_delay = duration(issues, "server.shutdown_delay", &raw.shutdown_delay);
    Some(ServerSettings {
        header_read_timeout: header_read_timeout?,
        keepalive_timeout: keepalive_timeout?,
        body_read_timeout: body_read_timeout?,
        health_path: health_path.map(str::to_owned),
        max_body_bytes,
        max_header_bytes: max_header_bytes?,
        shutdown_grace: shutdown_grace?,
        shutdown_delay: shutdown_delay?,
        underscores_in_headers: raw.underscores_in_headers,
        keep_escaped_slashes: raw.escaped_slashes == RawEscapedSlashes::Keep,
    })
}
