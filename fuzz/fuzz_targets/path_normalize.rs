//! Request paths through the normaliser that routing trusts: no dot segment or empty segment may survive it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::routing::{normalize_path, without_parameters, PathError};

/// Segments an upstream may resolve as `.` or `..` after percent-decoding; any of them left in a normalised path
/// lets a request match one route and reach another path upstream.
fn is_dot_segment(segment: &str) -> bool {
    matches!(
        segment.to_ascii_lowercase().as_str(),
        "." | ".." | "%2e" | "%2e%2e" | ".%2e" | "%2e."
    )
}

fuzz_target!(|data: &[u8]| {
    // Request targets reach routing as text; hyper refuses what is not visible ASCII, but the function takes any
    // string, so any string is fair.
    let path = String::from_utf8_lossy(data);
    let normal = match normalize_path(&path) {
        Ok(normal) => normal,
        Err(PathError::NotAPath) => {
            assert!(!path.starts_with('/'), "{path:?} is a path");
            return;
        }
        // Escapes that are malformed or that upstreams read their own way (`%2F`, `%5C`, `\`, `%00`, not UTF-8).
        Err(_) => return,
    };
    // One spelling, in ASCII: every non-ASCII character escaped, no backslash.
    assert!(normal.is_ascii(), "{path:?} -> {normal:?}");
    assert!(!normal.contains('\\'), "{path:?} -> {normal:?}");
    // The path routes match: without parameters, no dot segment either (`/x/..;/login` is `/login`).
    let routed = without_parameters(&normal);
    assert!(
        !routed.split('/').any(is_dot_segment),
        "{path:?} -> {routed:?} keeps a dot segment"
    );
    assert!(normal.starts_with('/'), "{path:?} -> {normal:?}");
    assert!(!normal.contains("//"), "{path:?} -> {normal:?}");
    assert!(
        !normal.split('/').any(is_dot_segment),
        "{path:?} -> {normal:?} keeps a dot segment"
    );
    // `/a/b/` and `/a/b` may be different resources upstream.
    if path.ends_with('/') {
        assert!(
            normal.ends_with('/'),
            "trailing slash dropped: {path:?} -> {normal:?}"
        );
    }
    let again = normalize_path(&normal);
    assert!(
        matches!(again, Ok(std::borrow::Cow::Borrowed(p)) if p == normal),
        "not a borrowed fixed point: {path:?} -> {normal:?} -> {again:?}"
    );
});
