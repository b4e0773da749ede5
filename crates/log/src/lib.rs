//! On-pool formats shared by KV nodes (which write logs) and the memory node (which merges them).
//!
//! - [`EntryRef`]: the 64-bit pointer to a log entry that the index stores and KV nodes cache as a shortcut.
//! - [`entry`]: one logged write: a 24-byte header with a CRC32C commit marker, then key and value.
//! - [`segment`]: a log segment's header, written only by the memory node.
//! - [`key_hash`]: the stable 64-bit key hash the index is built on.
//! - [`roots`] and [`tags`]: which pool root slot and allocation tag belongs to whom.

pub mod entry;
mod entry_ref;
pub mod segment;

pub use entry::{
    ENTRY_HEADER_LEN, EntryError, EntryHeader, EntryView, Op, encode_entry, entry_len,
};
pub use entry_ref::EntryRef;
pub use segment::{SEGMENT_HEADER_LEN, SegmentHeader};

/// Pool root slots used by the data plane.
pub mod roots {
    /// Offset of the index header.
    pub const INDEX: usize = 1;
    /// Offset of the log directory.
    pub const LOG_DIRECTORY: usize = 2;
}

/// Allocation tags, so that an extent's owner is known when the pool is scanned after a crash.
pub mod tags {
    /// A log segment.
    pub const LOG_SEGMENT: u16 = 0x10;
    /// The log directory.
    pub const LOG_DIRECTORY: u16 = 0x11;
    /// The index header.
    pub const INDEX_HEADER: u16 = 0x20;
    /// An index table (buckets and overflow buckets).
    pub const INDEX_TABLE: u16 = 0x21;
}

/// How keys are hashed for the index. Chosen when a pool is formatted and stored with it, because the index is laid
/// out by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashMode {
    /// [`key_hash`]: XXH3, the normal mode.
    Xxh3,
    /// XXH3 keeping only the low `bits` bits (at least 1): forces hash collisions, for tests of the collision paths.
    Colliding {
        /// Bits kept (1..=63).
        bits: u8,
    },
}

impl HashMode {
    /// The hash of `key` under this mode; never 0.
    #[inline]
    pub fn hash(self, key: &[u8]) -> u64 {
        match self {
            HashMode::Xxh3 => key_hash(key),
            HashMode::Colliding { bits } => {
                let h = xxhash_rust::xxh3::xxh3_64(key) & ((1u64 << bits.clamp(1, 63)) - 1);
                h + 1
            }
        }
    }

    /// The mode as a persistent word.
    pub fn to_word(self) -> u32 {
        match self {
            HashMode::Xxh3 => 0,
            HashMode::Colliding { bits } => 0x100 | bits as u32,
        }
    }

    /// The mode from its persistent word; `None` for an unknown word.
    pub fn from_word(w: u32) -> Option<HashMode> {
        match w {
            0 => Some(HashMode::Xxh3),
            0x101..=0x13f => Some(HashMode::Colliding {
                bits: (w & 0xff) as u8,
            }),
            _ => None,
        }
    }
}

/// The stable 64-bit hash of a key (XXH3, seed 0). It is part of the persistent format: the index on a pool file
/// is laid out by it, so it never changes. Never returns 0, which marks an empty index slot.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(key);
    if h == 0 { 1 } else { h }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_modes_round_trip_and_collide() {
        for m in [
            HashMode::Xxh3,
            HashMode::Colliding { bits: 1 },
            HashMode::Colliding { bits: 63 },
        ] {
            assert_eq!(HashMode::from_word(m.to_word()), Some(m));
        }
        assert_eq!(HashMode::from_word(7), None);
        let m = HashMode::Colliding { bits: 2 };
        let distinct: std::collections::HashSet<u64> =
            (0..1000u32).map(|i| m.hash(&i.to_le_bytes())).collect();
        assert!(distinct.len() <= 4 && !distinct.contains(&0));
        assert_ne!(key_hash(b"a"), key_hash(b"b"));
    }
}
