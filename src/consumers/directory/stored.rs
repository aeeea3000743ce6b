//! A consumer's record as the directory holds it in memory: one allocation of packed bytes (id, flags, plan, key
//! digests, key ids and issue times; overrides as JSON), about 90 bytes for a consumer with one key where the
//! serde form took several hundred, so that a million consumers fit in a few hundred megabytes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use triomphe::ThinArc;

use super::record::{ConsumerRecord, KeyRecord, LimitOverride};
use crate::consumers::{digest_hex, parse_hex_digest};

/// One consumer's id and record, packed, behind a one-word pointer (the tables hold one per consumer and one per
/// key, at half load: a word saved is about 17 bytes a consumer). Cloning shares the bytes; two clones of one
/// version of a record are [`same`](Self::same), which is how compiled overrides are kept per version. The
/// allocation also holds whether the record was used since a cache last looked (see [`Self::take_used`]).
///
/// Layout: `id` (u8 length, bytes), flags (u8: `BLOCKED`, `KEYS_AS_JSON`, `HAS_OVERRIDES`), `plan` (u16 length,
/// bytes; `NO_PLAN` for none), `overrides` as JSON when there are any (u32 length, bytes), then the keys (u16
/// count; each: SHA-256, u64 issue time, the id: u16 length and bytes, or `ISSUED_ID` and the 4 bytes an issued
/// id's 8 hex digits after `k_` spell). Lengths are little-endian. Keys that do not pack (a digest
/// that is not 64 lower-case hex digits: only written by hand) are kept as their JSON instead (u32 length, bytes),
/// read back as written.
#[derive(Clone)]
pub struct StoredRecord(ThinArc<AtomicBool, u8>);

const BLOCKED: u8 = 1;
const KEYS_AS_JSON: u8 = 2;
const HAS_OVERRIDES: u8 = 4;
const NO_PLAN: u16 = u16::MAX;
/// In place of a key id's length: the id is `k_` and 8 lower-case hex digits, as issued, kept in 4 bytes.
const ISSUED_ID: u16 = u16::MAX;

/// Reads the packed fields in order.
struct Fields<'a>(&'a [u8]);

impl std::fmt::Debug for StoredRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredRecord")
            .field("id", &self.id())
            .field("bytes", &self.size())
            .finish()
    }
}

// === impl StoredRecord ===

impl StoredRecord {
    /// `record` of consumer `id` (an id is at most 128 characters and a plan a name from the config, checked where
    /// they are taken; longer ones are cut here).
    pub fn new(id: &str, record: &ConsumerRecord) -> Self {
        let mut bytes = Vec::with_capacity(64 + id.len());
        let id = &id.as_bytes()[..id.len().min(usize::from(u8::MAX))];
        bytes.push(id.len() as u8);
        bytes.extend_from_slice(id);
        let keys = packed_keys(&record.keys);
        let mut flags = if record.blocked { BLOCKED } else { 0 };
        if keys.is_none() {
            flags |= KEYS_AS_JSON;
        }
        if !record.overrides.is_empty() {
            flags |= HAS_OVERRIDES;
        }
        bytes.push(flags);
        match &record.plan {
            Some(plan) => {
                let plan = &plan.as_bytes()[..plan.len().min(usize::from(NO_PLAN - 1))];
                bytes.extend_from_slice(&(plan.len() as u16).to_le_bytes());
                bytes.extend_from_slice(plan);
            }
            None => bytes.extend_from_slice(&NO_PLAN.to_le_bytes()),
        }
        if !record.overrides.is_empty() {
            push_chunk(
                &mut bytes,
                &serde_json::to_vec(&record.overrides).unwrap_or_default(),
            );
        }
        match keys {
            Some(keys) => bytes.extend_from_slice(&keys),
            None => push_chunk(
                &mut bytes,
                &serde_json::to_vec(&record.keys).unwrap_or_default(),
            ),
        }
        // Set or changed for a use: a cache's new entry is not the first to go.
        Self(ThinArc::from_header_and_slice(
            AtomicBool::new(true),
            &bytes,
        ))
    }

    /// The packed bytes.
    fn bytes(&self) -> &[u8] {
        &self.0.slice
    }

