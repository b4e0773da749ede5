//! The memory node's index: one shared by every KV node (DINOMO), or one partition per KV node (DINOMO-N), each
//! named by a descriptor of the pool's [`PartitionTable`].
//!
//! A partition is created on its node's first claim of a log. It is marked departed when the node's logs are taken
//! over (the node failed or was removed) and unmarked when the node claims a log again. Node ids are not reused,
//! so the partitions of departed nodes would fill the table (and hold an index table each) in a cluster that adds
//! and removes nodes for long: once a departed node's partition is empty (the rebalance after its departure moved
//! its keys to their new owners) and no log merges into it any more (its logs retired, see `retire`), it is freed
//! ([`Partitions::free_departed`]) and its slot taken by the next new node.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use dinomo_index::{Anchor, Index, IndexConfig, IndexError};
use dinomo_log::roots;
use dinomo_pool::Pool;
use tracing::{info, warn};

use super::{Partitioning, ProcessorConfig, ProcessorError};
use crate::partitions::PartitionTable;

/// The index layout of a pool.
pub(super) enum Indexes {
    Shared(Arc<Index>),
    PerNode(Partitions),
}

/// The partitions of a pool formatted per KV node.
pub(super) struct Partitions {
    table: PartitionTable,
    by_node: RwLock<BTreeMap<u32, Partition>>,
    config: IndexConfig,
    /// Serializes changes of the table: creations, departure marks and frees.
    changing: Mutex<()>,
}

struct Partition {
    slot: u32,
    index: Arc<Index>,
    departed: bool,
}

impl Indexes {
    /// Opens (or formats) the layout `config` asks for; a pool formatted with the other layout is refused.
    pub(super) fn open(
        pool: &Arc<Pool>,
        config: &ProcessorConfig,
    ) -> Result<Indexes, ProcessorError> {
        let table = PartitionTable::open(pool.clone())?;
        match (config.partitioning, table) {
            (Partitioning::Shared, None) => Ok(Indexes::Shared(Arc::new(Index::open_or_create(
                pool.clone(),
                &config.index,
            )?))),
            (Partitioning::Shared, Some(_)) => Err(ProcessorError::Config(
                "the pool is partitioned per KV node (formatted for dinomo-n); it opens only with partitioning \
                 per-node (dinomo up --system dinomo-n, dinomo dpm --partitioning per-node)"
                    .into(),
            )),
            (Partitioning::PerNode, None) => {
                if pool.root(roots::INDEX)? != 0 || pool.root(roots::LOG_DIRECTORY)? != 0 {
                    return Err(ProcessorError::Config(
                        "the pool holds one shared index (formatted for dinomo or dinomo-s); it opens only with \
                         partitioning shared (dinomo up --system dinomo|dinomo-s, dinomo dpm --partitioning shared)"
                            .into(),
                    ));
                }
                let table = PartitionTable::create(pool.clone(), config.partition_capacity)?;
                Ok(Indexes::per_node(table, BTreeMap::new(), config))
            }
            (Partitioning::PerNode, Some(table)) => {
                let mut by_node = BTreeMap::new();
                for p in table.partitions() {
                    let anchor = Anchor::Word(table.index_anchor(p.slot));
                    let index = Index::open_at(pool.clone(), &config.index, anchor)?;
                    by_node.insert(
                        p.node,
                        Partition {
                            slot: p.slot,
                            index: Arc::new(index),
                            departed: p.departed,
                        },
                    );
                }
                let live: Vec<&Index> = by_node.values().map(|p| &*p.index).collect();
                // Among them the index of a partition whose free a crash interrupted.
                dinomo_index::free_unreferenced(pool, &live);
                Ok(Indexes::per_node(table, by_node, config))
            }
        }
    }

    fn per_node(
        table: PartitionTable,
        by_node: BTreeMap<u32, Partition>,
        config: &ProcessorConfig,
    ) -> Indexes {
        Indexes::PerNode(Partitions {
            table,
            by_node: RwLock::new(by_node),
            config: config.index.clone(),
            changing: Mutex::new(()),
        })
    }

    pub(super) fn partitioning(&self) -> Partitioning {
        match self {
            Indexes::Shared(_) => Partitioning::Shared,
            Indexes::PerNode(_) => Partitioning::PerNode,
        }
    }

    /// The index KV node `node`'s logs merge into and it reads; a node's partition is created on first use.
    pub(super) fn for_node(
        &self,
        pool: &Arc<Pool>,
        node: u32,
    ) -> Result<Arc<Index>, ProcessorError> {
        match self {
            Indexes::Shared(index) => Ok(index.clone()),
            Indexes::PerNode(parts) => parts.for_node(pool, node),
        }
    }

    /// Every index, with the node whose partition it is (`None` for the shared index).
    pub(super) fn all(&self) -> Vec<(Option<u32>, Arc<Index>)> {
        match self {
            Indexes::Shared(index) => vec![(None, index.clone())],
            Indexes::PerNode(parts) => parts
                .by_node
                .read()
                .expect("partitions lock")
                .iter()
                .map(|(n, p)| (Some(*n), p.index.clone()))
                .collect(),
        }
    }

    /// The shared index, which keys shared by several KV nodes move out of and back into.
    pub(super) fn shared(&self) -> Result<&Index, ProcessorError> {
        match self {
            Indexes::Shared(index) => Ok(index),
            Indexes::PerNode(_) => Err(ProcessorError::Config(
                "the pool is partitioned per KV node (dinomo-n): a key cannot be shared by several KV nodes"
                    .into(),
            )),
        }
    }

