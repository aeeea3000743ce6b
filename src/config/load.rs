//! Loading a config file: read, interpolate, parse, validate, and place every problem in the file.

use std::path::Path;

use serde::de::DeserializeOwned;

use super::consumers::consumers;
use super::error::{ConfigError, Problem};
use super::interpolate::{interpolate, Interpolated, PositionMap};
use super::locate::{Locator, Position};
use super::model::{Config, ConsumersSettings, RlsSettings};
use super::raw::{RawConfig, RawConsumers};
use super::rls::{ratelimit_file, ratelimit_files, RawRatelimitFile};
use super::secrets::secret_api_keys;
use super::validate::{client_cert_in_consumers, validate, Issues, Reader};

/// Reads and validates the config file at `path`, taking `${VAR}` values from the process environment.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with_text(path).map(|(config, _)| config)
}

/// Reads the config file at `path` for tower layers ([`crate::layer::RateLimitLayer::from_route`]): as [`load`]
/// does, except that a route may have neither `upstream` nor `respond` (the layer limits whatever it wraps; such a
/// route's action is [`RouteAction::LimitsOnly`](super::RouteAction::LimitsOnly)).
pub fn load_for_layers(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::read(path, e))?;
    parse_for_layers(&text, path)
}

/// [`load_for_layers`] for a config's text; `source` names the file in messages.
pub fn parse_for_layers(text: &str, source: &Path) -> Result<Config, ConfigError> {
    parse_as(
        text,
        source,
        &|name| std::env::var(name).ok(),
        Reader::Layers,
    )
}

/// Validates a `consumers:` block written on its own (what goes under `consumers:` in a config file, not indented
/// under it), taking `${VAR}` values from the process environment. Problems are located in `text` as a config
/// file's are, `source` naming it, with field paths from the block (`plans.free.limits[0].rate`).
fn parse_consumers(text: &str, source: &Path) -> Result<ConsumersSettings, ConfigError> {
    let env = |name: &str| std::env::var(name).ok();
    let interpolated = interpolated(text, source, &env)?;
    let located = Located {
        source,
        locator: Locator::new(&interpolated.text),
        interpolated: &interpolated,
    };
    let raw: RawConsumers = deserialize(&located)?;
    // Relative file names (`jwks_file`) are relative to the file's folder, as in a config file.
    let folder = source.parent().unwrap_or(Path::new(""));
    let mut issues = Issues::default();
    let mut settings = consumers(&mut issues, &raw, folder);
    client_cert_in_consumers(&mut issues, &raw);
    if let Some(settings) = settings.as_mut() {
        secret_api_keys(&mut [], Some(settings));
    }
    let problems: Vec<Problem> = issues
        .into_vec()
        .into_iter()
        .map(|issue| {
            // The block's own paths, without the `consumers` it would sit under in a config file.
            let path = issue.path.strip_prefix("consumers").unwrap_or(&issue.path);
            let path = path.strip_prefix('.').unwrap_or(path);
            located.problem(path, issue.message)
        })
        .collect();
    match settings {
        Some(settings) if problems.is_empty() => Ok(settings),
        _ => Err(ConfigError::invalid(problems)),
    }
}

// `ConsumersSettings::from_yaml` is written here, beside the loader it calls, so that the consumers module, below
// config, does not reach up into it.
impl ConsumersSettings {
    /// A `consumers:` block on its own, for a tower layer's [`Builder::consumers`](crate::layer::Builder::consumers)
    /// without a whole config file: the text is what goes under `consumers:` in a config file (`identify:`,
    /// `keys:`, `plans:`...), with `${VAR}`s from the environment. It is checked as a config file's block is, and
    /// its problems are located the same way, in `source` (the name the messages give the text), e.g.
    /// `consumers.yaml:7:47: plans.free.limits[0].rate: ...`.
    ///
    /// ```
    /// use std::path::Path;
    ///
    /// use tollgate::consumers::ConsumersSettings;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let consumers = ConsumersSettings::from_yaml(
    ///     r#"
    /// identify:
    ///   - api_key: { header: x-api-key }
    /// keys:
    ///   - { key: "sha256:9f8cfdb17116bf0e2a44e071454f25594cb9b8737bf331e6a2f0b30550572f29", consumer: demo, plan: free }
    /// plans:
    ///   free:
    ///     limits:
    ///       - { name: hourly, key: consumer, algorithm: gcra, rate: 1000/1h, burst: 20 }
    /// "#,
    ///     Path::new("consumers.yaml"),
    /// )?;
    /// assert_eq!(consumers.plans.len(), 1);
    ///
    /// let error = ConsumersSettings::from_yaml("plans:\n  free:\n    limits: 7\n", Path::new("c.yaml"))
    ///     .expect_err("limits is a list");
    /// assert!(error.to_string().starts_with("c.yaml:3:13: plans.free.limits: "), "{error}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_yaml(text: &str, source: &Path) -> Result<Self, ConfigError> {
        parse_consumers(text, source)
    }
}

