//! The pDPM baselines (Tsai, Shan, Zhang, "Disaggregating Persistent Memory and Controlling Them Remotely",
//! USENIX ATC 2020), built on dinomo's fabric and pool so that they can be measured beside DINOMO:
//!
//! - [`direct`]: **DirectDS** and **DirectDS-C** (§4.2): compute nodes reach memory nodes only with one-sided
//!   verbs; every key has a fixed slot with a lock word, a committed copy and a redo copy on each of its replicas.
//! - [`central`]: **CentralDS** (§4.3): a coordinator behind two-sided RPC keeps every key's location under a
//!   per-key reader/writer lock and hands out space; values are written out of place.
//! - [`clover`]: **Clover** (SepDS, §4.4): compute nodes read and write with one-sided verbs along per-key
//!   chains of out-of-place versions; a metadata server hands out space and reclaims retired versions.
//!
//! Every client is one compute-node thread with one endpoint per memory node and implements [`PdpmStore`].

mod anchor;
pub mod central;
pub mod clover;
pub mod direct;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dinomo_fabric::{
    Batch, Connector, Endpoint, FabricError, FaultHooks, RemoteAddr, RpcError, VerbError,
};
use dinomo_pool::PoolError;

use crate::anchor::{Anchored, Located};

/// Pool root slots used by the baselines (the data plane uses 1 and 2).
pub mod roots {
    /// Offset of a memory node's DirectDS slot table.
    pub const DIRECT_TABLE: usize = 8;
    /// Offset of a memory node's CentralDS block area.
    pub const CENTRAL_BLOCKS: usize = 9;
    /// Offset of a memory node's Clover area (shortcut cells and data slots).
    pub const CLOVER_AREA: usize = 10;
}

/// Allocation tags of the baselines' extents.
pub mod tags {
    /// A DirectDS slot table.
    pub const DIRECT_TABLE: u16 = 0x40;
    /// A CentralDS block area.
    pub const CENTRAL_BLOCKS: u16 = 0x41;
    /// A Clover area.
    pub const CLOVER_AREA: u16 = 0x42;
}

/// The baseline whose area the pool holds ("DirectDS", "CentralDS" or "Clover"), if one formatted it.
pub fn formatted_store(pool: &dinomo_pool::Pool) -> Option<&'static str> {
    use anchor::Anchored;
    [
        direct::DirectLayout::ANCHOR,
        central::CentralLayout::ANCHOR,
        clover::CloverLayout::ANCHOR,
    ]
    .into_iter()
    .find(|a| pool.root(a.root).is_ok_and(|o| o != 0))
    .map(|a| a.store)
}

/// What a baseline formats each of its memory nodes with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// DirectDS or DirectDS-C: a slot table.
    Direct(direct::DirectLayout),
    /// CentralDS: a block area.
    Central(central::CentralLayout),
    /// Clover: shortcut cells and data slots.
    Clover(clover::CloverLayout),
}

impl Layout {
    /// Bytes of the area it formats on each memory node.
    pub fn area_len(&self) -> u64 {
        match self {
            Layout::Direct(l) => l.table_len(),
            Layout::Central(l) => l.area_len(),
            Layout::Clover(l) => l.area_len(),
        }
    }

    /// The pool root that holds the area once formatted (0 before).
    pub fn root(&self) -> usize {
        match self {
            Layout::Direct(_) => roots::DIRECT_TABLE,
            Layout::Central(_) => roots::CENTRAL_BLOCKS,
            Layout::Clover(_) => roots::CLOVER_AREA,
        }
    }

    /// Formats a memory node's pool.
    pub fn format(&self, pool: &dinomo_pool::Pool) -> Result<(), PdpmError> {
        match self {
            Layout::Direct(l) => direct::format(pool, l),
            Layout::Central(l) => central::format(pool, l),
            Layout::Clover(l) => clover::format(pool, l),
        }
    }
}

