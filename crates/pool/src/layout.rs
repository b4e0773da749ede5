//! On-media layout of a pool file and its checksummed superblock.
//!
//! ```text
//! page 0   superblock: immutable header (CRC32C-protected) + mutable state word
//! page 1   root slots: ROOT_SLOTS × u64, each updated atomically by the layers above
//! page 2.. allocation table: one u64 per segment (see `alloc.rs`)
//! data     segment_count × segment_size bytes, 4 KiB aligned
//! ```
//!
//! The header never changes after creation, so its checksum is written once. Everything that changes at run time
//! (the clean-shutdown flag, roots, allocation entries) is a single aligned 8-byte word, so a crash can never leave it
//! half-written.

use crate::PoolError;

/// First eight bytes of every pool file.
pub const MAGIC: [u8; 8] = *b"DINOMOPL";
/// The on-media format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Granularity of the metadata areas.
pub const PAGE: u64 = 4096;
/// Number of root slots (page 1).
pub const ROOT_SLOTS: usize = 64;

pub(crate) const ROOTS_OFFSET: u64 = PAGE;
pub(crate) const ALLOC_TABLE_OFFSET: u64 = 2 * PAGE;
/// Offset of the mutable state word inside page 0.
pub(crate) const STATE_OFFSET: u64 = 512;
const HEADER_LEN: usize = 128;
const CRC_OFFSET: usize = 120;

/// Where everything lives in a pool of a given size and segment size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Total size of the pool file in bytes.
    pub pool_size: u64,
    /// Size of one allocation unit in bytes.
    pub segment_size: u64,
    /// Number of segments in the data area.
    pub segment_count: u64,
    /// Offset of the allocation table.
    pub alloc_table_offset: u64,
    /// Offset of the first segment.
    pub data_offset: u64,
    /// Offset of the root slots.
    pub roots_offset: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Layout {
    /// Computes the layout for a new pool; fails when the sizes cannot hold at least one segment.
    pub fn compute(pool_size: u64, segment_size: u64) -> Result<Layout, PoolError> {
        if segment_size < PAGE || segment_size % PAGE != 0 {
            return Err(PoolError::InvalidOptions(format!(
                "segment size {segment_size} must be a positive multiple of {PAGE} bytes"
            )));
        }
        if pool_size % PAGE != 0 {
            return Err(PoolError::InvalidOptions(format!(
                "pool size {pool_size} must be a multiple of {PAGE} bytes"
            )));
        }
        let data_offset_for = |count: u64| align_up(ALLOC_TABLE_OFFSET + count * 8, PAGE);
        let mut count = pool_size.saturating_sub(ALLOC_TABLE_OFFSET) / (segment_size + 8);
        while count > 0 && data_offset_for(count) + count * segment_size > pool_size {
            count -= 1;
        }
        if count == 0 {
            return Err(PoolError::InvalidOptions(format!(
                "pool size {pool_size} is too small for one segment of {segment_size} bytes plus metadata"
            )));
        }
        Ok(Layout {
            pool_size,
            segment_size,
            segment_count: count,
            alloc_table_offset: ALLOC_TABLE_OFFSET,
            data_offset: data_offset_for(count),
            roots_offset: ROOTS_OFFSET,
        })
    }

    /// Pool offset of segment `index`.
    pub fn segment_offset(&self, index: u64) -> u64 {
        self.data_offset + index * self.segment_size
    }

    /// Segment index of a pool offset inside the data area.
    pub fn segment_index(&self, offset: u64) -> Option<u64> {
        if offset < self.data_offset {
            return None;
        }
        let idx = (offset - self.data_offset) / self.segment_size;
        (idx < self.segment_count).then_some(idx)
    }
}

/// The immutable part of page 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Layout the pool was created with.
    pub layout: Layout,
    /// Random identity chosen at creation; lets clients detect that a pool was replaced.
    pub pool_id: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix_secs: u64,
}

