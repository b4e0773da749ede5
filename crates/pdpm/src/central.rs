//! CentralDS (pDPM §4.3): a coordinator is the serialization point and owns all metadata and space.
//!
//! **Coordinator.** [`Coordinator`] is an RPC handler installed on a fabric [`MemoryNode`] of its own (its threads
//! are the node's processor threads, `NodeConfig::rpc_threads`), reached like any memory node, in-process or over
//! TCP. It keeps, per key, the location of the committed value (one block on each of `R` memory nodes) and its
//! version under a per-key reader/writer lock, and hands out free blocks: the memory node with the most free
//! blocks first (the paper's load balancing of writes).
//!
//! **Memory nodes** hold a block area (anchored in root slot [`crate::roots::CENTRAL_BLOCKS`], zeroed when it is
//! formatted) of fixed-size blocks `[stamp: 8][version: 8][key len: 2][0: 2][value len: 4][key][value][CRC32C: 4]`.
//! The CRC covers version to value. The version is the writing client's (its id and sequence: it tells a GET that
//! the block still holds the value it looked up); the coordinator names each client it serves, above every id in
//! a version its memory nodes hold, so versions never repeat. The stamp is the coordinator's: a client writes its
//! block with stamp 0 (the first word, so a torn write never keeps an old stamp), and the coordinator, on COMMIT,
//! WRITEs the next number of its commit counter there before it swaps the location; when it frees a block (an
//! overwrite or a delete) it WRITEs 0 there first. So the committed blocks are exactly the whole ones with a
//! nonzero stamp, and of two for one key (a crash between stamping the new and clearing the old) the higher stamp
//! is the newer.
//!
//! **PUT** (3 round trips with R = 1; Table 1): the client WRITEs the block out of place into blocks granted to it
//! in advance (a `GRANT` call refills `grant_batch` of them, off the per-write path), READs its tail to validate
//! persistence, then `COMMIT`s at the coordinator, which swaps the key's location under the key's write lock and
//! frees the old blocks. With `fuse_validation` the WRITE and its READ share one round trip (2).
//! **GET** (2): `LOOKUP` at the coordinator (under the key's read lock), then one READ; the block's version, key
//! and CRC are checked, because a block freed by a later commit may be reused while a reader is on its way, and the
//! GET starts over then.
//!
//! **Read-modify-write** ([`PdpmStore::update`]) is optimistic: the client reads the value as a GET does, runs
//! `f`, writes the result out of place and sends a conditional COMMIT (or DELETE) that the coordinator applies only
//! if the key's committed version is still the one read (or the key still has none); otherwise the client starts
//! over, reusing its written blocks. Optimistic rather than a write lock held across the client's round trips,
//! because a lock held by a client would need leases and recovery when the client dies, and would park the
//! coordinator's RPC threads behind it; a failed condition costs only the conflicting client a retry.
//!
//! A client that crashes mid-PUT leaves the old value: nothing is visible before `COMMIT`. Its granted blocks stay
//! out of the free list until [`Coordinator::reclaim_grants`] is called for it (or the coordinator restarts).
//!
//! **Coordinator restart.** The coordinator's metadata lives in its memory, and [`Coordinator::new`] rebuilds it
//! from the memory nodes: it scans every block area, keeps per key the whole blocks with the highest stamp (adding
//! unstamped whole copies of the same write where a crash cut the stamping of replicas short), clears the stamps of
//! superseded blocks and puts every other block on the free lists. (The paper instead persists the metadata in the
//! coordinator's PM and replicates it to a backup coordinator.)

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use dinomo_fabric::{
    Batch, ClientId, Connector, Endpoint, FaultHooks, MemoryNode, RpcError, RpcHandler, decode,
    encode,
};
use dinomo_pool::Pool;
use serde::{Deserialize, Serialize};

use crate::anchor::{self, Anchor, Anchored, HEADER_LEN, Located, le_u32, le_u64};
use crate::{
    Change, DownSince, MemoryNodes, PdpmError, PdpmStore, Tried, check_key, check_value, failed,
    hash, is_node_failure, reported_down, roots, tags, validate, write_validated,
};

/// Bytes before the key: stamp, version, key length, zero, value length.
const BLOCK_HEADER: usize = 24;
/// Where the CRC starts covering (the stamp is rewritten in place by the coordinator).
const SEALED_FROM: usize = 8;

/// RPC methods of the coordinator.
pub mod method {
    /// The block geometry and replication.
    pub const LAYOUT: u16 = 0x4301;
    /// Grant free blocks to a client.
    pub const GRANT: u16 = 0x4302;
    /// Where a key's committed value is.
    pub const LOOKUP: u16 = 0x4303;
    /// Make a written location a key's committed value.
    pub const COMMIT: u16 = 0x4304;
    /// Remove a key (if its version is the one expected).
    pub const DELETE: u16 = 0x4305;
    /// Give back granted blocks that will not be used.
    pub const RELEASE: u16 = 0x4306;
    /// How many keys have a committed value.
    pub const COUNT: u16 = 0x4307;
    /// A client found a memory node unreachable: grants avoid it for the coordinator's `node_retry`.
    pub const REPORT_DOWN: u16 = 0x4308;
    /// One step of a walk over the keys with a committed value (`SCAN`).
    pub const SCAN: u16 = 0x4309;
}

/// The block area of a memory node, fixed when it is formatted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CentralLayout {
    /// Blocks on this memory node. Default 16384.
    pub blocks: u64,
    /// Longest key in bytes (at most 65535). Default 64.
    pub max_key: u32,
    /// Longest value in bytes. Default 1024.
    pub max_value: u32,
}

impl Default for CentralLayout {
    fn default() -> Self {
        CentralLayout {
            blocks: 16384,
            max_key: 64,
            max_value: 1024,
        }
    }
}

impl CentralLayout {
    /// Bytes of one block, rounded to 8.
    pub fn block_len(&self) -> u64 {
        (BLOCK_HEADER as u64 + self.max_key as u64 + self.max_value as u64 + 4).next_multiple_of(8)
    }

    /// Bytes of the whole area on one memory node, its header included.
    pub fn area_len(&self) -> u64 {
        HEADER_LEN + self.blocks * self.block_len()
    }

    fn check(&self) -> Result<(), PdpmError> {
        let area = self
            .blocks
            .checked_mul(self.block_len())
            .and_then(|n| n.checked_add(HEADER_LEN));
        if self.blocks == 0
            || self.blocks > u32::MAX as u64
            || self.max_key > u16::MAX as u32
            || area.is_none()
        {
            return Err(PdpmError::Config(format!(
                "block area needs 0 < blocks < 2^32, max_key <= 65535 and a size that fits 64 bits: {self:?}"
            )));
        }
        Ok(())
    }
}

impl Anchored for CentralLayout {
    const ANCHOR: Anchor = Anchor {
        root: roots::CENTRAL_BLOCKS,
        tag: tags::CENTRAL_BLOCKS,
        magic: b"PDPMCEN1",
        version: 2,
        store: "CentralDS",
        what: "block area",
    };

