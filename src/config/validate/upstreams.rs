//! The `upstreams:` section: each upstream's targets, timeouts, health, retries and TLS files, loaded now.

use std::num::NonZeroU32;
use std::path::Path;

use http::Uri;

use super::checks::positive_duration;
use super::issues::Issues;
use crate::config::model::*;
use crate::config::raw::*;
use crate::proxy::{HealthSettings, TlsFiles, UpstreamTls};

pub(super) fn upstreams(
    issues: &mut Issues,
    raw: &Ordered<RawUpstream>,
    folder: &Path,
) -> Vec<UpstreamSettings> {
    raw.0
        .iter()
        .filter_map(|(name, upstream)| upstream_settings(issues, name, upstream, folder))
        .collect()
}

fn upstream_settings(
    issues: &mut Issues,
    name: &str,
    raw: &RawUpstream,
    folder: &Path,
) -> Option<UpstreamSettings> {
    let at = format!("upstreams.{name}");
    if name.is_empty() {
        issues.add(&at, "an upstream needs a name");
    }
    if raw.targets.is_empty() {
        issues.add(
            format!("{at}.targets"),
            "needs at least one target (e.g. targets: [\"http://127.0.0.1:3000\"])",
        );
    }
    let targets: Vec<Uri> = raw
        .targets
        .iter()
        .enumerate()
        .filter_map(|(i, text)| issues.check(format!("{at}.targets[{i}]"), upstream_target(text)))
        .collect();
    let timeout = positive_duration(issues, &format!("{at}.timeout"), &raw.timeout);
    let connect_timeout = positive_duration(
        issues,
        &format!("{at}.connect_timeout"),
        &raw.connect_timeout,
    );
    let idle_timeout = positive_duration(issues, &format!("{at}.idle_timeout"), &raw.idle_timeout);
    let health = health(issues, &at, &raw.health);
    let attempts = attempts(issues, &at, &raw.retry);
    if name.is_empty() || targets.len() != raw.targets.len() || targets.is_empty() {
        return None;
    }
    let tls = upstream_tls(issues, &at, raw, &targets, folder)?;
    Some(UpstreamSettings {
        name: name.to_owned(),
        targets,
        timeout: timeout?,
        connect_timeout: connect_timeout?,
        pass_host_header: raw.pass_host_header,
        tls,
        health: health?,
        attempts: attempts?,
        idle_timeout: idle_timeout?,
    })
}

/// `health:`: `max_fails` may be 0 (no accounting, as in nginx); `fail_timeout` is a positive duration.
fn health(issues: &mut Issues, at: &str, raw: &RawHealth) -> Option<HealthSettings> {
    let fail_timeout = positive_duration(
        issues,
        &format!("{at}.health.fail_timeout"),
        &raw.fail_timeout,
    )?;
    Some(HealthSettings {
        max_fails: raw.max_fails,
        fail_timeout,
    })
}

/// `retry.attempts`: at least 1 (the first try), `None` when not written.
fn attempts(issues: &mut Issues, at: &str, raw: &RawRetry) -> Option<Option<NonZeroU32>> {
    match raw.attempts {
        None => Some(None),
        Some(attempts) => {
            let valid = NonZeroU32::new(attempts).map(Some).ok_or_else(|| {
                "must be at least 1 (tries in all, the first included: 1 means no retry)".to_owned()
            });
            issues.check(format!("{at}.retry.attempts"), valid)
        }
    }
}

/// The TLS settings of an upstream with `https` targets (`Ok(None)` without any), loaded now so that a missing or
/// broken certificate file is an error of the config, with its place in the file, and not of the first request.
fn upstream_tls(
    issues: &mut Issues,
    at: &str,
    raw: &RawUpstream,
    targets: &[Uri],
    folder: &Path,
) -> Option<Option<UpstreamTls>> {
    let https = targets.iter().any(|t| t.scheme_str() == Some("https"));
    let block = raw.tls.as_ref();
    if !https {
        if block.is_some() {
            issues.add(
                format!("{at}.tls"),
                "applies to https targets only, and this upstream has none",
            );
            return None;
        }
        return Some(None);
    }
    let file = |name: &Option<String>| name.as_deref().map(|n| folder.join(n));
    let files = block
        .map(|tls| TlsFiles {
            ca_file: file(&tls.ca_file),
            cert_file: file(&tls.cert_file),
            key_file: file(&tls.key_file),
        })
        .unwrap_or_default();
    let server_name = block.and_then(|tls| tls.server_name.as_deref());
    match UpstreamTls::load(files, server_name) {
        Ok(tls) => {
            let before = issues.count();
            for (i, target) in targets.iter().enumerate() {
                if target.scheme_str() == Some("https") {
                    let host = target.host().unwrap_or_default();
                    issues.check(format!("{at}.targets[{i}]"), tls.dialer(host));
                }
            }
            (issues.count() == before).then_some(Some(tls))
        }
        Err(error) => {
            // Without a tls block, a missing system trust store is a problem of the https targets.
            let path = match (block, error.field) {
                (None, _) => format!("{at}.targets"),
                (Some(_), "") => format!("{at}.tls"),
                (Some(_), field) => format!("{at}.tls.{field}"),
            };
            issues.add(path, error.message);
            None
        }
    }
}

/// `http[s]://host[:port][/base-path]`.
fn upstream_target(text: &str) -> Result<Uri, String> {
    let invalid =
        || format!("invalid upstream URL {text:?} (use http://host:port[/path] or https://...)");
    let uri: Uri = text.trim().parse().map_err(|_| invalid())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(invalid());
    }
    let authority = uri.authority().ok_or_else(invalid)?;
    // Credentials in the URL would be sent nowhere (the proxy does not turn them into headers): refuse them.
    if authority.host().is_empty() || authority.as_str().contains('@') || uri.query().is_some() {
        return Err(invalid());
    }
    Ok(uri)
}
