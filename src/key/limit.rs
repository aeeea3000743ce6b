//! A limit with the key spec that keys it: one entry of a route's or a plan's `limits:`.

use super::KeySpec;
use crate::limiter::Limit;

/// A limit and how it keys requests (one entry of a route's `limits:`).
#[derive(Debug, Clone)]
pub struct LimitSettings {
    /// The validated limit (name, algorithm, cost).
    pub limit: Limit,
    /// How the limit keys requests.
    pub key: KeySpec,
    /// What the limit counts: requests, only the answers with some statuses, or the tokens answers report.
    pub counts: Counts,
}

// === impl LimitSettings ===

impl LimitSettings {
    /// `limit`, keyed as `key` says, counting requests.
    pub fn new(limit: Limit, key: KeySpec) -> Self {
        Self {
            limit,
            key,
            counts: Counts::Requests,
        }
    }

    /// The same limit counting what `counts` says.
    pub fn counting(mut self, counts: Counts) -> Self {
        self.counts = counts;
        self
    }
}

/// What a limit counts (`counts:`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Counts {
    /// Every request, `cost` each (the default).
    #[default]
    Requests,
    /// Only the answers whose status is in the set, `cost` each (failed logins: `{ status: [401, 403] }`). A
    /// request reserves its cost before it is forwarded, all-or-nothing with the other limits, and gets it back
    /// once its answer's status is known and not in the set.
    Status(StatusSet),
    /// The tokens the answers report they spent, of one kind (an LLM API's `usage`): a request reserves a bound
    /// before it is forwarded and settles to what its answer reported once it ends.
    Tokens(TokenKind),
}

/// Which tokens a limit counts (`counts: input_tokens | output_tokens | total_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Tokens read: the prompt.
    Input,
    /// Tokens written: the completion.
    Output,
    /// Both.
    Total,
}

/// A set of HTTP statuses: single codes and classes (`5xx`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusSet {
    /// Inclusive ranges of codes: `401` is `401..=401`, `5xx` is `500..=599`.
    ranges: Vec<(u16, u16)>,
}

// === impl Counts ===

impl Counts {
    /// The statuses counted, for a limit that counts answers by status.
    pub fn statuses(&self) -> Option<&StatusSet> {
        match self {
            Counts::Status(set) => Some(set),
            Counts::Requests | Counts::Tokens(_) => None,
        }
    }

    /// The tokens counted, for a limit that counts tokens.
    pub fn tokens(&self) -> Option<TokenKind> {
        match self {
            Counts::Tokens(kind) => Some(*kind),
            Counts::Requests | Counts::Status(_) => None,
        }
    }
}

// === impl TokenKind ===

impl TokenKind {
    /// Its name in the config (`counts:`) and in metrics (`kind`, without `_tokens`).
    pub fn name(self) -> &'static str {
        match self {
            TokenKind::Input => "input_tokens",
            TokenKind::Output => "output_tokens",
            TokenKind::Total => "total_tokens",
        }
    }

    /// The kind a `counts:` name names.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "input_tokens" => Some(TokenKind::Input),
            "output_tokens" => Some(TokenKind::Output),
            "total_tokens" => Some(TokenKind::Total),
            _ => None,
        }
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Counts::Requests => f.write_str("requests"),
            Counts::Status(set) => write!(f, "answers with status {set}"),
            Counts::Tokens(kind) => f.write_str(kind.name()),
        }
    }
}

// === impl StatusSet ===

impl StatusSet {
    /// Adds the statuses `text` names: a code from 100 to 599 (`401`) or a class (`4xx`, `5XX`). `None` for
    /// anything else.
    pub fn add(&mut self, text: &str) -> Option<()> {
        let range = match text.as_bytes() {
            [class @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                let start = u16::from(class - b'0') * 100;
                (start, start + 99)
            }
            [b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => {
                let code = text.parse().ok()?;
                (code, code)
            }
            _ => return None,
        };
        self.ranges.push(range);
        Some(())
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: u16) -> bool {
        self.ranges
            .iter()
            .any(|&(low, high)| (low..=high).contains(&status))
    }

    /// Whether the set names no status.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl std::fmt::Display for StatusSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &(low, high)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if low == high {
                write!(f, "{low}")?;
            } else {
                write!(f, "{}xx", low / 100)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::StatusSet;

    #[test]
    fn codes_and_classes_are_read_and_anything_else_refused() {
        let mut set = StatusSet::default();
        for text in ["401", "403", "5xx"] {
            assert_eq!(set.add(text), Some(()), "{text}");
        }
        assert!(set.contains(401) && set.contains(403) && set.contains(500) && set.contains(599));
        assert!(
            !set.contains(400) && !set.contains(404) && !set.contains(200) && !set.contains(600)
        );
        assert_eq!(set.to_string(), "401, 403, 5xx");
        for bad in [
            "", "40", "4011", "600", "099", "6xx", "4x", "abc", " 401", "4xy",
        ] {
            assert_eq!(StatusSet::default().add(bad), None, "{bad:?}");
        }
    }
}
