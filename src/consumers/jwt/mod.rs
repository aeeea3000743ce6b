//! JWT consumers: bearer tokens verified against a JWKS (file or URL) or an HS256 secret, cached until they expire.

mod bearer;
mod cache;
mod crypto;
mod jwks;
mod keys;
mod rejection;
mod settings;
mod verifier;

pub(crate) use bearer::other_scheme;
pub use crypto::use_ring_for_signatures;
pub use rejection::{JwtSetupError, TokenRejection};
pub use settings::{
    JwtKeySource, JwtSettings, DEFAULT_CONSUMER_PREFIX, DEFAULT_JWKS_REFRESH, TOKEN_CACHE_BYTES,
    TOKEN_CACHE_CAPACITY,
};
pub use verifier::{JwtVerifier, VerifiedToken};
