use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dinomo_fabric::{ClientId, Clients, MemoryNode, RpcError, RpcHandler};
use dinomo_index::{Index, IndexConfig, IndexError};
use dinomo_log::segment::{self, DamagedField, InPlace, ScanEnd, SegmentFormat};
use dinomo_log::{
    ENTRY_HEADER_LEN, EntryHeader, EntryRef, EntryView, HashMode, Op, SEGMENT_HEADER_LEN,
    SegmentHeader, tags,
};
use dinomo_pool::{Extent, Pool, PoolError};
use serde::{Deserialize, Serialize};
use tracing::{debug, error, info, warn};

use crate::cells::{self, CellState, CellTable};
use crate::directory::{Directory, owner_node, owner_word};
use crate::proto;
use crate::revocations::RevocationTable;

/// The thread number of a KV node's migration log: the log into which the memory node copies the entries of keys
/// that move into the node's partition (shared-nothing layout only). No KV-node thread may claim it.
pub const MIGRATION_THREAD: u32 = u32::MAX;

/// The thread number of a KV node's relocation log: the log into which the memory node's log cleaner copies the
/// live entries of the segments it empties (see [`ProcessorConfig::clean_below_free_percent`]). No KV-node thread
/// may claim it, and no merge applies it: the cleaner moves each index slot itself, only if it still holds the
/// entry copied.
pub const CLEANER_THREAD: u32 = u32::MAX - 1;

/// The node id of the memory node's own relocation log in a pool with one shared index: the cleaner copies every
/// node's entries there, so a node that leaves leaves no relocation log behind. KV node ids are below it.
pub const MEMORY_NODE_ID: u32 = 0x7fff_ffff;

/// The largest KV node id: a log's owner word holds 31 bits of it, and the last value is the memory node's.
pub const MAX_NODE_ID: u32 = MEMORY_NODE_ID - 1;

mod cleaner;
mod indexes;
mod log_writer;
mod retire;
mod scan;

use indexes::Indexes;

/// How the memory node lays out its index; fixed when the pool is formatted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Partitioning {
    /// One index that every KV node reads (DINOMO): when keys change owner, ownership moves and the data stays.
    #[default]
    Shared,
    /// One index per KV node, read by that node alone (DINOMO-N, shared-nothing): when keys change owner, their
    /// entries are copied from the old owner's partition into the new owner's before the new owner serves them
    /// ([`proto::REBALANCE`]). Keys cannot be shared by several nodes.
    PerNode,
}

impl Partitioning {
    /// Its name on the command line and in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            Partitioning::Shared => "shared",
            Partitioning::PerNode => "per-node",
        }
    }
}

impl std::fmt::Display for Partitioning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Partitioning {
    type Err = String;

    fn from_str(s: &str) -> Result<Partitioning, String> {
        [Partitioning::Shared, Partitioning::PerNode]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown index layout {s:?} (shared or per-node)"))
    }
}

/// Settings of the processor. The hash mode exists for tests and is left out of configuration files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessorConfig {
    /// Threads merging logs into the index (default 4).
    pub merge_threads: usize,
    /// Logs the directory can hold at once, fixed when the pool is formatted (default 4096: 512 KV nodes × 8
    /// threads, and the memory node's own). The logs of nodes that left are given back ([`retire`]).
    pub directory_capacity: u32,
    /// Bytes of a log segment, header included, fixed when the pool is formatted (default 8 MiB).
    pub segment_size: u64,
    /// Key hash of the index, fixed when the pool is formatted (default XXH3; tests force collisions).
    #[serde(skip)]
    pub hash_mode: HashMode,
    /// Index settings.
    pub index: IndexConfig,
    /// Keys that can be shared at once (cells for selective replication), fixed when the pool is formatted
    /// (default 1024).
    pub shared_key_capacity: u32,
    /// Longest key that can be shared, fixed when the pool is formatted (default 240 bytes).
    pub shared_key_max_len: u32,
    /// One shared index, or one per KV node (default shared); a pool opens only with the layout it was formatted
    /// with.
    pub partitioning: Partitioning,
    /// KV nodes that can have a partition at once, fixed when a pool is formatted per node (default 1024). The
    /// partitions of departed nodes are freed once emptied ([`indexes`]).
    pub partition_capacity: u32,
    /// Log segments held back for deletes (default 2). Once the pool is full, a KV-node thread may log deletes
    /// into one of them, so that a full store can still be emptied; they are refilled before any other log
    /// segment is granted. A thread deleting on a full pool holds one at a time (its deletes are merged after each
    /// group commit, and the segment recycled); 0 turns the reserve off.
    pub delete_reserve_segments: u32,
    /// The log cleaner works in the background while less than this share of the pool is free, in percent
    /// (default 25; 0: no background cleaning). A segment is recycled once every entry in it is superseded; a few
    /// live entries (keys written once and never again) would otherwise hold on to whole segments of dead ones
    /// until the pool is full. The cleaner copies the live entries of the emptiest merged segments into a
    /// relocation log, moves their index slots, and recycles the segments. Whatever this share, a segment grant
    /// that finds the pool full cleans before it refuses.
    pub clean_below_free_percent: u8,
    /// Only segments with at most this share of live entries are cleaned, in percent (default 80; 0 turns the
    /// cleaner off): cleaning one copies its live part to free the rest.
    pub clean_max_live_percent: u8,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        ProcessorConfig {
            merge_threads: 4,
            directory_capacity: 4096,
            segment_size: 8 << 20,
            hash_mode: HashMode::Xxh3,
            index: IndexConfig::default(),
            shared_key_capacity: 1024,
            shared_key_max_len: 240,
            partitioning: Partitioning::Shared,
            partition_capacity: 1024,
            delete_reserve_segments: 2,
            clean_below_free_percent: 25,
            clean_max_live_percent: 80,
        }
    }
}

/// What the processor can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    /// The pool refused an operation (out of space, out of range, I/O).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The index refused an operation.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// Persistent metadata does not make sense.
    #[error("corrupt pool metadata: {0}")]
    Corrupt(String),
    /// Every log descriptor is taken.
    #[error("the log directory is full ({capacity} logs): {why}")]
    DirectoryFull {
        /// Descriptors in the directory.
        capacity: u32,
        /// Why no descriptor could be had: which logs hold them, or why none could be emptied.
        why: String,
    },
    /// Every slot of the partition table holds a partition (shared-nothing layout).
    #[error(
        "no room for the partition of KV node {node}: the pool was formatted for {capacity} partitions at once \
         (processor.partition_capacity), and departed nodes' partitions are freed only once emptied"
    )]
    PartitionTableFull {
        /// The node that needed a partition.
        node: u32,
        /// Slots in the table.
        capacity: u32,
    },
    /// A call named a log that does not exist or carried an old session.
    #[error("log {log_id}: {why}")]
    BadLog {
        /// The log.
        log_id: u32,
        /// Why the call was refused.
        why: String,
    },
    /// A management node's call of a change older than one the memory node already acted on: it comes from an
    /// M-node that no longer leads, and following it would undo what the leader did since (see
    /// [`proto::ManagerEpoch`]).
    #[error(
        "{call} of management epoch {offered} is refused: the memory node acted on epoch {newest} already, so \
         the caller no longer leads"
    )]
    StaleEpoch {
        /// The call.
        call: &'static str,
        /// The epoch the call carried.
        offered: u64,
        /// The newest epoch the memory node acted on.
        newest: u64,
    },
    /// A client the memory node revoked (its KV node was taken over) tried to claim a log.
    #[error("{0} was revoked: the cluster took its node over, so it may not claim a log")]
    Revoked(ClientId),
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// A structure formatted when the pool is new does not fit in it.
    #[error("{what} ({bytes} bytes) does not fit in the pool: {source}")]
    NoRoom {
        /// The structure, in words.
        what: String,
        /// Its size.
        bytes: u64,
        /// The pool's refusal (boxed: this variant is rare and would widen every result of the processor).
        source: Box<PoolError>,
    },
}

impl ProcessorError {
    /// Whether the pool had no room for what was asked (a log segment, a table, the index growing); the same
    /// request may succeed once the memory node has reclaimed space.
    pub fn is_out_of_space(&self) -> bool {
        matches!(
            self,
            ProcessorError::Pool(PoolError::OutOfSpace { .. })
                | ProcessorError::Index(IndexError::OutOfSpace { .. })
                | ProcessorError::NoRoom { .. }
        )
    }

    /// A [`ProcessorError::NoRoom`] for `what` of `bytes`, refused by the pool with `source`.
    pub(crate) fn no_room(
        what: impl Into<String>,
        bytes: u64,
        source: PoolError,
    ) -> ProcessorError {
        ProcessorError::NoRoom {
            what: what.into(),
            bytes,
            source: Box::new(source),
        }
    }
}

/// Counters and gauges of the processor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessorStats {
    /// Logs in the directory.
    pub logs: u64,
    /// Segments held by logs.
    pub segments: u64,
    /// Sealed segments not merged yet (the merge backlog).
    pub backlog_segments: u64,
    /// Bytes of entries in the backlog.
    pub backlog_bytes: u64,
    /// Entries applied to the index since start.
    pub merged_entries: u64,
    /// Segments recycled since start.
    pub recycled_segments: u64,
    /// Entries merged at start-up that a crash had left unmerged.
    pub recovered_entries: u64,
    /// Sealed segments whose entries ended before their seal (torn or stale bytes where entries were promised).
    pub torn_entries: u64,
    /// Bytes of log segments that held no valid entry although valid entries of the log followed them: damage, so
    /// the writes there are lost (each such stretch is logged at error level with its place).
    #[serde(default)]
    pub damaged_log_bytes: u64,
    /// Segments whose sealed length was found damaged at start-up: each was scanned to its last valid entry and
    /// sealed there again, as a crash leaves an open segment.
    #[serde(default)]
    pub resealed_segments: u64,
    /// Segments whose link to the older segment was found damaged at start-up and written again: the log's
    /// segment outside every chain whose entries end just before it (none, when the log has no older segment).
    #[serde(default)]
    pub relinked_segments: u64,
    /// Pool bytes in use.
    pub pool_used_bytes: u64,
    /// Pool bytes free.
    pub pool_free_bytes: u64,
    /// Pool bytes faulted in ahead of the log writers by the pool's prefaulter.
    #[serde(default)]
    pub pool_prefaulted_bytes: u64,
    /// Keys in the index.
    pub index_entries: u64,
    /// Bytes of the index's current table.
    pub index_table_bytes: u64,
    /// Keys shared by several KV nodes through indirect cells.
    pub shared_keys: u64,
    /// Index partitions (one per KV node in the shared-nothing layout; 0 with the shared index).
    #[serde(default)]
    pub partitions: u64,
    /// Keys whose entries were copied into another partition because they changed owner, since start.
    #[serde(default)]
    pub migrated_keys: u64,
    /// Bytes of log entries written by those copies, since start.
    #[serde(default)]
    pub migrated_bytes: u64,
    /// Log segments held back for deletes on a full pool (counted as used pool space).
    #[serde(default)]
    pub delete_reserve_segments: u64,
    /// Log segments granted from that reserve since start.
    #[serde(default)]
    pub delete_reserve_grants: u64,
    /// Segments the log cleaner emptied (their live entries copied, the segment recycled), since start.
    #[serde(default)]
    pub cleaned_segments: u64,
    /// Live entries the log cleaner copied into relocation logs, since start.
    #[serde(default)]
    pub relocated_entries: u64,
    /// Bytes of those copies, since start.
    #[serde(default)]
    pub relocated_bytes: u64,
    /// Runs of segments the cleaner emptied for an index table that could not grow although the pool had room
    /// for it in pieces, since start.
    #[serde(default)]
    pub table_runs_made: u64,
    /// Logs whose directory descriptors were given back (no writer, no segment, everything merged), since start.
    #[serde(default)]
    pub retired_logs: u64,
    /// Of those, logs the cleaner emptied first because a claim found the directory full, since start.
    #[serde(default)]
    pub emptied_logs: u64,
    /// Index partitions of departed KV nodes freed (their slot and index tables given back) since start.
    #[serde(default)]
    pub freed_partitions: u64,
    /// The newest management epoch the memory node acted on (kept in the pool).
    #[serde(default)]
    pub manager_epoch: u64,
    /// Management calls refused because a newer epoch was acted on already (from M-nodes that no longer lead),
    /// since start.
    #[serde(default)]
    pub stale_manager_calls: u64,
    /// Revoked KV-node incarnations kept in the pool, refused after a restart as before it.
    #[serde(default)]
    pub revocations_kept: u64,
}