/// [`load`], also returning the file's text as it was read: what a later reload compares the file with.
pub fn load_with_text(path: &Path) -> Result<(Config, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::read(path, e))?;
    parse(&text, path).map(|config| (config, text))
}

/// Validates config `text`, taking `${VAR}` values from the process environment. `source` names the file in
/// messages and in [`Config::source`].
pub fn parse(text: &str, source: &Path) -> Result<Config, ConfigError> {
    parse_with_env(text, source, |name| std::env::var(name).ok())
}

/// Like [`parse`], taking `${VAR}` values from `env` instead of the process environment.
pub fn parse_with_env(
    text: &str,
    source: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    parse_as(text, source, &env, Reader::Gateway)
}

fn parse_as(
    text: &str,
    source: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    reader: Reader,
) -> Result<Config, ConfigError> {
    let interpolated = interpolated(text, source, env)?;
    let located = Located {
        source,
        locator: Locator::new(&interpolated.text),
        interpolated: &interpolated,
    };
    let raw: RawConfig = deserialize(&located)?;
    let mut config = validate(raw, source, reader).map_err(|issues| {
        let problems = issues
            .into_iter()
            .map(|issue| located.problem(&issue.path, issue.message))
            .collect();
        ConfigError::invalid(problems)
    })?;
    if let Some(rls) = config.rls.as_mut() {
        read_config_dir(rls, &located)?;
    }
    Ok(config)
}

/// Adds the domains of `rls.config_dir`'s envoyproxy/ratelimit files to `rls`: each file read as it is (no
/// `${VAR}`s), its problems located in it; a folder that cannot be read is a problem of the config file's.
fn read_config_dir(rls: &mut RlsSettings, located: &Located<'_>) -> Result<(), ConfigError> {
    let Some(dir) = rls.config_dir.clone() else {
        return Ok(());
    };
    let files = ratelimit_files(&dir).map_err(|error| {
        let message = format!("cannot read the folder {}: {error}", dir.display());
        ConfigError::invalid(vec![located.problem("rls.config_dir", message)])
    })?;
    let mut problems = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| ConfigError::read(&file, e))?;
        let verbatim = Interpolated {
            text,
            map: PositionMap::default(),
        };
        let here = Located {
            source: &file,
            locator: Locator::new(&verbatim.text),
            interpolated: &verbatim,
        };
        let raw: RawRatelimitFile = match deserialize(&here) {
            Ok(raw) => raw,
            Err(error) => {
                problems.extend(error.problems().iter().cloned());
                continue;
            }
        };
        let mut issues = Issues::default();
        let domain = ratelimit_file(&mut issues, &raw, &file);
        problems.extend(
            issues
                .into_vec()
                .into_iter()
                .map(|issue| here.problem(&issue.path, issue.message)),
        );
        let Some(domain) = domain else {
            continue;
        };
        if let Some(first) = rls.domains.iter().find(|d| d.name == domain.name) {
            let first = first.file.as_ref().map_or_else(
                || "the config file's rls.domains".to_owned(),
                |f| f.display().to_string(),
            );
            problems.push(here.problem(
                "domain",
                format!("duplicate domain {:?} (also in {first})", domain.name),
            ));
            continue;
        }
        rls.domains.push(domain);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        // Each file's problems in its own order: the files in name order.
        Err(ConfigError::Invalid { problems })
    }
}