    /// Notes the record as used (written only when it changes: a line that every request wrote would bounce
    /// between cores).
    pub fn mark_used(&self) {
        let used = &self.0.header.header;
        if !used.load(Ordering::Relaxed) {
            used.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the record was used since the last call, which it then no longer is: a CLOCK cache's second chance.
    pub fn take_used(&self) -> bool {
        self.0.header.header.swap(false, Ordering::Relaxed)
    }

    /// The consumer id.
    pub fn id(&self) -> &str {
        let bytes = self.bytes();
        let length = usize::from(bytes[0]);
        std::str::from_utf8(&bytes[1..1 + length]).unwrap_or_default()
    }

    /// Whether the consumer is blocked.
    pub fn blocked(&self) -> bool {
        self.flags() & BLOCKED != 0
    }

    /// The plan the record sets, if any.
    pub fn plan(&self) -> Option<&str> {
        self.fields().plan()
    }

    /// Whether the record overrides any limit.
    pub fn has_overrides(&self) -> bool {
        !self.overrides_json().is_empty()
    }

    /// The overrides, per limit name.
    pub fn overrides(&self) -> BTreeMap<String, LimitOverride> {
        serde_json::from_slice(self.overrides_json()).unwrap_or_default()
    }

    fn overrides_json(&self) -> &[u8] {
        if self.flags() & HAS_OVERRIDES == 0 {
            return &[];
        }
        let mut fields = self.fields();
        fields.plan();
        fields.chunk32()
    }

    /// Whether the record holds the key whose SHA-256 is `digest`.
    pub fn holds_key(&self, digest: &[u8; 32]) -> bool {
        self.key_digests().any(|held| held == *digest)
    }

    /// The SHA-256 digests of the record's keys.
    pub fn key_digests(&self) -> impl Iterator<Item = [u8; 32]> + '_ {
        let written: Vec<[u8; 32]> = if self.keys_as_json() {
            self.json_keys()
                .iter()
                .filter_map(|key| parse_hex_digest(&key.sha256))
                .collect()
        } else {
            Vec::new()
        };
        self.packed_keys()
            .map(|(digest, _, _)| digest)
            .chain(written)
    }

    /// The record in its serde form (for the admin API and the store).
    pub fn record(&self) -> ConsumerRecord {
        let keys = if self.keys_as_json() {
            self.json_keys()
        } else {
            self.packed_keys()
                .map(|(digest, created_ms, id)| KeyRecord {
                    id: id.to_string(),
                    sha256: digest_hex(&digest),
                    created_ms,
                })
                .collect()
        };
        ConsumerRecord {
            plan: self.plan().map(str::to_owned),
            overrides: self.overrides(),
            blocked: self.blocked(),
            keys,
        }
    }

    /// Whether `other` is this very version of the record (not an equal copy).
    pub fn same(&self, other: &Self) -> bool {
        self.0.ptr() == other.0.ptr()
    }

    /// Bytes held, allocation header aside.
    pub fn size(&self) -> usize {
        self.bytes().len()
    }

    fn flags(&self) -> u8 {
        let bytes = self.bytes();
        bytes[1 + usize::from(bytes[0])]
    }

    fn keys_as_json(&self) -> bool {
        self.flags() & KEYS_AS_JSON != 0
    }

    /// The fields after the id and the flags.
    fn fields(&self) -> Fields<'_> {
        let bytes = self.bytes();
        Fields(&bytes[2 + usize::from(bytes[0])..])
    }

    /// The fields from the keys on.
    fn key_fields(&self) -> Fields<'_> {
        let mut fields = self.fields();
        fields.plan();
        if self.flags() & HAS_OVERRIDES != 0 {
            fields.chunk32();
        }
        fields
    }

    /// The keys kept as JSON (none where they are packed).
    fn json_keys(&self) -> Vec<KeyRecord> {
        serde_json::from_slice(self.key_fields().chunk32()).unwrap_or_default()
    }

    /// The packed keys: digest, issue time, id (none where they are kept as JSON).
    fn packed_keys(&self) -> impl Iterator<Item = ([u8; 32], u64, KeyId<'_>)> {
        let mut fields = self.key_fields();
        let count = if self.keys_as_json() { 0 } else { fields.u16() };
        (0..count).map_while(move |_| {
            let digest: [u8; 32] = fields.take(32).try_into().ok()?;
            let created_ms = u64::from_le_bytes(fields.take(8).try_into().ok()?);
            let id = match fields.u16() {
                ISSUED_ID => KeyId::Issued(fields.take(4).try_into().ok()?),
                length => KeyId::Text(std::str::from_utf8(fields.take(usize::from(length))).ok()?),
            };
            Some((digest, created_ms, id))
        })
    }
}

/// `keys` packed, or `None` when one does not pack (see [`StoredRecord`]).
fn packed_keys(keys: &[KeyRecord]) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(2 + 54 * keys.len());
    bytes.extend_from_slice(&u16::try_from(keys.len()).ok()?.to_le_bytes());
    for key in keys {
        // Packed only where the digest reads back as written (lower-case hex).
        let digest = parse_hex_digest(&key.sha256).filter(|d| digest_hex(d) == key.sha256)?;
        bytes.extend_from_slice(&digest);
        bytes.extend_from_slice(&key.created_ms.to_le_bytes());
        match issued_id(&key.id) {
            Some(issued) => {
                bytes.extend_from_slice(&ISSUED_ID.to_le_bytes());
                bytes.extend_from_slice(&issued);
            }
            None => {
                let length = u16::try_from(key.id.len())
                    .ok()
                    .filter(|&l| l != ISSUED_ID)?;
                bytes.extend_from_slice(&length.to_le_bytes());
                bytes.extend_from_slice(key.id.as_bytes());
            }
        }
    }
    Some(bytes)
}

/// The 4 bytes of an id as issued (`k_` and 8 lower-case hex digits).
fn issued_id(id: &str) -> Option<[u8; 4]> {
    let hex = id.strip_prefix("k_").filter(|hex| hex.len() == 8)?;
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0u8; 4];
    for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(bytes)
}

