//! A route's `limits:` entries: the algorithm with exactly its parameters, the cost and the key.

use super::model::LimitSettings;
use super::raw::{KeyParts, RawLimit, RawMissing};
use super::validate::{check_name, Issues};
use crate::key::{KeyPart, KeySpec, MissingKey};
use crate::limiter::{
    format_duration_ms, parse_duration_ms, parse_rate, Algorithm, LeakyMode, Limit, Rate,
};

/// Every algorithm the file may name, with the parameters it takes, in the order users read them.
const ALGORITHMS: [AlgorithmSpec; 6] = [
    AlgorithmSpec {
        name: "sliding_window",
        params: &[Param::Limit, Param::Period],
        build: (sliding_window),
    },
    AlgorithmSpec {
        name: "sliding_log",
        params: &[Param::Limit, Param::Period],
        build: (sliding_log),
    },
    AlgorithmSpec {
        name: "token_bucket",
        params: &[Param::Rate, Param::Burst],
        build: (token_bucket),
    },
    AlgorithmSpec {
        name: "fixed_window",
        params: &[Param::Limit, Param::Period],
        build: (fixed_window),
    },
    AlgorithmSpec {
        name: "gcra",
        params: &[Param::Rate, Param::Burst],
        build: (gcra),
    },
    AlgorithmSpec {
        name: "leaky_bucket",
        params: &[Param::Rate, Param::Burst, Param::Mode, Param::MaxDelay],
        build: (leaky_bucket),
    },
];

/// An algorithm parameter of `limits:` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Param {
    Limit,
    Period,
    Rate,
    Burst,
    Mode,
    MaxDelay,
}

/// What the file may say about one algorithm.
#[derive(Debug)]
struct AlgorithmSpec {
    name: &'static str,
    /// The parameters it takes; all required except `mode` and `max_delay` (see [`Param::optional`]).
    params: &'static [Param],
    /// Builds the algorithm from its parsed parameters.
    build: fn(&Parsed) -> Option<Algorithm>,
}

/// The parameter values that parsed and are positive.
#[derive(Debug, Default)]
struct Parsed {
    limit: Option<u64>,
    period_ms: Option<u64>,
    rate: Option<Rate>,
    burst: Option<u64>,
    mode: Option<LeakyMode>,
}

/// Validates one entry of `limits:` at `at` (`routes[1].limits[0]`).
pub(crate) fn limit_settings(
    issues: &mut Issues,
    at: &str,
    raw: &RawLimit,
) -> Option<LimitSettings> {
    let before = issues.count();
    check_name(issues, &format!("{at}.name"), "limit", &raw.name);
    let key = key_spec(issues, &format!("{at}.key"), raw).map(|key| key.secret(raw.secret));
    let limit = checked_limit(issues, at, raw, before)?;
    Some(LimitSettings { limit, key: key? })
}

/// The parameters of an admin override of one plan limit: what it replaces, written as in the config.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Replaced<'a> {
    pub limit: Option<u64>,
    pub period: Option<&'a str>,
    pub rate: Option<&'a str>,
    pub burst: Option<u64>,
}

/// `base` with the parameters of `change` replaced, checked as the same values written in the file would be: an
/// override is bounded exactly as the config is. The problems, one `<limit>.<field>: <message>` each, joined.
pub(crate) fn replaced(base: &Limit, change: Replaced<'_>) -> Result<Limit, String> {
    let algorithm = base.algorithm();
    let (mut limit, mut period, mut rate, mut burst, mut mode, mut max_delay) =
        (None, None, None, None, None, None);
    match *algorithm {
        Algorithm::FixedWindow {
            limit: l,
            period_ms,
        }
        | Algorithm::SlidingWindow {
            limit: l,
            period_ms,
        }
        | Algorithm::SlidingLog {
            limit: l,
            period_ms,
        } => {
            limit = Some(l);
            period = Some(format_duration_ms(period_ms));
        }
        Algorithm::TokenBucket { rate: r, burst: b } | Algorithm::Gcra { rate: r, burst: b } => {
            rate = Some(r.to_string());
            burst = Some(b);
        }
        Algorithm::LeakyBucket {
            rate: r,
            burst: b,
            mode: m,
        } => {
            rate = Some(r.to_string());
            burst = Some(b);
            if let LeakyMode::Delay { max_delay_ms } = m {
                mode = Some("delay".to_owned());
                max_delay = Some(format_duration_ms(max_delay_ms));
            }
        }
    }
    let raw = RawLimit {
        name: base.name().to_owned(),
        key: None,
        missing: RawMissing::default(),
        algorithm: algorithm.name().to_owned(),
        limit: change.limit.or(limit),
        period: change.period.map(str::to_owned).or(period),
        rate: change.rate.map(str::to_owned).or(rate),
        burst: change.burst.or(burst),
        cost: base.cost(),
        mode,
        max_delay,
        shadow: base.is_shadow(),
        secret: false,
    };
    let mut issues = Issues::default();
    checked_limit(&mut issues, base.name(), &raw, 0).ok_or_else(|| issues.to_string())
}