/// `text` with its `${VAR}`s replaced, or every variable that could not be.
fn interpolated(
    text: &str,
    source: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Interpolated, ConfigError> {
    interpolate(text, env).map_err(|errors| {
        let problems = errors
            .into_iter()
            .map(|e| Problem::new(source, (e.position.line, e.position.column), "", e.message))
            .collect();
        ConfigError::invalid(problems)
    })
}

/// The parsed text with the means to place a problem in the original file.
struct Located<'a> {
    source: &'a Path,
    locator: Locator,
    interpolated: &'a Interpolated,
}

impl Located<'_> {
    /// A problem on `path`, placed where the path is in the file.
    fn problem(&self, path: &str, message: impl Into<String>) -> Problem {
        self.problem_at(self.locator.locate(path), path, message)
    }

    /// A problem at `position` of the interpolated text.
    fn problem_at(&self, position: Position, path: &str, message: impl Into<String>) -> Problem {
        let Position { line, column } = self.interpolated.map.to_source(position);
        Problem::new(self.source, (line, column), path, message)
    }
}

/// The serde stage: syntax and structure (unknown keys, wrong types). Serde stops at its first error.
fn deserialize<T: DeserializeOwned>(located: &Located<'_>) -> Result<T, ConfigError> {
    let deserializer = serde_yaml::Deserializer::from_str(&located.interpolated.text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = match err.path().to_string() {
            root if root == "." => String::new(),
            path => path,
        };
        let cause = err.into_inner();
        // The parser knows where it stopped; the locator only knows where the field starts.
        let problem = match cause.location() {
            Some(at) => {
                let position = Position {
                    line: at.line(),
                    column: at.column(),
                };
                located.problem_at(position, &path, serde_message(&cause, &path))
            }
            None => located.problem(&path, serde_message(&cause, &path)),
        };
        ConfigError::invalid(vec![problem.with_cause(cause)])
    })
}

/// The serde error's text without what the problem line already says: its position and its field path.
///
/// serde_norway starts its messages with its own path, which for an unknown key is the enclosing mapping, while
/// `serde_path_to_error` also names the key: any leading path that `path` extends is dropped.
fn serde_message(error: &serde_yaml::Error, path: &str) -> String {
    let text = error.to_string();
    let own_path = text
        .split_once(": ")
        .filter(|(prefix, _)| !prefix.is_empty() && path.starts_with(prefix));
    let text = own_path.map_or(text.as_str(), |(_, message)| message);
    strip_positions(text)
}

