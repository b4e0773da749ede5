//! Clover, the paper's SepDS (pDPM §4.4): compute nodes do every data access with one-sided verbs; a metadata
//! server (MS) behind two-sided RPC hands out space and collects garbage, off the data path.
//!
//! **Memory nodes** hold one area (anchored in root slot [`crate::roots::CLOVER_AREA`]): a *shortcut table* of
//! `cells` fixed cells, then `slots` data slots of one size class sized by the layout's longest key and value (the
//! paper's 128 B × 2^k classes are not built: one class keeps the MS's free lists simple and every slot fits every
//! entry). A key's cell is on its home node (`hash(key) mod M`), found by linear probing from a second hash within
//! `max_probe` cells; the cell stores the key, so collisions are detected, and a best-effort pointer to a recent
//! version (the shortcut). Cells are claimed by the MS (`CREATE`), which serializes creations so one key never gets
//! two cells; once claimed, a cell stays with its key (a delete writes a tombstone version).
//!
//! **Entry** (one per version, in a data slot): `[header: 8][meta: 8 = key len u16, flags u8, GC version u8,
//! value len u32][key][value][CRC32C of meta, key and value: 4]`. The header word is `GC version << 56 | next`
//! where `next` is a 56-bit [`Ptr`] (`present: 1 | node: 15 | GC version: 8 | slot: 32`) to the next version, 0
//! while the entry is the tail. Because the header carries its own slot's GC version, the link CAS (expect
//! "version v, no next") fails on a slot recycled under a stale cursor. A delete links a tombstone version.
//!
//! **Read** (1 round trip on a cursor hit): one batch READs the entry at the client's cursor (key → last known tail,
//! a bounded LRU) and, when the cursor's slot is on the key's home node, the shortcut cell too. An entry that
//! validates (CRC, key, GC version) and has no next is the answer. Otherwise the walk jumps to the shortcut (or
//! follows `next`), 1 round trip per hop; an entry that fails validation (its slot was recycled) restarts from the
//! shortcut. No cursor: the cell is read first (one more round trip; with the key's cell not cached either, the
//! probe window is read instead).
//!
//! **Write** (R = 1, 2 round trips on a cursor hit): WRITE the entry into a slot granted by the MS in advance,
//! with the validating READ of its last bytes in the same batch; then CAS the tail's header from "no next" to the
//! new entry (the first version of a key is linked by CASing the empty cell instead). A failed CAS chases to the
//! real tail and retries. Off the critical path: the shortcut is advanced by a CAS (from the old tail to the new
//! one) carried in this client's next batch to the cell's node; whoever moves the shortcut past a version retires
//! that version, so the shortcut never points at a retired slot. Each client has a background thread with its
//! own MS connection: it refills the client's free slots `grant_batch` at a time once fewer than `refill_at` are
//! left, and sends records (new version linked, old version retired) in batches, piggybacked on refills. A write
//! waits for it only when the client has no free slot at all.
//!
//! **Garbage collection** (MS): a retired slot waits for `reclaim_lease` (the paper's Tr, at least twice the
//! clients' `read_timeout`, after which a client abandons a read) and then returns to the free list with its GC
//! version + 1; a slot whose 8-bit version wraps is parked for `wrap_park` (the paper's Te) first, and clients drop
//! cursors idle for `cursor_idle` (< `wrap_park`), so no cursor can mistake a slot 255 reuses later for its own.
//!
//! **Recovery.** A client that crashed after writing an entry but before linking it leaves it invisible; a client
//! that crashed after linking but before advancing the shortcut leaves a lagging shortcut that readers chase and
//! the next writer advances. A writer whose shortcut CAS finds the shortcut elsewhere helps it along, but only up
//! to its own version: a later version's writer may have stopped before chaining its replica cells.
//! [`MetadataServer::reclaim_grants`] returns a dead client's granted slots: those found linked into their key's
//! chain stay live, the rest go back through the lease.
//!
//! **Replication** (`R` > 1, the paper's all-way chaining; layout field `replication`): every version has `R`
//! copies on distinct memory nodes (the MS grants them as a group), each entry holds `R` header words and the
//! pointers to all `R` copies of its version. A write takes 3 steps: WRITE the `R` copies (with validation), CAS
//! header word 0 of the old primary copy (the commit point, as for R = 1), then CAS header word `j` of every old
//! copy to the new copy `j`, so each replica chain can be followed on its own ([`CloverClient::replica_chain`]).
//! The fabric counts one round trip per memory node a step reaches (`2R + 1` per write; the protocol's steps are
//! [`CloverClient::protocol_steps`]).
//!
//! **Memory-node failure.** A key's `R` nodes are its home and the `R - 1` after it: copy `j` of every version
//! and the key's cell in section `j` (a mirror of the home's cell) are on the `j`-th. Cell `j` names copy `j` of a
//! version at or past the shortcut: the chaining step CASes it along with the old copy's header words, on the
//! replicas before the home (whose batch carries the shortcut CAS). Reads use the primary chain; with the home
//! down they follow replica chain `j` from cell `j` on the first replica node that answers. Writes need all `R`
//! nodes and are refused ([`PdpmError::NodeDown`], nothing applied) while one is down; a writer that finds a
//! replica cell behind (an earlier writer stopped between its commit and its chaining) completes the missing
//! links from the primary chain and moves the cell. Until then that stopped writer's version is on the primary
//! chain only: a read with the home down meanwhile returns the version before it, though a read of the primary
//! may have returned it already (its write was never acknowledged, but the two reads do not order as one copy's
//! would). Closing this would cost every read a look at the replica cells.
//!
//! **MS restart.** The MS keeps its state (slot states, GC versions, free lists) in its memory only, and
//! [`MetadataServer::new`] rebuilds it from the memory nodes (the cells, which are the key directory, are on the
//! memory nodes already): a slot holding a version reachable from its key's shortcut is live; any other written
//! slot (a superseded version the shortcut passed, an entry never linked, a torn write) is reused after one reclaim
//! lease at its content's GC version + 1; a slot never written is free. A start after a crash so also reclaims the
//! versions whose retire record was lost with a crashed client. Grants of the previous MS are forgotten: a client
//! of the previous MS must not write with them (in `dinomo up` the clients are in the same process and restart
//! with it).
//!
//! Not built: size classes, MS persistence and failover, the MS-driven epoch message (clients drop idle cursors
//! by their own clock), and, while an MS runs, a scan that finds versions whose retire record was lost with a
//! crashed client (they stay allocated until the MS restarts).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dinomo_fabric::{
    Batch, ClientId, Connector, Endpoint, FabricError, MemoryNode, RemoteAddr, RpcError,
    RpcHandler, decode, encode,
};
use dinomo_pool::Pool;
use serde::{Deserialize, Serialize};

use crate::anchor::{self, Anchor, Anchored, HEADER_LEN, Located, le_u32, le_u64};
use crate::{
    Change, MemoryNodes, PdpmError, PdpmStore, ScanRun, Tried, check_key, check_value, failed,
    hash, is_node_failure, not_applied, per_read, read_spans, reported_down, roots, tags, validate,
};

/// Bytes before the key in a cell: pointer word, key length (+1, 0 = free) and padding.
const CELL_HEAD: usize = 16;
const FLAG_VALUE: u8 = 1;
const FLAG_TOMBSTONE: u8 = 2;
/// Seed of the hash that picks a key's cell (the home node uses the settings' seed).
const CELL_SEED: u64 = 0xc10f_e5c1_0fe5_c10f;
const PRESENT: u64 = 1 << 55;
const NEXT_MASK: u64 = (1 << 56) - 1;

/// RPC methods of the metadata server.
pub mod method {
    /// The geometry and the MS's settings clients must agree with.
    pub const LAYOUT: u16 = 0x4c01;
    /// Grant free slots (and take records).
    pub const GRANT: u16 = 0x4c02;
    /// Take records.
    pub const RECORDS: u16 = 0x4c03;
    /// Find or claim a key's cell.
    pub const CREATE: u16 = 0x4c04;
    /// Give back granted slots that will not be used.
    pub const RELEASE: u16 = 0x4c05;
    /// A client found a memory node unreachable: no space is granted on it for the MS's `node_retry`.
    pub const REPORT_DOWN: u16 = 0x4c06;
}

/// The area of a memory node, fixed when it is formatted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloverLayout {
    /// Shortcut cells on this memory node (keys whose home it is). Default 16384.
    pub cells: u64,
    /// Data slots on this memory node. Default 65536.
    pub slots: u64,
    /// Longest key in bytes (at most 65534: a cell stores its length + 1). Default 64.
    pub max_key: u32,
    /// Longest value in bytes. Default 1024.
    pub max_value: u32,
    /// Copies of every version, on distinct memory nodes (1 to 16). Default 1.
    pub replication: u32,
}

impl Default for CloverLayout {
    fn default() -> Self {
        CloverLayout {
            cells: 16384,
            slots: 65536,
            max_key: 64,
            max_value: 1024,
            replication: 1,
        }
    }
}

impl CloverLayout {
    /// Bytes of one cell, rounded to 8.
    pub fn cell_len(&self) -> u64 {
        (CELL_HEAD as u64 + self.max_key as u64).next_multiple_of(8)
    }

    /// Bytes before the key in an entry: `R` header words, the meta word and `R` copy pointers.
    fn entry_head(&self) -> usize {
        8 + 16 * self.replication as usize
    }

    /// Bytes of one data slot (the one size class), rounded to 8.
    pub fn slot_len(&self) -> u64 {
        (self.entry_head() as u64 + self.max_key as u64 + self.max_value as u64 + 4)
            .next_multiple_of(8)
    }

    /// Bytes of the cell sections: `R` sections of `cells` cells (section `j` of node `n` mirrors section 0 of
    /// node `n - j`, so that a key's directory entry survives its home's failure).
    fn cells_len(&self) -> u64 {
        self.replication as u64 * self.cells * self.cell_len()
    }

    /// Bytes of the whole area on one memory node, its header included.
    pub fn area_len(&self) -> u64 {
        HEADER_LEN + self.cells_len() + self.slots * self.slot_len()
    }

    fn check(&self) -> Result<(), PdpmError> {
        let area = self
            .cells
            .checked_mul(self.cell_len())
            .and_then(|c| c.checked_mul(self.replication as u64))
            .zip(self.slots.checked_mul(self.slot_len()))
            .and_then(|(c, s)| c.checked_add(s))
            .and_then(|n| n.checked_add(HEADER_LEN));
        if self.cells == 0
            || self.slots == 0
            || self.slots > u32::MAX as u64
            // A cell's tag word stores the key length + 1.
            || self.max_key >= u16::MAX as u32
            || !(1..=16).contains(&self.replication)
            || area.is_none()
        {
            return Err(PdpmError::Config(format!(
                "Clover area needs cells > 0, 0 < slots < 2^32, max_key <= 65534, replication 1 to 16 and a size \
                 that fits 64 bits: {self:?}"
            )));
        }
        Ok(())
    }
}

impl Anchored for CloverLayout {
    const ANCHOR: Anchor = Anchor {
        root: roots::CLOVER_AREA,
        tag: tags::CLOVER_AREA,
        magic: b"PDPMCLV1",
        // 2: one cell section per copy.
        version: 2,
        store: "Clover",
        what: "area",
    };

    fn put_fields(&self, h: &mut [u8; HEADER_LEN as usize]) {
        h[16..24].copy_from_slice(&self.cells.to_le_bytes());
        h[24..32].copy_from_slice(&self.slots.to_le_bytes());
        h[32..36].copy_from_slice(&self.max_key.to_le_bytes());
        h[36..40].copy_from_slice(&self.max_value.to_le_bytes());
        h[40..44].copy_from_slice(&self.replication.to_le_bytes());
    }

    fn get_fields(h: &[u8]) -> Result<CloverLayout, String> {
        let l = CloverLayout {
            cells: le_u64(h, 16),
            slots: le_u64(h, 24),
            max_key: le_u32(h, 32),
            max_value: le_u32(h, 36),
            replication: le_u32(h, 40),
        };
        l.check().map_err(|e| e.to_string())?;
        Ok(l)
    }

    fn anchored_len(&self) -> u64 {
        self.area_len()
    }
}

/// Formats a memory node's pool with a Clover area (every cell free). Refuses a pool that already has one.
pub fn format(pool: &Pool, layout: &CloverLayout) -> Result<(), PdpmError> {
    layout.check()?;
    // An all-zero cell is a free one.
    anchor::format(pool, layout, true)
}

/// A 56-bit pointer to one version: `present: 1 | node: 15 | GC version: 8 | slot: 32`. Never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ptr(u64);

impl Ptr {
    /// The pointer to `slot` on `node` at GC version `version`.
    pub fn new(node: u16, slot: u32, version: u8) -> Ptr {
        Ptr(PRESENT | ((node as u64 & 0x7fff) << 40) | ((version as u64) << 32) | slot as u64)
    }

    /// A pointer from its word, `None` for 0 (no pointer); bits above 56 are ignored.
    pub fn from_word(word: u64) -> Option<Ptr> {
        let w = word & NEXT_MASK;
        (w & PRESENT != 0).then_some(Ptr(w))
    }

    /// The word it is stored as.
    pub fn word(self) -> u64 {
        self.0
    }

    /// Memory node.
    pub fn node(self) -> u16 {
        ((self.0 >> 40) & 0x7fff) as u16
    }

    /// Slot index on it.
    pub fn slot(self) -> u32 {
        self.0 as u32
    }

    /// GC version of the slot's content it points to.
    pub fn version(self) -> u8 {
        (self.0 >> 32) as u8
    }
}

/// A key's cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellRef {
    /// Memory node (the key's home).
    pub node: u16,
    /// Cell index on it.
    pub cell: u32,
}

/// A free slot granted to a client, with the GC version its next entry carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Memory node.
    pub node: u16,
    /// Slot index.
    pub slot: u32,
    /// GC version.
    pub version: u8,
}

impl Grant {
    fn ptr(self) -> Ptr {
        Ptr::new(self.node, self.slot, self.version)
    }
}

