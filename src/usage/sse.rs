//! A server-sent events parser fed the stream in whatever pieces it arrives: events split anywhere (inside a field
//! name, a CRLF, a BOM), CRLF / LF / CR line ends, comments, multi-line `data`, a last event with no blank line
//! after it. It holds no event: field values go to a sink as they arrive, so its memory is a few bytes per stream.

use memchr::{memchr2, memchr3};

/// The UTF-8 byte order mark a stream may start with (and which is not part of its first field's name).
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// Field names are compared only against `data` and `event`.
const NAME_BYTES: usize = 5;

/// What the parser finds, as it finds it.
pub(crate) trait SseSink {
    /// A piece of the current event's data: its `data` lines' values joined by LF, as a client reads `data`.
    fn data(&mut self, piece: &[u8]);

    /// An `event` line began: the event's type is what follows in [`SseSink::event_type`] (a later `event` line
    /// replaces an earlier one).
    fn event_type_start(&mut self) {}

    /// A piece of the current `event` line's value.
    fn event_type(&mut self, piece: &[u8]) {
        let _ = piece;
    }

    /// A blank line or the end of the stream ended an event; `dispatched` is false when it had no `data` line
    /// (a client dispatches nothing then).
    fn end(&mut self, dispatched: bool);
}

/// Where in a line the parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The stream's first bytes, matched against the BOM so far.
    Bom(usize),
    LineStart,
    Name,
    /// After the colon: one space here is not part of the value.
    ValueStart,
    Value,
    Comment,
}

/// The field of the current line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Data,
    Event,
    /// `id`, `retry`, or a field clients ignore.
    Other,
}

/// One stream's parser.
#[derive(Debug)]
pub(crate) struct SseParser {
    state: State,
    /// The last byte was a CR: an LF right after it is the same line end, even in the next piece.
    after_cr: bool,
    name: [u8; NAME_BYTES],
    name_len: usize,
    name_long: bool,
    field: Field,
    /// The current event has had a `data` line.
    has_data: bool,
}

