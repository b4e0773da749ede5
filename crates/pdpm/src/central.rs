//! CentralDS (pDPM §4.3): a coordinator is the serialization point and owns all metadata and space.
//!
//! **Coordinator.** [`Coordinator`] is an RPC handler installed on a fabric [`MemoryNode`] of its own (its threads
//! are the node's processor threads, `NodeConfig::rpc_threads`), reached like any memory node, in-process or over
//! TCP. It keeps, per key, the location of the committed value (one block on each of `R` memory nodes) and its
//! version under a per-key reader/writer lock, and hands out free blocks: the memory node with the most free
//! blocks first (the paper's load balancing of writes).
//!
//! **Memory nodes** hold a block area (anchored in root slot [`crate::roots::CENTRAL_BLOCKS`]) of fixed-size
//! blocks `[version: 8][key len: 2][0: 2][value len: 4][key][value][CRC32C: 4]`.
//!
//! **PUT** (3 round trips with R = 1; Table 1): the client WRITEs the block out of place into blocks granted to it
//! in advance (a `GRANT` call refills `grant_batch` of them, off the per-write path), READs its tail to validate
//! persistence, then `COMMIT`s at the coordinator, which swaps the key's location under the key's write lock and
//! frees the old blocks. With `fuse_validation` the WRITE and its READ share one round trip (2).
//! **GET** (2): `LOOKUP` at the coordinator (under the key's read lock), then one READ; the block's version, key
//! and CRC are checked, because a block freed by a later commit may be reused while a reader is on its way, and the
//! GET starts over then.
//!
//! A client that crashes mid-PUT leaves the old value: nothing is visible before `COMMIT`. Its granted blocks stay
//! out of the free list until [`Coordinator::reclaim_grants`] is called for it. The coordinator's metadata lives in
//! its memory only: a coordinator restart loses it (the paper persists it in the coordinator's PM and replicates it
//! to a backup coordinator; neither is built here).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dinomo_fabric::{Batch, Connector, Endpoint, MemoryNode, RpcError, RpcHandler, decode, encode};
use dinomo_pool::Pool;
use serde::{Deserialize, Serialize};

use crate::anchor::{self, Anchor, Anchored, HEADER_LEN, Located, le_u32, le_u64};
use crate::{
    PdpmError, PdpmStore, check_key, check_value, hash, new_client_id, roots, tags, validate,
    write_validated,
};

const BLOCK_HEADER: usize = 16;

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
    /// Remove a key.
    pub const DELETE: u16 = 0x4305;
    /// Give back granted blocks that will not be used.
    pub const RELEASE: u16 = 0x4306;
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
        version: 1,
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
    // Blocks need no zeroing: a block is read only where the coordinator says a committed value is.
    anchor::format(pool, layout, false)
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

#[derive(Debug, Serialize, Deserialize)]
struct CommitRequest {
    client: u32,
    key: Vec<u8>,
    location: Location,
    version: u64,
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

fn failed(why: impl Into<String>) -> RpcError {
    RpcError::Failed(why.into())
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
        let (_, _, layout) = anchor::locate_all::<CentralLayout>(connectors)?;
        let free = (0..connectors.len())
            .map(|_| (0..layout.blocks as u32).rev().collect())
            .collect();
        Ok(Arc::new(Coordinator {
            shards: (0..config.shards)
                .map(|_| RwLock::new(HashMap::new()))
                .collect(),
            config,
            layout,
            nodes: connectors.len(),
            space: Mutex::new(Space {
                free,
                granted: HashMap::new(),
            }),
        }))
    }