/// What a client tells the MS about slots (the paper's retire requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A granted slot now holds a linked version (it is live, no longer a grant).
    Linked(Ptr),
    /// The shortcut moved past this version: no new reader can reach it; reclaim it after the lease.
    Retired(Ptr),
}

#[derive(Debug, Serialize, Deserialize)]
struct GrantRequest {
    client: u32,
    node: u16,
    count: u32,
    records: Vec<Record>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ReleaseRequest {
    client: u32,
    grants: Vec<Vec<Grant>>,
    records: Vec<Record>,
}

/// What the MS tells clients at connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutReply {
    /// Memory nodes the MS manages.
    pub nodes: u32,
    /// Their (shared) geometry.
    pub layout: CloverLayout,
    /// Cells probed for a key.
    pub max_probe: u32,
    /// The home-node hash seed.
    pub node_seed: u64,
    /// The MS's reclaim lease (clients' read timeout must be at most half of it).
    pub reclaim_lease_us: u64,
    /// The MS's wrap park time (clients' cursor idle limit must be below it).
    pub wrap_park_us: u64,
    /// The connecting client's id: its name for its granted slots and records.
    pub client: u32,
}

/// Settings of the metadata server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// Cells probed for a key before its home's table counts as full. Default 16.
    pub max_probe: u32,
    /// Seed of the hash that picks a key's home node. Default 0.
    pub node_seed: u64,
    /// How long a retired slot waits before reuse (the paper's Tr; at least twice the clients' read timeout).
    /// Default 100 ms.
    #[serde(with = "humantime_serde")]
    pub reclaim_lease: Duration,
    /// How long a slot whose GC version wrapped is parked before reuse (the paper's Te). Default 10 s.
    #[serde(with = "humantime_serde")]
    pub wrap_park: Duration,
    /// Most slots one GRANT hands out. Default 1024.
    pub max_grant: u32,
    /// Hops a recovery walk takes along a chain before giving up on it. Default 4096.
    pub max_walk: u32,
    /// How long a memory node found unreachable (by the MS's own verbs or a client's report) gets no grants and
    /// no new keys before the MS connects to it again. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub node_retry: Duration,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig {
            max_probe: 16,
            node_seed: 0,
            reclaim_lease: Duration::from_millis(100),
            wrap_park: Duration::from_secs(10),
            max_grant: 1024,
            max_walk: 4096,
            node_retry: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Granted(u32),
    Live,
    /// Retired, waiting out the lease (or parked after a wrap).
    Waiting,
}

struct Space {
    free: Vec<VecDeque<u32>>,
    /// The GC version each slot's next (or current) content carries.
    version: Vec<Vec<u8>>,
    state: Vec<Vec<SlotState>>,
    /// Retired slots by the time they may be reused: `(when, node, slot)`.
    leased: VecDeque<(Instant, u16, u32)>,
    parked: VecDeque<(Instant, u16, u32)>,
    /// Slots ever parked.
    wrapped: u64,
    granted: HashMap<u32, HashSet<(u16, u32)>>,
    /// The copies of every granted or live version, by its primary copy (the primary first).
    groups: HashMap<(u16, u32), Vec<(u16, u32)>>,
}

impl Space {
    /// Moves slots whose lease (or park) has passed to the free lists.
    fn reclaim(&mut self, now: Instant, park: Duration) {
        while let Some(&(when, node, slot)) = self.leased.front() {
            if when > now {
                break;
            }
            self.leased.pop_front();
            let v = &mut self.version[node as usize][slot as usize];
            if *v == u8::MAX {
                // The 8-bit version wraps: a cursor that old must have been dropped before the slot returns.
                *v = 1;
                self.parked.push_back((now + park, node, slot));
                self.wrapped += 1;
            } else {
                *v += 1;
                self.free_slot(node, slot);
            }
        }
        while let Some(&(when, node, slot)) = self.parked.front() {
            if when > now {
                break;
            }
            self.parked.pop_front();
            self.free_slot(node, slot);
        }
    }

    fn free_slot(&mut self, node: u16, slot: u32) {
        self.state[node as usize][slot as usize] = SlotState::Free;
        self.free[node as usize].push_back(slot);
    }

    fn ungrant(&mut self, node: u16, slot: u32) {
        if let SlotState::Granted(c) = self.state[node as usize][slot as usize]
            && let Some(set) = self.granted.get_mut(&c)
        {
            set.remove(&(node, slot));
        }
    }

    /// Retires every copy of the version whose primary copy is `(node, slot)`.
    fn retire(&mut self, node: u16, slot: u32, until: Instant) {
        let copies = self
            .groups
            .remove(&(node, slot))
            .unwrap_or_else(|| vec![(node, slot)]);
        for (n, s) in copies {
            self.ungrant(n, s);
            self.state[n as usize][s as usize] = SlotState::Waiting;
            self.leased.push_back((until, n, s));
        }
    }

    /// Marks every copy of the version whose primary copy is `(node, slot)` live.
    fn make_live(&mut self, node: u16, slot: u32) {
        let copies = self
            .groups
            .get(&(node, slot))
            .cloned()
            .unwrap_or_else(|| vec![(node, slot)]);
        for (n, s) in copies {
            self.ungrant(n, s);
            self.state[n as usize][s as usize] = SlotState::Live;
        }
    }

    fn known(&self, p: Ptr) -> Option<SlotState> {
        let v = *self
            .version
            .get(p.node() as usize)?
            .get(p.slot() as usize)?;
        (v == p.version()).then(|| self.state[p.node() as usize][p.slot() as usize])
    }
}

/// Clover's metadata server.
pub struct MetadataServer {
    config: MetadataConfig,
    layout: CloverLayout,
    /// The MS's connections to the memory nodes (and which it counts as down).
    nodes: Mutex<(MemoryNodes<CloverLayout>, Batch<'static>)>,
    node_count: usize,
    space: Mutex<Space>,
    recovered: Recovered,
    /// The next client's id (grants are this MS's own, forgotten by the next one, so ids start at 1).
    next_client: AtomicU32,
}

impl std::fmt::Debug for MetadataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataServer")
            .field("config", &self.config)
            .field("layout", &self.layout)
            .field("nodes", &self.node_count)
            .finish()
    }
}

/// Space usage as the MS sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceStats {
    /// Free slots, all nodes.
    pub free: usize,
    /// Granted to clients, not yet known linked.
    pub granted: usize,
    /// Holding linked versions.
    pub live: usize,
    /// Retired, waiting out the lease or parked after a version wrap.
    pub waiting: usize,
    /// Slots parked after a version wrap since the server started (each parked slot is also in `waiting` until
    /// its park has passed).
    pub wrapped: u64,
}

/// What a starting MS found on the memory nodes ([`MetadataServer::recovered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovered {
    /// Cells holding a key.
    pub keys: usize,
    /// Slots holding a version reachable from its key's shortcut (every copy counted).
    pub live: usize,
    /// Slots holding anything else (superseded versions behind a shortcut, unlinked or torn entries): reused
    /// after one reclaim lease.
    pub waiting: usize,
    /// Chains that named a slot holding no version of their key (walked up to there; reported, not repaired).
    pub broken_chains: usize,
}

/// One slot as the start-up scan read it.
struct ScannedSlot {
    /// Highest GC version byte in the slot's header and meta words (0: never written).
    version: u8,
    /// The whole entry there, if one is: next version, every copy, key hash.
    entry: Option<(Option<Ptr>, Vec<Ptr>, u64)>,
}

/// Seed of the key hash the start-up scan compares chains with.
const SCAN_SEED: u64 = 0x5ca7_c10f;

/// Rebuilds the MS's space from the memory nodes: every slot holding a version reachable from its key's shortcut
/// (along the primary chain, with all the version's copies) is live; a slot that holds any other written bytes
/// waits out one reclaim lease and comes back at its content's GC version + 1 (parked after a wrap), so that no
/// pointer to its old content can match what is written there next; a slot never written is free at version 1.
///
/// Why reachable from the shortcut and not just the tail: a writer advances the shortcut past a version only
/// after linking its successor, and whoever advances it retires the passed version; the versions from the
/// shortcut to the tail are those not retired yet (a writer that died before advancing it leaves more than one),
/// and the shortcut must never point at a reused slot. A version the shortcut passed but whose retire record never
/// reached the MS (its client died) is reclaimed here.
fn rebuild(
    eps: &mut [Endpoint],
    areas: &[Located],
    layout: &CloverLayout,
    config: &MetadataConfig,
) -> Result<(Space, Recovered), PdpmError> {
    let m = areas.len();
    let slots = layout.slots as usize;
    let r = layout.replication as usize;
    let mut recovered = Recovered::default();
    // Every cell holding a key: (key hash, shortcut).
    let mut chains: Vec<(u64, Option<Ptr>)> = Vec::new();
    let mut scanned: Vec<Vec<ScannedSlot>> = Vec::with_capacity(m);
    let mut buf = Vec::new();
    for (node, ep) in eps.iter_mut().enumerate() {
        let area = &areas[node];
        let cl = layout.cell_len();
        for (first, n) in read_spans(ep.max_message_len(), layout.cells, cl, 4096) {
            buf.resize((n * cl) as usize, 0);
            ep.read(cell_addr(area, layout, first as u32), &mut buf)?;
            for c in buf.chunks_exact(cl as usize) {
                if let Some((key, shortcut)) = parse_cell(node, c)? {
                    chains.push((hash(key, SCAN_SEED), shortcut));
                }
            }
        }
        let sl = layout.slot_len();
        let mut found = Vec::with_capacity(slots);
        for (first, n) in read_spans(ep.max_message_len(), layout.slots, sl, 1024) {
            buf.resize((n * sl) as usize, 0);
            ep.read(slot_addr(area, layout, first as u32), &mut buf)?;
            for b in buf.chunks_exact(sl as usize) {
                let meta = 8 * r;
                let version = (0..r)
                    .map(|j| (le_u64(b, 8 * j) >> 56) as u8)
                    .chain([b[meta + 3]])
                    .max()
                    .unwrap_or(0);
                let entry = parse_entry(layout, b, b[meta + 3])
                    .map(|e| (e.next, e.copies().collect(), hash(e.key, SCAN_SEED)));
                found.push(ScannedSlot { version, entry });
            }
        }
        scanned.push(found);
    }
    recovered.keys = chains.len();
    // The GC version of every live copy, as the pointers to it carry it.
    let mut live: Vec<Vec<Option<u8>>> = (0..m).map(|_| vec![None; slots]).collect();
    let mut groups: HashMap<(u16, u32), Vec<(u16, u32)>> = HashMap::new();
    let in_range = |p: Ptr| (p.node() as usize) < m && (p.slot() as u64) < layout.slots;
    for (key, shortcut) in chains {
        let mut cur = shortcut;
        let mut hops = 0;
        while let Some(p) = cur {
            let entry = in_range(p)
                .then(|| &scanned[p.node() as usize][p.slot() as usize])
                .filter(|s| s.version == p.version())
                .and_then(|s| s.entry.as_ref())
                .filter(|(_, copies, k)| *k == key && copies.first() == Some(&p));
            let Some((next, copies, _)) = entry else {
                recovered.broken_chains += 1;
                break;
            };
            if live[p.node() as usize][p.slot() as usize].is_some() || hops >= config.max_walk {
                // A chain that loops or runs longer than any writer leaves one: keep what was walked.
                recovered.broken_chains += 1;
                break;
            }
            hops += 1;
            let mut group = Vec::with_capacity(copies.len());
            for &c in copies {
                if in_range(c) {
                    live[c.node() as usize][c.slot() as usize] = Some(c.version());
                    group.push((c.node(), c.slot()));
                }
            }
            groups.insert((p.node(), p.slot()), group);
            cur = *next;
        }
    }
    let now = Instant::now();
    let mut space = Space {
        free: vec![VecDeque::new(); m],
        version: (0..m).map(|_| vec![1u8; slots]).collect(),
        state: (0..m).map(|_| vec![SlotState::Free; slots]).collect(),
        leased: VecDeque::new(),
        parked: VecDeque::new(),
        wrapped: 0,
        granted: HashMap::new(),
        groups,
    };
    for node in 0..m {
        for slot in 0..slots {
            let version = scanned[node][slot].version;
            if let Some(v) = live[node][slot] {
                space.version[node][slot] = v;
                space.state[node][slot] = SlotState::Live;
                recovered.live += 1;
            } else if version == 0 {
                space.free[node].push_back(slot as u32);
            } else {
                // Reused after the lease at `version + 1`, as a retired slot is.
                space.version[node][slot] = version;
                space.state[node][slot] = SlotState::Waiting;
                space
                    .leased
                    .push_back((now + config.reclaim_lease, node as u16, slot as u32));
                recovered.waiting += 1;
            }
        }
    }
    Ok((space, recovered))
}

impl MetadataServer {
    /// An MS over the memory nodes `connectors` (formatted with one geometry). Its space is rebuilt from what the
    /// memory nodes hold (see [`rebuild`]): on fresh memory nodes every slot is free at GC version 1.
    pub fn new(
        connectors: &[Connector],
        config: MetadataConfig,
    ) -> Result<Arc<MetadataServer>, PdpmError> {
        if connectors.is_empty() || connectors.len() > 0x7fff {
            return Err(PdpmError::Config("1 to 32767 memory nodes needed".into()));
        }
        if config.max_probe == 0 || config.max_grant == 0 || config.max_walk == 0 {
            return Err(PdpmError::Config(
                "max_probe, max_grant and max_walk must be at least 1".into(),
            ));
        }
        let mut nodes = MemoryNodes::<CloverLayout>::connect(connectors, config.node_retry)?;
        let layout = nodes.layout.clone();
        if layout.replication as usize > connectors.len() {
            return Err(PdpmError::Config(format!(
                "replication {} needs at least that many memory nodes, have {}",
                layout.replication,
                connectors.len()
            )));
        }
        check_probe(config.max_probe, &layout)?;
        let (space, recovered) = rebuild(&mut nodes.eps, &nodes.areas, &layout, &config)?;
        tracing::info!(
            keys = recovered.keys,
            live = recovered.live,
            waiting = recovered.waiting,
            broken = recovered.broken_chains,
            "Clover metadata server rebuilt its space from the memory nodes"
        );
        Ok(Arc::new(MetadataServer {
            space: Mutex::new(space),
            config,
            layout,
            node_count: nodes.len(),
            nodes: Mutex::new((nodes, Batch::new())),
            recovered,
            next_client: AtomicU32::new(1),
        }))
    }

