//! The `consumers:` block: identifiers, static keys, the anonymous policy, forwarded headers and plans.

use http::HeaderName;
use std::path::Path;

use super::limits::limit_list;
use super::raw::{
    RawAnonymous, RawConsumers, RawCredentialSource, RawFailedCredentials, RawIdentifier, RawMtls,
    RawPlan, RawStaticKey,
};
use super::validate::{check_name, Issues};
use crate::consumers::{
    api_key_digest, consumer_id, parse_digest, Anonymous, ConsumersSettings, CredentialSource,
    FailureLimit, FailureSettings, ForwardHeaders, IdentifierSettings, Plan, StaticKey,
    DEFAULT_MTLS_PREFIX,
};
use crate::limiter::parse_duration;

/// The longest prefix of an identifier's consumer ids: half an id, so that a name of 64 characters fits.
const MAX_CONSUMER_PREFIX: usize = 64;

/// Whether `prefix`, written at `at`, can begin an identifier's consumer ids; an issue there (with `advice` after
/// a length over the bound) when not.
pub(super) fn check_consumer_prefix(
    issues: &mut Issues,
    at: &str,
    prefix: &str,
    advice: &str,
) -> bool {
    if !prefix.chars().all(crate::consumers::consumer_id_char) {
        issues.add(
            at,
            format_args!(
                "consumer ids begin with {prefix:?}: only A-Z a-z 0-9 . _ : @ - may stand in one"
            ),
        );
        return false;
    }
    if prefix.len() > MAX_CONSUMER_PREFIX {
        issues.add(
            at,
            format_args!(
                "consumer ids would begin with {prefix:?}, {} characters: at most {MAX_CONSUMER_PREFIX}{advice}",
                prefix.len()
            ),
        );
        return false;
    }
    true
}

/// Validates `consumers:`; relative file names (`jwks_file`) are relative to `folder`.
pub(crate) fn consumers(
    issues: &mut Issues,
    raw: &RawConsumers,
    folder: &Path,
) -> Option<ConsumersSettings> {
    let before = issues.count();
    let plans = plans(issues, raw);
    let plan_exists = |name: &str| raw.plans.0.iter().any(|(plan, _)| plan == name);
    let identify: Vec<IdentifierSettings> = raw
        .identify
        .iter()
        .enumerate()
        .filter_map(|(i, entry)| {
            identifier(
                issues,
                &format!("consumers.identify[{i}]"),
                entry,
                folder,
                &plan_exists,
            )
        })
        .collect();
    #[cfg(feature = "jwt")]
    super::jwt::shared_prefixes(issues, &identify);
    let mut keys: Vec<StaticKey> = Vec::with_capacity(raw.keys.len());
    for (i, raw_key) in raw.keys.iter().enumerate() {
        let at = format!("consumers.keys[{i}]");
        let Some(key) = static_key(issues, &at, raw_key, &plan_exists) else {
            continue;
        };
        if keys.iter().any(|earlier| earlier.digest == key.digest) {
            issues.add(format!("{at}.key"), "the same key is listed twice");
        }
        keys.push(key);
    }
    if !raw.keys.is_empty() && !raw.identify.iter().any(|entry| entry.api_key.is_some()) {
        issues.add(
            "consumers.keys",
            "keys are listed but no `api_key` identifier reads them (add `- api_key: { header: x-api-key }` to identify)",
        );
    }
    let anonymous = anonymous(issues, raw.anonymous.as_ref(), &plan_exists);
    let forward = ForwardHeaders {
        consumer: header_name(
            issues,
            "consumers.forward.consumer",
            raw.forward.consumer.as_deref(),
        ),
        plan: header_name(
            issues,
            "consumers.forward.plan",
            raw.forward.plan.as_deref(),
        ),
    };
    let failed_credentials = raw
        .failed_credentials
        .as_ref()
        .and_then(|failures| failed_credentials(issues, failures));
    let cache = raw.cache.and_then(|cache| match usize::try_from(cache) {
        Ok(cache) if (1..=MAX_CACHE).contains(&cache) => Some(cache),
        _ => {
            issues.add(
                "consumers.cache",
                format_args!("{cache} is not a number of consumers from 1 to {MAX_CACHE}"),
            );
            None
        }
    });
    if issues.count() != before {
        return None;
    }
    Some(ConsumersSettings {
        identify,
        keys,
        anonymous,
        forward,
        plans,
        failed_credentials,
        cache,
    })
}