    /// Serves this coordinator's RPCs on `host`'s processor threads.
    pub fn serve(self: &Arc<Coordinator>, host: &MemoryNode) {
        host.set_rpc_handler(self.clone());
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
        let mut space = self.lock_space();
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            // The replicas go to the memory nodes with the most free blocks.
            let mut order: Vec<usize> = (0..self.nodes).collect();
            order.sort_by_key(|&n| std::cmp::Reverse(space.free[n].len()));
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
            return Err(failed(
                "out of space: no free blocks on enough memory nodes",
            ));
        }
        Ok(out)
    }

    fn take_granted(&self, client: u32, location: &Location) -> Result<(), RpcError> {
        let mut space = self.lock_space();
        let mine = space.granted.entry(client).or_default();
        if location.0.len() != self.config.replication as usize
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

    fn commit(&self, req: CommitRequest) -> Result<(), RpcError> {
        if req.key.len() > self.layout.max_key as usize {
            return Err(failed("key longer than the block limit"));
        }
        self.take_granted(req.client, &req.location)?;
        let new = Committed {
            location: req.location,
            version: req.version,
        };
        loop {
            let entry = {
                let mut shard = self
                    .shard(&req.key)
                    .write()
                    .unwrap_or_else(|e| e.into_inner());
                shard.entry(req.key.clone()).or_default().clone()
            };
            let mut e = entry.write().unwrap_or_else(|e| e.into_inner());
            if e.detached {
                continue;
            }
            let old = e.committed.replace(new);
            drop(e);
            if let Some(old) = old {
                self.free_location(&old.location);
            }
            return Ok(());
        }
    }

    fn delete(&self, key: &[u8]) -> bool {
        let mut shard = self.shard(key).write().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = shard.remove(key) else {
            return false;
        };
        let mut e = entry.write().unwrap_or_else(|e| e.into_inner());
        e.detached = true;
        let old = e.committed.take();
        drop(e);
        drop(shard);
        match old {
            Some(old) => {
                self.free_location(&old.location);
                true
            }
            None => false,
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
    fn handle(&self, method: u16, request: &[u8], response: &mut Vec<u8>) -> Result<(), RpcError> {
        match method {
            method::LAYOUT => encode(
                &LayoutReply {
                    replication: self.config.replication,
                    nodes: self.nodes as u32,
                    layout: self.layout.clone(),
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
                self.commit(req)?;
                encode(&(), response)
            }
            method::DELETE => {
                let key: Vec<u8> = decode(request)?;
                encode(&self.delete(&key), response)
            }
            method::RELEASE => {
                let req: ReleaseRequest = decode(request)?;
                self.release(req)?;
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
}

impl Default for CentralSettings {
    fn default() -> Self {
        CentralSettings {
            grant_batch: 32,
            read_retries: 16,
            fuse_validation: false,
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
    eps: Vec<Endpoint>,
    /// Each node's block area; its body starts with block 0.
    areas: Vec<Located>,
    layout: CentralLayout,
    settings: CentralSettings,
    id: u32,
    seq: u32,
    granted: Vec<Location>,
    batch: Batch,
}

static CLIENT_SEQ: AtomicU32 = AtomicU32::new(0);

impl std::fmt::Debug for CentralClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CentralClient")
            .field("id", &self.id)
            .field("nodes", &self.eps.len())
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
        let mut eps = Vec::new();
        let mut areas = Vec::new();
        for (node, c) in memory_nodes.iter().enumerate() {
            let mut ep = c.connect()?;
            let (area, l) = anchor::locate::<CentralLayout>(&mut ep, node)?;
            if l != reply.layout {
                return Err(PdpmError::Layout {
                    node,
                    why: "block area differs from the coordinator's".into(),
                });
            }
            eps.push(ep);
            areas.push(area);
        }
        // Distinct ids in one process even if the random draw repeats.
        let id = new_client_id() ^ CLIENT_SEQ.fetch_add(1, Ordering::Relaxed).rotate_left(16);
        Ok(CentralClient {
            coordinator: coord,
            eps,
            areas,
            layout: reply.layout,
            settings,
            id: if id == 0 { 1 } else { id },
            seq: 0,
            granted: Vec::new(),
            batch: Batch::new(),
        })
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
        self.put_inner(key, value, Some(point))
    }

    fn check(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), PdpmError> {
        check_key(key, self.layout.max_key)?;
        value.map_or(Ok(()), |v| check_value(v, self.layout.max_value))
    }

    fn block_addr(&self, b: BlockRef) -> Result<dinomo_fabric::RemoteAddr, PdpmError> {
        let area = self.areas.get(b.node as usize).ok_or_else(|| {
            PdpmError::Coordinator(format!("location names memory node {}", b.node))
        })?;
        if b.block as u64 >= self.layout.blocks {
            return Err(PdpmError::Coordinator(format!(
                "location names block {}",
                b.block
            )));
        }
        Ok(area
            .data
            .at(area.body + b.block as u64 * self.layout.block_len()))
    }

    fn put_inner(
        &mut self,
        key: &[u8],
        value: &[u8],
        crash: Option<CentralCrash>,
    ) -> Result<(), PdpmError> {
        self.check(key, Some(value))?;
        if self.granted.is_empty() {
            self.refill()?;
        }
        let Some(location) = self.granted.pop() else {
            return Err(PdpmError::Coordinator("no blocks granted".into()));
        };
        self.seq = self.seq.wrapping_add(1);
        let version = ((self.id as u64) << 32) | self.seq as u64;
        let block = encode_block(version, key, value);
        let tail = block.len() as u64 - 8;
        let r = self.write_blocks(&location, &block, tail, crash);
        if crash.is_some() {
            return r;
        }
        let r = r.and_then(|()| {
            self.coordinator
                .call::<_, ()>(
                    method::COMMIT,
                    &CommitRequest {
                        client: self.id,
                        key: key.to_vec(),
                        location: location.clone(),
                        version,
                    },
                )
                .map_err(PdpmError::from)
        });
        if r.is_err() {
            // Best effort: the blocks go back so they are not lost while this client lives.
            let _ = self.coordinator.call::<_, ()>(
                method::RELEASE,
                &ReleaseRequest {
                    client: self.id,
                    locations: vec![location],
                },
            );
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
                write_validated(
                    &mut self.eps[node],
                    &mut self.batch,
                    node,
                    None,
                    addr,
                    block,
                    tail,
                )?;
            }
            return Ok(());
        }
        for &(node, addr) in &addrs {
            self.eps[node].write(addr, block)?;
        }
        if crash == Some(CentralCrash::AfterWrite) {
            return Ok(());
        }
        for &(node, addr) in &addrs {
            let mut last = [0u8; 8];
            self.eps[node].read(addr.offset_by(tail), &mut last)?;
            validate(node, None, &last, want)?;
        }
        Ok(())
    }
}

impl PdpmStore for CentralClient {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PdpmError> {
        self.check(key, None)?;
        let len = self.layout.block_len() as usize;
        for _ in 0..=self.settings.read_retries {
            let committed: Option<Committed> = self.coordinator.call(method::LOOKUP, &key)?;
            let Some(c) = committed else {
                return Ok(None);
            };
            let first = *c
                .location
                .0
                .first()
                .ok_or_else(|| PdpmError::Coordinator("empty location".into()))?;
            let addr = self.block_addr(first)?;
            let mut buf = vec![0u8; len];
            self.eps[first.node as usize].read(addr, &mut buf)?;
            match parse_block(&self.layout, &buf) {
                Some((version, k, v)) if version == c.version && k == key => {
                    return Ok(Some(v.to_vec()));
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

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PdpmError> {
        self.put_inner(key, value, None)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), PdpmError> {
        self.check(key, None)?;
        let _: bool = self.coordinator.call(method::DELETE, &key)?;
        Ok(())
    }
}

impl Drop for CentralClient {
    fn drop(&mut self) {
        if self.granted.is_empty() {
            return;
        }
        let locations = std::mem::take(&mut self.granted);
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
}

fn encode_block(version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCK_HEADER + key.len() + value.len() + 4);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(value.len() as u32).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The version, key and value of a whole block; `None` for anything else.
fn parse_block<'a>(layout: &CentralLayout, b: &'a [u8]) -> Option<(u64, &'a [u8], &'a [u8])> {
    if b.len() < BLOCK_HEADER {
        return None;
    }
    let version = u64::from_le_bytes(b[0..8].try_into().ok()?);
    let klen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let vlen = u32::from_le_bytes(b[12..16].try_into().ok()?) as usize;
    if klen > layout.max_key as usize || vlen > layout.max_value as usize {
        return None;
    }
    let end = BLOCK_HEADER + klen + vlen;
    let crc = u32::from_le_bytes(b.get(end..end + 4)?.try_into().ok()?);
    if crc32c::crc32c(&b[..end]) != crc {
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
        for i in 0..b.len() {
            let mut bad = image.clone();
            bad[i] ^= 0x40;
            assert_eq!(parse_block(&l, &bad), None, "flip at {i}");
        }
        let h = l.encode();
        assert_eq!(CentralLayout::decode(&h), Ok(l));
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
