//! The access line as text: written by the binary itself in its two log formats (the bytes tracing-subscriber's
//! `full` and `json` formats give for the same event, without their per-field dispatch, at a fraction of their
//! instructions), or handed to whatever `tracing` subscriber a library user runs.

use std::cell::RefCell;
use std::io::Write;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use super::TARGET;
use crate::civil::civil_from_days;
use crate::key::push_ip_text;

/// The log formats the binary writes access lines in by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// tracing-subscriber's default (`full`) format, without colours.
    Plain,
    /// tracing-subscriber's `json` format.
    Json,
}

/// Set once by the binary: access lines are then written to standard error in this format.
static WRITTEN_DIRECTLY: OnceLock<LineFormat> = OnceLock::new();

/// Has access lines written straight to standard error in `format`, where the binary's tracing-subscriber writes
/// its other lines in the same format. Without it (a library user's own subscriber, or colours for a terminal)
/// each line is a `tracing` event on [`TARGET`]. Only the first call counts.
pub fn write_directly(format: LineFormat) {
    let _ = WRITTEN_DIRECTLY.set(format);
}

/// The fields of one access line, in the order they are written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fields<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub route: &'a str,
    pub status: u16,
    pub client: IpAddr,
    pub peer: IpAddr,
    pub request_id: &'a str,
    pub trace_id: Option<&'a str>,
    pub limit: Option<&'a str>,
    pub consumer: Option<&'a str>,
    pub plan: Option<&'a str>,
    pub upstream: Option<&'a str>,
    pub upstream_us: Option<u64>,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub duration_us: u64,
}

thread_local! {
    /// Each worker thread's line, kept between requests so that writing one allocates nothing.
    static LINE: RefCell<String> = RefCell::new(String::with_capacity(512));
}

// === impl Fields ===

impl Fields<'_> {
    /// Writes the line: straight to standard error when the binary asked for it, as a `tracing` event otherwise.
    pub fn write(&self) {
        let Some(format) = WRITTEN_DIRECTLY.get().copied() else {
            self.emit();
            return;
        };
        LINE.with_borrow_mut(|line| {
            line.clear();
            self.render(format, SystemTime::now(), line);
            // One write of the whole line, as tracing-subscriber's writer does; a closed stderr loses the line and
            // nothing else.
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        });
    }

    /// The line as a `tracing` event: the method and addresses by `Display`, text by value, absent fields left out.
    fn emit(&self) {
        tracing::info!(
            target: TARGET,
            method = %self.method,
            path = self.path,
            route = self.route,
            status = self.status,
            client = %self.client,
            peer = %self.peer,
            request_id = self.request_id,
            trace_id = self.trace_id,
            limit = self.limit,
            consumer = self.consumer,
            plan = self.plan,
            upstream = self.upstream,
            upstream_us = self.upstream_us,
            bytes_received = self.bytes_received,
            bytes_sent = self.bytes_sent,
            duration_us = self.duration_us,
        );
    }

    /// Appends the line, stamped `now`, in `format` to `out`.
    fn render(&self, format: LineFormat, now: SystemTime, out: &mut String) {
        let mut line = Line { out, format };
        line.begin(now);
        line.plain("method", self.method);
        line.text("path", self.path);
        line.text("route", self.route);
        line.number("status", u64::from(self.status));
        line.address("client", self.client);
        line.address("peer", self.peer);
        line.text("request_id", self.request_id);
        let optional = [
            ("trace_id", self.trace_id),
            ("limit", self.limit),
            ("consumer", self.consumer),
            ("plan", self.plan),
            ("upstream", self.upstream),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                line.text(name, value);
            }
        }
        if let Some(us) = self.upstream_us {
            line.number("upstream_us", us);
        }
        line.number("bytes_received", self.bytes_received);
        line.number("bytes_sent", self.bytes_sent);
        line.number("duration_us", self.duration_us);
        line.end();
    }
}

/// A line being written in one format.
struct Line<'o> {
    out: &'o mut String,
    format: LineFormat,
}

// === impl Line ===

impl Line<'_> {
    fn begin(&mut self, now: SystemTime) {
        match self.format {
            LineFormat::Plain => {
                push_timestamp(self.out, now);
                self.out.push_str("  INFO tollgate::access:");
            }
            LineFormat::Json => {
                self.out.push_str("{\"timestamp\":\"");
                push_timestamp(self.out, now);
                self.out.push_str("\",\"level\":\"INFO\",\"fields\":{");
            }
        }
    }

    fn end(&mut self) {
        match self.format {
            LineFormat::Plain => self.out.push('\n'),
            LineFormat::Json => self.out.push_str("},\"target\":\"tollgate::access\"}\n"),
        }
    }

    /// Starts the field `name`: ` name=` in plain text, `"name":` (after a comma but for the first) in JSON.
    fn name(&mut self, name: &str) {
        match self.format {
            LineFormat::Plain => {
                self.out.push(' ');
                self.out.push_str(name);
                self.out.push('=');
            }
            LineFormat::Json => {
                if !self.out.ends_with('{') {
                    self.out.push(',');
                }
                self.out.push('"');
                self.out.push_str(name);
                self.out.push_str("\":");
            }
        }
    }

    /// A value recorded by `Display`: bare in plain text, a string in JSON.
    fn plain(&mut self, name: &str, value: &str) {
        self.name(name);
        match self.format {
            LineFormat::Plain => self.out.push_str(value),
            LineFormat::Json => push_json_string(self.out, value),
        }
    }

    /// A text value: quoted and escaped as Rust's `Debug` does in plain text, a JSON string in JSON.
    fn text(&mut self, name: &str, value: &str) {
        self.name(name);
        match self.format {
            LineFormat::Plain if is_plain(value) => {
                self.out.push('"');
                self.out.push_str(value);
                self.out.push('"');
            }
            LineFormat::Plain => {
                use std::fmt::Write as _;
                let _ = write!(self.out, "{value:?}");
            }
            LineFormat::Json => push_json_string(self.out, value),
        }
    }

    fn number(&mut self, name: &str, value: u64) {
        self.name(name);
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    fn address(&mut self, name: &str, ip: IpAddr) {
        self.name(name);
        let quoted = self.format == LineFormat::Json;
        if quoted {
            self.out.push('"');
        }
        push_ip_text(self.out, ip);
        if quoted {
            self.out.push('"');
        }
    }
}

