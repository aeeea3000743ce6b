//! Store keys: `<prefix><route>:<limit>:{<value>}`, with values that could grow keys or pick a Redis Cluster slot
//! replaced by their digest.

use sha2::{Digest, Sha256};

/// The route name plan limits' store keys use in its place (`<prefix>consumer:<limit>:{<consumer>}`), shared by
/// every route; a consumer's failed credentials are counted under it too.
pub const PLAN_KEY_SCOPE: &str = "consumer";

/// Key values longer than this are replaced by their digest, so clients cannot grow store keys.
pub const MAX_PLAIN_KEY_LEN: usize = 64;

/// The store key of one limit for one key value: `<prefix><route>:<limit>:{<value>}`.
///
/// The braces make the value the Redis Cluster hash tag. A value longer than [`MAX_PLAIN_KEY_LEN`] bytes, or with
/// `{`, `}` or control characters, is replaced by its SHA-256 hex digest, so that clients can
/// neither grow keys nor choose the cluster slot.
pub fn store_key(prefix: &str, route: &str, limit: &str, value: &str) -> String {
    let mut key =
        String::with_capacity(prefix.len() + route.len() + limit.len() + 4 + value.len().min(64));
    push_head(&mut key, prefix, route, limit);
    push_value(&mut key, value);
    key
}

/// The part of [`store_key`] before the value, `<prefix><route>:<limit>:{`: the same for every request, so
/// built once per limit.
pub fn key_head(prefix: &str, route: &str, limit: &str) -> String {
    let mut head = String::with_capacity(prefix.len() + route.len() + limit.len() + 3);
    push_head(&mut head, prefix, route, limit);
    head
}

fn push_head(key: &mut String, prefix: &str, route: &str, limit: &str) {
    key.push_str(prefix);
    key.push_str(route);
    key.push(':');
    key.push_str(limit);
    key.push_str(":{");
}

/// [`store_key`] from its [`key_head`] and the key value.
pub fn key_with_head(head: &str, value: &str) -> String {
    let mut key = String::with_capacity(head.len() + value.len().min(64) + 1);
    key.push_str(head);
    push_value(&mut key, value);
    key
}

/// Ends a store key with the value (or its digest) and the closing brace.
fn push_value(key: &mut String, value: &str) {
    let value_start = key.len();
    key.push_str(value);
    seal_key(key, value_start);
}

/// Ends a store key whose value was written from `value_start` on: replaces the value by its digest when it may
/// not stand in a key as it is (see [`store_key`]), then closes the brace.
pub fn seal_key(key: &mut String, value_start: usize) {
    let value = &key[value_start..];
    // Printable ASCII without braces, the usual address or token, is checked a byte at a time; anything else
    // character by character, where non-ASCII control characters also call for the digest.
    let printable_ascii = value
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'{' && b != b'}');
    let needs_digest = value.len() > MAX_PLAIN_KEY_LEN
        || (!printable_ascii
            && value
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_control()));
    if needs_digest {
        let digest = Sha256::digest(value.as_bytes());
        key.truncate(value_start);
        for byte in digest {
            key.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
            key.push(char::from(HEX_DIGITS[usize::from(byte & 0xf)]));
        }
    }
    key.push('}');
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_or_braced_values_are_digested() {
        let plain = store_key("t:", "api", "per-ip", "1.2.3.4");
        assert_eq!(plain, "t:api:per-ip:{1.2.3.4}");
        let braced = store_key("t:", "api", "k", "a}{b");
        // The digest is part of the key in Redis: it must not change between versions.
        assert_eq!(
            braced,
            "t:api:k:{f2a468af3f34e5a6cbb7447bf01c45aa97969d5ec2d53727efbe706e70f8bed2}"
        );
        assert_eq!(key_with_head(&key_head("t:", "api", "k"), "a}{b"), braced);
        let long = store_key("t:", "api", "k", &"x".repeat(10_000));
        assert_eq!(store_key("t:", "api", "k", "café"), "t:api:k:{café}");
        let newline = store_key("t:", "api", "k", "a\nb");
        let next_line = store_key("t:", "api", "k", "a\u{85}b");
        for key in [braced, long, newline, next_line] {
            let value = key
                .strip_prefix("t:api:k:{")
                .unwrap()
                .strip_suffix('}')
                .unwrap();
            assert_eq!(value.len(), 64);
            assert!(value.chars().all(|c| c.is_ascii_hexdigit()));
        }
    }
}