    fn put_fields(&self, h: &mut [u8; HEADER_LEN as usize]) {
        h[16..24].copy_from_slice(&self.blocks.to_le_bytes());
        h[24..28].copy_from_slice(&self.max_key.to_le_bytes());
        h[28..32].copy_from_slice(&self.max_value.to_le_bytes());
    }

    fn get_fields(h: &[u8]) -> Result<CentralLayout, String> {
        let l = CentralLayout {
            blocks: le_u64(h, 16),
            max_key: le_u32(h, 24),
            max_value: le_u32(h, 28),
        };
        l.check().map_err(|e| e.to_string())?;
        Ok(l)
    }

    fn anchored_len(&self) -> u64 {
        self.area_len()
    }
}

/// Formats a memory node's pool with a block area. Refuses a pool that already has one.
pub fn format(pool: &Pool, layout: &CentralLayout) -> Result<(), PdpmError> {
    layout.check()?;
    // Zeroed: a coordinator that starts rebuilds its metadata from the stamps, and an extent may hold old bytes.
    anchor::format(pool, layout, true)
}

/// One block on one memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockRef {
    /// Memory node index.
    pub node: u16,
    /// Block index on it.
    pub block: u32,
}

/// Where one value lives: one block per replica, the first read by GETs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location(pub Vec<BlockRef>);

/// What the coordinator tells clients at connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutReply {
    /// Copies of each value.
    pub replication: u32,
    /// Memory nodes the coordinator manages.
    pub nodes: u32,
    /// Their (shared) block geometry.
    pub layout: CentralLayout,
    /// The connecting client's id: the high half of its versions, and its name for its granted blocks.
    pub client: u32,
}

/// A committed value's place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    /// Its blocks.
    pub location: Location,
    /// Version written in its blocks.
    pub version: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct GrantRequest {
    client: u32,
    count: u32,
}

/// The condition of a COMMIT or DELETE on the key's committed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Expect {
    /// None (a plain PUT or DELETE).
    Any,
    /// The key has no value.
    Absent,
    /// The key's committed value has this version.
    Version(u64),
}

impl Expect {
    fn holds(self, committed: Option<&Committed>) -> bool {
        match self {
            Expect::Any => true,
            Expect::Absent => committed.is_none(),
            Expect::Version(v) => committed.is_some_and(|c| c.version == v),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct CommitRequest {
    client: u32,
    key: Vec<u8>,
    location: Location,
    version: u64,
    expect: Expect,
}

#[derive(Debug, Serialize, Deserialize)]
struct DeleteRequest {
    key: Vec<u8>,
    expect: Expect,
}

/// What a DELETE did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Deleted {
    /// The condition failed; nothing changed.
    Conflict,
    /// The key had no value.
    Absent,
    /// The value is gone.
    Removed,
}

#[derive(Debug, Serialize, Deserialize)]
struct ReleaseRequest {
    client: u32,
    locations: Vec<Location>,
}

/// Settings of the coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// Copies of each value, on distinct memory nodes. Default 1.
    pub replication: u32,
    /// Shards of the key map (each a reader/writer lock over its keys' entries). Default 64.
    pub shards: usize,
    /// Most locations one GRANT hands out. Default 1024.
    pub max_grant: u32,
}

/// How long the coordinator grants no blocks on a memory node found unreachable, by default
/// ([`Coordinator::set_node_retry`]).
pub const DEFAULT_NODE_RETRY: Duration = Duration::from_secs(1);

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            replication: 1,
            shards: 64,
            max_grant: 1024,
        }
    }
}

/// A key's entry: its lock is the per-key reader/writer lock.
#[derive(Debug, Default)]
struct Entry {
    committed: Option<Committed>,
    /// Removed from the map by a delete: a commit that raced with it starts over on a fresh entry.
    detached: bool,
}

/// Keys of one shard and their entries.
type Shard = RwLock<HashMap<Vec<u8>, Arc<RwLock<Entry>>>>;

struct Space {
    free: Vec<Vec<u32>>,
    /// Granted, not yet committed or released, by client.
    granted: HashMap<u32, HashSet<BlockRef>>,
}

/// The CentralDS coordinator.
pub struct Coordinator {
    config: CoordinatorConfig,
    layout: CentralLayout,
    nodes: usize,
    shards: Vec<Shard>,
    space: Mutex<Space>,
    /// The memory nodes, and per node the endpoints not in use (RPC threads stamping blocks take one each, so
    /// they do not wait for each other; a new one is connected when none is spare).
    connectors: Vec<Connector>,
    spare: Vec<Mutex<Vec<Endpoint>>>,
    areas: Vec<Located>,
    /// The next commit's stamp.
    next_stamp: AtomicU64,
    /// The next client's id: above every id in a version found on the memory nodes, so a client's versions
    /// (id and sequence) repeat none a block still holds, and no two clients share their granted blocks' name.
    next_client: AtomicU32,
    rebuilt: Mutex<Rebuilt>,
    /// When each memory node was last found unreachable.
    down: Mutex<DownSince>,
    /// Nanoseconds a node found unreachable gets no new blocks.
    node_retry_ns: AtomicU64,
}

/// What a coordinator found when it rebuilt its metadata from the memory nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Keys with a committed value.
    pub keys: usize,
    /// Stamped blocks superseded by a newer commit of their key (their stamps were cleared).
    pub superseded: usize,
    /// Replica blocks whose stamping a crash had cut short (stamped now).
    pub completed: usize,
    /// Blocks with a stamp but not whole (damaged; freed).
    pub damaged: usize,
}

