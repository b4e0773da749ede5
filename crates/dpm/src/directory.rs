//! The log directory: one 64-byte descriptor per KV-node thread log, in the pool.
//!
//! ```text
//! header (64 B): magic "DNMLOGD1" | version u32 | hash mode u32 | capacity u64 | segment size u64 | crc32c u32
//!   40..48 the newest management epoch acted on (not under the checksum: it changes; 0 in a directory that never
//!          saw one)
//! descriptor i (64 B, at 64 + 64·i):
//!   0..8   owner: 0 = free, else 1<<63 | node_id<<32 | thread
//!   8..16  head: pool offset of the newest segment (0: none)
//!   16..24 merged_seq: every entry of the log up to this sequence number is in the index
//! ```
//! Only the processor writes it; KV nodes read `merged_seq` with one-sided READs.
//!
//! A descriptor is given back ([`Directory::release`]) once its log has no writer, no segment and nothing unmerged,
//! and it keeps its `merged_seq`: the next log to claim it numbers its entries after the last one the descriptor
//! ever named. A log's id and sequence number then never name two entries, so leftovers of the old log in a reused
//! extent cannot pass for entries of the new one.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dinomo_log::{HashMode, tags};
use dinomo_pool::Pool;

use crate::ProcessorError;

const MAGIC: [u8; 8] = *b"DNMLOGD1";
/// 2: segment headers carry a checksum of their fixed fields.
const VERSION: u32 = 2;
const HEADER_LEN: u64 = 64;
const DESCRIPTOR_LEN: u64 = 64;
const OWNER: u64 = 0;
const HEAD: u64 = 8;
const MERGED_SEQ: u64 = 16;
/// Header offset of the newest management epoch (see [`crate::proto::ManagerEpoch`]).
const MANAGER_EPOCH: u64 = 40;

/// Identity of a log's writer.
pub fn owner_word(node_id: u32, thread: u32) -> u64 {
    (1 << 63) | (node_id as u64) << 32 | thread as u64
}

/// The KV node of a log's owner word.
pub fn owner_node(owner: u64) -> u32 {
    (owner >> 32) as u32 & 0x7fff_ffff
}

/// The directory in the pool.
pub struct Directory {
    pool: Arc<Pool>,
    offset: u64,
    capacity: u32,
    hash_mode: HashMode,
    segment_size: u64,
}

