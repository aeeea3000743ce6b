//! Keys as the in-process store holds them: hashed once per request, and that hash used for shard and map.

use std::hash::{BuildHasher, Hash, Hasher};

use indexmap::Equivalent;

use super::SHARD_BITS;

/// A key held by a shard, with the hash it was stored under.
///
/// A key is hashed once per request (SipHash, keyed per process: clients choose the keys, so the hash must not be
/// predictable), and that one hash picks the shard, finds the entry and stores it; with a hash per step it was
/// three SipHashes a key, more than the decision itself.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct StoredKey {
    pub(crate) hash: u64,
    pub(crate) text: Box<str>,
}

/// A key as a request names it, hashed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRef<'k> {
    pub(crate) hash: u64,
    pub(crate) text: &'k str,
}

/// The map's hashing: the hash a key carries, as it is.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StoredHash;

/// What [`StoredHash`] builds: it is only ever given the one `u64` of a [`StoredKey`] or a [`KeyRef`].
#[derive(Debug, Default)]
pub(crate) struct StoredHasher(u64);

// === impl KeyRef, StoredKey ===

impl KeyRef<'_> {
    /// The key's shard: the top bits of its hash mixed by a multiplication (Fibonacci hashing), so that the keys
    /// of one shard still differ in every bit the map itself uses.
    pub(crate) fn shard(&self) -> usize {
        (self.hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (u64::BITS - SHARD_BITS)) as usize
    }
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Hash for StoredKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Equivalent<StoredKey> for KeyRef<'_> {
    fn equivalent(&self, key: &StoredKey) -> bool {
        self.hash == key.hash && self.text == &*key.text
    }
}

// === impl StoredHash ===

impl BuildHasher for StoredHash {
    type Hasher = StoredHasher;

    fn build_hasher(&self) -> StoredHasher {
        StoredHasher::default()
    }
}

impl Hasher for StoredHasher {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    /// Never called (keys hash as one `u64`); folds the bytes in, so that it would still be a hash.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x100_0000_01B3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
