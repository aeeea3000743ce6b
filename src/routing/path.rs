//! Path normalisation: the one spelling of a request path that routing matches, keys count and the upstream
//! receives, so that `/%61pi/./x` cannot reach `/api/x` past the `/api` route's limits.

use std::borrow::Cow;

use thiserror::Error;

/// Why a request target has no normal path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PathError {
    /// The target is not a path (`*`, authority-form).
    #[error("the request target must be a path")]
    NotAPath,
    /// A `%` not followed by two hex digits: servers disagree on what it means, so it means nothing here.
    #[error("the path has a malformed percent-encoding")]
    BadEscape,
    /// `%2F`: a slash inside a segment, which upstreams read as a slash or as data, each its own way.
    #[error("the path has an escaped slash (%2F)")]
    EscapedSlash,
    /// `\` or `%5C`: a path separator to some upstreams (Windows, IIS, some frameworks), data to others.
    #[error("the path has a backslash")]
    Backslash,
    /// `%00`: ends the path early in C upstreams.
    #[error("the path has an escaped NUL (%00)")]
    Nul,
    /// Escapes whose bytes are not UTF-8: no character to read them as.
    #[error("the path's escapes are not UTF-8")]
    NotUtf8,
}

/// What may vary in how paths are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathRules {
    /// `server.escaped_slashes: keep`: `%2F` is data, kept escaped (never decoded) rather than refused.
    pub keep_escaped_slashes: bool,
}

/// The normal form of `path` with the default rules (`%2F` refused): see [`normalize_path_with`].
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    normalize_path_with(path, PathRules::default())
}

/// The normal form of `path` (RFC 3986 §6.2.2, and what every upstream agrees on):
/// - escapes of characters that may stand literally in a segment (unreserved, sub-delims, `:`, `@`) decoded; UTF-8
///   escapes read as their characters; then every byte that must be escaped escaped, in upper case (non-ASCII as
///   its UTF-8 bytes), so that each path has one spelling, in ASCII;
/// - `\`, `%5C`, `%00`, escapes that are not UTF-8 and (unless `rules` keep them) `%2F` refused;
/// - `.` and `..` segments resolved, so that `/api/../admin` is `/admin`;
/// - repeated slashes merged; a trailing slash kept (`/a/b/` and `/a/b` may be different resources upstream).
///
/// Borrowed when `path` is already normal, as nearly every path is.
pub fn normalize_path_with(path: &str, rules: PathRules) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAPath);
    }
    if is_normal_text(path, rules) && is_clean(path) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(path, rules)?;
    if is_clean(&decoded) {
        return Ok(Cow::Owned(encode_non_ascii(&decoded)));
    }
    Ok(Cow::Owned(encode_non_ascii(&resolve_dots(&decoded))))
}

/// `path` (starting with `/`) with empty, `.` and `..` segments resolved; a trailing slash kept.
fn resolve_dots(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/').skip(1) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if path.ends_with('/') || path.ends_with("/.") || path.ends_with("/..") || out.is_empty() {
        out.push('/');
    }
    out
}

/// The path routes match: the normal path with the `;` parameters of every segment removed and then its dot
/// segments resolved, as servers that read parameters (Tomcat, Jetty) read it: `/x/..;/login` is `/login` to them.
/// Borrowed when the path has no `;`.
pub fn without_parameters(path: &str) -> Cow<'_, str> {
    if !path.contains(';') {
        return Cow::Borrowed(path);
    }
    let mut stripped = String::with_capacity(path.len());
    for segment in path.split('/').skip(1) {
        stripped.push('/');
        stripped.push_str(segment.split(';').next().unwrap_or_default());
    }
    if is_clean(&stripped) {
        Cow::Owned(stripped)
    } else {
        Cow::Owned(resolve_dots(&stripped))
    }
}