/// How a baseline's clients reach it: their settings, and where CentralDS's coordinator or Clover's metadata
/// server is.
#[derive(Debug, Clone)]
pub enum ClientSettings {
    /// DirectDS or DirectDS-C (the flavour is in the memory nodes' layout).
    Direct(direct::DirectSettings),
    /// CentralDS.
    Central {
        /// The coordinator's node.
        coordinator: Connector,
        /// The clients' settings.
        settings: central::CentralSettings,
    },
    /// Clover.
    Clover {
        /// The metadata server's node.
        metadata_server: Connector,
        /// The clients' settings.
        settings: clover::CloverSettings,
    },
}

impl ClientSettings {
    /// Connects a new client (one compute-node thread's) to `memory_nodes`.
    pub fn connect(
        &self,
        memory_nodes: &[Connector],
    ) -> Result<Box<dyn PdpmStore + Send>, PdpmError> {
        Ok(match self {
            ClientSettings::Direct(settings) => Box::new(direct::DirectClient::connect(
                memory_nodes,
                settings.clone(),
            )?),
            ClientSettings::Central {
                coordinator,
                settings,
            } => Box::new(central::CentralClient::connect(
                coordinator,
                memory_nodes,
                settings.clone(),
            )?),
            ClientSettings::Clover {
                metadata_server,
                settings,
            } => Box::new(clover::CloverClient::connect(
                metadata_server,
                memory_nodes,
                settings.clone(),
            )?),
        })
    }
}

/// The operations every baseline offers to one compute-node thread.
pub trait PdpmStore {
    /// The committed value of `key`, or `None` when it has none.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PdpmError>;
    /// Writes `value` under `key`; on `Ok` the write is committed and persistent.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PdpmError>;
    /// Removes `key` (a no-op when it has no value).
    fn delete(&mut self, key: &[u8]) -> Result<(), PdpmError>;
    /// The longest value the store takes, in bytes (its layout's fixed slot size).
    fn max_value_len(&self) -> usize;
    /// How many keys have a value (for `DBSIZE`). Each store says how it counts and whether the count is of one
    /// instant while others write.
    fn key_count(&mut self) -> Result<u64, PdpmError>;
    /// One step of a walk over the keys (`SCAN`): from `cursor` (0 starts a walk; a returned cursor of 0 ends it),
    /// about `count` keys (a hint). Each store walks places a key keeps while it exists (slots, cells, index
    /// shards), so a whole walk names every key there from its start to its end; it may also name keys deleted
    /// meanwhile or before (the caller asks about each).
    fn scan_keys(&mut self, cursor: u64, count: u32) -> Result<(u64, Vec<Vec<u8>>), PdpmError>;
    /// Atomic read-modify-write: `f` gets `key`'s committed value (`None` for none) and says what becomes of it;
    /// no other write to `key` lands between the read `f` saw and the change. `f` may run more than once (a store
    /// that validates optimistically runs it again on a conflict), so it must compute its answer from its argument
    /// alone and report results only from its last run. A value `f` puts is checked against the size limits.
    fn update(
        &mut self,
        key: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>) -> Change,
    ) -> Result<(), PdpmError>;
}

/// What a read-modify-write ([`PdpmStore::update`]) does with the key's current value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Leave the key as it is.
    Keep,
    /// Replace the value (or create the key).
    Put(Vec<u8>),
    /// Remove the key.
    Delete,
}