/// A whole block found by the rebuild scan.
struct Found {
    stamp: u64,
    version: u64,
    blocks: Vec<BlockRef>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("config", &self.config)
            .field("layout", &self.layout)
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl Coordinator {
    /// A coordinator over the memory nodes `connectors` (formatted with one geometry), every block free.
    pub fn new(
        connectors: &[Connector],
        config: CoordinatorConfig,
    ) -> Result<Arc<Coordinator>, PdpmError> {
        if connectors.is_empty() || connectors.len() > u16::MAX as usize {
            return Err(PdpmError::Config("1 to 65535 memory nodes needed".into()));
        }
        if config.replication == 0 || config.replication as usize > connectors.len() {
            return Err(PdpmError::Config(format!(
                "replication {} needs 1 to {} (the memory nodes)",
                config.replication,
                connectors.len()
            )));
        }
        if config.shards == 0 || config.max_grant == 0 {
            return Err(PdpmError::Config(
                "shards and max_grant must be at least 1".into(),
            ));
        }
        let (eps, areas, layout) = anchor::locate_all::<CentralLayout>(connectors)?;
        let coordinator = Coordinator {
            shards: (0..config.shards)
                .map(|_| RwLock::new(HashMap::new()))
                .collect(),
            config,
            layout,
            nodes: connectors.len(),
            space: Mutex::new(Space {
                free: Vec::new(),
                granted: HashMap::new(),
            }),
            connectors: connectors.to_vec(),
            spare: eps.into_iter().map(|ep| Mutex::new(vec![ep])).collect(),
            areas,
            next_stamp: AtomicU64::new(1),
            next_client: AtomicU32::new(1),
            rebuilt: Mutex::new(Rebuilt::default()),
            down: Mutex::new(DownSince::new(connectors.len())),
            node_retry_ns: AtomicU64::new(DEFAULT_NODE_RETRY.as_nanos() as u64),
        };
        let rebuilt = coordinator.rebuild()?;
        tracing::info!(
            keys = rebuilt.keys,
            superseded = rebuilt.superseded,
            completed = rebuilt.completed,
            damaged = rebuilt.damaged,
            "CentralDS coordinator rebuilt its metadata from the memory nodes"
        );
        *coordinator
            .rebuilt
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = rebuilt;
        Ok(Arc::new(coordinator))
    }

    /// The memory nodes' block geometry.
    pub fn layout(&self) -> &CentralLayout {
        &self.layout
    }

    /// What this coordinator found on the memory nodes when it started.
    pub fn rebuilt(&self) -> Rebuilt {
        self.rebuilt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Scans every memory node's blocks and rebuilds the key map, the free lists and the stamp counter.
    fn rebuild(&self) -> Result<Rebuilt, PdpmError> {
        let block_len = self.layout.block_len() as usize;
        let mut found: HashMap<Vec<u8>, Found> = HashMap::new();
        // Whole unstamped blocks by key and version: replicas of a write whose stamping was cut short.
        let mut unstamped: HashMap<(Vec<u8>, u64), Vec<BlockRef>> = HashMap::new();
        let mut stale: Vec<BlockRef> = Vec::new();
        let mut out = Rebuilt::default();
        let mut max_stamp = 0u64;
        let mut max_client = 0u32;
        for node in 0..self.nodes {
            let mut ep = self.connectors[node].connect()?;
            let per_read = (ep.max_message_len() as usize / 2 / block_len).clamp(1, 1024);
            let mut buf = Vec::new();
            let mut first = 0u64;
            while first < self.layout.blocks {
                let n = (self.layout.blocks - first).min(per_read as u64);
                buf.resize(n as usize * block_len, 0);
                let area = &self.areas[node];
                ep.read(
                    area.data.at(area.body + first * self.layout.block_len()),
                    &mut buf,
                )?;
                for (i, b) in buf.chunks_exact(block_len).enumerate() {
                    let r = BlockRef {
                        node: node as u16,
                        block: (first + i as u64) as u32,
                    };
                    let stamp = le_u64(b, 0);
                    let Some((version, key, _)) = parse_block(&self.layout, b) else {
                        if stamp != 0 {
                            out.damaged += 1;
                            stale.push(r);
                        }
                        continue;
                    };
                    max_client = max_client.max((version >> 32) as u32);
                    // The stamp word lies outside the block's checksum; the last stamp would leave no next one.
                    if stamp == u64::MAX {
                        out.damaged += 1;
                        stale.push(r);
                        continue;
                    }
                    if stamp == 0 {
                        unstamped
                            .entry((key.to_vec(), version))
                            .or_default()
                            .push(r);
                        continue;
                    }
                    max_stamp = max_stamp.max(stamp);
                    match found.get_mut(key) {
                        Some(f) if f.stamp == stamp => f.blocks.push(r),
                        Some(f) if f.stamp > stamp => stale.push(r),
                        Some(f) => {
                            stale.append(&mut f.blocks);
                            *f = Found {
                                stamp,
                                version,
                                blocks: vec![r],
                            };
                        }
                        None => {
                            found.insert(
                                key.to_vec(),
                                Found {
                                    stamp,
                                    version,
                                    blocks: vec![r],
                                },
                            );
                        }
                    }
                }
                first += n;
            }
        }
        let mut used: HashSet<BlockRef> = HashSet::new();
        let replication = self.config.replication as usize;
        for (key, f) in found.iter_mut() {
            if f.blocks.len() < replication
                && let Some(extra) = unstamped.get(&(key.clone(), f.version))
            {
                for &r in extra {
                    if f.blocks.len() >= replication || f.blocks.iter().any(|b| b.node == r.node) {
                        continue;
                    }
                    self.write_stamp(r, f.stamp)?;
                    f.blocks.push(r);
                    out.completed += 1;
                }
            }
            used.extend(f.blocks.iter().copied());
        }
        out.superseded = stale.len() - out.damaged;
        for &r in &stale {
            self.write_stamp(r, 0)?;
        }
        let mut free = vec![Vec::new(); self.nodes];
        for (node, list) in free.iter_mut().enumerate() {
            // Popped from the end: low blocks first.
            for block in (0..self.layout.blocks as u32).rev() {
                let r = BlockRef {
                    node: node as u16,
                    block,
                };
                if !used.contains(&r) {
                    list.push(block);
                }
            }
        }
        out.keys = found.len();
        for (key, f) in found {
            let entry = Entry {
                committed: Some(Committed {
                    location: Location(f.blocks),
                    version: f.version,
                }),
                detached: false,
            };
            self.shard(&key)
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, Arc::new(RwLock::new(entry)));
        }
        self.lock_space().free = free;
        self.next_stamp.store(max_stamp + 1, Ordering::Relaxed);
        // Wraps to 0 only past the last id, which `next_id` never hands out.
        self.next_client
            .store(max_client.wrapping_add(1), Ordering::Relaxed);
        Ok(out)
    }

    /// Runs `f` on an endpoint to memory node `node` that no other thread is using.
    fn with_ep<T>(
        &self,
        node: usize,
        f: impl FnOnce(&mut Endpoint) -> Result<T, PdpmError>,
    ) -> Result<T, PdpmError> {
        let spare = &self.spare[node];
        let taken = spare.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut ep = match taken {
            Some(ep) => ep,
            None => self.connectors[node].connect()?,
        };
        let r = f(&mut ep);
        // An endpoint whose verb failed is dropped: the next user connects afresh.
        if r.is_ok() {
            spare.lock().unwrap_or_else(|e| e.into_inner()).push(ep);
        }
        r
    }

    /// WRITEs `stamp` into a block's stamp word (persistent when the WRITE returns).
    fn write_stamp(&self, b: BlockRef, stamp: u64) -> Result<(), PdpmError> {
        let area = self
            .areas
            .get(b.node as usize)
            .ok_or_else(|| PdpmError::Coordinator(format!("no memory node {}", b.node)))?;
        let addr = area
            .data
            .at(area.body + b.block as u64 * self.layout.block_len());
        let r = self.with_ep(b.node as usize, |ep| {
            ep.write(addr, &stamp.to_le_bytes())?;
            Ok(())
        });
        if let Err(e) = &r
            && is_node_failure(e)
        {
            self.mark_down(b.node as usize);
        }
        r
    }

    /// Records that memory node `node` is unreachable: no blocks on it are granted for `node_retry`.
    pub fn mark_down(&self, node: usize) {
        self.down
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .mark(node, &"granting no blocks on it");
    }

    /// Sets how long a memory node found unreachable (by a failed stamp or a client's report) gets no new
    /// blocks before it is tried again (default [`DEFAULT_NODE_RETRY`]).
    pub fn set_node_retry(&self, retry: Duration) {
        let ns = u64::try_from(retry.as_nanos()).unwrap_or(u64::MAX);
        self.node_retry_ns.store(ns, Ordering::Relaxed);
    }

    /// The memory nodes currently given no new blocks.
    pub fn down_nodes(&self) -> Vec<usize> {
        let retry = Duration::from_nanos(self.node_retry_ns.load(Ordering::Relaxed));
        let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.nodes).filter(|&n| down.within(n, retry)).collect()
    }

