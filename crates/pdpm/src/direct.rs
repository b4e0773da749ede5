//! DirectDS and DirectDS-C (pDPM §4.2): compute nodes access memory nodes only with one-sided verbs.
//!
//! **Placement.** A key's primary memory node is `hash(key) mod M`; its replicas are the next `R − 1` nodes. Each
//! memory node holds one slot table (anchored in root slot [`crate::roots::DIRECT_TABLE`]) with `R` sections of
//! `slots` slots: section `j` of node `n` mirrors the slots of node `n − j`, so a key lives at the same slot index
//! in section 0 of its primary and section `j` of its `j`-th replica. The slot index is found by linear probing
//! from a second hash on the primary; the key is stored in the slot, and a slot once given to a key stays with it
//! (a delete writes a tombstone), so the key → slot mapping a client caches (the paper's compute-node metadata)
//! never goes stale.
//!
//! **Slot.** `[lock word: 8 B][committed copy][redo copy]`, each copy `[word0: 8][key len: 2][flags: 2][value len:
//! 4][key][value]` plus, for DirectDS, `word0` again in the next aligned word after the value: word0 is a marker
//! unique to the write (client id and sequence), so a copy is whole iff its first and last 8 bytes match (writes
//! land in increasing address order and persistent memory fails atomically per aligned 8 bytes). For DirectDS-C word0 holds a CRC32C
//! of the rest. An all-zero word0 is a copy never written.
//!
//! **Write** (6 round trips with R = 1, 2 carrying data; Table 1): CAS the primary's lock word, WRITE the redo
//! copies, READ their last bytes (persistence validation), WRITE the committed copies, validate, WRITE 0 to the lock.
//! With `R` replicas every step reaches the `R` nodes one after another (the fabric has no multi-endpoint post), so
//! the fabric counts `2 + 4R` round trips while the protocol still has 6 steps ([`DirectClient::protocol_steps`]).
//! **Read**: DirectDS locks, READs the committed copy and unlocks (3); DirectDS-C READs and checks the CRC,
//! retrying a torn copy (1). A replica (read when the primary does not answer) is read lock-free: DirectDS-C by
//! its CRC, DirectDS by its markers and its marker word READ again in the same batch (a write stores its marker
//! first, and a shorter write landing mid-read would leave the old trailer and its marker in place).
//!
//! **Recovery.** A lock word unchanged for longer than the lease belongs to a crashed client. The client that
//! takes it over (CAS from the stale value) restores the slot: a whole committed copy stays (the old value, or the
//! new one if the crashed write had finished it); a torn committed copy means the crashed write had validated its
//! redo copy and started to commit, so the redo copy is copied over it. The result is then written to the replicas.
//! DirectDS reads take the lock and so recover; a DirectDS-C read that finds a whole committed copy does not touch
//! the lock, so a crashed writer's replicas are brought in line by the next writer (or by a read that kept finding
//! a torn copy and fell back to locking).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dinomo_fabric::{Batch, Connector, FaultHooks};
use dinomo_pool::Pool;
use serde::{Deserialize, Serialize};

use crate::anchor::{self, Anchor, Anchored, HEADER_LEN, le_u32, le_u64};
use crate::{
    Change, MemoryNodes, PdpmError, PdpmStore, ScanRun, Tried, check_key, check_value, hash,
    is_node_failure, new_client_id, not_applied, per_read, read_spans, roots, tags, validate,
    write_validated,
};

const COPY_HEADER: usize = 16;
const FLAG_VALUE: u16 = 1;
const FLAG_TOMBSTONE: u16 = 2;
/// Set in word0 of a DirectDS-C copy so that a written copy never has word0 == 0.
const CRC_PRESENT: u64 = 1 << 32;
/// Seed of the hash that picks the slot (the node hash uses the settings' seed).
const SLOT_SEED: u64 = 0x5107_5107_5107_5107;

/// How a copy proves it is whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Flavor {
    /// DirectDS: the same unique 8-byte marker at the start and the end; reads lock.
    Markers,
    /// DirectDS-C: a CRC32C of the copy; reads are lock-free.
    Crc,
}

/// The geometry of a memory node's slot table, fixed when it is formatted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirectLayout {
    /// Markers (DirectDS) or CRC (DirectDS-C). Default markers.
    pub flavor: Flavor,
    /// Slots per section (keys whose primary is this node, and likewise per replica section). Default 16384.
    pub slots: u64,
    /// Longest key in bytes (at most 65535). Default 64.
    pub max_key: u32,
    /// Longest value in bytes. Default 1024.
    pub max_value: u32,
    /// Copies of every key, on consecutive memory nodes (sections per table). Default 1.
    pub replication: u32,
}

impl Default for DirectLayout {
    fn default() -> Self {
        DirectLayout {
            flavor: Flavor::Markers,
            slots: 16384,
            max_key: 64,
            max_value: 1024,
            replication: 1,
        }
    }
}

impl DirectLayout {
    /// Bytes of one copy, rounded to 8.
    pub fn copy_len(&self) -> u64 {
        (COPY_HEADER as u64 + self.max_key as u64 + self.max_value as u64 + 8).next_multiple_of(8)
    }

    /// Bytes of one slot: the lock word and two copies.
    pub fn slot_len(&self) -> u64 {
        8 + 2 * self.copy_len()
    }

    /// Bytes of the whole table on one memory node.
    pub fn table_len(&self) -> u64 {
        HEADER_LEN + self.replication as u64 * self.slots * self.slot_len()
    }

