//! `${VAR}` and `${VAR:-default}` replaced from the environment in the raw config text, before YAML parsing.

use super::locate::Position;

/// The text after replacement, with the way back to positions of the original text.
#[derive(Debug)]
pub(crate) struct Interpolated {
    /// The text to parse.
    pub text: String,
    /// Where its positions come from in the original text.
    pub map: PositionMap,
}

/// A problem found while replacing, at its position in the original text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InterpolationError {
    pub position: Position,
    pub message: String,
}

/// Maps positions of the replaced text back to the original, so that messages name the line and column the user
/// sees in their file even when a value is longer or shorter than its placeholder.
#[derive(Debug, Default)]
pub(crate) struct PositionMap {
    /// In text order.
    replacements: Vec<Replacement>,
}

/// One placeholder (or escape) and what replaced it.
#[derive(Debug, Clone, Copy)]
struct Replacement {
    /// Span of the replacement in the output, end exclusive.
    out_start: Position,
    out_end: Position,
    /// Span of the placeholder in the original text, end exclusive.
    src_start: Position,
    src_end: Position,
}

/// A `${...}` found in the text.
#[derive(Debug)]
struct Placeholder<'a> {
    /// Everything from `${` to `}` inclusive.
    whole: &'a str,
    name: &'a str,
    default: Option<&'a str>,
}

/// Builds the output while tracking positions on both sides.
#[derive(Debug)]
struct Writer {
    out: String,
    out_pos: Position,
    src_pos: Position,
    map: PositionMap,
}

// === impl PositionMap ===

impl PositionMap {
    /// The position in the original text of `position` in the replaced text. A position inside a replaced value
    /// maps to the start of its placeholder.
    pub(crate) fn to_source(&self, position: Position) -> Position {
        let Some(last) = self
            .replacements
            .iter()
            .take_while(|r| r.out_start <= position)
            .last()
        else {
            return position;
        };
        if position < last.out_end {
            return last.src_start;
        }
        if position.line == last.out_end.line {
            Position {
                line: last.src_end.line,
                column: last.src_end.column + (position.column - last.out_end.column),
            }
        } else {
            Position {
                line: last.src_end.line + (position.line - last.out_end.line),
                column: position.column,
            }
        }
    }
}

// === impl Writer ===

impl Writer {
    fn new() -> Self {
        Writer {
            out: String::new(),
            out_pos: Position::START,
            src_pos: Position::START,
            map: PositionMap::default(),
        }
    }

    /// Copies text unchanged.
    fn copy(&mut self, text: &str) {
        self.out.push_str(text);
        self.out_pos = self.out_pos.advanced_over(text);
        self.src_pos = self.src_pos.advanced_over(text);
    }

    /// Writes `value` in place of `source`.
    fn replace(&mut self, source: &str, value: &str) {
        let out_start = self.out_pos;
        let src_start = self.src_pos;
        self.out.push_str(value);
        self.out_pos = self.out_pos.advanced_over(value);
        self.src_pos = self.src_pos.advanced_over(source);
        self.map.replacements.push(Replacement {
            out_start,
            out_end: self.out_pos,
            src_start,
            src_end: self.src_pos,
        });
    }

    fn finish(self) -> Interpolated {
        Interpolated {
            text: self.out,
            map: self.map,
        }
    }
}

/// Replaces every `${VAR}` / `${VAR:-default}` of `text`, looking variables up with `lookup`.
///
/// `${VAR}` needs `VAR` to be set (an empty value is kept); `${VAR:-default}` takes `default` when `VAR` is unset
/// or empty; `$${` writes a literal `${`. Every problem of the text is reported, not only the first.
///
/// Replacement happens on the text, so it works in any scalar, and in comments too. A value is inserted as
/// written: quote the placeholder (`"${TOKEN}"`) when the value may hold YAML syntax.
pub(crate) fn interpolate(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Interpolated, Vec<InterpolationError>> {
    let mut writer = Writer::new();
    let mut errors = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let (before, from) = rest.split_at(start);
        if let Some(literal) = before.strip_suffix('$') {
            writer.copy(literal);
            writer.replace("$${", "${");
            rest = &from[2..];
            continue;
        }
        writer.copy(before);
        let Some(placeholder) = Placeholder::parse(from) else {
            errors.push(InterpolationError {
                position: writer.src_pos,
                message: "unterminated ${ (close it with } on the same line, or write $${ for a literal ${)"
                    .to_owned(),
            });
            writer.copy(&from[..2]);
            rest = &from[2..];
            continue;
        };
        match placeholder.value(lookup) {
            Ok(value) => writer.replace(placeholder.whole, &value),
            Err(message) => {
                errors.push(InterpolationError {
                    position: writer.src_pos,
                    message,
                });
                writer.replace(placeholder.whole, "");
            }
        }
        rest = &from[placeholder.whole.len()..];
    }
    writer.copy(rest);
    if errors.is_empty() {
        Ok(writer.finish())
    } else {
        Err(errors)
    }
}

