//! The two-sided calls a KV node makes to the memory node's processor (postcard bodies over the fabric's RPC).
//!
//! Everything on the data path is one-sided; these calls happen once per log segment (allocation and seal), when a
//! KV-node thread starts (its log is recovered and merged first) and when a KV node hands its keys over (merge
//! everything now).

use serde::{Deserialize, Serialize};

/// [`OpenLog`] → [`LogOpened`].
pub const OPEN_LOG: u16 = 1;
/// [`NextSegment`] → [`SegmentGranted`].
pub const NEXT_SEGMENT: u16 = 2;
/// [`MergeAll`] → [`Merged`].
pub const MERGE_ALL: u16 = 3;
/// `()` → [`crate::ProcessorStats`].
pub const STATS: u16 = 4;
/// [`TakeOverNode`] → [`NodeTakenOver`].
pub const TAKE_OVER_NODE: u16 = 5;
/// [`ReserveCell`] → [`CellReserved`].
pub const RESERVE_CELL: u16 = 6;
/// [`ShareKey`] → [`Merged`].
pub const ACTIVATE_CELL: u16 = 7;
/// [`ShareKey`] → [`Merged`].
pub const DEACTIVATE_CELL: u16 = 8;
/// [`ReleaseCell`] → `()`.
pub const RELEASE_CELL: u16 = 9;
/// [`SyncCells`] → `()`.
pub const SYNC_CELLS: u16 = 10;
/// `()` → [`KeyCount`].
pub const COUNT_KEYS: u16 = 11;
/// [`Rebalance`] → [`Rebalanced`].
pub const REBALANCE: u16 = 12;
/// `()` → [`Layout`].
pub const LAYOUT: u16 = 13;
/// [`MergeSealed`] → [`Merged`].
pub const MERGE_SEALED: u16 = 14;
/// [`Fence`] → [`Fenced`].
pub const FENCE: u16 = 15;
/// [`ScanKeys`] → [`KeysPage`].
pub const SCAN_KEYS: u16 = 16;

/// The management node's calls ([`TAKE_OVER_NODE`], [`RESERVE_CELL`], [`RELEASE_CELL`], [`SYNC_CELLS`],
/// [`REBALANCE`] and [`FENCE`]) each carry the epoch of the change they belong to: the epoch the M-node reserved in
/// the cluster record before acting. The memory node keeps the newest such epoch in the pool and refuses a call
/// with an older one: it comes from an M-node that stalled and no longer leads, and acting on it would undo what
/// the leader did since (free a cell in use, send a shared key's value back to the index, revoke a live node).
/// Calls of the same change share its epoch, so a retry is taken.
pub type ManagerEpoch = u64;

/// Raises the memory node's newest management epoch to `epoch`, so that every call of an older change is refused
/// from then on. Sent by the M-node right after it reserves an epoch, before its change touches anything.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fence {
    /// The epoch just reserved.
    pub epoch: ManagerEpoch,
}

/// Reply to [`Fence`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    /// The memory node's newest management epoch after the call: the epoch offered when it was taken, a newer one
    /// when it was refused (the caller's record is behind the pool: it must reserve past this one).
    pub newest: ManagerEpoch,
}

/// Claims (or reclaims after a restart) the log of one KV-node thread. Whatever that log holds unmerged is merged
/// before the reply, so the caller starts from an index that has all of its earlier writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpenLog {
    /// The KV node's id.
    pub node_id: u32,
    /// The thread's index within the node.
    pub thread: u32,
}

/// Reply to [`OpenLog`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogOpened {
    /// The log's id; goes into every entry.
    pub log_id: u32,
    /// Fences older sessions of the same log: calls carrying another session are refused.
    pub session: u64,
    /// Sequence number of the next entry.
    pub next_seq: u64,
    /// Pool offset of the log's `merged_seq` word, readable with one-sided READs to follow merging.
    pub merged_seq_offset: u64,
    /// Word of the [`dinomo_log::HashMode`] the index uses.
    pub hash_mode: u32,
    /// Bytes of a segment (header included) this memory node hands out.
    pub segment_size: u64,
    /// Pool offset of the header of the index the log merges into, which the node reads (the node's own partition
    /// in the shared-nothing layout).
    pub index_header: u64,
    /// Sealed segments of the log not merged yet, oldest first: the index had no room for them (they are merged
    /// once it has). Their entries were acknowledged, so the caller serves its keys from them until then.
    pub unmerged: Vec<UnmergedSegment>,
}