impl Directory {
    /// Formats a new directory and publishes it in its root slot.
    pub fn create(
        pool: Arc<Pool>,
        capacity: u32,
        hash_mode: HashMode,
        segment_size: u64,
    ) -> Result<Directory, ProcessorError> {
        let bytes = HEADER_LEN + capacity as u64 * DESCRIPTOR_LEN;
        let ext = pool.alloc_bytes(bytes, tags::LOG_DIRECTORY).map_err(|e| {
            ProcessorError::no_room(format!("the log directory of {capacity} logs"), bytes, e)
        })?;
        pool.write(ext.offset, &vec![0u8; bytes as usize])?;
        let mut h = [0u8; HEADER_LEN as usize];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&hash_mode.to_word().to_le_bytes());
        h[16..24].copy_from_slice(&(capacity as u64).to_le_bytes());
        h[24..32].copy_from_slice(&segment_size.to_le_bytes());
        let crc = crc32c::crc32c(&h[..32]);
        h[32..36].copy_from_slice(&crc.to_le_bytes());
        pool.write(ext.offset, &h)?;
        pool.persist(ext.offset, bytes);
        pool.set_root(dinomo_log::roots::LOG_DIRECTORY, ext.offset)?;
        Ok(Directory {
            pool,
            offset: ext.offset,
            capacity,
            hash_mode,
            segment_size,
        })
    }

    /// Opens the directory named by the root slot; `None` when the pool has none yet.
    pub fn open(pool: Arc<Pool>) -> Result<Option<Directory>, ProcessorError> {
        let offset = pool.root(dinomo_log::roots::LOG_DIRECTORY)?;
        if offset == 0 {
            return Ok(None);
        }
        let corrupt =
            |why: &str| ProcessorError::Corrupt(format!("log directory at {offset:#x}: {why}"));
        // Its descriptors are atomic words: a root naming a place that is not word-aligned is damage.
        if offset % 8 != 0 {
            return Err(corrupt("not 8-byte aligned"));
        }
        let mut h = [0u8; HEADER_LEN as usize];
        pool.read(offset, &mut h)
            .map_err(|_| corrupt("out of the pool"))?;
        if h[0..8] != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let stored = u32::from_le_bytes(h[32..36].try_into().expect("4 bytes"));
        if crc32c::crc32c(&h[..32]) != stored {
            return Err(corrupt("header checksum mismatch"));
        }
        let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(corrupt(&format!(
                "format version {version}, this build reads {VERSION}"
            )));
        }
        let hash_mode =
            HashMode::from_word(u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")))
                .ok_or_else(|| corrupt("unknown hash mode"))?;
        let capacity = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
        let segment_size = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
        let capacity = u32::try_from(capacity).map_err(|_| corrupt("absurd capacity"))?;
        pool.check_range(offset, HEADER_LEN + capacity as u64 * DESCRIPTOR_LEN)
            .map_err(|_| corrupt("descriptors run past the pool"))?;
        Ok(Some(Directory {
            pool,
            offset,
            capacity,
            hash_mode,
            segment_size,
        }))
    }

    /// Hash mode of the index this directory's logs merge into.
    pub fn hash_mode(&self) -> HashMode {
        self.hash_mode
    }

    /// Segment size chosen when the pool was formatted.
    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// Number of descriptors.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    fn word_offset(&self, log_id: u32, field: u64) -> u64 {
        self.offset + HEADER_LEN + log_id as u64 * DESCRIPTOR_LEN + field
    }

    /// The directory's word at pool offset `off` (in its header or a descriptor).
    fn word(&self, off: u64) -> &std::sync::atomic::AtomicU64 {
        self.pool
            .atomic_u64(off)
            .expect("directory range checked at open")
    }

    /// Stores `value` in the word at `off` and persists it.
    fn store_word(&self, off: u64, value: u64) {
        self.word(off).store(value, Ordering::Release);
        self.pool.persist(off, 8);
    }

    fn load(&self, log_id: u32, field: u64) -> u64 {
        self.word(self.word_offset(log_id, field))
            .load(Ordering::Acquire)
    }

    fn store(&self, log_id: u32, field: u64, value: u64) {
        self.store_word(self.word_offset(log_id, field), value);
    }

    /// Owner word of a descriptor (0: free).
    pub fn owner(&self, log_id: u32) -> u64 {
        self.load(log_id, OWNER)
    }

    /// Claims a free descriptor for `owner`: its id, and the sequence number its entries follow (0 on a descriptor
    /// never used; otherwise the last sequence number of the log that released it).
    pub fn claim(&self, owner: u64) -> Result<(u32, u64), ProcessorError> {
        let free = (0..self.capacity).find(|&i| self.owner(i) == 0).ok_or(
            ProcessorError::DirectoryFull {
                capacity: self.capacity,
                why: "every descriptor names a log".into(),
            },
        )?;
        self.store(free, HEAD, 0);
        self.store(free, OWNER, owner);
        Ok((free, self.merged_seq(free)))
    }

    /// Gives back the descriptor of a log that has no segment left and every entry it wrote merged: its
    /// `merged_seq`, the log's last sequence number, stays for the next owner.
    pub fn release(&self, log_id: u32) {
        debug_assert_eq!(self.head(log_id), 0, "log {log_id} still has segments");
        self.store(log_id, OWNER, 0);
    }

    /// Free descriptors, counted up to `most`.
    pub fn free_descriptors(&self, most: u32) -> u32 {
        (0..self.capacity)
            .filter(|&i| self.owner(i) == 0)
            .take(most as usize)
            .count() as u32
    }

    /// Newest segment of a log.
    pub fn head(&self, log_id: u32) -> u64 {
        self.load(log_id, HEAD)
    }

    /// Publishes a new newest segment.
    pub fn set_head(&self, log_id: u32, offset: u64) {
        self.store(log_id, HEAD, offset)
    }

    /// Highest merged sequence number of a log.
    pub fn merged_seq(&self, log_id: u32) -> u64 {
        self.load(log_id, MERGED_SEQ)
    }

    /// Records merge progress (after the index changes it covers are persisted).
    pub fn set_merged_seq(&self, log_id: u32, seq: u64) {
        self.store(log_id, MERGED_SEQ, seq)
    }

    /// The newest management epoch the memory node acted on; 0 before the first.
    pub fn manager_epoch(&self) -> u64 {
        self.word(self.offset + MANAGER_EPOCH)
            .load(Ordering::Acquire)
    }

    /// Records (and persists) a newer management epoch before the call carrying it acts, so that the older
    /// changes' calls are refused across a restart as well.
    pub fn set_manager_epoch(&self, epoch: u64) {
        self.store_word(self.offset + MANAGER_EPOCH, epoch);
    }

    /// Pool offset of a log's `merged_seq` word.
    pub fn merged_seq_offset(&self, log_id: u32) -> u64 {
        self.word_offset(log_id, MERGED_SEQ)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root naming a whole, valid header at a place that is not word-aligned is refused at open: the directory's
    /// descriptors are atomic words, which cannot be taken at such a place.
    #[test]
    fn a_directory_root_off_word_alignment_is_refused_at_open() {
        let pool = Arc::new(Pool::anonymous(8 << 20, 1 << 20).unwrap());
        let dir = Directory::create(pool.clone(), 4, HashMode::Xxh3, 1 << 20).unwrap();
        let mut h = [0u8; HEADER_LEN as usize];
        pool.read(dir.offset, &mut h).unwrap();
        let bytes = HEADER_LEN + 4 * DESCRIPTOR_LEN;
        let ext = pool.alloc_bytes(bytes + 8, tags::LOG_DIRECTORY).unwrap();
        pool.write(ext.offset + 4, &h).unwrap();
        pool.set_root(dinomo_log::roots::LOG_DIRECTORY, ext.offset + 4)
            .unwrap();
        match Directory::open(pool.clone()) {
            Err(ProcessorError::Corrupt(why)) => assert!(why.contains("aligned"), "{why}"),
            other => panic!(
                "opened a misaligned directory: {:?}",
                other.map(|d| d.is_some())
            ),
        }
        // The same header at an aligned place opens.
        pool.write(ext.offset, &h).unwrap();
        pool.set_root(dinomo_log::roots::LOG_DIRECTORY, ext.offset)
            .unwrap();
        assert!(Directory::open(pool).unwrap().is_some());
    }
}