// === impl SseParser ===

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    pub(crate) fn new() -> Self {
        Self {
            state: State::Bom(0),
            after_cr: false,
            name: [0; NAME_BYTES],
            name_len: 0,
            name_long: false,
            field: Field::Other,
            has_data: false,
        }
    }

    /// The stream's next bytes.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], sink: &mut impl SseSink) {
        while let Some(&first) = bytes.first() {
            if self.after_cr {
                self.after_cr = false;
                if first == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            match self.state {
                State::Bom(matched) => {
                    if first == BOM[matched] {
                        bytes = &bytes[1..];
                        self.state = if matched + 1 == BOM.len() {
                            State::LineStart
                        } else {
                            State::Bom(matched + 1)
                        };
                    } else if matched == 0 {
                        self.state = State::LineStart;
                    } else {
                        // A BOM cut short was the start of a field name, which is then none of ours.
                        self.start_name();
                        self.name_long = true;
                    }
                }
                State::LineStart => match first {
                    b'\r' | b'\n' => {
                        bytes = self.line_end(bytes);
                        self.blank_line(sink);
                    }
                    b':' => {
                        bytes = &bytes[1..];
                        self.state = State::Comment;
                    }
                    _ => self.start_name(),
                },
                State::Name => match memchr3(b':', b'\r', b'\n', bytes) {
                    None => {
                        self.name_piece(bytes);
                        bytes = &[];
                    }
                    Some(at) => {
                        self.name_piece(&bytes[..at]);
                        self.field = self.field_named();
                        if bytes[at] == b':' {
                            bytes = &bytes[at + 1..];
                            self.state = State::ValueStart;
                        } else {
                            // A line with no colon is a field with an empty value.
                            self.start_value(sink);
                            bytes = self.line_end(&bytes[at..]);
                        }
                    }
                },
                State::ValueStart => {
                    if first == b' ' {
                        bytes = &bytes[1..];
                    }
                    self.start_value(sink);
                }
                State::Value => match memchr2(b'\r', b'\n', bytes) {
                    None => {
                        self.value_piece(bytes, sink);
                        bytes = &[];
                    }
                    Some(at) => {
                        self.value_piece(&bytes[..at], sink);
                        bytes = self.line_end(&bytes[at..]);
                    }
                },
                State::Comment => match memchr2(b'\r', b'\n', bytes) {
                    None => bytes = &[],
                    Some(at) => bytes = self.line_end(&bytes[at..]),
                },
            }
        }
    }

    /// The stream ended: a line with no line end is still a line, and an event with no blank line after it is
    /// still dispatched (some servers end a stream so; clients that drop it would see no usage either way).
    pub(crate) fn finish(&mut self, sink: &mut impl SseSink) {
        match self.state {
            State::Name => {
                self.field = self.field_named();
                self.start_value(sink);
            }
            State::ValueStart => self.start_value(sink),
            State::Bom(_) | State::LineStart | State::Value | State::Comment => {}
        }
        self.state = State::LineStart;
        self.after_cr = false;
        if self.has_data {
            self.blank_line(sink);
        }
    }

    /// `bytes` starts with a CR or an LF: past it, and the line is over.
    fn line_end<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        self.after_cr = bytes[0] == b'\r';
        self.state = State::LineStart;
        &bytes[1..]
    }

    fn blank_line(&mut self, sink: &mut impl SseSink) {
        sink.end(self.has_data);
        self.has_data = false;
    }

    fn start_name(&mut self) {
        self.state = State::Name;
        self.name_len = 0;
        self.name_long = false;
    }

    fn name_piece(&mut self, piece: &[u8]) {
        if self.name_long {
            return;
        }
        match self
            .name
            .get_mut(self.name_len..self.name_len + piece.len())
        {
            Some(room) => {
                room.copy_from_slice(piece);
                self.name_len += piece.len();
            }
            None => self.name_long = true,
        }
    }

    fn field_named(&self) -> Field {
        match (self.name_long, &self.name[..self.name_len]) {
            (false, b"data") => Field::Data,
            (false, b"event") => Field::Event,
            _ => Field::Other,
        }
    }

    fn start_value(&mut self, sink: &mut impl SseSink) {
        self.state = State::Value;
        match self.field {
            Field::Data => {
                if self.has_data {
                    sink.data(b"\n");
                }
                self.has_data = true;
            }
            Field::Event => sink.event_type_start(),
            Field::Other => {}
        }
    }

    fn value_piece(&mut self, piece: &[u8], sink: &mut impl SseSink) {
        if piece.is_empty() {
            return;
        }
        match self.field {
            Field::Data => sink.data(piece),
            Field::Event => sink.event_type(piece),
            Field::Other => {}
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The events a client would dispatch: (type, data).
    #[derive(Debug, Default)]
    pub(crate) struct Recorder {
        pub(crate) events: Vec<(String, String)>,
        event_type: Vec<u8>,
        data: Vec<u8>,
    }

    impl SseSink for Recorder {
        fn data(&mut self, piece: &[u8]) {
            self.data.extend_from_slice(piece);
        }

        fn event_type_start(&mut self) {
            self.event_type.clear();
        }

        fn event_type(&mut self, piece: &[u8]) {
            self.event_type.extend_from_slice(piece);
        }

        fn end(&mut self, dispatched: bool) {
            if dispatched {
                let name = if self.event_type.is_empty() {
                    "message".to_owned()
                } else {
                    String::from_utf8_lossy(&self.event_type).into_owned()
                };
                self.events
                    .push((name, String::from_utf8_lossy(&self.data).into_owned()));
            }
            self.event_type.clear();
            self.data.clear();
        }
    }

    fn parse(pieces: &[&[u8]]) -> Vec<(String, String)> {
        let mut parser = SseParser::new();
        let mut recorder = Recorder::default();
        for piece in pieces {
            parser.feed(piece, &mut recorder);
        }
        parser.finish(&mut recorder);
        recorder.events
    }

    /// The WHATWG algorithm written the plain way, over the whole stream at once.
    fn reference(stream: &[u8]) -> Vec<(String, String)> {
        let stream = stream.strip_prefix(&BOM[..]).unwrap_or(stream);
        let mut lines = Vec::new();
        let mut line = Vec::new();
        let mut i = 0;
        while i < stream.len() {
            match stream[i] {
                b'\r' => {
                    lines.push(std::mem::take(&mut line));
                    if stream.get(i + 1) == Some(&b'\n') {
                        i += 1;
                    }
                }
                b'\n' => lines.push(std::mem::take(&mut line)),
                byte => line.push(byte),
            }
            i += 1;
        }
        if !line.is_empty() {
            lines.push(line);
        }
        let mut events = Vec::new();
        let (mut event_type, mut data, mut data_lines) = (Vec::new(), Vec::new(), 0);
        let mut dispatch =
            |event_type: &mut Vec<u8>, data: &mut Vec<u8>, data_lines: &mut usize| {
                if *data_lines > 0 {
                    let name = if event_type.is_empty() {
                        "message".to_owned()
                    } else {
                        String::from_utf8_lossy(event_type).into_owned()
                    };
                    events.push((name, String::from_utf8_lossy(data).into_owned()));
                }
                event_type.clear();
                data.clear();
                *data_lines = 0;
            };
        for line in &lines {
            if line.is_empty() {
                dispatch(&mut event_type, &mut data, &mut data_lines);
                continue;
            }
            if line[0] == b':' {
                continue;
            }
            let (name, value) = match line.iter().position(|&b| b == b':') {
                Some(at) => {
                    let value = &line[at + 1..];
                    (&line[..at], value.strip_prefix(b" ").unwrap_or(value))
                }
                None => (&line[..], &b""[..]),
            };
            match name {
                b"data" => {
                    if data_lines > 0 {
                        data.push(b'\n');
                    }
                    data_lines += 1;
                    data.extend_from_slice(value);
                }
                b"event" => event_type = value.to_vec(),
                _ => {}
            }
        }
        dispatch(&mut event_type, &mut data, &mut data_lines);
        events
    }

    #[test]
    fn events_with_every_line_end_and_comments() {
        let stream =
            b": hello\r\nevent: one\r\ndata: a\r\n\r\ndata:b\rdata:  c\r\r:x\ndata\nevent:two\n\n";
        assert_eq!(
            parse(&[stream]),
            vec![
                ("one".to_owned(), "a".to_owned()),
                ("message".to_owned(), "b\n c".to_owned()),
                ("two".to_owned(), String::new()),
            ]
        );
    }

    #[test]
    fn a_crlf_split_between_pieces_is_one_line_end() {
        let events = parse(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(events, vec![("message".to_owned(), "a\nb".to_owned())]);
    }

    #[test]
    fn an_event_without_data_dispatches_nothing() {
        assert_eq!(
            parse(&[b"event: ping\n\n: keep-alive\n\nid: 3\n\n"]),
            vec![]
        );
    }

    #[test]
    fn the_last_event_without_a_blank_line_is_dispatched_at_the_end() {
        assert_eq!(
            parse(&[b"data: {\"a\":1}"]),
            vec![("message".to_owned(), "{\"a\":1}".to_owned())]
        );
        assert_eq!(
            parse(&[b"data: x\n"]),
            vec![("message".to_owned(), "x".to_owned())]
        );
        assert_eq!(
            parse(&[b"data"]),
            vec![("message".to_owned(), String::new())]
        );
    }

    #[test]
    fn a_bom_is_skipped_once_and_a_bom_cut_short_is_a_field_name() {
        assert_eq!(
            parse(&[b"\xEF\xBB", b"\xBFdata: a\n\n"]),
            vec![("message".to_owned(), "a".to_owned())]
        );
        assert_eq!(parse(&[b"\xEFdata: a\n\n"]), vec![]);
        assert_eq!(parse(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n"]), vec![]);
    }

    #[test]
    fn long_field_names_are_not_data() {
        assert_eq!(parse(&[b"datadata: a\ndat: b\n\n"]), vec![]);
    }

    fn stream_strategy() -> impl Strategy<Value = Vec<u8>> {
        let line_end = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
        let line = prop_oneof![
            "data: [a-z{}\":, ]{0,12}",
            "data:[a-z ]{0,5}",
            Just("data".to_owned()),
            "event: ?[a-z_.]{0,10}",
            ": ?[a-z ]{0,8}",
            "id: [0-9]{1,3}",
            "retry: [0-9]{1,4}",
            "[a-z]{1,7}(: [a-z]{0,4})?",
            Just(String::new()),
        ];
        (
            any::<bool>(),
            proptest::collection::vec((line, line_end), 0..16),
            any::<bool>(),
        )
            .prop_map(|(bom, lines, cut_last_end)| {
                let mut stream = Vec::new();
                if bom {
                    stream.extend_from_slice(&BOM);
                }
                let count = lines.len();
                for (index, (line, end)) in lines.into_iter().enumerate() {
                    stream.extend_from_slice(line.as_bytes());
                    if !(cut_last_end && index + 1 == count) {
                        stream.extend_from_slice(end.as_bytes());
                    }
                }
                stream
            })
    }

    proptest! {
        #[test]
        fn any_stream_parses_as_the_reference_algorithm(stream in stream_strategy()) {
            prop_assert_eq!(parse(&[&stream]), reference(&stream));
        }

        #[test]
        fn any_split_of_a_stream_parses_as_the_whole(
            stream in stream_strategy(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
        ) {
            let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(stream.len() + 1)).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for cut in cuts {
                pieces.push(&stream[from..cut]);
                from = cut;
            }
            pieces.push(&stream[from..]);
            prop_assert_eq!(parse(&pieces), parse(&[&stream]));
        }

        #[test]
        fn byte_by_byte_parses_as_the_whole(stream in stream_strategy()) {
            let pieces: Vec<&[u8]> = stream.chunks(1).collect();
            prop_assert_eq!(parse(&pieces), parse(&[&stream]));
        }
    }
}