/// `path` with escapes decoded as [`normalize_path_with`] says, non-ASCII left as UTF-8 (see [`encode_non_ascii`]),
/// and the ASCII bytes that may not stand literally escaped.
fn decode(path: &str, rules: PathRules) -> Result<String, PathError> {
    let bytes = path.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(path.len() + 8);
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte != b'%' {
            match byte {
                b'\\' => return Err(PathError::Backslash),
                0 => return Err(PathError::Nul),
                b'/' => out.push(byte),
                _ if byte >= 0x80 || is_literal(byte) => out.push(byte),
                _ => push_escape(&mut out, byte),
            }
            i += 1;
            continue;
        }
        let (Some(high), Some(low)) = (
            bytes.get(i + 1).copied().and_then(hex_value),
            bytes.get(i + 2).copied().and_then(hex_value),
        ) else {
            return Err(PathError::BadEscape);
        };
        let decoded = high << 4 | low;
        match decoded {
            0 => return Err(PathError::Nul),
            b'\\' => return Err(PathError::Backslash),
            b'/' if rules.keep_escaped_slashes => push_escape(&mut out, decoded),
            b'/' => return Err(PathError::EscapedSlash),
            _ if decoded >= 0x80 || is_literal(decoded) => out.push(decoded),
            _ => push_escape(&mut out, decoded),
        }
        i += 3;
    }
    String::from_utf8(out).map_err(|_| PathError::NotUtf8)
}

fn push_escape(out: &mut Vec<u8>, byte: u8) {
    out.push(b'%');
    out.push(HEX_UPPER[usize::from(byte >> 4)]);
    out.push(HEX_UPPER[usize::from(byte & 0xf)]);
}

/// `path` with each non-ASCII character written as its UTF-8 bytes' escapes, in upper case.
fn encode_non_ascii(path: &str) -> String {
    if path.is_ascii() {
        return path.to_owned();
    }
    let mut out = Vec::with_capacity(path.len() * 2);
    for &byte in path.as_bytes() {
        if byte >= 0x80 {
            push_escape(&mut out, byte);
        } else {
            out.push(byte);
        }
    }
    // Only ASCII was written.
    String::from_utf8(out).unwrap_or_default()
}

/// Whether `path` is already written as [`normalize_path_with`] writes it, dot segments aside: every byte literal
/// or `/`, and every `%` the start of an upper-case escape that must stay one (UTF-8 sequences whole). One pass,
/// true at once for the usual path without escapes.
fn is_normal_text(path: &str, rules: PathRules) -> bool {
    let bytes = path.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte != b'%' {
            if !(byte == b'/' || (byte < 0x80 && is_literal(byte))) {
                return false;
            }
            at += 1;
            continue;
        }
        let Some(first) = normal_escape(bytes, at) else {
            return false;
        };
        if first < 0x80 {
            let must_stay = match first {
                0 | b'\\' => false,
                b'/' => rules.keep_escaped_slashes,
                _ => !is_literal(first),
            };
            if !must_stay {
                return false;
            }
            at += 3;
            continue;
        }
        // A UTF-8 sequence: its first byte tells its length, and the whole must be one character.
        let width = match first {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return false,
        };
        let mut character = [first, 0, 0, 0];
        for (k, slot) in character.iter_mut().enumerate().take(width).skip(1) {
            match normal_escape(bytes, at + 3 * k) {
                Some(next) => *slot = next,
                None => return false,
            }
        }
        if std::str::from_utf8(&character[..width]).is_err() {
            return false;
        }
        at += 3 * width;
    }
    true
}

/// The byte of the escape at `at` when it is written in upper case (`%3F`, not `%3f`).
fn normal_escape(bytes: &[u8], at: usize) -> Option<u8> {
    if bytes.get(at) != Some(&b'%') {
        return None;
    }
    let digit = |i: usize| {
        bytes
            .get(i)
            .copied()
            .filter(|b| !b.is_ascii_lowercase())
            .and_then(hex_value)
    };
    Some(digit(at + 1)? << 4 | digit(at + 2)?)
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// Whether `byte` may stand literally in a path segment (RFC 3986 §3.3 `pchar`): unreserved (§2.3), sub-delims
/// (§2.2), `:` and `@`. A table: this runs for every byte of every path.
fn is_literal(byte: u8) -> bool {
    LITERAL[usize::from(byte)]
}

const LITERAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 128 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            );
        byte += 1;
    }
    table
};