    /// Clears the stamps of a location's blocks and frees them.
    fn retire(&self, location: &Location) -> Result<(), PdpmError> {
        let mut r = Ok(());
        for &b in &location.0 {
            if let Err(e) = self.write_stamp(b, 0) {
                r = Err(e);
            }
        }
        // Freed even when a clear failed: a client's write clears the stamp before it writes anything else.
        self.free_location(location);
        r
    }

    /// Serves this coordinator's RPCs on `host`'s processor threads.
    pub fn serve(self: &Arc<Coordinator>, host: &MemoryNode) {
        host.set_rpc_handler(self.clone());
    }

    /// One step of a walk over the keys with a committed value: the keys of index shard `cursor` (0 starts a
    /// walk), and of the shards after it until about `count` keys are named, with the shard the next step starts
    /// at (0 once the last was read). A key stays in its shard, so a whole walk names every key there throughout.
    pub fn scan_keys(&self, cursor: u64, count: u32) -> (u64, Vec<Vec<u8>>) {
        let mut keys = Vec::new();
        let mut shard = cursor;
        while let Some(s) = usize::try_from(shard).ok().and_then(|i| self.shards.get(i)) {
            let s = s.read().unwrap_or_else(|e| e.into_inner());
            keys.extend(
                s.iter()
                    .filter(|(_, e)| {
                        e.read()
                            .unwrap_or_else(|e| e.into_inner())
                            .committed
                            .is_some()
                    })
                    .map(|(k, _)| k.clone()),
            );
            shard += 1;
            // Whatever `count` asks, a reply stays far below the fabric's message limit.
            if keys.len() >= (count as usize).min(1 << 16) {
                break;
            }
        }
        let next = if shard >= self.shards.len() as u64 {
            0
        } else {
            shard
        };
        (next, keys)
    }

    /// Keys with a committed value.
    pub fn key_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.read()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .filter(|e| {
                        e.read()
                            .unwrap_or_else(|e| e.into_inner())
                            .committed
                            .is_some()
                    })
                    .count()
            })
            .sum()
    }

    /// Free blocks per memory node.
    pub fn free_blocks(&self) -> Vec<usize> {
        self.lock_space().free.iter().map(Vec::len).collect()
    }

    /// Returns every block granted to `client` and not committed to the free lists (for a client known to be
    /// gone). Returns how many blocks came back.
    pub fn reclaim_grants(&self, client: u32) -> usize {
        let mut space = self.lock_space();
        let blocks = space.granted.remove(&client).unwrap_or_default();
        let n = blocks.len();
        for b in blocks {
            space.free[b.node as usize].push(b.block);
        }
        n
    }

    fn lock_space(&self) -> std::sync::MutexGuard<'_, Space> {
        self.space.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shard(&self, key: &[u8]) -> &Shard {
        &self.shards[(hash(key, 0x5a4d) % self.shards.len() as u64) as usize]
    }

    fn grant(&self, client: u32, count: u32) -> Result<Vec<Location>, RpcError> {
        let count = count.min(self.config.max_grant);
        let r = self.config.replication as usize;
        let down = self.down_nodes();
        let mut space = self.lock_space();
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            // The replicas go to the live memory nodes with the most free blocks.
            let mut order: Vec<usize> = (0..self.nodes).filter(|n| !down.contains(n)).collect();
            order.sort_by_key(|&n| std::cmp::Reverse(space.free[n].len()));
            if order.len() < r {
                return Err(failed(format!(
                    "{} live memory nodes, replication {r} needs more (down: {down:?})",
                    order.len()
                )));
            }
            if space.free[order[r - 1]].is_empty() {
                break;
            }
            let mut loc = Vec::with_capacity(r);
            for &node in &order[..r] {
                let block = space.free[node].pop().unwrap_or_default();
                loc.push(BlockRef {
                    node: node as u16,
                    block,
                });
            }
            space
                .granted
                .entry(client)
                .or_default()
                .extend(loc.iter().copied());
            out.push(Location(loc));
        }
        if out.is_empty() && count > 0 {
            return Err(RpcError::OutOfSpace(
                "no free blocks on enough memory nodes".into(),
            ));
        }
        Ok(out)
    }

    fn take_granted(&self, client: u32, location: &Location) -> Result<(), RpcError> {
        let mut space = self.lock_space();
        let mine = space.granted.entry(client).or_default();
        // Each block once: a repeated block would be freed twice later, and then granted twice.
        let distinct = location
            .0
            .iter()
            .enumerate()
            .all(|(i, b)| !location.0[..i].contains(b));
        if location.0.len() != self.config.replication as usize
            || !distinct
            || !location.0.iter().all(|b| mine.contains(b))
        {
            return Err(failed("location was not granted to this client"));
        }
        for b in &location.0 {
            mine.remove(b);
        }
        Ok(())
    }

    fn free_location(&self, location: &Location) {
        let mut space = self.lock_space();
        for b in &location.0 {
            space.free[b.node as usize].push(b.block);
        }
    }

    /// `key`'s entry, created empty when it has none. A key already present (every overwrite) costs a shared
    /// lock of its shard; only a new key takes the shard's write lock.
    fn entry(&self, key: &[u8]) -> Arc<RwLock<Entry>> {
        let shard = self.shard(key);
        if let Some(entry) = shard.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            return entry.clone();
        }
        shard
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_vec())
            .or_default()
            .clone()
    }

    fn lookup(&self, key: &[u8]) -> Option<Committed> {
        let entry = self
            .shard(key)
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()?;
        let e = entry.read().unwrap_or_else(|e| e.into_inner());
        e.committed.clone()
    }

    /// Makes a written location the key's committed value if `req.expect` holds: `Ok(false)` when it does not
    /// (nothing changed; the blocks stay granted to the client).
    fn commit(&self, req: CommitRequest) -> Result<bool, RpcError> {
        if req.key.len() > self.layout.max_key as usize {
            return Err(failed("key longer than the block limit"));
        }
        loop {
            let entry = self.entry(&req.key);
            let mut e = entry.write().unwrap_or_else(|e| e.into_inner());
            if e.detached {
                continue;
            }
            if !req.expect.holds(e.committed.as_ref()) {
                return Ok(false);
            }
            self.take_granted(req.client, &req.location)?;
            // Stamped under the key's lock: a key's stamps grow in commit order.
            let stamp = self.next_stamp.fetch_add(1, Ordering::Relaxed);
            for &b in &req.location.0 {
                if let Err(err) = self.write_stamp(b, stamp) {
                    // Not committed: the blocks go back to the client's grant (a stamped one is superseded by
                    // the key's next commit or cleared by a rebuild).
                    self.lock_space()
                        .granted
                        .entry(req.client)
                        .or_default()
                        .extend(req.location.0.iter().copied());
                    return Err(failed(format!("stamping the committed blocks: {err}")));
                }
            }
            let old = e.committed.replace(Committed {
                location: req.location,
                version: req.version,
            });
            drop(e);
            if let Some(old) = old
                && let Err(err) = self.retire(&old.location)
            {
                // The new value is committed; a rebuild would still prefer its higher stamp.
                tracing::warn!(error = %err, "could not clear the stamps of an overwritten value");
            }
            return Ok(true);
        }
    }

    fn delete(&self, key: &[u8], expect: Expect) -> Result<Deleted, RpcError> {
        let mut shard = self.shard(key).write().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = shard.get(key).cloned() else {
            return Ok(if expect.holds(None) {
                Deleted::Absent
            } else {
                Deleted::Conflict
            });
        };
        let mut e = entry.write().unwrap_or_else(|e| e.into_inner());
        if !expect.holds(e.committed.as_ref()) {
            return Ok(Deleted::Conflict);
        }
        shard.remove(key);
        e.detached = true;
        let old = e.committed.take();
        drop(e);
        drop(shard);
        match old {
            // The delete is durable once the stamps are cleared: only then is it acknowledged.
            Some(old) => self
                .retire(&old.location)
                .map(|()| Deleted::Removed)
                .map_err(|err| failed(format!("clearing the deleted value's stamps: {err}"))),
            None => Ok(Deleted::Absent),
        }
    }

    fn release(&self, req: ReleaseRequest) -> Result<(), RpcError> {
        for loc in &req.locations {
            self.take_granted(req.client, loc)?;
            self.free_location(loc);
        }
        Ok(())
    }
}

