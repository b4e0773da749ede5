//! Persistent hash index (P-CLHT style) in the pool.
//!
//! The index maps a 64-bit key hash to an [`EntryRef`] (a packed pointer to a log entry). Keys are arbitrary bytes:
//! the index stores only the hash, the full key lives in the log entry, and every lookup hands each candidate to the
//! caller's `key_matches`, which compares the full key. Colliding hashes simply share a chain.
//!
//! # Who does what
//! - **Writers** are the memory node's processor threads (merge threads), several at once, through `&self` methods
//!   of [`Index`]. Writers of the same chain are serialized by striped locks kept in DRAM (keyed by primary bucket);
//!   a DRAM `RwLock` is held shared by every write and exclusively by a resize.
//! - **Readers** never lock: [`Index::get`] on the memory node, and [`RemoteIndex::candidates`] on KV nodes using
//!   one-sided READs.
//!
//! # Layout
//! See [`layout`]: 64-byte buckets of three `(hash, value)` slots and a `next` word; a table is one extent holding
//! its header, the primary buckets and an overflow area whose buckets are handed out by a bump counter in the table
//! header. Bucket selection uses the low bits of a mixed hash ([`layout::mix`]), so structured hashes still spread.
//! The index header (root slot [`dinomo_log::roots::INDEX`]) holds magic, version, settings, a CRC over them, and the
//! `current` word naming the published table.
//!
//! # Slot protocol and crash consistency
//! A slot is live when its hash and value words are both non-zero; hash 0 means empty whatever the value.
//! - insert: store the value word, persist it, then store the hash word (release), persist it;
//! - update: one atomic 8-byte store of the value word, persisted;
//! - delete: clear the hash word, persist, then clear the value word, persist.
//!
//! A lock-free reader may copy a slot while it changes and pair a hash with the value of another key that used the
//! slot before or after; that value points to an entry whose key differs, so the caller's full-key comparison
//! rejects it. It never sees a hash paired with a half-written value, because each word is stored atomically.
//!
//! Every crash point leaves an index that opens: a slot is committed by its hash word; an overflow bucket is taken
//! from the bump counter (persisted) before it is filled, and becomes reachable only when the previous bucket's
//! `next` word is stored (persisted) after it is filled, so an interrupted insert at worst leaks one overflow bucket
//! of that table. A resize builds and persists the whole new table in a fresh extent before publishing it with one
//! atomic store of `current`. Opening frees every `INDEX_TABLE` extent that is not current (an interrupted resize,
//! tables retired before a crash). The caller replays its log with upsert semantics, so an interrupted operation
//! may be lost or applied, and every completed one is there.
//!
//! # Resize and reclamation
//! When an insert would push the load past `max_load` of the primary slots, or needs an overflow bucket and the
//! overflow area is full, the writer takes the resize lock exclusively and rebuilds the table: the primary buckets
//! double (unless the load is under half of `max_load`, in which case the chains are long because hashes collide,
//! doubling would not shorten them, and only the overflow area grows), the new table is written and persisted in a
//! new extent, and `current` is swapped. The old table is retired: it is freed once `retire_grace` has passed, and
//! never while it is current. A pool out of space frees retired tables at once ([`Index::reclaim_retired_now`]):
//! the grace is a courtesy, not what makes lookups safe (next section).
//!
//! # Why readers never use freed or reused memory
//! A reader works from a `current` word `W` it read earlier. It reads each bucket (and a table header when it needs
//! the geometry) in one batch **followed by** a READ of the index header's `current` word; the batch executes in
//! order. If that READ still returns `W`, the table named by `W` was current when the bucket was read: `current`
//! only moves forward (every resize publishes a new word, with a new generation), so it was `W` during the whole
//! interval, and a table is never freed while it is current. The bucket bytes are therefore the table's own. If the
//! word changed, the bucket is discarded unread and the lookup restarts on the new table. A lookup that follows a
//! chain validates every bucket this way, so all of them come from one table while it was current. The local
//! [`Index::get`] follows the same protocol with atomic loads (acquire) instead of READs.
//!
//! A remote lookup therefore costs one round trip per bucket of the chain (usually one), plus one discarded round
//! trip each time a resize is published under its feet.

mod index;
pub mod layout;
mod remote;

use std::time::Duration;

pub use dinomo_log::EntryRef;
pub use index::{Anchor, Index, free_unreferenced};
pub use remote::{REMOTE_MAX_ATTEMPTS, RemoteIndex};

/// The slice a cursor walking the index visits after `slice`, when slices are read at `bits` bits (see
/// [`Index::for_each_in_slice`]); 0 once every slice was visited. Slices are taken in the order of their reversed
/// bits, as Redis's `SCAN` takes buckets: a walk that changes `bits` between steps (because the tables grew or
/// shrank) still visits every hash it had not visited, some perhaps twice.
pub fn next_slice(slice: u64, bits: u32) -> u64 {
    let mask = 1u64.checked_shl(bits).map_or(u64::MAX, |n| n - 1);
    let v = (slice | !mask).reverse_bits().wrapping_add(1);
    v.reverse_bits()
}

