//! A consumer's runtime settings as stored (in Redis as JSON) and taken by the admin API, and the API keys issued
//! at runtime: only their SHA-256 digest is kept.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use crate::consumers::parse_hex_digest as parse_digest;
use crate::consumers::{api_key_digest as digest, digest_hex};

/// What the admin API set for one consumer at runtime. Missing fields are their defaults, so `{"plan":"pro"}` is
/// a whole record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerRecord {
    /// The plan, ahead of a static key's plan and a token's claim; `None` leaves those to decide.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Per limit name of the plan, the parameters that replace the plan's for this consumer.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, LimitOverride>,
    /// Refused (403) while true.
    pub blocked: bool,
    /// API keys issued at runtime ([`Directory::add_key`](super::Directory::add_key)).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyRecord>,
}

/// The parameters of one plan limit replaced for one consumer, written as in the config (`"20000/1h"`, `"1m"`).
/// Which fields apply depends on the limit's algorithm: checked against the plan where plans are known, not here.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    /// A `concurrency` limit's requests in flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

/// An API key issued at runtime, as kept: its id (to revoke it by), the SHA-256 of the key (lower-case hex; the
/// key itself is shown once and never stored) and when it was issued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    pub id: String,
    pub sha256: String,
    pub created_ms: u64,
}

/// Why a random key could not be made.
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random number generator failed: {0}")]
pub struct RandomError(String);

/// Random bytes in an API key: 256 bits, beyond guessing.
const KEY_BYTES: usize = 32;
/// Random bytes in a key's id: the id is not secret (it is shown by `GET /consumers/{id}`), only unique per
/// consumer, which is checked.
const KEY_ID_BYTES: usize = 4;
/// What every issued key starts with, so that a leaked one can be recognised (secret scanners, logs).
pub const KEY_PREFIX: &str = "tg_";

// === impl ConsumerRecord ===

impl ConsumerRecord {
    /// The record's keys' digests, skipping any that is not 64 hex digits (a record written by hand).
    pub fn key_digests(&self) -> impl Iterator<Item = [u8; 32]> + '_ {
        self.keys.iter().filter_map(|key| parse_digest(&key.sha256))
    }
}

// === impl KeyRecord ===

impl KeyRecord {
    /// A new key for a consumer whose keys are `taken`: the record to keep, and the key's text (`tg_` and 64 hex
    /// digits from the OS's CSPRNG), to show once.
    pub fn issue(taken: &[KeyRecord]) -> Result<(Self, String), RandomError> {
        let key = format!("{KEY_PREFIX}{}", hex(&random::<KEY_BYTES>()?));
        let id = loop {
            let id = format!("k_{}", hex(&random::<KEY_ID_BYTES>()?));
            if !taken.iter().any(|key| key.id == id) {
                break id;
            }
        };
        let record = Self {
            id,
            sha256: digest_hex(&digest(&key)),
            created_ms: now_ms(),
        };
        Ok((record, key))
    }
}

/// A fresh random lineage for the directory's change counter (see `scripts/write.lua`): 64 bits, so that two
/// counters started at different times never share one.
#[cfg(feature = "redis")]
pub(super) fn lineage_token() -> Result<String, RandomError> {
    Ok(hex(&random::<8>()?))
}

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

/// `N` bytes from the operating system's CSPRNG: keys must not be predictable from earlier ones, which a
/// general-purpose generator (fastrand) does not promise.
fn random<const N: usize>() -> Result<[u8; N], RandomError> {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes).map_err(|error| RandomError(error.to_string()))?;
    Ok(bytes)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_as_the_admin_api_writes_it() {
        let json = r#"{"plan":"pro","overrides":{"hourly":{"rate":"20000/1h","burst":500}},"blocked":false,
            "keys":[{"id":"k_3f9a1c2b","sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","created_ms":1764000000000}]}"#;
        let record: ConsumerRecord = serde_json::from_str(json).expect("valid");
        assert_eq!(record.plan.as_deref(), Some("pro"));
        assert_eq!(record.overrides["hourly"].burst, Some(500));
        assert_eq!(record.keys[0].created_ms, 1_764_000_000_000);
        let again: ConsumerRecord =
            serde_json::from_str(&serde_json::to_string(&record).expect("json")).expect("valid");
        assert_eq!(again, record);
        let minimal: ConsumerRecord = serde_json::from_str(r#"{"plan":"free"}"#).expect("valid");
        assert_eq!(minimal.overrides, BTreeMap::new());
        assert!(!minimal.blocked);
    }

    #[test]
    fn unknown_fields_are_refused_not_ignored() {
        assert!(
            serde_json::from_str::<ConsumerRecord>(r#"{"plan":"pro","blokced":true}"#).is_err()
        );
        assert!(serde_json::from_str::<ConsumerRecord>(
            r#"{"overrides":{"hourly":{"rate":"1/s","brust":5}}}"#
        )
        .is_err());
    }

    #[test]
    fn an_issued_key_is_random_and_only_its_digest_is_kept() {
        let (first, key) = KeyRecord::issue(&[]).expect("random");
        let (second, other) = KeyRecord::issue(std::slice::from_ref(&first)).expect("random");
        assert!(key.starts_with(KEY_PREFIX));
        assert_eq!(key.len(), KEY_PREFIX.len() + 2 * KEY_BYTES);
        assert_ne!(key, other);
        assert_ne!(first.id, second.id);
        assert_eq!(parse_digest(&first.sha256), Some(digest(&key)));
        assert!(!first.sha256.contains(&key[KEY_PREFIX.len()..]));
        assert!(first.created_ms > 1_700_000_000_000);
    }

    #[test]
    fn digests_are_64_hex_digits_in_either_case() {
        let digest = digest("test");
        let text = hex(&digest);
        assert_eq!(
            text,
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert_eq!(parse_digest(&text), Some(digest));
        assert_eq!(parse_digest(&text.to_uppercase()), Some(digest));
        assert_eq!(parse_digest(&text[1..]), None);
        assert_eq!(parse_digest(&format!("{}g", &text[1..])), None);
    }
}
