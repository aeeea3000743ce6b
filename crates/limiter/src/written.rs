//! A limit's algorithm as people write it (a config file's `limits:` entry, an admin API override), checked.

use super::calendar::{Calendar, CalendarError, CalendarUnit};
use super::units::{parse_duration_ms, parse_rate};
use super::{format_duration_ms, Algorithm, LeakyMode, Limit, Rate, SlotQueue};

/// A `concurrency` lease when none is written: long enough that renewals (every third of it) cost nothing
/// noticeable, short enough that a crashed instance's slots come back soon.
pub const DEFAULT_LEASE_MS: u64 = 30_000;
/// Requests of one limit that may wait for a slot on one instance when `queue.max_waiting` is not written.
pub const DEFAULT_MAX_WAITING: u64 = 1_000;

/// Every algorithm that may be named, with the parameters it takes, in the order users read them.
const ALGORITHMS: [AlgorithmSpec; 7] = [
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
    AlgorithmSpec {
        name: "concurrency",
        params: &[Param::Max, Param::Lease, Param::Queue],
        build: (concurrency),
    },
];

/// An algorithm and its parameters as written: numbers as numbers, durations and rates as text (`"1m"`,
/// `"100/1h"`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WrittenAlgorithm<'a> {
    pub algorithm: &'a str,
    pub limit: Option<u64>,
    pub period: Option<&'a str>,
    pub rate: Option<&'a str>,
    pub burst: Option<u64>,
    pub mode: Option<&'a str>,
    pub max_delay: Option<&'a str>,
    pub max: Option<u64>,
    pub lease: Option<&'a str>,
    pub queue: Option<WrittenQueue<'a>>,
    /// `day`, `week`, `month` or `year`: a `fixed_window` on the calendar instead of a period.
    pub calendar: Option<&'a str>,
    /// The IANA zone of `calendar` (UTC when absent).
    pub timezone: Option<&'a str>,
}

/// `queue:` of a `concurrency` limit as written.
#[derive(Debug, Clone, Copy, Default)]
pub struct WrittenQueue<'a> {
    pub max_wait: Option<&'a str>,
    pub max_waiting: Option<u64>,
}

/// What is wrong with one field of a [`WrittenAlgorithm`]: the field (`period`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: &'static str,
    pub message: String,
}

/// The parameters of an admin override of one plan limit: what it replaces, written as in the config.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replaced<'a> {
    pub limit: Option<u64>,
    pub period: Option<&'a str>,
    pub rate: Option<&'a str>,
    pub burst: Option<u64>,
    pub max: Option<u64>,
}

/// An algorithm parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Param {
    Limit,
    Period,
    Rate,
    Burst,
    Mode,
    MaxDelay,
    Max,
    Lease,
    Queue,
}

/// What may be written about one algorithm.
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
    max: Option<u64>,
    lease_ms: Option<u64>,
    queue: Option<SlotQueue>,
}

/// The problems found so far, in the order they were found.
#[derive(Debug, Default)]
struct Problems(Vec<Problem>);