/// Whether `value` is printable ASCII that neither format escapes (no quote, no backslash).
fn is_plain(value: &str) -> bool {
    value
        .bytes()
        .all(|byte| matches!(byte, b' '..=b'~') && byte != b'"' && byte != b'\\')
}

/// `value` as a JSON string, escaped as serde_json escapes it.
fn push_json_string(out: &mut String, value: &str) {
    if is_plain(value) {
        out.push('"');
        out.push_str(value);
        out.push('"');
    } else {
        // Serialising a string cannot fail.
        out.push_str(&serde_json::to_string(value).unwrap_or_default());
    }
}

/// `now` as tracing-subscriber stamps its lines: RFC 3339 in UTC with microseconds, `2024-02-29T12:34:56.000123Z`.
fn push_timestamp(out: &mut String, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    let (days, time) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let mut stamp = *b"0000-00-00T00:00:00.000000Z";
    let mut put = |at: usize, value: i64, digits: usize| {
        let mut value = value;
        for place in stamp[at..at + digits].iter_mut().rev() {
            *place = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, year, 4);
    put(5, month, 2);
    put(8, day, 2);
    put(11, time / 3600, 2);
    put(14, time / 60 % 60, 2);
    put(17, time % 60, 2);
    put(20, i64::from(since.subsec_micros()), 6);
    // Only ASCII digits were written over an ASCII template.
    out.push_str(std::str::from_utf8(&stamp).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    /// What tracing-subscriber writes for `fields`' event in `format`.
    fn by_tracing_subscriber(fields: &Fields<'_>, format: LineFormat) -> String {
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&written);
        let writer = move || Sink(Arc::clone(&sink));
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(writer);
        let emit = || fields.emit();
        match format {
            LineFormat::Plain => tracing::subscriber::with_default(builder.finish(), emit),
            LineFormat::Json => tracing::subscriber::with_default(builder.json().finish(), emit),
        }
        let bytes = written.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The timestamp's 27 characters, which differ between two writes.
    fn without_timestamp(line: &str) -> String {
        let at = line.find("20").unwrap();
        format!("{}{}", &line[..at], &line[at + 27..])
    }

    fn fields<'a>(text: &'a str, client: IpAddr, optional: bool) -> Fields<'a> {
        Fields {
            method: "POST",
            path: text,
            route: "api",
            status: 429,
            client,
            peer: "127.0.0.1".parse().unwrap(),
            request_id: "4bf92f3577b34da6",
            trace_id: optional.then_some("4bf92f3577b34da6a3ce929d0e0e4736"),
            limit: optional.then_some(text),
            consumer: optional.then_some(text),
            plan: optional.then_some("pro"),
            upstream: optional.then_some("127.0.0.1:3000"),
            upstream_us: optional.then_some(412),
            bytes_received: 5,
            bytes_sent: 18_446_744_073_709_551_615,
            duration_us: 0,
        }
    }

    #[test]
    fn lines_are_the_bytes_tracing_subscriber_writes_for_the_same_event() {
        let texts = [
            "/api/orders",
            "/a \"quoted\" \\ path",
            "tab\there, new\nline, bell\u{7}",
            "caf\u{e9} \u{1f600} \u{200b}",
            "",
        ];
        let clients: [IpAddr; 2] = [
            "203.0.113.7".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
        ];
        for text in texts {
            for client in clients {
                for optional in [false, true] {
                    let fields = fields(text, client, optional);
                    for format in [LineFormat::Plain, LineFormat::Json] {
                        let mut ours = String::new();
                        fields.render(format, SystemTime::now(), &mut ours);
                        let theirs = by_tracing_subscriber(&fields, format);
                        assert_eq!(
                            without_timestamp(&ours),
                            without_timestamp(&theirs),
                            "{format:?} {text:?} {optional}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn timestamps_are_utc_with_microseconds() {
        let stamp = |seconds: u64, micros: u64| {
            let mut out = String::new();
            let time = UNIX_EPOCH + Duration::from_secs(seconds) + Duration::from_micros(micros);
            push_timestamp(&mut out, time);
            out
        };
        assert_eq!(stamp(1_709_210_096, 123), "2024-02-29T12:34:56.000123Z");
        assert_eq!(stamp(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(stamp(946_684_799, 999_999), "1999-12-31T23:59:59.999999Z");
    }
}