/// The largest `consumers.cache`: a hundred million consumers, far more than memory holds.
const MAX_CACHE: usize = 100_000_000;

/// `consumers.anonymous`: what a caller without a credential gets (no plan, a plan named in `plans`, or 401).
fn anonymous(
    issues: &mut Issues,
    anonymous: Option<&RawAnonymous>,
    plan_exists: &impl Fn(&str) -> bool,
) -> Anonymous {
    match anonymous {
        None => Anonymous::NoPlan,
        Some(RawAnonymous::Word(word)) if word == "reject" => Anonymous::Reject,
        Some(RawAnonymous::Word(word)) => {
            issues.add(
                "consumers.anonymous",
                format_args!("{word:?} is not `reject` or `{{ plan: NAME }}`"),
            );
            Anonymous::NoPlan
        }
        Some(RawAnonymous::Plan(plan)) if plan_exists(&plan.plan) => {
            Anonymous::Plan(plan.plan.clone())
        }
        Some(RawAnonymous::Plan(plan)) => {
            issues.add(
                "consumers.anonymous.plan",
                format_args!("unknown plan {:?}", plan.plan),
            );
            Anonymous::NoPlan
        }
    }
}

/// `consumers.failed_credentials`: how many wrong credentials an address may send in a period before its
/// credentials are refused unchecked.
fn failed_credentials(
    issues: &mut Issues,
    failures: &RawFailedCredentials,
) -> Option<FailureSettings> {
    let at = "consumers.failed_credentials";
    if failures.limit == 0 {
        issues.add(format!("{at}.limit"), "must be greater than 0");
    }
    let period_ms = issues.check(format!("{at}.period"), parse_duration(&failures.period));
    let period_ms = period_ms.map(|p| u64::try_from(p.as_millis()).unwrap_or(u64::MAX));
    match period_ms {
        Some(0) => {
            issues.add(format!("{at}.period"), "must be greater than 0");
            None
        }
        Some(period_ms) if failures.limit > 0 => {
            let settings = FailureSettings {
                limit: failures.limit,
                period_ms,
            };
            // Built once here as the gateway will build it, so that a bound it breaks is a located error.
            issues.check(at, FailureLimit::new(settings, "").map(|_| settings))
        }
        _ => None,
    }
}

// A `jwt:` identifier's files are read relative to `folder`.
#[cfg_attr(not(feature = "jwt"), allow(unused_variables))]
fn identifier(
    issues: &mut Issues,
    at: &str,
    raw: &RawIdentifier,
    folder: &Path,
    plan_exists: &dyn Fn(&str) -> bool,
) -> Option<IdentifierSettings> {
    match (&raw.api_key, &raw.jwt, &raw.mtls) {
        (None, None, Some(mtls)) => mtls_settings(issues, &format!("{at}.mtls"), mtls, plan_exists),
        (Some(source), None, None) => credential_source(issues, &format!("{at}.api_key"), source)
            .map(|credential| IdentifierSettings::ApiKey {
                source: credential,
                hide_credentials: source.hide_credentials,
            }),
        #[cfg(feature = "jwt")]
        (None, Some(jwt), None) => {
            super::jwt::jwt_settings(issues, &format!("{at}.jwt"), jwt, folder).map(|settings| {
                IdentifierSettings::Jwt {
                    settings: Box::new(settings),
                    hide_credentials: jwt.hide_credentials,
                }
            })
        }
        #[cfg(not(feature = "jwt"))]
        (None, Some(_), None) => {
            issues.add(
                format!("{at}.jwt"),
                "this build of tollgate has no JWT consumers (its `jwt` feature is off)",
            );
            None
        }
        _ => {
            issues.add(
                at,
                "an identifier is exactly one of `api_key`, `jwt` and `mtls`",
            );
            None
        }
    }
}

