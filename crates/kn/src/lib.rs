//! The KV node (KN).
//!
//! A KV node runs worker threads; each owns a share of the keys (its local key range), with its own cache, its
//! own log on the memory node and its own fabric endpoint, so threads share nothing on the request path.
//!
//! Writes are appended to the thread's current log segment (a local copy that is also the write buffer); the
//! requests that arrive together go out in one WRITE (group commit) and are acknowledged only after it completed.
//! Reads go, in order: value in the cache (0 round trips) → shortcut in the cache (1 READ, checked against key and
//! sequence number) → the thread's unmerged segments (local) → the index on the memory node → the cache is filled.

mod config;
mod embedded;
mod error;
mod hotkeys;
mod node;
mod occupancy;
mod segment_keys;
mod txn;
mod worker;

pub use config::KnConfig;
pub use embedded::{Embedded, EmbeddedConfig};
pub use error::KnError;
pub use hotkeys::{
    KeyCount, KeyFrequency, KeySketch, KeyStats, KeyStatsConfig, KeyStatsError, sketch_hash,
    sketch_hash_of,
};
pub use node::{KvHandle, KvNode, Submitter, submit_txn, thread_for_key};
pub use txn::{TxnAbort, TxnBarrier, TxnOps, TxnPart};
pub use worker::{
    Command, DataOp, DirectWorker, EpochStats, LeaseGate, OpCounts, Ownership, Reply, ReplySink,
    Tagged, WorkerStats,
};

/// The instant `after` from now; a setting too large for the clock means "not in this process's lifetime" (a
/// century) rather than a panic.
pub fn deadline_after(after: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(100 * 365 * 24 * 3600))
}
