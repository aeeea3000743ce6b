//! What an answer says it cost: the token counts of a `usage` object (OpenAI chat completions, OpenAI Responses,
//! Anthropic messages) or a number in a header, and how several reports in one stream add up.

use std::fmt;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer as _};
use serde_json::value::RawValue;

/// The tokens an answer reported it spent; `None` where it said nothing of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens read: OpenAI's `prompt_tokens` / `input_tokens` (cached tokens included, as OpenAI counts them);
    /// Anthropic's `input_tokens` plus `cache_creation_input_tokens` and `cache_read_input_tokens`.
    pub input_tokens: Option<u64>,
    /// Tokens written: `completion_tokens` / `output_tokens` (reasoning tokens included, as both APIs count them).
    pub output_tokens: Option<u64>,
    /// `total_tokens` as reported, else input + output when both are known. A `header:` format's number.
    pub total_tokens: Option<u64>,
}

/// Which API's field meanings apply to a `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI chat completions and Responses (and the many servers that copy them): cached tokens are already
    /// part of `prompt_tokens` / `input_tokens`.
    OpenAi,
    /// Anthropic messages: `input_tokens` leaves out the cached prompt, reported beside it.
    Anthropic,
}

/// The fields of the `usage` objects read so far from one answer, each the latest value reported: Anthropic's
/// stream reports input in `message_start` and the cumulative output in every `message_delta`, so a later object
/// refines the earlier ones field by field rather than replacing them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reported {
    input: Option<u64>,
    output: Option<u64>,
    total: Option<u64>,
    cache_creation: Option<u64>,
    cache_read: Option<u64>,
    /// A count was not a number tollgate trusts (see [`MAX_COUNT`]): the answer's usage is unknown, whatever its
    /// other counts say.
    untrusted: bool,
}

/// Counts are trusted below 2^53: every JSON reader holds them exactly there (JavaScript's and Lua's numbers are
/// doubles), and no answer spends that many tokens. A larger one would wrap or round on its way to a limit.
pub const MAX_COUNT: u64 = 1 << 53;

/// One count member as read: absent (or `null`), a trusted number, or anything else.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Count {
    #[default]
    Absent,
    Trusted(u64),
    Untrusted,
}

/// The members of a `usage` object that hold counts (their index in [`CountsVisitor`]'s answer); the others are
/// skipped unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Member {
    InputTokens,
    PromptTokens,
    OutputTokens,
    CompletionTokens,
    TotalTokens,
    CacheCreationInputTokens,
    CacheReadInputTokens,
    #[serde(other)]
    Other,
}

/// Reads a JSON object into the count of each [`Member`]: the last one named wins, as a JSON reader's map keeps
/// it; `null` is not reported, and a value that is not a whole number below [`MAX_COUNT`] is untrusted.
struct CountsVisitor;

// === impl Usage ===

impl Usage {
    /// Nothing reported.
    pub const MISSING: Usage = Usage {
        input_tokens: None,
        output_tokens: None,
        total_tokens: None,
    };

    /// One number, as a `header:` format reports it: counted as the total.
    pub fn total(tokens: u64) -> Self {
        Self {
            total_tokens: Some(tokens),
            ..Self::MISSING
        }
    }

    /// Whether the answer reported nothing at all.
    pub fn is_missing(&self) -> bool {
        *self == Self::MISSING
    }
}

// === impl Reported ===

impl Reported {
    /// The counts of one `usage` object given as JSON text; `None` when it is not a JSON object. A count that is not
    /// a whole number below [`MAX_COUNT`] (negative, fractional, a string, huge) makes the whole report untrusted.
    pub(crate) fn parse(object: &[u8]) -> Option<Self> {
        // Read member by member rather than into a `serde_json::Map`, which would allocate every key and hash it
        // to be looked up seven times: this runs once per answer (per event of a stream) on a token route.
        let mut deserializer = serde_json::Deserializer::from_slice(object);
        let counts = deserializer.deserialize_map(CountsVisitor).ok()?;
        deserializer.end().ok()?;
        let count = |member: Member| match counts[member as usize] {
            Count::Trusted(count) => Some(count),
            Count::Absent | Count::Untrusted => None,
        };
        Some(Self {
            untrusted: counts.contains(&Count::Untrusted),
            input: count(Member::InputTokens).or(count(Member::PromptTokens)),
            output: count(Member::OutputTokens).or(count(Member::CompletionTokens)),
            total: count(Member::TotalTokens),
            cache_creation: count(Member::CacheCreationInputTokens),
            cache_read: count(Member::CacheReadInputTokens),
        })
    }