/// `base` with the parameters of `change` replaced, checked as the same values written in a config file would be:
/// an override is bounded exactly as the config is. The problems, one `<limit>.<field>: <message>` each, joined.
pub fn replaced(base: &Limit, change: Replaced<'_>) -> Result<Limit, String> {
    let algorithm = base.algorithm();
    let (mut limit, mut period, mut rate, mut burst, mut mode, mut max_delay) =
        (None, None, None, None, None, None);
    let (mut max, mut lease, mut queue) = (None, None, None);
    let (mut calendar, mut timezone) = (None, None);
    match *algorithm {
        // The override of a calendar window's limit keeps its calendar and zone.
        Algorithm::CalendarWindow {
            limit: l,
            calendar: c,
        } => {
            limit = Some(l);
            calendar = Some(c.unit().name());
            timezone = Some(c.timezone());
        }
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
                mode = Some("delay");
                max_delay = Some(format_duration_ms(max_delay_ms));
            }
        }
        Algorithm::Concurrency {
            max: m,
            lease_ms,
            queue: q,
        } => {
            max = Some(m);
            lease = Some(format_duration_ms(lease_ms));
            queue = q.map(|q| (format_duration_ms(q.max_wait_ms), q.max_waiting));
        }
    }
    let written = WrittenAlgorithm {
        algorithm: algorithm.name(),
        limit: change.limit.or(limit),
        period: change.period.or(period.as_deref()),
        rate: change.rate.or(rate.as_deref()),
        burst: change.burst.or(burst),
        mode,
        max_delay: max_delay.as_deref(),
        max: change.max.or(max),
        lease: lease.as_deref(),
        queue: queue.as_ref().map(|(max_wait, max_waiting)| WrittenQueue {
            max_wait: Some(max_wait),
            max_waiting: Some(*max_waiting),
        }),
        calendar,
        timezone,
    };
    let name = base.name();
    let checked = written.checked().map_err(|problems| {
        let problems: Vec<String> = problems
            .iter()
            .map(|p| format!("{name}.{}: {}", p.field, p.message))
            .collect();
        problems.join("; ")
    })?;
    Limit::new(name, checked, base.cost())
        .map(|limit| limit.with_shadow(base.is_shadow()))
        .map_err(|error| format!("{name}: {error}"))
}

// === impl WrittenAlgorithm ===

impl WrittenAlgorithm<'_> {
    /// The algorithm, or every problem of the fields written: an unknown algorithm, a parameter it needs missing,
    /// one it does not take given (a typo, `rate` for `limit`, would otherwise leave a different limit than the one
    /// intended), a value that does not parse or is zero.
    pub fn checked(&self) -> Result<Algorithm, Vec<Problem>> {
        let mut problems = Problems::default();
        let Some(spec) = algorithm_spec(&mut problems, self.algorithm) else {
            return Err(problems.0);
        };
        let calendar = self.calendar_of(&mut problems, spec);
        for param in Param::ALL {
            // A calendar stands for the period (`calendar_of` refuses both).
            if !(param == Param::Period && self.calendar.is_some() && spec.takes_calendar()) {
                self.check_presence(&mut problems, spec, param);
            }
        }
        let parsed = Parsed::new(&mut problems, self);
        let algorithm = match calendar {
            Some(calendar) => parsed
                .limit
                .map(|limit| Algorithm::CalendarWindow { limit, calendar }),
            None => (spec.build)(&parsed),
        };
        match algorithm {
            Some(algorithm) if problems.0.is_empty() => Ok(algorithm),
            _ => Err(problems.0),
        }
    }

    /// The calendar of a `fixed_window` written with `calendar:` (and `timezone:`), or `None` with the problems: a
    /// calendar on another algorithm, a calendar with a period, a timezone without a calendar, an unknown unit or
    /// zone.
    fn calendar_of(&self, problems: &mut Problems, spec: &AlgorithmSpec) -> Option<Calendar> {
        let Some(unit) = self.calendar else {
            if self.timezone.is_some() {
                problems.add(
                    "timezone",
                    "only used with calendar (add calendar: day, week, month or year, or remove it)",
                );
            }
            return None;
        };
        if !spec.takes_calendar() {
            problems.add(
                "calendar",
                format_args!(
                    "calendar windows are fixed_window's, not {}'s (use algorithm: fixed_window, or remove \
                     calendar)",
                    spec.name
                ),
            );
            return None;
        }
        if self.period.is_some() {
            problems.add(
                "calendar",
                "calendar and period exclude each other: a calendar window runs from one boundary of the \
                 calendar to the next (remove period)",
            );
            return None;
        }
        let unit: CalendarUnit = problems.check("calendar", unit.parse())?;
        match Calendar::new(unit, self.timezone) {
            Ok(calendar) => Some(calendar),
            Err(error @ CalendarError::UnknownZone(_)) => {
                problems.add("timezone", error);
                None
            }
            Err(error) => {
                problems.add("calendar", error);
                None
            }
        }
    }

    /// A parameter the algorithm takes must be there; one it does not take must not.
    fn check_presence(&self, problems: &mut Problems, spec: &AlgorithmSpec, param: Param) {
        let takes = spec.params.contains(&param);
        let name = spec.name;
        let params = spec.param_list();
        match (takes, param.is_set(self)) {
            (true, false) if !param.optional() => problems.add(
                param.name(),
                format_args!("required by {name} (it takes {params})"),
            ),
            (false, true) => problems.add(
                param.name(),
                format_args!("{} is not used by {name} (it takes {params})", param.name()),
            ),
            _ => {}
        }
    }
}

