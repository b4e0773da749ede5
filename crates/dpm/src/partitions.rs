//! The partition table of a pool formatted shared-nothing ([`crate::Partitioning::PerNode`], DINOMO-N): one index
//! per KV node, each named by a word of this table.
//!
//! ```text
//! header (64 B): magic "DNMPART1" | version u32 | reserved u32 | capacity u64 | crc32c u32 (over bytes 0..24)
//! descriptor i (16 B, at 64 + 16·i):
//!   0..8   node: 0 = free, else 1<<63 | node_id
//!   8..16  index: pool offset of the partition's index header (the index's anchor word)
//! ```
//! A partition is claimed in three crash-safe steps: the index word is cleared (a leftover of an interrupted
//! claim), the index is created and named by the index word ([`dinomo_index::Index::create_at`]), and only then is
//! the node word stored, which commits the claim. An index whose descriptor was never committed is freed at the
//! next start ([`dinomo_index::free_unreferenced`]). Only the processor writes the table.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dinomo_pool::Pool;

use crate::ProcessorError;
use crate::table_header::{HEADER_LEN, TableKind};

/// Root slot of the partition table.
pub const ROOT: usize = 5;
/// Allocation tag of the partition table.
pub const TAG: u16 = 0x13;

const KIND: TableKind = TableKind {
    name: "partition table",
    magic: *b"DNMPART1",
    version: 1,
    root: ROOT,
    tag: TAG,
};
const DESCRIPTOR_LEN: u64 = 16;
const COMMITTED: u64 = 1 << 63;

/// The partition table in the pool.
pub struct PartitionTable {
    pool: Arc<Pool>,
    offset: u64,
    capacity: u32,
}

impl PartitionTable {
    /// Formats a table of `capacity` partitions and publishes it in its root slot.
    pub fn create(pool: Arc<Pool>, capacity: u32) -> Result<PartitionTable, ProcessorError> {
        if capacity == 0 {
            return Err(ProcessorError::Config(
                "partition_capacity must be at least 1".into(),
            ));
        }
        let offset = KIND.format(
            &pool,
            0,
            u64::from(capacity),
            u64::from(capacity) * DESCRIPTOR_LEN,
        )?;
        Ok(PartitionTable {
            pool,
            offset,
            capacity,
        })
    }

    /// Opens the table named by the root slot; `None` when the pool has none (it is not partitioned).
    pub fn open(pool: Arc<Pool>) -> Result<Option<PartitionTable>, ProcessorError> {
        let offset = pool.root(ROOT)?;
        if offset == 0 {
            return Ok(None);
        }
        let corrupt = |why: &str| KIND.corrupt(offset, why);
        let (_, capacity) = KIND.read(&pool, offset)?;
        let capacity = u32::try_from(capacity).map_err(|_| corrupt("absurd capacity"))?;
        pool.check_range(offset, HEADER_LEN + u64::from(capacity) * DESCRIPTOR_LEN)
            .map_err(|_| corrupt("descriptors run past the pool"))?;
        Ok(Some(PartitionTable {
            pool,
            offset,
            capacity,
        }))
    }

    fn word(&self, slot: u32, field: u64) -> &std::sync::atomic::AtomicU64 {
        self.pool
            .atomic_u64(self.offset + HEADER_LEN + u64::from(slot) * DESCRIPTOR_LEN + field)
            .expect("table range checked at open")
    }

    /// The pool offset of the word that names partition `slot`'s index.
    pub fn index_anchor(&self, slot: u32) -> u64 {
        self.offset + HEADER_LEN + u64::from(slot) * DESCRIPTOR_LEN + 8
    }

    /// Every committed partition: (slot, node id).
    pub fn partitions(&self) -> Vec<(u32, u32)> {
        (0..self.capacity)
            .filter_map(|slot| {
                let w = self.word(slot, 0).load(Ordering::Acquire);
                (w & COMMITTED != 0).then_some((slot, w as u32))
            })
            .collect()
    }

    /// A free slot for `node`'s partition, with its index word cleared; the caller creates the index at
    /// [`PartitionTable::index_anchor`] and then calls [`PartitionTable::commit`].
    pub fn reserve(&self, node: u32) -> Result<u32, ProcessorError> {
        let slot = (0..self.capacity)
            .find(|&s| self.word(s, 0).load(Ordering::Acquire) == 0)
            .ok_or_else(|| {
                ProcessorError::Config(format!(
                    "no room for the partition of KV node {node}: the pool was formatted for {} partitions",
                    self.capacity
                ))
            })?;
        let index = self.word(slot, 8);
        if index.load(Ordering::Acquire) != 0 {
            // Left by a claim a crash interrupted; its index extents were freed at start.
            index.store(0, Ordering::Release);
            self.pool.persist(self.index_anchor(slot), 8);
        }
        Ok(slot)
    }

    /// Commits `slot` as `node`'s partition (its index exists).
    pub fn commit(&self, slot: u32, node: u32) {
        self.word(slot, 0)
            .store(COMMITTED | u64::from(node), Ordering::Release);
        self.pool.persist(
            self.offset + HEADER_LEN + u64::from(slot) * DESCRIPTOR_LEN,
            8,
        );
    }
}