/// Everything the baselines can fail with.
#[derive(Debug, thiserror::Error)]
pub enum PdpmError {
    /// The fabric failed (a refused verb, a lost connection, an RPC error).
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    /// The pool refused to format.
    #[error("pool: {0}")]
    Pool(#[from] PoolError),
    /// The key is longer than the store's fixed slots allow.
    #[error("key of {len} bytes is longer than the limit of {max} bytes")]
    KeyTooLarge {
        /// Length given.
        len: usize,
        /// The setting.
        max: usize,
    },
    /// The value is longer than the store's fixed slots allow.
    #[error("value of {len} bytes is longer than the limit of {max} bytes")]
    ValueTooLarge {
        /// Length given.
        len: usize,
        /// The setting.
        max: usize,
    },
    /// No slot for a new key within the probe limit.
    #[error(
        "no free slot for the key within {probes} probes (the slot table is full around its hash)"
    )]
    TableFull {
        /// The setting.
        probes: u32,
    },
    /// A lock was held by a live client for longer than the wait limit.
    #[error("lock of slot {slot} on memory node {node} not acquired within {waited_ms} ms")]
    LockTimeout {
        /// Memory node.
        node: usize,
        /// Slot index.
        slot: u64,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A read kept finding a copy being rewritten.
    #[error(
        "read of slot {slot} on memory node {node} kept seeing a torn copy ({attempts} attempts)"
    )]
    Contended {
        /// Memory node.
        node: usize,
        /// Slot index.
        slot: u64,
        /// Attempts made.
        attempts: u32,
    },
    /// Memory-node content is not what the store wrote (not formatted, a different format, or damaged).
    #[error("memory node {node}: {why}")]
    Layout {
        /// Memory node.
        node: usize,
        /// What is wrong.
        why: String,
    },
    /// Neither copy of a slot is whole: the slot cannot be recovered.
    #[error("slot {slot} on memory node {node} has no whole copy")]
    Unrecoverable {
        /// Memory node.
        node: usize,
        /// Slot index.
        slot: u64,
    },
    /// A read-modify-write kept finding the key changed between its read and its conditional commit.
    #[error(
        "read-modify-write kept conflicting with other writers ({attempts} attempts in {waited_ms} ms)"
    )]
    Conflict {
        /// Attempts made.
        attempts: u32,
        /// How long it went on.
        waited_ms: u64,
    },
    /// A memory node the operation needs is unreachable (its connection was lost or it refused the client's
    /// region keys, as after a restart). Nothing was applied: a write that may have changed a committed copy before
    /// the failure reports [`PdpmError::Fabric`] instead (outcome unknown).
    #[error("memory node {node} is unreachable ({why}); nothing was applied")]
    NodeDown {
        /// Memory node.
        node: usize,
        /// What failed.
        why: String,
    },
    /// The coordinator refused a request.
    #[error("coordinator: {0}")]
    Coordinator(String),
    /// The memory nodes have no room for the write; nothing was applied.
    #[error("out of memory-node space, the write was not applied: {0}")]
    OutOfSpace(String),
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
}

/// What a failed operation tells its caller about the store's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The store refused the request itself (a key or value beyond its limits, a bad setting); nothing applied.
    Invalid,
    /// A write whose fabric failed midway: it may or may not have taken effect.
    Indeterminate,
    /// Nothing was applied (a lock timeout, a torn read, a node down, a coordinator's refusal).
    NotApplied,
    /// The memory nodes have no room for the write (a full slot table, no free blocks or slots); nothing was
    /// applied, and retrying helps only once space is freed.
    OutOfSpace,
}

impl PdpmError {
    /// Whether the store refused the request itself rather than failing to serve it.
    pub fn is_invalid_request(&self) -> bool {
        matches!(
            self,
            PdpmError::KeyTooLarge { .. } | PdpmError::ValueTooLarge { .. } | PdpmError::Config(_)
        )
    }

    /// Whether the memory nodes had no room for the write (nothing was applied).
    pub fn is_out_of_space(&self) -> bool {
        matches!(
            self,
            PdpmError::TableFull { .. }
                | PdpmError::OutOfSpace(_)
                | PdpmError::Fabric(FabricError::Rpc(RpcError::OutOfSpace(_)))
        )
    }

    /// What this error means for an operation that was (`write`) or was not a write.
    pub fn kind(&self, write: bool) -> FailureKind {
        match self {
            e if e.is_invalid_request() => FailureKind::Invalid,
            e if e.is_out_of_space() => FailureKind::OutOfSpace,
            PdpmError::Fabric(_) if write => FailureKind::Indeterminate,
            _ => FailureKind::NotApplied,
        }
    }
}

/// An RPC refusal with its reason, as the metadata services answer a request they cannot serve.
pub(crate) fn failed(why: impl Into<String>) -> RpcError {
    RpcError::Failed(why.into())
}

/// The memory node a client's down report (`REPORT_DOWN`) names, refused unless it is one of the `nodes` the
/// service knows.
pub(crate) fn reported_down(request: &[u8], nodes: usize) -> Result<usize, RpcError> {
    let node: u32 = dinomo_fabric::decode(request)?;
    if node as usize >= nodes {
        return Err(failed(format!("no memory node {node}")));
    }
    Ok(node as usize)
}