struct SegInfo {
    offset: u64,
    first_seq: u64,
    capacity: u64,
    /// How its in-place header fields are written.
    format: SegmentFormat,
    /// Bytes of entries once sealed.
    sealed_len: Option<u64>,
    /// Sealed before, but its sealed-length word was found damaged at start: taken as open, scanned and sealed
    /// again (its holes are damage, not a write cut short).
    resealed: bool,
    merged: bool,
}

impl SegInfo {
    /// Sealed and not merged yet: the merge backlog.
    fn awaits_merge(&self) -> bool {
        !self.merged && self.sealed_len.is_some()
    }
}

struct LogMeta {
    owner: u64,
    session: u64,
    /// Whether a writer holds `session`: a KV-node thread, or the memory node's own writer of a migration or
    /// relocation log. A log without one, with no segment and everything merged, gives its descriptor back.
    writer: bool,
    /// The incarnation of the KV-node process that claimed the log last, when its connection named it: a take-over
    /// of an older incarnation (from a management node that stalled while the node restarted) leaves the log to
    /// it.
    writer_incarnation: Option<u64>,
    /// Oldest first; the last is the head.
    segments: Vec<SegInfo>,
    merged_seq: u64,
    /// Highest sequence number known to be written (sealed segments and recovery).
    last_seq: u64,
}

struct LogState {
    id: u32,
    /// A relocation log ([`CLEANER_THREAD`]): its entries are copies the cleaner moved the index to itself, so a
    /// merge only marks its segments merged.
    relocation: bool,
    /// The index its entries merge into (the owner's partition in the shared-nothing layout).
    index: Arc<Index>,
    /// Serializes merges of one log, so its entries reach the index in order.
    merge_lock: Mutex<()>,
    meta: Mutex<LogMeta>,
    /// The newest entry counted in `merged_entries`. A merge that fails partway (the index has no room) has applied
    /// some entries; its retry applies them again, and must not count them again.
    counted_seq: AtomicU64,
}

impl LogState {
    /// The segments not merged yet, oldest first, each as (offset, first sequence number, bytes of entries: the
    /// sealed length, or the whole entry area of an open segment, whose entries end at the first invalid one), and
    /// the sequence number merged up to.
    fn unmerged_segments(&self) -> (Vec<(u64, u64, u64)>, u64) {
        let meta = self.meta.lock().expect("log lock");
        let unmerged = meta
            .segments
            .iter()
            .filter(|s| !s.merged)
            .map(|s| {
                let len = s
                    .sealed_len
                    .unwrap_or(s.capacity - SEGMENT_HEADER_LEN as u64);
                (s.offset, s.first_seq, len)
            })
            .collect();
        (unmerged, meta.merged_seq)
    }

    /// Log `id` of `owner`, merging into `index`, with `segments` (oldest first) and everything up to `merged_seq`
    /// merged; `writer` when the claim that makes it has one.
    fn new(
        id: u32,
        owner: u64,
        index: Arc<Index>,
        session: u64,
        writer: bool,
        segments: Vec<SegInfo>,
        merged_seq: u64,
    ) -> LogState {
        LogState {
            id,
            relocation: is_relocation(owner),
            index,
            merge_lock: Mutex::new(()),
            meta: Mutex::new(LogMeta {
                owner,
                session,
                writer,
                writer_incarnation: None,
                segments,
                merged_seq,
                last_seq: merged_seq,
            }),
            counted_seq: AtomicU64::new(merged_seq),
        }
    }
}

/// Invalidation bookkeeping of one merged segment; only the processor keeps it.
struct SegStat {
    log_id: u32,
    /// One past the segment's last byte.
    end: u64,
    entries: u64,
    invalid: u64,
}

struct Inner {
    pool: Arc<Pool>,
    indexes: Indexes,
    dir: Directory,
    /// Cells of shared keys. Lock order: a log's merge lock, then this.
    cells: Mutex<CellTable>,
    /// Active cells; merges skip the cell lookups while there are none.
    shared_active: AtomicUsize,
    logs: RwLock<HashMap<u32, Arc<LogState>>>,
    /// Merged segments by offset.
    stats_by_segment: Mutex<BTreeMap<u64, SegStat>>,
    queue: Sender<u32>,
    stopping: AtomicBool,
    recovering: AtomicBool,
    session_counter: AtomicU64,
    merged_entries: AtomicU64,
    recycled_segments: AtomicU64,
    recovered_entries: AtomicU64,
    torn_entries: AtomicU64,
    damaged_log_bytes: AtomicU64,
    resealed_segments: AtomicU64,
    relinked_segments: AtomicU64,
    /// One rebalance at a time; counting keys waits for it (a key is in two partitions for a moment).
    rebalance_lock: Mutex<()>,
    /// The newest management epoch acted on (persisted in the log directory's header). A management call holds it
    /// while it acts, so a call of an older change cannot slip in between a newer one's check and its effects.
    /// Lock order: this, then every other lock.
    manager_epoch: Mutex<u64>,
    /// One KV node's claim of a new log at a time, from the first try to the try after a log was emptied for it:
    /// the descriptor an emptying frees goes to the claim that asked for it, not to a claim that came in between.
    new_log_claims: Mutex<()>,
    migrated_keys: AtomicU64,
    migrated_bytes: AtomicU64,
    /// Log segments held back for deletes (allocated, in no log; a restart frees them as orphans).
    delete_reserve: Mutex<Vec<Extent>>,
    delete_reserve_target: usize,
    delete_reserve_grants: AtomicU64,
    /// The log cleaner's writers and memory; one cleaning at a time.
    cleaner: Mutex<cleaner::CleanerState>,
    clean_below_free_percent: u8,
    clean_max_live_percent: u8,
    cleaned_segments: AtomicU64,
    relocated_entries: AtomicU64,
    relocated_bytes: AtomicU64,
    /// Index tables (by offset) a run was last made for, and when.
    room_tried: Mutex<cleaner::RoomAttempts>,
    table_runs_made: AtomicU64,
    /// Logs whose descriptors were given back, and those emptied by the cleaner for a claim that found the
    /// directory full.
    retired_logs: AtomicU64,
    emptied_logs: AtomicU64,
    /// Set when a departed node's partition may have become free (a log retired, a node departed): the next
    /// [`Inner::free_departed_partitions`] looks.
    partitions_to_check: AtomicBool,
    freed_partitions: AtomicU64,
    stale_manager_calls: AtomicU64,
    /// The revoked incarnations kept in the pool; written by take-overs, read into the fabric's clients table by
    /// [`Processor::rpc_handler`].
    revocations: Mutex<RevocationTable>,
}

/// The memory node's processor: owns the index and the logs' bookkeeping, runs the merge threads, answers the
/// KV nodes' RPCs. Dropping it stops the merge threads.
pub struct Processor {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Processor {
    /// Opens (or formats) the data plane in `pool`, recovers it, and starts the merge threads.
    pub fn start(
        pool: Arc<Pool>,
        config: &ProcessorConfig,
    ) -> Result<Arc<Processor>, ProcessorError> {
        if config.merge_threads == 0 {
            return Err(ProcessorError::Config(
                "merge_threads must be at least 1".into(),
            ));
        }
        if config.segment_size < 4096 {
            return Err(ProcessorError::Config(format!(
                "segment_size {} is below the minimum of 4096 bytes",
                config.segment_size
            )));
        }
        // The index names an entry by an `EntryRef`, whose length field bounds how large an entry (and so a
        // segment worth filling) can be.
        if config.segment_size > EntryRef::MAX_LEN {
            return Err(ProcessorError::Config(format!(
                "segment_size {} is above the maximum of {} bytes",
                config.segment_size,
                EntryRef::MAX_LEN
            )));
        }
        for (name, percent) in [
            ("clean_below_free_percent", config.clean_below_free_percent),
            ("clean_max_live_percent", config.clean_max_live_percent),
        ] {
            if percent > 100 {
                return Err(ProcessorError::Config(format!(
                    "{name} is {percent}; a share in percent is at most 100"
                )));
            }
        }
        // A start that fails from here on leaves the pool marked as after a crash, whatever it held before.
        pool.begin_recovery();
        let indexes = Indexes::open(&pool, config)?;
        let dir = match Directory::open(pool.clone())? {
            Some(d) => d,
            None => Directory::create(
                pool.clone(),
                config.directory_capacity,
                config.hash_mode,
                config.segment_size,
            )?,
        };
        let cells = CellTable::open_or_create(
            pool.clone(),
            config.shared_key_capacity,
            config.shared_key_max_len,
        )?;
        let revocations = RevocationTable::open(pool.clone())?;
        let shared_active = AtomicUsize::new(cells.active());
        let manager_epoch = dir.manager_epoch();
        let (tx, rx) = crossbeam_channel::unbounded();
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let inner = Arc::new(Inner {
            pool,
            indexes,
            dir,
            cells: Mutex::new(cells),
            shared_active,
            logs: RwLock::new(HashMap::new()),
            stats_by_segment: Mutex::new(BTreeMap::new()),
            queue: tx,
            stopping: AtomicBool::new(false),
            recovering: AtomicBool::new(true),
            session_counter: AtomicU64::new(boot << 16),
            merged_entries: AtomicU64::new(0),
            recycled_segments: AtomicU64::new(0),
            recovered_entries: AtomicU64::new(0),
            torn_entries: AtomicU64::new(0),
            damaged_log_bytes: AtomicU64::new(0),
            resealed_segments: AtomicU64::new(0),
            relinked_segments: AtomicU64::new(0),
            rebalance_lock: Mutex::new(()),
            manager_epoch: Mutex::new(manager_epoch),
            new_log_claims: Mutex::new(()),
            migrated_keys: AtomicU64::new(0),
            migrated_bytes: AtomicU64::new(0),
            delete_reserve: Mutex::new(Vec::new()),
            delete_reserve_target: config.delete_reserve_segments as usize,
            delete_reserve_grants: AtomicU64::new(0),
            cleaner: Mutex::new(cleaner::CleanerState::default()),
            clean_below_free_percent: config.clean_below_free_percent,
            clean_max_live_percent: config.clean_max_live_percent,
            cleaned_segments: AtomicU64::new(0),
            relocated_entries: AtomicU64::new(0),
            relocated_bytes: AtomicU64::new(0),
            room_tried: Mutex::new(cleaner::RoomAttempts::default()),
            table_runs_made: AtomicU64::new(0),
            retired_logs: AtomicU64::new(0),
            emptied_logs: AtomicU64::new(0),
            partitions_to_check: AtomicBool::new(false),
            freed_partitions: AtomicU64::new(0),
            stale_manager_calls: AtomicU64::new(0),
            revocations: Mutex::new(revocations),
        });
        inner.recover()?;
        inner.pool.end_recovery();
        let mut threads: Vec<JoinHandle<()>> = (0..config.merge_threads)
            .map(|i| {
                let inner = inner.clone();
                let rx: Receiver<u32> = rx.clone();
                std::thread::Builder::new()
                    .name(format!("dinomo-merge-{i}"))
                    .spawn(move || inner.merge_loop(rx))
                    .expect("spawn merge thread")
            })
            .collect();
        if config.clean_below_free_percent > 0 && config.clean_max_live_percent > 0 {
            let inner = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("dinomo-cleaner".into())
                    .spawn(move || inner.cleaner_loop())
                    .expect("spawn cleaner thread"),
            );
        }
        Ok(Arc::new(Processor {
            inner,
            threads: Mutex::new(threads),
        }))
    }

    /// Installs this processor as `node`'s RPC handler.
    pub fn serve(self: &Arc<Self>, node: &MemoryNode) {
        node.set_rpc_handler(self.rpc_handler(node));
    }