/// Whether `path` (starting with `/`, already decoded) has neither an empty segment before its last (`//`) nor a
/// `.` or `..` segment: one pass over the bytes, since nearly every path is clean and this runs for every request.
fn is_clean(path: &str) -> bool {
    let mut rest = &path.as_bytes()[1..];
    loop {
        let (segment, next) = match rest.iter().position(|&b| b == b'/') {
            Some(slash) => (&rest[..slash], Some(&rest[slash + 1..])),
            None => (rest, None),
        };
        if segment == b"." || segment == b".." {
            return false;
        }
        match next {
            Some(_) if segment.is_empty() => return false,
            Some(next) => rest = next,
            None => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(path: &str) -> Result<String, PathError> {
        normalize_path(path).map(Cow::into_owned)
    }

    #[test]
    fn dot_segments_are_resolved_in_any_spelling() {
        assert_eq!(normal("/api/../admin").as_deref(), Ok("/admin"));
        assert_eq!(normal("/api/%2E%2E/admin").as_deref(), Ok("/admin"));
        assert_eq!(normal("/api/.%2e/admin").as_deref(), Ok("/admin"));
        assert_eq!(normal("//a/./b/").as_deref(), Ok("/a/b/"));
        assert_eq!(normal("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(normal("/a/b/.").as_deref(), Ok("/a/b/"));
        assert_eq!(normal("/../..").as_deref(), Ok("/"));
        assert_eq!(normal("/plain/path").as_deref(), Ok("/plain/path"));
        assert_eq!(normal("*"), Err(PathError::NotAPath));
    }

    #[test]
    fn escapes_of_characters_allowed_in_a_segment_are_decoded_and_the_others_upper_cased() {
        assert_eq!(normal("/%61pi/x").as_deref(), Ok("/api/x"));
        assert_eq!(normal("/%41%7e%2D%5f").as_deref(), Ok("/A~-_"));
        assert_eq!(
            normal("/v1/items%3Apurge").as_deref(),
            Ok("/v1/items:purge")
        );
        assert_eq!(
            normal("/%21%24%26%27%28%29%2A%2B%2C%3B%3D%40").as_deref(),
            Ok("/!$&'()*+,;=@")
        );
        assert_eq!(normal("/a%3f/%23%25%20").as_deref(), Ok("/a%3F/%23%25%20"));
        // What may not stand literally is escaped, however it came.
        assert_eq!(normal("/a|b/\"{x}").as_deref(), Ok("/a%7Cb/%22%7Bx%7D"));
        assert_eq!(normal("/a%7cb").as_deref(), Ok("/a%7Cb"));
        assert_eq!(normal("/a%2"), Err(PathError::BadEscape));
        assert_eq!(normal("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(normal("/%"), Err(PathError::BadEscape));
    }

    #[test]
    fn utf8_paths_are_one_spelling_of_upper_case_escapes() {
        for spelling in [
            "/caf\u{e9}/x",
            "/caf%C3%A9/x",
            "/caf%c3%a9/x",
            "/caf\u{e9}/./x",
        ] {
            assert_eq!(
                normal(spelling).as_deref(),
                Ok("/caf%C3%A9/x"),
                "{spelling}"
            );
        }
        assert_eq!(normal("/\u{1F600}").as_deref(), Ok("/%F0%9F%98%80"));
        assert!(matches!(
            normalize_path("/caf%C3%A9/x"),
            Ok(Cow::Borrowed(_))
        ));
        for bad in [
            "/caf%E9",
            "/%C3",
            "/%C3%28",
            "/%FF",
            "/%C0%AF",
            "/%ED%A0%80",
        ] {
            assert_eq!(normal(bad), Err(PathError::NotUtf8), "{bad}");
        }
    }

    #[test]
    fn slashes_backslashes_and_nul_that_upstreams_read_their_own_way_are_refused() {
        for (path, error) in [
            ("/a%2Fb", PathError::EscapedSlash),
            ("/a%2fb", PathError::EscapedSlash),
            ("/a%5Cb", PathError::Backslash),
            ("/a\\b", PathError::Backslash),
            ("/a%00", PathError::Nul),
        ] {
            assert_eq!(normal(path), Err(error), "{path}");
        }
        let keep = PathRules {
            keep_escaped_slashes: true,
        };
        let kept = normalize_path_with("/a%2fb/../c", keep).map(Cow::into_owned);
        assert_eq!(kept.as_deref(), Ok("/c"));
        let kept = normalize_path_with("/a%2fb", keep).map(Cow::into_owned);
        assert_eq!(kept.as_deref(), Ok("/a%2Fb"));
        assert!(matches!(
            normalize_path_with("/a%2Fb", keep),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(
            normalize_path_with("/a%5C", keep),
            Err(PathError::Backslash)
        );
    }

    #[test]
    fn parameters_are_removed_from_every_segment_before_dot_segments_for_matching() {
        assert_eq!(without_parameters("/login;jsessionid=1"), "/login");
        assert_eq!(without_parameters("/x/..;/login"), "/login");
        assert_eq!(without_parameters("/a;b/c;d=e/"), "/a/c/");
        assert_eq!(without_parameters("/;x"), "/");
        assert!(matches!(without_parameters("/plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn clean_paths_are_borrowed() {
        assert!(matches!(
            normalize_path("/api/v1/users/42"),
            Ok(Cow::Borrowed(_))
        ));
        assert!(matches!(normalize_path("/"), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalize_path("/a/.b/..c"), Ok(Cow::Borrowed(_))));
        assert!(matches!(
            normalize_path("/v1/items:purge;x=1"),
            Ok(Cow::Borrowed(_))
        ));
    }

    /// Every concatenation of up to `up_to` of `pieces` (repeats allowed), the empty one included.
    fn sequences(pieces: &[&str], up_to: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = all.clone();
        for _ in 0..up_to {
            last = last
                .iter()
                .flat_map(|start| pieces.iter().map(move |piece| format!("{start}{piece}")))
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    /// What an upstream that decodes every escape of a literal character and resolves dot segments would make of
    /// `path`, written the slow way: the reference the fast path must agree with.
    fn reference(path: &str) -> String {
        let mut bytes = Vec::new();
        let raw = path.as_bytes();
        let mut i = 0;
        while i < raw.len() {
            if raw[i] == b'%' {
                let byte = u8::from_str_radix(&path[i + 1..i + 3], 16).expect("hex");
                if byte < 0x80 && is_literal(byte) {
                    bytes.push(byte);
                } else {
                    bytes.extend(format!("%{byte:02X}").bytes());
                }
                i += 3;
            } else {
                bytes.push(raw[i]);
                i += 1;
            }
        }
        let decoded = String::from_utf8(bytes).expect("ascii");
        let mut out: Vec<&str> = Vec::new();
        let segments: Vec<&str> = decoded.split('/').skip(1).collect();
        for segment in &segments {
            match *segment {
                "" | "." => {}
                ".." => {
                    out.pop();
                }
                s => out.push(s),
            }
        }
        let mut text: String = out.iter().map(|s| format!("/{s}")).collect();
        if matches!(segments.last(), Some(&("" | "." | ".."))) || text.is_empty() {
            text.push('/');
        }
        text
    }

    #[test]
    fn every_short_path_normalises_as_the_reference_does_and_stays_normal() {
        let pieces = [
            "/", "/a", "/.", "/..", "/%2E", "/%2e%2E", "/.%2e", "/%61", "/%3a", "/B", "/%3F",
            "/%40;",
        ];
        for path in sequences(&pieces, 4).iter().filter(|p| !p.is_empty()) {
            let normal = normalize_path(path).expect("a path");
            assert_eq!(normal, reference(path), "{path:?}");
            assert!(
                matches!(normalize_path(&normal), Ok(Cow::Borrowed(p)) if p == normal),
                "{path:?} -> {normal:?} is not a fixed point"
            );
        }
    }
}