impl RpcHandler for Coordinator {
    fn handle(
        &self,
        _caller: Option<ClientId>,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), RpcError> {
        match method {
            method::LAYOUT => encode(
                &LayoutReply {
                    replication: self.config.replication,
                    nodes: self.nodes as u32,
                    layout: self.layout.clone(),
                    client: crate::next_id(&self.next_client),
                },
                response,
            ),
            method::GRANT => {
                let req: GrantRequest = decode(request)?;
                encode(&self.grant(req.client, req.count)?, response)
            }
            method::LOOKUP => {
                let key: Vec<u8> = decode(request)?;
                encode(&self.lookup(&key), response)
            }
            method::COMMIT => {
                let req: CommitRequest = decode(request)?;
                encode(&self.commit(req)?, response)
            }
            method::DELETE => {
                let req: DeleteRequest = decode(request)?;
                encode(&self.delete(&req.key, req.expect)?, response)
            }
            method::RELEASE => {
                let req: ReleaseRequest = decode(request)?;
                self.release(req)?;
                encode(&(), response)
            }
            method::COUNT => encode(&(self.key_count() as u64), response),
            method::SCAN => {
                let (cursor, count): (u64, u32) = decode(request)?;
                encode(&self.scan_keys(cursor, count), response)
            }
            method::REPORT_DOWN => {
                self.mark_down(reported_down(request, self.nodes)?);
                encode(&(), response)
            }
            other => Err(RpcError::UnknownMethod(other)),
        }
    }
}

/// Settings of a CentralDS client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CentralSettings {
    /// Locations asked for per GRANT. Default 32.
    pub grant_batch: u32,
    /// GETs that find their block reused by a later write start over this many times. Default 16.
    pub read_retries: u32,
    /// Post the WRITE with its validating READ in one round trip (a PUT costs 2). Default false: the paper's 3.
    pub fuse_validation: bool,
    /// How long a read-modify-write whose conditional commit keeps finding the key changed may go on starting
    /// over (with randomized exponential backoff, up to `update_backoff_max` between attempts) before it gives up.
    /// Default 10 s.
    #[serde(with = "humantime_serde")]
    pub update_wait: Duration,
    /// Longest pause between two attempts of a read-modify-write. Default 1 ms.
    #[serde(with = "humantime_serde")]
    pub update_backoff_max: Duration,
    /// A memory node whose connection failed is left alone (reads use the value's next block, writes other
    /// granted blocks) for this long before the client connects to it again. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub node_retry: Duration,
}

impl Default for CentralSettings {
    fn default() -> Self {
        CentralSettings {
            grant_batch: 32,
            read_retries: 16,
            fuse_validation: false,
            update_wait: Duration::from_secs(10),
            update_backoff_max: Duration::from_millis(1),
            node_retry: Duration::from_secs(1),
        }
    }
}

/// Where a crash is injected into a PUT (for crash tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CentralCrash {
    /// The value is written to its blocks, not validated.
    AfterWrite,
    /// Written and validated; the commit was never sent.
    AfterValidate,
}

/// One compute-node thread's CentralDS client.
pub struct CentralClient {
    coordinator: Endpoint,
    /// The memory nodes; each node's area is its block area, whose body starts with block 0.
    nodes: MemoryNodes<CentralLayout>,
    settings: CentralSettings,
    id: u32,
    seq: u32,
    granted: Vec<Location>,
    batch: Batch<'static>,
}

