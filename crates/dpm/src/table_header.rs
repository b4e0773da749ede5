//! The header the memory node's small fixed-size tables in the pool share (the cell table, the partition table):
//!
//! ```text
//! header (64 B): magic [8] | version u32 | parameter u32 | capacity u64 | crc32c u32 (over bytes 0..24)
//! ```
//! A table is formatted whole (zeroed, header written, persisted) before its root slot names it, so a crash leaves
//! either no table or a complete one.

use std::sync::Arc;

use dinomo_pool::Pool;

use crate::ProcessorError;

/// Bytes reserved for the header; the table's entries follow.
pub(crate) const HEADER_LEN: u64 = 64;

/// What identifies one kind of table.
pub(crate) struct TableKind {
    /// Its name in error messages.
    pub name: &'static str,
    pub magic: [u8; 8],
    pub version: u32,
    /// Root slot naming it.
    pub root: usize,
    /// Allocation tag of its extent.
    pub tag: u16,
}

impl TableKind {
    /// Allocates `HEADER_LEN + body` bytes, writes the header and a zeroed body, and publishes the table in its
    /// root slot; returns its pool offset.
    pub(crate) fn format(
        &self,
        pool: &Arc<Pool>,
        parameter: u32,
        capacity: u64,
        body: u64,
    ) -> Result<u64, ProcessorError> {
        self.format_filled(pool, parameter, capacity, body, &[])
    }

    /// Like [`TableKind::format`], with the body starting with `filled` (at most `body` bytes) before the table is
    /// published.
    pub(crate) fn format_filled(
        &self,
        pool: &Arc<Pool>,
        parameter: u32,
        capacity: u64,
        body: u64,
        filled: &[u8],
    ) -> Result<u64, ProcessorError> {
        debug_assert!(filled.len() as u64 <= body);
        let bytes = HEADER_LEN + body;
        let ext = pool.alloc_bytes(bytes, self.tag).map_err(|e| {
            ProcessorError::no_room(format!("the {} of {capacity} entries", self.name), bytes, e)
        })?;
        // The whole table in one write: header, the filled start of the body, zeros.
        let mut image = vec![0u8; bytes as usize];
        let h = &mut image[..HEADER_LEN as usize];
        h[0..8].copy_from_slice(&self.magic);
        h[8..12].copy_from_slice(&self.version.to_le_bytes());
        h[12..16].copy_from_slice(&parameter.to_le_bytes());
        h[16..24].copy_from_slice(&capacity.to_le_bytes());
        let crc = crc32c::crc32c(&h[..24]);
        h[24..28].copy_from_slice(&crc.to_le_bytes());
        image[HEADER_LEN as usize..][..filled.len()].copy_from_slice(filled);
        pool.write(ext.offset, &image)?;
        pool.persist(ext.offset, bytes);
        pool.set_root(self.root, ext.offset)?;
        Ok(ext.offset)
    }

    /// An error about the table at `offset`.
    pub(crate) fn corrupt(&self, offset: u64, why: &str) -> ProcessorError {
        ProcessorError::Corrupt(format!("{} at {offset:#x}: {why}", self.name))
    }

    /// Reads and checks the header of the table at `offset`: its parameter and capacity.
    pub(crate) fn read(&self, pool: &Pool, offset: u64) -> Result<(u32, u64), ProcessorError> {
        // The tables' fields are atomic words: a root naming a place that is not word-aligned is damage.
        if offset % 8 != 0 {
            return Err(self.corrupt(offset, "not 8-byte aligned"));
        }
        let mut h = [0u8; HEADER_LEN as usize];
        pool.read(offset, &mut h)
            .map_err(|_| self.corrupt(offset, "out of the pool"))?;
        if h[0..8] != self.magic {
            return Err(self.corrupt(offset, "bad magic"));
        }
        let u32_at = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes"));
        if crc32c::crc32c(&h[..24]) != u32_at(24) {
            return Err(self.corrupt(offset, "header checksum mismatch"));
        }
        let version = u32_at(8);
        if version != self.version {
            return Err(self.corrupt(
                offset,
                &format!(
                    "format version {version}, this build reads {}",
                    self.version
                ),
            ));
        }
        let capacity = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
        Ok((u32_at(12), capacity))
    }
}