    /// The memory nodes' geometry.
    pub fn layout(&self) -> &CloverLayout {
        &self.layout
    }

    /// What this MS found on the memory nodes when it started.
    pub fn recovered(&self) -> Recovered {
        self.recovered
    }

    /// Serves this MS's RPCs on `host`'s processor threads.
    pub fn serve(self: &Arc<MetadataServer>, host: &MemoryNode) {
        host.set_rpc_handler(self.clone());
    }

    /// Slots by state, after reclaiming those whose lease has passed.
    pub fn space(&self) -> SpaceStats {
        let mut space = self.lock_space();
        space.reclaim(Instant::now(), self.config.wrap_park);
        let mut s = SpaceStats::default();
        for node in &space.state {
            for st in node {
                match st {
                    SlotState::Free => s.free += 1,
                    SlotState::Granted(_) => s.granted += 1,
                    SlotState::Live => s.live += 1,
                    SlotState::Waiting => s.waiting += 1,
                }
            }
        }
        s.wrapped = space.wrapped;
        s
    }

    /// Returns the slots granted to `client` (known to be gone): a slot whose entry is linked into its key's chain
    /// stays live; the others go back to the free list after the lease. Returns how many went back.
    pub fn reclaim_grants(&self, client: u32) -> Result<usize, PdpmError> {
        let mut space = self.lock_space();
        let slots: Vec<(u16, u32)> = space
            .granted
            .remove(&client)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut freed = 0;
        let until = Instant::now() + self.config.reclaim_lease;
        for (node, slot) in slots {
            // Replicas go with their primary.
            if !space.groups.contains_key(&(node, slot)) {
                continue;
            }
            let p = Ptr::new(node, slot, space.version[node as usize][slot as usize]);
            if self.is_linked(p)? {
                space.make_live(node, slot);
            } else {
                freed += space.groups.get(&(node, slot)).map_or(1, Vec::len);
                space.retire(node, slot, until);
            }
        }
        Ok(freed)
    }

    /// Whether the entry at `p` is a version linked into its key's chain: reachable from the key's shortcut.
    fn is_linked(&self, p: Ptr) -> Result<bool, PdpmError> {
        let mut guard = self.lock_nodes();
        let (nodes, batch) = &mut *guard;
        let node = p.node() as usize;
        if node >= self.node_count {
            return Ok(false);
        }
        let mut buf = vec![0u8; self.layout.slot_len() as usize];
        let r = nodes.eps[node].read(
            slot_addr(&nodes.areas[node], &self.layout, p.slot()),
            &mut buf,
        );
        nodes.track(node, r)?;
        let Some(entry) = parse_entry(&self.layout, &buf, p.version()) else {
            return Ok(false);
        };
        let key = entry.key.to_vec();
        let home = home_node(&key, self.config.node_seed, self.node_count);
        let r = probe_cells(
            &mut nodes.eps[home],
            batch,
            &nodes.areas[home],
            &self.layout,
            self.config.max_probe,
            &key,
        );
        let cells = nodes.track(home, r)?;
        let Some((_, mut cur)) = cells.found else {
            return Ok(false);
        };
        for _ in 0..self.config.max_walk {
            let Some(c) = cur else { return Ok(false) };
            if c == p {
                return Ok(true);
            }
            let n = c.node() as usize;
            if n >= self.node_count {
                return Ok(false);
            }
            let r = nodes.eps[n].read(slot_addr(&nodes.areas[n], &self.layout, c.slot()), &mut buf);
            nodes.track(n, r)?;
            match parse_entry(&self.layout, &buf, c.version()) {
                Some(e) if e.key == key.as_slice() => cur = e.next,
                _ => return Ok(false),
            }
        }
        Ok(false)
    }

    fn lock_space(&self) -> std::sync::MutexGuard<'_, Space> {
        self.space.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_nodes(&self) -> std::sync::MutexGuard<'_, (MemoryNodes<CloverLayout>, Batch<'static>)> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that memory node `node` is unreachable: no space on it is granted, and no key whose cells it holds
    /// is created, for `node_retry`; then the MS connects to it again.
    pub fn mark_down(&self, node: usize) {
        self.lock_nodes().0.mark_down(node);
    }

    /// The memory nodes the MS counts as unreachable (one found so `node_retry` ago or more is tried first).
    pub fn down_nodes(&self) -> Vec<usize> {
        let nodes = &mut self.lock_nodes().0;
        (0..self.node_count)
            .filter(|&n| !nodes.reachable(n))
            .collect()
    }

    /// The nodes holding the copies (and cells) of the keys whose home is `home`, refused with the first one that
    /// is unreachable (connected again once `node_retry` has passed).
    fn copy_nodes_up(
        &self,
        nodes: &mut MemoryNodes<CloverLayout>,
        home: usize,
    ) -> Result<Vec<usize>, RpcError> {
        let set: Vec<usize> = (0..self.layout.replication as usize)
            .map(|j| copy_node(home, j, self.node_count))
            .collect();
        match set.iter().find(|&&n| !nodes.reachable(n)) {
            Some(n) => Err(failed(format!(
                "memory node {n} is down: keys whose home is node {home} keep their copies on nodes {set:?}"
            ))),
            None => Ok(set),
        }
    }

    fn take_records(&self, space: &mut Space, client: u32, records: &[Record]) {
        let until = Instant::now() + self.config.reclaim_lease;
        for r in records {
            match *r {
                Record::Linked(p) => {
                    if let Some(SlotState::Granted(_)) = space.known(p) {
                        space.make_live(p.node(), p.slot());
                    } else {
                        tracing::debug!(
                            client,
                            ?p,
                            "linked record for a slot not granted; ignored"
                        );
                    }
                }
                Record::Retired(p) => match space.known(p) {
                    Some(SlotState::Live | SlotState::Granted(_)) => {
                        space.retire(p.node(), p.slot(), until)
                    }
                    _ => tracing::debug!(client, ?p, "retire record for a slot not live; ignored"),
                },
            }
        }
    }

    /// Versions for keys whose home is `req.node`: copy `j` on the `j`-th node from the home, so that a key's
    /// chains and cells share its `R` nodes. Refused while one of them counts as down (the records are taken
    /// first).
    fn grant(&self, req: GrantRequest) -> Result<Vec<Vec<Grant>>, RpcError> {
        let home = req.node as usize;
        let mut space = self.lock_space();
        self.take_records(&mut space, req.client, &req.records);
        space.reclaim(Instant::now(), self.config.wrap_park);
        if home >= self.node_count {
            return Err(failed(format!("no memory node {home}")));
        }
        let set = self.copy_nodes_up(&mut self.lock_nodes().0, home)?;
        let count = req.count.min(self.config.max_grant);
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            if set.iter().any(|&n| space.free[n].is_empty()) {
                break;
            }
            let mut group = Vec::with_capacity(set.len());
            for &node in &set {
                let slot = space.free[node].pop_front().unwrap_or_default();
                space.state[node][slot as usize] = SlotState::Granted(req.client);
                space
                    .granted
                    .entry(req.client)
                    .or_default()
                    .insert((node as u16, slot));
                group.push(Grant {
                    node: node as u16,
                    slot,
                    version: space.version[node][slot as usize],
                });
            }
            space.groups.insert(
                (group[0].node, group[0].slot),
                group.iter().map(|g| (g.node, g.slot)).collect(),
            );
            out.push(group);
        }
        Ok(out)
    }

    fn release(&self, req: ReleaseRequest) {
        let mut space = self.lock_space();
        self.take_records(&mut space, req.client, &req.records);
        for group in req.grants {
            let Some(primary) = group.first() else {
                continue;
            };
            if space.known(primary.ptr()) != Some(SlotState::Granted(req.client)) {
                continue;
            }
            let copies = space
                .groups
                .remove(&(primary.node, primary.slot))
                .unwrap_or_default();
            for (n, s) in copies {
                space.ungrant(n, s);
                // Never linked: no reader can hold it, no lease needed.
                space.free_slot(n, s);
            }
        }
    }

    /// Finds `key`'s cell on its home node or claims a free one in its probe window (one creator at a time).
    fn create(&self, key: &[u8]) -> Result<CellRef, RpcError> {
        if key.len() > self.layout.max_key as usize {
            return Err(failed("key longer than the layout allows"));
        }
        let home = home_node(key, self.config.node_seed, self.node_count);
        let mut guard = self.lock_nodes();
        let (nodes, batch) = &mut *guard;
        // Every node holding the key's cells must answer: a key is created on all of them or not at all.
        let set = self.copy_nodes_up(nodes, home)?;
        let r = probe_cells(
            &mut nodes.eps[home],
            batch,
            &nodes.areas[home],
            &self.layout,
            self.config.max_probe,
            key,
        );
        let cells = nodes.track(home, r).map_err(|e| failed(e.to_string()))?;
        if let Some((cell, _)) = cells.found {
            return Ok(CellRef {
                node: home as u16,
                cell,
            });
        }
        let Some(cell) = cells.first_free else {
            return Err(RpcError::OutOfSpace(format!(
                "no free cell for the key within {} probes",
                self.config.max_probe
            )));
        };
        // Cell bytes 8..16: the key length + 1 (0 = free), then padding.
        let mut tag = [0u8; 8];
        tag[..2].copy_from_slice(&(key.len() as u16 + 1).to_le_bytes());
        // The replicas' cells first (pointer word 0, in case an earlier creation stopped halfway there), then the
        // home's: the key, then the length word that makes the cell taken (its pointer word is 0 while free).
        for j in (0..set.len()).rev() {
            let node = set[j];
            let addr = section_cell_addr(&nodes.areas[node], &self.layout, j, cell);
            batch.clear();
            if j > 0 {
                batch.write(addr, &[0u8; 8]);
            }
            batch.write_copy(addr.offset_by(CELL_HEAD as u64), key);
            batch.write_copy(addr.offset_by(8), &tag);
            let check = batch.read(addr.offset_by(8), 8);
            let r = nodes.eps[node].post(batch);
            nodes
                .track(node, r)
                .and_then(|()| validate(node, Some(cell as u64), batch.read_data(check), &tag))
                .map_err(|e| failed(e.to_string()))?;
        }
        Ok(CellRef {
            node: home as u16,
            cell,
        })
    }
}

impl RpcHandler for MetadataServer {
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
                    nodes: self.node_count as u32,
                    layout: self.layout.clone(),
                    max_probe: self.config.max_probe,
                    node_seed: self.config.node_seed,
                    reclaim_lease_us: self.config.reclaim_lease.as_micros() as u64,
                    wrap_park_us: self.config.wrap_park.as_micros() as u64,
                    client: crate::next_id(&self.next_client),
                },
                response,
            ),
            method::GRANT => {
                let req: GrantRequest = decode(request)?;
                encode(&self.grant(req)?, response)
            }
            method::RECORDS => {
                let (client, records): (u32, Vec<Record>) = decode(request)?;
                let mut space = self.lock_space();
                self.take_records(&mut space, client, &records);
                encode(&(), response)
            }
            method::CREATE => {
                let key: Vec<u8> = decode(request)?;
                encode(&self.create(&key)?, response)
            }
            method::RELEASE => {
                let req: ReleaseRequest = decode(request)?;
                self.release(req);
                encode(&(), response)
            }
            method::REPORT_DOWN => {
                self.mark_down(reported_down(request, self.node_count)?);
                encode(&(), response)
            }
            other => Err(RpcError::UnknownMethod(other)),
        }
    }
}

/// A cell holding a key: the key and its shortcut.
type KeyCell<'a> = (&'a [u8], Option<Ptr>);

/// The key and shortcut a cell's bytes hold, `None` for a free cell; a length word longer than the cell is damage
/// on memory node `node`.
fn parse_cell(node: usize, c: &[u8]) -> Result<Option<KeyCell<'_>>, PdpmError> {
    let tag = u16::from_le_bytes([c[8], c[9]]) as usize;
    if tag == 0 {
        return Ok(None);
    }
    let key = c
        .get(CELL_HEAD..CELL_HEAD + tag - 1)
        .ok_or_else(|| PdpmError::Layout {
            node,
            why: "a cell names a key longer than the layout allows".into(),
        })?;
    Ok(Some((key, Ptr::from_word(le_u64(c, 0)))))
}

fn home_node(key: &[u8], seed: u64, nodes: usize) -> usize {
    (hash(key, seed) % nodes as u64) as usize
}

/// Cell `cell` of section 0 (the keys whose home this node is).
fn cell_addr(area: &Located, layout: &CloverLayout, cell: u32) -> RemoteAddr {
    section_cell_addr(area, layout, 0, cell)
}

/// Cell `cell` of section `section` (section `j` mirrors section 0 of the node `j` before this one).
fn section_cell_addr(
    area: &Located,
    layout: &CloverLayout,
    section: usize,
    cell: u32,
) -> RemoteAddr {
    area.data
        .at(area.body + (section as u64 * layout.cells + cell as u64) * layout.cell_len())
}

fn slot_addr(area: &Located, layout: &CloverLayout, slot: u32) -> RemoteAddr {
    area.data
        .at(area.body + layout.cells_len() + slot as u64 * layout.slot_len())
}

/// The memory node holding copy `j` of every version of the keys whose home is `home` (and their cells' section
/// `j`): the `R` copies of a key's versions live on its home and the `R - 1` nodes after it.
fn copy_node(home: usize, j: usize, nodes: usize) -> usize {
    (home + j) % nodes
}

struct Probe {
    /// The key's cell and its shortcut.
    found: Option<(u32, Option<Ptr>)>,
    first_free: Option<u32>,
}