    /// `later`'s fields over these.
    pub(crate) fn merge(&mut self, later: Reported) {
        fn over(field: &mut Option<u64>, later: Option<u64>) {
            if later.is_some() {
                *field = later;
            }
        }
        over(&mut self.input, later.input);
        over(&mut self.output, later.output);
        over(&mut self.total, later.total);
        over(&mut self.cache_creation, later.cache_creation);
        over(&mut self.cache_read, later.cache_read);
        self.untrusted |= later.untrusted;
    }

    /// What these fields mean in `dialect`: nothing known ([`Usage::MISSING`]) when a count was untrusted, or a
    /// sum of them reaches [`MAX_COUNT`].
    pub(crate) fn usage(&self, dialect: Dialect) -> Usage {
        if self.untrusted {
            return Usage::MISSING;
        }
        let input = match dialect {
            Dialect::OpenAi => self.input,
            Dialect::Anthropic => [self.input, self.cache_creation, self.cache_read]
                .into_iter()
                .flatten()
                .reduce(u64::saturating_add),
        };
        let total = self
            .total
            .or_else(|| Some(input?.saturating_add(self.output?)));
        let usage = Usage {
            input_tokens: input,
            output_tokens: self.output,
            total_tokens: total,
        };
        let counts = [usage.input_tokens, usage.output_tokens, usage.total_tokens];
        if counts.into_iter().flatten().any(|count| count >= MAX_COUNT) {
            return Usage::MISSING;
        }
        usage
    }
}

// === impl CountsVisitor ===