/// `mtls:` of `identify:`: the consumer ids' prefix (`mtls:` unless written) and the plan it gives, if any. That the
/// HTTPS listener asks for client certificates (`tls.client_ca`) is checked with the whole file.
fn mtls_settings(
    issues: &mut Issues,
    at: &str,
    raw: &RawMtls,
    plan_exists: &dyn Fn(&str) -> bool,
) -> Option<IdentifierSettings> {
    let consumer_prefix = raw
        .consumer_prefix
        .clone()
        .unwrap_or_else(|| DEFAULT_MTLS_PREFIX.to_owned());
    let fits = check_consumer_prefix(
        issues,
        &format!("{at}.consumer_prefix"),
        &consumer_prefix,
        "",
    );
    if let Some(plan) = raw.plan.as_deref().filter(|plan| !plan_exists(plan)) {
        issues.add(format!("{at}.plan"), format_args!("unknown plan {plan:?}"));
        return None;
    }
    fits.then(|| IdentifierSettings::Mtls {
        consumer_prefix,
        plan: raw.plan.clone(),
    })
}

fn credential_source(
    issues: &mut Issues,
    at: &str,
    raw: &RawCredentialSource,
) -> Option<CredentialSource> {
    match (&raw.header, &raw.query) {
        (Some(header), None) => {
            header_name(issues, &format!("{at}.header"), Some(header)).map(CredentialSource::Header)
        }
        (None, Some(query)) if !query.is_empty() => Some(CredentialSource::Query(query.clone())),
        _ => {
            issues.add(
                at,
                "an API key is read from exactly one of `header` and `query`",
            );
            None
        }
    }
}

fn static_key(
    issues: &mut Issues,
    at: &str,
    raw: &RawStaticKey,
    plan_exists: &dyn Fn(&str) -> bool,
) -> Option<StaticKey> {
    let before = issues.count();
    let digest = if raw.key.starts_with("sha256:") {
        let digest = parse_digest(&raw.key);
        if digest.is_none() {
            issues.add(
                format!("{at}.key"),
                "a digest is `sha256:` and 64 hex digits",
            );
        }
        digest
    } else if raw.key.trim().is_empty() || raw.key.trim() != raw.key {
        issues.add(
            format!("{at}.key"),
            "a key is not empty and has no surrounding whitespace",
        );
        None
    } else {
        Some(api_key_digest(&raw.key))
    };
    check_consumer_id(issues, &format!("{at}.consumer"), &raw.consumer);
    if let Some(plan) = raw.plan.as_deref().filter(|plan| !plan_exists(plan)) {
        issues.add(format!("{at}.plan"), format_args!("unknown plan {plan:?}"));
    }
    if issues.count() != before {
        return None;
    }
    Some(StaticKey {
        digest: digest?,
        consumer: raw.consumer.clone(),
        plan: raw.plan.clone(),
    })
}

/// Consumer ids go into store keys, headers and log lines: 1 to 128 of `A-Z a-z 0-9 . _ : @ -`.
pub(crate) fn check_consumer_id(issues: &mut Issues, at: &str, id: &str) {
    if let Err(message) = consumer_id(id) {
        issues.add(at, message);
    }
}

pub(super) fn header_name(issues: &mut Issues, at: &str, name: Option<&str>) -> Option<HeaderName> {
    let name = name?;
    issues.check(
        at,
        HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("invalid header name {name:?}")),
    )
}

fn plans(issues: &mut Issues, raw: &RawConsumers) -> Vec<Plan> {
    let plans: Vec<Plan> = raw
        .plans
        .0
        .iter()
        .filter_map(|(name, plan)| plan_settings(issues, name, plan))
        .collect();
    // Plans share a limit's keys by its name (`<prefix>consumer:<limit>:{<consumer>}`), so that an upgraded
    // consumer keeps what it used: the state under one name must be one algorithm's.
    for (i, plan) in plans.iter().enumerate() {
        for (j, settings) in plan.limits.iter().enumerate() {
            let earlier = plans[..i]
                .iter()
                .flat_map(|other| other.limits.iter().map(move |l| (other, l)))
                .find(|(_, l)| l.limit.name() == settings.limit.name());
            if let Some((other, limit)) = earlier {
                let (ours, theirs) = (
                    settings.limit.algorithm().name(),
                    limit.limit.algorithm().name(),
                );
                if ours != theirs {
                    issues.add(
                        format!("consumers.plans.{}.limits[{j}].algorithm", plan.name),
                        format_args!(
                            "limit {:?} is {theirs} in plan {:?}: limits of one name share a consumer's state, so they must use one algorithm (or take another name)",
                            settings.limit.name(),
                            other.name
                        ),
                    );
                }
            }
        }
    }
    plans
}

