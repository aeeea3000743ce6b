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
}

/// The normal form of `path` (RFC 3986 §6.2.2):
/// - percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) decoded, other escapes' hex digits upper-cased;
/// - `.` and `..` segments resolved, so that `/api/../admin` is `/admin`;
/// - repeated slashes merged; a trailing slash kept (`/a/b/` and `/a/b` may be different resources upstream).
///
/// Borrowed when `path` is already normal, as nearly every path is.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAPath);
    }
    if escapes_are_normal(path) && is_clean(path) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path)?;
    if is_clean(&decoded) {
        return Ok(Cow::Owned(decoded));
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/').skip(1) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if decoded.ends_with('/')
        || decoded.ends_with("/.")
        || decoded.ends_with("/..")
        || out.is_empty()
    {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// `path` with the escapes of unreserved characters decoded and the others' hex digits in upper case.
fn decode_unreserved(path: &str) -> Result<String, PathError> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte != b'%' {
            out.push(char::from(byte));
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
        if is_unreserved(decoded) {
            out.push(char::from(decoded));
        } else {
            out.push('%');
            out.push(char::from(HEX_UPPER[usize::from(high)]));
            out.push(char::from(HEX_UPPER[usize::from(low)]));
        }
        i += 3;
    }
    Ok(out)
}

/// Whether every `%` of `path` starts an escape already in normal form: two upper-case hex digits of a character
/// that is not unreserved. True at once for the usual path without any.
fn escapes_are_normal(path: &str) -> bool {
    let bytes = path.as_bytes();
    let mut from = 0;
    while let Some(offset) = bytes[from..].iter().position(|&b| b == b'%') {
        let at = from + offset;
        let digit = |i: usize| {
            bytes
                .get(i)
                .copied()
                .filter(|b| !b.is_ascii_lowercase())
                .and_then(hex_value)
        };
        match (digit(at + 1), digit(at + 2)) {
            (Some(high), Some(low)) if !is_unreserved(high << 4 | low) => from = at + 3,
            _ => return false,
        }
    }
    true
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

/// RFC 3986 §2.3.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

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
    fn unreserved_escapes_are_decoded_and_the_others_upper_cased() {
        assert_eq!(normal("/%61pi/x").as_deref(), Ok("/api/x"));
        assert_eq!(normal("/%41%7e%2D%5f").as_deref(), Ok("/A~-_"));
        assert_eq!(normal("/a%2fb/%3f").as_deref(), Ok("/a%2Fb/%3F"));
        assert_eq!(normal("/a%20b").as_deref(), Ok("/a%20b"));
        assert_eq!(normal("/a%2"), Err(PathError::BadEscape));
        assert_eq!(normal("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(normal("/%"), Err(PathError::BadEscape));
    }

    #[test]
    fn clean_paths_are_borrowed() {
        assert!(matches!(
            normalize_path("/api/v1/users/42"),
            Ok(Cow::Borrowed(_))
        ));
        assert!(matches!(normalize_path("/"), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalize_path("/a/.b/..c"), Ok(Cow::Borrowed(_))));
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

    /// What an upstream that decodes unreserved escapes and resolves dot segments would make of `path`, written
    /// the slow way: the reference the fast path must agree with.
    fn reference(path: &str) -> String {
        let decoded = decode_unreserved(path).expect("valid escapes");
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
            "/", "/a", "/.", "/..", "/%2E", "/%2e%2E", "/.%2e", "/%61", "/%2f", "/B",
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