impl Superblock {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        let l = &self.layout;
        let words = [
            l.pool_size,
            l.segment_size,
            l.segment_count,
            l.alloc_table_offset,
            l.data_offset,
            l.roots_offset,
            ROOT_SLOTS as u64,
            self.pool_id,
            self.created_unix_secs,
        ];
        for (i, w) in words.iter().enumerate() {
            b[16 + i * 8..24 + i * 8].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..CRC_OFFSET]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Validates and decodes page 0 of a file of `file_len` bytes. Never trusts a field before its check.
    pub(crate) fn decode(b: &[u8], file_len: u64, path: &str) -> Result<Superblock, PoolError> {
        let corrupt = |reason: String| PoolError::CorruptSuperblock {
            path: path.to_string(),
            reason,
        };
        if b.len() < HEADER_LEN || file_len < PAGE {
            return Err(PoolError::NotAPool {
                path: path.to_string(),
            });
        }
        if b[0..8] != MAGIC {
            return Err(PoolError::NotAPool {
                path: path.to_string(),
            });
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        let stored_crc =
            u32::from_le_bytes(b[CRC_OFFSET..CRC_OFFSET + 4].try_into().expect("4 bytes"));
        let crc = crc32c::crc32c(&b[..CRC_OFFSET]);
        // The checksum covers the version: a version this build does not read is another format only when the
        // header is whole; with a checksum that fails, the version field may be the damaged part.
        if crc != stored_crc {
            let version_note = if version == FORMAT_VERSION {
                String::new()
            } else {
                format!("; the version field reads {version}, which may be the damaged part")
            };
            return Err(corrupt(format!(
                "checksum mismatch (stored {stored_crc:#010x}, computed {crc:#010x}){version_note}"
            )));
        }
        if version != FORMAT_VERSION {
            return Err(PoolError::UnsupportedVersion {
                path: path.to_string(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let header_len = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        if header_len as usize != HEADER_LEN {
            return Err(corrupt(format!("header length {header_len}")));
        }
        let word =
            |i: usize| u64::from_le_bytes(b[16 + i * 8..24 + i * 8].try_into().expect("8 bytes"));
        let pool_size = word(0);
        let segment_size = word(1);
        if pool_size != file_len {
            return Err(corrupt(format!(
                "superblock says {pool_size} bytes but the file has {file_len} (truncated or extended file?)"
            )));
        }
        let expected =
            Layout::compute(pool_size, segment_size).map_err(|e| corrupt(e.to_string()))?;
        let stored = Layout {
            pool_size,
            segment_size,
            segment_count: word(2),
            alloc_table_offset: word(3),
            data_offset: word(4),
            roots_offset: word(5),
        };
        if stored != expected || word(6) != ROOT_SLOTS as u64 {
            return Err(corrupt(format!(
                "layout fields are inconsistent: stored {stored:?}, expected {expected:?}"
            )));
        }
        Ok(Superblock {
            layout: stored,
            pool_id: word(7),
            created_unix_secs: word(8),
        })
    }
}

/// The mutable state word at [`STATE_OFFSET`]: bit 0 = cleanly closed, bits 32..64 = open generation.
pub(crate) fn state_word(clean: bool, generation: u32) -> u64 {
    ((generation as u64) << 32) | clean as u64
}

pub(crate) fn decode_state(word: u64) -> (bool, u32) {
    (word & 1 == 1, (word >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_fits_in_pool() {
        let l = Layout::compute(64 << 20, 1 << 20).unwrap();
        assert!(l.data_offset + l.segment_count * l.segment_size <= l.pool_size);
        assert!(l.alloc_table_offset + l.segment_count * 8 <= l.data_offset);
        assert_eq!(l.segment_count, 63);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(Layout::compute(64 << 20, 1000).is_err());
        assert!(Layout::compute(12 * 1024, 8 << 20).is_err());
        assert!(Layout::compute((64 << 20) + 1, 1 << 20).is_err());
    }

    proptest! {
        #[test]
        fn layout_is_maximal_and_sound(pages in 4u64..100_000, seg_pages in 1u64..64) {
            let size = pages * PAGE;
            let seg = seg_pages * PAGE;
            if let Ok(l) = Layout::compute(size, seg) {
                prop_assert!(l.data_offset + l.segment_count * seg <= size);
                prop_assert!(l.alloc_table_offset + l.segment_count * 8 <= l.data_offset);
                prop_assert_eq!(l.data_offset % PAGE, 0);
                // One more segment would not fit.
                let n = l.segment_count + 1;
                prop_assert!(align_up(ALLOC_TABLE_OFFSET + n * 8, PAGE) + n * seg > size);
            }
        }

        #[test]
        fn superblock_roundtrip_and_any_bit_flip_is_caught(bit in 0usize..(CRC_OFFSET + 4) * 8) {
            let layout = Layout::compute(1 << 24, 1 << 16).unwrap();
            let sb = Superblock { layout, pool_id: 7, created_unix_secs: 1 };
            let mut page = sb.encode();
            prop_assert_eq!(Superblock::decode(&page, 1 << 24, "p").unwrap(), sb);
            page[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Superblock::decode(&page, 1 << 24, "p").is_err());
        }
    }
}
