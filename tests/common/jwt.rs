//! JWT test helpers: signing keys (RSA from a fixture, P-256 and Ed25519 generated), their JWKS, signed tokens,
//! and a JWKS served on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::routing::get;
use axum::Router;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tollgate::consumers::jwt::JwtKeySource;

/// The RSA test key (made with `openssl genrsa 2048`, for tests only) and its public half.
pub const RSA_PEM: &str = include_str!("../fixtures/jwt_rsa.pem");
pub const RSA_PUBLIC_PEM: &str = include_str!("../fixtures/jwt_rsa.pub.pem");

/// A signing key and the public JWK that verifies it.
pub struct SigningKey {
    pub alg: Algorithm,
    pub kid: String,
    pub key: EncodingKey,
    pub jwk: Value,
}

/// A JWKS document served on 127.0.0.1, replaceable while served, counting the fetches.
pub struct JwksServer {
    pub addr: SocketAddr,
    document: Arc<Mutex<String>>,
    hits: Arc<AtomicUsize>,
}

pub fn rsa_key(kid: &str) -> SigningKey {
    let key = EncodingKey::from_rsa_pem(RSA_PEM.as_bytes()).expect("RSA test key");
    public(Algorithm::RS256, kid, key)
}

pub fn ec_key(kid: &str) -> SigningKey {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
    let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("EC key");
    public(Algorithm::ES256, kid, key)
}

pub fn ed_key(kid: &str) -> SigningKey {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("Ed25519 key");
    let key = EncodingKey::from_ed_pem(pair.serialize_pem().as_bytes()).expect("Ed key");
    // jsonwebtoken cannot derive an OKP JWK: its `x` is the raw public key.
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": URL_SAFE_NO_PAD.encode(pair.public_key_raw())});
    SigningKey {
        alg: Algorithm::EdDSA,
        kid: kid.to_owned(),
        key,
        jwk,
    }
}

pub fn public(alg: Algorithm, kid: &str, key: EncodingKey) -> SigningKey {
    let mut jwk = Jwk::from_encoding_key(&key, alg).expect("public JWK");
    jwk.common.key_id = Some(kid.to_owned());
    SigningKey {
        alg,
        kid: kid.to_owned(),
        key,
        jwk: serde_json::to_value(jwk).expect("JWK json"),
    }
}

pub fn jwks(keys: &[&SigningKey]) -> String {
    let document = json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
    // What the verifier reads must also be what jsonwebtoken calls a JWKS.
    serde_json::from_value::<JwkSet>(document.clone()).expect("a JWKS");
    document.to_string()
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

pub fn sign(key: &SigningKey, claims: &Value) -> String {
    sign_as(key.alg, Some(&key.kid), &key.key, claims)
}

pub fn sign_as(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).expect("sign")
}

// === impl JwksServer ===

impl JwksServer {
    pub async fn start(document: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, document)
    }

    pub fn serve(listener: TcpListener, document: String) -> Self {
        let addr = listener.local_addr().expect("addr");
        let document = Arc::new(Mutex::new(document));
        let hits = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (document.clone(), hits.clone());
        let app = Router::new().route(
            "/.well-known/jwks.json",
            get(move || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                let body = served.lock().expect("document").clone();
                ([(http::header::CONTENT_TYPE, "application/json")], body)
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            document,
            hits,
        }
    }

    pub fn source(&self) -> JwtKeySource {
        url_source(self.addr)
    }

    pub fn replace(&self, document: String) {
        *self.document.lock().expect("document") = document;
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

pub fn url_source(addr: SocketAddr) -> JwtKeySource {
    JwtKeySource::Url {
        url: format!("http://{addr}/.well-known/jwks.json")
            .parse()
            .expect("url"),
        // Long: a refetch in these tests is one a token asked for.
        refresh: Duration::from_secs(3600),
    }
}

/// `base`'s claims with `extra` merged over them (`null` removes a claim).
pub fn merged(mut base: Value, extra: Value) -> Value {
    for (name, value) in extra.as_object().expect("object") {
        if value.is_null() {
            base.as_object_mut().expect("object").remove(name);
        } else {
            base[name] = value.clone();
        }
    }
    base
}
