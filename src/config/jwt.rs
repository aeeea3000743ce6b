//! `jwt:` identifiers of `consumers.identify`: their algorithms, keys and consumer ids, checked where they are written.

use std::path::Path;
use std::time::Duration;

use http::Uri;
use jsonwebtoken::Algorithm;

use super::consumers::{check_consumer_prefix, header_name};
use super::raw::RawJwt;
use super::validate::Issues;
use crate::consumers::jwt::{JwtKeySource, JwtSettings, JwtVerifier, DEFAULT_JWKS_REFRESH};
use crate::consumers::IdentifierSettings;
use crate::limiter::parse_duration;

/// `jwt:` of `identify:`. A `jwks_file` is read here, so that a missing or unusable one is a located error that
/// stops the start or the reload; a `jwks_url` is only fetched once the gateway runs (start in any order).
pub(super) fn jwt_settings(
    issues: &mut Issues,
    at: &str,
    raw: &RawJwt,
    folder: &Path,
) -> Option<JwtSettings> {
    let before = issues.count();
    let header = match &raw.header {
        Some(name) => header_name(issues, &format!("{at}.header"), Some(name)),
        None => Some(http::header::AUTHORIZATION),
    };
    let algorithms = jwt_algorithms(issues, at, &raw.algorithms);
    let keys = jwt_keys(issues, at, raw, folder);
    keys_fit_algorithms(issues, at, keys.as_ref(), &algorithms);
    let leeway = match &raw.leeway {
        Some(text) => issues.check(format!("{at}.leeway"), parse_duration(text)),
        None => Some(Duration::ZERO),
    };
    let consumer_claim = raw
        .consumer_claim
        .clone()
        .unwrap_or_else(|| "sub".to_owned());
    if consumer_claim.is_empty() {
        issues.add(format!("{at}.consumer_claim"), "names a claim: not empty");
    }
    if issues.count() != before {
        return None;
    }
    let mut settings = JwtSettings::new(algorithms, keys?);
    settings.header = header?;
    settings.issuer = raw.issuer.clone();
    settings.audiences = raw.audiences.clone();
    settings.leeway = leeway?;
    settings.consumer_claim = consumer_claim;
    settings.plan_claim = raw.plan_claim.clone();
    settings.consumer_prefix = raw.consumer_prefix.clone();
    if !consumer_prefix(issues, at, &settings) {
        return None;
    }
    // As the gateway will build it (a JWKS file read, a URL's scheme and roots, a secret's length), without fetching.
    if let Err(error) = JwtVerifier::check(&settings) {
        let field = match settings.keys {
            JwtKeySource::File(_) => "jwks_file",
            JwtKeySource::Url { .. } => "jwks_url",
            JwtKeySource::Secret(_) => "secret_env",
        };
        // The error names its field first, as the location does already.
        let text = error.to_string();
        let text = text.strip_prefix(&format!("{field} ")).unwrap_or(&text);
        issues.add(format!("{at}.{field}"), text);
        return None;
    }
    Some(settings)
}

/// `algorithms`: the signatures a token may carry, by their JOSE names.
fn jwt_algorithms(issues: &mut Issues, at: &str, names: &[String]) -> Vec<Algorithm> {
    if names.is_empty() {
        issues.add(
            format!("{at}.algorithms"),
            "needs at least one of RS256, ES256, EdDSA, HS256",
        );
    }
    names
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let algorithm = match name.as_str() {
                "RS256" => Some(Algorithm::RS256),
                "ES256" => Some(Algorithm::ES256),
                "EdDSA" => Some(Algorithm::EdDSA),
                "HS256" => Some(Algorithm::HS256),
                _ => None,
            };
            if algorithm.is_none() {
                issues.add(
                    format!("{at}.algorithms[{i}]"),
                    format_args!("unsupported algorithm {name:?} (use RS256, ES256, EdDSA, HS256)"),
                );
            }
            algorithm
        })
        .collect()
}