// === impl Placeholder ===

impl<'a> Placeholder<'a> {
    /// Reads the placeholder at the start of `from` (which starts with `${`); `None` when it is not closed on its
    /// line, which keeps a stray `${` from swallowing the rest of the file.
    fn parse(from: &'a str) -> Option<Self> {
        let line = from.split('\n').next().unwrap_or(from);
        let close = line.find('}')?;
        let inner = &from[2..close];
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        Some(Placeholder {
            whole: &from[..=close],
            name,
            default,
        })
    }

    fn value(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
        if !is_variable_name(self.name) {
            return Err(format!(
                "invalid environment variable name {:?} in {} (use letters, digits and _, not starting with a digit)",
                self.name, self.whole
            ));
        }
        match (lookup(self.name), self.default) {
            (Some(value), None) => Ok(value),
            (Some(value), Some(_)) if !value.is_empty() => Ok(value),
            (_, Some(default)) => Ok(default.to_owned()),
            (None, None) => Err(format!(
                "environment variable {name} is not set (write ${{{name}:-default}} to give a default)",
                name = self.name
            )),
        }
    }
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
// A failed unwrap is a failed test, with the value in the message.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("redis.internal".to_owned()),
            "EMPTY" => Some(String::new()),
            "LONG" => Some("a-much-longer-value".to_owned()),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<String, Vec<InterpolationError>> {
        interpolate(text, &env).map(|i| i.text)
    }

    fn at(line: usize, column: usize) -> Position {
        Position { line, column }
    }

    #[test]
    fn replaces_set_variables_and_defaults() {
        assert_eq!(
            run("url: redis://${HOST}:6379").unwrap(),
            "url: redis://redis.internal:6379"
        );
        assert_eq!(run("a: ${NOPE:-fallback}").unwrap(), "a: fallback");
        assert_eq!(run("a: \"${NOPE:-}\"").unwrap(), "a: \"\"");
        // The default also replaces a variable that is set but empty...
        assert_eq!(run("a: ${EMPTY:-x}").unwrap(), "a: x");
        // ...while without a default, set-but-empty stays empty.
        assert_eq!(run("a: '${EMPTY}'").unwrap(), "a: ''");
        assert_eq!(run("a: ${HOST:-x}").unwrap(), "a: redis.internal");
        assert_eq!(
            run("u: ${NOPE:-redis://127.0.0.1:6379}").unwrap(),
            "u: redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn double_dollar_escapes_a_literal_placeholder() {
        assert_eq!(
            run("a: $${HOST} ${HOST}").unwrap(),
            "a: ${HOST} redis.internal"
        );
        assert_eq!(run("a: $5 and $ alone").unwrap(), "a: $5 and $ alone");
    }

    #[test]
    fn unset_variables_are_all_reported_with_their_position() {
        let errors = run("a: 1\nb: ${MISSING}\nc:   ${OTHER}\n").unwrap_err();
        assert_eq!(
            errors,
            vec![
                InterpolationError {
                    position: at(2, 4),
                    message: "environment variable MISSING is not set (write ${MISSING:-default} to give a default)"
                        .to_owned(),
                },
                InterpolationError {
                    position: at(3, 6),
                    message: "environment variable OTHER is not set (write ${OTHER:-default} to give a default)"
                        .to_owned(),
                },
            ]
        );
    }

    #[test]
    fn malformed_placeholders_are_errors() {
        let errors = run("a: ${1BAD}\nb: ${OPEN\nc: }").unwrap_err();
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].position, at(1, 4));
        assert!(errors[0]
            .message
            .contains("invalid environment variable name \"1BAD\""));
        assert_eq!(errors[1].position, at(2, 4));
        assert!(errors[1].message.starts_with("unterminated ${"));
    }

    #[test]
    fn positions_map_back_to_the_original_text() {
        let text = "a: ${HOST} b: x\nc: $${\n${LONG}\nd: 1";
        let result = interpolate(text, &env).unwrap();
        assert_eq!(
            result.text,
            "a: redis.internal b: x\nc: ${\na-much-longer-value\nd: 1"
        );
        let map = &result.map;
        // `b` after the longer value, inside the value, the escape, a later line.
        assert_eq!(map.to_source(at(1, 19)), at(1, 12));
        assert_eq!(map.to_source(at(1, 8)), at(1, 4));
        assert_eq!(map.to_source(at(2, 5)), at(2, 4));
        assert_eq!(map.to_source(at(3, 5)), at(3, 1));
        assert_eq!(map.to_source(at(4, 1)), at(4, 1));
        assert_eq!(map.to_source(at(1, 1)), at(1, 1));
    }
}