/// The cells of `key`'s probe window in section 0, read in one round trip (two READs when the window wraps) with
/// `batch`.
fn probe_cells(
    ep: &mut Endpoint,
    batch: &mut Batch,
    area: &Located,
    layout: &CloverLayout,
    max_probe: u32,
    key: &[u8],
) -> Result<Probe, PdpmError> {
    batch.clear();
    let slots = probe_reads(batch, area, layout, 0, max_probe, key);
    ep.post(batch)?;
    Ok(scan_probe(batch, &slots, layout, key))
}

/// Adds the READs of `key`'s probe window in cell section `section` to `batch`: `(first cell, cells, verb)` per
/// READ.
fn probe_reads(
    batch: &mut Batch,
    area: &Located,
    layout: &CloverLayout,
    section: usize,
    max_probe: u32,
    key: &[u8],
) -> Vec<(u32, u32, dinomo_fabric::Slot)> {
    let start = (hash(key, CELL_SEED) % layout.cells) as u32;
    let first = (max_probe as u64).min(layout.cells - start as u64) as u32;
    let mut out = vec![(
        start,
        first,
        batch.read(
            section_cell_addr(area, layout, section, start),
            first * layout.cell_len() as u32,
        ),
    )];
    if first < max_probe {
        let rest = max_probe - first;
        out.push((
            0,
            rest,
            batch.read(
                section_cell_addr(area, layout, section, 0),
                rest * layout.cell_len() as u32,
            ),
        ));
    }
    out
}

/// A probe reads `max_probe` consecutive cells in at most two READs, each of which must name its length in 32 bits.
fn check_probe(max_probe: u32, layout: &CloverLayout) -> Result<(), PdpmError> {
    let bytes = u64::from(max_probe).saturating_mul(layout.cell_len());
    if max_probe == 0 || u64::from(max_probe) > layout.cells || bytes > u64::from(u32::MAX) {
        return Err(PdpmError::Config(format!(
            "max_probe {max_probe} must be 1 to the {} cells per node, and its cells ({bytes} bytes) fit one READ",
            layout.cells
        )));
    }
    Ok(())
}

fn scan_probe(
    batch: &Batch,
    reads: &[(u32, u32, dinomo_fabric::Slot)],
    layout: &CloverLayout,
    key: &[u8],
) -> Probe {
    let cl = layout.cell_len() as usize;
    let mut probe = Probe {
        found: None,
        first_free: None,
    };
    for &(start, count, verb) in reads {
        let data = batch.read_data(verb);
        for i in 0..count as usize {
            let c = &data[i * cl..(i + 1) * cl];
            let tag = u16::from_le_bytes([c[8], c[9]]) as usize;
            if tag == 0 {
                if probe.first_free.is_none() {
                    probe.first_free = Some(start + i as u32);
                }
                continue;
            }
            let klen = tag - 1;
            if klen == key.len() && c.get(CELL_HEAD..CELL_HEAD + klen) == Some(key) {
                probe.found = Some((start + i as u32, Ptr::from_word(le_u64(c, 0))));
                return probe;
            }
        }
    }
    probe
}

/// A version as read from its slot: a view of the slot's bytes, so that a walk's hops allocate nothing.
#[derive(Debug, Clone, Copy)]
struct Entry<'a> {
    /// The slot's bytes (header words, meta word and copy pointers checked whole).
    bytes: &'a [u8],
    /// Copies of every version (`R`).
    replication: usize,
    /// Header word 0: the next version's primary copy.
    next: Option<Ptr>,
    key: &'a [u8],
    /// `None`: a tombstone.
    value: Option<&'a [u8]>,
}

impl<'a> Entry<'a> {
    /// Header word `j`: the next version's copy `j` (all-way chaining).
    fn next_copy(&self, j: usize) -> Option<Ptr> {
        (j < self.replication)
            .then(|| Ptr::from_word(le_u64(self.bytes, 8 * j)))
            .flatten()
    }

    /// Copy `j` of this version.
    fn copy(&self, j: usize) -> Option<Ptr> {
        (j < self.replication)
            .then(|| Ptr::from_word(le_u64(self.bytes, 8 * self.replication + 8 + 8 * j)))
            .flatten()
    }

    /// Every copy of this version, the primary first.
    fn copies(&self) -> impl Iterator<Item = Ptr> + 'a {
        let entry = *self;
        (0..self.replication).filter_map(move |j| entry.copy(j))
    }
}

/// Copy `j` of a version whose copies are `copies` (the primary first): `[R header words][meta][R copy
/// pointers][key][value][CRC]`, the header words "no next" and every word carrying the copy's own GC version.
/// Encoded into `b` (cleared first), so that a client reuses one buffer for every write.
fn encode_entry(b: &mut Vec<u8>, copies: &[Grant], j: usize, key: &[u8], value: Option<&[u8]>) {
    let v = value.unwrap_or_default();
    let version = copies[j].version;
    let r = copies.len();
    b.clear();
    b.reserve(8 + 16 * r + key.len() + v.len() + 4);
    for _ in 0..r {
        b.extend_from_slice(&((version as u64) << 56).to_le_bytes());
    }
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.push(if value.is_some() {
        FLAG_VALUE
    } else {
        FLAG_TOMBSTONE
    });
    b.push(version);
    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    for c in copies {
        b.extend_from_slice(&c.ptr().word().to_le_bytes());
    }
    b.extend_from_slice(key);
    b.extend_from_slice(v);
    let crc = crc32c::crc32c(&b[8 * r..]);
    b.extend_from_slice(&crc.to_le_bytes());
}

/// The entry in slot bytes `b` if it is whole and carries GC version `version`; `None` for anything else (never
/// written, torn, or the slot reused for another version).
fn parse_entry<'a>(layout: &CloverLayout, b: &'a [u8], version: u8) -> Option<Entry<'a>> {
    let r = layout.replication as usize;
    let head = layout.entry_head();
    if b.len() < head {
        return None;
    }
    let header = le_u64(b, 0);
    let m = 8 * r;
    let klen = u16::from_le_bytes([b[m], b[m + 1]]) as usize;
    let flags = b[m + 2];
    let vlen = le_u32(b, m + 4) as usize;
    if b[m + 3] != version || (header >> 56) as u8 != version {
        return None;
    }
    if klen > layout.max_key as usize || vlen > layout.max_value as usize {
        return None;
    }
    let end = head + klen + vlen;
    let crc = u32::from_le_bytes(b.get(end..end + 4)?.try_into().ok()?);
    if crc32c::crc32c(&b[m..end]) != crc {
        return None;
    }
    let value = match flags {
        FLAG_VALUE => Some(&b[head + klen..end]),
        FLAG_TOMBSTONE => None,
        _ => return None,
    };
    if (0..r).any(|i| Ptr::from_word(le_u64(b, m + 8 + 8 * i)).is_none()) {
        return None;
    }
    Some(Entry {
        bytes: b,
        replication: r,
        next: Ptr::from_word(header),
        key: &b[head..head + klen],
        value,
    })
}

/// Settings of a Clover client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloverSettings {
    /// Versions' slots asked for per refill. Default 16.
    pub grant_batch: u32,
    /// A background thread refills the client's free slots once it holds fewer than this many (after its first
    /// write); 0 refills only when a write finds none, on the write's path. At most `grant_batch`. Default 8.
    pub refill_at: u32,
    /// Records held before the background thread sends them on their own (they otherwise ride on the next
    /// refill). Default 64.
    pub record_batch: usize,
    /// Keys whose cell and cursor are cached (LRU). Default 100,000.
    pub cursor_capacity: usize,
    /// A cursor unused for this long is dropped (must stay below the MS's wrap park). Default 5 s.
    #[serde(with = "humantime_serde")]
    pub cursor_idle: Duration,
    /// A READ round trip slower than this is abandoned and the read starts over (at most half the MS's reclaim
    /// lease). Default 50 ms.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    /// Hops one operation may take along chains (restarts included) before it gives up. Default 4096.
    pub max_hops: u32,
    /// How long a write waits for free slots while the MS has none (retired slots wait out their lease).
    /// Default 2 s.
    #[serde(with = "humantime_serde")]
    pub space_wait: Duration,
    /// A memory node found unreachable is left alone for this long, then connected again. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub node_retry: Duration,
}

impl Default for CloverSettings {
    fn default() -> Self {
        CloverSettings {
            grant_batch: 16,
            refill_at: 8,
            record_batch: 64,
            cursor_capacity: 100_000,
            cursor_idle: Duration::from_secs(5),
            read_timeout: Duration::from_millis(50),
            max_hops: 4096,
            space_wait: Duration::from_secs(2),
            node_retry: Duration::from_secs(1),
        }
    }
}

/// Where a crash is injected into a write (for crash tests): the write stops there, as a client that died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloverCrash {
    /// The entry is written and validated, not linked.
    AfterWrite,
    /// Linked; the shortcut not advanced, no record sent.
    AfterLink,
    /// Linked and the shortcut advanced; no record sent.
    AfterShortcut,
}

/// A shortcut CAS waiting for the client's next batch to the cell's node.
#[derive(Debug, Clone, Copy)]
struct PendingShortcut {
    cell: CellRef,
    from: Ptr,
    to: Ptr,
}

#[derive(Debug, Clone)]
struct Cached {
    cell: CellRef,
    /// The cursor: the last known tail's primary copy, and when it was learnt.
    tail: Option<(Ptr, Instant)>,
    /// Every copy of that tail.
    copies: Vec<Ptr>,
    tick: u64,
}

/// Key → cell and cursor, least recently used first out.
#[derive(Debug, Default)]
struct CursorCache {
    capacity: usize,
    tick: u64,
    map: HashMap<Vec<u8>, Cached>,
    order: BTreeMap<u64, Vec<u8>>,
}

impl CursorCache {
    /// The entry of `key`, now the most recently used.
    fn get(&mut self, key: &[u8]) -> Option<&Cached> {
        let c = self.map.get_mut(key)?;
        touch(&mut self.order, &mut self.tick, key, c);
        Some(c)
    }

    fn put(
        &mut self,
        key: &[u8],
        cell: CellRef,
        tail: Option<Ptr>,
        copies: impl IntoIterator<Item = Ptr>,
    ) {
        let tail = tail.map(|p| (p, Instant::now()));
        if let Some(c) = self.map.get_mut(key) {
            touch(&mut self.order, &mut self.tick, key, c);
            c.cell = cell;
            c.tail = tail;
            // Refilled in place: a cursor refreshed by every read allocates nothing.
            c.copies.clear();
            c.copies.extend(copies);
            return;
        }
        while self.map.len() >= self.capacity {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            self.map.remove(&old);
        }
        self.tick += 1;
        self.map.insert(
            key.to_vec(),
            Cached {
                cell,
                tail,
                copies: copies.into_iter().collect(),
                tick: self.tick,
            },
        );
        self.order.insert(self.tick, key.to_vec());
    }
}

/// Makes `c` (the entry of `key`) the most recently used, moving its key within `order` rather than copying it;
/// nothing to do when it is already (a read's lookup and its cursor refresh touch the same entry).
fn touch(order: &mut BTreeMap<u64, Vec<u8>>, tick: &mut u64, key: &[u8], c: &mut Cached) {
    if c.tick == *tick {
        return;
    }
    *tick += 1;
    let k = order.remove(&c.tick).unwrap_or_else(|| key.to_vec());
    order.insert(*tick, k);
    c.tick = *tick;
}

/// A key's tail as one read found it.
#[derive(Debug)]
struct Tail {
    cell: CellRef,
    /// `None`: the key has no version yet.
    ptr: Option<Ptr>,
    /// Every copy of the tail (empty when there is none); inline up to four copies, so that a read, which drops
    /// them, allocates nothing for them.
    copies: Copies,
    value: Option<Vec<u8>>,
}

/// The copies of one version, the primary first.
type Copies = smallvec::SmallVec<[Ptr; 4]>;

/// What a client and its background thread share.
#[derive(Debug, Default)]
struct Exchange {
    /// Versions granted by the MS, not yet taken by the client.
    inbox: Vec<Vec<Grant>>,
    /// Records for the MS.
    outbox: Vec<Record>,
    /// A refill is asked for, its primaries preferably on this node.
    want: Option<u16>,
    /// The last call to the MS failed: the home node whose slots it asked for (none for records only), and why.
    error: Option<(Option<u16>, String)>,
    stop: bool,
}

type Shared = Arc<(Mutex<Exchange>, std::sync::Condvar)>;