/// The keys and the algorithms go together: a shared secret verifies HS256 alone, a JWKS the public-key algorithms
/// alone.
fn keys_fit_algorithms(
    issues: &mut Issues,
    at: &str,
    keys: Option<&JwtKeySource>,
    algorithms: &[Algorithm],
) {
    // A shared secret and public keys in one identifier would let a token signed with the public key as an HMAC
    // secret through: HS256 goes with `secret_env` and only there.
    let hs256 = algorithms.contains(&Algorithm::HS256);
    match (keys, hs256) {
        (Some(JwtKeySource::Secret(_)), _) if algorithms.iter().any(|a| *a != Algorithm::HS256) => {
            issues.add(
                format!("{at}.algorithms"),
                "a secret_env verifies HS256 only",
            );
        }
        (Some(JwtKeySource::File(_) | JwtKeySource::Url { .. }), true) => {
            issues.add(
                format!("{at}.algorithms"),
                "HS256 needs secret_env; keys from a JWKS verify RS256, ES256 and EdDSA",
            );
        }
        _ => {}
    }
}

/// Two `jwt:` identifiers whose consumers would share ids by default (issuers that read alike) are an issue at the
/// second's `issuer`: joining them takes the same `consumer_prefix` written in both.
pub(super) fn shared_prefixes(issues: &mut Issues, identify: &[IdentifierSettings]) {
    let mut seen: Vec<(String, bool)> = Vec::new();
    for (i, identifier) in identify.iter().enumerate() {
        let IdentifierSettings::Jwt { settings, .. } = identifier else {
            continue;
        };
        let prefix = settings.consumer_prefix();
        let written = settings.consumer_prefix.is_some();
        if seen.iter().any(|(p, w)| *p == prefix && !(*w && written)) {
            issues.add(
                format!("consumers.identify[{i}].jwt.issuer"),
                format_args!(
                    "another jwt identifier's consumer ids also begin with {prefix:?}: set consumer_prefix (the same in both joins them)"
                ),
            );
        }
        seen.push((prefix, written));
    }
}

/// Whether the consumer ids' prefix of a `jwt:` identifier (`consumer_prefix`, or the one its issuer gives) can
/// begin consumer ids; an issue at the field it comes from when not.
fn consumer_prefix(issues: &mut Issues, at: &str, settings: &JwtSettings) -> bool {
    let (field, advice) = match settings.consumer_prefix {
        Some(_) => ("consumer_prefix", ""),
        None => ("issuer", " (set a shorter consumer_prefix)"),
    };
    check_consumer_prefix(
        issues,
        &format!("{at}.{field}"),
        &settings.consumer_prefix(),
        advice,
    )
}

/// Where a `jwt:` identifier's keys come from: exactly one of `jwks_file`, `jwks_url` and `secret_env`.
fn jwt_keys(issues: &mut Issues, at: &str, raw: &RawJwt, folder: &Path) -> Option<JwtKeySource> {
    match (&raw.jwks_file, &raw.jwks_url, &raw.secret_env) {
        (Some(file), None, None) => Some(JwtKeySource::File(folder.join(file))),
        (None, Some(url), None) => {
            let refresh = match &raw.jwks_refresh {
                Some(text) => {
                    let refresh =
                        issues.check(format!("{at}.jwks_refresh"), parse_duration(text))?;
                    if refresh.is_zero() {
                        issues.add(format!("{at}.jwks_refresh"), "must be greater than 0");
                        return None;
                    }
                    refresh
                }
                None => DEFAULT_JWKS_REFRESH,
            };
            let parsed = url.parse::<Uri>().ok().filter(|uri| {
                matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some()
            });
            match parsed {
                Some(url) => Some(JwtKeySource::Url { url, refresh }),
                None => {
                    issues.add(
                        format!("{at}.jwks_url"),
                        format_args!("invalid URL {url:?} (use http://host/path or https://...)"),
                    );
                    None
                }
            }
        }
        (None, None, Some(variable)) => match std::env::var(variable) {
            // RFC 7518 §3.2: an HS256 key is at least as long as the hash, 32 bytes.
            Ok(secret) if secret.len() >= 32 => Some(JwtKeySource::Secret(secret.into_bytes())),
            Ok(secret) if !secret.is_empty() => {
                issues.add(
                    format!("{at}.secret_env"),
                    format_args!(
                        "the secret in {variable} is {} bytes; HS256 needs at least 32 (RFC 7518 §3.2)",
                        secret.len()
                    ),
                );
                None
            }
            _ => {
                issues.add(
                    format!("{at}.secret_env"),
                    format_args!("the environment variable {variable} is not set or empty"),
                );
                None
            }
        },
        _ => {
            issues.add(
                at,
                "takes exactly one of jwks_file, jwks_url and secret_env",
            );
            None
        }
    }
}