/// The limit of one entry, its name and key aside; `None` when `issues` grew since `before`.
fn checked_limit(issues: &mut Issues, at: &str, raw: &RawLimit, before: usize) -> Option<Limit> {
    let algorithm = algorithm(issues, at, raw);
    if raw.cost == 0 {
        issues.add(format!("{at}.cost"), "must be greater than 0");
    }
    if issues.count() != before {
        return None;
    }
    let limit = issues
        .check(at, Limit::new(raw.name.clone(), algorithm?, raw.cost))?
        .with_shadow(raw.shadow);
    Some(limit)
}

// === algorithms ===

fn algorithm(issues: &mut Issues, at: &str, raw: &RawLimit) -> Option<Algorithm> {
    let spec = algorithm_spec(issues, &format!("{at}.algorithm"), &raw.algorithm)?;
    let build = spec.build;
    let before = issues.count();
    for param in Param::ALL {
        check_presence(issues, at, spec, param, raw);
    }
    let parsed = Parsed::new(issues, at, raw);
    if issues.count() != before {
        return None;
    }
    build(&parsed)
}

fn algorithm_spec(issues: &mut Issues, at: &str, name: &str) -> Option<&'static AlgorithmSpec> {
    let available = available_names();
    match ALGORITHMS.iter().find(|spec| spec.name == name) {
        Some(spec) => Some(spec),
        None if name.is_empty() => {
            issues.add(
                at,
                format_args!("a limit needs an algorithm (use {available})"),
            );
            None
        }
        None => {
            issues.add(
                at,
                format_args!("unknown algorithm {name:?} (use {available})"),
            );
            None
        }
    }
}

fn available_names() -> String {
    let names: Vec<&str> = ALGORITHMS.iter().map(|spec| spec.name).collect();
    names.join(", ")
}

/// A parameter the algorithm takes must be there; one it does not take must not, since a typo (`rate` for
/// `limit`) would otherwise silently leave a different limit than the one intended.
fn check_presence(
    issues: &mut Issues,
    at: &str,
    spec: &AlgorithmSpec,
    param: Param,
    raw: &RawLimit,
) {
    let takes = spec.params.contains(&param);
    let path = format!("{at}.{}", param.name());
    let name = spec.name;
    let params = spec.param_list();
    match (takes, param.is_set(raw)) {
        (true, false) if !param.optional() => {
            issues.add(path, format_args!("required by {name} (it takes {params})"))
        }
        (false, true) => issues.add(
            path,
            format_args!("{} is not used by {name} (it takes {params})", param.name()),
        ),
        _ => {}
    }
}

fn sliding_window(p: &Parsed) -> Option<Algorithm> {
    Some(Algorithm::SlidingWindow {
        limit: p.limit?,
        period_ms: p.period_ms?,
    })
}

fn sliding_log(p: &Parsed) -> Option<Algorithm> {
    Some(Algorithm::SlidingLog {
        limit: p.limit?,
        period_ms: p.period_ms?,
    })
}

fn token_bucket(p: &Parsed) -> Option<Algorithm> {
    Some(Algorithm::TokenBucket {
        rate: p.rate?,
        burst: p.burst?,
    })
}

fn fixed_window(p: &Parsed) -> Option<Algorithm> {
    Some(Algorithm::FixedWindow {
        limit: p.limit?,
        period_ms: p.period_ms?,
    })
}

fn gcra(p: &Parsed) -> Option<Algorithm> {
    Some(Algorithm::Gcra {
        rate: p.rate?,
        burst: p.burst?,
    })
}

fn leaky_bucket(p: &Parsed) -> Option<Algorithm> {
    Some(Algorithm::LeakyBucket {
        rate: p.rate?,
        burst: p.burst?,
        mode: p.mode.unwrap_or(LeakyMode::Reject),
    })
}

// === impl AlgorithmSpec ===

impl AlgorithmSpec {
    /// `limit and period`, `rate, burst, mode and max_delay`.
    fn param_list(&self) -> String {
        let names: Vec<&str> = self.params.iter().map(|p| p.name()).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }
}

// === impl Param ===

impl Param {
    const ALL: [Param; 6] = [
        Param::Limit,
        Param::Period,
        Param::Rate,
        Param::Burst,
        Param::Mode,
        Param::MaxDelay,
    ];

