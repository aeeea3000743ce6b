//! jsonwebtoken's signature checks on ring (the crate rustls already uses here), for tokens that miss the cache.

use std::sync::OnceLock;

use jsonwebtoken::crypto::{rust_crypto, CryptoProvider, JwtVerifier as SignatureCheck};
use jsonwebtoken::errors::{ErrorKind, Result};
use jsonwebtoken::signature::{Error as SignatureError, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind};
use ring::signature::{
    RsaParameters, RsaPublicKeyComponents, UnparsedPublicKey, VerificationAlgorithm,
    ECDSA_P256_SHA256_FIXED, ECDSA_P384_SHA384_FIXED, ED25519, RSA_PKCS1_2048_8192_SHA256,
    RSA_PKCS1_2048_8192_SHA384, RSA_PKCS1_2048_8192_SHA512, RSA_PSS_2048_8192_SHA256,
    RSA_PSS_2048_8192_SHA384, RSA_PSS_2048_8192_SHA512,
};

/// One public-key signature check by ring.
struct RingCheck {
    algorithm: Algorithm,
    key: PublicKey,
}

/// A verification key as ring takes it.
enum PublicKey {
    /// An RSA key from a JWK's `n` and `e`.
    RsaComponents {
        n: Vec<u8>,
        e: Vec<u8>,
        params: &'static RsaParameters,
    },
    /// An EC point (`04 || x || y`), an Ed25519 key, or an RSA key in PKCS#1 DER.
    Encoded {
        bytes: Vec<u8>,
        algorithm: &'static dyn VerificationAlgorithm,
    },
}

/// Makes ring check the RSA, ECDSA and EdDSA signatures of every jsonwebtoken `decode` in this process; HMAC and
/// signing stay RustCrypto's. Each token that misses the cache, forged ones included, costs one check, which ring
/// makes faster (`benches/jwt.rs`; the figures in BENCHMARKS.md). It only takes
/// before jsonwebtoken's first use in the process (whose crypto is then fixed for good): returns whether it took.
/// The binary calls it first thing; an embedding program may.
///
/// ring refuses RSA keys under 2048 bits, which RustCrypto would accept: tokens they sign are `bad_signature`.
pub fn use_ring_for_signatures() -> bool {
    static PROVIDER: OnceLock<CryptoProvider> = OnceLock::new();
    PROVIDER
        .get_or_init(ring_provider)
        .install_default()
        .is_ok()
}

/// RustCrypto's provider with ring's public-key checks.
fn ring_provider() -> CryptoProvider {
    let rust = &rust_crypto::DEFAULT_PROVIDER;
    CryptoProvider {
        signer_factory: rust.signer_factory,
        verifier_factory: ring_check,
        jwk_utils: rust.jwk_utils.clone(),
    }
}

/// The check of `algorithm` with `key`, refusing a key of another family as RustCrypto's does.
fn ring_check(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn SignatureCheck>> {
    let algorithm = *algorithm;
    if algorithm.family() == AlgorithmFamily::Hmac {
        return (rust_crypto::DEFAULT_PROVIDER.verifier_factory)(&algorithm, key);
    }
    if key.family() != algorithm.family() {
        return Err(ErrorKind::InvalidKeyFormat.into());
    }
    let rsa = |params: &'static RsaParameters| match key.kind() {
        DecodingKeyKind::RsaModulusExponent { n, e } => PublicKey::RsaComponents {
            n: n.clone(),
            e: e.clone(),
            params,
        },
        DecodingKeyKind::SecretOrDer(der) => PublicKey::Encoded {
            bytes: der.clone(),
            algorithm: params,
        },
    };
    let encoded = |algorithm: &'static dyn VerificationAlgorithm| match key.kind() {
        DecodingKeyKind::SecretOrDer(bytes) => Ok(PublicKey::Encoded {
            bytes: bytes.clone(),
            algorithm,
        }),
        DecodingKeyKind::RsaModulusExponent { .. } => Err(ErrorKind::InvalidKeyFormat),
    };
    let public_key = match algorithm {
        Algorithm::RS256 => rsa(&RSA_PKCS1_2048_8192_SHA256),
        Algorithm::RS384 => rsa(&RSA_PKCS1_2048_8192_SHA384),
        Algorithm::RS512 => rsa(&RSA_PKCS1_2048_8192_SHA512),
        Algorithm::PS256 => rsa(&RSA_PSS_2048_8192_SHA256),
        Algorithm::PS384 => rsa(&RSA_PSS_2048_8192_SHA384),
        Algorithm::PS512 => rsa(&RSA_PSS_2048_8192_SHA512),
        Algorithm::ES256 => encoded(&ECDSA_P256_SHA256_FIXED)?,
        Algorithm::ES384 => encoded(&ECDSA_P384_SHA384_FIXED)?,
        Algorithm::EdDSA => encoded(&ED25519)?,
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            return (rust_crypto::DEFAULT_PROVIDER.verifier_factory)(&algorithm, key)
        }
    };
    Ok(Box::new(RingCheck {
        algorithm,
        key: public_key,
    }))
}