impl LogOpened {
    /// Bytes of entries one of the log's segments holds (its size less the header): no entry is longer.
    pub fn entry_room(&self) -> u64 {
        self.segment_size
            .saturating_sub(dinomo_log::SEGMENT_HEADER_LEN as u64)
    }
}

/// A sealed log segment the memory node could not merge yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmergedSegment {
    /// Pool offset of the segment header (entries start [`dinomo_log::SEGMENT_HEADER_LEN`] later).
    pub offset: u64,
    /// Sequence number of its first entry.
    pub first_seq: u64,
    /// Bytes of entries it holds.
    pub len: u64,
}

/// Seals the log's current segment at `sealed_len` bytes of entries (when there is one) and asks for a new one
/// whose first entry will carry `first_seq`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NextSegment {
    /// The log.
    pub log_id: u32,
    /// The session from [`LogOpened`].
    pub session: u64,
    /// Bytes of entries the caller wrote into its current segment; `None` when it has none.
    pub sealed_len: Option<u64>,
    /// Sequence number of the first entry of the new segment.
    pub first_seq: u64,
    /// The caller will log only deletes into the new segment: on a full pool it may have one of the delete
    /// reserve.
    pub deletes_only: bool,
}

/// Reply to [`NextSegment`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SegmentGranted {
    /// Pool offset of the new segment (its header; entries start [`dinomo_log::SEGMENT_HEADER_LEN`] later).
    pub offset: u64,
    /// Bytes of the segment, header included.
    pub capacity: u64,
    /// Every entry of the log up to this sequence number is merged.
    pub merged_seq: u64,
    /// The segment comes from the delete reserve: only deletes may be logged into it.
    pub reserved: bool,
}

/// Seals the current segment at `sealed_len` (when there is one) and merges the whole log before replying.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MergeAll {
    /// The log.
    pub log_id: u32,
    /// The session from [`LogOpened`].
    pub session: u64,
    /// Bytes of entries written into the current segment; `None` when there is none.
    pub sealed_len: Option<u64>,
}

/// Merges the log's sealed segments now (its open segment stays open) and replies when they are merged, or with
/// the reason they cannot be (out of space: the index has no room for a new key). A writer waiting for merges
/// asks this when they take long.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MergeSealed {
    /// The log.
    pub log_id: u32,
    /// The session from [`LogOpened`].
    pub session: u64,
}

/// Reply to [`MergeAll`] and [`MergeSealed`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Merged {
    /// Every entry of the log up to this sequence number is merged.
    pub merged_seq: u64,
}

/// Takes over every log of a KV node that failed or left: first the node is revoked (every connection that names
/// itself as the incarnation taken over is closed once its verbs in flight complete, and that incarnation may not
/// connect or claim a log again), then, unless a newer incarnation of the node holds its logs (the call came late,
/// and the logs are left to it), its sessions are fenced (its further calls are refused), its open segments
/// are sealed at their last valid entry and everything is merged before the reply, so the keys it owned can be
/// served by other nodes from the index.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TakeOverNode {
    /// The KV node's id.
    pub node_id: u32,
    /// The incarnation taken over, as the caller last saw it live: revoked whether it has a connection now or not
    /// (it may reconnect later, from behind a partition), while a newer incarnation of the node is left alone (a
    /// late call must not revoke a node that restarted meanwhile). `None` (not known): every incarnation of the
    /// node connected now is revoked.
    pub incarnation: Option<u64>,
    /// The epoch of the change taking the node over (see [`ManagerEpoch`]).
    pub epoch: ManagerEpoch,
}

/// Reply to [`TakeOverNode`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeTakenOver {
    /// Logs of the node that were taken over.
    pub logs: u32,
    /// Entries merged while taking over (committed by the node but not merged before).
    pub merged_entries: u64,
    /// Connections of the node that were closed.
    pub revoked_connections: u32,
}

/// Sets a pool cell aside for `key`, which is about to be shared by several KV nodes (selective replication). The
/// same key gets the same cell again until it is released.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReserveCell {
    /// The key.
    pub key: Vec<u8>,
    /// The epoch of the sharing change (see [`ManagerEpoch`]).
    pub epoch: ManagerEpoch,
}

