//! On-pool format of the index: the index header, the table header, buckets, the `current` word and the hash mix.
//!
//! Index header (its own extent, tag `INDEX_HEADER`, found through root slot `roots::INDEX`):
//! ```text
//! 0..8    magic "DNMIDXH1"
//! 8..12   format version u32
//! 12..16  header length u32 (64)
//! 16..24  initial_buckets u64        (settings the index was created with)
//! 24..32  max_load f64
//! 32..40  overflow_per_bucket f64
//! 40..48  reserved (0)
//! 48..52  CRC32C of bytes 0..48 (the immutable fields)
//! 52..56  reserved (0)
//! 56..64  current: the published table, see [`CurrentWord`]
//! ```
//!
//! Table (one extent, tag `INDEX_TABLE`, holding its header, the primary buckets and the overflow area):
//! ```text
//! 0..8    magic "DNMIDXT1"
//! 8..16   nbuckets u64 (power of two)
//! 16..24  overflow capacity u64 (overflow buckets)
//! 24..32  overflow used u64: bump counter of the overflow area (mutable)
//! 32..40  generation u64 (resize generation that published this table)
//! 40..48  pool offset of the owning index header
//! 48..52  CRC32C of bytes 0..24 and 32..48 (everything but the bump counter)
//! 52..64  reserved (0)
//! 64..    nbuckets primary buckets, then `overflow capacity` overflow buckets, 64 bytes each
//! ```
//!
//! Bucket (64 bytes, one cache line):
//! ```text
//! 0..16   slot 0: hash u64, value u64 (an EntryRef's raw word)
//! 16..32  slot 1
//! 32..48  slot 2
//! 48..56  next: 0 for the end of the chain, else k >= 1 for overflow bucket k of the same table
//! 56..64  reserved (0)
//! ```
//! A slot with hash 0 is empty whatever its value word; a slot is live when its hash and its value are both non-zero.

/// Magic of the index header.
pub const HEADER_MAGIC: [u8; 8] = *b"DNMIDXH1";
/// Magic of a table header.
pub const TABLE_MAGIC: [u8; 8] = *b"DNMIDXT1";
/// Format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the index header.
pub const HEADER_LEN: u64 = 64;
/// Offset of the `current` word inside the index header.
pub const CURRENT_OFFSET: u64 = 56;
/// Bytes of a table header (the first bucket starts right after it).
pub const TABLE_HEADER_LEN: u64 = 64;
/// Offset of the overflow bump counter inside a table header.
pub const OVERFLOW_USED_OFFSET: u64 = 24;
/// Offset of the overflow capacity inside a table header.
pub const OVERFLOW_CAPACITY_OFFSET: u64 = 16;
/// Bytes of a bucket.
pub const BUCKET_LEN: u64 = 64;
/// Key-value slots per bucket.
pub const SLOTS: usize = 3;
/// Offset of the `next` word inside a bucket.
pub const NEXT_OFFSET: u64 = 48;
/// Words of a bucket that carry meaning (3 slots × 2 words + next).
pub const BUCKET_WORDS: usize = 2 * SLOTS + 1;

const OFFSET_BITS: u32 = 42;
const LOG2_BITS: u32 = 6;
const GEN_SHIFT: u32 = OFFSET_BITS + LOG2_BITS;
/// Largest pool offset a table may start at (the `current` word stores `offset / 64` in 42 bits).
pub const MAX_TABLE_OFFSET: u64 = ((1u64 << OFFSET_BITS) - 1) * 64;
/// Largest number of primary buckets.
pub const MAX_BUCKETS: u64 = 1 << 40;

/// The `current` word of the index header: which table is published, packed so that one atomic 8-byte store
/// publishes a table and one 8-byte READ tells a remote reader everything it needs to address a primary bucket.
///
/// Bits 0..42 hold `table offset / 64`, bits 42..48 `log2(nbuckets)`, bits 48..64 the low 16 bits of the resize
/// generation. Every resize publishes a new table at a new generation, so the word never takes a value twice while
/// a reader could still compare against it (see the crate documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CurrentWord {
    /// Pool offset of the table.
    pub table: u64,
    /// Primary buckets.
    pub nbuckets: u64,
    /// Low 16 bits of the generation.
    pub generation: u16,
}

impl CurrentWord {
    /// Packs the word. `table` must be 64-byte aligned and at most [`MAX_TABLE_OFFSET`]; `nbuckets` a power of two.
    pub fn pack(self) -> u64 {
        debug_assert!(self.table % 64 == 0 && self.table <= MAX_TABLE_OFFSET);
        debug_assert!(self.nbuckets.is_power_of_two());
        (self.table / 64)
            | (u64::from(self.nbuckets.trailing_zeros()) << OFFSET_BITS)
            | (u64::from(self.generation) << GEN_SHIFT)
    }

