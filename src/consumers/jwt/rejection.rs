//! Why a token is refused (the class a 401 names), and why a verifier cannot be built.

use std::path::PathBuf;

use thiserror::Error;

/// Why a token was refused; [`reason`](Self::reason) is the class put in the 401 JSON body and `WWW-Authenticate`
/// (`invalid_token` per RFC 6750, with an `error_description` naming the class, never the token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TokenRejection {
    /// Not `Bearer <token>`, not three base64url parts, or a header or claims that are not JSON.
    #[error("malformed token")]
    Malformed,
    /// The token's `alg` is not in `algorithms` (`none` never is), or does not fit the key it names.
    #[error("token algorithm not allowed")]
    AlgorithmNotAllowed,
    /// No key of the set has the token's `kid` (or, without a `kid`, no key fits its `alg`).
    #[error("token signed by an unknown key")]
    UnknownKey,
    /// The signature does not verify.
    #[error("token signature does not verify")]
    BadSignature,
    /// `exp` is past (beyond the leeway).
    #[error("token expired")]
    Expired,
    /// `nbf` is ahead (beyond the leeway).
    #[error("token not yet valid")]
    NotYetValid,
    /// `iss` missing or not the configured issuer.
    #[error("token issuer not accepted")]
    WrongIssuer,
    /// `aud` missing or naming none of the configured audiences.
    #[error("token audience not accepted")]
    WrongAudience,
    /// The consumer claim is absent, empty or not a string, or there is no `exp`.
    #[error("token lacks a required claim")]
    MissingClaim,
    /// The consumer claim is not a valid consumer id (1 to 128 of `A-Z a-z 0-9 . _ : @ -`, not `.` or `..`).
    #[error("token consumer claim is not a valid consumer id")]
    InvalidConsumerId,
    /// The JWKS URL has not been fetched yet.
    #[error("token keys not available yet")]
    KeysUnavailable,
}

/// Why a [`JwtVerifier`](super::JwtVerifier) cannot be built: start-up (or a reload) fails, naming the file or URL.
#[derive(Debug, Error)]
pub enum JwtSetupError {
    /// The JWKS file cannot be read.
    #[error("jwks_file {}: cannot read it: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The JWKS file is not a JWKS document, or holds no key usable with the allowed algorithms.
    #[error("jwks_file {}: {message}", path.display())]
    InvalidFile { path: PathBuf, message: String },
    /// The JWKS URL cannot be fetched by the gateway (scheme, host, or no trusted roots for `https`).
    #[error("jwks_url {url}: {message}")]
    InvalidUrl { url: String, message: String },
    /// The HS256 secret is empty.
    #[error("the HS256 secret is empty")]
    EmptySecret,
}

// === impl TokenRejection ===

/// Each class's name, written once: the `reason` and the `WWW-Authenticate` value are made from it at compile time.
macro_rules! token_rejection_classes {
    ($($variant:ident => $reason:literal,)*) => {
        impl TokenRejection {
            /// Every class, for tests and docs.
            pub const ALL: &'static [TokenRejection] = &[$(Self::$variant,)*];

            /// The class, as put in the 401 body and `error_description`.
            pub fn reason(&self) -> &'static str {
                match self {
                    $(Self::$variant => $reason,)*
                }
            }

            /// The `WWW-Authenticate` value of the 401 (RFC 6750 §3), built without allocating.
            pub fn www_authenticate(&self) -> &'static str {
                match self {
                    $(Self::$variant => concat!(
                        r#"Bearer error="invalid_token", error_description=""#,
                        $reason,
                        '"'
                    ),)*
                }
            }
        }
    };
}

token_rejection_classes! {
    Malformed => "malformed",
    AlgorithmNotAllowed => "algorithm_not_allowed",
    UnknownKey => "unknown_key",
    BadSignature => "bad_signature",
    Expired => "expired",
    NotYetValid => "not_yet_valid",
    WrongIssuer => "wrong_issuer",
    WrongAudience => "wrong_audience",
    MissingClaim => "missing_claim",
    InvalidConsumerId => "invalid_consumer_id",
    KeysUnavailable => "keys_unavailable",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_names_the_reason() {
        for rejection in TokenRejection::ALL {
            assert_eq!(
                rejection.www_authenticate(),
                format!(
                    r#"Bearer error="invalid_token", error_description="{}""#,
                    rejection.reason()
                )
            );
        }
    }
}
