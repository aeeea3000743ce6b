//! A set of verification keys: each JWKS key (or the HS256 secret) with what it may verify.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};
use serde::Deserialize;

use super::rejection::TokenRejection;

/// The keys a verifier holds at one time. A new set (a JWKS that changed) gets a new `generation`, which the
/// token cache compares so that nothing verified by a key now gone stays cached.
#[derive(Debug)]
pub(crate) struct KeySet {
    pub generation: u64,
    keys: Vec<Key>,
    /// The HS256 secret answers every token, whatever `kid` it names.
    ignore_kid: bool,
    /// What the JWKS document said, to tell a refresh that changed nothing from one that did.
    source: Vec<Jwk>,
}

/// One usable key.
#[derive(Debug)]
struct Key {
    kid: Option<String>,
    /// The only algorithm it verifies when the JWKS names one (`alg`); else any of its family and curve.
    alg: Option<Algorithm>,
    curve: Option<EllipticCurve>,
    key: DecodingKey,
}

/// A JWKS document, each key read on its own: a key of a kind this verifier cannot use is skipped, not fatal.
#[derive(Deserialize)]
struct JwksDocument {
    keys: Vec<serde_json::Value>,
}

// === impl KeySet ===

impl KeySet {
    /// The keys of a JWKS document usable with `algorithms`; an error says why there is none.
    pub fn from_jwks(
        json: &[u8],
        algorithms: &[Algorithm],
        generation: u64,
    ) -> Result<Self, String> {
        let document: JwksDocument = serde_json::from_slice(json)
            .map_err(|error| format!("not a JWKS document ({{\"keys\": [...]}}): {error}"))?;
        let mut keys = Vec::new();
        let mut source = Vec::new();
        let mut skipped = Vec::new();
        for (index, value) in document.keys.into_iter().enumerate() {
            let jwk: Jwk = match serde_json::from_value(value) {
                Ok(jwk) => jwk,
                Err(error) => {
                    skipped.push(format!("key {index}: {error}"));
                    continue;
                }
            };
            match Key::from_jwk(&jwk, algorithms) {
                Ok(key) => keys.push(key),
                Err(why) => skipped.push(format!("key {index}: {why}")),
            }
            source.push(jwk);
        }
        if keys.is_empty() {
            let algorithms: Vec<_> = algorithms.iter().map(|a| format!("{a:?}")).collect();
            return Err(format!(
                "no key usable with {} in it{}",
                algorithms.join(", "),
                if skipped.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", skipped.join("; "))
                }
            ));
        }
        for why in &skipped {
            tracing::debug!(%why, "JWKS key skipped");
        }
        Ok(Self {
            generation,
            keys,
            ignore_kid: false,
            source,
        })
    }

    /// The set of one HS256 secret.
    pub fn from_secret(secret: &[u8], generation: u64) -> Self {
        Self {
            generation,
            keys: vec![Key {
                kid: None,
                alg: Some(Algorithm::HS256),
                curve: None,
                key: DecodingKey::from_secret(secret),
            }],
            ignore_kid: true,
            source: Vec::new(),
        }
    }

    /// Whether `other` came from the same JWKS keys (a refresh that changed nothing keeps the cache).
    pub fn same_keys(&self, other: &KeySet) -> bool {
        self.source == other.source
    }

    /// The keys that may verify a token with `alg` and `kid`, in the set's order. `UnknownKey` when none has the
    /// `kid` (or, without one, none fits `alg`); `AlgorithmNotAllowed` when the key named does not fit `alg` (an
    /// HS256 token naming an RSA key: the classic confusion, refused before any HMAC is computed).
    pub fn candidates<'a>(
        &'a self,
        alg: Algorithm,
        kid: Option<&'a str>,
    ) -> Result<impl Iterator<Item = &'a DecodingKey> + 'a, TokenRejection> {
        let kid = kid.filter(|_| !self.ignore_kid);
        let named = move |key: &&Key| kid.is_none() || key.kid.as_deref() == kid;
        if !self.keys.iter().any(|key| named(&key)) {
            return Err(TokenRejection::UnknownKey);
        }
        if !self.keys.iter().any(|key| named(&key) && key.fits(alg)) {
            return Err(match kid {
                Some(_) => TokenRejection::AlgorithmNotAllowed,
                None => TokenRejection::UnknownKey,
            });
        }
        Ok(self
            .keys
            .iter()
            .filter(move |key| named(key) && key.fits(alg))
            .map(|key| &key.key))
    }

    /// Whether `kid` names a key of the set (a token naming another may mean the issuer rotated its keys).
    pub fn knows(&self, kid: &str) -> bool {
        self.ignore_kid || self.keys.iter().any(|key| key.kid.as_deref() == Some(kid))
    }

    /// How many usable keys it holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

// === impl Key ===

impl Key {
    fn from_jwk(jwk: &Jwk, algorithms: &[Algorithm]) -> Result<Self, String> {
        if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
            return Err("an encryption key (use: enc)".to_owned());
        }
        let alg = match jwk.common.key_algorithm {
            None => None,
            Some(named) => {
                Some(algorithm(named).ok_or_else(|| format!("alg {named} not supported"))?)
            }
        };
        let curve = match &jwk.algorithm {
            AlgorithmParameters::EllipticCurve(params) => Some(params.curve.clone()),
            AlgorithmParameters::OctetKeyPair(params) => Some(params.curve.clone()),
            AlgorithmParameters::RSA(_) | AlgorithmParameters::OctetKey(_) => None,
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|error| format!("unusable: {error}"))?;
        let key = Self {
            kid: jwk.common.key_id.clone(),
            alg,
            curve,
            key,
        };
        if !algorithms.iter().any(|alg| key.fits(*alg)) {
            return Err("fits none of the allowed algorithms".to_owned());
        }
        Ok(key)
    }

    /// Whether this key verifies tokens signed with `alg`: same family, same curve, and the JWK's own `alg` if any.
    fn fits(&self, alg: Algorithm) -> bool {
        if self.alg.is_some_and(|own| own != alg) || self.key.family() != alg.family() {
            return false;
        }
        match alg.family() {
            AlgorithmFamily::Ec => match alg {
                Algorithm::ES256 => self.curve == Some(EllipticCurve::P256),
                Algorithm::ES384 => self.curve == Some(EllipticCurve::P384),
                _ => false,
            },
            AlgorithmFamily::Ed => self.curve == Some(EllipticCurve::Ed25519),
            AlgorithmFamily::Rsa | AlgorithmFamily::Hmac => true,
        }
    }
}

/// The signing algorithm a JWK's `alg` names, if it is one.
fn algorithm(named: KeyAlgorithm) -> Option<Algorithm> {
    Some(match named {
        KeyAlgorithm::HS256 => Algorithm::HS256,
        KeyAlgorithm::HS384 => Algorithm::HS384,
        KeyAlgorithm::HS512 => Algorithm::HS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        KeyAlgorithm::RSA1_5
        | KeyAlgorithm::RSA_OAEP
        | KeyAlgorithm::RSA_OAEP_256
        | KeyAlgorithm::UNKNOWN_ALGORITHM => return None,
    })
}