    /// Unpacks a word; `None` when it cannot describe a table (zero offset, too many buckets).
    pub fn unpack(word: u64) -> Option<CurrentWord> {
        let table = (word & ((1u64 << OFFSET_BITS) - 1)) * 64;
        let log2 = (word >> OFFSET_BITS) & ((1 << LOG2_BITS) - 1);
        let nbuckets = 1u64 << log2;
        if table == 0 || nbuckets > MAX_BUCKETS {
            return None;
        }
        Some(CurrentWord {
            table,
            nbuckets,
            generation: (word >> GEN_SHIFT) as u16,
        })
    }
}

/// Mixes a key hash before bucket selection (the murmur3 64-bit finalizer), so that hashes differing only in a few
/// bits (or small integers) still spread over all buckets. Part of the persistent format: a table's layout depends
/// on it.
#[inline]
pub fn mix(hash: u64) -> u64 {
    let mut z = hash;
    z ^= z >> 33;
    z = z.wrapping_mul(0xff51_afd7_ed55_8ccd);
    z ^= z >> 33;
    z = z.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    z ^ (z >> 33)
}

/// The primary bucket of `hash` in a table of `nbuckets` buckets.
#[inline]
pub fn bucket_index(hash: u64, nbuckets: u64) -> u64 {
    mix(hash) & (nbuckets - 1)
}

/// Pool offset of primary bucket `index` of the table at `table`.
#[inline]
pub fn primary_offset(table: u64, index: u64) -> u64 {
    table + TABLE_HEADER_LEN + index * BUCKET_LEN
}

/// Pool offset of overflow bucket `k` (1-based, as stored in `next`) of a table of `nbuckets` primary buckets.
#[inline]
pub fn overflow_offset(table: u64, nbuckets: u64, k: u64) -> u64 {
    table + TABLE_HEADER_LEN + (nbuckets + k - 1) * BUCKET_LEN
}

/// Bytes of a table with `nbuckets` primary and `overflow` overflow buckets.
pub fn table_bytes(nbuckets: u64, overflow: u64) -> u64 {
    TABLE_HEADER_LEN + (nbuckets + overflow) * BUCKET_LEN
}

/// The hash the index stores for a caller's hash: 0 marks an empty slot, so it is stored as 1 (as
/// `dinomo_log::key_hash` already does).
#[inline]
pub fn stored_hash(hash: u64) -> u64 {
    if hash == 0 { 1 } else { hash }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The immutable fields of the index header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexHeader {
    /// Buckets of the first table.
    pub initial_buckets: u64,
    /// Load factor setting at creation.
    pub max_load: f64,
    /// Overflow setting at creation.
    pub overflow_per_bucket: f64,
}

impl IndexHeader {
    /// The 64 header bytes with `current` as the current word.
    pub fn encode(&self, current: u64) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[0..8].copy_from_slice(&HEADER_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.initial_buckets.to_le_bytes());
        b[24..32].copy_from_slice(&self.max_load.to_bits().to_le_bytes());
        b[32..40].copy_from_slice(&self.overflow_per_bucket.to_bits().to_le_bytes());
        let crc = crc32c::crc32c(&b[0..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b[56..64].copy_from_slice(&current.to_le_bytes());
        b
    }

    /// Decodes and checks the 64 header bytes; returns the header and its current word.
    pub fn decode(b: &[u8]) -> Result<(IndexHeader, u64), HeaderError> {
        if b.len() < HEADER_LEN as usize || b[0..8] != HEADER_MAGIC {
            return Err(HeaderError::Corrupt("bad magic".into()));
        }
        let version = u32_at(b, 8);
        if version != FORMAT_VERSION {
            return Err(HeaderError::Version(version));
        }
        if crc32c::crc32c(&b[0..48]) != u32_at(b, 48) {
            return Err(HeaderError::Corrupt("checksum mismatch".into()));
        }
        if u32_at(b, 12) as u64 != HEADER_LEN {
            return Err(HeaderError::Corrupt(format!(
                "header length {}",
                u32_at(b, 12)
            )));
        }
        let h = IndexHeader {
            initial_buckets: u64_at(b, 16),
            max_load: f64::from_bits(u64_at(b, 24)),
            overflow_per_bucket: f64::from_bits(u64_at(b, 32)),
        };
        let current = u64_at(b, 56);
        if CurrentWord::unpack(current).is_none() {
            return Err(HeaderError::Corrupt(format!(
                "current word {current:#018x} names no table"
            )));
        }
        Ok((h, current))
    }
}

/// Why a header did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// A format version this build does not read.
    Version(u32),
    /// Anything else.
    Corrupt(String),
}

/// The fields of a table header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableHeader {
    /// Primary buckets.
    pub nbuckets: u64,
    /// Overflow buckets.
    pub overflow_capacity: u64,
    /// Overflow buckets handed out.
    pub overflow_used: u64,
    /// Resize generation.
    pub generation: u64,
    /// Pool offset of the owning index header.
    pub owner: u64,
}