/// The thread that talks to the MS off the write path: refills free slots and sends records.
struct Background {
    shared: Shared,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    fn start(
        mut ms: Endpoint,
        client: u32,
        settings: &CloverSettings,
    ) -> Result<Background, PdpmError> {
        let shared: Shared = Arc::default();
        let theirs = shared.clone();
        let (grant_batch, record_batch) = (settings.grant_batch, settings.record_batch.max(1));
        let thread = std::thread::Builder::new()
            .name("clover-ms".into())
            .spawn(move || {
                let (lock, cvar) = &*theirs;
                let mut x = lock.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if x.stop {
                        return;
                    }
                    if x.want.is_none() && x.outbox.len() < record_batch {
                        x = cvar.wait(x).unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    let want = x.want;
                    let records = std::mem::take(&mut x.outbox);
                    drop(x);
                    let r: Result<Vec<Vec<Grant>>, FabricError> = match want {
                        Some(node) => ms.call(
                            method::GRANT,
                            &GrantRequest {
                                client,
                                node,
                                count: grant_batch,
                                records,
                            },
                        ),
                        None => ms
                            .call::<_, ()>(method::RECORDS, &(client, records))
                            .map(|()| Vec::new()),
                    };
                    let empty = matches!(&r, Ok(g) if g.is_empty());
                    if want.is_some() && empty {
                        // Every free slot is granted or waiting out its lease: ask again shortly.
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    x = lock.lock().unwrap_or_else(|e| e.into_inner());
                    match r {
                        // A request made while the call was out (for records only) stays asked for.
                        Ok(groups) => {
                            if want.is_some() && !empty {
                                x.want = None;
                            }
                            x.inbox.extend(groups);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "metadata server call failed");
                            x.error = Some((want, e.to_string()));
                            if want.is_some() {
                                x.want = None;
                            }
                        }
                    }
                    cvar.notify_all();
                }
            })
            .map_err(|e| PdpmError::Config(format!("cannot start the metadata thread: {e}")))?;
        Ok(Background {
            shared,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Exchange> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the thread (a call in flight completes first).
    fn stop(&mut self) {
        self.lock().stop = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One compute-node thread's Clover client.
pub struct CloverClient {
    ms: Endpoint,
    background: Background,
    /// Connections to the memory nodes, and those found unreachable.
    nodes: MemoryNodes<CloverLayout>,
    layout: CloverLayout,
    max_probe: u32,
    node_seed: u64,
    settings: CloverSettings,
    id: u32,
    /// Granted versions (one slot per copy) by their primary's memory node.
    free: Vec<Vec<Vec<Grant>>>,
    /// Protocol steps (see [`CloverClient::protocol_steps`]).
    steps: u64,
    /// Inside a step whose posts to several memory nodes go out in parallel.
    parallel: bool,
    records: Vec<Record>,
    pending: Vec<PendingShortcut>,
    /// Shortcut CASes that found the shortcut elsewhere: advanced by a walk at the end of the operation.
    stalled: Vec<PendingShortcut>,
    cache: CursorCache,
    batch: Batch<'static>,
    /// The entry a write encodes, kept for the next write.
    entry_buf: Vec<u8>,
}

impl std::fmt::Debug for CloverClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloverClient")
            .field("id", &self.id)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl CloverClient {
    /// Visits the cells `first..first + n` of `node` that hold a key whose first version is linked, read in one
    /// READ: each one's index, key and shortcut.
    fn read_key_cells(
        &mut self,
        node: usize,
        first: u64,
        n: u64,
        buf: &mut Vec<u8>,
        mut visit: impl FnMut(u64, &[u8], Ptr),
    ) -> Result<(), PdpmError> {
        let cl = self.layout.cell_len();
        buf.resize((n * cl) as usize, 0);
        self.steps += 1;
        let r = self.nodes.eps[node].read(
            cell_addr(&self.nodes.areas[node], &self.layout, first as u32),
            buf,
        );
        self.on(node, r)?;
        for (i, c) in buf.chunks_exact(cl as usize).enumerate() {
            // A free cell, or a key created whose first version is not linked yet (checked before the key, as
            // such a cell is skipped whatever its length word says).
            if Ptr::from_word(le_u64(c, 0)).is_none() {
                continue;
            }
            if let Some((key, Some(shortcut))) = parse_cell(node, c)? {
                visit(first + i as u64, key, shortcut);
            }
        }
        Ok(())
    }

    /// Connects to the MS and to its memory nodes (in the MS's order).
    pub fn connect(
        metadata_server: &Connector,
        memory_nodes: &[Connector],
        settings: CloverSettings,
    ) -> Result<CloverClient, PdpmError> {
        if settings.grant_batch == 0 || settings.cursor_capacity == 0 || settings.max_hops == 0 {
            return Err(PdpmError::Config(
                "grant_batch, cursor_capacity and max_hops must be at least 1".into(),
            ));
        }
        if settings.refill_at > settings.grant_batch {
            return Err(PdpmError::Config(format!(
                "refill_at ({}) must not exceed grant_batch ({})",
                settings.refill_at, settings.grant_batch
            )));
        }
        let mut ms = metadata_server.connect()?;
        let reply: LayoutReply = ms.call(method::LAYOUT, &())?;
        if reply.nodes as usize != memory_nodes.len() {
            return Err(PdpmError::Config(format!(
                "the metadata server manages {} memory nodes, {} given",
                reply.nodes,
                memory_nodes.len()
            )));
        }
        if settings.read_timeout.as_micros() as u64 * 2 > reply.reclaim_lease_us
            || settings.cursor_idle.as_micros() as u64 >= reply.wrap_park_us
        {
            return Err(PdpmError::Config(format!(
                "read_timeout ({:?}) must be at most half the reclaim lease ({} us) and cursor_idle ({:?}) below \
                 the wrap park ({} us)",
                settings.read_timeout,
                reply.reclaim_lease_us,
                settings.cursor_idle,
                reply.wrap_park_us
            )));
        }
        let nodes = MemoryNodes::<CloverLayout>::connect(memory_nodes, settings.node_retry)?;
        if nodes.layout != reply.layout {
            return Err(PdpmError::Layout {
                node: 0,
                why: "area differs from the metadata server's".into(),
            });
        }
        // The layout is the memory nodes' own (checked when located); the probe length is the server's word alone.
        check_probe(reply.max_probe, &nodes.layout)?;
        let id = crate::named_client(reply.client)?;
        let background = Background::start(metadata_server.connect()?, id, &settings)?;
        Ok(CloverClient {
            ms,
            background,
            free: vec![Vec::new(); nodes.len()],
            nodes,
            layout: reply.layout,
            max_probe: reply.max_probe,
            node_seed: reply.node_seed,
            cache: CursorCache {
                capacity: settings.cursor_capacity,
                ..CursorCache::default()
            },
            settings,
            id,
            records: Vec::new(),
            steps: 0,
            parallel: false,
            pending: Vec::new(),
            stalled: Vec::new(),
            batch: Batch::new(),
            entry_buf: Vec::new(),
        })
    }

    /// This client's identity at the MS (for [`MetadataServer::reclaim_grants`]).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Has the background thread fetch free slots for the keys of every home node whose copy nodes answer, and
    /// waits for them (up to `space_wait` each), so that the next writes find some.
    pub fn refill(&mut self) -> Result<(), PdpmError> {
        for home in 0..self.nodes.len() {
            if self.copies_up(home).is_err() {
                continue;
            }
            let g = self.wait_for_grants(home)?;
            self.give_back(g);
        }
        Ok(())
    }

    /// The fault hooks of this client's current connection to memory node `node` (tests cut it to fail the node;
    /// a reconnection after [`CloverSettings::node_retry`] gets fresh hooks).
    pub fn fault_hooks(&self, node: usize) -> Option<Arc<dinomo_fabric::FaultHooks>> {
        self.nodes.fault_hooks(node)
    }

    /// The home node of `key`: its cells and the primary copies of its versions are there, copy `j` on the `j`-th
    /// node after it.
    pub fn home_of(&self, key: &[u8]) -> usize {
        self.home(key)
    }

    /// Passes `r` (the outcome of a verb to `node`) on; when its error says the node is gone, marks it down and
    /// tells the MS (best effort), which then grants no space on it.
    fn on<T, E: Into<PdpmError>>(&mut self, node: usize, r: Result<T, E>) -> Result<T, PdpmError> {
        self.nodes
            .track_reporting(node, r, &mut self.ms, method::REPORT_DOWN)
    }

    /// READs the 8-byte word at `addr` on `node` (a shortcut or replica cell) in its own round trip.
    fn read_word(&mut self, node: usize, addr: RemoteAddr) -> Result<u64, PdpmError> {
        let mut word = [0u8; 8];
        let r = self.nodes.eps[node].read(addr, &mut word);
        self.on(node, r)?;
        Ok(u64::from_le_bytes(word))
    }

    /// Writes need every node holding a copy of the key's versions (the commit point is the primary's header,
    /// and every copy is chained before the write returns): refused, nothing applied, while one counts as down.
    fn copies_up(&mut self, home: usize) -> Result<(), PdpmError> {
        for j in 0..self.layout.replication as usize {
            let node = copy_node(home, j, self.nodes.len());
            if !self.nodes.reachable(node) {
                return Err(PdpmError::NodeDown {
                    node,
                    why: format!(
                        "it holds copy {j} of the versions of keys whose home is node {home}; writes need every copy"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Sends the shortcut CASes and records held, so that the MS knows of every retired slot.
    pub fn flush(&mut self) -> Result<(), PdpmError> {
        for node in 0..self.nodes.len() {
            if self.pending.iter().any(|p| p.cell.node as usize == node) {
                self.batch.clear();
                let carried = self.carry_pending(node);
                self.post(node, carried)?;
            }
        }
        self.help_stalled()?;
        let mut records = std::mem::take(&mut self.background.lock().outbox);
        records.append(&mut self.records);
        if !records.is_empty() {
            self.ms
                .call::<_, ()>(method::RECORDS, &(self.id, records))?;
        }
        Ok(())
    }

    /// Atomic read-modify-write of `key`: reads its tail, calls `f` with its value and links the outcome onto
    /// exactly that tail. When another version was linked in between, the tail is read again and **`f` runs again**
    /// (it may run any number of times; only the last call's outcome is written).
    pub fn update(
        &mut self,
        key: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>) -> Change,
    ) -> Result<(), PdpmError> {
        check_key(key, self.layout.max_key)?;
        let r = self.update_inner(key, f);
        self.after_op(r)
    }

    /// Runs a put up to `point` and stops, as a client that crashed would. For crash tests.
    pub fn put_crashing(
        &mut self,
        key: &[u8],
        value: &[u8],
        point: CloverCrash,
    ) -> Result<(), PdpmError> {
        self.check(key, Some(value))?;
        let r = self.write(key, Some(value), Some(point));
        // Nothing more reaches the MS from this client.
        self.background.stop();
        r
    }

    fn check(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), PdpmError> {
        check_key(key, self.layout.max_key)?;
        value.map_or(Ok(()), |v| check_value(v, self.layout.max_value))
    }

    fn after_op<T>(&mut self, r: Result<T, PdpmError>) -> Result<T, PdpmError> {
        let r = r.and_then(|v| self.help_stalled().map(|()| v));
        if self.records.len() >= self.settings.record_batch {
            let mut x = self.background.lock();
            x.outbox.append(&mut self.records);
            drop(x);
            self.background.shared.1.notify_all();
        }
        r
    }

    fn home(&self, key: &[u8]) -> usize {
        home_node(key, self.node_seed, self.nodes.len())
    }

    fn valid_ptr(&self, p: Ptr) -> Result<(), PdpmError> {
        if (p.node() as usize) < self.nodes.len() && (p.slot() as u64) < self.layout.slots {
            return Ok(());
        }
        Err(PdpmError::Layout {
            node: p.node() as usize,
            why: format!("pointer to slot {} out of range", p.slot()),
        })
    }

    /// Adds the shortcut CASes pending for `node` to the batch.
    fn carry_pending(&mut self, node: usize) -> Vec<(PendingShortcut, dinomo_fabric::Slot)> {
        let mut carried = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let p = self.pending[i];
            if p.cell.node as usize == node {
                let addr = cell_addr(&self.nodes.areas[node], &self.layout, p.cell.cell);
                carried.push((p, self.batch.cas(addr, p.from.word(), p.to.word())));
                self.pending.remove(i);
            } else {
                i += 1;
            }
        }
        carried
    }

    /// Posts the batch to `node` and settles the shortcut CASes it carried.
    fn post(
        &mut self,
        node: usize,
        carried: Vec<(PendingShortcut, dinomo_fabric::Slot)>,
    ) -> Result<(), PdpmError> {
        if !self.parallel {
            self.steps += 1;
        }
        let r = self.nodes.eps[node].post(&mut self.batch);
        self.on(node, r)?;
        for (p, verb) in carried {
            if self.batch.old_value(verb) == p.from.word() {
                self.records.push(Record::Retired(p.from));
            } else {
                self.stalled.push(p);
            }
        }
        Ok(())
    }

    /// Advances shortcuts that were not where their CAS expected (a writer that crashed before advancing it, or
    /// one whose CAS is still pending): walks from the shortcut to the version this client linked and moves the
    /// shortcut there in one CAS, retiring every version it passes. A shortcut found at or past that version is
    /// left alone: a later version's writer may have stopped before chaining its replica cells, which then still
    /// name the version before it, and retiring that one would leave them naming a slot that is reused.
    fn help_stalled(&mut self) -> Result<(), PdpmError> {
        let mut passed = Vec::new();
        while let Some(p) = self.stalled.pop() {
            let node = p.cell.node as usize;
            let addr = cell_addr(&self.nodes.areas[node], &self.layout, p.cell.cell);
            let mut hops = 0;
            'look: while hops < self.settings.max_hops {
                let start = self.read_word(node, addr)?;
                let Some(mut cur) = Ptr::from_word(start) else {
                    break;
                };
                passed.clear();
                while cur != p.to {
                    hops += 1;
                    if hops > self.settings.max_hops {
                        break 'look;
                    }
                    self.valid_ptr(cur)?;
                    let Some(e) = self.read_entry(cur)? else {
                        // Retired and reused meanwhile: someone moved the shortcut on; look again.
                        continue 'look;
                    };
                    // The tail, and this client's version not met: the shortcut is past it already.
                    let Some(next) = e.next else { break 'look };
                    passed.push(cur);
                    cur = next;
                }
                if passed.is_empty() {
                    break;
                }
                hops += 1;
                let r = self.nodes.eps[node].cas(addr, start, p.to.word());
                if self.on(node, r)? == start {
                    self.records.extend(passed.drain(..).map(Record::Retired));
                    break;
                }
            }
        }
        Ok(())
    }

    /// READs the entry at `p` in its own round trip (carrying pending shortcut CASes for its node); `None` when it
    /// is not a whole version of that GC version or the READ took longer than the read timeout.
    fn read_entry(&mut self, p: Ptr) -> Result<Option<Entry<'_>>, PdpmError> {
        let (verb, _) = self.read_slot(p, None)?;
        Ok(verb.and_then(|v| parse_entry(&self.layout, self.batch.read_data(v), p.version())))
    }

    /// READs the slot `p` names in its own round trip (carrying pending shortcut CASes for its node), with the
    /// shortcut word of `cell` in the same batch when the cell is on that node. Returns the slot READ's verb in
    /// the batch (`None` when the round trip took longer than the read timeout: the slot may have been reused
    /// meanwhile) and the shortcut, when it was read.
    fn read_slot(
        &mut self,
        p: Ptr,
        cell: Option<CellRef>,
    ) -> Result<(Option<dinomo_fabric::Slot>, Option<Option<Ptr>>), PdpmError> {
        let node = p.node() as usize;
        self.batch.clear();
        let carried = self.carry_pending(node);
        let verb = self.batch.read(
            slot_addr(&self.nodes.areas[node], &self.layout, p.slot()),
            self.layout.slot_len() as u32,
        );
        let shortcut = cell.filter(|c| c.node as usize == node).map(|c| {
            self.batch
                .read(cell_addr(&self.nodes.areas[node], &self.layout, c.cell), 8)
        });
        let start = Instant::now();
        self.post(node, carried)?;
        let fresh = start.elapsed() <= self.settings.read_timeout;
        let shortcut = shortcut.map(|v| Ptr::from_word(le_u64(self.batch.read_data(v), 0)));
        Ok((fresh.then_some(verb), shortcut))
    }

    /// Reads the shortcut word of `cell`.
    fn read_cell(&mut self, cell: CellRef) -> Result<Option<Ptr>, PdpmError> {
        let node = cell.node as usize;
        self.batch.clear();
        let carried = self.carry_pending(node);
        let verb = self.batch.read(
            cell_addr(&self.nodes.areas[node], &self.layout, cell.cell),
            8,
        );
        self.post(node, carried)?;
        Ok(Ptr::from_word(le_u64(self.batch.read_data(verb), 0)))
    }

    /// Finds `key`'s cell by reading its probe window; `None` when the key was never created.
    fn find_cell(&mut self, key: &[u8]) -> Result<Option<(CellRef, Option<Ptr>)>, PdpmError> {
        let home = self.home(key);
        let found = self.probe_section(home, 0, key)?;
        Ok(found.map(|(cell, ptr)| {
            (
                CellRef {
                    node: home as u16,
                    cell,
                },
                ptr,
            )
        }))
    }

    /// Reads `key`'s probe window in cell section `section` of memory node `node` (carrying the shortcut CASes
    /// pending there): its cell index and the pointer word there, `None` when the key has no cell.
    fn probe_section(
        &mut self,
        node: usize,
        section: usize,
        key: &[u8],
    ) -> Result<Option<(u32, Option<Ptr>)>, PdpmError> {
        self.batch.clear();
        let carried = self.carry_pending(node);
        let reads = probe_reads(
            &mut self.batch,
            &self.nodes.areas[node],
            &self.layout,
            section,
            self.max_probe,
            key,
        );
        self.post(node, carried)?;
        Ok(scan_probe(&self.batch, &reads, &self.layout, key).found)
    }

    /// The key's tail: from the cursor when one is cached (one batch with the shortcut when they share a node),
    /// else from the shortcut. `None` when the key has no cell.
    fn read_tail(&mut self, key: &[u8]) -> Result<Option<Tail>, PdpmError> {
        let cached = self.cache.get(key).map(|c| (c.cell, c.tail));
        let (cell, mut cur, mut first, mut shortcut) = match cached {
            None => match self.find_cell(key)? {
                None => return Ok(None),
                Some((cell, s)) => (cell, s, None, None),
            },
            Some((cell, Some((t, used)))) if used.elapsed() < self.settings.cursor_idle => {
                self.valid_ptr(t)?;
                let (entry, s) = self.read_slot(t, Some(cell))?;
                (cell, Some(t), Some(entry), s)
            }
            Some((cell, _)) => {
                let s = self.read_cell(cell)?;
                (cell, s, None, None)
            }
        };
        for _ in 0..self.settings.max_hops {
            let Some(p) = cur else {
                self.cache.put(key, cell, None, []);
                return Ok(Some(Tail {
                    cell,
                    ptr: None,
                    copies: Copies::new(),
                    value: None,
                }));
            };
            self.valid_ptr(p)?;
            let verb = match first.take() {
                Some(verb) => verb,
                None => self.read_slot(p, None)?.0,
            };
            let e =
                verb.and_then(|v| parse_entry(&self.layout, self.batch.read_data(v), p.version()));
            match e {
                Some(e) if e.key == key => match e.next {
                    None => {
                        self.cache.put(key, cell, Some(p), e.copies());
                        return Ok(Some(Tail {
                            cell,
                            ptr: Some(p),
                            copies: e.copies().collect(),
                            value: e.value.map(<[u8]>::to_vec),
                        }));
                    }
                    Some(next) => {
                        // The shortcut read beside a stale cursor usually points nearer the tail.
                        cur = match shortcut.take().flatten() {
                            Some(s) if s != p => Some(s),
                            _ => Some(next),
                        };
                    }
                },
                // The slot was reclaimed and reused under a stale pointer: start over from the shortcut.
                _ => {
                    cur = match shortcut.take() {
                        Some(s) => s,
                        None => self.read_cell(cell)?,
                    };
                }
            }
        }
        Err(PdpmError::Contended {
            node: cell.node as usize,
            slot: cell.cell as u64,
            attempts: self.settings.max_hops,
        })
    }

    /// `key`'s committed value: from the primary chain on its home; when the home is down, from the first replica
    /// node that answers, along its own chain (cell section `j`, header words `j`), which every write chains
    /// before it returns. No copy answers: [`PdpmError::NodeDown`].
    fn read_value(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PdpmError> {
        let home = self.home(key);
        let mut tried = Tried::default();
        if self.nodes.reachable(home) {
            match self.read_tail(key) {
                Ok(t) => return Ok(t.and_then(|t| t.value)),
                Err(e) if is_node_failure(&e) => tried.failed(home, &e),
                Err(e) => return Err(e),
            }
        } else {
            tried.skipped(home);
        }
        for j in 1..self.layout.replication as usize {
            let node = copy_node(home, j, self.nodes.len());
            if !self.nodes.reachable(node) {
                tried.skipped(node);
                continue;
            }
            match self.read_replica(key, j) {
                Ok(v) => return Ok(v),
                Err(e) if is_node_failure(&e) => tried.failed(node, &e),
                Err(e) => return Err(e),
            }
        }
        Err(tried.node_down(home, "copy of the key"))
    }

    /// `key`'s value along replica chain `j`: its cell in section `j` (the cached cell index, else the probe
    /// window there) names copy `j` of a version at or past the shortcut; header word `j` leads on to the tail.
    /// A copy that fails validation (its slot was recycled under this walk) restarts from the cell.
    fn read_replica(&mut self, key: &[u8], j: usize) -> Result<Option<Vec<u8>>, PdpmError> {
        let home = self.home(key);
        let node = copy_node(home, j, self.nodes.len());
        let cell = match self.cache.get(key).map(|c| c.cell.cell) {
            Some(c) => c,
            None => match self.probe_section(node, j, key)? {
                None => return Ok(None),
                Some((c, _)) => c,
            },
        };
        let addr = section_cell_addr(&self.nodes.areas[node], &self.layout, j, cell);
        let mut cur = None;
        let mut from_cell = true;
        for _ in 0..self.settings.max_hops {
            if from_cell {
                cur = Ptr::from_word(self.read_word(node, addr)?);
                from_cell = false;
            }
            let Some(p) = cur else { return Ok(None) };
            self.valid_ptr(p)?;
            match self.read_entry(p)? {
                Some(e) if e.key == key => match e.next_copy(j) {
                    None => return Ok(e.value.map(<[u8]>::to_vec)),
                    Some(n) => cur = Some(n),
                },
                _ => from_cell = true,
            }
        }
        Err(PdpmError::Contended {
            node,
            slot: cell as u64,
            attempts: self.settings.max_hops,
        })
    }

    /// A granted version (one slot per copy, the primary first) for a key whose home is `node`. Slots come
    /// from the background thread, asked for once fewer than `refill_at` are left; a write that finds none waits
    /// for them (up to `space_wait`, while retired slots wait out their lease).
    fn take_group(&mut self, node: usize) -> Result<Vec<Grant>, PdpmError> {
        self.take_inbox(Some(node))?;
        let Some(g) = self.free[node].pop() else {
            return self.wait_for_grants(node);
        };
        if self.free[node].len() < self.settings.refill_at as usize {
            self.ask_for_grants(node);
        }
        Ok(g)
    }

    fn ask_for_grants(&mut self, node: usize) {
        let mut x = self.background.lock();
        if x.want.is_none() {
            x.want = Some(node as u16);
        }
        x.outbox.append(&mut self.records);
        drop(x);
        self.background.shared.1.notify_all();
    }

    /// Moves what the background thread received into the free lists, checking it. A failed call is reported
    /// to a write for `node` only when it asked for that node's slots (or sent records only): a refill that
    /// failed for another home (one whose copy node is down, say) is that home's writes' business, and they ask
    /// again when they need slots. `None` reports any failure.
    fn take_inbox(&mut self, node: Option<usize>) -> Result<(), PdpmError> {
        let (groups, error) = {
            let mut x = self.background.lock();
            (std::mem::take(&mut x.inbox), x.error.take())
        };
        for group in groups {
            let mut nodes = HashSet::new();
            for g in &group {
                self.valid_ptr(g.ptr())?;
                nodes.insert(g.node);
            }
            let m = self.nodes.len();
            let placed = group
                .iter()
                .enumerate()
                .all(|(j, g)| g.node as usize == copy_node(group[0].node as usize, j, m));
            if group.len() != self.layout.replication as usize
                || nodes.len() != group.len()
                || !placed
            {
                return Err(PdpmError::Coordinator(
                    "granted version does not have copy j on the j-th node from its primary's"
                        .into(),
                ));
            }
            self.give_back(group);
        }
        match error {
            Some((asked, e))
                if node.is_none() || asked.is_none_or(|a| Some(a as usize) == node) =>
            {
                Err(PdpmError::Coordinator(format!("refill failed: {e}")))
            }
            Some((asked, e)) => {
                tracing::debug!(home = asked, error = %e, "a refill for another home failed");
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Asks for a refill and waits until one version's slots arrive.
    fn wait_for_grants(&mut self, node: usize) -> Result<Vec<Grant>, PdpmError> {
        let deadline = Instant::now() + self.settings.space_wait;
        self.ask_for_grants(node);
        loop {
            {
                let (lock, cvar) = &*self.background.shared;
                let mut x = lock.lock().unwrap_or_else(|e| e.into_inner());
                while x.inbox.is_empty() && x.error.is_none() && !x.stop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    x = cvar
                        .wait_timeout(x, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            self.take_inbox(Some(node))?;
            if let Some(g) = self.free[node].pop() {
                return Ok(g);
            }
            if Instant::now() >= deadline || self.background.thread.is_none() {
                return Err(PdpmError::OutOfSpace(
                    "the metadata server has no free slots".into(),
                ));
            }
            self.ask_for_grants(node);
        }
    }

    fn give_back(&mut self, group: Vec<Grant>) {
        if let Some(first) = group.first() {
            self.free[first.node as usize].push(group);
        }
    }

    /// WRITEs every copy of a version into its slot, each with the validating READ of its last 8 bytes (one
    /// round trip per memory node; one protocol step).
    fn write_copies(
        &mut self,
        group: &[Grant],
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), PdpmError> {
        self.steps += 1;
        self.parallel = true;
        let mut bytes = std::mem::take(&mut self.entry_buf);
        let r = (0..group.len()).try_for_each(|j| {
            let g = group[j];
            encode_entry(&mut bytes, group, j, key, value);
            let node = g.node as usize;
            let addr = slot_addr(&self.nodes.areas[node], &self.layout, g.slot);
            self.batch.clear();
            let carried = self.carry_pending(node);
            self.batch.write_copy(addr, &bytes);
            let tail = bytes.len() as u64 - 8;
            let check = self.batch.read(addr.offset_by(tail), 8);
            self.post(node, carried)?;
            validate(
                node,
                Some(g.slot as u64),
                self.batch.read_data(check),
                &bytes[tail as usize..],
            )
        });
        self.entry_buf = bytes;
        self.parallel = false;
        r
    }

    /// CAS-links `new` after `tail` (or into the empty cell). `Ok(None)` on success, else what the CAS found in the
    /// way: `Some(Some(p))` a newer version to chase from, `Some(None)` the tail's slot was recycled.
    fn link(
        &mut self,
        cell: CellRef,
        tail: Option<Ptr>,
        new: Ptr,
    ) -> Result<Option<Option<Ptr>>, PdpmError> {
        let (node, addr, expect, swap) = match tail {
            None => {
                let node = cell.node as usize;
                (
                    node,
                    cell_addr(&self.nodes.areas[node], &self.layout, cell.cell),
                    0,
                    new.word(),
                )
            }
            Some(t) => {
                let node = t.node() as usize;
                let own = (t.version() as u64) << 56;
                (
                    node,
                    slot_addr(&self.nodes.areas[node], &self.layout, t.slot()),
                    own,
                    own | new.word(),
                )
            }
        };
        self.steps += 1;
        let r = self.nodes.eps[node].cas(addr, expect, swap);
        let old = self.on(node, r)?;
        if old == expect {
            return Ok(None);
        }
        match tail {
            // The cell holds a first version already: its word is the way on.
            None => Ok(Some(Ptr::from_word(old))),
            Some(t) if (old >> 56) as u8 == t.version() => Ok(Some(Ptr::from_word(old))),
            Some(_) => Ok(Some(None)),
        }
    }

    /// All-way chaining (R > 1), one protocol step with one round trip per memory node: on each replica node `j`
    /// (the last first), header word `k` of the old tail's copy `j` is CASed to the new version's copy `k` and the
    /// key's cell in section `j` from the old copy `j` to the new one; then on the home, the primary's other header
    /// words, carrying the shortcut CAS pending there. So every replica cell is at or past the shortcut, and the
    /// version the shortcut passes (retired) is named by no cell. CASes expect "own GC version, no next" (a slot
    /// recycled meanwhile is left alone); a replica cell found elsewhere is repaired (`repair_cell`).
    fn chain_replicas(&mut self, key: &[u8], tail: &Tail, new: &[Grant]) -> Result<(), PdpmError> {
        let r = new.len();
        let home = new[0].node as usize;
        let old: &[Ptr] = if tail.copies.len() == r {
            &tail.copies
        } else {
            &[]
        };
        for &o in old {
            self.valid_ptr(o)?;
        }
        self.steps += 1;
        self.parallel = true;
        let result = (1..r).rev().try_for_each(|j| {
            let node = new[j].node as usize;
            self.batch.clear();
            let carried = self.carry_pending(node);
            if let Some(&o) = old.get(j) {
                if o.node() as usize != node {
                    return Err(PdpmError::Layout {
                        node,
                        why: format!("copy {j} of a version is on node {}", o.node()),
                    });
                }
                let base = slot_addr(&self.nodes.areas[node], &self.layout, o.slot());
                let own = (o.version() as u64) << 56;
                for (k, n) in new.iter().enumerate() {
                    self.batch
                        .cas(base.offset_by(8 * k as u64), own, own | n.ptr().word());
                }
            }
            let cell = section_cell_addr(&self.nodes.areas[node], &self.layout, j, tail.cell.cell);
            let expect = old.get(j).map_or(0, |o| o.word());
            let verb = self.batch.cas(cell, expect, new[j].ptr().word());
            self.post(node, carried)?;
            if self.batch.old_value(verb) != expect {
                self.repair_cell(key, j, tail.cell.cell, new[j].ptr())?;
            }
            Ok(())
        });
        let result = result.and_then(|()| {
            // The shortcut CAS (old tail to new) rides in the home's batch.
            if let Some(from) = tail.ptr {
                self.pending.push(PendingShortcut {
                    cell: tail.cell,
                    from,
                    to: new[0].ptr(),
                });
            }
            self.batch.clear();
            let carried = self.carry_pending(home);
            if let Some(&o) = old.first() {
                let base = slot_addr(&self.nodes.areas[home], &self.layout, o.slot());
                let own = (o.version() as u64) << 56;
                for (k, n) in new.iter().enumerate().skip(1) {
                    self.batch
                        .cas(base.offset_by(8 * k as u64), own, own | n.ptr().word());
                }
            }
            self.post(home, carried)
        });
        self.parallel = false;
        result
    }

    /// Brings `key`'s cell in section `j` (on the `j`-th node from its home) to `target` (copy `j` of the version
    /// this client just linked) unless it is past it already. The cell was not at the old tail's copy: an earlier
    /// writer stopped between its commit and its chaining (then replica chain `j` misses that link too), or a
    /// later writer's chaining ran first. Walks chain `j` from the cell: meeting `target`, the cell was behind and
    /// is CASed forward; reaching the key's tail without meeting it, the cell is past it. A copy with no next
    /// whose primary has one is a link a writer left out: it is completed from the primary chain (the home answers:
    /// writes need every copy node).
    fn repair_cell(
        &mut self,
        key: &[u8],
        j: usize,
        cell: u32,
        target: Ptr,
    ) -> Result<(), PdpmError> {
        let node = target.node() as usize;
        let addr = section_cell_addr(&self.nodes.areas[node], &self.layout, j, cell);
        let mut hops = 0;
        'restart: while hops < self.settings.max_hops {
            let start = self.read_word(node, addr)?;
            let mut at = match Ptr::from_word(start) {
                Some(p) if p == target => return Ok(()),
                Some(p) => p,
                None => {
                    // Never set (the first version's writer stopped before chaining): point it at ours.
                    let r = self.nodes.eps[node].cas(addr, 0, target.word());
                    if self.on(node, r)? == 0 {
                        return Ok(());
                    }
                    hops += 1;
                    continue;
                }
            };
            loop {
                hops += 1;
                if hops > self.settings.max_hops {
                    break 'restart;
                }
                self.valid_ptr(at)?;
                let Some(e) = self.read_entry(at)?.filter(|e| e.key == key) else {
                    continue 'restart;
                };
                let next = match e.next_copy(j) {
                    Some(n) => n,
                    None => {
                        let Some(primary) = e.copy(0) else {
                            continue 'restart;
                        };
                        self.valid_ptr(primary)?;
                        let Some(p) = self.read_entry(primary)?.filter(|p| p.key == key) else {
                            continue 'restart;
                        };
                        // No next on the primary either: `at` is the tail, the cell is past `target`.
                        let Some(z) = p.next else { return Ok(()) };
                        self.valid_ptr(z)?;
                        let Some(ze) = self.read_entry(z)?.filter(|z| z.key == key) else {
                            continue 'restart;
                        };
                        let Some(zj) = ze.copy(j) else {
                            continue 'restart;
                        };
                        let copies: Copies = ze.copies().collect();
                        // Complete the link the writer of `z` left out.
                        let n = at.node() as usize;
                        let base = slot_addr(&self.nodes.areas[n], &self.layout, at.slot());
                        let own = (at.version() as u64) << 56;
                        self.batch.clear();
                        for (k, c) in copies.iter().enumerate() {
                            self.batch
                                .cas(base.offset_by(8 * k as u64), own, own | c.word());
                        }
                        self.post(n, Vec::new())?;
                        zj
                    }
                };
                if next == target {
                    let r = self.nodes.eps[node].cas(addr, start, target.word());
                    if self.on(node, r)? == start {
                        return Ok(());
                    }
                    continue 'restart;
                }
                at = next;
            }
        }
        Err(PdpmError::Contended {
            node,
            slot: cell as u64,
            attempts: self.settings.max_hops,
        })
    }

    /// Bookkeeping after the version `new` was linked after `tail`: replica chaining, cursor, the shortcut CAS
    /// (for the next batch to the cell's node; with replicas, in the chaining's), the record.
    fn linked(
        &mut self,
        key: &[u8],
        tail: &Tail,
        new: &[Grant],
        crash: Option<CloverCrash>,
    ) -> Result<(), PdpmError> {
        let cell = tail.cell;
        let primary = new[0].ptr();
        self.cache
            .put(key, cell, Some(primary), new.iter().map(|g| g.ptr()));
        if crash == Some(CloverCrash::AfterLink) {
            return Ok(());
        }
        if new.len() > 1 {
            self.chain_replicas(key, tail, new)?;
        } else if let Some(from) = tail.ptr {
            self.pending.push(PendingShortcut {
                cell,
                from,
                to: primary,
            });
        }
        if crash == Some(CloverCrash::AfterShortcut) {
            // The shortcut CAS goes out now; the records it and the link produce are never sent.
            let node = cell.node as usize;
            self.batch.clear();
            let carried = self.carry_pending(node);
            self.post(node, carried)?;
            return Ok(());
        }
        self.records.push(Record::Linked(primary));
        Ok(())
    }

    /// Walks from `start` (a pointer found in the way of a link) to the tail; from the shortcut when `start` is
    /// `None` (the tail's slot was recycled).
    fn chase(&mut self, key: &[u8], cell: CellRef, start: Option<Ptr>) -> Result<Tail, PdpmError> {
        let mut cur = match start {
            Some(p) => Some(p),
            None => self.read_cell(cell)?,
        };
        for _ in 0..self.settings.max_hops {
            let Some(p) = cur else {
                return Ok(Tail {
                    cell,
                    ptr: None,
                    copies: Copies::new(),
                    value: None,
                });
            };
            self.valid_ptr(p)?;
            match self.read_entry(p)? {
                Some(e) if e.key == key => match e.next {
                    None => {
                        return Ok(Tail {
                            cell,
                            ptr: Some(p),
                            copies: e.copies().collect(),
                            value: e.value.map(<[u8]>::to_vec),
                        });
                    }
                    Some(n) => cur = Some(n),
                },
                _ => cur = self.read_cell(cell)?,
            }
        }
        Err(PdpmError::Contended {
            node: cell.node as usize,
            slot: cell.cell as u64,
            attempts: self.settings.max_hops,
        })
    }

    /// The key's tail for a blind write: the cursor when one is cached (no round trip), else read; creates the
    /// key's cell through the MS when it has none. The value is not known on the cursor path.
    fn tail_for_write(&mut self, key: &[u8]) -> Result<Tail, PdpmError> {
        let idle = self.settings.cursor_idle;
        if let Some(c) = self.cache.get(key)
            && let Some((t, used)) = c.tail
            && used.elapsed() < idle
        {
            return Ok(Tail {
                cell: c.cell,
                ptr: Some(t),
                copies: c.copies.iter().copied().collect(),
                value: None,
            });
        }
        if let Some(t) = self.read_tail(key)? {
            return Ok(t);
        }
        self.steps += 1;
        // A refused or lost CREATE made nothing visible (a claimed cell holds no version).
        let cell: CellRef = self.ms.call(method::CREATE, &key).map_err(|e| match e {
            FabricError::Rpc(RpcError::OutOfSpace(why)) => {
                PdpmError::OutOfSpace(format!("CREATE: {why}"))
            }
            e => PdpmError::Coordinator(format!("CREATE: {e}")),
        })?;
        if cell.node as usize >= self.nodes.len() || cell.cell as u64 >= self.layout.cells {
            return Err(PdpmError::Coordinator(
                "CREATE named a cell out of range".into(),
            ));
        }
        // Another client may have linked a first version since the MS answered.
        let s = self.read_cell(cell)?;
        let tail = match s {
            None => Tail {
                cell,
                ptr: None,
                copies: Copies::new(),
                value: None,
            },
            Some(p) => self.chase(key, cell, Some(p))?,
        };
        self.cache
            .put(key, cell, tail.ptr, tail.copies.iter().copied());
        Ok(tail)
    }

    /// A blind write (value or tombstone): out of place, then CAS-linked at the tail (chasing it on failure).
    fn write(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        crash: Option<CloverCrash>,
    ) -> Result<(), PdpmError> {
        let home = self.home(key);
        self.copies_up(home)?;
        let mut tail = self.tail_for_write(key).map_err(|e| not_applied(home, e))?;
        let group = self.take_group(home)?;
        if let Err(e) = self.write_copies(&group, key, value) {
            self.give_back(group);
            return Err(not_applied(home, e));
        }
        if crash == Some(CloverCrash::AfterWrite) {
            return Ok(());
        }
        let new = group[0].ptr();
        for _ in 0..self.settings.max_hops {
            match self.link(tail.cell, tail.ptr, new)? {
                None => return self.linked(key, &tail, &group, crash),
                Some(found) => tail = self.chase(key, tail.cell, found)?,
            }
        }
        // Never linked: the slots are still this client's.
        let cell = tail.cell;
        self.give_back(group);
        Err(PdpmError::Contended {
            node: cell.node as usize,
            slot: cell.cell as u64,
            attempts: self.settings.max_hops,
        })
    }

    fn update_inner(
        &mut self,
        key: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>) -> Change,
    ) -> Result<(), PdpmError> {
        let home = self.home(key);
        self.copies_up(home)?;
        let tail = match self.read_tail(key) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => {
                // No cell: create it only if `f` wants a value there.
                if matches!(f(None), Change::Keep | Change::Delete) {
                    return Ok(());
                }
                self.tail_for_write(key)
            }
            Err(e) => Err(e),
        };
        let mut tail = tail.map_err(|e| not_applied(home, e))?;
        let mut group: Option<Vec<Grant>> = None;
        let mut outcome = Ok(());
        for _ in 0..self.settings.max_hops {
            let value = match f(tail.value.as_deref()) {
                Change::Keep => break,
                Change::Delete if tail.value.is_none() => break,
                Change::Delete => None,
                Change::Put(v) => {
                    if let Err(e) = check_value(&v, self.layout.max_value) {
                        outcome = Err(e);
                        break;
                    }
                    Some(v)
                }
            };
            let g = match group.take() {
                Some(g) => g,
                None => self.take_group(home)?,
            };
            // Rewriting an unlinked version in place is safe: no reader can reach it.
            if let Err(e) = self.write_copies(&g, key, value.as_deref()) {
                outcome = Err(not_applied(home, e));
                group = Some(g);
                break;
            }
            match self.link(tail.cell, tail.ptr, g[0].ptr())? {
                None => return self.linked(key, &tail, &g, None),
                Some(found) => tail = self.chase(key, tail.cell, found)?,
            }
            group = Some(g);
        }
        if let Some(g) = group {
            self.give_back(g);
        }
        outcome
    }

    /// Protocol steps taken so far: round trips as the paper counts them, where the verbs of one step to several
    /// memory nodes (the copies of a version) go out in parallel.
    pub fn protocol_steps(&self) -> u64 {
        self.steps
    }

    /// The values along replica chain `j` (copy `j` of each version, following header word `j` only), from the
    /// version the shortcut names to the tail. Shows that every copy is written and all-way chained.
    pub fn replica_chain(
        &mut self,
        key: &[u8],
        j: usize,
    ) -> Result<Vec<Option<Vec<u8>>>, PdpmError> {
        self.check(key, None)?;
        if j >= self.layout.replication as usize {
            return Err(PdpmError::Config(format!("no copy {j}")));
        }
        let Some((cell, Some(s))) = self.find_cell(key)? else {
            return Ok(Vec::new());
        };
        let Some(e) = self.read_entry(s)? else {
            return Err(PdpmError::Contended {
                node: cell.node as usize,
                slot: cell.cell as u64,
                attempts: 1,
            });
        };
        let mut cur = e.copy(j);
        let mut out = Vec::new();
        for _ in 0..self.settings.max_hops {
            let Some(p) = cur else { return Ok(out) };
            self.valid_ptr(p)?;
            let Some(e) = self.read_entry(p)? else {
                return Err(PdpmError::Layout {
                    node: p.node() as usize,
                    why: format!(
                        "replica chain {j} names slot {} that holds no such version",
                        p.slot()
                    ),
                });
            };
            out.push(e.value.map(<[u8]>::to_vec));
            cur = e.next_copy(j);
        }
        Ok(out)
    }
}

impl PdpmStore for CloverClient {
    fn max_value_len(&self) -> usize {
        self.layout.max_value as usize
    }

    /// Keys whose latest version is a value (not a tombstone): every memory node's cells are read in large
    /// READs, and each key's chain is walked from its shortcut to the tail. For `DBSIZE`; a count taken while
    /// others write may miss or include keys written meanwhile.
    fn key_count(&mut self) -> Result<u64, PdpmError> {
        let mut count = 0u64;
        let mut buf = Vec::new();
        for node in 0..self.nodes.len() {
            let spans = read_spans(
                self.nodes.eps[node].max_message_len(),
                self.layout.cells,
                self.layout.cell_len(),
                4096,
            );
            for (first, n) in spans {
                let mut keys = Vec::new();
                self.read_key_cells(node, first, n, &mut buf, |cell, key, shortcut| {
                    keys.push((key.to_vec(), cell, shortcut));
                })?;
                for (key, cell, shortcut) in keys {
                    self.valid_ptr(shortcut)?;
                    let cell = CellRef {
                        node: node as u16,
                        cell: cell as u32,
                    };
                    if self.chase(&key, cell, Some(shortcut))?.value.is_some() {
                        count += 1;
                    }
                }
            }
        }
        self.after_op(Ok(count))
    }

    /// Cells in turn, node after node (the cursor is `node × cells + cell`): a claimed cell stays with its key, so
    /// a walk over them meets every key there throughout. A step reads one run of at most `count` cells (16 at
    /// least) and names the keys of those whose first version is linked; whether each has a value now (its tail
    /// may be a tombstone) is the caller's to ask.
    fn scan_keys(&mut self, cursor: u64, count: u32) -> Result<(u64, Vec<Vec<u8>>), PdpmError> {
        let (cells, cell_len) = (self.layout.cells, self.layout.cell_len());
        let eps = &self.nodes.eps;
        let Some(run) = ScanRun::at(cursor, cells, eps.len(), count, |node| {
            per_read(eps[node].max_message_len(), cell_len, 4096)
        }) else {
            return Ok((0, Vec::new()));
        };
        let mut keys = Vec::new();
        let r = self.read_key_cells(run.node, run.first, run.n, &mut Vec::new(), |_, key, _| {
            keys.push(key.to_vec())
        });
        if let Err(e) = r {
            return self.after_op(Err(e));
        }
        self.after_op(Ok((run.next, keys)))
    }

    fn update(
        &mut self,
        key: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>) -> Change,
    ) -> Result<(), PdpmError> {
        // The inherent method (path syntax picks it over this one).
        CloverClient::update(self, key, f)
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PdpmError> {
        self.check(key, None)?;
        let r = self.read_value(key);
        self.after_op(r)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PdpmError> {
        self.check(key, Some(value))?;
        let r = self.write(key, Some(value), None);
        self.after_op(r)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), PdpmError> {
        self.check(key, None)?;
        let home = self.home(key);
        if let Err(e) = self.copies_up(home) {
            return self.after_op(Err(e));
        }
        // A key without a cell has nothing to delete; otherwise a tombstone version is linked.
        let r = if self.cache.get(key).is_some() {
            self.write(key, None, None)
        } else {
            match self.find_cell(key).map_err(|e| not_applied(home, e))? {
                None => Ok(()),
                Some((cell, s)) => {
                    self.cache.put(key, cell, None, []);
                    if s.is_none() {
                        Ok(())
                    } else {
                        self.write(key, None, None)
                    }
                }
            }
        };
        self.after_op(r)
    }
}

impl Drop for CloverClient {
    fn drop(&mut self) {
        self.background.stop();
        if let Err(e) = self.take_inbox(None) {
            tracing::debug!(error = %e, "refill failed");
        }
        if let Err(e) = self.flush() {
            tracing::debug!(error = %e, "could not flush shortcut updates and records");
        }
        let grants: Vec<Vec<Grant>> = self.free.iter_mut().flat_map(std::mem::take).collect();
        let records = std::mem::take(&mut self.records);
        if grants.is_empty() && records.is_empty() {
            return;
        }
        if let Err(e) = self.ms.call::<_, ()>(
            method::RELEASE,
            &ReleaseRequest {
                client: self.id,
                grants,
                records,
            },
        ) {
            tracing::debug!(error = %e, "could not give granted slots back");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_and_key_lengths_beyond_the_formats_limits_are_refused() {
        let layout = CloverLayout::default();
        check_probe(16, &layout).unwrap();
        check_probe(layout.cells as u32, &layout).unwrap();
        // None, more than the cells, or more bytes than one READ can name (the metadata server's reply is checked
        // the same way, so a bad reply cannot make a client overflow its probe lengths).
        for bad in [0, layout.cells as u32 + 1] {
            assert!(check_probe(bad, &layout).is_err(), "{bad}");
        }
        let wide = CloverLayout {
            cells: 1 << 20,
            max_key: 60_000,
            ..layout.clone()
        };
        assert!(check_probe(1 << 20, &wide).is_err());
        // A cell's tag stores the key length + 1 in 16 bits.
        let longest = CloverLayout {
            max_key: 65_534,
            ..layout.clone()
        };
        longest.check().unwrap();
        let too_long = CloverLayout {
            max_key: 65_535,
            ..layout
        };
        assert!(too_long.check().is_err());
    }

    #[test]
    fn a_wrapped_slot_is_parked_before_it_is_free_again() {
        let mut space = Space {
            free: vec![VecDeque::new()],
            version: vec![vec![u8::MAX - 1, u8::MAX]],
            state: vec![vec![SlotState::Live; 2]],
            leased: VecDeque::new(),
            parked: VecDeque::new(),
            wrapped: 0,
            granted: HashMap::new(),
            groups: HashMap::new(),
        };
        let (t0, lease, park) = (
            Instant::now(),
            Duration::from_millis(5),
            Duration::from_secs(10),
        );
        space.retire(0, 0, t0 + lease);
        space.retire(0, 1, t0 + lease);
        space.reclaim(t0, park);
        assert!(space.free[0].is_empty(), "nothing is free before the lease");
        space.reclaim(t0 + lease, park);
        // Slot 0 comes back at the next version; slot 1's version wrapped, so it is parked, not free.
        assert_eq!(Vec::from(space.free[0].clone()), vec![0]);
        assert_eq!(space.version[0], vec![u8::MAX, 1]);
        assert_eq!(space.state[0][1], SlotState::Waiting);
        assert_eq!(space.wrapped, 1);
        space.reclaim(t0 + lease + park / 2, park);
        assert_eq!(
            space.free[0].len(),
            1,
            "still parked halfway through the park"
        );
        space.reclaim(t0 + lease + park, park);
        assert_eq!(Vec::from(space.free[0].clone()), vec![0, 1]);
        assert_eq!(space.state[0][1], SlotState::Free);
    }

    #[test]
    fn entries_round_trip_and_damage_is_caught() {
        let l = CloverLayout::default();
        let one = |version| {
            [Grant {
                node: 0,
                slot: 5,
                version,
            }]
        };
        let encode = |copies: &[Grant], j, key: &[u8], value| {
            let mut b = Vec::new();
            encode_entry(&mut b, copies, j, key, value);
            b
        };
        let b = encode(&one(7), 0, b"key", Some(&b"value"[..]));
        let mut image = vec![0u8; l.slot_len() as usize];
        image[..b.len()].copy_from_slice(&b);
        let e = parse_entry(&l, &image, 7).unwrap();
        assert_eq!(
            (e.key, e.value, e.next),
            (&b"key"[..], Some(&b"value"[..]), None)
        );
        assert!(parse_entry(&l, &image, 8).is_none(), "another GC version");
        for i in 8..b.len() {
            let mut bad = image.clone();
            bad[i] ^= 0x40;
            assert!(parse_entry(&l, &bad, 7).is_none(), "flip at {i}");
        }
        let next = Ptr::new(3, 99, 200);
        image[..8].copy_from_slice(&((7u64 << 56) | next.word()).to_le_bytes());
        assert_eq!(parse_entry(&l, &image, 7).unwrap().next, Some(next));
        let t = encode(&one(1), 0, b"k", None);
        let mut image = vec![0u8; l.slot_len() as usize];
        image[..t.len()].copy_from_slice(&t);
        assert_eq!(parse_entry(&l, &image, 1).unwrap().value, None);
        assert_eq!(CloverLayout::decode(&l.encode()), Ok(l));
        // Two copies: each names both, and header word j of copy j is its own.
        let l2 = CloverLayout {
            replication: 2,
            ..CloverLayout::default()
        };
        let group = [
            Grant {
                node: 0,
                slot: 1,
                version: 3,
            },
            Grant {
                node: 1,
                slot: 2,
                version: 9,
            },
        ];
        let c1 = encode(&group, 1, b"k", Some(&b"v"[..]));
        let mut image = vec![0u8; l2.slot_len() as usize];
        image[..c1.len()].copy_from_slice(&c1);
        let e = parse_entry(&l2, &image, 9).unwrap();
        assert_eq!(
            e.copies().collect::<Vec<_>>(),
            vec![group[0].ptr(), group[1].ptr()]
        );
        assert_eq!((e.next_copy(0), e.next_copy(1)), (None, None));
        assert_eq!(CloverLayout::decode(&l2.encode()), Ok(l2));
    }

    #[test]
    fn the_cursor_cache_drops_the_least_recently_used_key() {
        let mut cache = CursorCache {
            capacity: 2,
            ..CursorCache::default()
        };
        let cell = CellRef { node: 0, cell: 1 };
        let p = Ptr::new(0, 7, 1);
        cache.put(b"a", cell, Some(p), [p]);
        cache.put(b"b", cell, None, []);
        // `a` is used (looked up, then refreshed as a read does): `b` is now the oldest.
        assert!(cache.get(b"a").is_some());
        let q = Ptr::new(0, 8, 1);
        cache.put(b"a", cell, Some(q), [q]);
        cache.put(b"c", cell, None, []);
        assert!(cache.get(b"b").is_none());
        let a = cache.get(b"a").unwrap();
        assert_eq!(
            (a.tail.map(|t| t.0), a.copies.as_slice()),
            (Some(q), &[q][..])
        );
        assert!(cache.get(b"c").is_some());
        assert_eq!((cache.map.len(), cache.order.len()), (2, 2));
        // `a` was looked up last but one: `c` stays, `a` goes.
        cache.put(b"d", cell, None, []);
        assert!(cache.get(b"a").is_none());
        assert!(cache.get(b"c").is_some() && cache.get(b"d").is_some());
    }

    #[test]
    fn pointers_pack_and_unpack() {
        let p = Ptr::new(0x7fff, u32::MAX, 255);
        assert_eq!((p.node(), p.slot(), p.version()), (0x7fff, u32::MAX, 255));
        assert_eq!(Ptr::from_word(p.word() | (9 << 56)), Some(p));
        assert_eq!(Ptr::from_word(0), None);
        assert_eq!(Ptr::from_word(5u64 << 56), None);
    }

    /// Clover on `nodes` in-process memory nodes with `layout`, and its metadata server on a node of its own.
    fn in_process(
        nodes: usize,
        layout: &CloverLayout,
        config: MetadataConfig,
    ) -> (Vec<Connector>, Connector, Arc<MetadataServer>) {
        let memory: Vec<Connector> = (0..nodes)
            .map(|_| {
                let pool = Arc::new(Pool::anonymous(8 << 20, 1 << 20).unwrap());
                format(&pool, layout).unwrap();
                let node = MemoryNode::new(pool, dinomo_fabric::NodeConfig::default());
                Connector::new(dinomo_fabric::Target::InProcess(node))
            })
            .collect();
        let ms = MetadataServer::new(&memory, config).unwrap();
        let host = MemoryNode::new(
            Arc::new(Pool::anonymous(4 << 20, 1 << 20).unwrap()),
            dinomo_fabric::NodeConfig::default(),
        );
        ms.serve(&host);
        (
            memory,
            Connector::new(dinomo_fabric::Target::InProcess(host)),
            ms,
        )
    }

    #[test]
    fn a_late_helper_never_moves_the_shortcut_past_its_own_version() {
        let layout = CloverLayout {
            cells: 64,
            slots: 8,
            max_key: 16,
            max_value: 16,
            replication: 2,
        };
        let config = MetadataConfig {
            reclaim_lease: Duration::from_millis(20),
            ..MetadataConfig::default()
        };
        let (memory, ms, _server) = in_process(2, &layout, config);
        let settings = CloverSettings {
            grant_batch: 1,
            refill_at: 0,
            record_batch: 1,
            read_timeout: Duration::from_millis(10),
            ..CloverSettings::default()
        };
        let client = || CloverClient::connect(&ms, &memory, settings.clone()).unwrap();
        let key = b"k";
        let mut a = client();
        let mut versions = Vec::new();
        for v in 1..=3u8 {
            a.put(key, &[v]).unwrap();
            versions.push(a.cache.get(key).unwrap().tail.unwrap().0);
        }
        let cell = a.cache.get(key).unwrap().cell;
        // A writer links version 4 and stops before chaining its replica and moving the shortcut.
        let mut stopped = client();
        stopped
            .put_crashing(key, &[4], CloverCrash::AfterLink)
            .unwrap();
        std::mem::forget(stopped);
        // A client that linked version 2 gets to help its shortcut along only now, long after version 3's writer
        // moved it past: it must leave the shortcut at 3, whose copy the replica cell still names.
        let mut late = client();
        late.stalled.push(PendingShortcut {
            cell,
            from: versions[0],
            to: versions[1],
        });
        late.help_stalled().unwrap();
        late.flush().unwrap();
        assert_eq!(late.read_cell(cell).unwrap(), Some(versions[2]));
        // Had version 3 been retired, its slots would go round again (another key's writes take them) and the
        // replica cell would name a reused slot: the next write of `key` could not chain, nor a failover read
        // find the value.
        let mut other = client();
        for i in 0..4 * layout.slots {
            std::thread::sleep(Duration::from_millis(2));
            other.put(b"other", &i.to_le_bytes()).unwrap();
        }
        let mut next = client();
        next.put(key, &[5]).unwrap();
        assert_eq!(next.get(key).unwrap(), Some(vec![5]));
        assert_eq!(next.read_replica(key, 1).unwrap(), Some(vec![5]));
    }
}