// === impl RingCheck ===

impl Verifier<Vec<u8>> for RingCheck {
    fn verify(
        &self,
        message: &[u8],
        signature: &Vec<u8>,
    ) -> std::result::Result<(), SignatureError> {
        let checked = match &self.key {
            PublicKey::RsaComponents { n, e, params } => RsaPublicKeyComponents {
                n: n.as_slice(),
                e: e.as_slice(),
            }
            .verify(params, message, signature),
            PublicKey::Encoded { bytes, algorithm } => {
                UnparsedPublicKey::new(*algorithm, bytes).verify(message, signature)
            }
        };
        checked.map_err(|_| SignatureError::new())
    }
}

impl SignatureCheck for RingCheck {
    fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::jwk::Jwk;
    use jsonwebtoken::EncodingKey;

    use super::*;

    const RSA_PEM: &str = include_str!("../../../tests/fixtures/jwt_rsa.pem");

    /// Signing keys of each family and the decoding keys their JWKs give, as the verifier builds them.
    fn keys() -> Vec<(Algorithm, EncodingKey, DecodingKey)> {
        let rsa = EncodingKey::from_rsa_pem(RSA_PEM.as_bytes()).expect("RSA key");
        let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256");
        let ec = EncodingKey::from_ec_pem(p256.serialize_pem().as_bytes()).expect("EC key");
        let ed25519 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("Ed25519");
        let ed = EncodingKey::from_ed_pem(ed25519.serialize_pem().as_bytes()).expect("Ed key");
        let decoding = |key: &EncodingKey, alg| {
            DecodingKey::from_jwk(&Jwk::from_encoding_key(key, alg).expect("JWK")).expect("key")
        };
        let ed_public = DecodingKey::from_ed_der(ed25519.public_key_raw());
        vec![
            (
                Algorithm::RS256,
                rsa.clone(),
                decoding(&rsa, Algorithm::RS256),
            ),
            (
                Algorithm::ES256,
                ec.clone(),
                decoding(&ec, Algorithm::ES256),
            ),
            (Algorithm::EdDSA, ed, ed_public),
        ]
    }

    fn sign(alg: Algorithm, key: &EncodingKey, message: &[u8]) -> Vec<u8> {
        let signature = jsonwebtoken::crypto::sign(message, key, alg).expect("sign");
        base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, signature)
            .expect("base64")
    }

    #[test]
    fn ring_accepts_what_rustcrypto_signs_and_refuses_the_rest() {
        let keys = keys();
        for (alg, signing, decoding) in &keys {
            let check = ring_check(alg, decoding).expect("a ring check");
            let signature = sign(*alg, signing, b"header.claims");
            assert!(
                check.verify(b"header.claims", &signature).is_ok(),
                "{alg:?}"
            );
            assert!(
                check.verify(b"header.claimz", &signature).is_err(),
                "{alg:?}: another message"
            );
            let mut flipped = signature.clone();
            flipped[0] ^= 1;
            assert!(
                check.verify(b"header.claims", &flipped).is_err(),
                "{alg:?}: a changed signature"
            );
            assert_eq!(check.algorithm(), *alg);
        }
        // A key of another family is refused before anything is checked: no ES256 check with an RSA key, no
        // HS256 check with anything but a secret.
        let (_, _, rsa) = &keys[0];
        for alg in [Algorithm::ES256, Algorithm::EdDSA, Algorithm::HS256] {
            assert!(ring_check(&alg, rsa).is_err(), "{alg:?} with an RSA key");
        }
    }

    #[test]
    fn hmac_stays_rustcrypto() {
        let secret = b"a shared secret of at least 32 bytes";
        let check =
            ring_check(&Algorithm::HS256, &DecodingKey::from_secret(secret)).expect("HS256");
        let signature = sign(Algorithm::HS256, &EncodingKey::from_secret(secret), b"m");
        assert!(check.verify(b"m", &signature).is_ok());
        assert!(check.verify(b"n", &signature).is_err());
    }
}
