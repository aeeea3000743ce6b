//! API keys: reading one from a request, and the SHA-256 digest that is all tollgate keeps of it.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

use super::settings::CredentialSource;
use crate::key::{query_parameter, trimmed_value, QueryParameter, RequestFacts};

/// What a request holds where an API key is looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented<'r> {
    /// Nothing there: the next identifier is tried.
    Absent,
    /// One value (surrounding whitespace removed), as the bytes it is: a key that is not UTF-8 is digested as it
    /// was sent, never as a lossy reading that other bytes share.
    One(Cow<'r, [u8]>),
    /// More than one: refused, since the upstream could read another copy than the one checked.
    Ambiguous,
}

/// The SHA-256 digest of an API key.
pub fn digest(key: impl AsRef<[u8]>) -> [u8; 32] {
    Sha256::digest(key.as_ref()).into()
}

/// Parses a `sha256:<64 hex digits>` digest as written in the config.
pub fn parse_digest(text: &str) -> Option<[u8; 32]> {
    parse_hex_digest(text.strip_prefix("sha256:")?)
}

/// 64 hex digits (either case) as a digest, as issued keys' records keep them.
pub fn parse_hex_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let high = (pair[0] as char).to_digit(16)?;
        let low = (pair[1] as char).to_digit(16)?;
        *byte = u8::try_from(high << 4 | low).ok()?;
    }
    Some(digest)
}

/// Hex of a digest, as the admin API and audit lines show it.
pub fn digest_hex(digest: &[u8; 32]) -> String {
    use std::fmt::Write;
    digest.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// The API key `facts` carry at `source`.
pub fn presented<'r>(source: &CredentialSource, facts: &RequestFacts<'r>) -> Presented<'r> {
    match source {
        CredentialSource::Header(name) => {
            let mut lines = facts.headers.get_all(name).iter();
            let Some(value) = lines.next() else {
                return Presented::Absent;
            };
            if lines.next().is_some() {
                return Presented::Ambiguous;
            }
            match trimmed_value(value.as_bytes()) {
                b"" => Presented::Absent,
                key => Presented::One(Cow::Borrowed(key)),
            }
        }
        CredentialSource::Query(name) => query_value(facts.query, name),
    }
}

/// The one value of the query parameter `name`, as limits read it ([`query_parameter`]): `api%5Fkey`, `API_KEY`,
/// `api_key[]` and a `;` separator are all that parameter.
fn query_value<'r>(query: Option<&'r str>, name: &str) -> Presented<'r> {
    match query_parameter(query, name) {
        QueryParameter::Absent => Presented::Absent,
        QueryParameter::Ambiguous => Presented::Ambiguous,
        QueryParameter::One(value) if value.is_empty() => Presented::Absent,
        QueryParameter::One(value) => Presented::One(value),
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::*;

    fn facts<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> RequestFacts<'a> {
        RequestFacts::get("192.0.2.1", headers, query)
    }

    #[test]
    fn digests_are_parsed_from_hex_and_match_the_key() {
        let written = format!("sha256:{}", digest_hex(&digest("test")));
        assert_eq!(
            written,
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert_eq!(parse_digest(&written), Some(digest("test")));
        assert_eq!(parse_digest("sha256:9f86"), None);
        assert_eq!(parse_digest(&written.replace('f', "g")), None);
        assert_eq!(parse_digest(&written.replace("sha256:", "")), None);
    }

    #[test]
    fn a_key_is_read_once_and_a_second_copy_is_ambiguous() {
        let header = CredentialSource::Header(http::HeaderName::from_static("x-api-key"));
        let query = CredentialSource::Query("api_key".to_owned());
        let mut headers = HeaderMap::new();
        assert_eq!(
            presented(&header, &facts(&headers, None)),
            Presented::Absent
        );
        headers.insert("x-api-key", HeaderValue::from_static(" k1 "));
        assert_eq!(
            presented(&header, &facts(&headers, None)),
            Presented::One(b"k1"[..].into())
        );
        headers.append("X-API-KEY", HeaderValue::from_static("k1"));
        assert_eq!(
            presented(&header, &facts(&headers, None)),
            Presented::Ambiguous
        );

        let none = HeaderMap::new();
        for (text, expected) in [
            ("a=1&api_key=k2", Presented::One(b"k2"[..].into())),
            ("api_key=a%2Bb", Presented::One(b"a+b"[..].into())),
            ("api_key=", Presented::Absent),
            ("api_key=k2&api%5Fkey=k3", Presented::Ambiguous),
            ("api_key=k2&api_key=k2", Presented::Ambiguous),
            ("apikey=k2", Presented::Absent),
        ] {
            assert_eq!(
                presented(&query, &facts(&none, Some(text))),
                expected,
                "{text}"
            );
        }
    }
}