impl TableHeader {
    fn crc(b: &[u8]) -> u32 {
        let mut c = crc32c::crc32c(&b[0..24]);
        c = crc32c::crc32c_append(c, &b[32..48]);
        c
    }

    /// The 64 header bytes.
    pub fn encode(&self) -> [u8; TABLE_HEADER_LEN as usize] {
        let mut b = [0u8; TABLE_HEADER_LEN as usize];
        b[0..8].copy_from_slice(&TABLE_MAGIC);
        b[8..16].copy_from_slice(&self.nbuckets.to_le_bytes());
        b[16..24].copy_from_slice(&self.overflow_capacity.to_le_bytes());
        b[24..32].copy_from_slice(&self.overflow_used.to_le_bytes());
        b[32..40].copy_from_slice(&self.generation.to_le_bytes());
        b[40..48].copy_from_slice(&self.owner.to_le_bytes());
        let crc = Self::crc(&b);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks the 64 header bytes of a table published by `word` for the index header at `owner`.
    pub fn decode(b: &[u8], word: CurrentWord, owner: u64) -> Result<TableHeader, String> {
        if b.len() < TABLE_HEADER_LEN as usize || b[0..8] != TABLE_MAGIC {
            return Err("bad magic".into());
        }
        if Self::crc(b) != u32_at(b, 48) {
            return Err("checksum mismatch".into());
        }
        let t = TableHeader {
            nbuckets: u64_at(b, 8),
            overflow_capacity: u64_at(b, 16),
            overflow_used: u64_at(b, 24),
            generation: u64_at(b, 32),
            owner: u64_at(b, 40),
        };
        if t.nbuckets != word.nbuckets {
            return Err(format!(
                "{} buckets, the current word says {}",
                t.nbuckets, word.nbuckets
            ));
        }
        if t.generation as u16 != word.generation {
            return Err(format!(
                "generation {} does not match the current word's {}",
                t.generation, word.generation
            ));
        }
        if t.owner != owner {
            return Err(format!(
                "belongs to the index header at {:#x}, not {owner:#x}",
                t.owner
            ));
        }
        if t.overflow_capacity > MAX_BUCKETS {
            return Err(format!("overflow capacity {}", t.overflow_capacity));
        }
        Ok(t)
    }
}

/// A bucket as read in one piece (remote READ or local snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketImage {
    /// `(hash, value)` of each slot.
    pub slots: [(u64, u64); SLOTS],
    /// The next word.
    pub next: u64,
}

impl BucketImage {
    /// Decodes the 64 bucket bytes.
    pub fn decode(b: &[u8]) -> BucketImage {
        let mut img = BucketImage::default();
        for (i, s) in img.slots.iter_mut().enumerate() {
            *s = (u64_at(b, 16 * i), u64_at(b, 16 * i + 8));
        }
        img.next = u64_at(b, NEXT_OFFSET as usize);
        img
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_word_round_trips() {
        let w = CurrentWord {
            table: 4096 * 77,
            nbuckets: 1 << 20,
            generation: 0xBEEF,
        };
        assert_eq!(CurrentWord::unpack(w.pack()), Some(w));
        assert_eq!(CurrentWord::unpack(0), None);
    }

    #[test]
    fn headers_round_trip_and_detect_flips() {
        let h = IndexHeader {
            initial_buckets: 1024,
            max_load: 0.75,
            overflow_per_bucket: 0.25,
        };
        let cur = CurrentWord {
            table: 8192,
            nbuckets: 1024,
            generation: 3,
        }
        .pack();
        let b = h.encode(cur);
        assert_eq!(IndexHeader::decode(&b).unwrap(), (h, cur));
        for i in 0..48 {
            let mut c = b;
            c[i] ^= 0x10;
            assert!(IndexHeader::decode(&c).is_err(), "flip at byte {i}");
        }
        let t = TableHeader {
            nbuckets: 1024,
            overflow_capacity: 256,
            overflow_used: 3,
            generation: 3,
            owner: 4096,
        };
        let tb = t.encode();
        let word = CurrentWord::unpack(cur).unwrap();
        assert_eq!(TableHeader::decode(&tb, word, 4096).unwrap(), t);
        // The bump counter is mutable and not covered by the checksum.
        let mut moved = tb;
        moved[24] = 9;
        assert_eq!(
            TableHeader::decode(&moved, word, 4096)
                .unwrap()
                .overflow_used,
            9
        );
        let mut bad = tb;
        bad[9] ^= 1;
        assert!(TableHeader::decode(&bad, word, 4096).is_err());
        assert!(TableHeader::decode(&tb, word, 8192).is_err());
    }

    #[test]
    fn mix_spreads_small_hashes() {
        let n = 64;
        let mut seen = std::collections::HashSet::new();
        for h in 1..=16u64 {
            seen.insert(bucket_index(h, n));
        }
        assert!(seen.len() >= 10, "{seen:?}");
    }
}