impl std::fmt::Debug for CentralClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CentralClient")
            .field("id", &self.id)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl CentralClient {
    /// Connects to the coordinator and to its memory nodes (in the coordinator's order).
    pub fn connect(
        coordinator: &Connector,
        memory_nodes: &[Connector],
        settings: CentralSettings,
    ) -> Result<CentralClient, PdpmError> {
        if settings.grant_batch == 0 {
            return Err(PdpmError::Config("grant_batch must be at least 1".into()));
        }
        let mut coord = coordinator.connect()?;
        let reply: LayoutReply = coord.call(method::LAYOUT, &())?;
        if reply.nodes as usize != memory_nodes.len() {
            return Err(PdpmError::Config(format!(
                "the coordinator manages {} memory nodes, {} given",
                reply.nodes,
                memory_nodes.len()
            )));
        }
        let nodes = MemoryNodes::<CentralLayout>::connect(memory_nodes, settings.node_retry)?;
        if nodes.layout != reply.layout {
            return Err(PdpmError::Layout {
                node: 0,
                why: "block area differs from the coordinator's".into(),
            });
        }
        let id = crate::named_client(reply.client)?;
        Ok(CentralClient {
            coordinator: coord,
            nodes,
            settings,
            id,
            seq: 0,
            granted: Vec::new(),
            batch: Batch::new(),
        })
    }

    /// The block geometry of the memory nodes.
    pub fn layout(&self) -> &CentralLayout {
        &self.nodes.layout
    }

    /// This client's identity at the coordinator (for [`Coordinator::reclaim_grants`]).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Asks for granted locations now, so that the next PUTs need no GRANT call.
    pub fn refill(&mut self) -> Result<(), PdpmError> {
        let got: Vec<Location> = self.coordinator.call(
            method::GRANT,
            &GrantRequest {
                client: self.id,
                count: self.settings.grant_batch,
            },
        )?;
        self.granted.extend(got);
        Ok(())
    }

    /// Runs a PUT up to `point` and stops, as a client that crashed would. For crash tests.
    pub fn put_crashing(
        &mut self,
        key: &[u8],
        value: &[u8],
        point: CentralCrash,
    ) -> Result<(), PdpmError> {
        self.put_inner(key, value, Some(point), Expect::Any)
            .map(|_| ())
    }

    /// The fault hooks of this client's current connection to memory node `node` (tests cut it to fail the node;
    /// a reconnection after [`CentralSettings::node_retry`] gets fresh hooks).
    pub fn fault_hooks(&self, node: usize) -> Option<Arc<FaultHooks>> {
        self.nodes.fault_hooks(node)
    }

    /// Passes `r` on; when its error says memory node `node` is gone, marks it down and tells the coordinator
    /// (best effort), so that new grants avoid it.
    fn on<T, E: Into<PdpmError>>(&mut self, node: usize, r: Result<T, E>) -> Result<T, PdpmError> {
        self.nodes
            .track_reporting(node, r, &mut self.coordinator, method::REPORT_DOWN)
    }

    /// Gives granted locations back to the coordinator (best effort).
    fn release(&mut self, locations: Vec<Location>) {
        if locations.is_empty() {
            return;
        }
        if let Err(e) = self.coordinator.call::<_, ()>(
            method::RELEASE,
            &ReleaseRequest {
                client: self.id,
                locations,
            },
        ) {
            tracing::debug!(error = %e, "could not give granted blocks back");
        }
    }

    /// A granted location whose memory nodes are all reachable; locations on nodes known to be down go back.
    fn take_location(&mut self) -> Result<Location, PdpmError> {
        for _ in 0..2 {
            if self.granted.is_empty() {
                self.refill()?;
            }
            while let Some(location) = self.granted.pop() {
                if location
                    .0
                    .iter()
                    .all(|b| self.nodes.reachable(b.node as usize))
                {
                    return Ok(location);
                }
                self.release(vec![location]);
            }
        }
        Err(PdpmError::Coordinator(
            "no granted blocks on reachable memory nodes".into(),
        ))
    }

    fn check(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), PdpmError> {
        check_key(key, self.nodes.layout.max_key)?;
        value.map_or(Ok(()), |v| check_value(v, self.nodes.layout.max_value))
    }

    fn block_addr(&self, b: BlockRef) -> Result<dinomo_fabric::RemoteAddr, PdpmError> {
        let area = self.nodes.areas.get(b.node as usize).ok_or_else(|| {
            PdpmError::Coordinator(format!("location names memory node {}", b.node))
        })?;
        if b.block as u64 >= self.nodes.layout.blocks {
            return Err(PdpmError::Coordinator(format!(
                "location names block {}",
                b.block
            )));
        }
        Ok(area
            .data
            .at(area.body + b.block as u64 * self.nodes.layout.block_len()))
    }

    /// Writes `value` out of place and commits it if `expect` holds; whether it did (when not, the written blocks
    /// stay this client's for its next write).
    fn put_inner(
        &mut self,
        key: &[u8],
        value: &[u8],
        crash: Option<CentralCrash>,
        expect: Expect,
    ) -> Result<bool, PdpmError> {
        self.check(key, Some(value))?;
        self.seq = self.seq.wrapping_add(1);
        let version = ((self.id as u64) << 32) | self.seq as u64;
        let block = encode_block(version, key, value);
        let tail = block.len() as u64 - 8;
        // Nothing is visible before COMMIT: a location whose node fails while it is written goes back and the
        // write moves to another one (the coordinator, told of the failure, grants none on that node).
        let mut attempt = 0;
        let (location, r) = loop {
            let location = self.take_location()?;
            let r = self.write_blocks(&location, &block, tail, crash);
            match r {
                Err(e) if is_node_failure(&e) && attempt < self.nodes.len() => {
                    tracing::debug!(error = %e, "writing the value elsewhere");
                    self.release(vec![location]);
                    attempt += 1;
                }
                r => break (location, r),
            }
        };
        if crash.is_some() {
            return r.map(|()| true);
        }
        let r = r.and_then(|()| {
            self.coordinator
                .call::<_, bool>(
                    method::COMMIT,
                    &CommitRequest {
                        client: self.id,
                        key: key.to_vec(),
                        location: location.clone(),
                        version,
                        expect,
                    },
                )
                .map_err(PdpmError::from)
        });
        if let Ok(false) = r {
            self.granted.push(location);
            return r;
        }
        if r.is_err() {
            // The blocks go back so they are not lost while this client lives.
            self.release(vec![location]);
        }
        r
    }

    fn write_blocks(
        &mut self,
        location: &Location,
        block: &[u8],
        tail: u64,
        crash: Option<CentralCrash>,
    ) -> Result<(), PdpmError> {
        let addrs = location
            .0
            .iter()
            .map(|b| Ok((b.node as usize, self.block_addr(*b)?)))
            .collect::<Result<Vec<_>, PdpmError>>()?;
        let want = &block[tail as usize..];
        if self.settings.fuse_validation && crash.is_none() {
            for &(node, addr) in &addrs {
                let r = write_validated(
                    &mut self.nodes.eps[node],
                    &mut self.batch,
                    node,
                    None,
                    addr,
                    block,
                    tail,
                );
                self.on(node, r)?;
            }
            return Ok(());
        }
        for &(node, addr) in &addrs {
            let r = self.nodes.eps[node].write(addr, block);
            self.on(node, r)?;
        }
        if crash == Some(CentralCrash::AfterWrite) {
            return Ok(());
        }
        for &(node, addr) in &addrs {
            let mut last = [0u8; 8];
            let r = self.nodes.eps[node].read(addr.offset_by(tail), &mut last);
            self.on(node, r)?;
            validate(node, None, &last, want)?;
        }
        Ok(())
    }
}

