//! The token of a request (`Bearer <token>`) and what its JOSE header names (`alg`, `kid`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use super::rejection::TokenRejection;

/// Longer tokens are refused unread: real ones are a few KB at most, and each cached one is kept whole.
pub(crate) const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The fields of a token's header that choose its key.
#[derive(Debug, Deserialize)]
pub(crate) struct JoseHeader {
    pub alg: String,
    #[serde(default)]
    pub kid: Option<String>,
}

/// The token in `name`: `None` without the header or with another scheme's credentials in it (`Basic ...`),
/// `Malformed` when it is there but not one `Bearer <token>`.
pub(crate) fn token_from<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Option<Result<&'h str, TokenRejection>> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    // Two credentials are ambiguous: which one a proxy in front read is anyone's guess.
    if values.next().is_some() {
        return Some(Err(TokenRejection::Malformed));
    }
    if other_scheme(value) {
        return None;
    }
    Some(token_in(value))
}

/// Whether `value` holds another scheme's credentials (`Basic ...`, `Digest ...`, anything not starting with the
/// word `Bearer`): no bearer token at all, so no credential for a JWT identifier, rather than a malformed one. A
/// route with optional consumers then serves the request as anonymous (the upstream may check its own
/// `Authorization`), and a later identifier may still name the caller.
pub(crate) fn other_scheme(value: &HeaderValue) -> bool {
    const SCHEME: &[u8] = b"bearer";
    let value = value.as_bytes();
    !(value.len() >= SCHEME.len() && value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME))
}

/// The token in one header value, `Malformed` when it is not `Bearer <token>`.
pub(crate) fn token_in(value: &HeaderValue) -> Result<&str, TokenRejection> {
    bearer(value.as_bytes()).ok_or(TokenRejection::Malformed)
}

/// `Bearer` (any case), spaces, then the token. Its characters are not checked here: a cache hit is a token that
/// verified, and a miss is decoded, which refuses anything but three base64url parts as `Malformed` (a scan here
/// would cost instructions for every byte of every request's token).
fn bearer(value: &[u8]) -> Option<&str> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let token = std::str::from_utf8(&value[SCHEME.len()..])
        .ok()?
        .trim_matches(' ');
    (!token.is_empty()).then_some(token)
}

/// The JOSE header of `token` (its first part), read to pick the key and refuse `alg`s (`none` too) by name.
pub(crate) fn jose_header(token: &str) -> Result<JoseHeader, TokenRejection> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenRejection::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenRejection::Malformed);
    };
    let json = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| TokenRejection::Malformed)?;
    serde_json::from_slice(&json).map_err(|_| TokenRejection::Malformed)
}

#[cfg(test)]
mod tests {
    use http::header::AUTHORIZATION;
    use http::HeaderValue;

    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                AUTHORIZATION,
                HeaderValue::from_str(value).expect("header value"),
            );
        }
        headers
    }

    #[test]
    fn reads_a_bearer_token_in_any_case() {
        for value in [
            "Bearer a.b.c",
            "bearer a.b.c",
            "BEARER   a.b.c ",
            "Bearer a.b.c==",
        ] {
            let headers = headers(&[value]);
            let token = token_from(&headers, &AUTHORIZATION);
            assert!(
                matches!(token, Some(Ok(t)) if t.trim_end_matches('=') == "a.b.c"),
                "{value}: {token:?}"
            );
        }
    }

    #[test]
    fn no_header_is_no_credential() {
        assert_eq!(token_from(&HeaderMap::new(), &AUTHORIZATION), None);
    }

    #[test]
    fn another_scheme_is_no_token() {
        for value in [
            "Basic dXNlcjpwYXNz",
            "Digest username=\"a\"",
            "token abc",
            "Bear a.b.c",
        ] {
            assert_eq!(
                token_from(&headers(&[value]), &AUTHORIZATION),
                None,
                "{value}"
            );
        }
    }

    #[test]
    fn anything_but_one_bearer_token_is_malformed() {
        for values in [
            &["Bearer"][..],
            &["Bearer "],
            &["Bearera.b.c"],
            &["Bearer a.b.c", "Bearer d.e.f"],
        ] {
            let headers = headers(values);
            assert_eq!(
                token_from(&headers, &AUTHORIZATION),
                Some(Err(TokenRejection::Malformed)),
                "{values:?}"
            );
        }
    }

    #[test]
    fn reads_alg_and_kid_from_the_first_part() {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","kid":"k1","typ":"JWT"}"#);
        let parsed = jose_header(&format!("{header}.e30.")).expect("header");
        assert_eq!(parsed.alg, "none");
        assert_eq!(parsed.kid.as_deref(), Some("k1"));
        for token in [
            "a.b",
            "a.b.c.d",
            "!!!.e30.sig",
            &format!("{}.e30.sig", URL_SAFE_NO_PAD.encode("[]")),
        ] {
            assert!(jose_header(token).is_err(), "{token}");
        }
    }
}