    /// Marks `node`'s partition departed (its logs were taken over) or back (it claims a log), persistently.
    /// Nothing to do with the shared index, or for a node without a partition.
    pub(super) fn set_departed(&self, node: u32, departed: bool) {
        if let Indexes::PerNode(parts) = self {
            parts.set_departed(node, departed);
        }
    }

    /// Whether `node` has a partition marked departed.
    pub(super) fn is_departed(&self, node: u32) -> bool {
        match self {
            Indexes::Shared(_) => false,
            Indexes::PerNode(parts) => parts.is_departed(node),
        }
    }

    /// Whether `index` is still one of the memory node's indexes (false once a departed partition's was freed).
    pub(super) fn is_live(&self, index: &Arc<Index>) -> bool {
        match self {
            Indexes::Shared(_) => true,
            Indexes::PerNode(parts) => parts
                .by_node
                .read()
                .expect("partitions lock")
                .values()
                .any(|p| Arc::ptr_eq(&p.index, index)),
        }
    }
}

impl Partitions {
    fn for_node(&self, pool: &Arc<Pool>, node: u32) -> Result<Arc<Index>, ProcessorError> {
        if let Some(p) = self.by_node.read().expect("partitions lock").get(&node) {
            return Ok(p.index.clone());
        }
        let _one = self.changing.lock().expect("partition changes lock");
        if let Some(p) = self.by_node.read().expect("partitions lock").get(&node) {
            return Ok(p.index.clone());
        }
        let slot = self.table.reserve(node)?;
        let index = Arc::new(Index::create_at(
            pool.clone(),
            &self.config,
            Anchor::Word(self.table.index_anchor(slot)),
        )?);
        self.table.commit(slot, node);
        info!(node, slot, "index partition created");
        self.by_node.write().expect("partitions lock").insert(
            node,
            Partition {
                slot,
                index: index.clone(),
                departed: false,
            },
        );
        Ok(index)
    }

    fn set_departed(&self, node: u32, departed: bool) {
        let _one = self.changing.lock().expect("partition changes lock");
        let mut by_node = self.by_node.write().expect("partitions lock");
        if let Some(p) = by_node.get_mut(&node)
            && p.departed != departed
        {
            self.table.set_departed(p.slot, node, departed);
            p.departed = departed;
        }
    }

    fn is_departed(&self, node: u32) -> bool {
        self.by_node
            .read()
            .expect("partitions lock")
            .get(&node)
            .is_some_and(|p| p.departed)
    }

    /// Frees every departed partition whose index is empty and that `in_use` (whether a log merges into an index)
    /// does not name; returns the nodes whose partitions were freed. The caller keeps a log from being claimed
    /// into a partition meanwhile (a claim checks, under the lock the caller holds, that its index
    /// [`Indexes::is_live`]).
    pub(super) fn free_departed(&self, in_use: impl Fn(&Arc<Index>) -> bool) -> Vec<u32> {
        let _one = self.changing.lock().expect("partition changes lock");
        let unused: Vec<(u32, u32, Arc<Index>)> = self
            .by_node
            .read()
            .expect("partitions lock")
            .iter()
            .filter(|(_, p)| p.departed && p.index.is_empty() && !in_use(&p.index))
            .map(|(&node, p)| (node, p.slot, p.index.clone()))
            .collect();
        let mut freed = Vec::with_capacity(unused.len());
        for (node, slot, index) in unused {
            let partition = self.by_node.write().expect("partitions lock").remove(&node);
            // The partition ends before its index goes: a crash in between leaves an index nothing names.
            self.table.release(slot);
            match index.free() {
                Ok(()) => self.table.clear_index(slot),
                Err(IndexError::NotEmpty(entries)) => {
                    // Nothing writes to a partition no log merges into; should something have, it stays.
                    warn!(
                        node,
                        slot, entries, "a departed node's partition is not empty after all"
                    );
                    self.table.set_departed(slot, node, true);
                    if let Some(p) = partition {
                        self.by_node
                            .write()
                            .expect("partitions lock")
                            .insert(node, p);
                    }
                    continue;
                }
                // Unreferenced now: the next start frees what is left of it.
                Err(e) => warn!(node, slot, error = %e, "freeing a departed node's index failed"),
            }
            info!(
                node,
                slot, "the index partition of a departed node was freed"
            );
            freed.push(node);
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a claim relies on: an index looked up before its departed partition was freed is no longer live, and
    /// looking the node up again makes it a new partition, which is.
    #[test]
    fn a_freed_partitions_index_is_not_live_and_the_node_gets_a_new_one() {
        let pool = Arc::new(Pool::anonymous(16 << 20, 64 << 10).unwrap());
        let config = ProcessorConfig {
            partitioning: Partitioning::PerNode,
            ..ProcessorConfig::default()
        };
        let indexes = Indexes::open(&pool, &config).unwrap();
        let Indexes::PerNode(parts) = &indexes else {
            panic!("per-node layout");
        };
        let looked_up = indexes.for_node(&pool, 5).unwrap();
        assert!(indexes.is_live(&looked_up));
        // In use, or not departed: kept.
        indexes.set_departed(5, true);
        assert!(indexes.is_departed(5));
        assert!(parts.free_departed(|_| true).is_empty());
        indexes.set_departed(5, false);
        assert!(parts.free_departed(|_| false).is_empty());

        indexes.set_departed(5, true);
        assert_eq!(parts.free_departed(|_| false), vec![5]);
        assert!(!indexes.is_live(&looked_up));
        assert!(!indexes.is_departed(5));
        let again = indexes.for_node(&pool, 5).unwrap();
        assert!(indexes.is_live(&again) && !Arc::ptr_eq(&again, &looked_up));
    }
}