    fn check(&self) -> Result<(), PdpmError> {
        let table = (self.replication as u64)
            .checked_mul(self.slots)
            .and_then(|n| n.checked_mul(self.slot_len()))
            .and_then(|n| n.checked_add(HEADER_LEN));
        if self.slots == 0
            || self.replication == 0
            || self.max_key > u16::MAX as u32
            || table.is_none()
        {
            return Err(PdpmError::Config(format!(
                "slot table needs slots > 0, replication > 0, max_key <= 65535 and a size that fits 64 bits: \
                 {self:?}"
            )));
        }
        Ok(())
    }
}

impl Anchored for DirectLayout {
    const ANCHOR: Anchor = Anchor {
        root: roots::DIRECT_TABLE,
        tag: tags::DIRECT_TABLE,
        magic: b"PDPMDIR1",
        version: 1,
        store: "DirectDS",
        what: "slot table",
    };

    fn put_fields(&self, h: &mut [u8; HEADER_LEN as usize]) {
        let flavor: u32 = match self.flavor {
            Flavor::Markers => 1,
            Flavor::Crc => 2,
        };
        h[12..16].copy_from_slice(&flavor.to_le_bytes());
        h[16..24].copy_from_slice(&self.slots.to_le_bytes());
        h[24..28].copy_from_slice(&self.max_key.to_le_bytes());
        h[28..32].copy_from_slice(&self.max_value.to_le_bytes());
        h[32..36].copy_from_slice(&self.replication.to_le_bytes());
        h[40..48].copy_from_slice(&self.slot_len().to_le_bytes());
    }

    fn get_fields(h: &[u8]) -> Result<DirectLayout, String> {
        let flavor = match le_u32(h, 12) {
            1 => Flavor::Markers,
            2 => Flavor::Crc,
            f => return Err(format!("unknown flavor {f}")),
        };
        let layout = DirectLayout {
            flavor,
            slots: le_u64(h, 16),
            max_key: le_u32(h, 24),
            max_value: le_u32(h, 28),
            replication: le_u32(h, 32),
        };
        layout.check().map_err(|e| e.to_string())?;
        if layout.slot_len() != le_u64(h, 40) {
            return Err("slot length in the header does not match its geometry".into());
        }
        Ok(layout)
    }

    fn anchored_len(&self) -> u64 {
        self.table_len()
    }
}

/// Formats a memory node's pool with an empty slot table and anchors it in its root slot. Refuses a pool that
/// already has one.
pub fn format(pool: &Pool, layout: &DirectLayout) -> Result<(), PdpmError> {
    layout.check()?;
    // Extents are not zeroed, and an all-zero slot is an unused one.
    anchor::format(pool, layout, true)
}

/// Settings of a DirectDS client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirectSettings {
    /// A lock word unchanged for this long is taken to belong to a crashed client and is taken over, with
    /// recovery. Must exceed the longest time a live client holds a lock. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub lock_lease: Duration,
    /// How long to wait for a lock held by a live client before giving up. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub lock_wait: Duration,
    /// Slots probed for a key before the table counts as full. Default 64.
    pub max_probe: u32,
    /// DirectDS-C: lock-free reads that may find a torn copy before the read takes the lock (which recovers a
    /// slot left torn by a crashed client). Default 64.
    pub torn_retries: u32,
    /// Post each WRITE together with its validating READ (one round trip instead of two; the fabric executes a
    /// batch in order). Default false: the paper's protocol.
    pub fuse_validation: bool,
    /// Seed of the hash that picks a key's primary memory node. Default 0.
    pub node_seed: u64,
    /// Key → slot entries a client caches before it starts over. Default 1,048,576.
    pub max_cached_slots: usize,
    /// A memory node whose connection failed is left alone (reads go to the next replica, writes that need it are
    /// refused) for this long before the client connects to it again. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub node_retry: Duration,
}

impl Default for DirectSettings {
    fn default() -> Self {
        DirectSettings {
            lock_lease: Duration::from_secs(1),
            lock_wait: Duration::from_secs(10),
            max_probe: 64,
            torn_retries: 64,
            fuse_validation: false,
            node_seed: 0,
            max_cached_slots: 1 << 20,
            node_retry: Duration::from_secs(1),
        }
    }
}

/// Where a crash is injected into a write (for crash tests): the write stops there and leaves the lock held, as
/// a client that died at that point would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// The lock is taken; nothing written.
    AfterLock,
    /// Only the first `bytes` of the primary's redo copy were written.
    RedoTorn {
        /// Bytes written.
        bytes: usize,
    },
    /// The redo copies are written, not validated.
    AfterRedo,
    /// The redo copies are validated.
    AfterRedoValidated,
    /// Only the first `bytes` of the primary's committed copy were written.
    CommittedTorn {
        /// Bytes written.
        bytes: usize,
    },
    /// The committed copies are written, not validated.
    AfterCommitted,
    /// Everything but the unlock.
    AfterCommittedValidated,
}

/// What a copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Copy {
    /// Never written.
    Empty,
    /// Whole: the key and its value (`None`: a tombstone).
    Whole {
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    },
    /// Partly written.
    Torn,
}

/// One compute-node thread's DirectDS or DirectDS-C client.
pub struct DirectClient {
    /// The memory nodes; each node's area is its slot table, whose body starts with slot 0 of section 0.
    nodes: MemoryNodes<DirectLayout>,
    settings: DirectSettings,
    id: u32,
    seq: u32,
    cache: HashMap<Vec<u8>, u64>,
    steps: u64,
    batch: Batch<'static>,
}

impl std::fmt::Debug for DirectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectClient")
            .field("nodes", &self.nodes.len())
            .field("layout", &self.nodes.layout)
            .field("id", &self.id)
            .finish()
    }
}

enum LockOutcome {
    Free,
    TookOverStale,
}

