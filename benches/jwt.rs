//! Criterion benches of JWT verification: a token served from the cache (what every request after a token's first
//! costs) beside a full RS256 and ES256 check (the first request, and what the cache saves), and the bearer
//! header read.
//!
//! Run with `cargo bench --bench jwt` (about half a minute). Signatures are checked by ring, as in the binary;
//! `JWT_CRYPTO=rustcrypto` measures jsonwebtoken's RustCrypto checks instead. For an instruction count, which a shared machine does
//! not blur as it does times, `JWT_COUNT=<bench>:<n>` runs that bench's routine n times without criterion; run it
//! under callgrind for n = 0 and n = 10000 and divide the difference by 10000:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/jwt-HASH 2>&1 | grep refs
//! JWT_COUNT=cached_rs256:10000 valgrind --tool=callgrind ... (uncached_rs256, uncached_es256, token_from_header)
//! ```

use std::hint::black_box;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, Criterion};
use http::{HeaderMap, HeaderValue};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use tollgate::consumers::jwt::{JwtKeySource, JwtSettings, JwtVerifier};

/// The test-only RSA key of tests/jwt.rs.
const RSA_PEM: &str = include_str!("../tests/fixtures/jwt_rsa.pem");

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

/// A verifier holding one RS256 and one ES256 key (JWKS file), and a token signed by each, with realistic claims.
fn setup() -> (JwtVerifier, String, String, tempfile::TempDir) {
    let rsa = EncodingKey::from_rsa_pem(RSA_PEM.as_bytes()).expect("RSA key");
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
    let ec = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("EC key");
    let jwk = |key: &EncodingKey, alg, kid: &str| {
        let mut jwk = Jwk::from_encoding_key(key, alg).expect("JWK");
        jwk.common.key_id = Some(kid.to_owned());
        jwk
    };
    let document =
        json!({"keys": [jwk(&rsa, Algorithm::RS256, "rsa"), jwk(&ec, Algorithm::ES256, "ec")]});
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, document.to_string()).expect("write JWKS");
    let mut settings = JwtSettings::new(
        vec![Algorithm::RS256, Algorithm::ES256],
        JwtKeySource::File(path),
    );
    settings.issuer = Some("https://auth.example.test".to_owned());
    settings.audiences = vec!["api".to_owned()];
    settings.plan_claim = Some("tier".to_owned());
    let verifier = JwtVerifier::new(settings).expect("verifier");
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    let claims = json!({"sub": "acme-7f3a", "tier": "pro", "iss": "https://auth.example.test", "aud": "api",
                        "exp": exp, "iat": exp - 3600, "scope": "read write"});
    let sign = |alg, kid: &str, key: &EncodingKey| {
        let mut header = Header::new(alg);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, &claims, key).expect("sign")
    };
    let rs256 = sign(Algorithm::RS256, "rsa", &rsa);
    let es256 = sign(Algorithm::ES256, "ec", &ec);
    (verifier, rs256, es256, dir)
}

fn verify(c: &mut Criterion) {
    let (verifier, rs256, es256, _dir) = setup();
    assert!(verifier.verify(&rs256).is_ok() && verifier.verify(&es256).is_ok());
    let mut group = c.benchmark_group("jwt_verify");
    group.bench_function("cached_rs256", |b| {
        b.iter(|| verifier.verify(black_box(&rs256)))
    });
    group.bench_function("uncached_rs256", |b| {
        b.iter(|| verifier.verify_uncached(black_box(&rs256)))
    });
    group.bench_function("uncached_es256", |b| {
        b.iter(|| verifier.verify_uncached(black_box(&es256)))
    });
    group.finish();

    let mut headers = HeaderMap::new();
    let value = format!("Bearer {rs256}");
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&value).expect("header"),
    );
    c.bench_function("jwt_token_from_header", |b| {
        b.iter(|| {
            verifier
                .token_from(black_box(&headers))
                .map(|t| t.map(str::len))
        })
    });
}

/// `JWT_COUNT=<bench>:<n>`: the routine of `<bench>` n times, for an instruction count under callgrind.
fn count(spec: &str) {
    let (bench, n) = spec.split_once(':').expect("JWT_COUNT=<bench>:<n>");
    let n: u64 = n.parse().expect("a count");
    let (verifier, rs256, es256, _dir) = setup();
    assert!(verifier.verify(&rs256).is_ok() && verifier.verify(&es256).is_ok());
    let mut headers = HeaderMap::new();
    let value = format!("Bearer {rs256}");
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&value).expect("header"),
    );
    for _ in 0..n {
        match bench {
            "cached_rs256" => drop(black_box(verifier.verify(black_box(&rs256)))),
            "uncached_rs256" => drop(black_box(verifier.verify_uncached(black_box(&rs256)))),
            "uncached_es256" => drop(black_box(verifier.verify_uncached(black_box(&es256)))),
            "token_from_header" => {
                black_box(
                    verifier
                        .token_from(black_box(&headers))
                        .map(|t| t.map(str::len)),
                );
            }
            other => panic!("no bench {other}"),
        }
    }
}

criterion_group! {
    name = benches;
    config = quick();
    targets = verify
}

fn main() {
    // As the binary does, unless `JWT_CRYPTO=rustcrypto` asks for jsonwebtoken's own (RustCrypto) checks.
    if std::env::var("JWT_CRYPTO").as_deref() != Ok("rustcrypto") {
        assert!(tollgate::consumers::jwt::use_ring_for_signatures());
    }
    match std::env::var("JWT_COUNT") {
        Ok(spec) => count(&spec),
        Err(_) => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