/// Removes ` at line L column C` and ` at position N`, which the problem line already gives in `file:line:col`.
fn strip_positions(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(" at ") {
        let (before, after) = rest.split_at(start);
        out.push_str(before);
        let after = &after[" at ".len()..];
        match skip_position(after) {
            Some(remaining) => rest = remaining,
            None => {
                out.push_str(" at ");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The text after a leading `line L column C` or `position N`, if it starts with one.
fn skip_position(text: &str) -> Option<&str> {
    if let Some(rest) = text.strip_prefix("line ") {
        let rest = skip_number(rest)?.strip_prefix(" column ")?;
        return skip_number(rest);
    }
    skip_number(text.strip_prefix("position ")?)
}

/// The text after a leading number, if it starts with one.
fn skip_number(text: &str) -> Option<&str> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    (digits > 0).then(|| &text[digits..])
}

#[cfg(test)]
// A failed unwrap is a failed test, with the value in the message.
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use http::{Method, StatusCode};

    use super::*;
    use crate::config::{BackendKind, RouteAction};
    use crate::key::{KeyPart, MissingKey};
    use crate::limiter::{Algorithm, OnError, Rate};

    /// The example of docs/configuration.md, verbatim.
    const DESIGN_EXAMPLE: &str = r##"listen: 0.0.0.0:8080
admin:
  listen: 127.0.0.1:9901            # health, metrics, admin API
  token: "${TOLLGATE_ADMIN_TOKEN:-}"  # required (non-empty) when admin.listen is not loopback
store:
  backend: redis                    # redis | memory
  url: "${REDIS_URL:-redis://127.0.0.1:6379}"   # redis://, rediss://, redis-cluster://, redis-sentinel://
  timeout: 25ms                     # budget for one limiter call
  on_error: local                   # what to do when Redis fails or times out: allow | deny | local
  key_prefix: "tollgate:"
client_ip:
  trusted_proxies: []               # CIDRs; X-Forwarded-For / Forwarded are believed only from these peers
upstreams:
  api:
    targets: ["http://127.0.0.1:3000"]   # several targets: round robin
    timeout: 30s
routes:                             # first match wins, in file order
  - name: demo
    match: { path_prefix: /demo }
    respond: { status: 200, body: "hello from tollgate\n" }    # direct response, no upstream
    limits:
      - name: per-ip
        key: ip
        algorithm: token_bucket
        rate: 5/s
        burst: 10
  - name: api
    match: { path_prefix: /api, methods: [GET, POST] }   # also: path (exact), host
    upstream: api
    limits:
      - name: per-ip
        key: ip
        algorithm: sliding_window
        limit: 100
        period: 1m
      - name: per-api-key
        key: [header:x-api-key]       # parts: ip, route, method, path, host, header:NAME, query:NAME
        algorithm: gcra
        rate: 1000/1h
        burst: 50
        cost: 1
"##;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn parse_text(text: &str) -> Result<Config, ConfigError> {
        parse_with_env(text, Path::new("gateway.yaml"), no_env)
    }

    /// The design example, as written in the design.
    fn runnable_example() -> String {
        DESIGN_EXAMPLE.to_owned()
    }

    fn error_lines(result: Result<Config, ConfigError>) -> Vec<String> {
        match result {
            Ok(_) => panic!("expected the config to be refused"),
            Err(err) => err.to_string().lines().map(str::to_owned).collect(),
        }
    }

    #[test]
    fn design_example_parses_into_the_model() {
        let config = parse_text(&runnable_example()).unwrap();
        assert_eq!(config.source, Path::new("gateway.yaml"));
        assert_eq!(config.listen, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(config.admin.listen, "127.0.0.1:9901".parse().unwrap());
        assert_eq!(config.admin.token, None);
        assert_eq!(config.store.backend, BackendKind::Redis);
        assert_eq!(config.store.url, "redis://127.0.0.1:6379");
        assert_eq!(config.store.timeout, Duration::from_millis(25));
        assert_eq!(config.store.on_error, OnError::Local);
        assert_eq!(config.store.key_prefix, "tollgate:");
        assert_eq!(config.store.max_keys, 1_000_000);
        assert_eq!(config.store.pool_size, 4);
        assert!(config.client_ip.trusted_proxies.is_empty());
        assert_eq!(config.server.header_read_timeout, Duration::from_secs(10));

        let [api] = config.upstreams.as_slice() else {
            panic!("one upstream expected");
        };
        assert_eq!(api.name, "api");
        assert_eq!(
            api.targets,
            vec!["http://127.0.0.1:3000".parse::<http::Uri>().unwrap()]
        );
        assert_eq!(api.timeout, Duration::from_secs(30));
        assert_eq!(api.connect_timeout, Duration::from_secs(5));

        let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["demo", "api"]);

        let demo = &config.routes[0];
        assert_eq!(demo.matcher.path_prefix.as_deref(), Some("/demo"));
        let RouteAction::Respond(response) = &demo.action else {
            panic!("demo answers directly");
        };
        assert_eq!(response.status, StatusCode::OK);
        assert_eq!(response.body, "hello from tollgate\n");
        assert_eq!(demo.deny_status, StatusCode::TOO_MANY_REQUESTS);
        assert!(demo.headers);
        let [demo_limit] = demo.limits.as_slice() else {
            panic!("one limit expected");
        };
        assert_eq!(demo_limit.limit.name(), "per-ip");
        assert_eq!(demo_limit.key.parts(), [KeyPart::Ip]);
        assert_eq!(
            *demo_limit.limit.algorithm(),
            Algorithm::TokenBucket {
                rate: Rate::new(5, 1_000).unwrap(),
                burst: 10
            }
        );

        let api_route = &config.routes[1];
        assert_eq!(api_route.matcher.path_prefix.as_deref(), Some("/api"));
        assert_eq!(api_route.matcher.methods, [Method::GET, Method::POST]);
        assert!(matches!(&api_route.action, RouteAction::Upstream(name) if name == "api"));
        let limits: Vec<(&str, Algorithm, u64)> = api_route
            .limits
            .iter()
            .map(|l| (l.limit.name(), *l.limit.algorithm(), l.limit.cost()))
            .collect();
        assert_eq!(
            limits,
            [
                (
                    "per-ip",
                    Algorithm::SlidingWindow {
                        limit: 100,
                        period_ms: 60_000
                    },
                    1
                ),
                (
                    "per-api-key",
                    Algorithm::Gcra {
                        rate: Rate::new(1_000, 3_600_000).unwrap(),
                        burst: 50
                    },
                    1
                ),
            ]
        );
        let api_key = &api_route.limits[1].key;
        assert_eq!(
            api_key.parts(),
            [KeyPart::parse("header:x-api-key").unwrap()]
        );
        assert_eq!(api_key.missing(), MissingKey::Ip);
    }

    #[test]
    fn bad_period_is_located_on_its_key() {
        let text = runnable_example().replace("period: 1m", "period: 1 minute");
        assert_eq!(
            error_lines(parse_text(&text)),
            [
                r#"gateway.yaml:35:9: routes[1].limits[0].period: invalid duration "1 minute" (use 250ms, 1s, 1m, 1h, 1d)"#
            ]
        );
    }

    #[test]
    fn unknown_key_is_refused_with_its_location() {
        let text = runnable_example().replace("period: 1m", "perod: 1m");
        let err = parse_text(&text).unwrap_err();
        let [problem] = err.problems() else {
            panic!("one problem expected: {err}");
        };
        assert_eq!((problem.line(), problem.column()), (35, 9));
        assert_eq!(problem.path(), "routes[1].limits[0].perod");
        assert!(
            problem
                .message()
                .starts_with("unknown field `perod`, expected one of `name`, `key`"),
            "{problem}"
        );
        assert!(std::error::Error::source(problem).is_some());
        assert!(err
            .to_string()
            .starts_with("gateway.yaml:35:9: routes[1].limits[0].perod: unknown field `perod`"));
    }

    #[test]
    fn top_level_typo_and_wrong_type_are_located() {
        let lines = error_lines(parse_text(
            "listen: 0.0.0.0:8080\nstroe:\n  backend: redis\n",
        ));
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with("gateway.yaml:2:1: stroe: unknown field `stroe`"),
            "{lines:?}"
        );
        assert_eq!(
            error_lines(parse_text("routes:\n  - name: a\n    deny_status: lots\n")),
            [
                r#"gateway.yaml:3:18: routes[0].deny_status: invalid type: string "lots", expected u16"#
            ]
        );
    }

    #[test]
    fn yaml_syntax_errors_carry_the_parser_position() {
        let err = parse_text("routes: [\n  - name: a\n").unwrap_err();
        let [problem] = err.problems() else {
            panic!("one problem expected: {err}");
        };
        assert_eq!(problem.line(), 2);
        assert!(!problem.message().contains(" at line "), "{problem}");
    }

    #[test]
    fn environment_values_and_defaults_are_used() {
        let env = |name: &str| match name {
            "REDIS_URL" => Some("rediss://cache.internal:6380".to_owned()),
            "TOLLGATE_ADMIN_TOKEN" => Some("s3cret".to_owned()),
            _ => None,
        };
        let text = runnable_example().replace("127.0.0.1:9901", "0.0.0.0:9901");
        let config = parse_with_env(&text, Path::new("gateway.yaml"), env).unwrap();
        assert_eq!(config.store.url, "rediss://cache.internal:6380");
        assert_eq!(config.admin.token.as_deref(), Some("s3cret"));
    }

    #[test]
    fn unset_variable_without_default_is_located() {
        let text = "listen: 0.0.0.0:8080\nadmin:\n  token: \"${ADMIN_TOKEN}\"\n";
        assert_eq!(
            error_lines(parse_text(text)),
            ["gateway.yaml:3:11: environment variable ADMIN_TOKEN is not set (write ${ADMIN_TOKEN:-default} to give a default)"]
        );
    }

    #[test]
    fn locations_after_a_substituted_value_are_those_of_the_file() {
        let env = |name: &str| (name == "PREFIX").then(|| "/a-rather-long-prefix".to_owned());
        let text = "upstreams:\n  u: { targets: [\"http://h:1\"] }\nroutes:\n  - { name: r, upstream: u, match: { path_prefix: \"${PREFIX}\", path: nope } }\n";
        let lines = error_lines(parse_with_env(text, Path::new("g.yaml"), env));
        assert_eq!(
            lines,
            [r#"g.yaml:4:64: routes[0].match.path: must start with "/" (got "nope")"#]
        );
    }

    #[test]
    fn load_reads_the_file_and_names_it_when_it_cannot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.yaml");
        std::fs::write(&path, runnable_example()).unwrap();
        let config = load(&path).unwrap();
        assert_eq!(config.source, path);
        assert_eq!(config.routes.len(), 2);

        let missing = dir.path().join("absent.yaml");
        let err = load(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.problems().is_empty());
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "{}: cannot read the config file: ",
                missing.display()
            )),
            "{message}"
        );
    }

    #[test]
    fn positions_are_stripped_from_parser_messages() {
        assert_eq!(
            strip_positions("did not find x at line 2 column 1, while parsing at position 7"),
            "did not find x, while parsing"
        );
        assert_eq!(strip_positions("look at this"), "look at this");
    }

    #[test]
    fn a_route_without_upstream_or_respond_is_limits_only_for_layers_and_an_error_for_the_gateway()
    {
        let text = "routes:\n  - name: api\n    limits:\n      - { name: per-ip, key: ip, algorithm: sliding_window, limit: 5, period: 1s }\n";
        let config = parse_for_layers(text, Path::new("l.yaml")).unwrap();
        assert!(matches!(config.routes[0].action, RouteAction::LimitsOnly));
        assert_eq!(config.routes[0].limits.len(), 1);
        let error = parse(text, Path::new("g.yaml")).unwrap_err().to_string();
        assert!(
            error.starts_with(
                "g.yaml:2:5: routes[0]: needs upstream (forward to an upstream) or respond"
            ) && error.contains("config::load_for_layers"),
            "{error}"
        );
    }

    #[test]
    fn a_consumers_block_on_its_own_is_checked_and_located_as_in_a_file() {
        let text = "identify:\n  - api_key: { header: x-api-key }\nanonymous: { plan: gold }\nplans:\n  free:\n    limits:\n      - { name: h, key: [header:x-api-key], algorithm: gcra, rate: 10/1s, burst: 0 }\n";
        let error = parse_consumers(text, Path::new("c.yaml")).unwrap_err();
        let lines: Vec<String> = error.problems().iter().map(ToString::to_string).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("c.yaml:3:14: anonymous.plan: unknown plan \"gold\""),
            "{lines:?}"
        );
        assert_eq!(
            lines[1],
            "c.yaml:7:75: plans.free.limits[0].burst: must be greater than 0"
        );

        let fixed = text.replace("gold", "free").replace("burst: 0", "burst: 5");
        let settings = parse_consumers(&fixed, Path::new("c.yaml")).unwrap();
        assert_eq!(settings.plans[0].limits.len(), 1);
        // A plan limit keyed by where the API keys are sent keeps them out of store keys, as in a file.
        assert!(settings.plans[0].limits[0].key.is_secret());
    }

    #[test]
    fn a_consumers_block_on_its_own_cannot_read_client_certificates() {
        // A tower layer's block: no HTTPS listener of tollgate's asks for a certificate.
        let text = "identify:\n  - mtls: {}\nplans:\n  free:\n    limits:\n      - { name: h, key: client_cert, algorithm: gcra, rate: 10/1s, burst: 5 }\n";
        let error = parse_consumers(text, Path::new("c.yaml")).unwrap_err();
        let lines: Vec<String> = error.problems().iter().map(ToString::to_string).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("c.yaml:2:5: identify[0].mtls: reads the client certificate"),
            "{lines:?}"
        );
        assert!(
            lines[1]
                .starts_with("c.yaml:6:20: plans.free.limits[0].key: reads the client certificate"),
            "{lines:?}"
        );
    }
}
