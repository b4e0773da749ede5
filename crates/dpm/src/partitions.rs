//! The partition table of a pool formatted shared-nothing ([`crate::Partitioning::PerNode`], DINOMO-N): one index
//! per KV node, each named by a word of this table.
//!
//! ```text
//! header (64 B): magic "DNMPART1" | version u32 | reserved u32 | capacity u64 | crc32c u32 (over bytes 0..24)
//! descriptor i (16 B, at 64 + 16·i):
//!   0..8   node: 0 = free, else 1<<63 | departed<<62 | node_id
//!   8..16  index: pool offset of the partition's index header (the index's anchor word)
//! ```
//! A partition is claimed in three crash-safe steps: the index word is cleared (a leftover of an interrupted
//! claim), the index is created and named by the index word ([`dinomo_index::Index::create_at`]), and only then is
//! the node word stored, which commits the claim. An index whose descriptor was never committed is freed at the
//! next start ([`dinomo_index::free_unreferenced`]). Only the processor writes the table.
//!
//! A partition is marked departed when its node's logs are taken over (the node failed or was removed), and
//! unmarked when the node claims a log again. A departed partition that no log merges into any more is given back
//! in the reverse order: the node word is cleared first, which ends the partition (a crash after it leaves an
//! uncommitted index, freed at the next start), then the index is freed and the index word cleared.

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
const DEPARTED: u64 = 1 << 62;

/// A committed descriptor of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSlot {
    /// Where its descriptor is.
    pub slot: u32,
    /// The KV node whose partition it is.
    pub node: u32,
    /// Its node's logs were taken over and the node has not claimed one since.
    pub departed: bool,
}

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

    /// Every committed partition.
    pub fn partitions(&self) -> Vec<PartitionSlot> {
        (0..self.capacity)
            .filter_map(|slot| {
                let w = self.word(slot, 0).load(Ordering::Acquire);
                (w & COMMITTED != 0).then_some(PartitionSlot {
                    slot,
                    node: w as u32,
                    departed: w & DEPARTED != 0,
                })
            })
            .collect()
    }

    /// A free slot for `node`'s partition, with its index word cleared; the caller creates the index at
    /// [`PartitionTable::index_anchor`] and then calls [`PartitionTable::commit`].
    pub fn reserve(&self, node: u32) -> Result<u32, ProcessorError> {
        let slot = (0..self.capacity)
            .find(|&s| self.word(s, 0).load(Ordering::Acquire) == 0)
            .ok_or(ProcessorError::PartitionTableFull {
                node,
                capacity: self.capacity,
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
        self.store_node_word(slot, COMMITTED | u64::from(node));
    }

    /// Marks `node`'s partition at `slot` departed, or not.
    pub fn set_departed(&self, slot: u32, node: u32, departed: bool) {
        let flag = if departed { DEPARTED } else { 0 };
        self.store_node_word(slot, COMMITTED | flag | u64::from(node));
    }

    /// Ends the partition at `slot`: from now on it is free, and its index unreferenced. The caller frees the index
    /// and then calls [`PartitionTable::clear_index`]; a crash in between leaves the index to the next start.
    pub fn release(&self, slot: u32) {
        self.store_node_word(slot, 0);
    }

    /// Clears the index word of a released slot, once its index is freed.
    pub fn clear_index(&self, slot: u32) {
        self.word(slot, 8).store(0, Ordering::Release);
        self.pool.persist(self.index_anchor(slot), 8);
    }

    fn store_node_word(&self, slot: u32, word: u64) {
        self.word(slot, 0).store(word, Ordering::Release);
        self.pool.persist(
            self.offset + HEADER_LEN + u64::from(slot) * DESCRIPTOR_LEN,
            8,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(capacity: u32) -> (Arc<Pool>, PartitionTable) {
        let pool = Arc::new(Pool::anonymous(4 << 20, 64 << 10).unwrap());
        let table = PartitionTable::create(pool.clone(), capacity).unwrap();
        (pool, table)
    }

    #[test]
    fn departure_marks_and_releases_survive_a_reopen_and_free_slots_are_reused() {
        let (pool, table) = table(2);
        let a = table.reserve(7).unwrap();
        table.commit(a, 7);
        let b = table.reserve(8).unwrap();
        table.commit(b, 8);
        let full = table.reserve(9).unwrap_err().to_string();
        assert!(
            full.contains("formatted for 2 partitions at once"),
            "{full}"
        );

        table.set_departed(a, 7, true);
        let reopened = PartitionTable::open(pool.clone()).unwrap().unwrap();
        let slot = |slot, node, departed| PartitionSlot {
            slot,
            node,
            departed,
        };
        assert_eq!(
            reopened.partitions(),
            vec![slot(a, 7, true), slot(b, 8, false)]
        );
        table.set_departed(a, 7, false);
        assert_eq!(table.partitions()[0], slot(a, 7, false));

        // A released slot is free at once; its index word, until cleared, is cleared by the next claim.
        table.word(a, 8).store(0x1000, Ordering::Release);
        table.release(a);
        assert_eq!(table.partitions(), vec![slot(b, 8, false)]);
        assert_eq!(table.reserve(9).unwrap(), a);
        assert_eq!(table.word(a, 8).load(Ordering::Acquire), 0);
        table.word(a, 8).store(0x1000, Ordering::Release);
        table.clear_index(a);
        assert_eq!(table.word(a, 8).load(Ordering::Acquire), 0);
    }
}
