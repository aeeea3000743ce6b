//! Valid configs edited line by line, with a fuzzed environment: reaches validation, which random bytes rarely do.
#![no_main]

use std::path::Path;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate_fuzz::{check_config_outcome, FILE};

/// Files that load, so that most edits leave YAML that parses and the validator sees one wrong value at a time.
const BASES: &[&str] = &[
    include_str!("../../gateway.yaml"),
    include_str!("../seeds/config_parse/memory.yaml"),
    include_str!("../seeds/config_parse/algorithms.yaml"),
    include_str!("../seeds/config_parse/proxies.yaml"),
];

/// Values the validator treats specially: zeros, overflows, units, key parts, networks, placeholders.
#[rustfmt::skip] // Grouped by kind, several to a line; one value a line would hide the groups.
const VALUES: &[&str] = &[
    "0", "1", "-1", "18446744073709551615", "18446744073709551616", "4294967296", "1e3", "0x10", "~", "null",
    "\"\"", "''", "[]", "{}", "[ip, route]", "0/s", "1/0s", "5/s", "1000/1h", "1/1d", "1/ms", "10/2m", "/s",
    "1/", "1/s/s", "0ms", "1ms", "25ms", "1s", "59m", "24h", "365d", "1.5s", "999999999999999999d", "10 s",
    "ip", "route", "method", "path", "host", "header:", "header:x-api-key", "header:bad name", "query:",
    "query:tenant", "[header:x-api-key, query:t]", "gcra", "token_bucket", "sliding_window", "sliding_log",
    "fixed_window", "leaky_bucket", "delay", "reject", "skip", "memory", "redis", "allow", "deny", "local",
    "0.0.0.0/0", "::/0", "10.0.0.0/8", "10.0.0.1/33", "[10.0.0.0/8, \"::ffff:0:0/96\"]", "not-a-net", "*",
    "/", "//", "/api/../admin", "*.example.com", "*.", "EXAMPLE.com:80", "[GET, POST]", "[GTE]", "[get]",
    "0.0.0.0:0", "127.0.0.1:65536", "[::1]:9901", "redis://h:1", "redis-cluster://a,b", "rediss://",
    "http://127.0.0.1:3000", "ftp://x", "[\"http://a\", \"http://a\"]", "tollgate:{x}", "a}b", "100",
    "199", "429", "600", "${X}", "${X:-}", "${X:-d}", "$${X}", "${1X}", "${X", "\"${X}\"", "&a 1", "*a",
    "!!binary aGk=", "|\n  text", ">-\n  text", "\"\\u0000\"", "\"\\x7f\"", "\"\t\"",
];

#[derive(Arbitrary, Debug)]
struct Input {
    base: u8,
    edits: Vec<Edit>,
    /// Variables the placeholders see; values may hold newlines, which shift the file's lines.
    env: Vec<(String, String)>,
}

#[derive(Arbitrary, Debug)]
enum Edit {
    /// Keeps a `key:` line's key and indentation, with a new value.
    SetValue { line: u16, value: Value },
    /// Drops a line, which removes a field or one entry of a list.
    Delete { line: u16 },
    /// Repeats a line, which makes duplicate keys and entries.
    Duplicate { line: u16 },
    /// Moves a line's indentation, which re-parents a field.
    Indent { line: u16, by: i8 },
    /// Adds a line after `line`, with the same indentation.
    Insert { line: u16, key: Key, value: Value },
}

#[derive(Arbitrary, Debug)]
enum Value {
    Known(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
enum Key {
    Known(u8),
    Raw(String),
}

/// Field names of the config, so that inserted lines are mostly known keys in the wrong or right place.
#[rustfmt::skip] // In file order, several to a line.
const KEYS: &[&str] = &[
    "listen", "admin", "token", "store", "backend", "url", "timeout", "on_error", "key_prefix", "max_keys",
    "pool_size", "client_ip", "trusted_proxies", "server", "header_read_timeout", "max_header_bytes",
    "shutdown_grace", "upstreams", "targets", "connect_timeout", "routes", "- name", "name", "match",
    "path_prefix", "path", "methods", "host", "upstream", "respond", "status", "body", "headers", "limits",
    "key", "missing", "algorithm", "limit", "period", "rate", "burst", "cost", "mode", "max_delay",
    "deny_status", "allow", "- key",
];

impl Value {
    fn text(&self) -> &str {
        match self {
            Value::Known(i) => VALUES[usize::from(*i) % VALUES.len()],
            Value::Raw(s) => s,
        }
    }
}

impl Key {
    fn text(&self) -> &str {
        match self {
            Key::Known(i) => KEYS[usize::from(*i) % KEYS.len()],
            Key::Raw(s) => s,
        }
    }
}

fn indentation(line: &str) -> &str {
    &line[..line.len() - line.trim_start_matches(' ').len()]
}

fn apply(lines: &mut Vec<String>, edit: &Edit) {
    if lines.is_empty() {
        return;
    }
    let at = |line: u16| usize::from(line) % lines.len();
    match edit {
        Edit::SetValue { line, value } => {
            let i = at(*line);
            // Without a `key:` there is no value to replace; the edit then writes a bare scalar line, which the
            // parser must refuse with a location.
            let head = match lines[i].split_once(':') {
                Some((key, _)) => format!("{key}: "),
                None => indentation(&lines[i]).to_owned(),
            };
            lines[i] = format!("{head}{}", value.text());
        }
        Edit::Delete { line } => {
            lines.remove(at(*line));
        }
        Edit::Duplicate { line } => {
            let i = at(*line);
            let copy = lines[i].clone();
            lines.insert(i, copy);
        }
        Edit::Indent { line, by } => {
            let i = at(*line);
            let body = lines[i].trim_start_matches(' ').to_owned();
            let width = indentation(&lines[i]).len() as isize + isize::from(*by % 8);
            lines[i] = format!("{}{body}", " ".repeat(width.max(0) as usize));
        }
        Edit::Insert { line, key, value } => {
            let i = at(*line);
            let indent = indentation(&lines[i]).to_owned();
            lines.insert(i + 1, format!("{indent}{}: {}", key.text(), value.text()));
        }
    }
}

fuzz_target!(|input: Input| {
    let base = BASES[usize::from(input.base) % BASES.len()];
    let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
    // Bounded so that one input stays fast; a handful of edits already reaches every validation branch.
    for edit in input.edits.iter().take(16) {
        apply(&mut lines, edit);
    }
    let text = lines.join("\n");
    let env = |name: &str| {
        input
            .env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.clone())
    };
    let outcome = tollgate::config::parse_with_env(&text, Path::new(FILE), env);
    check_config_outcome(&text, &outcome);
});
