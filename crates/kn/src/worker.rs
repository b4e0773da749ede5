//! One KV-node worker thread: its cache, its log, its endpoint, and the request loop with group commit.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::{ControlFlow, Range};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dinomo_cache::{CacheStats, Dac, Lookup, Shortcut};
use dinomo_dpm::proto;
use dinomo_fabric::{
    Batch, Connector, DATA_REGION, Endpoint, FabricError, RegionInfo, RpcError, Slot, counters,
};
use dinomo_index::RemoteIndex;
use dinomo_index::layout::{BUCKET_LEN, stored_hash};
use dinomo_log::{EntryRef, EntryView, HashMode, Op, SEGMENT_HEADER_LEN, encode_entry, entry_len};
use dinomo_value::RangeWrite;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::hotkeys::{KeySketch, KeyStats};
use crate::occupancy::Occupancy;
use crate::segment_keys::SegmentKeys;
use crate::{KnConfig, KnError};

/// Which keys a KV node owns (the cluster's ownership map, seen from one node). Workers refuse keys it rejects.
pub trait Ownership: Send + Sync {
    /// Version of the map; grows with every change.
    fn epoch(&self) -> u64;
    /// Whether this node may serve `key`.
    fn owns(&self, key: &[u8]) -> bool;
    /// The pool offset of `key`'s indirect cell when several nodes share the key (selective replication, paper
    /// §3.4); `None` for keys owned by one node.
    fn cell(&self, _key: &[u8]) -> Option<u64> {
        None
    }
    /// Every shared key with its cell.
    fn shared_keys(&self) -> Vec<(Vec<u8>, u64)> {
        Vec::new()
    }
}

/// The liveness lease of a KV node as the node itself sees it: serving is allowed until a deadline that heartbeats
/// push forward. Shared by the node's heartbeat and its workers.
///
/// A gate whose deadline passed has *lapsed*: the node may not serve, but a later renewal reopens it (the store's
/// lease outlives the gate's, so a renewal that succeeds proves no other node took the keys over). A request that
/// meets a lapsed gate waits up to [`LeaseGate::wait`] for that renewal. A gate that is *fenced*
/// ([`LeaseGate::close`]: the store reported the lease expired, or the node crashed) never reopens.
#[derive(Debug)]
pub struct LeaseGate {
    base: Instant,
    /// Nanoseconds after `base` until which the node may serve; `u64::MAX` = never again (fenced).
    until_ns: AtomicU64,
    /// How long a request that meets a lapsed gate waits for a renewal (zero: it is refused at once).
    wait: Duration,
    /// Whether renewals may still come (false once the heartbeat stopped): nothing is worth waiting for otherwise.
    renewing: AtomicBool,
    /// Wakes waiters when the deadline moves, the gate is fenced or renewals stop.
    changed: (Mutex<()>, Condvar),
    /// Waits for a renewal begun (by requests or group commits that met the gate lapsed).
    waits: AtomicU64,
}

impl LeaseGate {
    /// A gate open until `deadline` whose requests never wait for a renewal.
    pub fn open_until(deadline: Instant) -> Arc<LeaseGate> {
        LeaseGate::with_wait(deadline, Duration::ZERO)
    }

    /// A gate open until `deadline` whose requests wait up to `wait` for a renewal when it has lapsed.
    pub fn with_wait(deadline: Instant, wait: Duration) -> Arc<LeaseGate> {
        let g = Arc::new(LeaseGate {
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
            wait,
            renewing: AtomicBool::new(true),
            changed: (Mutex::new(()), Condvar::new()),
            waits: AtomicU64::new(0),
        });
        g.extend_to(deadline);
        g
    }

    /// Moves the deadline to `deadline` (never backwards, never after [`LeaseGate::close`]).
    pub fn extend_to(&self, deadline: Instant) {
        let ns = deadline.saturating_duration_since(self.base).as_nanos() as u64;
        let mut cur = self.until_ns.load(Ordering::Acquire);
        while cur != u64::MAX && ns > cur {
            match self
                .until_ns
                .compare_exchange(cur, ns, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return self.wake(),
                Err(now) => cur = now,
            }
        }
    }

    /// Fences the node for good.
    pub fn close(&self) {
        self.until_ns.store(u64::MAX, Ordering::Release);
        self.wake();
    }

    /// Says no renewal will come any more (the heartbeat stopped): the gate stays open until its deadline, but a
    /// request that meets it lapsed is refused without waiting.
    pub fn stop_renewals(&self) {
        self.renewing.store(false, Ordering::Release);
        self.wake();
    }

    /// Whether the node may serve now.
    pub fn is_open(&self) -> bool {
        let until = self.until_ns.load(Ordering::Acquire);
        until != u64::MAX && (self.base.elapsed().as_nanos() as u64) < until
    }

    /// Whether the node is fenced for good.
    pub fn is_fenced(&self) -> bool {
        self.until_ns.load(Ordering::Acquire) == u64::MAX
    }