/// `e` from a write step on `node` before the write changed anything: a node failure becomes
/// [`PdpmError::NodeDown`] (not applied); anything else is returned as it is.
pub(crate) fn not_applied(node: usize, e: PdpmError) -> PdpmError {
    match e {
        PdpmError::NodeDown { .. } => e,
        e if is_node_failure(&e) => PdpmError::NodeDown {
            node,
            why: e.to_string(),
        },
        e => e,
    }
}

/// True when `e` says the memory node itself is gone rather than that one request was wrong: a lost connection,
/// or a refusal of the region key or region (a restarted node registers its regions under new keys).
pub(crate) fn is_node_failure(e: &PdpmError) -> bool {
    match e {
        PdpmError::Fabric(f) => {
            f.is_connection_lost()
                || matches!(
                    f,
                    FabricError::Verb {
                        error: VerbError::BadKey | VerbError::NoSuchRegion,
                        ..
                    } | FabricError::Handshake(_)
                )
        }
        PdpmError::NodeDown { .. } => true,
        _ => false,
    }
}

/// When each memory node was last found unreachable (`None`: reachable as far as its holder knows).
#[derive(Debug, Clone)]
pub(crate) struct DownSince(Vec<Option<Instant>>);

impl DownSince {
    /// `nodes` memory nodes, all reachable.
    pub fn new(nodes: usize) -> DownSince {
        DownSince(vec![None; nodes])
    }

    /// Counts `node` unreachable from now on; logs `why` when it was not already.
    pub fn mark(&mut self, node: usize, why: &dyn std::fmt::Display) {
        if let Some(down) = self.0.get_mut(node) {
            if down.is_none() {
                tracing::warn!(node, %why, "memory node unreachable");
            }
            *down = Some(Instant::now());
        }
    }

    /// Whether `node` was found unreachable less than `retry` ago.
    pub fn within(&self, node: usize, retry: Duration) -> bool {
        self.since(node).is_some_and(|t| t.elapsed() < retry)
    }

    /// When `node` was last found unreachable, `None` when it counts as reachable (or is unknown).
    fn since(&self, node: usize) -> Option<Instant> {
        self.0.get(node).copied().flatten()
    }

