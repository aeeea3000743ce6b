//! JWT signatures checked by ring, as the binary has them (`use_ring_for_signatures`): a process of its own,
//! since jsonwebtoken's crypto is chosen once per process, before its first use.

mod common;

use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::json;
use tollgate::consumers::jwt::{
    use_ring_for_signatures, JwtKeySource, JwtSettings, JwtVerifier, TokenRejection,
};

use common::jwt::{ec_key, ed_key, jwks, now, public, rsa_key, sign, sign_as, RSA_PUBLIC_PEM};

/// Too short for ring (1024 bits), long enough for RustCrypto.
const SHORT_RSA_PEM: &str = include_str!("fixtures/jwt_rsa1024.pem");

#[test]
fn ring_checks_rs256_es256_and_eddsa_signatures() {
    // The one test of this process, so nothing uses jsonwebtoken before this line.
    assert!(use_ring_for_signatures(), "jsonwebtoken was used before");
    assert!(!use_ring_for_signatures(), "only the first call takes");

    let (rsa, ec, ed) = (rsa_key("rsa"), ec_key("ec"), ed_key("ed"));
    let short = public(
        Algorithm::RS256,
        "short",
        EncodingKey::from_rsa_pem(SHORT_RSA_PEM.as_bytes()).expect("1024-bit key"),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, jwks(&[&rsa, &ec, &ed, &short])).expect("write JWKS");
    let verifier = JwtVerifier::new(JwtSettings::new(
        vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
        JwtKeySource::File(path),
    ))
    .expect("verifier");
    let claims = json!({"sub": "acme", "exp": now() + 600});

    for key in [&rsa, &ec, &ed] {
        let token = sign(key, &claims);
        assert!(verifier.verify_uncached(&token).is_ok(), "{:?}", key.alg);
        // The signature of another token of the same key: the claims are not what was signed.
        let other = sign(key, &json!({"sub": "mallory", "exp": now() + 600}));
        let (head, _) = token.rsplit_once('.').expect("three parts");
        let (_, signature) = other.rsplit_once('.').expect("three parts");
        assert_eq!(
            verifier.verify(&format!("{head}.{signature}")),
            Err(TokenRejection::BadSignature),
            "{:?}",
            key.alg
        );
    }
    // ring refuses RSA keys under 2048 bits (RustCrypto would accept this token): ring did the check.
    assert_eq!(
        verifier.verify(&sign(&short, &claims)),
        Err(TokenRejection::BadSignature)
    );
    // HS256 "signed" with the RSA public key, naming the RSA key: refused before any check.
    let forged = sign_as(
        Algorithm::HS256,
        Some("rsa"),
        &EncodingKey::from_secret(RSA_PUBLIC_PEM.as_bytes()),
        &claims,
    );
    assert_eq!(
        verifier.verify(&forged),
        Err(TokenRejection::AlgorithmNotAllowed)
    );
}