fn plan_settings(issues: &mut Issues, name: &str, raw: &RawPlan) -> Option<Plan> {
    let at = format!("consumers.plans.{name}");
    let before = issues.count();
    check_name(issues, &at, "plan", name);
    let limits = limit_list(issues, &at, &raw.limits);
    (issues.count() == before).then(|| Plan {
        name: name.to_owned(),
        limits,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::parse;
    use crate::consumers::{Anonymous, ConsumerMode};

    const ROUTE: &str =
        "routes:\n  - name: api\n    match: { path_prefix: / }\n    respond: { status: 200 }\n";

    fn problems(yaml: &str) -> Vec<String> {
        match parse(yaml, Path::new("t.yaml")) {
            Ok(_) => Vec::new(),
            Err(error) => error.problems().iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_consumers_block_compiles_into_plans_keys_and_route_modes() {
        let yaml = format!(
            r#"consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  keys:
    - {{ key: k1, consumer: acme, plan: pro }}
  anonymous: reject
  plans:
    pro:
      limits:
        - {{ name: hourly, key: consumer, algorithm: gcra, rate: 100/1h, burst: 10 }}
{ROUTE}"#
        );
        let config = parse(&yaml, Path::new("t.yaml")).expect("valid");
        let consumers = config.consumers.expect("block");
        assert_eq!(consumers.anonymous, Anonymous::Reject);
        assert_eq!(consumers.plans[0].name, "pro");
        assert_eq!(consumers.plans[0].limits[0].key.to_string(), "consumer");
        assert_eq!(
            consumers.keys[0].digest,
            crate::consumers::api_key_digest("k1")
        );
        assert_eq!(config.routes[0].consumers, ConsumerMode::Optional);
    }

    #[test]
    fn mistakes_are_located_and_named() {
        let yaml = format!(
            r#"consumers:
  identify:
    - api_key: {{ header: x-api-key, query: api_key }}
    - {{}}
  keys:
    - {{ key: "sha256:12", consumer: acme }}
    - {{ key: k1, consumer: "a b", plan: gold }}
    - {{ key: k2, consumer: bob }}
    - {{ key: k2, consumer: eve }}
  anonymous: {{ plan: nobody }}
  forward: {{ consumer: "bad header" }}
  plans:
    free:
      limits:
        - {{ name: hourly, key: consumer, algorithm: gcra, rate: 1/s, burst: 1 }}
    team:
      limits:
        - {{ name: daily, key: consumer, algorithm: gcra, rate: 1/s, burst: 1 }}
        - {{ name: daily, key: consumer, algorithm: gcra, rate: 1/s, burst: 1 }}
    pro:
      limits:
        - {{ name: hourly, key: consumer, algorithm: fixed_window, limit: 5, period: 1h }}
{ROUTE}  - name: consumer
    match: {{ path_prefix: /c }}
    respond: {{ status: 200 }}
    consumers: sometimes
"#
        );
        let expected = [
            "t.yaml:3:7: consumers.identify[0].api_key: an API key is read from exactly one of `header` and `query`",
            "t.yaml:4:7: consumers.identify[1]: an identifier is exactly one of `api_key`, `jwt` and `mtls`",
            "consumers.keys[0].key: a digest is `sha256:` and 64 hex digits",
            "consumers.keys[1].consumer: invalid consumer id \"a b\"",
            "consumers.keys[1].plan: unknown plan \"gold\"",
            "consumers.keys[3].key: the same key is listed twice",
            "consumers.anonymous.plan: unknown plan \"nobody\"",
            "consumers.forward.consumer: invalid header name \"bad header\"",
            "consumers.plans.team.limits[1].name: duplicate limit name \"daily\"",
            "consumers.plans.pro.limits[0].algorithm: limit \"hourly\" is gcra in plan \"free\"",
        ];
        // `consumers: sometimes` is a serde error, reported alone before validation: checked below.
        let found = problems(&yaml.replace("    consumers: sometimes\n", ""));
        let joined = found.join("\n");
        for text in expected {
            assert!(joined.contains(text), "missing {text:?} in\n{joined}");
        }
        assert!(
            joined.contains("routes[1].name: the route name \"consumer\" is taken"),
            "{joined}"
        );
        let failures = problems(&format!(
            "consumers:\n  failed_credentials: {{ limit: 0, period: 0s }}\n{ROUTE}"
        ))
        .join("\n");
        assert!(
            failures.contains("consumers.failed_credentials.limit: must be greater than 0")
                && failures.contains("consumers.failed_credentials.period: must be greater than 0"),
            "{failures}"
        );
        // A cache of consumers is for a directory in Redis, and holds at least one.
        let cache = |store: &str, cache: &str| {
            problems(&format!(
                "{store}consumers:\n  cache: {cache}\n  identify: [ {{ api_key: {{ header: x-api-key }} }} ]\n{ROUTE}"
            ))
            .join("\n")
        };
        let redis = "store: { backend: redis, url: \"redis://127.0.0.1:6379\" }\n";
        assert_eq!(cache(redis, "1000"), "");
        assert!(
            cache("", "1000")
                .contains("t.yaml:2:3: consumers.cache: only with store.backend: redis"),
            "{}",
            cache("", "1000")
        );
        assert!(
            cache(redis, "0").contains("consumers.cache: 0 is not a number of consumers from 1 to"),
            "{}",
            cache(redis, "0")
        );
        let bad_mode = problems(&format!("{ROUTE}    consumers: sometimes\n"));
        assert!(bad_mode[0].contains("routes[0].consumers"), "{bad_mode:?}");
        let no_block = problems(&format!("{ROUTE}    consumers: required\n"));
        assert!(
            no_block[0].ends_with("routes[0].consumers: needs a top-level consumers: block saying how requests name their consumer"),
            "{no_block:?}"
        );
    }

    #[test]
    #[cfg(feature = "jwt")]
    fn jwt_identifiers_are_checked_where_they_are_written() {
        let yaml = format!(
            r#"consumers:
  identify:
    - jwt: {{ algorithms: [] , jwks_file: nowhere.json }}
    - jwt: {{ algorithms: [RS512], jwks_url: "ftp://x" }}
    - jwt: {{ algorithms: [RS256, HS256], jwks_url: "https://idp.example/jwks" }}
    - jwt: {{ algorithms: [HS256], secret_env: TOLLGATE_TEST_UNSET_SECRET }}
    - jwt: {{ algorithms: [RS256], jwks_url: "https://idp.example/jwks", secret_env: S }}
    - jwt: {{ algorithms: [ES256], jwks_url: "https://idp.example/jwks", leeway: soon }}
{ROUTE}"#
        );
        let found = problems(&yaml).join("\n");
        for text in [
            "consumers.identify[0].jwt.algorithms: needs at least one of RS256, ES256, EdDSA, HS256",
            "consumers.identify[1].jwt.algorithms[0]: unsupported algorithm \"RS512\"",
            "consumers.identify[1].jwt.jwks_url: invalid URL \"ftp://x\"",
            "consumers.identify[2].jwt.algorithms: HS256 needs secret_env",
            "consumers.identify[3].jwt.secret_env: the environment variable TOLLGATE_TEST_UNSET_SECRET is not set or empty",
            "consumers.identify[4].jwt: takes exactly one of jwks_file, jwks_url and secret_env",
            "consumers.identify[5].jwt.leeway: invalid duration \"soon\"",
        ] {
            assert!(found.contains(text), "missing {text:?} in\n{found}");
        }
        let missing_file = format!(
            "consumers:\n  identify:\n    - jwt: {{ algorithms: [RS256], jwks_file: no-such-jwks.json }}\n{ROUTE}"
        );
        let found = problems(&missing_file).join("\n");
        assert!(
            found
                .contains("consumers.identify[0].jwt.jwks_file: no-such-jwks.json: cannot read it"),
            "{found}"
        );
    }
}
