//! `telemetry:`, where the gateway sends its traces: an OpenTelemetry collector's address, the service name its
//! spans carry, and the share of new traces kept.

use std::path::Path;

use serde::Deserialize;

use super::raw::scalar_text;
use super::validate::Issues;
use crate::config::{OtlpProtocol, OtlpSettings, TelemetrySettings};
use crate::proxy::trusted_roots;

/// `telemetry:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawTelemetry {
    pub otlp: Option<RawOtlp>,
}

/// `telemetry.otlp:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOtlp {
    pub endpoint: String,
    #[serde(default = "default_service_name", deserialize_with = "scalar_text")]
    pub service_name: String,
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    pub ca_file: Option<String>,
}

fn default_service_name() -> String {
    "tollgate".to_owned()
}

fn default_sample_ratio() -> f64 {
    1.0
}

/// `telemetry:` validated.
/// `telemetry:` validated, its `ca_file` resolved against `folder` and read.
pub(crate) fn telemetry(
    issues: &mut Issues,
    raw: &RawTelemetry,
    folder: &Path,
) -> TelemetrySettings {
    TelemetrySettings {
        otlp: raw
            .otlp
            .as_ref()
            .and_then(|otlp| self::otlp(issues, otlp, folder)),
    }
}

fn otlp(issues: &mut Issues, raw: &RawOtlp, folder: &Path) -> Option<OtlpSettings> {
    let before = issues.count();
    let endpoint = match raw.endpoint.parse::<http::Uri>() {
        Ok(uri)
            if uri.authority().is_some()
                && matches!(uri.scheme_str(), Some("http" | "https" | "grpc" | "grpcs")) =>
        {
            Some(uri)
        }
        _ => {
            issues.add(
                "telemetry.otlp.endpoint",
                format_args!(
                    "not an OTLP address (http://HOST:PORT or https:// for OTLP/HTTP, grpc://HOST:PORT or grpcs:// \
                     for OTLP/gRPC): {:?}",
                    raw.endpoint
                ),
            );
            None
        }
    };
    let over_tls = endpoint
        .as_ref()
        .is_some_and(|uri| matches!(uri.scheme_str(), Some("https" | "grpcs")));
    let ca_file = raw.ca_file.as_ref().map(|file| folder.join(file));
    if ca_file.is_some() && endpoint.is_some() && !over_tls {
        issues.add(
            "telemetry.otlp.ca_file",
            "trusts a TLS collector's certificate: the endpoint must be https:// or grpcs://",
        );
    } else if over_tls {
        // Read now, so that an unreadable file or a system without roots is a located error, not a silent export
        // failure later.
        if let Err(error) = trusted_roots(ca_file.as_deref()) {
            issues.add("telemetry.otlp.ca_file", error.message);
        }
    }
    if raw.service_name.trim().is_empty() {
        issues.add("telemetry.otlp.service_name", "must not be empty");
    }
    if !(0.0..=1.0).contains(&raw.sample_ratio) {
        issues.add(
            "telemetry.otlp.sample_ratio",
            format_args!("must be between 0 and 1 (got {})", raw.sample_ratio),
        );
    }
    if issues.count() != before {
        return None;
    }
    let endpoint = endpoint?;
    let (endpoint, protocol) = match endpoint.scheme_str() {
        Some("grpc" | "grpcs") => (grpc_address(endpoint, over_tls), OtlpProtocol::Grpc),
        _ => (traces_address(endpoint), OtlpProtocol::Http),
    };
    Some(OtlpSettings {
        endpoint,
        ca_file,
        protocol,
        service_name: raw.service_name.trim().to_owned(),
        sample_ratio: raw.sample_ratio,
    })
}

/// Where the spans are posted: the endpoint's own path when it names one, else OTLP/HTTP's `/v1/traces`, as an
/// OpenTelemetry SDK reads a base endpoint.
fn traces_address(endpoint: http::Uri) -> http::Uri {
    if endpoint.path() != "/" {
        return endpoint;
    }
    let mut parts = endpoint.into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/v1/traces"));
    http::Uri::from_parts(parts)
        .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1:4318/v1/traces"))
}

/// The `http://` (over TLS: `https://`) origin a gRPC endpoint's calls go to (the method's path is the call's
/// own).
fn grpc_address(endpoint: http::Uri, over_tls: bool) -> http::Uri {
    let mut parts = endpoint.into_parts();
    parts.scheme = Some(if over_tls {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    });
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    http::Uri::from_parts(parts)
        .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1:4317/"))
}