    /// The processor's RPC handler on `node` (whose clients a take-over revokes), for composing with other
    /// services on one memory node. The incarnations revoked before a restart are revoked on `node` again, so call
    /// this before `node` serves any connection.
    pub fn rpc_handler(&self, node: &MemoryNode) -> Arc<dyn RpcHandler> {
        let kept = self
            .inner
            .revocations
            .lock()
            .expect("revocations lock")
            .revoked();
        if !kept.is_empty() {
            info!(
                revoked = kept.len(),
                "KV-node incarnations revoked before the restart are refused"
            );
            node.clients().restore(&kept);
        }
        Arc::new(Handler {
            inner: self.inner.clone(),
            clients: node.clients().clone(),
        })
    }

    /// Empties the sealed, merged log segments at `offsets` now, whatever their live share: their live entries are
    /// copied into a relocation log and the segments recycled. Returns how many were emptied (an open segment, one
    /// a shared key's entry holds, or one no log holds stays). For a repair: a segment with a damaged stretch keeps
    /// it for as long as any other entry of the segment is live.
    pub fn clean_segments(&self, offsets: &[u64]) -> Result<u64, ProcessorError> {
        self.inner.clean_segments(offsets)
    }

    /// Keys in the index (every partition's, in the shared-nothing layout).
    pub fn indexed_keys(&self) -> u64 {
        self.inner.indexes.all().iter().map(|(_, i)| i.len()).sum()
    }

    /// The layout of the index.
    pub fn partitioning(&self) -> Partitioning {
        self.inner.indexes.partitioning()
    }

    /// Current statistics.
    pub fn stats(&self) -> ProcessorStats {
        self.inner.stats()
    }

    /// How many keys the store holds: the index's entries corrected by the entries of every log that reached the
    /// pool but are not merged yet (a put of a key the index lacks adds one, a delete of a key it has removes one).
    /// Merges wait while it counts, so the index and the logs are seen at one moment.
    pub fn count_keys(&self) -> Result<u64, ProcessorError> {
        self.inner.count_keys()
    }

    /// One step of a walk over every key ([`proto::ScanKeys`]).
    pub fn scan_keys(&self, req: &proto::ScanKeys) -> Result<proto::KeysPage, ProcessorError> {
        self.inner.scan_keys(req)
    }

    /// Stops the merge threads (also done on drop).
    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        for t in self.threads.lock().expect("threads lock").drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Handler {
    inner: Arc<Inner>,
    /// The memory node's named clients.
    clients: Arc<Clients>,
}

impl RpcHandler for Handler {
    fn handle(
        &self,
        caller: Option<ClientId>,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), RpcError> {
        let fail = |e: ProcessorError| {
            if e.is_out_of_space() {
                RpcError::OutOfSpace(e.to_string())
            } else {
                RpcError::Failed(e.to_string())
            }
        };
        match method {
            proto::OPEN_LOG => {
                let req: proto::OpenLog = dinomo_fabric::decode(request)?;
                if req.thread == MIGRATION_THREAD || req.thread == CLEANER_THREAD {
                    return Err(RpcError::Failed(format!(
                        "thread {} names one of the memory node's own logs (migration {MIGRATION_THREAD}, \
                         relocation {CLEANER_THREAD}); no KV node may claim it",
                        req.thread
                    )));
                }
                let claim = Claim::KvNode {
                    caller: caller.map(|c| (c, &*self.clients)),
                };
                dinomo_fabric::encode(&self.inner.open_log(&req, claim).map_err(fail)?, response)
            }
            proto::NEXT_SEGMENT => {
                let req: proto::NextSegment = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(
                    &self.inner.next_segment(&req, true).map_err(fail)?,
                    response,
                )
            }
            proto::MERGE_ALL => {
                let req: proto::MergeAll = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(&self.inner.merge_all(&req).map_err(fail)?, response)
            }
            proto::MERGE_SEALED => {
                let req: proto::MergeSealed = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(&self.inner.merge_sealed(&req).map_err(fail)?, response)
            }
            proto::STATS => dinomo_fabric::encode(&self.inner.stats(), response),
            proto::COUNT_KEYS => dinomo_fabric::encode(
                &proto::KeyCount {
                    keys: self.inner.count_keys().map_err(fail)?,
                },
                response,
            ),
            proto::SCAN_KEYS => {
                let req: proto::ScanKeys = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(&self.inner.scan_keys(&req).map_err(fail)?, response)
            }
            proto::TAKE_OVER_NODE => {
                let req: proto::TakeOverNode = dinomo_fabric::decode(request)?;
                let taken = self.inner.as_manager("TAKE_OVER_NODE", req.epoch, || {
                    self.inner.take_over_node(&req, &self.clients)
                });
                dinomo_fabric::encode(&taken.map_err(fail)?, response)
            }
            proto::RESERVE_CELL => {
                let req: proto::ReserveCell = dinomo_fabric::decode(request)?;
                let reserved = self
                    .inner
                    .as_manager("RESERVE_CELL", req.epoch, || self.inner.reserve_cell(&req));
                dinomo_fabric::encode(&reserved.map_err(fail)?, response)
            }
            proto::FENCE => {
                let req: proto::Fence = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(&self.inner.fence(req.epoch), response)
            }
            proto::ACTIVATE_CELL => {
                let req: proto::ShareKey = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(&self.inner.activate_cell(&req).map_err(fail)?, response)
            }
            proto::DEACTIVATE_CELL => {
                let req: proto::ShareKey = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(&self.inner.deactivate_cell(&req).map_err(fail)?, response)
            }
            proto::SYNC_CELLS => {
                let req: proto::SyncCells = dinomo_fabric::decode(request)?;
                self.inner
                    .as_manager("SYNC_CELLS", req.epoch, || self.inner.sync_cells(&req))
                    .map_err(fail)?;
                dinomo_fabric::encode(&(), response)
            }
            proto::REBALANCE => {
                let req: proto::Rebalance = dinomo_fabric::decode(request)?;
                let moved = self
                    .inner
                    .as_manager("REBALANCE", req.ring.epoch(), || self.inner.rebalance(&req));
                dinomo_fabric::encode(&moved.map_err(fail)?, response)
            }
            proto::LAYOUT => dinomo_fabric::encode(
                &proto::Layout {
                    partitioning: self.inner.indexes.partitioning(),
                },
                response,
            ),
            proto::RELEASE_CELL => {
                let req: proto::ReleaseCell = dinomo_fabric::decode(request)?;
                self.inner
                    .as_manager("RELEASE_CELL", req.epoch, || self.inner.release_cell(&req))
                    .map_err(fail)?;
                dinomo_fabric::encode(&(), response)
            }
            other => Err(RpcError::UnknownMethod(other)),
        }
    }
}

/// Who claims a log.
#[derive(Clone, Copy)]
enum Claim<'a> {
    /// A KV-node thread, over a connection that named its client (and the memory node's clients) or not.
    KvNode {
        caller: Option<(ClientId, &'a Clients)>,
    },
    /// The memory node itself (its migration and relocation logs).
    MemoryNode,
}

impl Claim<'_> {
    /// Whether a KV node claims (not the memory node itself).
    fn by_kv_node(&self) -> bool {
        matches!(self, Claim::KvNode { .. })
    }

    /// The incarnation of the claiming process, when its connection named it.
    fn incarnation(&self) -> Option<u64> {
        match self {
            Claim::KvNode {
                caller: Some((id, _)),
            } => Some(id.incarnation),
            _ => None,
        }
    }

    /// Refuses the claim of a client the memory node revoked: the cluster took its node over, so the logs are not
    /// its any more.
    fn check_not_revoked(&self) -> Result<(), ProcessorError> {
        match self {
            Claim::KvNode {
                caller: Some((id, clients)),
            } if clients.is_revoked(*id) => Err(ProcessorError::Revoked(*id)),
            _ => Ok(()),
        }
    }
}

/// Refuses a KV node id beyond [`MAX_NODE_ID`]: a log's owner word would name another node's logs with it.
fn check_node_id(node_id: u32) -> Result<(), ProcessorError> {
    if node_id > MAX_NODE_ID {
        return Err(ProcessorError::Config(format!(
            "node id {node_id} is out of range: KV node ids go up to {MAX_NODE_ID}"
        )));
    }
    Ok(())
}

/// Whether `owner` names a relocation log ([`CLEANER_THREAD`]).
fn is_relocation(owner: u64) -> bool {
    owner as u32 == CLEANER_THREAD
}

/// Refuses a call on `log_id` that carries another session than its writer's (`meta`, locked for the change the call
/// makes, so that a take-over cannot slip in between).
fn check_session(log_id: u32, meta: &LogMeta, session: u64) -> Result<(), ProcessorError> {
    if meta.session == session {
        Ok(())
    } else {
        Err(ProcessorError::BadLog {
            log_id,
            why: "the log was claimed by a newer session".into(),
        })
    }
}

/// The pool's extents allocated as log segments: offset → length.
pub(crate) fn log_segment_extents(pool: &Pool) -> HashMap<u64, u64> {
    pool.allocated()
        .into_iter()
        .filter(|e| e.tag == tags::LOG_SEGMENT)
        .map(|e| (e.offset, e.len))
        .collect()
}

/// Reads the header of the log segment a chain names at `offset`, which must be one of the allocated log segment
/// `extents` (offset → length) and as long as its header says: the data region is writable by every client, so a
/// chain word or header pointing elsewhere is corruption, not a segment.
fn read_segment_header(
    pool: &Pool,
    offset: u64,
    extents: &HashMap<u64, u64>,
) -> Result<SegmentHeader, ProcessorError> {
    let not_a_segment = |why: &str| {
        ProcessorError::Corrupt(format!(
            "{offset:#x} is not an allocated log segment: {why}"
        ))
    };
    let len = *extents
        .get(&offset)
        .ok_or_else(|| not_a_segment("no extent starts there"))?;
    let mut b = [0u8; SEGMENT_HEADER_LEN];
    pool.read(offset, &mut b)?;
    let h = SegmentHeader::decode(&b).ok_or_else(|| not_a_segment("no valid header"))?;
    if h.capacity != len {
        return Err(not_a_segment(&format!(
            "its header says {} bytes, the extent holds {len}",
            h.capacity
        )));
    }
    Ok(h)
}

/// The segment a damaged link word of log `log_id`'s segment starting at `first_seq` named: among the allocated
/// log segments `extents` that no chain reached so far (`chained`), the newest of the log older than it, whose
/// valid entries must end just before `first_seq` (a log's sequence numbers only grow, so one segment ends there);
/// 0 when the log has no older segment left. `Err` says why neither can be told, when a guess could free a segment
/// the index points into: the newest older segment ends elsewhere, or an extent that no chain reached carries a
/// segment's magic and a damaged header (it may be the one). Extents without a segment's magic (the delete reserve,
/// never formatted) are no candidates.
pub(crate) fn find_older_segment(
    pool: &Pool,
    extents: &HashMap<u64, u64>,
    chained: impl Fn(u64) -> bool,
    log_id: u32,
    first_seq: u64,
) -> Result<u64, String> {
    let mut newest: Option<(u64, SegmentHeader)> = None;
    let mut offsets: Vec<u64> = extents.keys().copied().filter(|&o| !chained(o)).collect();
    offsets.sort_unstable();
    for offset in offsets {
        match read_segment_header(pool, offset, extents) {
            Ok(h) if h.log_id == log_id && h.first_seq < first_seq => {
                if newest
                    .as_ref()
                    .is_none_or(|(_, n)| h.first_seq > n.first_seq)
                {
                    newest = Some((offset, h));
                }
            }
            Ok(_) => {}
            Err(_) => {
                let mut magic = [0u8; 8];
                if pool.read(offset, &mut magic).is_ok()
                    && SegmentFormat::of_magic(&magic).is_some()
                {
                    return Err(format!(
                        "the segment at {offset:#x}, which no chain reaches, has a damaged header and may be the older one"
                    ));
                }
            }
        }
    }
    let Some((offset, h)) = newest else {
        return Ok(0);
    };
    let len = match h.sealed_len {
        Ok(len) if len > 0 => len,
        _ => h.data_capacity(),
    };
    let mut data = vec![0u8; len as usize];
    pool.read(offset + SEGMENT_HEADER_LEN as u64, &mut data)
        .map_err(|e| format!("the segment at {offset:#x} cannot be read: {e}"))?;
    let mut last = None;
    segment::scan_through(&data, log_id, h.first_seq, |_, e| last = Some(e.header.seq));
    match last.and_then(|seq| seq.checked_add(1)) {
        Some(next) if next == first_seq => Ok(offset),
        _ => Err(format!(
            "the log's newest older segment outside its chain ({offset:#x}) does not end where this one begins"
        )),
    }
}