    fn clear(&mut self, node: usize) {
        if let Some(down) = self.0.get_mut(node) {
            *down = None;
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A client's connections to the memory nodes of a store whose areas are laid out as `L` (node `i` is
/// `connectors[i]`), and the nodes it found unreachable: those are left alone for `retry`, then connected again.
pub(crate) struct MemoryNodes<L> {
    connectors: Vec<Connector>,
    /// Each node's current endpoint.
    pub eps: Vec<Endpoint>,
    /// Each node's area.
    pub areas: Vec<Located>,
    /// The geometry every node's area shares.
    pub layout: L,
    down: DownSince,
    retry: Duration,
}

impl<L: Anchored> MemoryNodes<L> {
    /// Connects to every memory node (at least one) and locates their areas, which must share one geometry.
    pub fn connect(connectors: &[Connector], retry: Duration) -> Result<MemoryNodes<L>, PdpmError> {
        if connectors.is_empty() {
            return Err(PdpmError::Config("no memory nodes".into()));
        }
        let (eps, areas, layout) = anchor::locate_all::<L>(connectors)?;
        Ok(MemoryNodes {
            connectors: connectors.to_vec(),
            down: DownSince::new(eps.len()),
            eps,
            areas,
            layout,
            retry,
        })
    }

    /// Memory nodes.
    pub fn len(&self) -> usize {
        self.eps.len()
    }

    /// True while `node` counts as unreachable (found so, and not connected again since).
    pub fn is_down(&self, node: usize) -> bool {
        self.down.since(node).is_some()
    }

    /// Counts `node` as unreachable from now on (another party found it so), until `retry` has passed.
    pub fn mark_down(&mut self, node: usize) {
        self.down.mark(node, &"reported");
    }

    /// The fault hooks of the current connection to `node` (tests cut it to fail the node; a reconnection gets
    /// fresh hooks).
    pub fn fault_hooks(&self, node: usize) -> Option<Arc<FaultHooks>> {
        self.eps.get(node).map(|ep| ep.hooks().clone())
    }

    /// True unless `node` is unknown or was found unreachable less than `retry` ago; after that it is connected
    /// again (and its area located again: a restarted node registers its regions under new keys).
    pub fn reachable(&mut self, node: usize) -> bool {
        if node >= self.down.len() {
            return false;
        }
        if self.down.since(node).is_none() {
            return true;
        }
        if self.down.within(node, self.retry) {
            return false;
        }
        match self.reconnect(node) {
            Ok(()) => {
                tracing::info!(node, "memory node reachable again");
                self.down.clear(node);
                true
            }
            Err(e) => {
                tracing::debug!(node, error = %e, "memory node still unreachable");
                self.down.mark(node, &e);
                false
            }
        }
    }

    fn reconnect(&mut self, node: usize) -> Result<(), PdpmError> {
        let mut ep = self.connectors[node].connect()?;
        let (area, layout) = anchor::locate::<L>(&mut ep, node)?;
        if layout != self.layout {
            return Err(PdpmError::Layout {
                node,
                why: format!(
                    "{} {layout:?} differs from {:?} seen before",
                    L::ANCHOR.what,
                    self.layout
                ),
            });
        }
        self.eps[node] = ep;
        self.areas[node] = area;
        Ok(())
    }

    /// Passes `r` (the outcome of a verb to `node`) on, marking `node` down when its error says the node is gone.
    pub fn track<T, E: Into<PdpmError>>(
        &mut self,
        node: usize,
        r: Result<T, E>,
    ) -> Result<T, PdpmError> {
        r.map_err(|e| {
            let e = e.into();
            if is_node_failure(&e) {
                self.down.mark(node, &e);
            }
            e
        })
    }

    /// As [`MemoryNodes::track`], and when the error says `node` is gone, tells the server behind `server` too
    /// (RPC `method` with the node's index; best effort), so that it grants no space there.
    pub fn track_reporting<T, E: Into<PdpmError>>(
        &mut self,
        node: usize,
        r: Result<T, E>,
        server: &mut Endpoint,
        method: u16,
    ) -> Result<T, PdpmError> {
        let r = self.track(node, r);
        if let Err(e) = &r
            && is_node_failure(e)
            && let Err(report) = server.call::<_, ()>(method, &(node as u32))
        {
            tracing::debug!(node, error = %report, "could not report a memory node down");
        }
        r
    }
}

/// The nodes a read that fails over from copy to copy tried, for the [`PdpmError::NodeDown`] it returns when none
/// answered.
#[derive(Default)]
pub(crate) struct Tried(String);

impl Tried {
    /// `node` was skipped: it counts as down.
    pub fn skipped(&mut self, node: usize) {
        self.0.push_str(&format!("node {node} down; "));
    }

    /// The read on `node` failed as the node did.
    pub fn failed(&mut self, node: usize, e: &PdpmError) {
        self.0.push_str(&format!("node {node}: {e}; "));
    }

    /// No `what` answered: [`PdpmError::NodeDown`] naming `node` and every node tried.
    pub fn node_down(self, node: usize, what: &str) -> PdpmError {
        PdpmError::NodeDown {
            node,
            why: format!("no {what} answers ({})", self.0.trim_end_matches("; ")),
        }
    }
}

/// The seeded hash that places keys on memory nodes and slots.
#[inline]
pub(crate) fn hash(key: &[u8], seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, seed)
}

/// The next id from `counter`, never 0 (ids wrap past `u32::MAX`): a server's name for a client it has not named
/// before.
pub(crate) fn next_id(counter: &AtomicU32) -> u32 {
    let id = counter.fetch_add(1, Ordering::Relaxed);
    if id == 0 {
        counter.fetch_add(1, Ordering::Relaxed)
    } else {
        id
    }
}

/// The id a server's `LAYOUT` reply named for the connecting client ([`next_id`] never names 0).
pub(crate) fn named_client(id: u32) -> Result<u32, PdpmError> {
    match id {
        0 => Err(PdpmError::Coordinator("LAYOUT named client 0".into())),
        id => Ok(id),
    }
}

/// A nonzero random 32-bit client identity, where no server names clients: distinguishes lock owners and makes
/// markers unique.
pub(crate) fn new_client_id() -> u32 {
    loop {
        let id: u32 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

/// Refuses a key longer than the layout's `max`.
pub(crate) fn check_key(key: &[u8], max: u32) -> Result<(), PdpmError> {
    if key.len() > max as usize {
        return Err(PdpmError::KeyTooLarge {
            len: key.len(),
            max: max as usize,
        });
    }
    Ok(())
}

/// Refuses a value longer than the layout's `max`.
pub(crate) fn check_value(value: &[u8], max: u32) -> Result<(), PdpmError> {
    if value.len() > max as usize {
        return Err(PdpmError::ValueTooLarge {
            len: value.len(),
            max: max as usize,
        });
    }
    Ok(())
}

/// Persistence validation: the READ after a WRITE to memory node `node` (at `slot`, where the store has slots)
/// must see the bytes written.
pub(crate) fn validate(
    node: usize,
    slot: Option<u64>,
    got: &[u8],
    want: &[u8],
) -> Result<(), PdpmError> {
    if got == want {
        return Ok(());
    }
    const WHY: &str = "validation read does not see the bytes just written";
    Err(PdpmError::Layout {
        node,
        why: match slot {
            Some(slot) => format!("slot {slot}: {WHY}"),
            None => WHY.into(),
        },
    })
}

/// WRITEs `bytes` at `addr` and READs back its last 8 bytes (from `tail`) in the same round trip (the fabric
/// executes a batch in order), then validates them. `batch` lends its buffers; the WRITE borrows `bytes`.
pub(crate) fn write_validated(
    ep: &mut Endpoint,
    batch: &mut Batch<'static>,
    node: usize,
    slot: Option<u64>,
    addr: RemoteAddr,
    bytes: &[u8],
    tail: u64,
) -> Result<(), PdpmError> {
    let mut round = std::mem::take(batch).reuse();
    round.write(addr, bytes);
    let check = round.read(addr.offset_by(tail), 8);
    let r = ep
        .post(&mut round)
        .map_err(PdpmError::from)
        .and_then(|()| validate(node, slot, round.read_data(check), &bytes[tail as usize..]));
    *batch = round.reuse();
    r
}

/// Items of `len` bytes one READ takes: half the message limit `max_message`, at least 1, at most `cap`.
pub(crate) fn per_read(max_message: u32, len: u64, cap: u64) -> u64 {
    (u64::from(max_message) / 2 / len).clamp(1, cap)
}

/// `(first, n)` ranges covering `count` records (cells or slots) of `len` bytes, read `cap` records at most per
/// READ and no more than half of `max_message` bytes (a READ's reply must fit one message).
pub(crate) fn read_spans(
    max_message: u32,
    count: u64,
    len: u64,
    cap: u64,
) -> impl Iterator<Item = (u64, u64)> {
    let per_read = per_read(max_message, len, cap);
    (0..count.div_ceil(per_read)).map(move |i| {
        let first = i * per_read;
        (first, per_read.min(count - first))
    })
}

/// One step of a walk over the keys (`SCAN`) of a store whose keys keep their place (a slot, a cell) while they
/// exist: `per_node` places on each memory node, taken node after node, the cursor being `node × per_node + place`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScanRun {
    /// The memory node read.
    pub node: usize,
    /// Its first place read.
    pub first: u64,
    /// How many places are read.
    pub n: u64,
    /// The cursor after them; 0 after the last place.
    pub next: u64,
}

impl ScanRun {
    /// The run from `cursor`: at most `count` places (16 at least), at most `per_read(node)` (one READ), not past
    /// the node's last. `None` for a cursor past the last place of the last node.
    pub(crate) fn at(
        cursor: u64,
        per_node: u64,
        nodes: usize,
        count: u32,
        per_read: impl Fn(usize) -> u64,
    ) -> Option<ScanRun> {
        let total = per_node * nodes as u64;
        if cursor >= total {
            return None;
        }
        let (node, first) = ((cursor / per_node) as usize, cursor % per_node);
        let n = (per_node - first)
            .min(per_read(node))
            .min(u64::from(count).max(16));
        let next = cursor + n;
        Some(ScanRun {
            node,
            first,
            n,
            next: if next >= total { 0 } else { next },
        })
    }
}
