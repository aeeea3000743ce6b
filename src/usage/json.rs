//! Finds the `usage` object of a JSON document read piece by piece: it holds that object only (capped), never the
//! document, and keeps no more state than the nesting depth, whatever the document's size.

use memchr::memchr2;

use super::reported::Reported;

/// A `usage` object larger than this is not a usage report (OpenAI's, with its details, is a few hundred bytes):
/// it is skipped rather than held.
pub(crate) const MAX_USAGE_BYTES: usize = 16 * 1024;

/// Keys are compared only against short names; a longer key is none of them.
const KEY_BYTES: usize = 24;

/// Where a `usage` object is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Places {
    /// `usage` in the top-level object: a whole answer's body, an OpenAI chat chunk, Anthropic's `message_delta`.
    Top,
    /// Also `message.usage` (Anthropic's `message_start`) and `response.usage` (the Responses API's
    /// `response.completed`), as server-sent events carry them.
    TopAndNested,
}

/// What the value after the last key read at the current depth is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Nothing,
    /// A `usage` object, if it is an object.
    Usage,
    /// An object that may hold a `usage` (`message`, `response`).
    Parent,
}

/// The scanner of one JSON document. It reads any bytes (a body that is not JSON finds nothing) and is reset for
/// the next document.
#[derive(Debug)]
pub(crate) struct UsageScanner {
    places: Places,
    /// How many containers are open.
    depth: u32,
    /// Bit `d - 1`: the container at depth `d` is an object (only depths 1 and 2 matter: keys are read there).
    objects: u8,
    in_string: bool,
    escaped: bool,
    /// The next string at this depth is a key (the container is an object, after `{` or `,`).
    expect_key: bool,
    /// A key at depth 1 or 2 is being read into `key`.
    reading_key: bool,
    key: [u8; KEY_BYTES],
    key_len: usize,
    key_long: bool,
    slot: Slot,
    /// The object at depth 2 is the value of `message` / `response`.
    in_parent: bool,
    /// Inside a `usage` object, which is at this depth.
    capture_depth: Option<u32>,
    capture: Vec<u8>,
    capture_long: bool,
    /// The last `usage` object closed in this document.
    found: Option<Reported>,
}

// === impl UsageScanner ===

impl UsageScanner {
    pub(crate) fn new(places: Places) -> Self {
        Self {
            places,
            depth: 0,
            objects: 0,
            in_string: false,
            escaped: false,
            expect_key: false,
            reading_key: false,
            key: [0; KEY_BYTES],
            key_len: 0,
            key_long: false,
            slot: Slot::Nothing,
            in_parent: false,
            capture_depth: None,
            capture: Vec::new(),
            capture_long: false,
            found: None,
        }
    }

    /// Ready for the next document (the capture buffer's memory is kept for it).
    pub(crate) fn reset(&mut self) {
        let capture = std::mem::take(&mut self.capture);
        *self = Self {
            capture,
            ..Self::new(self.places)
        };
        self.capture.clear();
    }

    /// The last `usage` object the document closed so far, taken.
    pub(crate) fn take_found(&mut self) -> Option<Reported> {
        self.found.take()
    }

