//! What reads a connection's client certificate (the `client_cert` key part, the `mtls` identifier) needs the HTTPS
//! listener to ask for one (`tls.client_ca`): without it nothing could ever fill it.

use super::issues::Issues;
use crate::config::raw::{KeyParts, RawConfig, RawConsumers, RawLimit};

/// Why a use of the client certificate is refused without `tls.client_ca`.
const NO_CLIENT_CA: &str = "reads the client certificate, which only the HTTPS listener with tls.client_ca (mutual TLS) asks for: set tls.client_ca, or remove it";

/// Reports, unless the file's `tls:` has a `client_ca`, each `client_cert` key part of a route's or plan's limits
/// and each `mtls` identifier, where it is written.
pub(super) fn client_cert_needs_client_ca(issues: &mut Issues, raw: &RawConfig) {
    if raw.tls.as_ref().is_some_and(|tls| tls.client_ca.is_some()) {
        return;
    }
    for (i, route) in raw.routes.iter().enumerate() {
        limits(issues, &format!("routes[{i}]"), &route.limits);
    }
    if let Some(consumers) = &raw.consumers {
        in_consumers(issues, consumers);
    }
}

/// Reports each `client_cert` key part of the plans' limits and each `mtls` identifier of `consumers:` (a block
/// read on its own, for tower layers, which no HTTPS listener serves).
pub(crate) fn in_consumers(issues: &mut Issues, raw: &RawConsumers) {
    for (i, identifier) in raw.identify.iter().enumerate() {
        if identifier.mtls.is_some() {
            issues.add(format!("consumers.identify[{i}].mtls"), NO_CLIENT_CA);
        }
    }
    for (name, plan) in &raw.plans.0 {
        limits(issues, &format!("consumers.plans.{name}"), &plan.limits);
    }
}

/// Reports each `client_cert` key part of the `limits:` at `at`.
fn limits(issues: &mut Issues, at: &str, limits: &[RawLimit]) {
    let reads_certificate = |part: &String| part.trim() == "client_cert";
    for (j, limit) in limits.iter().enumerate() {
        let at = format!("{at}.limits[{j}].key");
        match &limit.key {
            Some(KeyParts::One(part)) if reads_certificate(part) => issues.add(at, NO_CLIENT_CA),
            Some(KeyParts::List(parts)) => {
                for (k, _) in parts
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| reads_certificate(p))
                {
                    issues.add(format!("{at}[{k}]"), NO_CLIENT_CA);
                }
            }
            _ => {}
        }
    }
}