impl DirectClient {
    /// Connects to every memory node (in order: node `i` is `connectors[i]`) and reads their slot tables, which
    /// must share one geometry.
    pub fn connect(
        connectors: &[Connector],
        settings: DirectSettings,
    ) -> Result<DirectClient, PdpmError> {
        if settings.max_probe == 0 {
            return Err(PdpmError::Config("max_probe must be at least 1".into()));
        }
        let nodes = MemoryNodes::<DirectLayout>::connect(connectors, settings.node_retry)?;
        if nodes.layout.replication as usize > nodes.len() {
            return Err(PdpmError::Config(format!(
                "replication {} needs at least that many memory nodes, have {}",
                nodes.layout.replication,
                nodes.len()
            )));
        }
        Ok(DirectClient {
            nodes,
            settings,
            id: new_client_id(),
            seq: 0,
            cache: HashMap::new(),
            steps: 0,
            batch: Batch::new(),
        })
    }

    /// The tables' geometry.
    pub fn layout(&self) -> &DirectLayout {
        &self.nodes.layout
    }

    /// Protocol steps taken so far: round trips as the paper counts them, where the verbs of one step to several
    /// replicas go out in parallel.
    pub fn protocol_steps(&self) -> u64 {
        self.steps
    }

    /// The memory node holding `key`'s primary copy.
    pub fn primary_of(&self, key: &[u8]) -> usize {
        (hash(key, self.settings.node_seed) % self.nodes.len() as u64) as usize
    }

    /// The fault hooks of this client's current connection to memory node `node` (tests cut it to fail the node;
    /// a reconnection after [`DirectSettings::node_retry`] gets fresh hooks).
    pub fn fault_hooks(&self, node: usize) -> Option<Arc<FaultHooks>> {
        self.nodes.fault_hooks(node)
    }

    /// A write needs every replica of the key (the lock lives on the primary and the protocol writes all `R`
    /// copies): refuses, before anything is written, when one is known to be down.
    fn require_replicas(&mut self, primary: usize) -> Result<(), PdpmError> {
        for (node, _) in self.replicas(primary) {
            if !self.nodes.reachable(node) {
                return Err(PdpmError::NodeDown {
                    node,
                    why: "a replica of the key is down; writes need every replica".into(),
                });
            }
        }
        Ok(())
    }

    /// The committed copy of `key` on each of its replicas, primary first, read lock-free: the value, `None` for
    /// no value, or an error for a torn copy. For audits and tests; `key`'s slot must be known to this client.
    pub fn replica_values(&mut self, key: &[u8]) -> Result<Vec<Option<Vec<u8>>>, PdpmError> {
        let primary = self.primary_of(key);
        let Some(&slot) = self.cache.get(key) else {
            return Err(PdpmError::Config(
                "the key's slot is not known to this client".into(),
            ));
        };
        let mut out = Vec::with_capacity(self.nodes.layout.replication as usize);
        for (node, section) in self.replicas(primary) {
            let addr = self.committed_addr(node, section, slot);
            match self.read_copy_at(node, addr)? {
                Copy::Empty => out.push(None),
                Copy::Whole { key: k, value } if k == key => out.push(value),
                Copy::Whole { .. } => {
                    return Err(PdpmError::Layout {
                        node,
                        why: format!("replica slot {slot} holds another key"),
                    });
                }
                Copy::Torn => return Err(PdpmError::Unrecoverable { node, slot }),
            }
        }
        Ok(out)
    }

    /// Runs a put up to `point` and stops there with the lock held, as a client that crashed would; the client
    /// should be dropped afterwards. For crash tests.
    pub fn put_crashing(
        &mut self,
        key: &[u8],
        value: &[u8],
        point: CrashPoint,
    ) -> Result<(), PdpmError> {
        self.check_key(key)?;
        self.check_value(value)?;
        let (slot, _) = self.lock_for_write(key)?;
        self.write_locked(key, slot, Some(value), Some(point))
    }

    fn check_key(&self, key: &[u8]) -> Result<(), PdpmError> {
        check_key(key, self.nodes.layout.max_key)
    }

    fn check_value(&self, value: &[u8]) -> Result<(), PdpmError> {
        check_value(value, self.nodes.layout.max_value)
    }

    fn copy_len(&self) -> u64 {
        self.nodes.layout.copy_len()
    }

    /// Pool offset of `slot`'s lock word in `section` on `node`.
    fn slot_offset(&self, node: usize, section: u32, slot: u64) -> u64 {
        self.nodes.areas[node].body
            + (section as u64 * self.nodes.layout.slots + slot) * self.nodes.layout.slot_len()
    }

    fn lock_addr(&self, node: usize, slot: u64) -> dinomo_fabric::RemoteAddr {
        self.nodes.areas[node]
            .data
            .at(self.slot_offset(node, 0, slot))
    }

    fn committed_addr(&self, node: usize, section: u32, slot: u64) -> dinomo_fabric::RemoteAddr {
        self.nodes.areas[node]
            .data
            .at(self.slot_offset(node, section, slot) + 8)
    }

    fn redo_addr(&self, node: usize, section: u32, slot: u64) -> dinomo_fabric::RemoteAddr {
        self.nodes.areas[node]
            .data
            .at(self.slot_offset(node, section, slot) + 8 + self.copy_len())
    }

    /// The nodes holding `key` (primary first) with their section numbers.
    fn replicas(&self, primary: usize) -> impl Iterator<Item = (usize, u32)> + use<> {
        let m = self.nodes.len();
        (0..self.nodes.layout.replication).map(move |j| ((primary + j as usize) % m, j))
    }

    fn first_slot(&self, key: &[u8]) -> u64 {
        hash(key, SLOT_SEED) % self.nodes.layout.slots
    }

    fn next_unique(&mut self) -> u64 {
        self.seq = self.seq.wrapping_add(1);
        ((self.id as u64) << 32) | self.seq as u64
    }

