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

/// The stable 64-bit hash of a key (XXH3, seed 0). It is part of the persistent format: the index on a pool file
/// is laid out by it, so it never changes. Never returns 0, which marks an empty index slot.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(key);
    if h == 0 { 1 } else { h }
}