fn algorithm_spec(problems: &mut Problems, name: &str) -> Option<&'static AlgorithmSpec> {
    let available = available_names();
    match ALGORITHMS.iter().find(|spec| spec.name == name) {
        Some(spec) => Some(spec),
        None if name.is_empty() => {
            problems.add(
                "algorithm",
                format_args!("a limit needs an algorithm (use {available})"),
            );
            None
        }
        None => {
            problems.add(
                "algorithm",
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

fn concurrency(p: &Parsed) -> Option<Algorithm> {
    Some(Algorithm::Concurrency {
        max: p.max?,
        lease_ms: p.lease_ms.unwrap_or(DEFAULT_LEASE_MS),
        queue: p.queue,
    })
}

/// `queue: { max_wait, max_waiting }`: `max_wait` required, `max_waiting` 1,000 unless written.
fn slot_queue(problems: &mut Problems, written: &WrittenQueue<'_>) -> Option<SlotQueue> {
    let Some(text) = written.max_wait else {
        problems.add(
            "queue.max_wait",
            "required by queue (the longest a request waits for a slot)",
        );
        return None;
    };
    let max_wait_ms = problems.check("queue.max_wait", parse_duration_ms(text))?;
    if max_wait_ms == 0 {
        problems.add(
            "queue.max_wait",
            format_args!("must be greater than 0 (got {text:?})"),
        );
        return None;
    }
    let max_waiting = written.max_waiting.unwrap_or(DEFAULT_MAX_WAITING);
    if max_waiting == 0 {
        problems.add(
            "queue.max_waiting",
            "must be greater than 0 (remove queue to refuse at once)",
        );
        return None;
    }
    Some(SlotQueue {
        max_wait_ms,
        max_waiting,
    })
}

/// `mode: reject` (default) or `mode: delay` with its `max_delay`.
fn leaky_mode(problems: &mut Problems, written: &WrittenAlgorithm<'_>) -> Option<LeakyMode> {
    match written.mode.map(str::trim) {
        None | Some("reject") => {
            // Not taken as `mode: delay` implied: whether requests are held is said in one place, `mode`, and a
            // max_delay left behind when the mode was removed must not bring the holding back.
            // Other algorithms say of max_delay that they do not take it.
            if written.max_delay.is_some() && written.algorithm.trim() == "leaky_bucket" {
                problems.add(
                    "max_delay",
                    "only used with mode: delay (add mode: delay to hold requests up to it, or remove it)",
                );
            }
            Some(LeakyMode::Reject)
        }
        Some("delay") => {
            let Some(text) = written.max_delay else {
                problems.add(
                    "max_delay",
                    "required by mode: delay (the longest a request may be held)",
                );
                return None;
            };
            let max_delay_ms = problems.check("max_delay", parse_duration_ms(text))?;
            if max_delay_ms == 0 {
                problems.add(
                    "max_delay",
                    format_args!("must be greater than 0 (got {text:?})"),
                );
                return None;
            }
            Some(LeakyMode::Delay { max_delay_ms })
        }
        Some(other) => {
            problems.add(
                "mode",
                format_args!("invalid mode {other:?} (use reject or delay)"),
            );
            None
        }
    }
}

// === impl AlgorithmSpec ===

impl AlgorithmSpec {
    /// Whether the algorithm may count calendar windows (`calendar:` instead of `period:`).
    fn takes_calendar(&self) -> bool {
        self.name == "fixed_window"
    }

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
    const ALL: [Param; 9] = [
        Param::Limit,
        Param::Period,
        Param::Rate,
        Param::Burst,
        Param::Mode,
        Param::MaxDelay,
        Param::Max,
        Param::Lease,
        Param::Queue,
    ];

    fn name(self) -> &'static str {
        match self {
            Param::Limit => "limit",
            Param::Period => "period",
            Param::Rate => "rate",
            Param::Burst => "burst",
            Param::Mode => "mode",
            Param::MaxDelay => "max_delay",
            Param::Max => "max",
            Param::Lease => "lease",
            Param::Queue => "queue",
        }
    }

    /// `mode` defaults to `reject`, and `max_delay` is only wanted by `mode: delay`; `lease` has a default and
    /// `queue` is only for callers that would rather wait.
    fn optional(self) -> bool {
        matches!(
            self,
            Param::Mode | Param::MaxDelay | Param::Lease | Param::Queue
        )
    }

    fn is_set(self, written: &WrittenAlgorithm<'_>) -> bool {
        match self {
            Param::Limit => written.limit.is_some(),
            Param::Period => written.period.is_some(),
            Param::Rate => written.rate.is_some(),
            Param::Burst => written.burst.is_some(),
            Param::Mode => written.mode.is_some(),
            Param::MaxDelay => written.max_delay.is_some(),
            Param::Max => written.max.is_some(),
            Param::Lease => written.lease.is_some(),
            Param::Queue => written.queue.is_some(),
        }
    }
}

// === impl Parsed ===

impl Parsed {
    /// Parses every parameter present, reporting each bad one on its own field.
    fn new(problems: &mut Problems, written: &WrittenAlgorithm<'_>) -> Self {
        let positive = |problems: &mut Problems, field: &'static str, value: Option<u64>| {
            let value = value?;
            if value == 0 {
                problems.add(field, "must be greater than 0");
                return None;
            }
            Some(value)
        };
        let period_ms = written.period.and_then(|text| {
            let ms = problems.check("period", parse_duration_ms(text))?;
            if ms == 0 {
                problems.add(
                    "period",
                    format_args!("must be greater than 0 (got {text:?})"),
                );
                return None;
            }
            Some(ms)
        });
        let rate = written
            .rate
            .and_then(|text| problems.check("rate", parse_rate(text)));
        let lease_ms = written.lease.and_then(|text| {
            let ms = problems.check("lease", parse_duration_ms(text))?;
            if ms == 0 {
                problems.add(
                    "lease",
                    format_args!("must be greater than 0 (got {text:?})"),
                );
                return None;
            }
            Some(ms)
        });
        // Checked only for the algorithm that takes it: another says it does not.
        let queue = written
            .queue
            .filter(|_| written.algorithm.trim() == "concurrency")
            .and_then(|queue| slot_queue(problems, &queue));
        Parsed {
            limit: positive(problems, "limit", written.limit),
            period_ms,
            rate,
            burst: positive(problems, "burst", written.burst),
            mode: leaky_mode(problems, written),
            max: positive(problems, "max", written.max),
            lease_ms,
            queue,
        }
    }
}

// === impl Problems ===

impl Problems {
    fn add(&mut self, field: &'static str, message: impl std::fmt::Display) {
        self.0.push(Problem {
            field,
            message: message.to_string(),
        });
    }

    /// The value, or `None` with the error recorded on `field`.
    fn check<T, E: std::fmt::Display>(
        &mut self,
        field: &'static str,
        result: Result<T, E>,
    ) -> Option<T> {
        result.map_err(|e| self.add(field, e)).ok()
    }
}