    /// Acquires the lock of `slot` on the primary `node`; a lock word that stays unchanged for the lease is taken
    /// over and the slot recovered.
    fn lock(&mut self, node: usize, slot: u64) -> Result<LockOutcome, PdpmError> {
        let mine = self.next_unique();
        let addr = self.lock_addr(node, slot);
        let start = Instant::now();
        let mut seen: Option<(u64, Instant)> = None;
        let mut attempt: u32 = 0;
        loop {
            self.steps += 1;
            let prev = {
                let r = self.nodes.eps[node].cas(addr, 0, mine);
                self.nodes.track(node, r)?
            };
            if prev == 0 {
                return Ok(LockOutcome::Free);
            }
            match seen {
                Some((v, since)) if v == prev && since.elapsed() >= self.settings.lock_lease => {
                    self.steps += 1;
                    if {
                        let r = self.nodes.eps[node].cas(addr, prev, mine);
                        self.nodes.track(node, r)?
                    } == prev
                    {
                        tracing::warn!(node, slot, stale = prev, "taking over a stale lock");
                        self.recover_slot(node, slot)?;
                        return Ok(LockOutcome::TookOverStale);
                    }
                    seen = None;
                }
                Some((v, _)) if v == prev => {}
                _ => seen = Some((prev, Instant::now())),
            }
            if start.elapsed() > self.settings.lock_wait {
                return Err(PdpmError::LockTimeout {
                    node,
                    slot,
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            backoff(attempt);
            attempt = attempt.saturating_add(1);
        }
    }

    fn unlock_slot(&mut self, node: usize, slot: u64) -> Result<(), PdpmError> {
        self.steps += 1;
        let addr = self.lock_addr(node, slot);
        {
            let r = self.nodes.eps[node].write(addr, &0u64.to_le_bytes());
            self.nodes.track(node, r)?
        };
        Ok(())
    }

    fn unlock(&mut self, key: &[u8], slot: u64) -> Result<(), PdpmError> {
        let node = self.primary_of(key);
        self.unlock_slot(node, slot)
    }

    fn read_copy_at(
        &mut self,
        node: usize,
        addr: dinomo_fabric::RemoteAddr,
    ) -> Result<Copy, PdpmError> {
        let mut buf = vec![0u8; self.copy_len() as usize];
        self.steps += 1;
        {
            let r = self.nodes.eps[node].read(addr, &mut buf);
            self.nodes.track(node, r)?
        };
        Ok(parse_copy(
            self.nodes.layout.flavor,
            &self.nodes.layout,
            &buf,
        ))
    }

    fn read_committed(&mut self, node: usize, slot: u64) -> Result<Copy, PdpmError> {
        let addr = self.committed_addr(node, 0, slot);
        self.read_copy_at(node, addr)
    }

    fn remember(&mut self, key: &[u8], slot: u64) {
        if self.cache.len() >= self.settings.max_cached_slots {
            self.cache.clear();
        }
        self.cache.insert(key.to_vec(), slot);
    }

    /// Takes the lock of `key`'s slot, finding (and, for a new key, claiming) the slot if this client does not
    /// know it yet. Returns the slot and, when it had to look, the committed copy it read under the lock.
    fn lock_for_write(&mut self, key: &[u8]) -> Result<(u64, Option<Copy>), PdpmError> {
        let node = self.primary_of(key);
        if let Some(&slot) = self.cache.get(key) {
            self.lock(node, slot)?;
            return Ok((slot, None));
        }
        let first = self.first_slot(key);
        for i in 0..self.settings.max_probe as u64 {
            let slot = (first + i) % self.nodes.layout.slots;
            self.lock(node, slot)?;
            let copy = match self.read_committed(node, slot) {
                Ok(c) => c,
                Err(e) => {
                    let _ = self.unlock_slot(node, slot);
                    return Err(e);
                }
            };
            match &copy {
                // An empty slot becomes the key's only once a write fills it (see `write_locked`).
                Copy::Empty => return Ok((slot, Some(copy))),
                Copy::Whole { key: k, .. } if k == key => {
                    self.remember(key, slot);
                    return Ok((slot, Some(copy)));
                }
                Copy::Whole { .. } => self.unlock_slot(node, slot)?,
                Copy::Torn => {
                    // Under a lock that was released (or recovered) a committed copy is whole.
                    self.unlock_slot(node, slot)?;
                    return Err(PdpmError::Unrecoverable { node, slot });
                }
            }
        }
        Err(PdpmError::TableFull {
            probes: self.settings.max_probe,
        })
    }

    /// The write protocol on a locked slot; `value == None` writes a tombstone.
    fn write_locked(
        &mut self,
        key: &[u8],
        slot: u64,
        value: Option<&[u8]>,
        crash: Option<CrashPoint>,
    ) -> Result<(), PdpmError> {
        let primary = self.primary_of(key);
        let marker = self.next_unique();
        let copy = encode_copy(self.nodes.layout.flavor, marker, key, value);
        let tail = copy.len() as u64 - 8;
        let nodes: Vec<(usize, u32)> = self.replicas(primary).collect();
        let mut committing = false;
        let r = self.write_phases(&nodes, slot, &copy, tail, crash, &mut committing);
        if r.is_ok() {
            self.remember(key, slot);
        }
        match (r, crash) {
            (Ok(true), _) => Ok(()),
            (Ok(false), None) => self.unlock_slot(primary, slot),
            (Ok(false), Some(_)) => Ok(()),
            (Err(e), _) if !committing && is_node_failure(&e) => {
                // No committed copy changed: the write is not applied. Release the lock where the primary still
                // answers; otherwise the next writer takes it over after the lease and finds the old committed
                // copy whole.
                if !self.nodes.is_down(primary) {
                    let _ = self.unlock_slot(primary, slot);
                }
                let node = nodes
                    .iter()
                    .map(|&(n, _)| n)
                    .find(|&n| self.nodes.is_down(n))
                    .unwrap_or(primary);
                Err(PdpmError::NodeDown {
                    node,
                    why: e.to_string(),
                })
            }
            // Outcome unknown: some committed copy may have changed. The lock stays held, so the next writer (once
            // every replica answers) takes it over after the lease and brings the replicas in line with the
            // primary's copy.
            (Err(e), _) => Err(e),
        }
    }

    /// Writes the redo copies, validates, writes the committed copies, validates. Returns Ok(true) when it
    /// stopped at a crash point (lock left held).
    #[allow(clippy::too_many_arguments)]
    fn write_phases(
        &mut self,
        nodes: &[(usize, u32)],
        slot: u64,
        copy: &[u8],
        tail: u64,
        crash: Option<CrashPoint>,
        committing: &mut bool,
    ) -> Result<bool, PdpmError> {
        if crash == Some(CrashPoint::AfterLock) {
            return Ok(true);
        }
        for phase in [Phase::Redo, Phase::Committed] {
            *committing = phase == Phase::Committed;
            let torn = match (phase, crash) {
                (Phase::Redo, Some(CrashPoint::RedoTorn { bytes })) => Some(bytes),
                (Phase::Committed, Some(CrashPoint::CommittedTorn { bytes })) => Some(bytes),
                _ => None,
            };
            if let Some(bytes) = torn {
                let (node, section) = nodes[0];
                let addr = self.phase_addr(phase, node, section, slot);
                {
                    let r = self.nodes.eps[node].write(addr, &copy[..bytes.min(copy.len())]);
                    self.nodes.track(node, r)?
                };
                return Ok(true);
            }
            let stop_after_write = matches!(
                (phase, crash),
                (Phase::Redo, Some(CrashPoint::AfterRedo))
                    | (Phase::Committed, Some(CrashPoint::AfterCommitted))
            );
            if self.settings.fuse_validation && !stop_after_write {
                self.steps += 1;
                for &(node, section) in nodes {
                    let addr = self.phase_addr(phase, node, section, slot);
                    let r = write_validated(
                        &mut self.nodes.eps[node],
                        &mut self.batch,
                        node,
                        Some(slot),
                        addr,
                        copy,
                        tail,
                    );
                    self.nodes.track(node, r)?;
                }
            } else {
                self.steps += 1;
                for &(node, section) in nodes {
                    let addr = self.phase_addr(phase, node, section, slot);
                    {
                        let r = self.nodes.eps[node].write(addr, copy);
                        self.nodes.track(node, r)?
                    };
                }
                if stop_after_write {
                    return Ok(true);
                }
                self.steps += 1;
                for &(node, section) in nodes {
                    let addr = self.phase_addr(phase, node, section, slot);
                    let mut last = [0u8; 8];
                    {
                        let r = self.nodes.eps[node].read(addr.offset_by(tail), &mut last);
                        self.nodes.track(node, r)?
                    };
                    validate(node, Some(slot), &last, &copy[tail as usize..])?;
                }
            }
            let done = matches!(
                (phase, crash),
                (Phase::Redo, Some(CrashPoint::AfterRedoValidated))
                    | (Phase::Committed, Some(CrashPoint::AfterCommittedValidated))
            );
            if done {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn phase_addr(
        &self,
        phase: Phase,
        node: usize,
        section: u32,
        slot: u64,
    ) -> dinomo_fabric::RemoteAddr {
        match phase {
            Phase::Redo => self.redo_addr(node, section, slot),
            Phase::Committed => self.committed_addr(node, section, slot),
        }
    }

    /// Restores a slot whose lock this client took over from a crashed client (the lock is held).
    fn recover_slot(&mut self, primary: usize, slot: u64) -> Result<(), PdpmError> {
        let len = self.copy_len() as usize;
        let mut committed = vec![0u8; len];
        let mut redo = vec![0u8; len];
        let caddr = self.committed_addr(primary, 0, slot);
        let raddr = self.redo_addr(primary, 0, slot);
        {
            let r = self.nodes.eps[primary].read(caddr, &mut committed);
            self.nodes.track(primary, r)?
        };
        let image = match parse_copy(self.nodes.layout.flavor, &self.nodes.layout, &committed) {
            Copy::Empty | Copy::Whole { .. } => committed,
            Copy::Torn => {
                {
                    let r = self.nodes.eps[primary].read(raddr, &mut redo);
                    self.nodes.track(primary, r)?
                };
                if !matches!(
                    parse_copy(self.nodes.layout.flavor, &self.nodes.layout, &redo),
                    Copy::Whole { .. }
                ) {
                    return Err(PdpmError::Unrecoverable {
                        node: primary,
                        slot,
                    });
                }
                {
                    let r = self.nodes.eps[primary].write(caddr, &redo);
                    self.nodes.track(primary, r)?
                };
                let mut check = vec![0u8; len];
                {
                    let r = self.nodes.eps[primary].read(caddr, &mut check);
                    self.nodes.track(primary, r)?
                };
                validate(primary, Some(slot), &check, &redo)?;
                redo
            }
        };
        // Replicas follow the primary's outcome.
        for (node, section) in self.replicas(primary).skip(1) {
            let addr = self.committed_addr(node, section, slot);
            {
                let r = self.nodes.eps[node].write(addr, &image);
                self.nodes.track(node, r)?
            };
            let mut check = vec![0u8; len];
            {
                let r = self.nodes.eps[node].read(addr, &mut check);
                self.nodes.track(node, r)?
            };
            validate(node, Some(slot), &check, &image)?;
        }
        tracing::info!(
            primary,
            slot,
            "recovered a slot left locked by a crashed client"
        );
        Ok(())
    }

    /// Reads `key`'s committed copy on its primary or, when that node is down, on the next replica that answers.
    /// A write is acknowledged only once every replica holds its committed copy, so any whole replica copy is the
    /// last acknowledged value (or that of a write whose outcome was reported unknown).
    fn lookup(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PdpmError> {
        let primary = self.primary_of(key);
        let mut tried = Tried::default();
        for (node, section) in self.replicas(primary) {
            if !self.nodes.reachable(node) {
                tried.skipped(node);
                continue;
            }
            match self.lookup_on(key, node, section) {
                Err(e) if is_node_failure(&e) => {
                    tracing::debug!(node, error = %e, "read fails over to the next replica");
                    tried.failed(node, &e);
                }
                r => return r,
            }
        }
        Err(tried.node_down(primary, "replica of the key"))
    }

    /// Finds `key`'s slot in `section` of `node` and reads its committed copy. On the primary DirectDS reads under
    /// the lock and DirectDS-C lock-free; a replica is read lock-free (its lock is the primary's), checked by
    /// markers or CRC.
    fn lookup_on(
        &mut self,
        key: &[u8],
        node: usize,
        section: u32,
    ) -> Result<Option<Vec<u8>>, PdpmError> {
        let cached = self.cache.get(key).copied();
        let first = self.first_slot(key);
        let probes = if cached.is_some() {
            1
        } else {
            self.settings.max_probe as u64
        };
        for i in 0..probes {
            let slot = cached.unwrap_or((first + i) % self.nodes.layout.slots);
            let copy = if section == 0 {
                self.read_slot(node, slot)?
            } else {
                self.read_replica_slot(node, section, slot)?
            };
            match copy {
                Copy::Empty => return Ok(None),
                Copy::Whole { key: k, value } if k == key => {
                    self.remember(key, slot);
                    return Ok(value);
                }
                Copy::Whole { .. } if cached.is_some() => {
                    return Err(PdpmError::Layout {
                        node,
                        why: format!("slot {slot} cached for a key now holds another key"),
                    });
                }
                Copy::Whole { .. } => {}
                Copy::Torn => return Err(PdpmError::Unrecoverable { node, slot }),
            }
        }
        Ok(None)
    }

    /// The committed copy of one slot in a replica section, read lock-free; a copy being rewritten is read again.
    fn read_replica_slot(
        &mut self,
        node: usize,
        section: u32,
        slot: u64,
    ) -> Result<Copy, PdpmError> {
        let addr = self.committed_addr(node, section, slot);
        let attempts = self.settings.torn_retries.max(1);
        for attempt in 0..attempts {
            let copy = match self.nodes.layout.flavor {
                Flavor::Crc => self.read_copy_at(node, addr)?,
                Flavor::Markers => self.read_marked_copy(node, addr)?,
            };
            match copy {
                Copy::Torn => backoff(attempt),
                c => return Ok(c),
            }
        }
        Err(PdpmError::Contended {
            node,
            slot,
            attempts,
        })
    }

    /// A DirectDS copy read without its lock: the copy, then its marker word again in the same batch. Matching
    /// markers alone do not prove a copy whole when it is read during a write of a shorter value: the reader can
    /// take the old header (old marker and length) before the write lands and the rest after it, where the old
    /// trailer, past the new copy's end, still holds the old marker. The write stores its own marker first, so a
    /// marker unchanged after the copy was read means no write landed in between.
    fn read_marked_copy(
        &mut self,
        node: usize,
        addr: dinomo_fabric::RemoteAddr,
    ) -> Result<Copy, PdpmError> {
        self.steps += 1;
        self.batch.clear();
        let copy = self.batch.read(addr, self.copy_len() as u32);
        let marker = self.batch.read(addr, 8);
        let r = self.nodes.eps[node].post(&mut self.batch);
        self.nodes.track(node, r)?;
        Ok(settle_marked_copy(
            &self.nodes.layout,
            self.batch.read_data(copy),
            self.batch.read_data(marker),
        ))
    }

    /// Slots one READ of a scan takes on `node`: half its message limit, at most 256.
    fn slots_per_read(&self, node: usize) -> u64 {
        per_read(
            self.nodes.eps[node].max_message_len(),
            self.nodes.layout.slot_len(),
            256,
        )
    }

    /// Visits the committed copies of slots `first..first + n` of `node`'s primary section, read lock-free in one
    /// READ; a copy found being rewritten is read again the way a GET reads it.
    fn read_primary_slots(
        &mut self,
        node: usize,
        first: u64,
        n: u64,
        buf: &mut Vec<u8>,
        mut visit: impl FnMut(Copy),
    ) -> Result<(), PdpmError> {
        let slot_len = self.nodes.layout.slot_len();
        let copy_len = self.copy_len() as usize;
        buf.resize((n * slot_len) as usize, 0);
        let addr = self.nodes.areas[node]
            .data
            .at(self.slot_offset(node, 0, first));
        self.steps += 1;
        {
            let r = self.nodes.eps[node].read(addr, buf);
            self.nodes.track(node, r)?
        };
        for i in 0..n {
            let at = (i * slot_len) as usize + 8;
            let copy = match parse_copy(
                self.nodes.layout.flavor,
                &self.nodes.layout,
                &buf[at..at + copy_len],
            ) {
                Copy::Torn => self.read_slot(node, first + i)?,
                c => c,
            };
            visit(copy);
        }
        Ok(())
    }

    /// The committed copy of one slot, read the flavor's way.
    fn read_slot(&mut self, node: usize, slot: u64) -> Result<Copy, PdpmError> {
        if self.nodes.layout.flavor == Flavor::Crc {
            for attempt in 0..self.settings.torn_retries {
                match self.read_committed(node, slot)? {
                    Copy::Torn => backoff(attempt),
                    c => return Ok(c),
                }
            }
            tracing::debug!(
                node,
                slot,
                "lock-free reads kept seeing a torn copy; locking"
            );
        }
        self.lock(node, slot)?;
        let r = self.read_committed(node, slot);
        self.unlock_slot(node, slot)?;
        r
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Redo,
    Committed,
}

impl PdpmStore for DirectClient {
    fn max_value_len(&self) -> usize {
        self.nodes.layout.max_value as usize
    }

    /// Keys with a value: a scan of every memory node's primary section, reading the committed copies lock-free in
    /// large READs; a copy found being rewritten is read again the way a GET reads it. While writes go on, the
    /// count is of no single instant.
    fn key_count(&mut self) -> Result<u64, PdpmError> {
        let mut count = 0u64;
        let mut buf = Vec::new();
        for node in 0..self.nodes.len() {
            let runs = read_spans(
                self.nodes.eps[node].max_message_len(),
                self.nodes.layout.slots,
                self.nodes.layout.slot_len(),
                256,
            );
            for (first, n) in runs {
                self.read_primary_slots(node, first, n, &mut buf, |copy| {
                    if matches!(copy, Copy::Whole { value: Some(_), .. }) {
                        count += 1;
                    }
                })?;
            }
        }
        Ok(count)
    }

    /// Slots in turn, node after node (the cursor is `node × slots + slot`): a slot stays with its key, so a
    /// walk over them meets every key there throughout. Each step reads one run of at most `count` slots (16 at
    /// least) the way [`PdpmStore::key_count`] does.
    fn scan_keys(&mut self, cursor: u64, count: u32) -> Result<(u64, Vec<Vec<u8>>), PdpmError> {
        let Some(run) = ScanRun::at(
            cursor,
            self.nodes.layout.slots,
            self.nodes.len(),
            count,
            |node| self.slots_per_read(node),
        ) else {
            return Ok((0, Vec::new()));
        };
        let mut keys = Vec::new();
        self.read_primary_slots(run.node, run.first, run.n, &mut Vec::new(), |copy| {
            if let Copy::Whole {
                key,
                value: Some(_),
            } = copy
            {
                keys.push(key);
            }
        })?;
        Ok((run.next, keys))
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PdpmError> {
        self.check_key(key)?;
        self.lookup(key)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PdpmError> {
        self.check_key(key)?;
        self.check_value(value)?;
        let primary = self.primary_of(key);
        self.require_replicas(primary)?;
        let (slot, _) = self
            .lock_for_write(key)
            .map_err(|e| not_applied(primary, e))?;
        self.write_locked(key, slot, Some(value), None)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), PdpmError> {
        self.update(key, &mut |_| Change::Delete)
    }

    /// Under the key's lock: lock, READ the committed copy (already read when this client had to find the slot),
    /// `f`, the write protocol, unlock. `f` runs once. One round trip more than a put.
    fn update(
        &mut self,
        key: &[u8],
        f: &mut dyn FnMut(Option<&[u8]>) -> Change,
    ) -> Result<(), PdpmError> {
        self.check_key(key)?;
        let primary = self.primary_of(key);
        self.require_replicas(primary)?;
        let (slot, current) = self
            .lock_for_write(key)
            .map_err(|e| not_applied(primary, e))?;
        let current = match current {
            Some(c) => c,
            None => match self.read_committed(primary, slot) {
                Ok(c) => c,
                Err(e) => {
                    let _ = self.unlock(key, slot);
                    return Err(not_applied(primary, e));
                }
            },
        };
        let old = match &current {
            Copy::Whole { value, .. } => value.as_deref(),
            _ => None,
        };
        let new = match f(old) {
            Change::Keep => return self.unlock(key, slot),
            Change::Delete if old.is_none() => return self.unlock(key, slot),
            Change::Delete => None,
            Change::Put(v) => {
                if let Err(e) = self.check_value(&v) {
                    self.unlock(key, slot)?;
                    return Err(e);
                }
                Some(v)
            }
        };
        self.write_locked(key, slot, new.as_deref(), None)
    }
}

fn backoff(attempt: u32) {
    if attempt < 8 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(10 * u64::from(attempt.min(100))));
    }
}

fn encode_copy(flavor: Flavor, marker: u64, key: &[u8], value: Option<&[u8]>) -> Vec<u8> {
    let vlen = value.map_or(0, <[u8]>::len);
    let mut c = Vec::with_capacity(COPY_HEADER + key.len() + vlen + 8);
    c.extend_from_slice(&[0u8; 8]);
    c.extend_from_slice(&(key.len() as u16).to_le_bytes());
    let flags = if value.is_some() {
        FLAG_VALUE
    } else {
        FLAG_TOMBSTONE
    };
    c.extend_from_slice(&flags.to_le_bytes());
    c.extend_from_slice(&(vlen as u32).to_le_bytes());
    c.extend_from_slice(key);
    c.extend_from_slice(value.unwrap_or(&[]));
    let word0 = match flavor {
        Flavor::Markers => {
            // The trailer is 8-byte aligned: persistent memory fails atomically per aligned 8 bytes, so a torn
            // write never leaves half a trailer that happens to match.
            c.resize(c.len().next_multiple_of(8), 0);
            c.extend_from_slice(&marker.to_le_bytes());
            marker
        }
        Flavor::Crc => CRC_PRESENT | u64::from(crc32c::crc32c(&c[8..])),
    };
    c[0..8].copy_from_slice(&word0.to_le_bytes());
    c
}

/// A DirectDS copy `b` read lock-free, then its marker word read again (`marker_after`): whole only if the copy is
/// whole and its marker was still in place after it was read.
fn settle_marked_copy(layout: &DirectLayout, b: &[u8], marker_after: &[u8]) -> Copy {
    match parse_copy(Flavor::Markers, layout, b) {
        Copy::Whole { .. } if b.get(..8) != Some(marker_after) => Copy::Torn,
        c => c,
    }
}

fn parse_copy(flavor: Flavor, layout: &DirectLayout, b: &[u8]) -> Copy {
    if b.len() < COPY_HEADER {
        return Copy::Torn;
    }
    let word0 = u64::from_le_bytes(b[0..8].try_into().unwrap_or([0; 8]));
    if word0 == 0 {
        return Copy::Empty;
    }
    let klen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let flags = u16::from_le_bytes([b[10], b[11]]);
    let vlen = u32::from_le_bytes(b[12..16].try_into().unwrap_or([0; 4])) as usize;
    if klen > layout.max_key as usize
        || vlen > layout.max_value as usize
        || !(flags == FLAG_VALUE || (flags == FLAG_TOMBSTONE && vlen == 0))
    {
        return Copy::Torn;
    }
    let end = COPY_HEADER + klen + vlen;
    let whole = match flavor {
        Flavor::Markers => {
            let trailer = end.next_multiple_of(8);
            trailer + 8 <= b.len() && b[trailer..trailer + 8] == word0.to_le_bytes()
        }
        Flavor::Crc => {
            end <= b.len()
                && word0 >> 32 == 1
                && u64::from(crc32c::crc32c(&b[8..end])) == word0 & 0xffff_ffff
        }
    };
    if !whole {
        return Copy::Torn;
    }
    Copy::Whole {
        key: b[COPY_HEADER..COPY_HEADER + klen].to_vec(),
        value: (flags == FLAG_VALUE).then(|| b[COPY_HEADER + klen..end].to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_free_read_across_a_shorter_write_is_torn_though_its_markers_match() {
        let layout = DirectLayout::default();
        let (old_marker, new_marker) = (0x1_0000_0001u64, 0x1_0000_0002u64);
        let old = encode_copy(Flavor::Markers, old_marker, b"key", Some(&[b'o'; 100]));
        let new = encode_copy(Flavor::Markers, new_marker, b"key", Some(b"short"));
        let mut image = vec![0u8; layout.copy_len() as usize];
        image[..old.len()].copy_from_slice(&old);
        // The reader took the old header, then the shorter write landed, then the reader took the rest: the old
        // trailer, past the new copy's end, still holds the old marker.
        let mut read = image.clone();
        read[COPY_HEADER..new.len()].copy_from_slice(&new[COPY_HEADER..]);
        let markers_alone = parse_copy(Flavor::Markers, &layout, &read);
        assert!(
            matches!(markers_alone, Copy::Whole { value: Some(v), .. } if v != [b'o'; 100]),
            "the markers alone take the mixed bytes for a copy"
        );
        // The marker read again after the copy is the new write's.
        assert_eq!(
            settle_marked_copy(&layout, &read, &new_marker.to_le_bytes()),
            Copy::Torn
        );
        // Read with no write in between, the copy stands.
        assert_eq!(
            settle_marked_copy(&layout, &image, &old_marker.to_le_bytes()),
            parse_copy(Flavor::Markers, &layout, &image)
        );
        assert!(matches!(
            settle_marked_copy(&layout, &image, &old_marker.to_le_bytes()),
            Copy::Whole { .. }
        ));
        // A slot never written stays empty.
        assert_eq!(
            settle_marked_copy(&layout, &[0u8; 64], &[0u8; 8]),
            Copy::Empty
        );
    }

    #[test]
    fn copies_round_trip_and_every_proper_prefix_is_torn() {
        let layout = DirectLayout::default();
        for flavor in [Flavor::Markers, Flavor::Crc] {
            let old = encode_copy(flavor, 0x1_0000_0001, b"key", Some(b"old value here"));
            let new = encode_copy(flavor, 0x1_0000_0002, b"key", Some(b"a new value!"));
            let mut image = vec![0u8; layout.copy_len() as usize];
            image[..old.len()].copy_from_slice(&old);
            assert_eq!(
                parse_copy(flavor, &layout, &image),
                Copy::Whole {
                    key: b"key".to_vec(),
                    value: Some(b"old value here".to_vec())
                }
            );
            // DirectDS assumes 8-byte power-fail atomicity (its trailer is one aligned word); a CRC catches any cut.
            let step = if flavor == Flavor::Markers { 8 } else { 1 };
            for cut in (step..new.len()).step_by(step) {
                let mut torn = image.clone();
                torn[..cut].copy_from_slice(&new[..cut]);
                assert_eq!(
                    parse_copy(flavor, &layout, &torn),
                    Copy::Torn,
                    "{flavor:?} cut {cut}"
                );
            }
            let tomb = encode_copy(flavor, 0x1_0000_0003, b"key", None);
            image[..tomb.len()].copy_from_slice(&tomb);
            assert_eq!(
                parse_copy(flavor, &layout, &image),
                Copy::Whole {
                    key: b"key".to_vec(),
                    value: None
                }
            );
            assert_eq!(parse_copy(flavor, &layout, &[0u8; 64]), Copy::Empty);
        }
    }

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let l = DirectLayout {
            flavor: Flavor::Crc,
            slots: 100,
            max_key: 16,
            max_value: 40,
            replication: 2,
        };
        let mut h = l.encode();
        assert_eq!(DirectLayout::decode(&h), Ok(l));
        h[20] ^= 1;
        assert!(DirectLayout::decode(&h).is_err());
    }
}
