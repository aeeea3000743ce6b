//! The `admin:` section: the admin listener, its token, the degraded readiness status.

use super::checks::socket_addr;
use super::issues::Issues;
use crate::config::model::*;
use crate::config::raw::*;

pub(super) fn admin(issues: &mut Issues, raw: &RawAdmin) -> Option<AdminSettings> {
    let listen = socket_addr(issues, "admin.listen", &raw.listen)?;
    let token = raw.token.clone().filter(|t| !t.is_empty());
    // A client's `Authorization` header cannot carry them (its value is trimmed), so such a token never matches:
    // usually a newline from a secret file or an environment variable.
    if token.as_deref().is_some_and(|t| t.trim() != t) {
        issues.add(
            "admin.token",
            "has leading or trailing whitespace, which no client can send: remove it",
        );
        return None;
    }
    // The admin API can reset limits: reachable from other hosts, it must not be open to them.
    if token.is_none() && !listen.ip().is_loopback() {
        issues.add(
            "admin.token",
            "required when admin.listen is not a loopback address",
        );
        return None;
    }
    let status = u16::try_from(raw.readyz_degraded_status)
        .ok()
        .filter(|s| (200..=599).contains(s))
        .ok_or_else(|| {
            format!(
                "must be an HTTP status from 200 to 599 (got {}): 200 keeps the instance in rotation, 503 takes it out",
                raw.readyz_degraded_status
            )
        });
    let readyz_degraded_status = issues.check("admin.readyz_degraded_status", status)?;
    Some(AdminSettings {
        listen,
        token,
        readyz_degraded_status,
    })
}