    /// The document's next bytes.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        // Where the usage object's bytes start in this piece, while inside one.
        let mut capture_from = self.capture_depth.map(|_| 0);
        let mut i = 0;
        while i < bytes.len() {
            if self.in_string {
                i = self.string_bytes(bytes, i);
                continue;
            }
            match bytes[i] {
                b'"' => {
                    self.in_string = true;
                    if self.expect_key
                        && self.capture_depth.is_none()
                        && (1..=2).contains(&self.depth)
                    {
                        self.reading_key = true;
                        self.key_len = 0;
                        self.key_long = false;
                    }
                }
                open @ (b'{' | b'[') => {
                    if open == b'{' && self.capture_depth.is_none() && self.slot == Slot::Usage {
                        capture_from = Some(i);
                    }
                    self.open(open == b'{');
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if let Some(depth) = self.capture_depth {
                        if self.depth < depth {
                            let from = capture_from.take().unwrap_or(0);
                            self.capture_piece(&bytes[from..=i]);
                            self.capture_done();
                        }
                    }
                    self.expect_key = false;
                    self.slot = Slot::Nothing;
                }
                b',' => {
                    self.expect_key = self.in_object();
                    self.slot = Slot::Nothing;
                }
                _ => {}
            }
            i += 1;
        }
        if let Some(from) = capture_from {
            if self.capture_depth.is_some() {
                self.capture_piece(&bytes[from..]);
            }
        }
    }

    /// Reads on inside a string from `bytes[i]`: a key's bytes are kept when a key is being read; returns where
    /// reading goes on (past the closing quote, or the end of the piece).
    fn string_bytes(&mut self, bytes: &[u8], i: usize) -> usize {
        if self.escaped {
            self.escaped = false;
            self.key_byte(bytes[i]);
            return i + 1;
        }
        let Some(offset) = memchr2(b'"', b'\\', &bytes[i..]) else {
            self.key_bytes(&bytes[i..]);
            return bytes.len();
        };
        let at = i + offset;
        self.key_bytes(&bytes[i..at]);
        if bytes[at] == b'\\' {
            self.escaped = true;
            self.key_byte(b'\\');
        } else {
            self.in_string = false;
            if self.reading_key {
                self.reading_key = false;
                self.key_read();
            }
        }
        at + 1
    }

    /// An object (`object`) or an array opens: the usage object starts its capture, and the two levels the reader
    /// follows note which kind they are.
    fn open(&mut self, object: bool) {
        if object && self.capture_depth.is_none() && self.slot == Slot::Usage {
            self.capture_depth = Some(self.depth + 1);
            self.capture.clear();
            self.capture_long = false;
        }
        self.depth = self.depth.saturating_add(1);
        if (1..=2).contains(&self.depth) {
            let bit = 1 << (self.depth - 1);
            if object {
                self.objects |= bit;
            } else {
                self.objects &= !bit;
            }
        }
        if self.depth == 2 {
            self.in_parent = object && self.slot == Slot::Parent;
        }
        self.expect_key = object;
        self.slot = Slot::Nothing;
    }

    fn in_object(&self) -> bool {
        (1..=2).contains(&self.depth) && self.objects & (1 << (self.depth - 1)) != 0
    }

    fn key_byte(&mut self, byte: u8) {
        self.key_bytes(std::slice::from_ref(&byte));
    }

    fn key_bytes(&mut self, bytes: &[u8]) {
        if !self.reading_key || self.key_long {
            return;
        }
        match self.key.get_mut(self.key_len..self.key_len + bytes.len()) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.key_len += bytes.len();
            }
            None => self.key_long = true,
        }
    }

    /// A key at depth 1 or 2 ended: what does its value hold?
    fn key_read(&mut self) {
        self.expect_key = false;
        self.slot = Slot::Nothing;
        if self.key_long {
            return;
        }
        let raw = &self.key[..self.key_len];
        let mut decoded = [0u8; KEY_BYTES];
        let key: &[u8] = if raw.contains(&b'\\') {
            // An escaped key means what it decodes to, as the client of the answer reads it.
            let mut quoted = Vec::with_capacity(raw.len() + 2);
            quoted.push(b'"');
            quoted.extend_from_slice(raw);
            quoted.push(b'"');
            match serde_json::from_slice::<String>(&quoted) {
                Ok(text) if text.len() <= KEY_BYTES => {
                    decoded[..text.len()].copy_from_slice(text.as_bytes());
                    &decoded[..text.len()]
                }
                _ => return,
            }
        } else {
            raw
        };
        self.slot = match (self.depth, key) {
            (1, b"usage") => Slot::Usage,
            (1, b"message" | b"response") if self.places == Places::TopAndNested => Slot::Parent,
            (2, b"usage") if self.in_parent => Slot::Usage,
            _ => Slot::Nothing,
        };
    }

    fn capture_piece(&mut self, piece: &[u8]) {
        if self.capture_long {
            return;
        }
        if self.capture.len() + piece.len() > MAX_USAGE_BYTES {
            self.capture_long = true;
            self.capture.clear();
        } else {
            self.capture.extend_from_slice(piece);
        }
    }

    fn capture_done(&mut self) {
        self.capture_depth = None;
        if !self.capture_long {
            if let Some(reported) = Reported::parse(&self.capture) {
                self.found = Some(reported);
            }
        }
        self.capture.clear();
    }
}