    /// How long a request that meets a lapsed gate waits for a renewal.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether the node may serve, waiting (parked, not spinning) until `until` at the latest for a renewal when
    /// the gate has lapsed. Returns at once when open, fenced, or no renewal can come.
    pub fn wait_open(&self, until: Instant) -> bool {
        if let ControlFlow::Break(serve) = self.verdict(until) {
            return serve;
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        let (lock, cv) = &self.changed;
        let mut guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        // Checked under the lock, and the deadline is moved before the lock is taken to wake: no wake-up is lost.
        loop {
            match self.verdict(until) {
                ControlFlow::Break(serve) => return serve,
                ControlFlow::Continue(left) => {
                    guard = cv
                        .wait_timeout(guard, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            }
        }
    }

    /// Whether a request waiting until `until` is decided now (`Break`: served or not) or waits on for up to the
    /// duration in `Continue`.
    fn verdict(&self, until: Instant) -> ControlFlow<bool, Duration> {
        if self.is_open() {
            return ControlFlow::Break(true);
        }
        let now = Instant::now();
        if self.is_fenced() || !self.renewing.load(Ordering::Acquire) || now >= until {
            return ControlFlow::Break(false);
        }
        ControlFlow::Continue(until - now)
    }

    /// Waits for a renewal begun so far (by requests or group commits that met the gate lapsed).
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    fn wake(&self) {
        let (lock, cv) = &self.changed;
        drop(lock.lock().unwrap_or_else(|p| p.into_inner()));
        cv.notify_all();
    }
}

/// An operation on one key: what clients ask a KV node for, in process or over the network. Keys and values are
/// encoded as byte strings (`serde_bytes`): the same bytes on the wire as a sequence of `u8`, copied whole rather
/// than one element at a time (ten times faster for a 1 KiB value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataOp {
    /// The value of a key.
    Get(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Upsert.
    Set(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Only when absent; replies whether it was applied.
    Insert(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Only when present; replies whether it was applied.
    Update(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Sets the value and replies with the previous one.
    GetSet(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Replies whether the key existed.
    Delete(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Adds to the decimal integer stored at the key (absent = 0) and replies with the result.
    Incr(#[serde(with = "serde_bytes")] Vec<u8>, i64),
    /// Appends to the value (absent = empty) and replies with the new length.
    Append(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Replies whether the key has a value, without the value.
    Exists(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Replies with the length of the key's value (absent = 0), without the value.
    Strlen(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Removes the key and replies with the value it had (`GETDEL`).
    Take(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Replies with the bytes of the value from the first position to the second, both included, negative
    /// positions counting from the end (`GETRANGE`; absent = empty).
    GetRange(#[serde(with = "serde_bytes")] Vec<u8>, i64, i64),
    /// Writes the bytes at the offset, zero-filling any gap (absent = empty), and replies with the new length
    /// (`SETRANGE`).
    SetRange(
        #[serde(with = "serde_bytes")] Vec<u8>,
        u64,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Adds the float spelled by the bytes to the number stored at the key (absent = 0) and replies with the
    /// result as stored (`INCRBYFLOAT`).
    IncrFloat(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Sets the value only when absent; replies with the current value, none when it was set (`SET NX GET`).
    InsertGet(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Sets the value only when present; replies with the previous value, none when nothing was set
    /// (`SET XX GET`).
    UpdateGet(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
    ),
    /// Sets or clears one bit of the value (bit 0: the first byte's most significant), growing it with zero bytes;
    /// replies with the bit before (`SETBIT`).
    SetBit(#[serde(with = "serde_bytes")] Vec<u8>, u64, bool),
    /// Replies with one bit of the value, 0 beyond its end or when absent (`GETBIT`).
    GetBit(#[serde(with = "serde_bytes")] Vec<u8>, u64),
    /// Replies with how many bits of the value are set: all, or those from the first position to the second,
    /// counted in bits when the flag is set, else in bytes (`BITCOUNT`).
    BitCount(
        #[serde(with = "serde_bytes")] Vec<u8>,
        Option<(i64, i64, bool)>,
    ),
    /// Replies with the position of the first bit equal to the flag: in all of the value, or from the first
    /// position to the optional second, counted in bits when the last flag is set, else in bytes (`BITPOS`).
    BitPos(
        #[serde(with = "serde_bytes")] Vec<u8>,
        bool,
        Option<(i64, Option<i64>, bool)>,
    ),
    /// Replies whether the value still has this digest (`dinomo_value::digest`; none: no value): a key a Redis
    /// transaction watches (`WATCH`). In a transaction it is checked before any part runs, and the transaction
    /// runs only if it holds.
    Unchanged(#[serde(with = "serde_bytes")] Vec<u8>, Option<u128>),
}

impl DataOp {
    /// The key the operation is about.
    pub fn key(&self) -> &[u8] {
        match self {
            DataOp::Get(k)
            | DataOp::Exists(k)
            | DataOp::Strlen(k)
            | DataOp::Delete(k)
            | DataOp::Take(k)
            | DataOp::Incr(k, _)
            | DataOp::GetRange(k, ..)
            | DataOp::SetRange(k, ..)
            | DataOp::SetBit(k, ..)
            | DataOp::GetBit(k, _)
            | DataOp::BitCount(k, _)
            | DataOp::BitPos(k, ..)
            | DataOp::Unchanged(k, _) => k,
            DataOp::Set(k, _)
            | DataOp::Insert(k, _)
            | DataOp::Update(k, _)
            | DataOp::GetSet(k, _)
            | DataOp::Append(k, _)
            | DataOp::IncrFloat(k, _)
            | DataOp::InsertGet(k, _)
            | DataOp::UpdateGet(k, _) => k,
        }
    }

    /// Whether the operation may change data.
    pub fn is_write(&self) -> bool {
        !matches!(
            self,
            DataOp::Get(_)
                | DataOp::Exists(_)
                | DataOp::Strlen(_)
                | DataOp::GetRange(..)
                | DataOp::GetBit(..)
                | DataOp::BitCount(..)
                | DataOp::BitPos(..)
                | DataOp::Unchanged(..)
        )
    }
}

/// A request to a worker.
pub enum Command {
    /// An operation on a key.
    Data(DataOp),
    /// Seal and merge this thread's whole log now.
    MergeAll,
    /// Installs a new ownership map: the worker commits what is pending, has its log merged when it holds
    /// unmerged writes of keys it no longer owns, drops those keys from its cache, and only then serves under the
    /// new map.
    Own(Arc<dyn Ownership>),
    /// The worker's counters.
    Stats,
    /// The statistics of the monitoring epoch that ends now (busy time, key accesses); a new epoch starts.
    EpochStats,
    /// Count accesses of these keys exactly from now on (the node's replicated keys), in place of the keys named
    /// before.
    TrackKeys(Arc<[Vec<u8>]>),
    /// Finish what is queued before it, then stop.
    Shutdown,
    /// This worker's share of a transaction (`crate::txn`): run once every worker of it reached its share. Its
    /// operations are answered one by one, each with its own tag, to the request's reply destination.
    Txn(crate::txn::TxnPart),
}

impl Command {
    /// The key whose current value the command reads: every data operation's but a blind SET's.
    fn read_key(&self) -> Option<&[u8]> {
        match self {
            Command::Data(DataOp::Set(..)) => None,
            Command::Data(op) => Some(op.key()),
            _ => None,
        }
    }

    /// The key the command is about, if any.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Command::Data(op) => Some(op.key()),
            Command::MergeAll
            | Command::Own(_)
            | Command::Stats
            | Command::EpochStats
            | Command::TrackKeys(_)
            | Command::Shutdown
            | Command::Txn(_) => None,
        }
    }

    /// The data operation, if the command is one.
    fn into_data(self) -> Option<DataOp> {
        match self {
            Command::Data(op) => Some(op),
            _ => None,
        }
    }
}

/// A worker's answer.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// A value, or none.
    Value(Option<Vec<u8>>),
    /// Whether a write applied.
    Applied(bool),
    /// An integer result (INCR) or a length (APPEND, STRLEN).
    Int(i64),
    /// Counters.
    Stats(Box<WorkerStats>),
    /// A monitoring epoch's statistics.
    Epoch(Box<EpochStats>),
}

/// One worker's statistics of one monitoring epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// Nanoseconds spent serving in the epoch.
    pub busy_ns: u64,
    /// Length of the epoch in nanoseconds.
    pub wall_ns: u64,
    /// Key accesses of the epoch (`None` when [`crate::KeyStatsConfig::enabled`] is off).
    pub keys: Option<KeyStats>,
}

/// A reply with the tag of its request, so one channel can collect the replies of many requests in flight.
pub type Tagged = (u64, Result<Reply, KnError>);

/// Takes the replies of requests submitted with [`crate::Submitter::submit_to`]: a server's event loop, say, that
/// must be told when replies arrive, which a channel alone cannot do.
pub trait ReplySink: Send + Sync {
    /// Takes the reply of the request tagged `tag`; false when no one waits for replies here any more. Runs on the
    /// worker thread, so it must not block.
    fn deliver(&self, tag: u64, reply: Result<Reply, KnError>) -> bool;
}

/// Where a worker sends a request's reply.
#[derive(Clone)]
pub(crate) struct Responder {
    pub tag: u64,
    pub to: ReplyTo,
}

/// The ways a reply goes back.
#[derive(Clone)]
pub(crate) enum ReplyTo {
    Channel(Sender<Tagged>),
    Sink(Arc<dyn ReplySink>),
}

impl Responder {
    /// A responder that sends to a channel.
    pub(crate) fn channel(tag: u64, tx: Sender<Tagged>) -> Responder {
        Responder {
            tag,
            to: ReplyTo::Channel(tx),
        }
    }

    /// A responder that delivers to a sink.
    pub(crate) fn sink(tag: u64, sink: Arc<dyn ReplySink>) -> Responder {
        Responder {
            tag,
            to: ReplyTo::Sink(sink),
        }
    }

    pub(crate) fn send(&self, r: Result<Reply, KnError>) -> Result<(), ()> {
        match &self.to {
            ReplyTo::Channel(tx) => tx.send((self.tag, r)).map_err(|_| ()),
            ReplyTo::Sink(sink) => sink.deliver(self.tag, r).then_some(()).ok_or(()),
        }
    }
}

pub(crate) struct Request {
    pub cmd: Command,
    pub reply: Responder,
}

/// Data operations a worker served, by kind (refused ones not included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpCounts {
    /// GET.
    pub get: u64,
    /// Upserts.
    pub set: u64,
    /// Writes only when absent.
    pub insert: u64,
    /// Writes only when present.
    pub update: u64,
    /// Writes replying with the previous value.
    pub getset: u64,
    /// Deletes.
    pub delete: u64,
    /// Increments.
    pub incr: u64,
    /// Appends.
    pub append: u64,
    /// Existence probes (EXISTS).
    pub exists: u64,
    /// Length probes (STRLEN).
    pub strlen: u64,
    /// Deletes replying with the value (GETDEL).
    pub getdel: u64,
    /// Reads of part of a value (GETRANGE).
    pub getrange: u64,
    /// Writes of part of a value (SETRANGE).
    pub setrange: u64,
    /// Writes of one bit (SETBIT).
    pub setbit: u64,
    /// Reads of bits (GETBIT, BITCOUNT, BITPOS).
    pub getbits: u64,
    /// Checks of keys a transaction watched (WATCH).
    pub watch: u64,
}

impl OpCounts {
    /// Each kind with its count, named as in the metrics.
    pub fn by_kind(&self) -> [(&'static str, u64); 16] {
        [
            ("get", self.get),
            ("set", self.set),
            ("insert", self.insert),
            ("update", self.update),
            ("getset", self.getset),
            ("delete", self.delete),
            ("incr", self.incr),
            ("append", self.append),
            ("exists", self.exists),
            ("strlen", self.strlen),
            ("getdel", self.getdel),
            ("getrange", self.getrange),
            ("setrange", self.setrange),
            ("setbit", self.setbit),
            ("getbits", self.getbits),
            ("watch", self.watch),
        ]
    }

    /// The counts of `self` and `other` added kind by kind (saturating: the counts may come from peers' reports).
    pub fn plus(&self, other: &OpCounts) -> OpCounts {
        let add = |a: u64, b: u64| a.saturating_add(b);
        OpCounts {
            get: add(self.get, other.get),
            set: add(self.set, other.set),
            insert: add(self.insert, other.insert),
            update: add(self.update, other.update),
            getset: add(self.getset, other.getset),
            delete: add(self.delete, other.delete),
            incr: add(self.incr, other.incr),
            append: add(self.append, other.append),
            exists: add(self.exists, other.exists),
            strlen: add(self.strlen, other.strlen),
            getdel: add(self.getdel, other.getdel),
            getrange: add(self.getrange, other.getrange),
            setrange: add(self.setrange, other.setrange),
            setbit: add(self.setbit, other.setbit),
            getbits: add(self.getbits, other.getbits),
            watch: add(self.watch, other.watch),
        }
    }

    /// Operations of every kind.
    pub fn total(&self) -> u64 {
        // Saturating: the counts may come from a peer's report.
        self.by_kind()
            .iter()
            .fold(0u64, |total, (_, n)| total.saturating_add(*n))
    }

    fn count(&mut self, op: &DataOp) {
        let n = match op {
            DataOp::Get(_) => &mut self.get,
            DataOp::Set(..) => &mut self.set,
            // The conditional writes that answer with the value are inserts and updates all the same.
            DataOp::Insert(..) | DataOp::InsertGet(..) => &mut self.insert,
            DataOp::Update(..) | DataOp::UpdateGet(..) => &mut self.update,
            DataOp::GetSet(..) => &mut self.getset,
            DataOp::Delete(_) => &mut self.delete,
            DataOp::Incr(..) | DataOp::IncrFloat(..) => &mut self.incr,
            DataOp::Append(..) => &mut self.append,
            DataOp::Exists(_) => &mut self.exists,
            DataOp::Strlen(_) => &mut self.strlen,
            DataOp::Take(_) => &mut self.getdel,
            DataOp::GetRange(..) => &mut self.getrange,
            DataOp::SetRange(..) => &mut self.setrange,
            DataOp::SetBit(..) => &mut self.setbit,
            DataOp::GetBit(..) | DataOp::BitCount(..) | DataOp::BitPos(..) => &mut self.getbits,
            DataOp::Unchanged(..) => &mut self.watch,
        };
        *n += 1;
    }
}

/// Counters of one worker thread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Data operations served, by kind.
    #[serde(default)]
    pub ops: OpCounts,
    /// Requests refused because the key is not this node's under its routing table.
    #[serde(default)]
    pub not_owner: u64,
    /// Lookups served (GET and the existence checks of conditional writes).
    pub lookups: u64,
    /// Lookups answered from a cached value.
    pub value_hits: u64,
    /// Lookups answered through a cached shortcut (one READ).
    pub shortcut_hits: u64,
    /// Entries that shortcuts led to, read ahead for a batch's lookups in one round trip (instead of one each).
    #[serde(default)]
    pub entries_read_ahead: u64,
    /// Index walks of a batch's uncached keys made side by side before it was served (one round trip per bucket
    /// level for all of them, and their entries in the round trip of the entries read ahead).
    #[serde(default)]
    pub index_walks_ahead: u64,
    /// Lookups answered "no value" from the cache's record that an earlier index walk found none (no round trip).
    #[serde(default)]
    pub absent_hits: u64,
    /// Shortcuts that no longer matched their key and sequence number.
    pub stale_shortcuts: u64,
    /// Operations on shared keys (served through their indirect cells).
    pub shared_ops: u64,
    /// CASes on shared keys' cells that lost to another owner (the operation was retried).
    pub shared_cas_retries: u64,
    /// Shared keys' cells read again because the entry named was not the key's: another owner moved the cell on
    /// between the two READs (or the cell is damaged).
    #[serde(default)]
    pub cell_rereads: u64,
    /// Lookups answered from the thread's own unmerged log segments.
    pub log_hits: u64,
    /// Lookups that walked the index on the memory node.
    pub index_walks: u64,
    /// Round trips spent on index walks (including the entry READ).
    pub index_walk_round_trips: u64,
    /// Index walks made again because a candidate's entry did not parse or held another key: its slot was
    /// replaced since the bucket was read (the cleaner moved it and its segment was written again), or it is
    /// damaged.
    #[serde(default)]
    pub index_rewalks: u64,
    /// Writes acknowledged (puts and deletes that were logged).
    pub writes: u64,
    /// Group commits (one WRITE each).
    pub commits: u64,
    /// Segments this thread filled.
    pub segments_sealed: u64,
    /// Times a write waited for the memory node to merge.
    pub merge_waits: u64,
    /// Requests (and group commits) that met the node's lease lapsed and were served after it was renewed.
    #[serde(default)]
    pub lease_waits_served: u64,
    /// Requests (and group commits) refused because the node's lease had lapsed and was not renewed in time.
    #[serde(default)]
    pub lease_refusals: u64,
    /// Bytes of unmerged segment copies held locally, with their bloom filters and key locators.
    pub unmerged_bytes: u64,
    /// Entries in those segment copies.
    pub unmerged_keys: u64,
    /// Fabric round trips this thread made (all kinds).
    pub round_trips: u64,
    /// Bytes this thread sent over the fabric.
    pub bytes_out: u64,
    /// Bytes this thread received over the fabric.
    pub bytes_in: u64,
    /// The cache's own counters.
    pub cache: CacheStats,
    /// The cache's moving average of round trips per miss.
    pub miss_cost: f64,
    /// Nanoseconds spent serving since the worker started (from taking a batch to finishing its commit); the busy
    /// share of an interval between two snapshots is its occupancy.
    #[serde(default)]
    pub busy_ns: u64,
    /// Nanoseconds since the worker started.
    #[serde(default)]
    pub wall_ns: u64,
}

/// A segment this thread writes or wrote, with its local copy (which is also the write buffer).
struct LocalSegment {
    /// Pool offset of the segment header.
    offset: u64,
    /// Bytes available for entries.
    capacity: usize,
    /// Sequence number of the last entry (first_seq - 1 when empty).
    last_seq: u64,
    buf: Vec<u8>,
    /// Bytes of `buf` already written to the memory node.
    flushed: usize,
    /// Where each key's newest entry lies in `buf`.
    keys: SegmentKeys,
    /// Granted from the memory node's delete reserve (the pool was full): only deletes go here, and they are merged
    /// after each group commit so that the space they free is usable at once.
    reserved: bool,
    /// Holds a delete: merging it would supersede entries, which may free pool space.
    has_deletes: bool,
}

impl LocalSegment {
    fn entries_offset(&self) -> u64 {
        self.offset + SEGMENT_HEADER_LEN as u64
    }
}

/// How long a writer waits for its merges before it asks the memory node to merge now (and why it cannot).
const MERGE_ASK_AFTER: Duration = Duration::from_millis(50);
/// How often it asks again while it keeps waiting.
const MERGE_ASK_EVERY: Duration = Duration::from_millis(500);

/// What an index walk's candidates hold for a key.
enum Candidate {
    /// A put of the key: its value, and the shortcut to cache.
    Found(Vec<u8>, Shortcut),
    /// No candidate is the key's. `skipped`: a candidate held a put of another key of this hash, taken for that
    /// key's own slot; it may instead have been this key's slot, moved meanwhile, its bytes written again.
    None { skipped: bool },
    /// This candidate's entry does not parse or is not a put of a key of this hash (why), and no earlier one was
    /// the key's.
    Unreadable(EntryRef, String),
}

/// An index walk made ahead of a batch, for one key ([`Worker::read_ahead`]).
struct WalkAhead {
    /// Its key in `Worker::walked_keys`: the walk answers for this key only. Another key of the hash may have had
    /// writes in the worker's unmerged log when the walk was made, which the index did not hold yet.
    key: Range<usize>,
    /// Its candidates in `Worker::walked_candidates`.
    candidates: Range<usize>,
}

/// A write whose WRITE has not completed yet.
struct PendingWrite {
    key: Vec<u8>,
    /// `None` for a delete.
    value: Option<Vec<u8>>,
    entry: EntryRef,
    seq: u64,
    /// What to answer once committed.
    ack: Reply,
    reply: Responder,
}

pub(crate) struct Worker {
    cfg: Arc<KnConfig>,
    thread: u32,
    connector: Connector,
    ep: Endpoint,
    data: RegionInfo,
    remote: RemoteIndex,
    hash_mode: HashMode,
    log: proto::LogOpened,
    next_seq: u64,
    merged_seq: u64,
    cache: Dac,
    active: Option<LocalSegment>,
    sealed: VecDeque<LocalSegment>,
    pending: Vec<PendingWrite>,
    /// Key hashes of `pending` (a false match only commits early).
    pending_keys: HashSet<u64>,
    spare_buffers: Vec<Vec<u8>>,
    candidates: Vec<EntryRef>,
    read_buf: Vec<u8>,
    /// The entries the current batch's reads will follow shortcuts to, read ahead in one round trip
    /// ([`Worker::read_ahead`]): each one's place in `ahead`, by the shortcut's pointer.
    ahead_slots: HashMap<u64, Slot>,
    ahead: Batch<'static>,
    /// The index walks of the current batch's uncached keys, made side by side ([`Worker::read_ahead`]), by the
    /// key's index hash. A write of a key of that hash removes its walk.
    walked: HashMap<u64, WalkAhead>,
    /// The keys of `walked`, one after another.
    walked_keys: Vec<u8>,
    /// Each candidate a walk made ahead found, with the place in `ahead` of its entry when that was read too.
    walked_candidates: Vec<(EntryRef, Option<Slot>)>,
    /// Round trips the walks made ahead took (bucket levels, and their entries' round trip).
    walk_ahead_round_trips: u32,
    /// Scratch of [`Worker::read_ahead`]: the hashes to walk, and what their walks found.
    walk_hashes: Vec<u64>,
    walk_found: Vec<(usize, EntryRef)>,
    /// After a failed round trip: the log must be claimed again before the next request.
    broken: bool,
    /// The cluster's ownership map (`None`: this node serves every key).
    ownership: Option<Arc<dyn Ownership>>,
    /// Sharing changes `(key, cell)` of an install that failed partway: the memory node may hold any of these keys
    /// in either state, so this worker serves none of them until an install brings each to what its map says.
    unsettled_sharing: Vec<(Vec<u8>, u64)>,
    /// The node's liveness lease (`None`: not part of a cluster).
    lease: Option<Arc<LeaseGate>>,
    /// Until when the requests of the current batch may wait for a lapsed lease to be renewed, set when the batch
    /// first meets it lapsed (`None`: not yet): one wait per batch at most, so a lease that stays lapsed delays a
    /// batch by [`LeaseGate::wait`], not each of its requests.
    lease_wait_until: Option<Instant>,
    stats: WorkerStats,
    occupancy: Occupancy,
    /// Key accesses of the current monitoring epoch (`None`: not kept).
    key_sketch: Option<KeySketch>,
}

/// Copies of the segments of a just-claimed log the memory node could not merge yet (its index had no room): their
/// entries were acknowledged, so reads find them here until they are merged. Oldest first, as `Worker::sealed`.
fn load_unmerged(
    ep: &mut Endpoint,
    data: &RegionInfo,
    log: &proto::LogOpened,
) -> Result<VecDeque<LocalSegment>, KnError> {
    let room = log.entry_room();
    let mut out = VecDeque::with_capacity(log.unmerged.len());
    for u in &log.unmerged {
        let entries_at = u.offset.checked_add(SEGMENT_HEADER_LEN as u64);
        let Some(entries_at) = entries_at.filter(|_| u.len <= room && u.first_seq > 0) else {
            return Err(KnError::Corrupt(format!(
                "the memory node named an unmerged segment of {} bytes at {:#x} from seq {} (segments hold {room})",
                u.len, u.offset, u.first_seq
            )));
        };
        let mut buf = vec![0u8; u.len as usize];
        ep.read(data.at(entries_at), &mut buf)?;
        let mut keys = SegmentKeys::new(buf.len());
        let (mut last_seq, mut has_deletes) = (u.first_seq - 1, false);
        // Past damage too, as the memory node's merge does: the entries after it are merged.
        let found = dinomo_log::segment::scan_through(&buf, log.log_id, u.first_seq, |at, e| {
            keys.insert(dinomo_log::key_hash(e.key), at as u32);
            last_seq = e.header.seq;
            has_deletes |= e.header.op == Op::Delete;
        });
        let valid = found.end;
        buf.truncate(valid);
        out.push_back(LocalSegment {
            offset: u.offset,
            capacity: valid,
            last_seq,
            flushed: valid,
            buf,
            keys,
            reserved: false,
            has_deletes,
        });
    }
    Ok(out)
}

/// The sequence number of a just-claimed log's oldest entry not merged yet.
fn first_unmerged_seq(log: &proto::LogOpened) -> u64 {
    log.unmerged
        .first()
        .map_or(log.next_seq, |u| u.first_seq.min(log.next_seq))
}

/// Claims the log of `thread` (the memory node merges what an earlier claim left first), checks that the limits
/// fit in the node's segments, and connects to the index.
fn claim_log(
    ep: &mut Endpoint,
    cfg: &KnConfig,
    thread: u32,
) -> Result<(proto::LogOpened, HashMode, RemoteIndex), KnError> {
    let log: proto::LogOpened = ep
        .call(
            proto::OPEN_LOG,
            &proto::OpenLog {
                node_id: cfg.node_id,
                thread,
            },
        )
        .map_err(refused)?;
    let hash_mode = HashMode::from_word(log.hash_mode)
        .ok_or_else(|| KnError::Corrupt(format!("unknown hash mode {:#x}", log.hash_mode)))?;
    // Sequence numbers start at 1 and must have room to grow.
    if log.next_seq == 0 || log.next_seq == u64::MAX {
        return Err(KnError::Corrupt(format!(
            "the memory node gave log {} the next sequence number {}",
            log.log_id, log.next_seq
        )));
    }
    let room = log.entry_room();
    let largest = entry_len(cfg.max_key_len, cfg.max_value_len) as u64;
    if largest > room {
        return Err(KnError::Config(format!(
            "max_key_len {} + max_value_len {} need {largest} bytes per log entry, but the memory node's log \
             segments hold {room}; lower the limits or format the pool with a larger segment size",
            cfg.max_key_len, cfg.max_value_len
        )));
    }
    // The index this log merges into: the shared one, or this node's own partition (shared-nothing layout).
    let remote = RemoteIndex::connect_at(ep, log.index_header)
        .map_err(|e| KnError::Corrupt(e.to_string()))?;
    Ok((log, hash_mode, remote))
}

fn refused(e: FabricError) -> KnError {
    match e {
        FabricError::Rpc(RpcError::Failed(why)) => KnError::Refused(why),
        FabricError::Rpc(RpcError::OutOfSpace(why)) => KnError::OutOfSpace(why),
        other => KnError::Fabric(other),
    }
}

/// The memory node's data region, with the key this connection's verbs present.
fn data_region(ep: &Endpoint) -> Result<RegionInfo, KnError> {
    ep.region(DATA_REGION)
        .cloned()
        .ok_or_else(|| KnError::Corrupt("the memory node has no data region".into()))
}

impl Worker {
    /// Connects, claims (and so recovers) this thread's log, and checks that the limits fit in a segment.
    pub(crate) fn start(
        cfg: Arc<KnConfig>,
        thread: u32,
        connector: Connector,
        ownership: Option<Arc<dyn Ownership>>,
        lease: Option<Arc<LeaseGate>>,
    ) -> Result<Worker, KnError> {
        let mut ep = connector.connect()?;
        let data = data_region(&ep)?;
        let (log, hash_mode, remote) = claim_log(&mut ep, &cfg, thread)?;
        let sealed = load_unmerged(&mut ep, &data, &log)?;
        let merged_seq = first_unmerged_seq(&log) - 1;
        let cache = Dac::new(cfg.cache.clone());
        Ok(Worker {
            thread,
            connector,
            ep,
            data,
            remote,
            hash_mode,
            next_seq: log.next_seq,
            merged_seq,
            log,
            cache,
            active: None,
            sealed,
            pending: Vec::new(),
            pending_keys: HashSet::new(),
            spare_buffers: Vec::new(),
            candidates: Vec::new(),
            read_buf: Vec::new(),
            ahead_slots: HashMap::new(),
            ahead: Batch::new(),
            walked: HashMap::new(),
            walked_keys: Vec::new(),
            walked_candidates: Vec::new(),
            walk_ahead_round_trips: 0,
            walk_hashes: Vec::new(),
            walk_found: Vec::new(),
            broken: false,
            ownership,
            unsettled_sharing: Vec::new(),
            lease,
            lease_wait_until: None,
            stats: WorkerStats::default(),
            occupancy: Occupancy::new(),
            key_sketch: cfg
                .key_stats
                .enabled
                .then(|| KeySketch::new(&cfg.key_stats)),
            cfg,
        })
    }

    /// The request loop: takes what is queued (up to `max_batch`), serves it, commits the writes with one WRITE,
    /// then acknowledges them.
    pub(crate) fn run(mut self, rx: Receiver<Request>) {
        let mut batch = Vec::with_capacity(self.cfg.max_batch);
        while let Ok(first) = rx.recv() {
            self.occupancy.begin_batch();
            // No clock read here: only a batch that meets the lease lapsed needs its deadline.
            self.lease_wait_until = None;
            batch.push(first);
            while batch.len() < self.cfg.max_batch {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let stop = self.serve_batch(&mut batch);
            self.occupancy.end_batch();
            if stop {
                self.seal_on_shutdown();
                return;
            }
        }
        self.flush();
        self.seal_on_shutdown();
    }

    /// Serves the requests of `batch` in order (it is left empty), commits their writes with one WRITE and then
    /// acknowledges them. True when one of them asked the worker to stop.
    fn serve_batch(&mut self, batch: &mut Vec<Request>) -> bool {
        // Ask for every key's cache entry at once, so that the memory loads of their lookups overlap; then read the
        // entries their shortcuts lead to in one round trip.
        if batch.len() > 1 {
            self.cache
                .prefetch(batch.iter().filter_map(|r| r.cmd.key()));
            self.read_ahead(batch.iter().filter_map(|r| r.cmd.read_key()));
        }
        let mut stop = false;
        for req in batch.drain(..) {
            if matches!(req.cmd, Command::Shutdown) {
                stop = true;
                let _ = req.reply.send(Ok(Reply::Applied(true)));
                continue;
            }
            self.serve(req);
        }
        // What was read ahead answers for this batch only: a lookup outside one walks afresh.
        self.forget_read_ahead();
        self.flush();
        self.merge_reserved_deletes();
        stop
    }

    fn serve(&mut self, req: Request) {
        let Request { cmd, reply } = req;
        // A transaction's part makes its own checks: it must reach its barrier whatever they find.
        let cmd = match cmd {
            Command::Txn(part) => return self.serve_txn(part, &reply),
            cmd => cmd,
        };
        // Counters and key tracking touch no data: they are answered whatever the lease says.
        let bookkeeping = matches!(
            cmd,
            Command::Stats | Command::EpochStats | Command::TrackKeys(_)
        );
        if !bookkeeping && !self.lease_open() {
            let _ = reply.send(Err(KnError::LeaseLapsed));
            return;
        }
        if let (Some(own), Some(key)) = (&self.ownership, cmd.key())
            && !own.owns(key)
        {
            self.stats.not_owner += 1;
            let _ = reply.send(Err(self.not_owner(cmd.into_data())));
            return;
        }
        if !self.unsettled_sharing.is_empty()
            && let Some(key) = cmd.key()
            && self.unsettled_sharing.iter().any(|(k, _)| k == key)
        {
            let _ = reply.send(Err(self.not_owner(cmd.into_data())));
            return;
        }
        // The key's hash, once: the access statistics, the conflict check and the log all use it.
        let hash = cmd.key().map(dinomo_log::key_hash);
        // A key over the limit is refused below; the sketch must not keep a copy of it.
        if let (Some(sketch), Some(key), Some(h)) = (&mut self.key_sketch, cmd.key(), hash)
            && key.len() <= self.cfg.max_key_len
        {
            sketch.record_hashed(crate::hotkeys::sketch_hash_of(h), key);
        }
        if self.broken
            && let Err(e) = self.reclaim()
        {
            let _ = reply.send(Err(e));
            return;
        }
        // A request on a key with a write in flight waits for that write's commit, so it sees (and orders after)
        // an acknowledged value only.
        let conflicts = hash.is_some_and(|h| self.has_pending_write(h));
        if (conflicts || matches!(cmd, Command::MergeAll | Command::Own(_)))
            && let Err(e) = self.commit_pending()
        {
            let _ = reply.send(Err(e));
            return;
        }
        let result = match cmd {
            Command::Data(op) => return self.data(op, hash.unwrap_or_default(), reply),
            Command::MergeAll => self.merge_all().map(|_| Reply::Applied(true)),
            Command::Own(own) => self.install_ownership(own).map(|_| Reply::Applied(true)),
            Command::Stats => Ok(Reply::Stats(Box::new(self.snapshot()))),
            Command::EpochStats => Ok(Reply::Epoch(Box::new(self.take_epoch()))),
            Command::TrackKeys(keys) => {
                if let Some(sketch) = &mut self.key_sketch {
                    sketch.track(&keys);
                }
                Ok(Reply::Applied(true))
            }
            Command::Shutdown => Ok(Reply::Applied(true)),
            Command::Txn(_) => unreachable!("served above"),
        };
        let _ = reply.send(result);
    }

    /// Serves this worker's part of a transaction: says at the barrier whether it may run, and runs it only if
    /// every part may. Each operation is answered to `reply`'s destination with its own tag.
    fn serve_txn(&mut self, part: crate::txn::TxnPart, reply: &Responder) {
        let crate::txn::TxnPart { barrier, ops } = part;
        let verdict = self.txn_verdict(&ops);
        let answer = |tag: u64| Responder {
            tag,
            to: reply.to.clone(),
        };
        if let Err(abort) = barrier.arrive(verdict) {
            let error = || match &abort {
                crate::txn::TxnAbort::Changed => KnError::TxnChanged,
                abort => KnError::TxnAborted(abort.to_string()),
            };
            for (tag, _) in ops {
                let _ = answer(tag).send(Err(error()));
            }
            return;
        }
        for (tag, op) in ops {
            let hash = dinomo_log::key_hash(op.key());
            // As for a request of its own: an operation on a key with a write in flight waits for its commit.
            if self.has_pending_write(hash)
                && let Err(e) = self.commit_pending()
            {
                let _ = answer(tag).send(Err(e));
                continue;
            }
            self.data(op, hash, answer(tag));
        }
    }

    /// Whether this worker may run its part of a transaction: it serves now, owns every key of the part alone (a
    /// shared key's writes are seen by the other owners at once, outside the transaction), and every watched key
    /// of the part still has the value it had ([`DataOp::Unchanged`]).
    fn txn_verdict(&mut self, ops: &[(u64, DataOp)]) -> Result<(), crate::txn::TxnAbort> {
        use crate::txn::TxnAbort::{Changed, Refused};
        self.txn_may_run(ops).map_err(Refused)?;
        for (_, op) in ops {
            if let DataOp::Unchanged(key, digest) = op {
                let current = self
                    .read_for_write(key)
                    .map_err(|e| Refused(e.to_string()))?;
                if dinomo_value::digest(current.as_deref()) != *digest {
                    return Err(Changed);
                }
            }
        }
        Ok(())
    }

    /// Whether this worker serves now and owns every key of `ops` alone; why not.
    fn txn_may_run(&mut self, ops: &[(u64, DataOp)]) -> Result<(), String> {
        if !self.lease_open() {
            return Err(KnError::LeaseLapsed.to_string());
        }
        if self.broken
            && let Err(e) = self.reclaim()
        {
            return Err(e.to_string());
        }
        for (_, op) in ops {
            let key = op.key();
            if let Some(own) = &self.ownership {
                if !own.owns(key) {
                    self.stats.not_owner += 1;
                    return Err(format!(
                        "a key of the transaction is not this node's (ownership epoch {}); retry",
                        own.epoch()
                    ));
                }
                if own.cell(key).is_some() {
                    return Err(
                        "a key of the transaction is shared by several KV nodes (replicated for load)".into(),
                    );
                }
            }
            if self.unsettled_sharing.iter().any(|(k, _)| k == key) {
                return Err(
                    "a key of the transaction is being shared by several KV nodes; retry".into(),
                );
            }
        }
        Ok(())
    }

    /// The refusal of an operation on a key this node does not own (now): the data operation, if there is one to
    /// hand back, goes back untouched.
    fn not_owner(&self, refused: Option<DataOp>) -> KnError {
        KnError::NotOwner {
            epoch: self.ownership.as_ref().map_or(0, |o| o.epoch()),
            refused: refused.map(Box::new),
        }
    }

    /// Whether the node's lease lets it serve now; a lapsed lease is waited for until this batch's wait ends.
    fn lease_open(&mut self) -> bool {
        let Some(lease) = &self.lease else {
            return true;
        };
        if lease.is_open() {
            return true;
        }
        let until = *self
            .lease_wait_until
            .get_or_insert_with(|| crate::deadline_after(lease.wait()));
        let served = lease.wait_open(until);
        if served {
            self.stats.lease_waits_served += 1;
        } else {
            self.stats.lease_refusals += 1;
        }
        served
    }

    /// Serves a data operation. Reads are answered now; a write is appended to the log and answered after its
    /// group commit.
    fn data(&mut self, op: DataOp, hash: u64, reply: Responder) {
        self.stats.ops.count(&op);
        if let Some(cell) = self.ownership.as_ref().and_then(|o| o.cell(op.key())) {
            let result = self.shared(op, hash, cell);
            let _ = reply.send(result);
            return;
        }
        let result = match op {
            DataOp::Get(key) => self
                .check_key(&key)
                .and_then(|_| self.lookup(&key))
                .map(Reply::Value),
            DataOp::Exists(key) => self
                .check_key(&key)
                .and_then(|_| self.lookup_with(&key, <[u8]>::len))
                .map(|len| Reply::Applied(len.is_some())),
            DataOp::Strlen(key) => self
                .check_key(&key)
                .and_then(|_| self.lookup_with(&key, <[u8]>::len))
                .map(|len| Reply::Int(len.unwrap_or(0) as i64)),
            DataOp::Set(key, value) => {
                return self.write(key, hash, Some(value), reply, Reply::Applied(true));
            }
            // Read-modify-writes: the current value decides what is written and answered.
            op => match self.read_for_write(op.key()) {
                Ok(current) => match outcome(op, current, self.cfg.max_value_len) {
                    (key, Outcome::Write(value, ack)) => {
                        return self.write(key, hash, value, reply, ack);
                    }
                    (_, Outcome::Done(r)) => r,
                },
                Err(e) => Err(e),
            },
        };
        // A read answers for the moment it ends. A lease that lapsed meanwhile (an index walk's round trips, a
        // stalled thread) may have let the key go to a new owner, which may have written it since: as for a group
        // commit, the lease must be renewed first, else the read is refused, nothing applied.
        let result = if self.lease_open() {
            result
        } else {
            Err(KnError::LeaseLapsed)
        };
        let _ = reply.send(result);
    }

    /// Whether a write of the key hashed `hash` waits for its group commit.
    fn has_pending_write(&self, hash: u64) -> bool {
        !self.pending_keys.is_empty() && self.pending_keys.contains(&hash)
    }

    /// Commits the writes waiting for their group commit, and claims the log again if a commit failed.
    fn commit_pending(&mut self) -> Result<(), KnError> {
        self.flush();
        if self.broken {
            self.reclaim()?;
        }
        Ok(())
    }

    /// The current value of `key` for a read-modify-write.
    fn read_for_write(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, KnError> {
        self.check_key(key)?;
        self.lookup(key)
    }

    /// Serves under `own` from now on. Keys this node no longer owns leave its cache, and when its unmerged log
    /// holds writes of such keys the memory node merges the log first, so their new owner finds them in the index.
    fn install_ownership(&mut self, own: Arc<dyn Ownership>) -> Result<(), KnError> {
        self.commit_pending()?;
        self.change_sharing(&*own)?;
        self.forget_read_ahead();
        // Shared keys are never cached: their cell is read on every access.
        let dropped = self.cache.retain(|k| own.owns(k) && own.cell(k).is_none());
        let moved = self.segments().any(|seg| {
            seg.keys
                .offsets()
                .any(|at| EntryView::parse(&seg.buf[at as usize..]).is_ok_and(|e| !own.owns(e.key)))
        });
        debug!(
            thread = self.thread,
            epoch = own.epoch(),
            dropped,
            moved,
            "new ownership map"
        );
        self.ownership = Some(own);
        if moved {
            if self.broken {
                // Claiming the log again merges all of it.
                self.reclaim()?;
            } else {
                self.merge_all()?;
            }
        }
        Ok(())
    }

    /// Keys of this thread that stop or start being shared under `own` while this node is their only owner on one
    /// side of the change: when a key becomes shared, its former sole owner moves its value into the cell; when it
    /// stops, its new sole owner moves the value back into the index (every other owner merged its log first).
    ///
    /// Both calls are idempotent at the memory node, so the changes of an earlier install that failed partway
    /// (including one whose call took effect but whose reply was lost) are settled here by bringing each such key
    /// to the state `own` gives it, whatever the previous map said. If a call fails, every change of this install
    /// stays unsettled and its keys are refused until a later install succeeds.
    fn change_sharing(&mut self, own: &dyn Ownership) -> Result<(), KnError> {
        let Some(old) = self.ownership.clone() else {
            return Ok(());
        };
        let changes = sharing_changes(&*old, own, &self.unsettled_sharing, |k: &[u8]| {
            crate::node::thread_for_key(k, self.cfg.threads) == self.thread as usize
        });
        for (key, method, cell) in &changes {
            let sealed_len = self.active.as_ref().map(|a| a.buf.len() as u64);
            let result = self.ep.call::<_, proto::Merged>(
                *method,
                &proto::ShareKey {
                    log_id: self.log.log_id,
                    session: self.log.session,
                    sealed_len,
                    cell: *cell,
                    key: key.clone(),
                },
            );
            match result {
                Ok(merged) => {
                    self.seal_active();
                    self.note_merged(merged.merged_seq);
                }
                Err(e) => {
                    warn!(
                        thread = self.thread,
                        epoch = own.epoch(),
                        error = %e,
                        "a sharing change failed; its keys wait for the next install"
                    );
                    self.unsettled_sharing = changes
                        .into_iter()
                        .map(|(key, _, cell)| (key, cell))
                        .collect();
                    return Err(self.fail_rpc(e));
                }
            }
        }
        self.unsettled_sharing.clear();
        Ok(())
    }

    /// Serves an operation on a shared key through its cell: a read is one READ of the cell and one of the entry;
    /// a write appends an entry to this thread's log, commits it, and CASes the cell from the reference it read to
    /// the new entry (a delete CASes it to 0), retrying from the read when another owner got there first.
    fn shared(&mut self, op: DataOp, hash: u64, cell: u64) -> Result<Reply, KnError> {
        self.stats.shared_ops += 1;
        self.check_key(op.key())?;
        // Pending writes of other keys are committed first, so this thread's log stays in order.
        self.commit_pending()?;
        let attempts = self.cfg.shared_cas_attempts.max(1);
        for _ in 0..attempts {
            let (seen, current) = match self.read_cell(op.key(), cell, needs_value(&op)) {
                Ok(read) => read,
                // No attempt's CAS won, so nothing of the operation was applied: it goes back whole.
                Err(KnError::NotOwner { .. }) => {
                    return Err(self.not_owner(Some(op)));
                }
                Err(e) => return Err(e),
            };
            let (new_value, reply) = match outcome(op.clone(), current, self.cfg.max_value_len).1 {
                Outcome::Done(r) => return r,
                Outcome::Write(v, r) => (v, r),
            };
            let new_ref = match &new_value {
                Some(v) => {
                    if v.len() > self.cfg.max_value_len {
                        return Err(KnError::ValueTooLarge {
                            len: v.len(),
                            max: self.cfg.max_value_len,
                        });
                    }
                    let (entry, _) = self.append(Op::Put, op.key(), hash, v)?;
                    self.write_through()?;
                    entry.raw()
                }
                None => 0,
            };
            if !self.lease_open() {
                return Err(KnError::Fenced);
            }
            let prev = self
                .ep
                .cas(self.data.at(cell), seen, new_ref)
                .map_err(|e| self.fail(e))?;
            if prev == seen {
                // As for a group commit: a lease that lapsed while the CAS was on its way may have let the key be
                // taken over (and this log merged) before the CAS landed, so whether it counts is unknown.
                if !self.lease_open() {
                    return Err(KnError::Fenced);
                }
                self.stats.writes += 1;
                return Ok(reply);
            }
            self.stats.shared_cas_retries += 1;
        }
        Err(KnError::Contended { attempts })
    }

    /// The cell word of a shared key and the value it points to (only whether there is one unless `value`: an
    /// empty placeholder then stands for a present value, saving the READ of the entry).
    ///
    /// An entry that is not a put of the key may have been the cell's: another owner's CAS can move the cell on
    /// between the two READs, and the entry it left be superseded, its segment recycled and written again. The cell
    /// is read again then; only a cell that still names such an entry is damage.
    fn read_cell(
        &mut self,
        key: &[u8],
        cell: u64,
        value: bool,
    ) -> Result<(u64, Option<Vec<u8>>), KnError> {
        const READS: u32 = 3;
        let mut previous = None;
        for _ in 0..READS {
            let mut word = [0u8; 8];
            self.ep
                .read(self.data.at(cell), &mut word)
                .map_err(|e| self.fail(e))?;
            let seen = u64::from_le_bytes(word);
            if seen == dinomo_dpm::cells::RETIRED {
                // The key went back to one owner; this node's routing table is older than that.
                return Err(self.not_owner(None));
            }
            let Some(r) = EntryRef::from_raw(seen) else {
                return Ok((seen, None));
            };
            if !value {
                return Ok((seen, Some(Vec::new())));
            }
            self.read_entry(r)?;
            if let Ok(e) = EntryView::parse(&self.read_buf)
                && e.key == key
                && e.header.op == Op::Put
            {
                return Ok((seen, Some(e.value.to_vec())));
            }
            if previous == Some(seen) {
                break;
            }
            self.stats.cell_rereads += 1;
            previous = Some(seen);
        }
        Err(KnError::Corrupt(format!(
            "the cell at {cell:#x} does not point to an entry of its key"
        )))
    }

    /// WRITEs what the active segment holds beyond what was written (no pending writes: they were flushed).
    fn write_through(&mut self) -> Result<(), KnError> {
        let Some(seg) = self.active.as_mut() else {
            return Ok(());
        };
        if seg.flushed == seg.buf.len() {
            return Ok(());
        }
        let addr = self.data.at(seg.entries_offset() + seg.flushed as u64);
        match self.ep.write(addr, &seg.buf[seg.flushed..]) {
            Ok(()) => {
                seg.flushed = seg.buf.len();
                self.stats.commits += 1;
                Ok(())
            }
            Err(e) => {
                self.broken = true;
                Err(KnError::Fabric(e))
            }
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<(), KnError> {
        if key.len() > self.cfg.max_key_len {
            return Err(KnError::KeyTooLarge {
                len: key.len(),
                max: self.cfg.max_key_len,
            });
        }
        Ok(())
    }

    fn snapshot(&mut self) -> WorkerStats {
        let mut s = self.stats.clone();
        s.unmerged_bytes = self
            .segments()
            .map(|seg| (seg.buf.capacity() + seg.keys.heap_bytes()) as u64)
            .sum();
        s.unmerged_keys = self.segments().map(|seg| seg.keys.len() as u64).sum();
        let c = counters::thread_snapshot();
        s.round_trips = c.round_trips;
        s.bytes_out = c.bytes_out;
        s.bytes_in = c.bytes_in;
        s.cache = self.cache.stats();
        s.miss_cost = self.cache.miss_cost();
        (s.busy_ns, s.wall_ns) = self.occupancy.totals();
        s
    }

    /// The statistics of the monitoring epoch that ends now; the next one starts.
    fn take_epoch(&mut self) -> EpochStats {
        let (busy_ns, wall_ns) = self.occupancy.take_epoch();
        EpochStats {
            busy_ns,
            wall_ns,
            keys: self.key_sketch.as_mut().map(KeySketch::take),
        }
    }

    // ---------------------------------------------------------------------------------------------------------
    // Reads

    /// The value of `key`, through the cache, the unmerged log and the index, in that order.
    fn lookup(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, KnError> {
        self.lookup_with(key, <[u8]>::to_vec)
    }

    /// Looks `key` up like [`Self::lookup`], answering with `of` of its value: a probe (`EXISTS`, `STRLEN`) copies
    /// no value that is cached here.
    fn lookup_with<T>(
        &mut self,
        key: &[u8],
        of: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, KnError> {
        self.stats.lookups += 1;
        match self.cache.lookup(key) {
            Lookup::Value { value, .. } => {
                self.stats.value_hits += 1;
                return Ok(Some(of(value)));
            }
            Lookup::Absent => {
                self.stats.absent_hits += 1;
                return Ok(None);
            }
            Lookup::Shortcut(sc) => {
                if let Some(value) = self.read_shortcut(key, sc)? {
                    self.stats.shortcut_hits += 1;
                    return Ok(Some(of(&value)));
                }
                self.stats.stale_shortcuts += 1;
                self.cache.stale_shortcut(key);
            }
            Lookup::Miss => {}
        }
        if let Some(found) = self.unmerged_lookup(key) {
            self.stats.log_hits += 1;
            return Ok(found.map(|v| of(&v)));
        }
        Ok(self.index_walk(key)?.map(|v| of(&v)))
    }

    /// Reads ahead what the lookups of `keys` (the keys whose values the batch's operations read: reads and
    /// read-modify-writes) will need, so that they do not make a round trip each:
    /// - the index walks of the keys not cached at all, side by side: one round trip per bucket level for all of
    ///   them ([`RemoteIndex::candidates_of_many`]);
    /// - then, in one round trip, the entries those walks found and the entries the cached shortcuts lead to.
    ///
    /// This answers exactly as a lookup made at its turn would: only this thread writes its keys, and a write since
    /// changes the key's cached shortcut (an entry read ahead is checked against its key and sequence number when
    /// used, as a READ made then would be) and removes its walk (`append`); a change of ownership or a failed round
    /// trip drops all of it, as it drops the cache. Where round trips cost nothing (in process) nothing is read
    /// ahead.
    fn read_ahead<'k>(&mut self, keys: impl Iterator<Item = &'k [u8]>) {
        // Nothing is left from an earlier batch: `serve_batch` forgets it all when the batch is served.
        if self.broken || self.cfg.read_ahead_bytes == 0 || self.ep.round_trips_are_free() {
            return;
        }
        self.ahead.clear();
        let room = self.log.entry_room();
        // Within the memory node's message limit too, so that no batch is refused whole.
        let budget = self
            .cfg
            .read_ahead_bytes
            .min(u64::from(self.ep.max_message_len()) / 2);
        let mut bytes = 0u64;
        let mut hashes = std::mem::take(&mut self.walk_hashes);
        hashes.clear();
        for key in keys {
            if let Some(sc) = self.cache.peek_shortcut(key) {
                let Some(r) = EntryRef::from_raw(sc.ptr) else {
                    continue;
                };
                if r.len() > room || bytes + r.len() > budget {
                    continue;
                }
                // Keys shared through a cell never have a cached shortcut, and keys not owned are refused before
                // their lookup: neither uses what is read here.
                if let std::collections::hash_map::Entry::Vacant(v) = self.ahead_slots.entry(sc.ptr)
                {
                    bytes += r.len();
                    v.insert(self.ahead.read(self.data.at(r.offset()), r.len() as u32));
                }
            } else if bytes + BUCKET_LEN + key.len() as u64 <= budget && self.walks_index(key) {
                // One walk per hash: a second key of the hash walks at its lookup. The copy of the key kept for
                // the walk counts against the budget too, so that the worker's buffers stay within it.
                let hash = self.hash_mode.hash(key);
                if let std::collections::hash_map::Entry::Vacant(v) = self.walked.entry(hash) {
                    let at = self.walked_keys.len();
                    self.walked_keys.extend_from_slice(key);
                    v.insert(WalkAhead {
                        key: at..self.walked_keys.len(),
                        candidates: 0..0,
                    });
                    bytes += BUCKET_LEN + key.len() as u64;
                    hashes.push(hash);
                }
            }
        }
        // A walk alone with nothing to read beside its entry gains no round trip.
        if hashes.len() == 1 && self.ahead_slots.is_empty() {
            hashes.clear();
            self.forget_walks();
        }
        if !hashes.is_empty() {
            self.walk_ahead(&hashes, room, budget, &mut bytes);
        }
        self.walk_hashes = hashes;
        if self.broken {
            self.forget_read_ahead();
            return;
        }
        // One entry alone gains no round trip either: its lookup reads it.
        if self.ahead.len() < 2 {
            self.ahead_slots.clear();
            for c in &mut self.walked_candidates {
                c.1 = None;
            }
            return;
        }
        let walk_entries = self.walked_candidates.iter().any(|c| c.1.is_some());
        match self.ep.post(&mut self.ahead) {
            Ok(()) => {
                self.stats.entries_read_ahead += self.ahead_slots.len() as u64;
                if walk_entries {
                    self.walk_ahead_round_trips += 1;
                    self.stats.index_walk_round_trips += 1;
                }
            }
            Err(e) => {
                self.forget_read_ahead();
                // Handled as any failed round trip (a lost connection has the log claimed again before the
                // batch's requests are served; a revocation stops the node); a refused READ is left to the lookup
                // that would have made it.
                let _ = self.fail(e);
            }
        }
    }

    /// Whether the lookup of `key` would walk the index: the key is not cached, is not in this thread's unmerged
    /// log, and is an owned, unshared key this worker serves.
    fn walks_index(&self, key: &[u8]) -> bool {
        if key.len() > self.cfg.max_key_len || self.cache.contains(key).is_some() {
            return false;
        }
        if let Some(own) = &self.ownership
            && (!own.owns(key) || own.cell(key).is_some())
        {
            return false;
        }
        let hash = dinomo_log::key_hash(key);
        !self
            .segments()
            .any(|seg| seg.keys.find(hash, key, &seg.buf).is_some())
    }

    /// Walks the index for `hashes` side by side, keeps each walk's candidates in `walked`, and adds their entries
    /// to `ahead` while `bytes` stays within `budget`. A walk that fails leaves every lookup to walk itself.
    fn walk_ahead(&mut self, hashes: &[u64], room: u64, budget: u64, bytes: &mut u64) {
        let before = counters::thread_snapshot().round_trips;
        let mut found = std::mem::take(&mut self.walk_found);
        let walked = self
            .remote
            .candidates_of_many(&mut self.ep, hashes, &mut found);
        let rts = counters::thread_snapshot().round_trips - before;
        self.stats.index_walk_round_trips += rts;
        match walked {
            Ok(()) => {
                self.walk_ahead_round_trips = rts as u32;
                self.stats.index_walks_ahead += hashes.len() as u64;
                // `found` lists each hash's candidates together, in the order of `hashes`.
                let mut at = 0;
                for (i, &hash) in hashes.iter().enumerate() {
                    let start = self.walked_candidates.len();
                    while let Some(&(j, r)) = found.get(at)
                        && j == i
                    {
                        at += 1;
                        let slot = (r.len() <= room && *bytes + r.len() <= budget).then(|| {
                            *bytes += r.len();
                            self.ahead.read(self.data.at(r.offset()), r.len() as u32)
                        });
                        self.walked_candidates.push((r, slot));
                    }
                    let end = self.walked_candidates.len();
                    if let Some(walk) = self.walked.get_mut(&hash) {
                        walk.candidates = start..end;
                    }
                }
            }
            Err(e) => {
                self.forget_walks();
                // A lost connection is handled as any; damage is left to the lookups, which report it.
                if let dinomo_index::RemoteIndexError::Fabric(e) = e {
                    let _ = self.fail(e);
                }
            }
        }
        self.walk_found = found;
    }

    /// Drops what was read ahead.
    fn forget_read_ahead(&mut self) {
        self.ahead_slots.clear();
        self.forget_walks();
    }

    /// Drops the walks made ahead.
    fn forget_walks(&mut self) {
        self.walked.clear();
        self.walked_keys.clear();
        self.walked_candidates.clear();
        self.walk_ahead_round_trips = 0;
    }

    /// The bytes of the entry `r`: those read ahead into `slot`, or READ now into `read_buf`.
    fn entry_bytes(&mut self, r: EntryRef, slot: Option<Slot>) -> Result<&[u8], KnError> {
        match slot {
            Some(slot) => Ok(self.ahead.read_data(slot)),
            None => {
                self.read_entry(r)?;
                Ok(&self.read_buf)
            }
        }
    }

    /// Follows a shortcut with one READ (none when the batch read its entry ahead); `None` when the entry there is no
    /// longer this key's.
    fn read_shortcut(&mut self, key: &[u8], sc: Shortcut) -> Result<Option<Vec<u8>>, KnError> {
        let Some(r) = EntryRef::from_raw(sc.ptr) else {
            return Ok(None);
        };
        let slot = self.ahead_slots.remove(&sc.ptr);
        let value = match EntryView::parse(self.entry_bytes(r, slot)?) {
            Ok(e) if e.key == key && e.header.seq == sc.seq && e.header.op == Op::Put => {
                e.value.to_vec()
            }
            _ => return Ok(None),
        };
        self.cache.shortcut_hit(key, &value, sc);
        Ok(Some(value))
    }

    /// READs the entry `r` into `read_buf`.
    fn read_entry(&mut self, r: EntryRef) -> Result<(), KnError> {
        // No entry spans segments: a longer reference is damage, and must not size the buffer.
        let room = self.log.entry_room();
        if r.len() > room {
            return Err(KnError::Corrupt(format!(
                "an index reference names a {}-byte entry at {:#x}, longer than a log segment's {room} bytes",
                r.len(),
                r.offset()
            )));
        }
        self.read_buf.resize(r.len() as usize, 0);
        self.ep
            .read(self.data.at(r.offset()), &mut self.read_buf)
            .map_err(|e| self.fail(e))
    }

    /// Local segment copies, newest first.
    fn segments(&self) -> impl Iterator<Item = &LocalSegment> {
        self.active.iter().chain(self.sealed.iter().rev())
    }

    /// The newest unmerged write of `key` by this thread: `Some(None)` for a delete.
    fn unmerged_lookup(&mut self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let hash = dinomo_log::key_hash(key);
        let (seg, at) = self
            .segments()
            .find_map(|seg| seg.keys.find(hash, key, &seg.buf).map(|at| (seg, at)))?;
        let e = EntryView::parse(&seg.buf[at as usize..])
            .expect("local segment copies hold valid entries");
        let found = match e.header.op {
            Op::Put => Some(e.value.to_vec()),
            Op::Delete => None,
        };
        let r =
            EntryRef::new(seg.entries_offset() + at as u64, e.len() as u64).expect("aligned entry");
        let seq = e.header.seq;
        if let Some(v) = &found {
            self.cache.fill(key, v, Shortcut { ptr: r.raw(), seq });
        }
        Some(found)
    }

    /// Finds `key` in the memory node's index and fills the cache.
    fn index_walk(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, KnError> {
        self.stats.index_walks += 1;
        let before = counters::thread_snapshot().round_trips;
        let hash = self.hash_mode.hash(key);
        let mut cands = std::mem::take(&mut self.candidates);
        // A candidate whose entry does not parse, or is not of a key of this hash, was either replaced since the
        // bucket was read (its segment recycled and written again) or is damaged: another walk tells which.
        const WALKS: u32 = 3;
        // An answer of "none" that skipped another key's put stands once two walks in a row find the same
        // candidates: the skipped entries are still indexed, so they are their own keys' slots.
        const WALKS_TO_CONFIRM: u32 = 8;
        let mut unreadable: Option<EntryRef> = None;
        let mut unconfirmed: Option<Vec<EntryRef>> = None;
        let mut walks = 0;
        // The walk made ahead of the batch for this key, if any, stands for the first one.
        let mut walked_ahead = match self.walked.get(&hash) {
            Some(walk) if self.walked_keys[walk.key.clone()] == *key => {
                self.walked.remove(&hash).map(|walk| walk.candidates)
            }
            _ => None,
        };
        let ahead_rts = if walked_ahead.is_some() {
            self.walk_ahead_round_trips
        } else {
            0
        };
        let result = loop {
            walks += 1;
            let found = if let Some(range) = walked_ahead.take() {
                cands.clear();
                cands.extend(self.walked_candidates[range.clone()].iter().map(|c| c.0));
                self.first_matching(key, hash, &cands, Some(range.start))
            } else {
                match self.remote.candidates(&mut self.ep, hash, &mut cands) {
                    Err(dinomo_index::RemoteIndexError::Fabric(e)) => Err(self.fail(e)),
                    Err(e) => Err(KnError::Corrupt(e.to_string())),
                    Ok(()) => self.first_matching(key, hash, &cands, None),
                }
            };
            match found {
                Ok(Candidate::Unreadable(r, e)) => match unreadable {
                    Some(earlier) if earlier == r || walks == WALKS => {
                        break Err(KnError::Corrupt(format!(
                            "the index names the entry at {:#x} ({} bytes) for this key, and {e}",
                            r.offset(),
                            r.len()
                        )));
                    }
                    _ => {
                        self.stats.index_rewalks += 1;
                        unreadable = Some(r);
                    }
                },
                Ok(Candidate::Found(value, sc)) => break Ok(Some((value, sc))),
                Ok(Candidate::None { skipped: false }) => break Ok(None),
                Ok(Candidate::None { skipped: true }) => {
                    if unconfirmed.as_deref() == Some(&cands[..]) {
                        break Ok(None);
                    }
                    if walks >= WALKS_TO_CONFIRM {
                        break Err(KnError::Contended { attempts: walks });
                    }
                    self.stats.index_rewalks += 1;
                    unconfirmed = Some(cands.clone());
                }
                Err(e) => break Err(e),
            }
        };
        self.candidates = cands;
        let rts = counters::thread_snapshot().round_trips - before;
        self.stats.index_walk_round_trips += rts;
        // The cost of a miss is the round trips its answer waited for, those of its walk made ahead included.
        self.cache.record_miss_round_trips(rts as u32 + ahead_rts);
        match result? {
            Some((value, sc)) => {
                self.cache.fill(key, &value, sc);
                Ok(Some(value))
            }
            None => {
                // This thread is the key's only writer while it owns the key, so "none" stands until it writes the
                // key (or loses it, which drops its cache entries). Where a walk is a function call, the cache's
                // bookkeeping would cost more than the walk it saves.
                if !self.ep.round_trips_are_free() {
                    self.cache.fill_absent(key);
                }
                Ok(None)
            }
        }
    }

    /// The first of `cands` (the slots of `hash`, which is `key`'s) whose entry is a put of `key`. Stops at the first
    /// entry that is not a put of a key of this hash: it may have been this key's, its slot moved since the bucket
    /// was read (the cleaner moves slots to copies, and recycles the segments it empties) and its bytes written
    /// again by another log, so skipping it could serve an older value or none. Entries that do not parse stop it
    /// for the same reason. A put of another key of this hash is skipped as that key's own slot, and the answer
    /// "none" then says so: written again by another log, it could have been this key's slot too.
    ///
    /// The candidates of a walk made ahead are `walked_candidates[ahead..]`, with the entries read ahead for them.
    fn first_matching(
        &mut self,
        key: &[u8],
        hash: u64,
        cands: &[EntryRef],
        ahead: Option<usize>,
    ) -> Result<Candidate, KnError> {
        let mut skipped = false;
        let hash_mode = self.hash_mode;
        for (i, &r) in cands.iter().enumerate() {
            let slot = ahead
                .and_then(|start| self.walked_candidates.get(start + i))
                .and_then(|c| c.1);
            match EntryView::parse(self.entry_bytes(r, slot)?) {
                Ok(e) if e.key == key && e.header.op == Op::Put => {
                    return Ok(Candidate::Found(
                        e.value.to_vec(),
                        Shortcut {
                            ptr: r.raw(),
                            seq: e.header.seq,
                        },
                    ));
                }
                // Another key whose hash is this one's: most likely its own slot.
                Ok(e)
                    if e.header.op == Op::Put
                        && stored_hash(hash_mode.hash(e.key)) == stored_hash(hash) =>
                {
                    skipped = true;
                }
                Ok(e) => {
                    return Ok(Candidate::Unreadable(
                        r,
                        format!(
                            "it holds a {} of another key",
                            match e.header.op {
                                Op::Put => "put",
                                Op::Delete => "delete",
                            }
                        ),
                    ));
                }
                Err(e) => return Ok(Candidate::Unreadable(r, format!("it fails its check: {e}"))),
            }
        }
        Ok(Candidate::None { skipped })
    }

    // ---------------------------------------------------------------------------------------------------------
    // Writes

    /// Appends a put (`value` Some) or delete of `key` (whose [`dinomo_log::key_hash`] is `hash`) to the log; the
    /// reply goes out after the group commit.
    fn write(
        &mut self,
        key: Vec<u8>,
        hash: u64,
        value: Option<Vec<u8>>,
        reply: Responder,
        ack: Reply,
    ) {
        if let Err(e) = self.check_key(&key) {
            let _ = reply.send(Err(e));
            return;
        }
        if let Some(v) = &value
            && v.len() > self.cfg.max_value_len
        {
            let _ = reply.send(Err(KnError::ValueTooLarge {
                len: v.len(),
                max: self.cfg.max_value_len,
            }));
            return;
        }
        let op = if value.is_some() { Op::Put } else { Op::Delete };
        let (entry, seq) = match self.append(op, &key, hash, value.as_deref().unwrap_or(&[])) {
            Ok(x) => x,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        self.pending_keys.insert(hash);
        self.pending.push(PendingWrite {
            key,
            value,
            entry,
            seq,
            ack,
            reply,
        });
    }

    /// Encodes an entry into the active segment (rolling to a new segment when it is full); `hash` is the key's
    /// [`dinomo_log::key_hash`].
    fn append(
        &mut self,
        op: Op,
        key: &[u8],
        hash: u64,
        value: &[u8],
    ) -> Result<(EntryRef, u64), KnError> {
        // A walk made ahead of the batch no longer answers for this key (nor for the others of its hash).
        if !self.walked.is_empty() {
            self.walked.remove(&self.hash_mode.hash(key));
        }
        let len = entry_len(key.len(), value.len());
        let deletes_only = op == Op::Delete;
        let fits = self
            .active
            .as_ref()
            .is_some_and(|a| a.buf.len() + len <= a.capacity && (deletes_only || !a.reserved));
        if !fits {
            self.roll(deletes_only)?;
        }
        let seq = self.next_seq;
        let seg = self
            .active
            .as_mut()
            .expect("roll installs an active segment");
        let at = seg.buf.len();
        encode_entry(&mut seg.buf, op, self.log.log_id, seq, key, value);
        seg.last_seq = seq;
        seg.has_deletes |= deletes_only;
        self.next_seq += 1;
        // Granted segments are aligned (`check_grant`) and entries are no longer than `KnConfig::validate` allows.
        let r = EntryRef::new(seg.entries_offset() + at as u64, len as u64).expect("aligned entry");
        seg.keys.insert(hash, at as u32);
        Ok((r, seq))
    }

    /// Seals the active segment and starts a new one, first waiting while too many sealed segments are unmerged.
    /// `deletes_only`: the entry that needs the room is a delete, which may use the delete reserve of a full pool.
    fn roll(&mut self, deletes_only: bool) -> Result<(), KnError> {
        self.flush();
        if self.broken {
            return Err(KnError::Refused(
                "the previous group commit failed; retry".into(),
            ));
        }
        self.wait_for_merges(self.cfg.max_unmerged_segments.saturating_sub(1))?;
        let granted = match self.next_segment(deletes_only) {
            // Deletes in the active segment free space once merged, which needs the segment sealed: seal and merge
            // it, then ask once more. The active segment is gone either way, so this happens once per segment.
            Err(KnError::OutOfSpace(_)) if self.active.as_ref().is_some_and(|a| a.has_deletes) => {
                self.merge_all()?;
                self.next_segment(deletes_only)?
            }
            other => other?,
        };
        self.seal_active();
        let capacity = self.check_grant(&granted)?;
        let mut buf = self.spare_buffers.pop().unwrap_or_default();
        buf.clear();
        buf.reserve_exact(capacity);
        self.active = Some(LocalSegment {
            offset: granted.offset,
            capacity,
            last_seq: self.next_seq - 1,
            buf,
            flushed: 0,
            keys: SegmentKeys::new(capacity),
            reserved: granted.reserved,
            has_deletes: false,
        });
        self.note_merged(granted.merged_seq);
        Ok(())
    }

    /// Asks the memory node to seal the active segment and grant the next one.
    fn next_segment(&mut self, deletes_only: bool) -> Result<proto::SegmentGranted, KnError> {
        let sealed_len = self.active.as_ref().map(|a| a.buf.len() as u64);
        self.ep
            .call(
                proto::NEXT_SEGMENT,
                &proto::NextSegment {
                    log_id: self.log.log_id,
                    session: self.log.session,
                    sealed_len,
                    first_seq: self.next_seq,
                    deletes_only,
                },
            )
            .map_err(|e| self.fail_rpc(e))
    }

    /// The entry bytes a granted segment holds, once the grant is known to be usable: 8-byte aligned, inside the
    /// data region, room for the largest entry, positions that fit the segment's key table.
    fn check_grant(&mut self, granted: &proto::SegmentGranted) -> Result<usize, KnError> {
        let largest = entry_len(self.cfg.max_key_len, self.cfg.max_value_len) as u64;
        let header = SEGMENT_HEADER_LEN as u64;
        let usable = granted.offset % 8 == 0
            && granted.offset >= self.data.start
            && granted
                .offset
                .checked_add(granted.capacity)
                .is_some_and(|end| end <= self.data.end())
            && granted.capacity >= header + largest
            && granted.capacity - header <= u64::from(u32::MAX);
        if !usable {
            // The memory node sealed the old segment and expects entries in this one: nothing can be written
            // safely, so this thread stops logging until it reconnects.
            self.broken = true;
            return Err(KnError::Corrupt(format!(
                "the memory node granted an unusable log segment ({} bytes at {:#x})",
                granted.capacity, granted.offset
            )));
        }
        Ok((granted.capacity - header) as usize)
    }

    /// Moves the active segment (which the memory node has just sealed) to the sealed ones.
    fn seal_active(&mut self) {
        if let Some(old) = self.active.take() {
            self.stats.segments_sealed += 1;
            self.sealed.push_back(old);
        }
    }

    /// Waits until at most `limit` sealed segments are unmerged.
    fn wait_for_merges(&mut self, limit: usize) -> Result<(), KnError> {
        if self.sealed.len() <= limit {
            return Ok(());
        }
        self.stats.merge_waits += 1;
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        let mut word = [0u8; 8];
        // Merges normally finish in microseconds to milliseconds; one that takes longer may be failing, so the
        // memory node is asked to merge now, which also says why it cannot.
        let mut ask_at = start + MERGE_ASK_AFTER;
        loop {
            self.ep
                .read(self.data.at(self.log.merged_seq_offset), &mut word)
                .map_err(|e| self.fail(e))?;
            self.note_merged(u64::from_le_bytes(word));
            if self.sealed.len() <= limit {
                return Ok(());
            }
            if start.elapsed() > self.cfg.merge_wait_timeout {
                return Err(KnError::MergeStalled(self.cfg.merge_wait_timeout));
            }
            if Instant::now() >= ask_at {
                ask_at = Instant::now() + MERGE_ASK_EVERY;
                let asked: Result<proto::Merged, _> = self.ep.call(
                    proto::MERGE_SEALED,
                    &proto::MergeSealed {
                        log_id: self.log.log_id,
                        session: self.log.session,
                    },
                );
                match asked.map_err(|e| self.fail_rpc(e)) {
                    Ok(merged) => self.note_merged(merged.merged_seq),
                    // The index has no room for a key this log holds: nothing merges until space is freed.
                    Err(e @ KnError::OutOfSpace(_)) => return Err(e),
                    Err(e) if self.broken => return Err(e),
                    Err(e) => debug!(thread = self.thread, error = %e, "asking for a merge failed"),
                }
                continue;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    /// Drops local copies of segments the memory node has merged: their keys are in the index now.
    fn note_merged(&mut self, merged_seq: u64) {
        self.merged_seq = self.merged_seq.max(merged_seq);
        while self
            .sealed
            .front()
            .is_some_and(|s| s.last_seq <= self.merged_seq)
        {
            let seg = self.sealed.pop_front().expect("checked");
            if self.spare_buffers.is_empty() {
                self.spare_buffers.push(seg.buf);
            }
        }
    }

    /// Group commit: one WRITE of everything appended since the last one, then the acknowledgements.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let result = match self.active.as_mut() {
            Some(seg) if seg.flushed < seg.buf.len() => {
                let addr = self.data.at(seg.entries_offset() + seg.flushed as u64);
                let r = self.ep.write(addr, &seg.buf[seg.flushed..]);
                if r.is_ok() {
                    seg.flushed = seg.buf.len();
                }
                r
            }
            _ => Ok(()),
        };
        self.pending_keys.clear();
        // A node whose lease lapsed may have had its keys handed over (and its log merged) while this WRITE was in
        // flight: whether the writes count is unknown, so they are not acknowledged, unless the lease is renewed
        // within the wait (a renewal proves the store's lease never ran out, so nobody took the keys over).
        let result = match result {
            Ok(()) if !self.lease_open() => Err(None),
            Ok(()) => Ok(()),
            Err(e) => {
                self.note_revoked(&e);
                Err(Some(e))
            }
        };
        match result {
            Ok(()) => {
                self.stats.commits += 1;
                for p in self.pending.drain(..) {
                    match &p.value {
                        Some(v) => self.cache.write(
                            &p.key,
                            v,
                            Shortcut {
                                ptr: p.entry.raw(),
                                seq: p.seq,
                            },
                        ),
                        None => self.cache.invalidate(&p.key),
                    }
                    self.stats.writes += 1;
                    let _ = p.reply.send(Ok(p.ack));
                }
            }
            Err(None) => {
                for p in self.pending.drain(..) {
                    // The entry is in the log and may yet count: the cached value may be outdated.
                    self.cache.invalidate(&p.key);
                    let _ = p.reply.send(Err(KnError::Fenced));
                }
            }
            Err(Some(e)) => {
                warn!(thread = self.thread, error = %e, "group commit failed; the log is claimed again before the next request");
                let msg = e.to_string();
                for p in self.pending.drain(..) {
                    let _ = p
                        .reply
                        .send(Err(KnError::Fabric(FabricError::Disconnected(msg.clone()))));
                }
                self.broken = true;
            }
        }
    }

    /// A clean stop seals the log and has it merged: a restart then has nothing to recover, and every entry is
    /// behind a seal, so damage to any of them is told from a write the stop cut short.
    fn seal_on_shutdown(&mut self) {
        if self.broken || self.active.is_none() {
            return;
        }
        if let Err(e) = self.merge_all() {
            debug!(thread = self.thread, error = %e, "sealing the log at shutdown failed");
        }
    }

    /// Deletes logged into a segment of the delete reserve are merged right after their commit: only merged
    /// deletes supersede entries, and only then can the memory node recycle the segments those filled.
    fn merge_reserved_deletes(&mut self) {
        if !self
            .active
            .as_ref()
            .is_some_and(|a| a.reserved && a.flushed > 0 && a.flushed == a.buf.len())
        {
            return;
        }
        if let Err(e) = self.merge_all() {
            debug!(thread = self.thread, error = %e, "merging deletes logged on a full pool failed");
        }
    }

    /// Seals the active segment and has the memory node merge the whole log.
    fn merge_all(&mut self) -> Result<(), KnError> {
        self.flush();
        let sealed_len = self.active.as_ref().map(|a| a.buf.len() as u64);
        let merged: proto::Merged = self
            .ep
            .call(
                proto::MERGE_ALL,
                &proto::MergeAll {
                    log_id: self.log.log_id,
                    session: self.log.session,
                    sealed_len,
                },
            )
            .map_err(|e| self.fail_rpc(e))?;
        self.seal_active();
        self.note_merged(merged.merged_seq);
        Ok(())
    }

    fn fail(&mut self, e: FabricError) -> KnError {
        self.note_revoked(&e);
        if e.is_connection_lost() {
            self.broken = true;
        }
        KnError::Fabric(e)
    }

    fn fail_rpc(&mut self, e: FabricError) -> KnError {
        self.note_revoked(&e);
        let e = refused(e);
        if matches!(e, KnError::Fabric(_)) {
            self.broken = true;
        }
        e
    }

    /// Stops the node serving when the memory node revoked it: the cluster took it over, whatever its lease says
    /// yet. (Over TCP a revoked connection is just closed; the node learns why when it connects again.)
    fn note_revoked(&self, e: &FabricError) {
        if let FabricError::Revoked(why) = e
            && let Some(gate) = &self.lease
            && !gate.is_fenced()
        {
            warn!(thread = self.thread, %why, "the memory node revoked this node; it stops serving");
            gate.close();
        }
    }

    /// After a failure: forgets local state and claims the log again, which makes the memory node merge whatever
    /// of it reached the pool. The memory node is the ground truth from then on.
    fn reclaim(&mut self) -> Result<(), KnError> {
        debug!(
            thread = self.thread,
            "claiming the log again after a failure"
        );
        // Writes still waiting for their commit are settled first: committed and acknowledged if the endpoint still
        // works, refused if not. Never acknowledged after their segment copy is dropped below.
        self.flush();
        self.cache.clear();
        self.forget_read_ahead();
        self.active = None;
        self.sealed.clear();
        // A fenced node's logs may have been taken over: claiming them would take them back.
        if self.lease.as_ref().is_some_and(|g| g.is_fenced()) {
            return Err(KnError::LeaseLapsed);
        }
        self.ep = match self.connector.connect() {
            Ok(ep) => ep,
            Err(e @ FabricError::Revoked(_)) => {
                // A member of a cluster serves nothing from now on, as when its lease expired, and says so: the
                // request was not applied, and the key has a new owner.
                self.note_revoked(&e);
                return Err(match self.lease {
                    Some(_) => KnError::LeaseLapsed,
                    None => KnError::Fabric(e),
                });
            }
            Err(e) => return Err(e.into()),
        };
        // A restarted memory node registers its regions under new keys.
        self.data = data_region(&self.ep)?;
        let (log, hash_mode, remote) = claim_log(&mut self.ep, &self.cfg, self.thread)?;
        self.sealed = load_unmerged(&mut self.ep, &self.data, &log)?;
        self.hash_mode = hash_mode;
        self.remote = remote;
        self.next_seq = log.next_seq;
        self.merged_seq = first_unmerged_seq(&log) - 1;
        self.log = log;
        self.broken = false;
        Ok(())
    }
}

/// What an operation does given its key's current value.
enum Outcome {
    /// Nothing to write: the reply.
    Done(Result<Reply, KnError>),
    /// Write this value (`None`: delete) and reply this once the cell points to it.
    Write(Option<Vec<u8>>, Reply),
}

/// The sharing calls (`ACTIVATE_CELL` / `DEACTIVATE_CELL` with the cell) a worker makes when its map changes from
/// `old` to `new`, for the keys `mine` accepts, plus those that settle `unsettled` (changes of a failed install,
/// which may stand either way at the memory node). Deactivations come first, so that a key whose cell changed is
/// moved out of its old cell before it moves into the new one.
fn sharing_changes(
    old: &dyn Ownership,
    new: &dyn Ownership,
    unsettled: &[(Vec<u8>, u64)],
    mine: impl Fn(&[u8]) -> bool,
) -> Vec<(Vec<u8>, u16, u64)> {
    let mut deactivate = Vec::new();
    let mut activate = Vec::new();
    let is_unsettled = |key: &[u8]| unsettled.iter().any(|(k, _)| k.as_slice() == key);
    for (key, cell) in unsettled {
        if new.cell(key) != Some(*cell) {
            deactivate.push((key.clone(), proto::DEACTIVATE_CELL, *cell));
        }
    }
    let mut settled: Vec<&[u8]> = Vec::new();
    for (key, _) in unsettled {
        if settled.contains(&key.as_slice()) {
            continue;
        }
        settled.push(key);
        if let Some(c) = new.cell(key) {
            activate.push((key.clone(), proto::ACTIVATE_CELL, c));
        }
    }
    for (key, cell) in new.shared_keys() {
        if mine(&key) && !is_unsettled(&key) && old.owns(&key) && old.cell(&key).is_none() {
            activate.push((key, proto::ACTIVATE_CELL, cell));
        }
    }
    for (key, cell) in old.shared_keys() {
        if mine(&key) && !is_unsettled(&key) && new.owns(&key) && new.cell(&key).is_none() {
            deactivate.push((key, proto::DEACTIVATE_CELL, cell));
        }
    }
    deactivate.extend(activate);
    deactivate
}

/// Whether `op` on a shared key needs the current value, not only whether there is one.
fn needs_value(op: &DataOp) -> bool {
    matches!(
        op,
        DataOp::Get(_)
            | DataOp::Strlen(_)
            | DataOp::GetSet(..)
            | DataOp::Incr(..)
            | DataOp::Append(..)
            | DataOp::Take(_)
            | DataOp::GetRange(..)
            | DataOp::SetRange(..)
            | DataOp::IncrFloat(..)
            | DataOp::InsertGet(..)
            | DataOp::UpdateGet(..)
            | DataOp::SetBit(..)
            | DataOp::GetBit(..)
            | DataOp::BitCount(..)
            | DataOp::BitPos(..)
    )
}

/// What `op` does given its key's current value, with the key: the one decision of the exclusive and the shared
/// (cell) paths. A value longer than `max_value_len` that `SETRANGE` would make is refused before it is built.
fn outcome(op: DataOp, current: Option<Vec<u8>>, max_value_len: usize) -> (Vec<u8>, Outcome) {
    let done = |r: Reply| Outcome::Done(Ok(r));
    match op {
        DataOp::Get(k) => (k, done(Reply::Value(current))),
        DataOp::Exists(k) => (k, done(Reply::Applied(current.is_some()))),
        DataOp::Strlen(k) => (k, done(Reply::Int(current.map_or(0, |v| v.len()) as i64))),
        DataOp::Set(k, v) => (k, Outcome::Write(Some(v), Reply::Applied(true))),
        DataOp::Insert(k, v) => match current {
            Some(_) => (k, done(Reply::Applied(false))),
            None => (k, Outcome::Write(Some(v), Reply::Applied(true))),
        },
        DataOp::Update(k, v) => match current {
            Some(_) => (k, Outcome::Write(Some(v), Reply::Applied(true))),
            None => (k, done(Reply::Applied(false))),
        },
        DataOp::GetSet(k, v) => (k, Outcome::Write(Some(v), Reply::Value(current))),
        DataOp::Delete(k) => match current {
            Some(_) => (k, Outcome::Write(None, Reply::Applied(true))),
            None => (k, done(Reply::Applied(false))),
        },
        DataOp::Incr(k, delta) => match dinomo_value::increment(current.as_deref(), delta) {
            Ok(n) => (
                k,
                Outcome::Write(Some(n.to_string().into_bytes()), Reply::Int(n)),
            ),
            Err(e) => (k, Outcome::Done(Err(e.into()))),
        },
        DataOp::IncrFloat(k, delta) => {
            match dinomo_value::increment_float(current.as_deref(), &delta) {
                Ok(n) => (k, Outcome::Write(Some(n.clone()), Reply::Value(Some(n)))),
                Err(e) => (k, Outcome::Done(Err(e.into()))),
            }
        }
        DataOp::Take(k) => match current {
            Some(v) => (k, Outcome::Write(None, Reply::Value(Some(v)))),
            None => (k, done(Reply::Value(None))),
        },
        DataOp::GetRange(k, start, end) => {
            let part = dinomo_value::range(current.as_deref().unwrap_or_default(), start, end);
            (k, done(Reply::Value(Some(part.to_vec()))))
        }
        DataOp::SetRange(k, offset, bytes) => {
            match dinomo_value::set_range(current, offset, &bytes, max_value_len) {
                Ok(RangeWrite::Unchanged(len)) => (k, done(Reply::Int(len as i64))),
                Ok(RangeWrite::Write(v)) => {
                    let len = v.len() as i64;
                    (k, Outcome::Write(Some(v), Reply::Int(len)))
                }
                Err(e) => (k, Outcome::Done(Err(e.into()))),
            }
        }
        DataOp::InsertGet(k, v) => match current {
            Some(old) => (k, done(Reply::Value(Some(old)))),
            None => (k, Outcome::Write(Some(v), Reply::Value(None))),
        },
        DataOp::UpdateGet(k, v) => match current {
            Some(old) => (k, Outcome::Write(Some(v), Reply::Value(Some(old)))),
            None => (k, done(Reply::Value(None))),
        },
        DataOp::SetBit(k, i, bit) => match dinomo_value::set_bit(current, i, bit, max_value_len) {
            Ok(w) => {
                let reply = Reply::Int(i64::from(w.previous));
                match w.value {
                    Some(v) => (k, Outcome::Write(Some(v), reply)),
                    None => (k, done(reply)),
                }
            }
            Err(e) => (k, Outcome::Done(Err(e.into()))),
        },
        DataOp::GetBit(k, i) => {
            let bit = dinomo_value::get_bit(current.as_deref().unwrap_or_default(), i);
            (k, done(Reply::Int(i64::from(bit))))
        }
        DataOp::BitCount(k, range) => {
            let n = dinomo_value::bit_count(current.as_deref().unwrap_or_default(), range);
            (k, done(Reply::Int(n as i64)))
        }
        DataOp::BitPos(k, bit, range) => {
            let at = dinomo_value::bit_pos(current.as_deref(), bit, range);
            (k, done(Reply::Int(at)))
        }
        DataOp::Unchanged(k, digest) => {
            let holds = dinomo_value::digest(current.as_deref()) == digest;
            (k, done(Reply::Applied(holds)))
        }
        DataOp::Append(k, suffix) => {
            let mut v = current.unwrap_or_default();
            v.extend_from_slice(&suffix);
            let len = v.len() as i64;
            (k, Outcome::Write(Some(v), Reply::Int(len)))
        }
    }
}

/// One worker driven directly by the calling thread, without a queue: for benchmarks that measure the data path
/// itself, and for loading data quickly. It claims the log of (`node_id`, `thread`) like a worker of a running
/// KV node would; do not run it beside a [`crate::KvNode`] that uses the same log.
pub struct DirectWorker {
    worker: Worker,
    reply_tx: Sender<Tagged>,
    reply_rx: Receiver<Tagged>,
}

impl DirectWorker {
    /// Connects and claims the log of thread `thread` of node `cfg.node_id`.
    pub fn start(
        cfg: KnConfig,
        thread: u32,
        connector: Connector,
    ) -> Result<DirectWorker, KnError> {
        cfg.validate()?;
        let worker = Worker::start(Arc::new(cfg), thread, connector, None, None)?;
        let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
        Ok(DirectWorker {
            worker,
            reply_tx,
            reply_rx,
        })
    }

    /// The value of `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, KnError> {
        self.worker.check_key(key)?;
        self.worker.lookup(key)
    }

    /// Writes every pair with one group commit (more when they fill a segment).
    pub fn set_many<'a>(
        &mut self,
        pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<(), KnError> {
        for (k, v) in pairs {
            let reply = Responder::channel(0, self.reply_tx.clone());
            self.worker.write(
                k.to_vec(),
                dinomo_log::key_hash(k),
                Some(v.to_vec()),
                reply,
                Reply::Applied(true),
            );
        }
        self.worker.flush();
        for (_, r) in self.reply_rx.try_iter() {
            r?;
        }
        Ok(())
    }

    /// Serves `ops` as the worker serves the requests it takes from its queue together (one batch: cache
    /// prefetch, entries read ahead, one group commit), and returns their replies in order.
    pub fn serve_batch(&mut self, ops: Vec<DataOp>) -> Vec<Result<Reply, KnError>> {
        let n = ops.len();
        let mut batch: Vec<Request> = ops
            .into_iter()
            .enumerate()
            .map(|(i, op)| Request {
                cmd: Command::Data(op),
                reply: Responder::channel(i as u64, self.reply_tx.clone()),
            })
            .collect();
        self.worker.serve_batch(&mut batch);
        let mut replies: Vec<Option<Result<Reply, KnError>>> = (0..n).map(|_| None).collect();
        for (tag, r) in self.reply_rx.try_iter() {
            if let Some(slot) = replies.get_mut(tag as usize) {
                *slot = Some(r);
            }
        }
        replies
            .into_iter()
            .map(|r| r.unwrap_or(Err(KnError::Stopped)))
            .collect()
    }

    /// Writes one pair.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), KnError> {
        self.set_many([(key, value)])
    }

    /// Seals the log and has the memory node merge all of it.
    pub fn merge_all(&mut self) -> Result<(), KnError> {
        self.worker.merge_all()
    }

    /// Changes the injected per-round-trip latency of this worker's endpoint.
    pub fn set_injected_latency(&mut self, ns: u64) {
        self.worker.ep.set_injected_latency(ns);
    }

    /// This worker's counters. The fabric counters in it (`round_trips`, `bytes_out`, `bytes_in`) are the calling
    /// thread's, since the fabric counts per thread.
    pub fn stats(&mut self) -> WorkerStats {
        self.worker.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dinomo_dpm::{Processor, ProcessorConfig};
    use dinomo_fabric::{MemoryNode, NodeConfig, Server, ServerConfig, Target};

    struct Map(Vec<(&'static [u8], u64)>);

    impl Ownership for Map {
        fn epoch(&self) -> u64 {
            1
        }
        fn owns(&self, _key: &[u8]) -> bool {
            true
        }
        fn cell(&self, key: &[u8]) -> Option<u64> {
            self.0.iter().find(|(k, _)| *k == key).map(|(_, c)| *c)
        }
        fn shared_keys(&self) -> Vec<(Vec<u8>, u64)> {
            self.0.iter().map(|(k, c)| (k.to_vec(), *c)).collect()
        }
    }

    #[test]
    fn sharing_changes_settle_unsettled_keys_to_the_new_map() {
        let all = |_: &[u8]| true;
        let calls = |old: &Map, new: &Map, unsettled: &[(&[u8], u64)]| {
            let unsettled: Vec<(Vec<u8>, u64)> =
                unsettled.iter().map(|(k, c)| (k.to_vec(), *c)).collect();
            sharing_changes(old, new, &unsettled, all)
                .into_iter()
                .map(|(k, m, c)| (String::from_utf8(k).unwrap(), m, c))
                .collect::<Vec<_>>()
        };
        let (on, off) = (proto::ACTIVATE_CELL, proto::DEACTIVATE_CELL);
        // Plain diffs: newly shared keys are activated, keys no longer shared deactivated, the rest left alone.
        assert_eq!(
            calls(
                &Map(vec![(b"a", 8), (b"b", 16)]),
                &Map(vec![(b"b", 16), (b"c", 24)]),
                &[]
            ),
            vec![("a".into(), off, 8), ("c".into(), on, 24)]
        );
        // An unsettled key goes to the new map's state even when the old map already agreed with it.
        assert_eq!(
            calls(&Map(vec![]), &Map(vec![]), &[(b"a", 8)]),
            vec![("a".into(), off, 8)]
        );
        assert_eq!(
            calls(&Map(vec![(b"a", 8)]), &Map(vec![(b"a", 8)]), &[(b"a", 8)]),
            vec![("a".into(), on, 8)]
        );
        // A key whose cell changed leaves the old cell before it enters the new one, once.
        assert_eq!(
            calls(
                &Map(vec![]),
                &Map(vec![(b"a", 32)]),
                &[(b"a", 8), (b"a", 32)]
            ),
            vec![("a".into(), off, 8), ("a".into(), on, 32)]
        );
    }

    /// A write waiting for its group commit when the connection breaks under a read of the same batch must not be
    /// acknowledged unless it really reached the memory node.
    #[test]
    fn a_write_pending_when_the_connection_breaks_is_not_acknowledged_unwritten() {
        let pool = Arc::new(dinomo_pool::Pool::anonymous(64 << 20, 1 << 20).unwrap());
        let processor = Processor::start(pool.clone(), &ProcessorConfig::default()).unwrap();
        let node = MemoryNode::new(pool, NodeConfig::default());
        processor.serve(&node);
        let server = Server::start(
            node,
            ServerConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                ..ServerConfig::default()
            },
        )
        .unwrap();
        let cfg = Arc::new(KnConfig {
            threads: 1,
            ..KnConfig::default()
        });
        let connector = Connector::new(Target::Tcp(server.local_addr()));
        let mut w = Worker::start(cfg.clone(), 0, connector.clone(), None, None).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let tx = Responder::channel(0, tx);
        // One batch: a write (pending), a read that loses the connection, another read.
        w.serve(Request {
            cmd: Command::Data(DataOp::Set(b"a".to_vec(), b"1".to_vec())),
            reply: tx.clone(),
        });
        server.cut_all_connections();
        w.serve(Request {
            cmd: Command::Data(DataOp::Get(b"b".to_vec())),
            reply: tx.clone(),
        });
        w.serve(Request {
            cmd: Command::Data(DataOp::Get(b"c".to_vec())),
            reply: tx.clone(),
        });
        w.flush();
        let replies: Vec<_> = rx.try_iter().map(|(_, r)| r).collect();
        assert_eq!(replies.len(), 3);
        let set_acknowledged = replies
            .iter()
            .any(|r| matches!(r, Ok(Reply::Applied(true))));
        if set_acknowledged {
            // Ask the memory node, through a fresh claim of the log, not this worker's cache.
            drop(w);
            let mut fresh = Worker::start(cfg, 0, connector, None, None).unwrap();
            let found = fresh.lookup(b"a").unwrap();
            assert_eq!(found, Some(b"1".to_vec()), "an acknowledged write was lost");
        }
    }
}