/// Writes `value` to the in-place header `field` of the segment at `offset` (of `format`) with one aligned 8-byte
/// store, so a crash leaves the old word or the new one.
fn write_in_place(
    pool: &Pool,
    offset: u64,
    format: SegmentFormat,
    field: InPlace,
    value: u64,
) -> Result<(), ProcessorError> {
    let word = format.word(field, value).ok_or_else(|| {
        ProcessorError::Corrupt(format!(
            "{value:#x} does not fit the {field:?} field of the segment at {offset:#x}"
        ))
    })?;
    let at = offset + field.offset();
    pool.atomic_u64(at)?.store(word, Ordering::Release);
    pool.persist(at, 8);
    Ok(())
}

/// True when the entry `r` in the pool carries `key`. `scratch` is reused between calls.
fn entry_has_key(pool: &Pool, r: EntryRef, key: &[u8], scratch: &mut Vec<u8>) -> bool {
    let mut h = [0u8; ENTRY_HEADER_LEN];
    if pool.read(r.offset(), &mut h).is_err() {
        return false;
    }
    let Ok(header) = EntryHeader::parse(&h) else {
        return false;
    };
    if header.key_len as usize != key.len() {
        return false;
    }
    scratch.resize(key.len(), 0);
    pool.read(r.offset() + ENTRY_HEADER_LEN as u64, scratch)
        .is_ok()
        && scratch[..] == *key
}

/// Merges entry `r` of the shared key of cell `slot`: the cell is the key's only reference, and an owner CASes
/// the cell to an entry before the segment holding that entry can be sealed. So `r` is live exactly when the cell
/// points to it now; any other entry of the key is dead for good. Returns the entries that died.
/// A delete entry (owners delete by CASing the cell to 0, so there should be none) is already counted invalid.
fn shared_entry(
    cells: &mut CellTable,
    slot: u32,
    r: EntryRef,
    is_delete: bool,
) -> Result<Vec<EntryRef>, ProcessorError> {
    let current = cells.word(slot)?.load(Ordering::Acquire);
    let cell = cells.get_mut(slot).expect("active cell");
    let mut dead = Vec::new();
    if let Some(prev) = cell.live
        && prev.raw() != current
    {
        dead.push(prev);
        cell.live = None;
    }
    if current == r.raw() && !is_delete {
        cell.live = Some(r);
    } else if !is_delete {
        dead.push(r);
    }
    Ok(dead)
}

/// Buffers a merge reuses: a segment's entries, and a key read back from the pool for comparison.
#[derive(Default)]
struct Scratch {
    data: Vec<u8>,
    key: Vec<u8>,
}

/// The merged segment that holds pool offset `at`, with its offset.
fn segment_holding(stats: &mut BTreeMap<u64, SegStat>, at: u64) -> Option<(u64, &mut SegStat)> {
    let (&offset, st) = stats.range_mut(..=at).next_back()?;
    (at < st.end).then_some((offset, st))
}

/// What merging one segment did.
#[derive(Default)]
struct SegmentMerge {
    entries: u64,
    deletes: u64,
    last_seq: Option<u64>,
    superseded: Vec<EntryRef>,
}

impl Inner {
    /// Every log, taken out of the map so that its lock is not held while they are worked on.
    fn all_logs(&self) -> Vec<Arc<LogState>> {
        self.logs
            .read()
            .expect("logs lock")
            .values()
            .cloned()
            .collect()
    }

    fn next_session(&self) -> u64 {
        self.session_counter.fetch_add(1, Ordering::Relaxed)
    }

    fn log(&self, log_id: u32, session: u64) -> Result<Arc<LogState>, ProcessorError> {
        let log = self
            .logs
            .read()
            .expect("logs lock")
            .get(&log_id)
            .cloned()
            .ok_or_else(|| ProcessorError::BadLog {
                log_id,
                why: "no such log".into(),
            })?;
        check_session(log_id, &log.meta.lock().expect("log lock"), session)?;
        Ok(log)
    }

    /// Start-up: loads every log's chain, merges what is committed but unmerged (sealing open heads at their last
    /// valid entry), rebuilds invalidation counters from the index, recycles dead segments, frees orphans.
    fn recover(&self) -> Result<(), ProcessorError> {
        let mut chained = HashSet::new();
        let mut logs = HashMap::new();
        // A chain may only link whole segments this processor allocated.
        let segment_extents = log_segment_extents(&self.pool);
        for log_id in 0..self.dir.capacity() {
            let owner = self.dir.owner(log_id);
            if owner == 0 {
                continue;
            }
            let mut segments = Vec::new();
            let mut at = self.dir.head(log_id);
            while at != 0 {
                if !chained.insert(at) {
                    return Err(ProcessorError::Corrupt(format!(
                        "log {log_id}: segment chain loops at {at:#x}"
                    )));
                }
                let h = read_segment_header(&self.pool, at, &segment_extents)?;
                if h.log_id != log_id {
                    return Err(ProcessorError::Corrupt(format!(
                        "log {log_id}: segment at {at:#x} belongs to log {}",
                        h.log_id
                    )));
                }
                let (sealed_len, resealed) = match h.sealed_len {
                    Ok(len) => ((len != 0).then_some(len), false),
                    // Taken as open: the take-over below scans it to its last valid entry and seals it there,
                    // which is where its writer sealed it (entries past a seal were never written in this use
                    // of the segment, and leftovers of an earlier use are never taken).
                    Err(damaged) => {
                        warn!(
                            log = log_id,
                            segment = at,
                            %damaged,
                            "a segment's sealed length is damaged; it is scanned and sealed again"
                        );
                        self.resealed_segments.fetch_add(1, Ordering::Relaxed);
                        (None, true)
                    }
                };
                segments.push(SegInfo {
                    offset: at,
                    first_seq: h.first_seq,
                    capacity: h.capacity,
                    format: h.format,
                    sealed_len,
                    resealed,
                    merged: false,
                });
                at = match h.older {
                    Ok(older) => older,
                    Err(damaged) => {
                        self.relink_older(log_id, at, &h, damaged, &segment_extents, &chained)?
                    }
                };
            }
            segments.reverse();
            let merged_seq = self.dir.merged_seq(log_id);
            let index = self.indexes.for_node(&self.pool, owner_node(owner))?;
            logs.insert(
                log_id,
                // Its writer, if any, claims it again.
                Arc::new(LogState::new(
                    log_id,
                    owner,
                    index,
                    self.next_session(),
                    false,
                    segments,
                    merged_seq,
                )),
            );
        }
        // Extents tagged as segments that no chain reaches were being linked or unlinked at a crash.
        for ext in self.pool.allocated() {
            if ext.tag == tags::LOG_SEGMENT && !chained.contains(&ext.offset) {
                debug!(offset = ext.offset, "freeing an orphaned log segment");
                self.pool.free(ext.offset)?;
            }
        }
        *self.logs.write().expect("logs lock") = logs.clone();

        let before = self.merged_entries.load(Ordering::Relaxed);
        let mut scratch = Scratch::default();
        for log in logs.values() {
            match self.take_over(log, &mut scratch) {
                // Acknowledged entries the index has no room for stay in their segments; the merge threads retry
                // them until it has.
                Err(e) if e.is_out_of_space() => {
                    warn!(log = log.id, error = %e, "the index has no room for a log's entries yet");
                    let _ = self.queue.send(log.id);
                }
                other => other?,
            }
        }
        let recovered = self.merged_entries.load(Ordering::Relaxed) - before;
        self.recovered_entries.store(recovered, Ordering::Relaxed);

        // Every segment's entry count, then its live entries from the index: the rest are invalid.
        let mut stats = BTreeMap::new();
        for log in logs.values() {
            let meta = log.meta.lock().expect("log lock");
            // A segment not merged yet gets its counters when it is.
            for s in meta.segments.iter().filter(|s| s.merged) {
                let len = s.sealed_len.unwrap_or(0);
                self.read_entries(s.offset, len, &mut scratch.data)?;
                let mut entries = 0u64;
                segment::scan_through(&scratch.data, log.id, s.first_seq, |_, _| entries += 1);
                stats.insert(
                    s.offset,
                    SegStat {
                        log_id: log.id,
                        end: s.offset + s.capacity,
                        entries,
                        invalid: entries,
                    },
                );
            }
        }
        let mut live: Vec<EntryRef> = Vec::new();
        for (_, index) in self.indexes.all() {
            index.for_each(|_, r| live.push(r));
        }
        live.extend(
            self.cells
                .lock()
                .expect("cells lock")
                .cells()
                .filter(|c| c.state == CellState::Active)
                .filter_map(|c| c.live),
        );
        for r in live {
            if let Some((_, st)) = segment_holding(&mut stats, r.offset()) {
                st.invalid = st.invalid.saturating_sub(1);
            }
        }
        let dead: Vec<u64> = stats
            .iter()
            .filter(|(_, s)| s.entries == s.invalid)
            .map(|(&o, _)| o)
            .collect();
        *self.stats_by_segment.lock().expect("segment stats lock") = stats;
        self.recovering.store(false, Ordering::Release);
        self.recycle(&dead)?;
        // Logs left with nothing in them (their node emptied them and left, or stopped): a node that comes back
        // claims a fresh one.
        for log in logs.values() {
            self.retire_if_unused(log.id);
        }
        self.partitions_to_check.store(true, Ordering::Release);
        self.free_departed_partitions();
        info!(
            logs = logs.len(),
            recovered_entries = recovered,
            index_entries = self.indexes.all().iter().map(|(_, i)| i.len()).sum::<u64>(),
            "memory-node processor recovered"
        );
        Ok(())
    }

    /// The older segment of `log_id`'s segment at `at` (header `h`), whose link word is `damaged`: found again
    /// ([`find_older_segment`], among the log segments `extents` outside the chains loaded so far, `chained`) and
    /// written back. When it cannot be told, the start is refused.
    fn relink_older(
        &self,
        log_id: u32,
        at: u64,
        h: &SegmentHeader,
        damaged: DamagedField,
        extents: &HashMap<u64, u64>,
        chained: &HashSet<u64>,
    ) -> Result<u64, ProcessorError> {
        let older = find_older_segment(
            &self.pool,
            extents,
            |o| chained.contains(&o),
            log_id,
            h.first_seq,
        )
        .map_err(|why| {
            ProcessorError::Corrupt(format!(
                "log {log_id}: segment at {at:#x}: its link to the older segment is damaged ({damaged}), and {why}; \
                 the older segments of the log are out of reach"
            ))
        })?;
        write_in_place(&self.pool, at, h.format, InPlace::Older, older)?;
        warn!(
            log = log_id,
            segment = at,
            older,
            %damaged,
            "a segment's link to the older segment is damaged; linked again to the log's segment that ends where it \
             begins"
        );
        self.relinked_segments.fetch_add(1, Ordering::Relaxed);
        Ok(older)
    }