/// Settings of an index.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexConfig {
    /// Primary buckets of the first table (a power of two). Default 1024. Used only when creating.
    pub initial_buckets: u64,
    /// Largest fraction of the primary slots (3 per bucket) that may be live before the table doubles. Default
    /// 0.75.
    pub max_load: f64,
    /// Spare overflow buckets per primary bucket in each new table. Default 0.25.
    pub overflow_per_bucket: f64,
    /// How long a replaced table stays allocated, so that lookups already under way finish on it. Default 2 s. A
    /// pool out of space frees replaced tables sooner: no lookup trusts what it read from one.
    #[serde(with = "humantime_serde")]
    pub retire_grace: Duration,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            initial_buckets: 1024,
            max_load: 0.75,
            overflow_per_bucket: 0.25,
            retire_grace: Duration::from_secs(2),
        }
    }
}

impl IndexConfig {
    /// Checks that the settings describe an index.
    pub fn validate(&self) -> Result<(), IndexError> {
        if !self.initial_buckets.is_power_of_two() || self.initial_buckets > layout::MAX_BUCKETS {
            return Err(IndexError::InvalidConfig(format!(
                "initial_buckets {} must be a power of two no larger than 2^40",
                self.initial_buckets
            )));
        }
        if !(self.max_load > 0.0 && self.max_load <= 1.0) {
            return Err(IndexError::InvalidConfig(format!(
                "max_load {} must lie in (0, 1]",
                self.max_load
            )));
        }
        if !(self.overflow_per_bucket >= 0.0 && self.overflow_per_bucket <= 16.0) {
            return Err(IndexError::InvalidConfig(format!(
                "overflow_per_bucket {} must lie in [0, 16]",
                self.overflow_per_bucket
            )));
        }
        Ok(())
    }
}

/// Counters and geometry of an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexStats {
    /// Primary buckets of the current table.
    pub buckets: u64,
    /// Overflow buckets handed out in the current table.
    pub overflow_used: u64,
    /// Overflow buckets of the current table.
    pub overflow_capacity: u64,
    /// Live entries.
    pub entries: u64,
    /// Resizes since this `Index` was opened.
    pub resizes: u64,
    /// Bytes of the current table.
    pub table_bytes: u64,
    /// Replaced tables not freed yet.
    pub retired_tables: usize,
    /// Resize generation of the current table (persistent).
    pub generation: u64,
}

/// Errors of the index on the memory node. Opening never changes a pool whose index it refuses.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The root slot holds no index.
    #[error("no index in this pool (root slot {} is 0)", dinomo_log::roots::INDEX)]
    NotFound,
    /// `create` found an index already.
    #[error("an index already exists at pool offset {0:#x}")]
    AlreadyExists(u64),
    /// The index header is damaged or is not an index header.
    #[error("corrupt index header at pool offset {offset:#x}: {reason}")]
    CorruptHeader {
        /// Pool offset of the header.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The current table is damaged.
    #[error("corrupt index table at pool offset {offset:#x}: {reason}")]
    CorruptTable {
        /// Pool offset of the table.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The index was written by an incompatible format.
    #[error(
        "index format version {found} is not supported (this build reads version {})",
        layout::FORMAT_VERSION
    )]
    UnsupportedVersion {
        /// Version in the pool.
        found: u32,
    },
    /// Settings that cannot describe an index.
    #[error("invalid index settings: {0}")]
    InvalidConfig(String),
    /// The null reference cannot be stored (it marks an empty slot).
    #[error("the null entry reference cannot be stored in the index")]
    NullRef,
    /// The pool has no room for a new table.
    #[error("index table of {bytes} bytes does not fit in the pool: {source}")]
    OutOfSpace {
        /// Size of the table that was asked for.
        bytes: u64,
        /// The pool's answer.
        source: dinomo_pool::PoolError,
    },
    /// [`Index::free`] was asked to free an index that still holds entries.
    #[error("the index still holds {0} entries and cannot be freed")]
    NotEmpty(u64),
    /// Any other pool error.
    #[error(transparent)]
    Pool(#[from] dinomo_pool::PoolError),
}

/// Errors of a remote reader.
#[derive(Debug, thiserror::Error)]
pub enum RemoteIndexError {
    /// A verb failed or the connection broke.
    #[error(transparent)]
    Fabric(#[from] dinomo_fabric::FabricError),
    /// The memory node does not register a region the reader needs.
    #[error("the memory node has no {0:?} region")]
    NoRegion(&'static str),
    /// The root slot holds no index.
    #[error(
        "no index on the memory node (root slot {} is 0)",
        dinomo_log::roots::INDEX
    )]
    NotFound,
    /// The index header or a table header read remotely is damaged.
    #[error("corrupt index at pool offset {offset:#x}: {reason}")]
    Corrupt {
        /// Pool offset of the damaged header.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The lookup kept finding the table replaced (or a chain it could not follow) and gave up.
    #[error("index lookup gave up after {attempts} attempts (tables kept changing)")]
    TooManyRetries {
        /// Attempts made.
        attempts: u32,
    },
}
