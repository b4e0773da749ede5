//! The memory node's processor.
//!
//! KV nodes write their logs with one-sided WRITEs; this crate does everything else on the memory node's side:
//! - a persistent [`directory`] of logs (one per KV-node thread) and the segment chains behind them;
//! - the RPCs of [`proto`]: claim a log (merging what it left unmerged), grant a new segment (sealing the current
//!   one), merge everything now, report statistics;
//! - merge threads that apply each sealed segment to the index in log order (upserts; deletes remove), keep the
//!   per-segment invalidation counters, and recycle segments whose every entry is merged and superseded;
//! - a log cleaner that copies the live entries of mostly-dead segments into a relocation log and moves their index
//!   slots, so that a few live entries do not hold on to whole segments;
//! - the [`cells`] of shared (selectively replicated) keys, whose values live behind indirect pointers that the
//!   owners CAS, and which merges leave out of the index;
//! - in the shared-nothing layout ([`Partitioning::PerNode`], DINOMO-N), one index per KV node ([`partitions`]),
//!   and the rebalance that copies the entries of keys changing owner into their new owner's partition;
//! - the [`revocations`] of KV-node incarnations the cluster took over, kept so that a restart still refuses them;
//! - recovery when the pool is reopened: committed-but-unmerged entries are merged, torn ones are rejected by their
//!   CRC, counters are rebuilt from the index, orphaned segments are freed;
//! - the [`check`]er, which walks all of it in a pool file and reports damage without changing anything.

pub mod cells;
pub mod check;
pub mod directory;
pub mod partitions;
mod processor;
pub mod proto;
pub mod revocations;
mod table_header;

pub use processor::{
    CLEANER_THREAD, MAX_NODE_ID, MEMORY_NODE_ID, MIGRATION_THREAD, Partitioning, Processor,
    ProcessorConfig, ProcessorError, ProcessorStats,
};
