//! Where each field of the YAML text is: an index from field paths (`routes[1].limits[0].period`) to line and column.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// A 1-based line and column (in characters) of a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

/// Finds the position of a field path in one YAML text.
///
/// Built from yaml-rust2's marked events rather than from the serde parse, because serde forgets positions as soon
/// as a value is deserialized, and validation runs later on plain structs.
#[derive(Debug, Default)]
pub(crate) struct Locator {
    positions: HashMap<String, Position>,
}

/// One open mapping or sequence while walking the events.
#[derive(Debug)]
enum Frame {
    Mapping {
        path: String,
        /// The path of the value being read, once its key has been seen.
        value_path: Option<String>,
    },
    Sequence {
        path: String,
        next_index: usize,
    },
}

/// Turns the event stream into the path index.
#[derive(Debug, Default)]
struct Indexer {
    stack: Vec<Frame>,
    positions: HashMap<String, Position>,
}

// === impl Position ===

impl Position {
    /// The first character of a text.
    pub const START: Position = Position { line: 1, column: 1 };

    /// The position just after `text`, read from here.
    pub(crate) fn advanced_over(mut self, text: &str) -> Position {
        for c in text.chars() {
            if c == '\n' {
                self.line += 1;
                self.column = 1;
            } else {
                self.column += 1;
            }
        }
        self
    }
}

impl From<Marker> for Position {
    fn from(mark: Marker) -> Self {
        // yaml-rust2 counts lines from 1 but columns from 0.
        Position {
            line: mark.line(),
            column: mark.col() + 1,
        }
    }
}

// === impl Locator ===

impl Locator {
    /// Indexes `text`. A YAML syntax error only ends the index early: the serde parse reports it.
    pub(crate) fn new(text: &str) -> Self {
        let mut indexer = Indexer::default();
        let _ = Parser::new_from_str(text).load(&mut indexer, false);
        Locator {
            positions: indexer.positions,
        }
    }

    /// The position of `path`, or of its nearest ancestor present in the text (the file start for none).
    ///
    /// For a mapping entry that is the position of its key, for a sequence item the start of the item.
    pub(crate) fn locate(&self, path: &str) -> Position {
        let mut path = path;
        loop {
            if let Some(position) = self.positions.get(path) {
                return *position;
            }
            match parent(path) {
                Some(up) => path = up,
                None => return Position::START,
            }
        }
    }
}

/// `routes[1].limits` for `routes[1].limits[0]`, `routes[1]` for `routes[1].name`, `None` for the root.
fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    Some(&path[..cut])
}

// === impl Indexer ===

impl Indexer {
    /// The path of a node starting now, recording where it starts; `None` for a mapping key.
    fn enter_node(&mut self, event: &Event, position: Position) -> Option<String> {
        let path = match self.stack.last_mut() {
            None => String::new(),
            Some(Frame::Sequence { path, next_index }) => {
                let item = format!("{path}[{next_index}]");
                *next_index += 1;
                item
            }
            Some(Frame::Mapping { value_path, path }) => match value_path.take() {
                // The value's location is its key's, already recorded.
                Some(value) => return Some(value),
                None => {
                    let key = match event {
                        Event::Scalar(key, ..) => key.as_str(),
                        // Complex keys do not occur in a config; their values stay unindexed.
                        _ => "?",
                    };
                    // A block mapping's start event is marked at its first `:`; its first key is where it starts.
                    if let Some(start) = self.positions.get_mut(path.as_str()) {
                        *start = (*start).min(position);
                    }
                    let value = if path.is_empty() {
                        key.to_owned()
                    } else {
                        format!("{path}.{key}")
                    };
                    self.positions.entry(value.clone()).or_insert(position);
                    *value_path = Some(value);
                    return None;
                }
            },
        };
        self.positions.entry(path.clone()).or_insert(position);
        Some(path)
    }
}

impl MarkedEventReceiver for Indexer {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let position = Position::from(mark);
        match event {
            Event::Scalar(..) | Event::Alias(..) => {
                self.enter_node(&event, position);
            }
            Event::MappingStart(..) => {
                if let Some(path) = self.enter_node(&event, position) {
                    self.stack.push(Frame::Mapping {
                        path,
                        value_path: None,
                    });
                }
            }
            Event::SequenceStart(..) => {
                if let Some(path) = self.enter_node(&event, position) {
                    self.stack.push(Frame::Sequence {
                        path,
                        next_index: 0,
                    });
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
listen: 0.0.0.0:8080
store:
  timeout: 25ms
upstreams:
  api:
    targets: [\"http://a:1\", \"http://b:2\"]
routes:
  - name: one
    limits:
      - name: x
        period: 1m
";

    fn at(line: usize, column: usize) -> Position {
        Position { line, column }
    }

    #[test]
    fn mapping_entries_point_at_their_key() {
        let locator = Locator::new(TEXT);
        assert_eq!(locator.locate("store.timeout"), at(3, 3));
        assert_eq!(locator.locate("routes[0].limits[0].period"), at(11, 9));
    }

    #[test]
    fn sequence_items_point_at_their_start() {
        let locator = Locator::new(TEXT);
        assert_eq!(locator.locate("upstreams.api.targets[1]"), at(6, 29));
        assert_eq!(locator.locate("routes[0].limits[0]"), at(10, 9));
    }

    #[test]
    fn missing_fields_fall_back_to_the_nearest_ancestor() {
        let locator = Locator::new(TEXT);
        assert_eq!(locator.locate("routes[0].limits[0].rate"), at(10, 9));
        assert_eq!(locator.locate("routes[5].name"), at(7, 1));
        assert_eq!(locator.locate("admin.token"), Position::START);
    }
}