/// Reply to [`ReserveCell`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellReserved {
    /// Pool offset of the key's 8-byte cell.
    pub cell: u64,
}

/// Sent by the thread of the key's exclusive owner, which serves nothing meanwhile. [`ACTIVATE_CELL`]: the
/// caller's log is sealed at `sealed_len` and merged, then the key's value moves from the index into its cell and
/// the key is shared from then on. [`DEACTIVATE_CELL`]: the caller's log is sealed and merged (every other owner
/// has merged its log already), then the cell's value moves back into the index and the cell is retired. Both are
/// idempotent; deactivating a cell that no longer holds the key (retired, freed, or reserved for another key)
/// does nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShareKey {
    /// The caller's log.
    pub log_id: u32,
    /// The session from [`LogOpened`].
    pub session: u64,
    /// Bytes of entries written into the current segment; `None` when there is none.
    pub sealed_len: Option<u64>,
    /// The key's cell, from [`CellReserved`].
    pub cell: u64,
    /// The key, checked against the cell's: a cell freed and reserved again for another key is not touched.
    pub key: Vec<u8>,
}

/// Frees a retired cell once no routing table in use names it any more.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseCell {
    /// The cell.
    pub cell: u64,
    /// The epoch of the change that stopped sharing the cell's key, or rolled its sharing back (see
    /// [`ManagerEpoch`]).
    pub epoch: ManagerEpoch,
}

/// Sent by the M-node once a failed KV node's logs are taken over: `shared` lists the cells of the keys the
/// cluster record shares. A cell that is active but not listed belonged to a sharing change the failed node began
/// and the record never took in: its value goes back to the index. Reserved cells that are not listed are freed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SyncCells {
    /// The cells the cluster record names.
    pub shared: Vec<u64>,
    /// The epoch of the change that took the failed node over (see [`ManagerEpoch`]).
    pub epoch: ManagerEpoch,
}

/// Reply to [`COUNT_KEYS`]: how many keys the store holds, counting every write that reached the memory node
/// (merged or still in a log).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyCount {
    /// Keys with a value.
    pub keys: u64,
}

/// One step of a walk over every key the memory node holds (Redis's `SCAN`). A walk starts at cursor 0 and ends
/// when a reply's cursor is 0. It first reads the logs' unmerged entries, then the index slice by slice, so that a
/// key written before the walk started and not deleted before it ended is named by some step: an entry only
/// moves from a log to the index, which is read after. The keys named are candidates: some may have been deleted
/// (their delete is not merged yet), and the caller checks them at their owners. A key may be named twice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanKeys {
    /// The cursor of the previous step's reply, or 0 to start.
    pub cursor: u64,
    /// About how many keys to name (a hint: a step reads whole log segments and whole index slices).
    pub count: u32,
    /// The most key bytes the reply may carry; it stops before that, after at least one key.
    pub max_bytes: u32,
}

/// Reply to [`ScanKeys`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KeysPage {
    /// Where the next step starts; 0 when the walk is over.
    pub cursor: u64,
    /// Keys the index or a shared key's cell names, and keys whose newest entry among those this step read writes
    /// a value; none twice within one step.
    pub keys: Vec<Vec<u8>>,
}

/// Shared-nothing layout (DINOMO-N): moves every key to the partition of its owner under `ring`. Each partition's
/// index is walked; the entry of every key another node owns is copied into that node's migration log, which is
/// merged into its partition, and then removed from the old partition. Sent by the M-node once the keys' old owners
/// stopped serving them and merged their logs, and before their new owners start. The shared layout moves nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rebalance {
    /// The routing table the partitions must match. Its epoch is the change's management epoch (see
    /// [`ManagerEpoch`]).
    pub ring: dinomo_ring::Ring,
}

/// Reply to [`Rebalance`]: what moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebalanced {
    /// Keys copied into another partition.
    pub keys: u64,
    /// Bytes of log entries written by those copies.
    pub bytes: u64,
    /// Partitions walked.
    pub partitions: u32,
    /// How long the memory node took, in nanoseconds.
    pub nanos: u64,
}

/// Reply to [`LAYOUT`]: how the memory node lays out its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// One shared index, or one per KV node.
    pub partitioning: crate::Partitioning,
}