    /// Takes over a log whose writer is gone: seals its open segments at their last valid entry (nothing after
    /// it was acknowledged) and merges all of it.
    fn take_over(&self, log: &LogState, scratch: &mut Scratch) -> Result<(), ProcessorError> {
        {
            let mut meta = log.meta.lock().expect("log lock");
            let mut last_seq = meta.last_seq;
            for s in meta.segments.iter_mut().filter(|s| s.sealed_len.is_none()) {
                self.read_entries(
                    s.offset,
                    s.capacity - SEGMENT_HEADER_LEN as u64,
                    &mut scratch.data,
                )?;
                // Past damage too: an entry after it was written, so may have been acknowledged.
                let found = segment::scan_through(&scratch.data, log.id, s.first_seq, |_, e| {
                    last_seq = last_seq.max(e.header.seq)
                });
                let valid = found.end;
                // Holes before the last valid entry of a segment its writer left open: a write the crash cut short
                // (its bytes land in any order; it was never acknowledged) or damage. They stay in the sealed
                // segment, so the count is kept with it: a check then tells them from damage found later. (Holes in
                // a segment resealed over a damaged length word are damage, and stay reported.)
                let stepped_over = found.gap_bytes();
                if stepped_over > 0 && !s.resealed {
                    warn!(
                        log = log.id,
                        segment = s.offset,
                        bytes = stepped_over,
                        "an open segment holds stretches without a valid entry before its last one (a write the \
                         crash cut short, or damage); they are stepped over"
                    );
                    write_in_place(
                        &self.pool,
                        s.offset,
                        s.format,
                        InPlace::SteppedOver,
                        stepped_over,
                    )?;
                }
                if valid > 0 {
                    write_in_place(
                        &self.pool,
                        s.offset,
                        s.format,
                        InPlace::SealedLen,
                        valid as u64,
                    )?;
                    if let ScanEnd::Stopped { reason, .. } = found.tail {
                        debug!(
                            log = log.id,
                            segment = s.offset,
                            ?reason,
                            "open segment ends here"
                        );
                    }
                }
                s.sealed_len = Some(valid as u64);
            }
            meta.last_seq = last_seq;
        }
        self.merge_log(log, scratch)
    }

    fn read_entries(
        &self,
        segment: u64,
        len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), ProcessorError> {
        out.resize(len as usize, 0);
        self.pool.read(segment + SEGMENT_HEADER_LEN as u64, out)?;
        Ok(())
    }

    /// Claims the log of `req`'s node and thread, creating it the first time. A KV node's claim (`Claim::KvNode`)
    /// that finds the directory full has a log without a writer emptied for it; the memory node's own claims (its
    /// migration and relocation logs) may not, as they hold the locks that takes.
    fn open_log(
        &self,
        req: &proto::OpenLog,
        claim: Claim<'_>,
    ) -> Result<proto::LogOpened, ProcessorError> {
        let owner = owner_word(req.node_id, req.thread);
        let by_kv_node = claim.by_kv_node();
        if by_kv_node {
            check_node_id(req.node_id)?;
            claim.check_not_revoked()?;
            // The node is back: its partition, if it has one, stays.
            self.indexes.set_departed(req.node_id, false);
        }
        // The log is found and given its new writer under the logs lock, which a retirement holds too: a log is
        // either retired before (and a new one claimed) or has a writer, and stays.
        let existing = {
            let logs = self.logs.read().expect("logs lock");
            let found = logs
                .values()
                .find(|l| l.meta.lock().expect("log lock").owner == owner)
                .cloned();
            if let Some(log) = &found {
                let mut meta = log.meta.lock().expect("log lock");
                // Again under the log's lock, which a take-over takes after it revoked the node: a claim either
                // comes first (and the take-over fences it) or sees the revocation.
                claim.check_not_revoked()?;
                meta.writer_incarnation = claim.incarnation();
                meta.session = self.next_session();
                meta.writer = true;
            }
            found
        };
        let log = match existing {
            Some(log) => {
                // The previous writer of this log is gone: take over what it wrote and merge it all, or what the
                // index has room for (the rest goes back to the caller, and is merged once there is room).
                match self.take_over(&log, &mut Scratch::default()) {
                    Err(e) if e.is_out_of_space() => {
                        warn!(log = log.id, error = %e, "a log is claimed with segments the index has no room for yet");
                        let _ = self.queue.send(log.id);
                    }
                    other => other?,
                }
                log
            }
            // The memory node's own claims hold the cleaner's lock, which emptying takes: they neither wait here
            // nor empty a log.
            None if !by_kv_node => self.claim_log(owner, claim)?,
            None => {
                let _one_claim = self.new_log_claims.lock().expect("claims lock");
                match self.claim_log(owner, claim) {
                    Err(ProcessorError::DirectoryFull { capacity, why }) => {
                        // Only a relocation log's claim (made while emptying, for the descriptor KV nodes' claims
                        // leave free) takes a descriptor without this lock.
                        self.empty_a_log().map_err(|not_emptied| {
                            ProcessorError::DirectoryFull {
                                capacity,
                                why: format!("{why}, and {not_emptied}"),
                            }
                        })?;
                        self.claim_log(owner, claim)?
                    }
                    other => other?,
                }
            }
        };
        let meta = log.meta.lock().expect("log lock");
        Ok(proto::LogOpened {
            log_id: log.id,
            session: meta.session,
            next_seq: meta
                .last_seq
                .max(meta.merged_seq)
                .checked_add(1)
                .ok_or_else(|| ProcessorError::BadLog {
                    log_id: log.id,
                    why: "its sequence numbers are used up".into(),
                })?,
            merged_seq_offset: self.dir.merged_seq_offset(log.id),
            hash_mode: self.dir.hash_mode().to_word(),
            segment_size: self.dir.segment_size(),
            index_header: log.index.header_offset(),
            unmerged: meta
                .segments
                .iter()
                .filter(|s| !s.merged)
                .filter_map(|s| {
                    s.sealed_len.map(|len| proto::UnmergedSegment {
                        offset: s.offset,
                        first_seq: s.first_seq,
                        len,
                    })
                })
                .collect(),
        })
    }

    /// Claims a directory descriptor for a new log of `owner`, which merges into its node's index. A KV node's
    /// claim leaves the last free descriptor to the memory node's own relocation log of a shared index while that
    /// log does not exist: emptying a log for a claim that finds the directory full copies into it.
    fn claim_log(&self, owner: u64, claim: Claim<'_>) -> Result<Arc<LogState>, ProcessorError> {
        let (index, mut logs) = loop {
            let index = self.indexes.for_node(&self.pool, owner_node(owner))?;
            let logs = self.logs.write().expect("logs lock");
            // A departed node's partition freed since the lookup (the free holds this lock) takes no log: the next
            // lookup makes the node a new one.
            if self.indexes.is_live(&index) {
                break (index, logs);
            }
        };
        let relocations = owner_word(MEMORY_NODE_ID, CLEANER_THREAD);
        let keep_one = claim.by_kv_node()
            && self.indexes.partitioning() == Partitioning::Shared
            && !logs
                .values()
                .any(|l| l.meta.lock().expect("log lock").owner == relocations);
        if keep_one && self.dir.free_descriptors(2) < 2 {
            return Err(ProcessorError::DirectoryFull {
                capacity: self.dir.capacity(),
                why: "the last free descriptor is kept for the memory node's relocation log".into(),
            });
        }
        // A reused descriptor numbers its entries after the last one it ever named.
        let (id, seq) = self.dir.claim(owner)?;
        let log = Arc::new(LogState::new(
            id,
            owner,
            index,
            self.next_session(),
            true,
            Vec::new(),
            seq,
        ));
        // Given its writer as a claimed log is (`open_log`): with its session, and whose claim it is.
        log.meta.lock().expect("log lock").writer_incarnation = claim.incarnation();
        logs.insert(id, log.clone());
        Ok(log)
    }

    /// Seals the head of `meta` at `sealed_len` (when it is open).
    fn seal_head(
        &self,
        log_id: u32,
        meta: &mut LogMeta,
        sealed_len: Option<u64>,
    ) -> Result<(), ProcessorError> {
        let Some(head) = meta.segments.last_mut() else {
            return Ok(());
        };
        if head.sealed_len.is_some() {
            return Ok(());
        }
        let cap = head.capacity - SEGMENT_HEADER_LEN as u64;
        let len = match sealed_len {
            Some(len) if len <= cap => len,
            Some(len) => {
                return Err(ProcessorError::BadLog {
                    log_id,
                    why: format!("seal at {len} bytes exceeds the segment's {cap}"),
                });
            }
            None => 0,
        };
        write_in_place(
            &self.pool,
            head.offset,
            head.format,
            InPlace::SealedLen,
            len,
        )?;
        head.sealed_len = Some(len);
        Ok(())
    }

    /// Grants `req`'s log a new segment. Out of space, it first frees the index tables replaced within their grace
    /// period, then merges every log's sealed segments (whose superseded entries may free whole segments), asking
    /// the pool once more after each; then, when `may_clean`, has the cleaner make room and asks again, and, for an
    /// index that cannot grow although the pool has room for it in pieces, empty a run for the table. A
    /// rebalance's own grants may not clean: they hold the rebalance lock, which the cleaner takes.
    fn next_segment(
        &self,
        req: &proto::NextSegment,
        may_clean: bool,
    ) -> Result<proto::SegmentGranted, ProcessorError> {
        let out_of_space =
            |g: &Result<_, ProcessorError>| matches!(g, Err(e) if e.is_out_of_space());
        let mut granted = self.next_segment_once(req);
        if out_of_space(&granted) && self.reclaim_retired_tables() {
            granted = self.next_segment_once(req);
        }
        // Asked again whatever the merging and the cleaning did themselves: each first waits for one under way
        // (a merge thread's, the cleaner thread's), whose recycling may have freed the room.
        if out_of_space(&granted) {
            self.merge_backlog();
            granted = self.next_segment_once(req);
        }
        if may_clean && out_of_space(&granted) {
            self.clean_for_room();
            granted = self.next_segment_once(req);
        }
        // An index that cannot grow for want of one contiguous run refuses writes until it grows. The run an
        // attempt picks can change under it (a grant takes one of its free segments), so a second one is made
        // before the write is refused.
        if may_clean
            && out_of_space(&granted)
            && let Ok(log) = self.log(req.log_id, req.session)
        {
            // (Once nothing blocks the growth, an attempt returns at once.)
            if (0..2).any(|_| self.make_room_for_table(&log.index, true)) {
                granted = self.next_segment_once(req);
            }
        }
        granted
    }

    /// Frees every replaced index table now, grace or not (see [`Index::reclaim_retired_now`]); whether there
    /// were any.
    fn reclaim_retired_tables(&self) -> bool {
        let mut freed = 0;
        for (_, index) in self.indexes.all() {
            freed += index.reclaim_retired_now();
        }
        if freed > 0 {
            debug!(
                tables = freed,
                "freed replaced index tables early to make room"
            );
        }
        freed > 0
    }

    /// Merges the sealed segments of every log now, after any merge under way (which recycles what it emptied
    /// before it lets go of the log).
    fn merge_backlog(&self) {
        let mut scratch = Scratch::default();
        for log in self.all_logs() {
            let pending = {
                let _after_merge_under_way = log.merge_lock.lock().expect("merge lock");
                log.meta
                    .lock()
                    .expect("log lock")
                    .segments
                    .iter()
                    .any(SegInfo::awaits_merge)
            };
            if pending && let Err(e) = self.merge_log(&log, &mut scratch) {
                warn!(log = log.id, error = %e, "merging a log to make room failed");
            }
        }
    }