impl CentralClient {
    /// The committed version and value of `key` (LOOKUP, READ), starting over when the block was reused.
    fn read_current(&mut self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, PdpmError> {
        let len = self.nodes.layout.block_len() as usize;
        for _ in 0..=self.settings.read_retries {
            let committed: Option<Committed> = self.coordinator.call(method::LOOKUP, &key)?;
            let Some(c) = committed else {
                return Ok(None);
            };
            // The first block on a reachable node; every block of a committed location holds the same value.
            let mut buf = vec![0u8; len];
            let mut read = None;
            let mut tried = Tried::default();
            for &b in &c.location.0 {
                let node = b.node as usize;
                if !self.nodes.reachable(node) {
                    tried.skipped(node);
                    continue;
                }
                let addr = self.block_addr(b)?;
                let r = self.nodes.eps[node].read(addr, &mut buf);
                match self.on(node, r) {
                    Ok(()) => {
                        read = Some(b);
                        break;
                    }
                    Err(e) if is_node_failure(&e) => tried.failed(node, &e),
                    Err(e) => return Err(e),
                }
            }
            let Some(first) = read else {
                return Err(tried.node_down(
                    c.location.0.first().map_or(0, |b| b.node as usize),
                    "block of the key's value",
                ));
            };
            match parse_block(&self.nodes.layout, &buf) {
                Some((version, k, v)) if version == c.version && k == key => {
                    return Ok(Some((version, v.to_vec())));
                }
                // Freed by a later write and reused: ask again.
                _ => tracing::debug!(
                    node = first.node,
                    block = first.block,
                    "block reused; retrying"
                ),
            }
        }
        Err(PdpmError::Contended {
            node: 0,
            slot: 0,
            attempts: self.settings.read_retries + 1,
        })
    }

    fn delete_if(&mut self, key: &[u8], expect: Expect) -> Result<Deleted, PdpmError> {
        self.check(key, None)?;
        Ok(self.coordinator.call(
            method::DELETE,
            &DeleteRequest {
                key: key.to_vec(),
                expect,
            },
        )?)
    }
}

impl PdpmStore for CentralClient {
    fn max_value_len(&self) -> usize {
        self.nodes.layout.max_value as usize
    }

    /// Keys with a committed value, as the coordinator counts them (one RPC).
    fn key_count(&mut self) -> Result<u64, PdpmError> {
        Ok(self.coordinator.call(method::COUNT, &())?)
    }