/// A packed key's id.
enum KeyId<'a> {
    Issued([u8; 4]),
    Text(&'a str),
}

impl std::fmt::Display for KeyId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyId::Issued(bytes) => {
                f.write_str("k_")?;
                bytes.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
            }
            KeyId::Text(text) => f.write_str(text),
        }
    }
}

/// Appends `chunk` with its u32 length.
fn push_chunk(bytes: &mut Vec<u8>, chunk: &[u8]) {
    let length = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
    bytes.extend_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(&chunk[..length as usize]);
}

// === impl Fields ===

impl<'a> Fields<'a> {
    /// The next `n` bytes (fewer at the end, which a record this module wrote never reaches).
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    fn u16(&mut self) -> u16 {
        self.take(2).try_into().map_or(0, u16::from_le_bytes)
    }

    /// A field of u32 length and its bytes.
    fn chunk32(&mut self) -> &'a [u8] {
        let length = self.take(4).try_into().map_or(0, u32::from_le_bytes);
        self.take(usize::try_from(length).unwrap_or(usize::MAX))
    }

    /// The plan field.
    fn plan(&mut self) -> Option<&'a str> {
        let length = self.u16();
        if length == NO_PLAN {
            return None;
        }
        std::str::from_utf8(self.take(usize::from(length))).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::api_key_digest as digest;

    fn key(id: &str, text: &str) -> KeyRecord {
        KeyRecord {
            id: id.to_owned(),
            sha256: digest_hex(&digest(text)),
            created_ms: 1_764_000_000_000,
        }
    }

    #[test]
    fn a_record_reads_back_whole_from_its_packed_form() {
        let mut overrides = BTreeMap::new();
        overrides.insert(
            "hourly".to_owned(),
            LimitOverride {
                rate: Some("20000/1h".to_owned()),
                burst: Some(500),
                ..LimitOverride::default()
            },
        );
        let records = [
            ConsumerRecord::default(),
            ConsumerRecord {
                plan: Some("pro".to_owned()),
                overrides,
                blocked: true,
                keys: vec![
                    key("k_1", "tg_a"),
                    key("k_2", "tg_b"),
                    key("k_ABCDEF12", "tg_e"),
                    key("k_abcdef12", "tg_f"),
                ],
            },
            ConsumerRecord {
                plan: Some("free".to_owned()),
                keys: vec![key("k_3f9a1c2b", "tg_c")],
                ..ConsumerRecord::default()
            },
        ];
        for record in records {
            let stored = StoredRecord::new("acme-corp", &record);
            assert_eq!(stored.id(), "acme-corp");
            assert_eq!(stored.record(), record);
            assert_eq!(stored.blocked(), record.blocked);
            assert_eq!(stored.plan(), record.plan.as_deref());
            assert_eq!(stored.has_overrides(), !record.overrides.is_empty());
            assert_eq!(
                stored.key_digests().collect::<Vec<_>>(),
                record.key_digests().collect::<Vec<_>>()
            );
            assert!(!stored.keys_as_json());
        }
        let one_key = StoredRecord::new(
            "customer-0000001",
            &ConsumerRecord {
                plan: Some("pro".to_owned()),
                keys: vec![key("k_3f9a1c2b", "tg_c")],
                ..ConsumerRecord::default()
            },
        );
        // 16 characters of id, a plan and one issued key: 71 bytes, 95 with the allocation's count, used flag and
        // length (a 96-byte block).
        assert!(one_key.size() <= 71, "{} bytes", one_key.size());
        assert!(one_key.holds_key(&digest("tg_c")));
        assert!(!one_key.holds_key(&digest("tg_d")));
        assert_eq!(std::mem::size_of::<StoredRecord>(), 8);
    }

    #[test]
    fn a_record_is_used_until_taken_and_again_once_marked() {
        let stored = StoredRecord::new("acme", &ConsumerRecord::default());
        let shared = stored.clone();
        assert!(stored.take_used(), "a new record counts as used");
        assert!(!shared.take_used(), "clones share the flag");
        shared.mark_used();
        assert!(stored.take_used());
        assert!(stored.same(&shared));
        assert!(!stored.same(&StoredRecord::new("acme", &ConsumerRecord::default())));
    }

    #[test]
    fn a_record_written_by_hand_is_kept_as_written() {
        // Upper-case hex and a digest that is no digest: kept as JSON, read back as they were.
        let upper = KeyRecord {
            sha256: digest_hex(&digest("tg_a")).to_uppercase(),
            ..key("k_1", "tg_a")
        };
        let broken = KeyRecord {
            sha256: "not hex".to_owned(),
            ..key("k_2", "tg_b")
        };
        let record = ConsumerRecord {
            plan: Some("pro".to_owned()),
            keys: vec![upper, broken],
            ..ConsumerRecord::default()
        };
        let stored = StoredRecord::new("acme", &record);
        assert!(stored.keys_as_json());
        assert_eq!(stored.record(), record);
        assert_eq!(stored.plan(), Some("pro"));
        assert!(stored.holds_key(&digest("tg_a")));
        assert_eq!(stored.key_digests().count(), 1);
    }
}
