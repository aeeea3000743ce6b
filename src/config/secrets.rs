//! Limits keyed by where the consumers send their API keys, marked secret: their values never reach a store key.

use crate::config::model::*;
use crate::consumers::{CredentialSource, IdentifierSettings};
use crate::key::KeyPart;

/// Marks secret every limit keyed by where the consumers' API keys are sent (`key: header:x-api-key` beside
/// `api_key: { header: x-api-key }`): those values are keys to an account, never to stand in a store key or a log.
pub(crate) fn secret_api_keys(
    routes: &mut [RouteSettings],
    consumers: Option<&mut ConsumersSettings>,
) {
    let Some(consumers) = consumers else {
        return;
    };
    let sources = credential_sources(consumers);
    let plan_limits = consumers
        .plans
        .iter_mut()
        .flat_map(|plan| plan.limits.iter_mut());
    let route_limits = routes.iter_mut().flat_map(|route| route.limits.iter_mut());
    mark_secret(plan_limits.chain(route_limits), &sources);
}

/// [`secret_api_keys`] for limits outside a config: the tower layer's own, beside `consumers`.
#[cfg(feature = "layer")]
pub(crate) fn mark_credential_keys<'a>(
    limits: impl Iterator<Item = &'a mut LimitSettings>,
    consumers: &ConsumersSettings,
) {
    mark_secret(limits, &credential_sources(consumers));
}

/// Where the consumers' API-key identifiers read keys.
fn credential_sources(consumers: &ConsumersSettings) -> Vec<CredentialSource> {
    consumers
        .identify
        .iter()
        .filter_map(|identifier| match identifier {
            IdentifierSettings::ApiKey { source, .. } => Some(source.clone()),
            #[cfg(feature = "jwt")]
            IdentifierSettings::Jwt { .. } => None,
            IdentifierSettings::Mtls { .. } => None,
        })
        .collect()
}

/// Marks secret each of `limits` with a key part read from one of `sources`.
fn mark_secret<'a>(
    limits: impl Iterator<Item = &'a mut LimitSettings>,
    sources: &[CredentialSource],
) {
    let carries_a_key = |part: &KeyPart| {
        sources.iter().any(|source| match (source, part) {
            (CredentialSource::Header(header), KeyPart::Header(name)) => header == name,
            (CredentialSource::Query(query), KeyPart::Query(name)) => query
                .trim_end_matches("[]")
                .eq_ignore_ascii_case(name.trim_end_matches("[]")),
            _ => false,
        })
    };
    for settings in limits {
        if settings.key.parts().iter().any(carries_a_key) {
            settings.key = settings.key.clone().secret(true);
        }
    }
}