/// `bytes` cut at each of `cuts` (sorted, at most its length): the pieces a body may arrive in, for the tests that
/// read every split as the whole.
#[cfg(test)]
pub(super) fn cut_at(bytes: &[u8], mut cuts: Vec<usize>) -> Vec<&[u8]> {
    cuts.sort_unstable();
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for cut in cuts {
        pieces.push(&bytes[from..cut]);
        from = cut;
    }
    pieces.push(&bytes[from..]);
    pieces
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::usage::reported::{Dialect, Usage};

    fn scan(places: Places, pieces: &[&[u8]]) -> Option<Usage> {
        let mut scanner = UsageScanner::new(places);
        for piece in pieces {
            scanner.feed(piece);
        }
        scanner
            .take_found()
            .map(|found| found.usage(Dialect::OpenAi))
    }

    fn whole(places: Places, text: &str) -> Option<Usage> {
        scan(places, &[text.as_bytes()])
    }

    const CHAT: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"{\"usage\":{\"prompt_tokens\":999}} \\\" }"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"completion_tokens_details":{"reasoning_tokens":0}},"system_fingerprint":null}"#;

    #[test]
    fn finds_the_top_level_usage_and_not_one_quoted_in_the_content() {
        let read = whole(Places::Top, CHAT).expect("usage found");
        assert_eq!(read.input_tokens, Some(19));
        assert_eq!(read.total_tokens, Some(29));
    }

    #[test]
    fn a_usage_deeper_than_its_places_is_not_the_answers() {
        let text =
            r#"{"choices":[{"usage":{"prompt_tokens":5}}],"data":{"usage":{"prompt_tokens":6}}}"#;
        assert_eq!(whole(Places::TopAndNested, text), None);
        let text = r#"{"message":{"content":[{"usage":{"input_tokens":5}}]}}"#;
        assert_eq!(whole(Places::TopAndNested, text), None);
    }

    #[test]
    fn message_and_response_usage_are_found_only_where_nested_places_are_looked_at() {
        let start = r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"output_tokens":1}}}"#;
        assert_eq!(whole(Places::Top, start), None);
        assert_eq!(
            whole(Places::TopAndNested, start).and_then(|u| u.input_tokens),
            Some(25)
        );
        let completed = r#"{"type":"response.completed","response":{"output":[{"type":"message","content":[]}],"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7}}}"#;
        assert_eq!(
            whole(Places::TopAndNested, completed).and_then(|u| u.total_tokens),
            Some(7)
        );
    }

    #[test]
    fn a_null_or_non_object_usage_finds_nothing() {
        assert_eq!(whole(Places::Top, r#"{"usage":null,"x":{"a":1}}"#), None);
        assert_eq!(whole(Places::Top, r#"{"usage":[{"a":1}]}"#), None);
        assert_eq!(whole(Places::Top, r#"{"usage":"{}"}"#), None);
    }

    #[test]
    fn the_last_usage_of_a_document_wins() {
        let text = r#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}"#;
        assert_eq!(
            whole(Places::Top, text).and_then(|u| u.input_tokens),
            Some(2)
        );
    }

    #[test]
    fn an_escaped_key_is_read_as_it_decodes() {
        let text = r#"{"us\u0061ge":{"prompt_tokens":7}}"#;
        assert_eq!(
            whole(Places::Top, text).and_then(|u| u.input_tokens),
            Some(7)
        );
        let text = r#"{"usage\"":{"prompt_tokens":7}}"#;
        assert_eq!(whole(Places::Top, text), None);
    }

    #[test]
    fn an_oversized_usage_object_is_skipped_not_held() {
        let padding = "x".repeat(MAX_USAGE_BYTES);
        let text = format!(r#"{{"usage":{{"pad":"{padding}","prompt_tokens":7}}}}"#);
        let mut scanner = UsageScanner::new(Places::Top);
        scanner.feed(text.as_bytes());
        assert_eq!(scanner.take_found(), None);
        assert!(scanner.capture.capacity() <= MAX_USAGE_BYTES);
    }

    #[test]
    fn garbage_and_deep_nesting_find_nothing_and_hold_nothing() {
        assert_eq!(whole(Places::Top, "[DONE]"), None);
        assert_eq!(whole(Places::Top, "}}}]]]\"usage\":{"), None);
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(whole(Places::Top, &deep), None);
        let mut scanner = UsageScanner::new(Places::Top);
        scanner.feed(&[b'{'; 10_000]);
        assert_eq!(scanner.capture.capacity(), 0);
    }

    proptest! {
        #[test]
        fn any_split_of_a_document_reads_as_the_whole(cuts in proptest::collection::vec(0..CHAT.len(), 0..8)) {
            let pieces = cut_at(CHAT.as_bytes(), cuts);
            prop_assert_eq!(scan(Places::Top, &pieces), whole(Places::Top, CHAT));
        }

        #[test]
        fn any_generated_document_reads_usage_as_serde_does(
            value in json_value(3),
            tokens in 0u64..1_000_000,
            before in any::<bool>(),
        ) {
            // The usage placed among generated values (which may hold their own deeper `usage` keys).
            let other = serde_json::to_string(&value).expect("serializable");
            let usage = format!(r#""usage":{{"prompt_tokens":{tokens}}}"#);
            let text = if before {
                format!(r#"{{{usage},"other":{other}}}"#)
            } else {
                format!(r#"{{"other":{other},{usage}}}"#)
            };
            let read = whole(Places::Top, &text).and_then(|u| u.input_tokens);
            prop_assert_eq!(read, Some(tokens));
        }
    }

    fn json_value(depth: u32) -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z\"\\\\{}\\[\\],: ]{0,12}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(depth, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::vec(("(usage|[a-z\"{}]{0,6})", inner), 0..4).prop_map(
                    |entries| { serde_json::Value::Object(entries.into_iter().collect()) }
                ),
            ]
        })
    }
}