impl<'de> Visitor<'de> for CountsVisitor {
    type Value = [Count; Member::Other as usize];

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut counts = [Count::Absent; Member::Other as usize];
        while let Some(member) = map.next_key::<Member>()? {
            if member == Member::Other {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value: &RawValue = map.next_value()?;
            counts[member as usize] = match serde_json::from_str::<Option<u64>>(value.get()) {
                Ok(None) => Count::Absent,
                Ok(Some(count)) if count < MAX_COUNT => Count::Trusted(count),
                Ok(Some(_)) | Err(_) => Count::Untrusted,
            };
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(dialect: Dialect, objects: &[&str]) -> Usage {
        let mut reported = Reported::default();
        for object in objects {
            reported.merge(Reported::parse(object.as_bytes()).expect("a JSON object"));
        }
        reported.usage(dialect)
    }

    #[test]
    fn openai_chat_completions_usage_reads_prompt_and_completion() {
        let read = usage(
            Dialect::OpenAi,
            &[
                r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,
                "prompt_tokens_details":{"cached_tokens":5},"completion_tokens_details":{"reasoning_tokens":3}}"#,
            ],
        );
        assert_eq!(
            read,
            Usage {
                input_tokens: Some(19),
                output_tokens: Some(10),
                total_tokens: Some(29)
            }
        );
    }

    #[test]
    fn openai_responses_usage_reads_input_and_output() {
        let read = usage(
            Dialect::OpenAi,
            &[
                r#"{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,
                "output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}"#,
            ],
        );
        assert_eq!(read.input_tokens, Some(36));
        assert_eq!(read.output_tokens, Some(87));
        assert_eq!(read.total_tokens, Some(123));
    }

    #[test]
    fn anthropic_cached_input_counts_as_input_and_total_is_the_sum() {
        let read = usage(
            Dialect::Anthropic,
            &[
                r#"{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":3000,"output_tokens":1}"#,
            ],
        );
        assert_eq!(
            read,
            Usage {
                input_tokens: Some(3210),
                output_tokens: Some(1),
                total_tokens: Some(3211)
            }
        );
    }

    #[test]
    fn openai_dialect_ignores_cache_fields_a_relay_adds_beside_prompt_tokens() {
        // Relays that speak OpenAI for other providers' models add Anthropic's cache fields, already included in
        // prompt_tokens: counting them again would charge the cached prompt twice.
        let read = usage(
            Dialect::OpenAi,
            &[r#"{"prompt_tokens":100,"completion_tokens":5,"cache_read_input_tokens":90}"#],
        );
        assert_eq!(read.input_tokens, Some(100));
        assert_eq!(read.total_tokens, Some(105));
    }

    #[test]
    fn a_later_report_refines_fields_and_keeps_the_rest() {
        let read = usage(
            Dialect::Anthropic,
            &[
                r#"{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}"#,
                r#"{"output_tokens":15}"#,
                r#"{"output_tokens":40}"#,
            ],
        );
        assert_eq!(read.input_tokens, Some(30));
        assert_eq!(read.output_tokens, Some(40));
        assert_eq!(read.total_tokens, Some(70));
    }

    #[test]
    fn a_count_that_is_not_a_whole_number_below_2_53_makes_the_report_unknown() {
        for count in [
            "-1",
            "2.5",
            "\"9\"",
            "9007199254740992",
            "18446744073709461616",
            "1e3",
            "true",
            "{}",
        ] {
            let object =
                format!(r#"{{"prompt_tokens":10,"completion_tokens":{count},"total_tokens":20}}"#);
            assert!(usage(Dialect::OpenAi, &[&object]).is_missing(), "{count}");
        }
        // Sticky over a stream: a later good report does not make an untrusted answer trusted.
        let read = usage(
            Dialect::Anthropic,
            &[r#"{"input_tokens":-5}"#, r#"{"output_tokens":40}"#],
        );
        assert!(read.is_missing());
        // null is not reported; the largest trusted count is 2^53 - 1.
        let read = usage(
            Dialect::OpenAi,
            &[r#"{"prompt_tokens":9007199254740991,"completion_tokens":null}"#],
        );
        assert_eq!(read.input_tokens, Some(9_007_199_254_740_991));
        assert_eq!(read.output_tokens, None);
        assert_eq!(Reported::parse(b"[1,2]"), None);
        assert_eq!(Reported::parse(b"null"), None);
    }

    #[test]
    fn a_member_named_twice_counts_as_its_last_value_and_escaped_names_as_they_decode() {
        // As a JSON reader that keeps the last of repeated keys reads it (the clients of the answer do).
        let read = usage(
            Dialect::OpenAi,
            &[
                r#"{"prompt_tokens":1,"prompt_tokens":7,"completion_tokens":"x","completion_tokens":2,"total_\u0074okens":9}"#,
            ],
        );
        assert_eq!(read.input_tokens, Some(7));
        assert_eq!(read.output_tokens, Some(2));
        assert_eq!(read.total_tokens, Some(9));
        assert_eq!(Reported::parse(br#"{"prompt_tokens":1} trailing"#), None);
    }

    #[test]
    fn a_total_needs_both_halves_when_not_reported() {
        let read = usage(Dialect::Anthropic, &[r#"{"input_tokens":25}"#]);
        assert_eq!(read.input_tokens, Some(25));
        assert_eq!(read.total_tokens, None);
    }

    #[test]
    fn sums_reaching_2_53_are_unknown_rather_than_rounded_or_wrapped() {
        let read = usage(
            Dialect::Anthropic,
            &[r#"{"input_tokens":9007199254740991,"cache_read_input_tokens":1,"output_tokens":1}"#],
        );
        assert!(read.is_missing());
        let read = usage(
            Dialect::OpenAi,
            &[r#"{"prompt_tokens":9007199254740990,"completion_tokens":5}"#],
        );
        assert!(read.is_missing());
    }
}