    /// The coordinator's walk over its index shards (one RPC per step; [`Coordinator::scan_keys`]).
    fn scan_keys(&mut self, cursor: u64, count: u32) -> Result<(u64, Vec<Vec<u8>>), PdpmError> {
        Ok(self.coordinator.call(method::SCAN, &(cursor, count))?)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PdpmError> {
        self.check(key, None)?;
        Ok(self.read_current(key)?.map(|(_, v)| v))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PdpmError> {
        self.put_inner(key, value, None, Expect::Any).map(|_| ())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), PdpmError> {
        self.delete_if(key, Expect::Any).map(|_| ())
    }

    /// Optimistic: read (LOOKUP, READ), `f`, then a COMMIT or DELETE conditional on the version read; a conflict
    /// starts over (so `f` may run again) after a randomized, exponentially growing pause (contenders spread out,
    /// so each gets its turn), for up to `update_wait`.
    fn update(
        &mut self,
        key: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>) -> Change,
    ) -> Result<(), PdpmError> {
        self.check(key, None)?;
        let start = Instant::now();
        let mut attempts = 0u32;
        loop {
            let current = self.read_current(key)?;
            let expect = match &current {
                Some((version, _)) => Expect::Version(*version),
                None => Expect::Absent,
            };
            let applied = match f(current.as_ref().map(|(_, v)| v.as_slice())) {
                Change::Keep => true,
                Change::Put(v) => self.put_inner(key, &v, None, expect)?,
                Change::Delete if current.is_none() => true,
                Change::Delete => self.delete_if(key, expect)? != Deleted::Conflict,
            };
            attempts = attempts.saturating_add(1);
            if applied {
                return Ok(());
            }
            if start.elapsed() >= self.settings.update_wait {
                return Err(PdpmError::Conflict {
                    attempts,
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            let cap = (Duration::from_micros(1) * (1u32 << attempts.min(20)))
                .min(self.settings.update_backoff_max);
            let cap_ns = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
            std::thread::sleep(Duration::from_nanos(rand::random_range(0..=cap_ns)));
        }
    }
}

impl Drop for CentralClient {
    fn drop(&mut self) {
        let locations = std::mem::take(&mut self.granted);
        self.release(locations);
    }
}

/// A block as a client writes it: stamp 0 (the coordinator stamps it on COMMIT).
fn encode_block(version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCK_HEADER + key.len() + value.len() + 4);
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(value.len() as u32).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    let crc = crc32c::crc32c(&b[SEALED_FROM..]);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The version, key and value of a whole block; `None` for anything else.
fn parse_block<'a>(layout: &CentralLayout, b: &'a [u8]) -> Option<(u64, &'a [u8], &'a [u8])> {
    if b.len() < BLOCK_HEADER {
        return None;
    }
    let version = u64::from_le_bytes(b[8..16].try_into().ok()?);
    let klen = u16::from_le_bytes([b[16], b[17]]) as usize;
    let vlen = u32::from_le_bytes(b[20..24].try_into().ok()?) as usize;
    if klen > layout.max_key as usize || vlen > layout.max_value as usize {
        return None;
    }
    let end = BLOCK_HEADER + klen + vlen;
    let crc = u32::from_le_bytes(b.get(end..end + 4)?.try_into().ok()?);
    if crc32c::crc32c(&b[SEALED_FROM..end]) != crc {
        return None;
    }
    Some((
        version,
        &b[BLOCK_HEADER..BLOCK_HEADER + klen],
        &b[BLOCK_HEADER + klen..end],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_damage_is_caught() {
        let l = CentralLayout::default();
        let b = encode_block(42, b"key", b"value");
        let mut image = vec![0u8; l.block_len() as usize];
        image[..b.len()].copy_from_slice(&b);
        assert_eq!(
            parse_block(&l, &image),
            Some((42, &b"key"[..], &b"value"[..]))
        );
        for i in SEALED_FROM..b.len() {
            let mut bad = image.clone();
            bad[i] ^= 0x40;
            assert_eq!(parse_block(&l, &bad), None, "flip at {i}");
        }
        let h = l.encode();
        assert_eq!(CentralLayout::decode(&h), Ok(l));
    }

    /// Memory nodes with `blocks` blocks each, and a function that starts a coordinator (and its host) on them.
    fn memory_nodes(count: usize, blocks: u64) -> Vec<(Arc<Pool>, Arc<MemoryNode>)> {
        use dinomo_fabric::NodeConfig;
        (0..count)
            .map(|_| {
                let pool = Arc::new(Pool::anonymous(8 << 20, 1 << 20).unwrap());
                format(
                    &pool,
                    &CentralLayout {
                        blocks,
                        ..CentralLayout::default()
                    },
                )
                .unwrap();
                let node = MemoryNode::new(pool.clone(), NodeConfig::default());
                (pool, node)
            })
            .collect()
    }

    fn start(
        nodes: &[(Arc<Pool>, Arc<MemoryNode>)],
        replication: u32,
    ) -> (Arc<Coordinator>, Arc<MemoryNode>, Vec<Connector>) {
        use dinomo_fabric::{NodeConfig, Target};
        let connectors: Vec<Connector> = nodes
            .iter()
            .map(|(_, n)| Connector::new(Target::InProcess(n.clone())))
            .collect();
        let coordinator = Coordinator::new(
            &connectors,
            CoordinatorConfig {
                replication,
                ..CoordinatorConfig::default()
            },
        )
        .unwrap();
        let host = MemoryNode::new(
            Arc::new(Pool::anonymous(4 << 20, 1 << 20).unwrap()),
            NodeConfig {
                rpc_threads: 2,
                ..NodeConfig::default()
            },
        );
        coordinator.serve(&host);
        (coordinator, host, connectors)
    }

    fn client(host: &Arc<MemoryNode>, connectors: &[Connector]) -> CentralClient {
        use dinomo_fabric::Target;
        CentralClient::connect(
            &Connector::new(Target::InProcess(host.clone())),
            connectors,
            CentralSettings {
                grant_batch: 2,
                ..CentralSettings::default()
            },
        )
        .unwrap()
    }

    /// Pool offset of block `block` of a formatted pool.
    fn block_offset(pool: &Pool, block: u64) -> u64 {
        let base = pool.root(roots::CENTRAL_BLOCKS).unwrap();
        base + HEADER_LEN + block * CentralLayout::default().block_len()
    }

    #[test]
    fn a_restarted_coordinator_rebuilds_from_the_blocks_and_ignores_torn_and_superseded_ones() {
        let nodes = memory_nodes(1, 16);
        let (first, host, connectors) = start(&nodes, 1);
        let mut c = client(&host, &connectors);
        c.put(b"k1", b"v1").unwrap();
        c.put(b"k2", b"v2").unwrap();
        c.put(b"k1", b"v1b").unwrap();
        c.delete(b"k2").unwrap();
        c.put(b"k3", b"v3").unwrap();
        let stamps = first.next_stamp.load(Ordering::Relaxed);
        drop(c);
        drop(host);
        drop(first);
        let pool = &nodes[0].0;
        // A stamped block cut short by a crash (its CRC fails), with a stamp above every real one.
        let mut torn = encode_block(99, b"k1", b"torn value");
        torn[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let cut = torn.len() - 3;
        pool.write(block_offset(pool, 15), &torn[..cut]).unwrap();
        // An older whole copy of k1 whose stamp was never cleared (a crash between stamping and clearing).
        let mut older = encode_block(98, b"k1", b"older");
        older[0..8].copy_from_slice(&1u64.to_le_bytes());
        pool.write(block_offset(pool, 14), &older).unwrap();
        // A whole block never committed (a client that crashed before COMMIT).
        pool.write(block_offset(pool, 13), &encode_block(97, b"k4", b"lost"))
            .unwrap();

        let (second, host, connectors) = start(&nodes, 1);
        assert_eq!(
            second.rebuilt(),
            Rebuilt {
                keys: 2,
                superseded: 1,
                completed: 0,
                damaged: 1
            }
        );
        assert_eq!(second.key_count(), 2);
        assert_eq!(second.free_blocks(), vec![14]);
        assert!(second.next_stamp.load(Ordering::Relaxed) >= stamps);
        let mut c = client(&host, &connectors);
        assert_eq!(c.get(b"k1").unwrap().as_deref(), Some(&b"v1b"[..]));
        assert_eq!(c.get(b"k2").unwrap(), None);
        assert_eq!(c.get(b"k3").unwrap().as_deref(), Some(&b"v3"[..]));
        assert_eq!(c.get(b"k4").unwrap(), None);
        // Writes go on, and a third start agrees.
        c.put(b"k2", b"again").unwrap();
        c.put(b"k1", b"v1c").unwrap();
        drop(c);
        drop(host);
        drop(second);
        let (third, host, connectors) = start(&nodes, 1);
        assert_eq!(third.rebuilt().superseded, 0, "stale stamps were cleared");
        let mut c = client(&host, &connectors);
        assert_eq!(c.get(b"k1").unwrap().as_deref(), Some(&b"v1c"[..]));
        assert_eq!(c.get(b"k2").unwrap().as_deref(), Some(&b"again"[..]));
        assert_eq!(third.key_count(), 3);
    }

    #[test]
    fn a_rebuild_completes_a_commit_whose_replica_stamping_was_cut_short() {
        let nodes = memory_nodes(2, 8);
        let (first, host, connectors) = start(&nodes, 2);
        let mut c = client(&host, &connectors);
        c.put(b"r", b"replicated").unwrap();
        let location = first.lookup(b"r").unwrap().location;
        drop(c);
        drop(host);
        drop(first);
        // The crash came after the first replica's stamp and before the second's.
        let second_replica = location.0[1];
        let pool = &nodes[second_replica.node as usize].0;
        pool.write(
            block_offset(pool, second_replica.block as u64),
            &0u64.to_le_bytes(),
        )
        .unwrap();
        let (second, host, connectors) = start(&nodes, 2);
        assert_eq!(second.rebuilt().completed, 1);
        assert_eq!(second.lookup(b"r").unwrap().location.0.len(), 2);
        assert_eq!(second.free_blocks(), vec![7, 7]);
        let mut c = client(&host, &connectors);
        assert_eq!(c.get(b"r").unwrap().as_deref(), Some(&b"replicated"[..]));
    }

    #[test]
    fn commits_of_blocks_not_granted_to_the_client_are_refused() {
        use dinomo_fabric::{NodeConfig, Target};
        let pool = Arc::new(Pool::anonymous(8 << 20, 1 << 20).unwrap());
        format(
            &pool,
            &CentralLayout {
                blocks: 8,
                ..CentralLayout::default()
            },
        )
        .unwrap();
        let node = MemoryNode::new(pool, NodeConfig::default());
        let coordinator = Coordinator::new(
            &[Connector::new(Target::InProcess(node))],
            CoordinatorConfig::default(),
        )
        .unwrap();
        let granted = coordinator.grant(1, 2).unwrap();
        let commit = |client: u32, location: Location| {
            coordinator.commit(CommitRequest {
                client,
                key: b"k".to_vec(),
                location,
                version: 7,
                expect: Expect::Any,
            })
        };
        // Another client's grant, a block never granted, a location of the wrong size.
        assert!(commit(2, granted[0].clone()).is_err());
        let never = BlockRef { node: 0, block: 7 };
        assert!(granted.iter().all(|l| l.0[0] != never));
        assert!(commit(1, Location(vec![never])).is_err());
        assert!(commit(1, Location(vec![])).is_err());
        // The rightful commit succeeds once, and the same blocks cannot be committed twice.
        commit(1, granted[0].clone()).unwrap();
        assert!(commit(1, granted[0].clone()).is_err());
        assert_eq!(coordinator.lookup(b"k").map(|c| c.version), Some(7));
        assert_eq!(coordinator.free_blocks(), vec![6]);
    }
}