    fn next_segment_once(
        &self,
        req: &proto::NextSegment,
    ) -> Result<proto::SegmentGranted, ProcessorError> {
        let log = self.log(req.log_id, req.session)?;
        // An index that could not grow keeps its last free slots for the writes already logged: no room for more
        // puts until it grows (deletes go on, and free slots).
        if !req.deletes_only {
            log.index.check_room()?;
        }
        let mut meta = log.meta.lock().expect("log lock");
        check_session(req.log_id, &meta, req.session)?;
        // Sequence numbers must grow, or recovery could not tell new entries from old ones.
        let known = meta.last_seq.max(meta.merged_seq);
        if req.first_seq <= known || req.first_seq == u64::MAX {
            return Err(ProcessorError::BadLog {
                log_id: req.log_id,
                why: format!("first_seq {} does not follow {known}", req.first_seq),
            });
        }
        // A refused call changes nothing: the new segment is allocated and formatted before the head is sealed, so
        // a caller told "out of space" keeps writing its current segment (smaller entries may still fit there).
        self.top_up_delete_reserve();
        let (ext, reserved) = match self
            .pool
            .alloc_bytes(self.dir.segment_size(), tags::LOG_SEGMENT)
        {
            Ok(ext) => (ext, false),
            Err(e @ PoolError::OutOfSpace { .. }) if req.deletes_only => {
                match self.delete_reserve.lock().expect("reserve lock").pop() {
                    Some(ext) => (ext, true),
                    None => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let older = meta.segments.last().map_or(0, |s| s.offset);
        let mut format_then_seal = || -> Result<(), ProcessorError> {
            let header = SegmentHeader::open(req.log_id, req.first_seq, older, ext.len)
                .encode()
                .ok_or_else(|| {
                    ProcessorError::Corrupt(format!(
                        "the segment at {:#x} lies beyond what a segment header can link",
                        ext.offset
                    ))
                })?;
            self.pool.write(ext.offset, &header)?;
            // A zero header where the first entry goes: a reused extent must not look like it holds entries.
            self.pool.write(
                ext.offset + SEGMENT_HEADER_LEN as u64,
                &[0u8; ENTRY_HEADER_LEN],
            )?;
            self.seal_head(req.log_id, &mut meta, req.sealed_len)
        };
        if let Err(e) = format_then_seal() {
            if reserved {
                self.delete_reserve.lock().expect("reserve lock").push(ext);
            } else if let Err(free) = self.pool.free(ext.offset) {
                warn!(segment = ext.offset, %free, "could not free a refused log segment");
            }
            return Err(e);
        }
        if reserved {
            self.delete_reserve_grants.fetch_add(1, Ordering::Relaxed);
            debug!(
                log = req.log_id,
                segment = ext.offset,
                "granted a log segment from the delete reserve"
            );
        }
        self.pool
            .persist(ext.offset, (SEGMENT_HEADER_LEN + ENTRY_HEADER_LEN) as u64);
        meta.last_seq = req.first_seq - 1;
        self.dir.set_head(req.log_id, ext.offset);
        meta.segments.push(SegInfo {
            offset: ext.offset,
            first_seq: req.first_seq,
            capacity: ext.len,
            format: SegmentFormat::Checked,
            sealed_len: None,
            resealed: false,
            // A relocation log's entries are never merged: the cleaner moves the slots that name them.
            merged: log.relocation,
        });
        let merged_seq = meta.merged_seq;
        drop(meta);
        let _ = self.queue.send(req.log_id);
        Ok(proto::SegmentGranted {
            offset: ext.offset,
            capacity: ext.len,
            merged_seq,
            reserved,
        })
    }

    /// Runs the management call `call` of epoch `epoch` while no other management call runs, unless a newer
    /// epoch was acted on already (the caller no longer leads: see [`proto::ManagerEpoch`]).
    fn as_manager<T>(
        &self,
        call: &'static str,
        epoch: u64,
        f: impl FnOnce() -> Result<T, ProcessorError>,
    ) -> Result<T, ProcessorError> {
        let _acting =
            self.enter_manager_epoch(call, epoch)
                .map_err(|newest| ProcessorError::StaleEpoch {
                    call,
                    offered: epoch,
                    newest,
                })?;
        f()
    }

    /// Takes the management epoch for a call of `epoch`: refused with the newest epoch when a newer one was acted
    /// on already, otherwise raised to `epoch` (and persisted) before the call acts; held until the call is done.
    fn enter_manager_epoch(
        &self,
        call: &'static str,
        epoch: u64,
    ) -> Result<std::sync::MutexGuard<'_, u64>, u64> {
        let mut newest = self.manager_epoch.lock().expect("manager epoch lock");
        if epoch < *newest {
            self.stale_manager_calls.fetch_add(1, Ordering::Relaxed);
            warn!(
                call,
                offered = epoch,
                newest = *newest,
                "a call of an older management epoch is refused"
            );
            return Err(*newest);
        }
        if epoch > *newest {
            self.dir.set_manager_epoch(epoch);
            *newest = epoch;
        }
        Ok(newest)
    }

    /// [`proto::FENCE`]: raises the newest management epoch to `epoch` unless it is newer already; the newest after.
    fn fence(&self, epoch: u64) -> proto::Fenced {
        let newest = match self.enter_manager_epoch("FENCE", epoch) {
            Ok(newest) => *newest,
            Err(newest) => newest,
        };
        proto::Fenced { newest }
    }

    fn take_over_node(
        &self,
        req: &proto::TakeOverNode,
        clients: &Clients,
    ) -> Result<proto::NodeTakenOver, ProcessorError> {
        check_node_id(req.node_id)?;
        // Before its logs are sealed: once this returns, none of the node's verbs lands in the pool any more, so
        // nothing is written past a seal or into a segment after it is recycled, and no claim of its takes a log
        // back.
        let revocation = clients.revoke_node(req.node_id, req.incarnation);
        // Kept before anything is sealed, so that a restart still refuses what this revoked. (A crash before this
        // leaves the take-over unanswered, and the management node asks for it again.) A pool without room for
        // the table does not hold the take-over up: the node's keys would stay unserved.
        if let Err(e) = self
            .revocations
            .lock()
            .expect("revocations lock")
            .record(&revocation.clients, clients.max_revoked())
        {
            warn!(
                node = req.node_id,
                error = %e,
                "the revocation is kept in memory only: a restart of the memory node forgets it"
            );
        }
        if !revocation.clients.is_empty() {
            info!(
                node = req.node_id,
                clients = revocation.clients.len(),
                connections = revocation.connections,
                "KV node revoked"
            );
        }
        let logs: Vec<Arc<LogState>> = self
            .logs
            .read()
            .expect("logs lock")
            .values()
            .filter(|l| {
                let owner = l.meta.lock().expect("log lock").owner;
                // The node's relocation log is the cleaner's, which goes on writing it.
                !l.relocation && owner >> 63 == 1 && owner_node(owner) == req.node_id
            })
            .cloned()
            .collect();
        // A take-over of an older incarnation than the one writing the node's logs comes late (its management node
        // stalled while the node restarted): the new incarnation merged what the old one wrote when it claimed the
        // logs, and sealing them now would lose what it acknowledged since.
        let held_by_newer = |meta: &LogMeta| {
            req.incarnation.is_some_and(|taken| {
                meta.writer && meta.writer_incarnation.is_some_and(|w| w != taken)
            })
        };
        if logs
            .iter()
            .any(|l| held_by_newer(&l.meta.lock().expect("log lock")))
        {
            info!(
                node = req.node_id,
                "a take-over of an older incarnation of a KV node whose logs a newer one writes; its logs are left \
                 to it"
            );
            return Ok(proto::NodeTakenOver {
                logs: 0,
                merged_entries: 0,
                revoked_connections: revocation.connections as u32,
            });
        }
        let mut scratch = Scratch::default();
        let mut merged_entries = 0;
        let mut skipped = 0;
        // The cleaner opens no relocation log for a departed node's partition, which the rebalance after its
        // departure empties; once its logs retire, the partition is freed.
        self.indexes.set_departed(req.node_id, true);
        self.close_relocation_writer(req.node_id)?;
        for log in &logs {
            // A new session fences the node's writer: its NEXT_SEGMENT and MERGE_ALL calls are refused from now on.
            let before = {
                let mut meta = log.meta.lock().expect("log lock");
                // Checked again under the lock: a newer incarnation may have claimed this log since.
                if held_by_newer(&meta) {
                    skipped += 1;
                    continue;
                }
                meta.session = self.next_session();
                meta.writer = false;
                meta.merged_seq
            };
            self.take_over(log, &mut scratch)?;
            // Sequence numbers are consecutive, so the merged sequence number counts the entries.
            merged_entries += log.meta.lock().expect("log lock").merged_seq - before;
            // A log the node had emptied goes now; the others once their entries are superseded or cleaned.
            self.retire_if_unused(log.id);
        }
        if skipped > 0 {
            // The node is back (as the claims that made this take-over late said): its partition stays.
            self.indexes.set_departed(req.node_id, false);
        }
        self.partitions_to_check.store(true, Ordering::Release);
        self.free_departed_partitions();
        Ok(proto::NodeTakenOver {
            logs: (logs.len() - skipped) as u32,
            merged_entries,
            revoked_connections: revocation.connections as u32,
        })
    }

    fn merge_all(&self, req: &proto::MergeAll) -> Result<proto::Merged, ProcessorError> {
        let log = self.log(req.log_id, req.session)?;
        {
            let mut meta = log.meta.lock().expect("log lock");
            check_session(req.log_id, &meta, req.session)?;
            self.seal_head(req.log_id, &mut meta, req.sealed_len)?;
        }
        self.merge_now(&log)
    }

    fn merge_sealed(&self, req: &proto::MergeSealed) -> Result<proto::Merged, ProcessorError> {
        let log = self.log(req.log_id, req.session)?;
        self.merge_now(&log)
    }

    /// Merges `log`'s sealed segments on the caller's thread; the reply to [`proto::MergeAll`] and
    /// [`proto::MergeSealed`].
    fn merge_now(&self, log: &LogState) -> Result<proto::Merged, ProcessorError> {
        self.merge_log(log, &mut Scratch::default())?;
        Ok(proto::Merged {
            merged_seq: log.meta.lock().expect("log lock").merged_seq,
        })
    }

    /// A merge thread: merges the logs named on `rx`. A log whose merge failed (the index had no room, say) is
    /// retried on its own, sooner at first, until it succeeds: its writer may be waiting for it and sends nothing
    /// meanwhile.
    fn merge_loop(&self, rx: Receiver<u32>) {
        const FIRST_RETRY: Duration = Duration::from_millis(20);
        const LAST_RETRY: Duration = Duration::from_secs(1);
        let mut scratch = Scratch::default();
        // Failed logs: when to try again, and the pause after that.
        let mut failed: HashMap<u32, (Instant, Duration)> = HashMap::new();
        while !self.stopping.load(Ordering::Acquire) {
            let mut due: Vec<u32> = Vec::new();
            let tick = if failed.is_empty() {
                Duration::from_millis(50)
            } else {
                FIRST_RETRY
            };
            match rx.recv_timeout(tick) {
                Ok(log_id) => due.push(log_id),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    for (_, index) in self.indexes.all() {
                        index.reclaim_retired();
                    }
                    self.free_departed_partitions();
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            }
            let now = Instant::now();
            for (&id, &(at, _)) in &failed {
                if at <= now && !due.contains(&id) {
                    due.push(id);
                }
            }
            for log_id in due {
                let Some(log) = self.logs.read().expect("logs lock").get(&log_id).cloned() else {
                    failed.remove(&log_id);
                    continue;
                };
                let merged = self.merge_log(&log, &mut scratch);
                // Growing here, off the writers' path, before the table is at its limit: a table that cannot
                // grow is then known while it has slots left for what is already logged (see `next_segment`).
                if let Err(e) = log.index.grow_early() {
                    let out_of_space = matches!(e, IndexError::OutOfSpace { .. });
                    if !(out_of_space && self.make_room_for_table(&log.index, false)) {
                        debug!(log = log_id, error = %e, "the index cannot grow yet");
                    }
                }
                match merged {
                    Ok(()) => {
                        if failed.remove(&log_id).is_some() {
                            info!(log = log_id, "merge succeeds again");
                        }
                    }
                    Err(e) => {
                        let pause = match failed.get(&log_id) {
                            Some(&(_, pause)) => (pause * 2).min(LAST_RETRY),
                            None => {
                                warn!(log = log_id, error = %e, "merge failed; retrying until it succeeds");
                                FIRST_RETRY
                            }
                        };
                        failed.insert(log_id, (Instant::now() + pause, pause));
                    }
                }
            }
        }
    }

    /// Merges every sealed, unmerged segment of `log`, oldest first.
    fn merge_log(&self, log: &LogState, scratch: &mut Scratch) -> Result<(), ProcessorError> {
        let _order = log.merge_lock.lock().expect("merge lock");
        if log.relocation {
            return self.settle_relocation_log(log, scratch);
        }
        loop {
            let next = {
                let meta = log.meta.lock().expect("log lock");
                meta.segments.iter().find(|s| s.awaits_merge()).map(|s| {
                    (
                        s.offset,
                        s.first_seq,
                        s.sealed_len.unwrap_or(0),
                        meta.merged_seq,
                        s.capacity,
                    )
                })
            };
            let Some((offset, first_seq, len, merged_seq, capacity)) = next else {
                return Ok(());
            };
            self.read_entries(offset, len, &mut scratch.data)?;
            let result = self.merge_segment(
                log,
                offset,
                &scratch.data,
                first_seq,
                merged_seq,
                &mut scratch.key,
            );
            let (m, failure) = match result {
                Ok(m) => (m, None),
                Err((m, e)) => (m, Some(e)),
            };
            // Invalidations are recorded even when the merge stopped early: the index already changed. While
            // recovering, counters are rebuilt from the index once everything is merged.
            let mut dead = if self.recovering.load(Ordering::Acquire) {
                Vec::new()
            } else {
                self.count_invalidations(log.id, offset, offset + capacity, &m, failure.is_none())
            };
            if let Some(e) = failure {
                return Err(e);
            }
            {
                let mut meta = log.meta.lock().expect("log lock");
                if let Some(seq) = m.last_seq {
                    self.dir.set_merged_seq(log.id, seq);
                    meta.merged_seq = seq;
                    meta.last_seq = meta.last_seq.max(seq);
                }
                if let Some(s) = meta.segments.iter_mut().find(|s| s.offset == offset) {
                    s.merged = true;
                }
            }
            dead.sort_unstable();
            dead.dedup();
            self.recycle(&dead)?;
        }
    }

    /// Records what merging the segment at `offset` (ending at `end`) did to the invalidation counters; returns the
    /// segments that became entirely invalid. `complete`: every entry of the segment was applied.
    fn count_invalidations(
        &self,
        log_id: u32,
        offset: u64,
        end: u64,
        m: &SegmentMerge,
        complete: bool,
    ) -> Vec<u64> {
        let mut stats = self.stats_by_segment.lock().expect("segment stats lock");
        let mut dead = Vec::new();
        if complete {
            let st = stats.entry(offset).or_insert(SegStat {
                log_id,
                end,
                entries: 0,
                invalid: 0,
            });
            st.entries = m.entries;
            st.invalid += m.deletes;
            if st.invalid >= st.entries {
                dead.push(offset);
            }
        }
        for old in &m.superseded {
            if let Some((o, st)) = segment_holding(&mut stats, old.offset()) {
                st.invalid += 1;
                if st.invalid >= st.entries {
                    dead.push(o);
                }
            }
        }
        dead
    }

    /// Applies the entries of one segment of `log` after `merged_seq` to the log's index.
    fn merge_segment(
        &self,
        log: &LogState,
        offset: u64,
        data: &[u8],
        first_seq: u64,
        merged_seq: u64,
        scratch: &mut Vec<u8>,
    ) -> Result<SegmentMerge, (SegmentMerge, ProcessorError)> {
        let (index, log_id) = (&*log.index, log.id);
        let mode = self.dir.hash_mode();
        let mut m = SegmentMerge::default();
        let mut error = None;
        let base = offset + SEGMENT_HEADER_LEN as u64;
        let mut cells = (self.shared_active.load(Ordering::Acquire) > 0)
            .then(|| self.cells.lock().expect("cells lock"));
        let counted = log.counted_seq.load(Ordering::Relaxed);
        // Entries applied to the index (or a cell) for the first time.
        let mut applied = 0u64;
        let found = segment::scan_through(data, log_id, first_seq, |at, e| {
            if error.is_some() {
                return;
            }
            m.entries += 1;
            if e.header.op == Op::Delete {
                m.deletes += 1;
            }
            if e.header.seq <= merged_seq {
                return;
            }
            // Segments start 8-byte aligned and entries are padded to 8 bytes; only a segment whose bytes were
            // overwritten (any client may WRITE the data region) or an entry longer than a reference can name gets
            // here without a reference.
            let Some(r) = EntryRef::new(base + at as u64, e.len() as u64) else {
                error = Some(ProcessorError::Corrupt(format!(
                    "log {log_id}: the entry at {:#x} ({} bytes) cannot be indexed",
                    base + at as u64,
                    e.len()
                )));
                return;
            };
            if let Some(cells) = cells.as_deref_mut()
                && let Some(slot) = cells
                    .by_key(e.key)
                    .filter(|c| c.state == CellState::Active)
                    .map(|c| c.slot)
            {
                match shared_entry(cells, slot, r, e.header.op == Op::Delete) {
                    Ok(dead) => {
                        m.superseded.extend(dead);
                        m.last_seq = Some(e.header.seq);
                        applied += u64::from(e.header.seq > counted);
                    }
                    // Not applied: the retry applies and counts it.
                    Err(err) => error = Some(err),
                }
                return;
            }
            let hash = mode.hash(e.key);
            let pool = &self.pool;
            let old = match e.header.op {
                Op::Put => {
                    match index.upsert(hash, r, |c| entry_has_key(pool, c, e.key, scratch)) {
                        Ok(old) => old,
                        Err(err) => {
                            error = Some(ProcessorError::Index(err));
                            return;
                        }
                    }
                }
                Op::Delete => index.remove(hash, |c| entry_has_key(pool, c, e.key, scratch)),
            };
            // Replaying an entry that is already in the index replaces it with itself: nothing is superseded.
            if let Some(old) = old
                && old != r
            {
                m.superseded.push(old);
            }
            m.last_seq = Some(e.header.seq);
            applied += u64::from(e.header.seq > counted);
        });
        self.merged_entries.fetch_add(applied, Ordering::Relaxed);
        if let Some(seq) = m.last_seq {
            log.counted_seq.fetch_max(seq, Ordering::Relaxed);
        }
        if let Some(e) = error {
            return Err((m, e));
        }
        for gap in &found.gaps {
            // Written and sealed, yet not an entry: the entries that were there are lost. The ones after it are
            // merged, so a key whose last write was lost reads as its write before that.
            error!(
                log = log_id,
                segment = offset,
                at = base + gap.at as u64,
                bytes = gap.len,
                reason = ?gap.reason,
                "damaged log entries skipped: the writes they held are lost"
            );
            self.damaged_log_bytes
                .fetch_add(gap.len as u64, Ordering::Relaxed);
        }
        if found.end < data.len() {
            warn!(
                log = log_id,
                segment = offset,
                at = found.end,
                why = ?found.tail,
                "segment ends before its seal"
            );
            self.torn_entries.fetch_add(1, Ordering::Relaxed);
        }
        Ok(m)
    }

    /// Allocates log segments for the delete reserve until it holds its target or the pool is full. A reserved
    /// extent's header is cleared: one left from an earlier use as a segment could otherwise be taken for a log's
    /// older segment when a damaged link is rebuilt ([`find_older_segment`]).
    fn top_up_delete_reserve(&self) {
        let mut reserve = self.delete_reserve.lock().expect("reserve lock");
        while reserve.len() < self.delete_reserve_target {
            match self
                .pool
                .alloc_bytes(self.dir.segment_size(), tags::LOG_SEGMENT)
            {
                Ok(ext) => {
                    match self.pool.write(ext.offset, &[0u8; SEGMENT_HEADER_LEN]) {
                        Ok(()) => self.pool.persist(ext.offset, SEGMENT_HEADER_LEN as u64),
                        Err(e) => {
                            warn!(segment = ext.offset, %e, "could not clear a reserved segment's header")
                        }
                    }
                    reserve.push(ext);
                }
                Err(_) => break,
            }
        }
    }

    /// Unlinks and frees segments whose every entry is merged and superseded. A log's newest segment is kept while
    /// it is open (its writer appends to it).
    fn recycle(&self, dead: &[u64]) -> Result<(), ProcessorError> {
        let mut freed = false;
        let mut emptied = Vec::new();
        for &offset in dead {
            let log_id = match self
                .stats_by_segment
                .lock()
                .expect("segment stats lock")
                .get(&offset)
            {
                Some(st) if st.invalid >= st.entries => st.log_id,
                _ => continue,
            };
            let Some(log) = self.logs.read().expect("logs lock").get(&log_id).cloned() else {
                continue;
            };
            let mut meta = log.meta.lock().expect("log lock");
            let Some(pos) = meta.segments.iter().position(|s| s.offset == offset) else {
                continue;
            };
            let seg = &meta.segments[pos];
            if !seg.merged {
                continue;
            }
            let older = if pos == 0 {
                0
            } else {
                meta.segments[pos - 1].offset
            };
            if pos + 1 == meta.segments.len() {
                // The head goes only once sealed (by a MergeAll or a take-over: nothing more is written there);
                // the log's next segment then links to the one before it.
                if seg.sealed_len.is_none() {
                    continue;
                }
                self.dir.set_head(log_id, older);
            } else {
                let newer = &meta.segments[pos + 1];
                write_in_place(
                    &self.pool,
                    newer.offset,
                    newer.format,
                    InPlace::Older,
                    older,
                )?;
            }
            meta.segments.remove(pos);
            if meta.segments.is_empty() {
                emptied.push(log_id);
            }
            drop(meta);
            self.pool.free(offset)?;
            self.stats_by_segment
                .lock()
                .expect("segment stats lock")
                .remove(&offset);
            self.recycled_segments.fetch_add(1, Ordering::Relaxed);
            freed = true;
        }
        // Space coming back goes to the delete reserve first, before the index or a log can take it.
        if freed {
            self.top_up_delete_reserve();
        }
        for log_id in emptied {
            self.retire_if_unused(log_id);
        }
        Ok(())
    }

    fn reserve_cell(
        &self,
        req: &proto::ReserveCell,
    ) -> Result<proto::CellReserved, ProcessorError> {
        self.indexes.shared()?;
        let mut cells = self.cells.lock().expect("cells lock");
        // A retired cell not released yet is still the key's: activation reuses it.
        let slot = cells.reserve(&req.key)?;
        Ok(proto::CellReserved {
            cell: cells.cell_offset(slot),
        })
    }

    /// The slot of `req`'s cell while that cell is in use for `req`'s key.
    fn key_slot(cells: &CellTable, req: &proto::ShareKey) -> Option<u32> {
        cells
            .slot_at(req.cell)
            .filter(|s| cells.get(*s).is_some_and(|c| c.key == req.key))
    }

    /// Seals and merges the log of the sharing change's caller.
    fn merge_caller(&self, req: &proto::ShareKey) -> Result<proto::Merged, ProcessorError> {
        self.merge_all(&proto::MergeAll {
            log_id: req.log_id,
            session: req.session,
            sealed_len: req.sealed_len,
        })
    }

    fn activate_cell(&self, req: &proto::ShareKey) -> Result<proto::Merged, ProcessorError> {
        let index = self.indexes.shared()?;
        let merged = self.merge_caller(req)?;
        let mut cells = self.cells.lock().expect("cells lock");
        let slot = Self::key_slot(&cells, req).ok_or_else(|| {
            ProcessorError::Config(format!(
                "the cell at {:#x} is not in use for the key being shared",
                req.cell
            ))
        })?;
        let cell = cells.get(slot).expect("used slot").clone();
        if cell.state == CellState::Active {
            return Ok(merged);
        }
        // The key's value moves from the index into the cell: from now on the cell is its only reference.
        let hash = self.dir.hash_mode().hash(&cell.key);
        let mut scratch = Vec::new();
        let current = index.remove(hash, |c| {
            entry_has_key(&self.pool, c, &cell.key, &mut scratch)
        });
        cells.set_word(slot, current.map_or(0, EntryRef::raw))?;
        cells.get_mut(slot).expect("used slot").live = current;
        cells.set_state(slot, CellState::Active)?;
        self.shared_active.fetch_add(1, Ordering::AcqRel);
        info!(slot, "key shared through an indirect cell");
        Ok(merged)
    }

    fn deactivate_cell(&self, req: &proto::ShareKey) -> Result<proto::Merged, ProcessorError> {
        let merged = self.merge_caller(req)?;
        let slot = Self::key_slot(&self.cells.lock().expect("cells lock"), req);
        // A cell no longer in use for the key holds nothing of it: the key is in the index already.
        if let Some(slot) = slot {
            self.unshare(slot)?;
        }
        Ok(merged)
    }

    fn sync_cells(&self, req: &proto::SyncCells) -> Result<(), ProcessorError> {
        let listed: HashSet<u64> = req.shared.iter().copied().collect();
        let stray: Vec<(u32, CellState)> = {
            let cells = self.cells.lock().expect("cells lock");
            cells
                .cells()
                .filter(|c| !listed.contains(&cells.cell_offset(c.slot)))
                .map(|c| (c.slot, c.state))
                .collect()
        };
        for (slot, state) in stray {
            match state {
                CellState::Active => {
                    warn!(
                        slot,
                        "a shared key the cluster record does not know goes back to the index"
                    );
                    self.unshare(slot)?;
                }
                CellState::Reserved => self
                    .cells
                    .lock()
                    .expect("cells lock")
                    .set_state(slot, CellState::Free)?,
                CellState::Retired | CellState::Free => {}
            }
        }
        Ok(())
    }

    /// Moves the value of the shared key of `slot` back into the index and retires the cell. Every log that may
    /// hold the key's entries must be merged.
    fn unshare(&self, slot: u32) -> Result<(), ProcessorError> {
        let index = self.indexes.shared()?;
        let mut cells = self.cells.lock().expect("cells lock");
        // Another processor thread may have released the slot since the caller looked it up.
        let Some(cell) = cells.get(slot).cloned() else {
            return Ok(());
        };
        if cell.state != CellState::Active {
            return Ok(());
        }
        // Every owner's log is merged, so the cell holds the key's newest value; it goes back to the index, and
        // the cell turns away whoever still has the old routing table.
        let current = cells.word(slot)?.swap(cells::RETIRED, Ordering::AcqRel);
        let mut dead = Vec::new();
        if let Some(prev) = cell.live
            && prev.raw() != current
        {
            dead.push(prev);
        }
        if let Some(r) = EntryRef::from_raw(current) {
            let hash = self.dir.hash_mode().hash(&cell.key);
            let mut scratch = Vec::new();
            let old = index.upsert(hash, r, |c| {
                entry_has_key(&self.pool, c, &cell.key, &mut scratch)
            })?;
            dead.extend(old.filter(|o| *o != r));
        }
        cells.persist_word(slot);
        cells.get_mut(slot).expect("used slot").live = None;
        cells.set_state(slot, CellState::Retired)?;
        self.shared_active.fetch_sub(1, Ordering::AcqRel);
        drop(cells);
        self.invalidate(&dead)?;
        info!(slot, "shared key back in the index");
        Ok(())
    }

    fn release_cell(&self, req: &proto::ReleaseCell) -> Result<(), ProcessorError> {
        let mut cells = self.cells.lock().expect("cells lock");
        let Some((slot, state)) = cells
            .slot_at(req.cell)
            .and_then(|s| cells.get(s))
            .map(|c| (c.slot, c.state))
        else {
            return Ok(());
        };
        match state {
            CellState::Retired | CellState::Reserved => cells.set_state(slot, CellState::Free),
            CellState::Active => Err(ProcessorError::Config(
                "the cell's key is still shared".into(),
            )),
            CellState::Free => Ok(()),
        }
    }

    /// Counts `dead` entries as superseded and recycles segments that became entirely invalid.
    fn invalidate(&self, dead: &[EntryRef]) -> Result<(), ProcessorError> {
        let mut gone = Vec::new();
        {
            let mut stats = self.stats_by_segment.lock().expect("segment stats lock");
            for r in dead {
                if let Some((o, st)) = segment_holding(&mut stats, r.offset()) {
                    st.invalid += 1;
                    if st.invalid >= st.entries {
                        gone.push(o);
                    }
                }
            }
        }
        self.recycle(&gone)
    }

    /// Shared-nothing layout: copies every key whose owner under `req.ring` is not the node whose partition
    /// holds it into its owner's partition, then removes it from the old one (see [`proto::Rebalance`]). The
    /// shared layout moves nothing.
    fn rebalance(&self, req: &proto::Rebalance) -> Result<proto::Rebalanced, ProcessorError> {
        let moved = self.move_to_owners(req);
        // The moves retired the logs of departed nodes whose entries they superseded.
        self.free_departed_partitions();
        moved
    }

    fn move_to_owners(&self, req: &proto::Rebalance) -> Result<proto::Rebalanced, ProcessorError> {
        let mut out = proto::Rebalanced::default();
        if self.indexes.partitioning() == Partitioning::Shared {
            return Ok(out);
        }
        let _one_at_a_time = self.rebalance_lock.lock().expect("rebalance lock");
        let started = Instant::now();
        let mut header = [0u8; ENTRY_HEADER_LEN];
        let mut key = Vec::new();
        for (node, index) in self.indexes.all() {
            let Some(node) = node else { continue };
            out.partitions += 1;
            let mut refs = Vec::new();
            index.for_each(|_, r| refs.push(r));
            let mut moves: BTreeMap<u32, Vec<EntryRef>> = BTreeMap::new();
            for r in refs {
                self.pool.read(r.offset(), &mut header)?;
                let h = EntryHeader::parse(&header).map_err(|e| {
                    ProcessorError::Corrupt(format!(
                        "partition of node {node}: the index names an entry at {:#x} that does not parse: {e}",
                        r.offset()
                    ))
                })?;
                key.resize(usize::from(h.key_len), 0);
                self.pool
                    .read(r.offset() + ENTRY_HEADER_LEN as u64, &mut key)?;
                match req.ring.primary(&key) {
                    Some(owner) if owner != node => moves.entry(owner).or_default().push(r),
                    _ => {}
                }
            }
            for (owner, refs) in moves {
                let (keys, bytes) = self.move_entries(&index, owner, &refs)?;
                debug!(from = node, to = owner, keys, bytes, "entries moved");
                out.keys += keys;
                out.bytes += bytes;
            }
        }
        out.nanos = started.elapsed().as_nanos() as u64;
        self.migrated_keys.fetch_add(out.keys, Ordering::Relaxed);
        self.migrated_bytes.fetch_add(out.bytes, Ordering::Relaxed);
        info!(
            keys = out.keys,
            bytes = out.bytes,
            partitions = out.partitions,
            took = ?started.elapsed(),
            "partitions rebalanced"
        );
        Ok(out)
    }

    /// Copies the entries `refs` of partition `from` into the migration log of node `to`, merges that log into
    /// `to`'s partition, and only then removes them from `from` (a crash in between leaves a key in both, never in
    /// neither; the next rebalance moves it again). Returns the keys moved and the bytes written.
    fn move_entries(
        &self,
        from: &Index,
        to: u32,
        refs: &[EntryRef],
    ) -> Result<(u64, u64), ProcessorError> {
        let mut writer = log_writer::LogWriter::open(self, to, MIGRATION_THREAD)?;
        let mode = self.dir.hash_mode();
        let mut moved = Vec::with_capacity(refs.len());
        let mut entry = Vec::new();
        for &r in refs {
            entry.resize(r.len() as usize, 0);
            self.pool.read(r.offset(), &mut entry)?;
            let e = EntryView::parse(&entry).map_err(|e| {
                ProcessorError::Corrupt(format!(
                    "the index names an entry at {:#x} that does not parse: {e}",
                    r.offset()
                ))
            })?;
            writer.append(self, e.key, e.value)?;
            moved.push((mode.hash(e.key), r));
        }
        let bytes = writer.finish_merged(self)?;
        let mut dead = Vec::with_capacity(moved.len());
        for &(hash, r) in &moved {
            if let Some(old) = from.remove(hash, |c| c == r) {
                dead.push(old);
            }
        }
        self.invalidate(&dead)?;
        Ok((moved.len() as u64, bytes))
    }

    fn count_keys(&self) -> Result<u64, ProcessorError> {
        // A key being moved between partitions is in both for a moment.
        let _no_rebalance = self.rebalance_lock.lock().expect("rebalance lock");
        let mut logs = self.all_logs();
        // Always taken in log order, and nothing else holds two merge locks, so this cannot deadlock.
        logs.sort_by_key(|l| l.id);
        let _merges_wait: Vec<_> = logs
            .iter()
            .map(|l| l.merge_lock.lock().expect("merge lock"))
            .collect();
        let indexed: u64 = self.indexes.all().iter().map(|(_, i)| i.len()).sum();
        // Whether each key with unmerged entries has a value after its last one, and the index its log merges
        // into. Ownership moves only after the previous owner's log is merged, so a key's unmerged entries are all
        // in one log, in sequence order.
        let mut present_after: HashMap<Vec<u8>, (bool, Arc<Index>)> = HashMap::new();
        let mut data = Vec::new();
        for log in &logs {
            let (segments, merged_seq) = log.unmerged_segments();
            for (offset, first_seq, len) in segments {
                // An open segment is read to its end: the scan ends after the last valid entry, past damage as a
                // merge goes.
                self.read_entries(offset, len, &mut data)?;
                segment::scan_through(&data, log.id, first_seq, |_, e| {
                    if e.header.seq > merged_seq {
                        present_after
                            .insert(e.key.to_vec(), (e.header.op == Op::Put, log.index.clone()));
                    }
                });
            }
        }
        // A shared key's value is its cell, whatever its owners' unmerged entries say.
        let mut shared = 0u64;
        {
            let cells = self.cells.lock().expect("cells lock");
            for c in cells.cells().filter(|c| c.state == CellState::Active) {
                present_after.remove(&c.key);
                let word = cells.word(c.slot)?.load(Ordering::Acquire);
                if word != 0 && word != cells::RETIRED {
                    shared += 1;
                }
            }
        }
        let mode = self.dir.hash_mode();
        let mut scratch = Vec::new();
        let (mut added, mut removed) = (0u64, 0u64);
        for (key, (present, index)) in &present_after {
            let indexed = index
                .get(mode.hash(key), |c| {
                    entry_has_key(&self.pool, c, key, &mut scratch)
                })
                .is_some();
            match (present, indexed) {
                (true, false) => added += 1,
                (false, true) => removed += 1,
                _ => {}
            }
        }
        Ok((indexed + added + shared).saturating_sub(removed))
    }

    fn stats(&self) -> ProcessorStats {
        let logs = self.logs.read().expect("logs lock");
        let mut s = ProcessorStats {
            logs: logs.len() as u64,
            ..Default::default()
        };
        for log in logs.values() {
            let meta = log.meta.lock().expect("log lock");
            s.segments += meta.segments.len() as u64;
            for seg in meta.segments.iter().filter(|s| s.awaits_merge()) {
                s.backlog_segments += 1;
                s.backlog_bytes += seg.sealed_len.unwrap_or(0);
            }
        }
        s.shared_keys = self.shared_active.load(Ordering::Relaxed) as u64;
        let space = self.pool.space();
        s.merged_entries = self.merged_entries.load(Ordering::Relaxed);
        s.recycled_segments = self.recycled_segments.load(Ordering::Relaxed);
        s.recovered_entries = self.recovered_entries.load(Ordering::Relaxed);
        s.torn_entries = self.torn_entries.load(Ordering::Relaxed);
        s.damaged_log_bytes = self.damaged_log_bytes.load(Ordering::Relaxed);
        s.resealed_segments = self.resealed_segments.load(Ordering::Relaxed);
        s.relinked_segments = self.relinked_segments.load(Ordering::Relaxed);
        s.delete_reserve_segments = self.delete_reserve.lock().expect("reserve lock").len() as u64;
        s.delete_reserve_grants = self.delete_reserve_grants.load(Ordering::Relaxed);
        s.pool_used_bytes = space.used_bytes();
        s.pool_free_bytes = space.free_bytes();
        s.pool_prefaulted_bytes = self.pool.prefaulted_segments() * space.segment_size;
        for (node, index) in self.indexes.all() {
            let is = index.stats();
            s.index_entries += is.entries;
            s.index_table_bytes += is.table_bytes;
            s.partitions += u64::from(node.is_some());
        }
        s.migrated_keys = self.migrated_keys.load(Ordering::Relaxed);
        s.migrated_bytes = self.migrated_bytes.load(Ordering::Relaxed);
        s.cleaned_segments = self.cleaned_segments.load(Ordering::Relaxed);
        s.relocated_entries = self.relocated_entries.load(Ordering::Relaxed);
        s.relocated_bytes = self.relocated_bytes.load(Ordering::Relaxed);
        s.table_runs_made = self.table_runs_made.load(Ordering::Relaxed);
        s.retired_logs = self.retired_logs.load(Ordering::Relaxed);
        s.emptied_logs = self.emptied_logs.load(Ordering::Relaxed);
        s.freed_partitions = self.freed_partitions.load(Ordering::Relaxed);
        // Read from the pool, not under the lock a long rebalance holds.
        s.manager_epoch = self.dir.manager_epoch();
        s.stale_manager_calls = self.stale_manager_calls.load(Ordering::Relaxed);
        s.revocations_kept = self.revocations.lock().expect("revocations lock").len() as u64;
        s
    }
}