    fn name(self) -> &'static str {
        match self {
            Param::Limit => "limit",
            Param::Period => "period",
            Param::Rate => "rate",
            Param::Burst => "burst",
            Param::Mode => "mode",
            Param::MaxDelay => "max_delay",
        }
    }

    /// `mode` defaults to `reject`, and `max_delay` is only wanted by `mode: delay`.
    fn optional(self) -> bool {
        matches!(self, Param::Mode | Param::MaxDelay)
    }

    fn is_set(self, raw: &RawLimit) -> bool {
        match self {
            Param::Limit => raw.limit.is_some(),
            Param::Period => raw.period.is_some(),
            Param::Rate => raw.rate.is_some(),
            Param::Burst => raw.burst.is_some(),
            Param::Mode => raw.mode.is_some(),
            Param::MaxDelay => raw.max_delay.is_some(),
        }
    }
}

// === impl Parsed ===

impl Parsed {
    /// Parses every parameter present, reporting each bad one on its own field.
    fn new(issues: &mut Issues, at: &str, raw: &RawLimit) -> Self {
        let positive = |issues: &mut Issues, field: &str, value: Option<u64>| {
            let value = value?;
            if value == 0 {
                issues.add(format!("{at}.{field}"), "must be greater than 0");
                return None;
            }
            Some(value)
        };
        let period_ms = raw.period.as_deref().and_then(|text| {
            let path = format!("{at}.period");
            let ms = issues.check(&path, parse_duration_ms(text))?;
            if ms == 0 {
                issues.add(path, format_args!("must be greater than 0 (got {text:?})"));
                return None;
            }
            Some(ms)
        });
        let rate = raw
            .rate
            .as_deref()
            .and_then(|text| issues.check(format!("{at}.rate"), parse_rate(text)));
        Parsed {
            limit: positive(issues, "limit", raw.limit),
            period_ms,
            rate,
            burst: positive(issues, "burst", raw.burst),
            mode: leaky_mode(issues, at, raw),
        }
    }
}

/// `mode: reject` (default) or `mode: delay` with its `max_delay`.
fn leaky_mode(issues: &mut Issues, at: &str, raw: &RawLimit) -> Option<LeakyMode> {
    match raw.mode.as_deref().map(str::trim) {
        None | Some("reject") => {
            // Not taken as `mode: delay` implied: whether requests are held is said in one place, `mode`, and a
            // max_delay left behind when the mode was removed must not bring the holding back.
            // Other algorithms say of max_delay that they do not take it.
            if raw.max_delay.is_some() && raw.algorithm.trim() == "leaky_bucket" {
                issues.add(
                    format!("{at}.max_delay"),
                    "only used with mode: delay (add mode: delay to hold requests up to it, or remove it)",
                );
            }
            Some(LeakyMode::Reject)
        }
        Some("delay") => {
            let path = format!("{at}.max_delay");
            let Some(text) = raw.max_delay.as_deref() else {
                issues.add(
                    path,
                    "required by mode: delay (the longest a request may be held)",
                );
                return None;
            };
            let max_delay_ms = issues.check(&path, parse_duration_ms(text))?;
            if max_delay_ms == 0 {
                issues.add(path, format_args!("must be greater than 0 (got {text:?})"));
                return None;
            }
            Some(LeakyMode::Delay { max_delay_ms })
        }
        Some(other) => {
            issues.add(
                format!("{at}.mode"),
                format_args!("invalid mode {other:?} (use reject or delay)"),
            );
            None
        }
    }
}

// === keys ===

fn key_spec(issues: &mut Issues, at: &str, raw: &RawLimit) -> Option<KeySpec> {
    let written: Vec<(String, &str)> = match &raw.key {
        None => vec![(at.to_owned(), "ip")],
        Some(KeyParts::One(part)) => vec![(at.to_owned(), part.as_str())],
        Some(KeyParts::List(parts)) => parts
            .iter()
            .enumerate()
            .map(|(i, part)| (format!("{at}[{i}]"), part.as_str()))
            .collect(),
    };
    if written.is_empty() {
        issues.add(
            at,
            "needs at least one part (use ip, route, method, path, host, header:NAME, query:NAME, consumer, plan)",
        );
        return None;
    }
    let before = issues.count();
    let parts: Vec<KeyPart> = written
        .into_iter()
        .filter_map(|(path, text)| issues.check(path, KeyPart::parse(text)))
        .collect();
    if issues.count() != before {
        return None;
    }
    let missing = match raw.missing {
        RawMissing::Ip => MissingKey::Ip,
        RawMissing::Skip => MissingKey::Skip,
    };
    Some(KeySpec::new(parts, missing))
}
