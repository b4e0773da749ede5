//! Disaggregated Adaptive Caching (DAC) for KV-node worker threads.
//!
//! A KV node caches, in its local DRAM and within one byte budget, two kinds of entries:
//!
//! * a **value** entry holds a copy of the value: a hit costs no round trip to remote memory;
//! * a **shortcut** entry holds a [`Shortcut`], an opaque pointer to the value in remote memory:
//!   a hit costs one round trip (one one-sided read).
//!
//! A miss costs `M` round trips (an index walk plus the read); `M` is measured at run time as
//! an exponentially weighted moving average ([`Dac::record_miss_round_trips`]).
//!
//! A miss whose walk found no value may also be remembered ([`Dac::fill_absent`]): a value entry
//! with no value, answering [`Lookup::Absent`] without a walk. Such a record only takes space
//! that is free (it never demotes or evicts anything) and is dropped, not demoted, when a value
//! needs its room. Like every entry it is exact only while the caller is the key's sole writer.
//!
//! # The adaptive policy ([`Policy::Adaptive`], Table 3 of the DINOMO paper)
//!
//! * The cache starts empty and caches values while they fit in free space.
//! * On a miss ([`Dac::fill`]) the key is cached as a value if its value entry fits in the free
//!   space; otherwise it is cached as a shortcut, and room for the shortcut is made by
//!   **demoting** the least-recently-used value to a shortcut (its access count becomes its
//!   frequency) or, when no value is left, by **evicting** the least-frequently-used shortcut.
//! * On a shortcut hit ([`Dac::shortcut_hit`]) the shortcut `P` is **promoted** to a value if
//!   the free space covers the extra bytes of the value. Otherwise let `N` be the smallest
//!   number of least-frequently-used shortcuts (other than `P`) whose eviction, together with
//!   the free space, makes room; `P` is promoted, and those `N` shortcuts evicted, exactly when
//!   equation (1) holds:
//!
//!   `Hits(P) × 1 ≥ (Hits(S₁) + … + Hits(S_N)) × M`
//!
//!   If even evicting every other shortcut would not make room, `P` stays a shortcut and
//!   nothing is evicted. A promoted entry keeps its access count.
//! * Evicted entries are always least-frequently-used shortcuts; demoted entries are always
//!   least-recently-used values. Ties in frequency go to the least recently touched shortcut.
//!
//! # Static policies ([`Policy::Static`], [`Policy::ValueOnly`], [`Policy::ShortcutOnly`])
//!
//! A fixed share of the budget holds values and the rest holds shortcuts; each share evicts
//! its least-recently-used entry. A value pushed out of the value share is demoted into the
//! shortcut share (dropped when that share is empty, as with `ValueOnly`). New keys, and
//! shortcuts that are hit, go to the value share when their value entry fits in it, so the
//! value share holds the most recently used keys and the shortcut share the ones below them.
//!
//! # Accounting
//!
//! Every entry is charged [`Dac::value_entry_bytes`] or [`Dac::shortcut_entry_bytes`]: its key
//! bytes, its value bytes (value entries), the 16-byte shortcut (both kinds; a value entry keeps
//! the shortcut of its value), and [`ENTRY_OVERHEAD`], an estimate of the memory the cache's own
//! structures spend per entry (see its documentation). `used_bytes <= budget_bytes` holds
//! after every call.
//!
//! # Cost
//!
//! Lookups, fills, writes and invalidations cost O(1) expected time, plus O(log n) to keep
//! the frequency order of adaptive shortcuts, plus the demotions or evictions they cause
//! (each entry is demoted or evicted at most once per insertion, so these are amortised
//! O(1)). A promotion decision visits its `N` victims in O(N log N). A lookup never
//! allocates; an overwrite with a value of the same length reuses the entry's buffer.

mod lfu;
mod node;
mod policy;

use std::hash::BuildHasher;
use std::mem::size_of;

use hashbrown::HashTable;

use crate::lfu::{Frontier, Lfu};
use crate::node::{Kind, List, NIL, Node};
pub use crate::policy::{ParsePolicyError, Policy};

/// Bytes of an entry's key and value [`Dac::prefetch`] asks for (the hardware's own prefetcher follows a copy of the
/// rest).
const PREFETCH_BYTES: usize = 256;

/// Asks the CPU to load the cache line at `p` (a hint: never faults, whatever `p` is; a no-op where unsupported).
#[inline(always)]
fn prefetch_read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that reads nothing the program sees and cannot fault, for any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Bytes a hash-table slot costs per entry: a 4-byte slot index plus a 1-byte control byte,
/// at the table's typical load factor of about two thirds.
const TABLE_SLOT_BYTES: usize = 8;
/// Bytes the allocator spends on the heap buffer holding an entry's key (and value): an
/// 8-byte chunk header plus, on average, 8 bytes of rounding to 16-byte chunks.
const ALLOC_BYTES: usize = 16;

/// Per-entry memory, in bytes, that the cache charges on top of the key, value and shortcut
/// bytes of an entry.
///
/// It is derived from the data structures rather than guessed:
///
/// * the slab node (`size_of::<Node>()`, 56 bytes on 64-bit targets) minus the 16-byte
///   shortcut already charged separately: buffer pointer and length, access count, key
///   length, list links, heap position and kind;
/// * a slot of the least-frequently-used heap (16 bytes: tick, count, node index), charged to
///   every entry because any value may be demoted to a shortcut;
/// * a hash-table slot (8 bytes, see `TABLE_SLOT_BYTES`);
/// * the allocator's header and rounding for the entry's buffer (16 bytes);
/// * one eighth of the node and heap slot for the spare capacity of the slab and heap
///   vectors, which grow by a quarter at a time (about 12 % spare on average).
///
/// That is 89 bytes on 64-bit targets.
pub const ENTRY_OVERHEAD: u64 = ((size_of::<Node>() - size_of::<Shortcut>())
    + size_of::<lfu::Item>()
    + TABLE_SLOT_BYTES
    + ALLOC_BYTES
    + (size_of::<Node>() + size_of::<lfu::Item>()) / 8) as u64;

/// Grows `v` by a quarter of its length when full, instead of doubling, so that the spare
/// capacity counted in [`ENTRY_OVERHEAD`] stays small.
pub(crate) fn grow_for_push<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact((v.len() / 4).max(16));
    }
}

/// Configuration of one [`Dac`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Bytes the cache may charge for its entries (see [`Dac::value_entry_bytes`]).
    pub budget_bytes: u64,
    /// How the budget is divided between values and shortcuts.
    pub policy: Policy,
    /// Round trips per miss assumed until misses are measured.
    pub initial_miss_cost: f64,
    /// Weight of a new sample in the moving average of round trips per miss, in `(0, 1]`.
    pub miss_cost_weight: f64,
    /// Whether [`Dac::fill_absent`] records keys found to have no value (in free space only). Off, the cache
    /// holds only what the DINOMO paper's DAC holds, values and shortcuts, and every lookup of a key without a
    /// value walks the index. (A KV node records absence only where a walk costs a fabric round trip: not over
    /// an in-process fabric without injected latency, where the walk is cheaper than the record's bookkeeping.)
    pub remember_absent: bool,
}

impl Default for CacheConfig {
    /// A 64 MiB budget, [`Policy::Adaptive`], an initial miss cost of 2 round trips (an index
    /// read plus the value read), a moving-average weight of 1/64 per sample, and keys without a
    /// value remembered.
    fn default() -> Self {
        CacheConfig {
            budget_bytes: 64 << 20,
            policy: Policy::Adaptive,
            initial_miss_cost: 2.0,
            miss_cost_weight: 1.0 / 64.0,
            remember_absent: true,
        }
    }
}

/// Where a value lives in remote memory. The cache stores and returns it without
/// interpreting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shortcut {
    /// Location of the value.
    pub ptr: u64,
    /// Version or sequence information kept with the location.
    pub seq: u64,
}

/// The result of [`Dac::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// A value hit: the cached value and the shortcut to it in remote memory.
    Value {
        /// The cached value.
        value: &'a [u8],
        /// Where the value lives in remote memory.
        shortcut: Shortcut,
    },
    /// A shortcut hit: read the value through this shortcut, then call
    /// [`Dac::shortcut_hit`] (or [`Dac::stale_shortcut`] if it no longer leads to the key).
    Shortcut(Shortcut),
    /// A miss: walk the index, then call [`Dac::fill`] (or [`Dac::fill_absent`] when the key has no value).
    Miss,
    /// The key has no value: a miss found none, and nothing wrote it since.
    Absent,
}

/// The kind of a cached entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A copy of the value.
    Value,
    /// A pointer to the value in remote memory.
    Shortcut,
    /// A record that the key has no value.
    Absent,
}

/// Counters and gauges of a [`Dac`]. The counters (hits, misses, promotions, demotions,
/// evictions) accumulate from creation; [`Dac::clear`] does not reset them.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheStats {
    /// Lookups answered with a value.
    pub value_hits: u64,
    /// Lookups answered with a shortcut (minus those later reported stale).
    pub shortcut_hits: u64,
    /// Lookups that found nothing (plus shortcut hits later reported stale).
    pub misses: u64,
    /// Value entries now cached.
    pub values: u64,
    /// Shortcut entries now cached.
    pub shortcuts: u64,
    /// Bytes charged for all entries now cached.
    pub used_bytes: u64,
    /// The budget.
    pub budget_bytes: u64,
    /// Shortcuts turned into values.
    pub promotions: u64,
    /// Values turned into shortcuts.
    pub demotions: u64,
    /// Entries dropped to make room (not counting invalidations and stale shortcuts).
    pub evictions: u64,
    /// Bytes charged for value entries now cached.
    pub value_bytes: u64,
    /// Bytes charged for shortcut entries now cached.
    pub shortcut_bytes: u64,
    /// Lookups answered with a record that the key has no value.
    #[serde(default)]
    pub absent_hits: u64,
    /// Records of keys without a value now cached (charged as value entries with no value: in `value_bytes`,
    /// not in `values`).
    #[serde(default)]
    pub absents: u64,
}

/// One worker thread's cache of values and shortcuts; see the [crate documentation](crate).
pub struct Dac {
    policy: Policy,
    budget: u64,
    /// Bytes value entries may use (static policies).
    value_cap: u64,
    /// Bytes shortcut entries may use (static policies).
    shortcut_cap: u64,
    miss_cost: f64,
    miss_cost_weight: f64,
    remember_absent: bool,

    nodes: Vec<Node>,
    free_head: u32,
    table: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// Value entries, most recently used first.
    values: List,
    /// Shortcut entries of static policies, most recently used first.
    shortcut_lru: List,
    /// Shortcut entries of the adaptive policy, least frequently used first.
    lfu: Lfu,
    tick: u64,
    frontier: Frontier,
    victims: Vec<u32>,
    /// Hashes of the keys [`Dac::prefetch`] was given (kept to avoid an allocation per batch).
    prefetched: Vec<u64>,

    value_bytes: u64,
    shortcut_bytes: u64,
    value_count: u64,
    shortcut_count: u64,
    /// Value entries that record an absence (counted in `value_count` too).
    absent_count: u64,
    counters: CacheStats,
}

impl std::fmt::Debug for Dac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dac")
            .field("policy", &self.policy)
            .field("miss_cost", &self.miss_cost)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Dac {
    /// Creates an empty cache. A `miss_cost_weight` outside `(0, 1]` (or NaN) is replaced by
    /// the default 1/64; a negative or NaN `initial_miss_cost` by the default 2.
    pub fn new(cfg: CacheConfig) -> Dac {
        let defaults = CacheConfig::default();
        let miss_cost_weight = if cfg.miss_cost_weight > 0.0 && cfg.miss_cost_weight <= 1.0 {
            cfg.miss_cost_weight
        } else {
            defaults.miss_cost_weight
        };
        let miss_cost = if cfg.initial_miss_cost >= 0.0 {
            cfg.initial_miss_cost
        } else {
            defaults.initial_miss_cost
        };
        let mut dac = Dac {
            policy: cfg.policy,
            budget: 0,
            value_cap: 0,
            shortcut_cap: 0,
            miss_cost,
            miss_cost_weight,
            remember_absent: cfg.remember_absent,
            nodes: Vec::new(),
            free_head: NIL,
            table: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            values: List::default(),
            shortcut_lru: List::default(),
            lfu: Lfu::default(),
            tick: 0,
            frontier: Frontier::new(),
            victims: Vec::new(),
            prefetched: Vec::new(),
            value_bytes: 0,
            shortcut_bytes: 0,
            value_count: 0,
            shortcut_count: 0,
            absent_count: 0,
            counters: CacheStats::default(),
        };
        dac.set_caps(cfg.budget_bytes);
        dac
    }

    /// Bytes charged for a value entry with a key of `key_len` bytes and a value of
    /// `value_len` bytes: key + value + shortcut + [`ENTRY_OVERHEAD`].
    pub fn value_entry_bytes(key_len: usize, value_len: usize) -> u64 {
        (key_len as u64)
            .saturating_add(value_len as u64)
            .saturating_add(size_of::<Shortcut>() as u64 + ENTRY_OVERHEAD)
    }

    /// Bytes charged for a shortcut entry with a key of `key_len` bytes:
    /// key + shortcut + [`ENTRY_OVERHEAD`].
    pub fn shortcut_entry_bytes(key_len: usize) -> u64 {
        (key_len as u64).saturating_add(size_of::<Shortcut>() as u64 + ENTRY_OVERHEAD)
    }

    /// The policy this cache follows.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Number of cached entries (values and shortcuts).
    pub fn len(&self) -> usize {
        (self.value_count + self.shortcut_count) as usize
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Readies the lookups of `keys`, about to follow, by asking the CPU to load the memory they will touch: each
    /// key's table slot and entry, its key and value bytes, and its recency-list neighbours. A lookup in a cache
    /// larger than the CPU's caches waits on several memory loads in turn (slot, entry, key); issued for a batch of
    /// keys together, those loads overlap. Changes nothing that a lookup observes; costs a few hashes and probes
    /// for keys the cache does not hold.
    pub fn prefetch<'k>(&mut self, keys: impl Iterator<Item = &'k [u8]>) {
        let (table, nodes, hasher) = (&self.table, &self.nodes, &self.hasher);
        self.prefetched.clear();
        // Slots and entries first: every key's probe, touching each candidate entry without reading it.
        for key in keys {
            let hash = hasher.hash_one(key);
            self.prefetched.push(hash);
            table.find(hash, |&id| {
                prefetch_read(nodes.as_ptr().wrapping_add(id as usize));
                false
            });
        }
        // Then what the entries point at, now that they are (being) loaded.
        for &hash in &self.prefetched {
            table.find(hash, |&id| {
                if let Some(node) = nodes.get(id as usize) {
                    for line in (0..node.buf.len().min(PREFETCH_BYTES)).step_by(64) {
                        prefetch_read(node.buf.as_ptr().wrapping_add(line));
                    }
                    for link in [node.prev, node.next] {
                        if link != NIL {
                            prefetch_read(nodes.as_ptr().wrapping_add(link as usize));
                        }
                    }
                }
                false
            });
        }
    }

    /// Looks `key` up and counts a value hit, shortcut hit or miss. A hit also counts an
    /// access of the entry (its frequency) and, for values, makes it the most recently used.
    /// Never allocates.
    pub fn lookup(&mut self, key: &[u8]) -> Lookup<'_> {
        let Some(id) = self.find(key) else {
            self.counters.misses += 1;
            return Lookup::Miss;
        };
        let node = &mut self.nodes[id as usize];
        node.hits = node.hits.saturating_add(1);
        match node.kind {
            Kind::Value if node.absent => {
                self.counters.absent_hits += 1;
                self.values.move_to_front(&mut self.nodes, id);
                Lookup::Absent
            }
            Kind::Value => {
                self.counters.value_hits += 1;
                self.values.move_to_front(&mut self.nodes, id);
                let node = &self.nodes[id as usize];
                Lookup::Value {
                    value: node.value(),
                    shortcut: node.shortcut,
                }
            }
            Kind::Shortcut => {
                self.counters.shortcut_hits += 1;
                let (hits, shortcut) = (node.hits, node.shortcut);
                if self.is_adaptive() {
                    let tick = self.next_tick();
                    self.lfu.touch(&mut self.nodes, id, hits, tick);
                } else {
                    self.shortcut_lru.move_to_front(&mut self.nodes, id);
                }
                Lookup::Shortcut(shortcut)
            }
            Kind::Free | Kind::Detached => unreachable!("the key table holds only placed entries"),
        }
    }

    /// Caches `key` after a miss was served from remote memory with `value`, found at
    /// `shortcut`. If the key got cached meanwhile, its entry is updated as by [`Dac::write`].
    pub fn fill(&mut self, key: &[u8], value: &[u8], shortcut: Shortcut) {
        self.upsert(key, value, shortcut);
    }

    /// Records, after a miss whose walk found no value for `key`, that it has none, so that its next lookups answer
    /// [`Lookup::Absent`] until it is written or invalidated. Only space free now is used (within the value share of
    /// a static policy): nothing is demoted or evicted for the record, which is worth less than any value or
    /// shortcut. A key cached meanwhile keeps its entry (a write since is newer than the walk's answer). Nothing is
    /// recorded when [`CacheConfig::remember_absent`] is off.
    pub fn fill_absent(&mut self, key: &[u8]) {
        if !self.remember_absent || self.find(key).is_some() {
            return;
        }
        let entry = Self::value_entry_bytes(key.len(), 0);
        let fits = if self.is_adaptive() {
            entry <= self.free()
        } else {
            self.value_bytes + entry <= self.value_cap
        };
        if !fits || key.len() > u32::MAX as usize || self.nodes.len() >= NIL as usize {
            return;
        }
        let id = self.alloc(key, Shortcut { ptr: 0, seq: 0 });
        self.nodes[id as usize].absent = true;
        self.attach_value(id, &[]);
    }

    /// Reports that a shortcut hit on `key` read `value` (now at `shortcut`, which may differ
    /// from the cached one). The adaptive policy then promotes the shortcut to a value when
    /// equation (1) allows; static policies move it into the value share when it fits there.
    /// A key no longer cached is inserted as by [`Dac::fill`]; a key that is a value by now is
    /// updated to `value`.
    pub fn shortcut_hit(&mut self, key: &[u8], value: &[u8], shortcut: Shortcut) {
        let Some(id) = self.find(key) else {
            self.insert_new(key, value, shortcut);
            return;
        };
        let node = &mut self.nodes[id as usize];
        node.shortcut = shortcut;
        if node.kind == Kind::Shortcut && self.is_adaptive() {
            self.try_promote(id, value);
        } else {
            self.update(id, value);
        }
    }

    /// Reports that the shortcut [`Dac::lookup`] returned for `key` no longer leads to its
    /// value: the shortcut entry is dropped, and one lookup is moved from the shortcut hits
    /// to the misses (the caller goes on as after a miss and then calls [`Dac::fill`]).
    /// A value entry for `key` is kept: it can only have been written after that lookup.
    pub fn stale_shortcut(&mut self, key: &[u8]) {
        if self.counters.shortcut_hits > 0 {
            self.counters.shortcut_hits -= 1;
            self.counters.misses += 1;
        }
        if let Some(id) = self.find(key) {
            if self.nodes[id as usize].kind == Kind::Shortcut {
                self.remove(id);
            }
        }
    }

    /// Records that this node wrote `value` for `key`, now at `shortcut`. A cached entry of
    /// either kind is updated (and counts an access), so the cache never returns an older
    /// value afterwards; the entry is re-placed by the policy as if newly inserted (for
    /// example, a value that grew past the free space becomes a shortcut). An uncached key
    /// is inserted as by [`Dac::fill`].
    pub fn write(&mut self, key: &[u8], value: &[u8], shortcut: Shortcut) {
        self.upsert(key, value, shortcut);
    }

    /// Removes `key` entirely (for example after a delete).
    pub fn invalidate(&mut self, key: &[u8]) {
        if let Some(id) = self.find(key) {
            self.remove(id);
        }
    }

    /// Adds a measured miss cost, in round trips, to the moving average:
    /// `M ← M + w × (rts − M)` with `w` = [`CacheConfig::miss_cost_weight`].
    pub fn record_miss_round_trips(&mut self, rts: u32) {
        self.miss_cost += self.miss_cost_weight * (f64::from(rts) - self.miss_cost);
    }

    /// The current average round trips per miss (`M` in equation (1)).
    pub fn miss_cost(&self) -> f64 {
        self.miss_cost
    }

    /// Changes the budget. Shrinking demotes least-recently-used values and then evicts
    /// shortcuts (least frequently used for the adaptive policy, least recently used in the
    /// shortcut share of static ones) until the entries fit, and releases spare memory of
    /// the cache's structures. Growing leaves the entries as they are; later misses and
    /// shortcut hits use the new space.
    pub fn set_budget(&mut self, bytes: u64) {
        self.set_caps(bytes);
        if self.is_adaptive() {
            while self.used() > self.budget {
                self.make_room_step();
            }
        } else {
            while self.value_bytes > self.value_cap {
                let lru = self.values.back().expect("value bytes imply a value entry");
                self.demote(lru);
            }
            while self.shortcut_bytes > self.shortcut_cap {
                self.evict_lru_shortcut();
            }
        }
        if self.nodes.len() > 2 * self.len() + 64 {
            self.compact();
        }
    }

    /// Drops every entry and releases the memory of the cache's structures. Counters and
    /// the miss cost are kept.
    pub fn clear(&mut self) {
        self.nodes = Vec::new();
        self.free_head = NIL;
        self.table = HashTable::new();
        self.values = List::default();
        self.shortcut_lru = List::default();
        self.lfu = Lfu::default();
        self.frontier = Frontier::new();
        self.victims = Vec::new();
        self.value_bytes = 0;
        self.shortcut_bytes = 0;
        self.value_count = 0;
        self.shortcut_count = 0;
        self.absent_count = 0;
    }

    /// Drops every entry whose key `keep` rejects; returns how many were dropped. A KV node calls it when it hands
    /// keys to another node, so that it never serves a stale copy if the keys come back later.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) -> usize {
        let doomed: Vec<u32> = (0..self.nodes.len() as u32)
            .filter(|&id| {
                let n = &self.nodes[id as usize];
                matches!(n.kind, Kind::Value | Kind::Shortcut)
                    && !keep(&n.buf[..n.key_len as usize])
            })
            .collect();
        for &id in &doomed {
            self.remove(id);
        }
        doomed.len()
    }

    /// Counters and gauges.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            values: self.value_count - self.absent_count,
            absents: self.absent_count,
            shortcuts: self.shortcut_count,
            used_bytes: self.used(),
            budget_bytes: self.budget,
            value_bytes: self.value_bytes,
            shortcut_bytes: self.shortcut_bytes,
            ..self.counters
        }
    }

    /// The shortcut of `key` when it is cached as a shortcut, without counting anything or touching its frequency
    /// (a caller reading ahead for lookups that follow, which count).
    pub fn peek_shortcut(&self, key: &[u8]) -> Option<Shortcut> {
        let node = &self.nodes[self.find(key)? as usize];
        (node.kind == Kind::Shortcut).then_some(node.shortcut)
    }

    /// How `key` is cached, if at all, without counting anything.
    pub fn contains(&self, key: &[u8]) -> Option<EntryKind> {
        let id = self.find(key)?;
        let node = &self.nodes[id as usize];
        match node.kind {
            Kind::Value if node.absent => Some(EntryKind::Absent),
            Kind::Value => Some(EntryKind::Value),
            Kind::Shortcut => Some(EntryKind::Shortcut),
            Kind::Free | Kind::Detached => None,
        }
    }

    // ---- internals -------------------------------------------------------------------

    #[inline]
    fn is_adaptive(&self) -> bool {
        self.policy == Policy::Adaptive
    }

    #[inline]
    fn used(&self) -> u64 {
        self.value_bytes + self.shortcut_bytes
    }

    #[inline]
    fn free(&self) -> u64 {
        self.budget.saturating_sub(self.used())
    }

    #[inline]
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn set_caps(&mut self, budget: u64) {
        self.budget = budget;
        match self.policy.value_percent() {
            None => {
                self.value_cap = budget;
                self.shortcut_cap = budget;
            }
            Some(percent) => {
                self.value_cap = (u128::from(budget) * u128::from(percent) / 100) as u64;
                self.shortcut_cap = budget - self.value_cap;
            }
        }
    }

    #[inline]
    fn find(&self, key: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        let nodes = &self.nodes;
        self.table
            .find(hash, |&id| nodes[id as usize].key() == key)
            .copied()
    }

    fn entry_bytes(node: &Node) -> u64 {
        match node.kind {
            Kind::Value => Self::value_entry_bytes(node.key_len as usize, node.value().len()),
            Kind::Shortcut => Self::shortcut_entry_bytes(node.key_len as usize),
            Kind::Free | Kind::Detached => 0,
        }
    }

    fn upsert(&mut self, key: &[u8], value: &[u8], shortcut: Shortcut) {
        match self.find(key) {
            Some(id) => {
                let node = &mut self.nodes[id as usize];
                node.shortcut = shortcut;
                node.hits = node.hits.saturating_add(1);
                self.update(id, value);
            }
            None => self.insert_new(key, value, shortcut),
        }
    }

    /// Gives the cached entry `id` the new `value`, then lets the policy place it again.
    fn update(&mut self, id: u32, value: &[u8]) {
        let node = &mut self.nodes[id as usize];
        let was = node.kind;
        if was == Kind::Value && !node.absent && node.value().len() == value.len() {
            node.set_value(value);
            self.values.move_to_front(&mut self.nodes, id);
            return;
        }
        self.detach(id);
        // A record of absence holds a value from now on.
        self.nodes[id as usize].absent = false;
        match (was, self.place(id, value)) {
            (Kind::Shortcut, Some(Kind::Value)) => self.counters.promotions += 1,
            (Kind::Value, Some(Kind::Shortcut)) => self.counters.demotions += 1,
            (_, None) => self.counters.evictions += 1,
            _ => {}
        }
    }

    fn insert_new(&mut self, key: &[u8], value: &[u8], shortcut: Shortcut) {
        let fits_somewhere = Self::value_entry_bytes(key.len(), value.len()) <= self.value_cap
            || Self::shortcut_entry_bytes(key.len()) <= self.shortcut_cap;
        if !fits_somewhere || key.len() > u32::MAX as usize || self.nodes.len() >= NIL as usize {
            return;
        }
        let id = self.alloc(key, shortcut);
        self.place(id, value);
    }

    /// Takes a free slab slot for `key`, enters it in the key table, and leaves it detached
    /// with one access.
    fn alloc(&mut self, key: &[u8], shortcut: Shortcut) -> u32 {
        let id = if self.free_head != NIL {
            let id = self.free_head;
            self.free_head = self.nodes[id as usize].next;
            id
        } else {
            grow_for_push(&mut self.nodes);
            self.nodes.push(Node::free(NIL));
            (self.nodes.len() - 1) as u32
        };
        let node = &mut self.nodes[id as usize];
        node.buf = Box::from(key);
        node.key_len = key.len() as u32;
        node.shortcut = shortcut;
        node.hits = 1;
        node.prev = NIL;
        node.next = NIL;
        node.kind = Kind::Detached;
        let hash = self.hasher.hash_one(key);
        let (nodes, hasher) = (&self.nodes, &self.hasher);
        self.table.insert_unique(hash, id, |&other| {
            hasher.hash_one(nodes[other as usize].key())
        });
        id
    }

    /// Places the detached entry `id` with `value` as the policy decides for a new key,
    /// making room as needed. Returns the kind it got, or `None` if it was dropped because
    /// not even its shortcut fits.
    fn place(&mut self, id: u32, value: &[u8]) -> Option<Kind> {
        let key_len = self.nodes[id as usize].key_len as usize;
        let value_entry = Self::value_entry_bytes(key_len, value.len());
        let shortcut_entry = Self::shortcut_entry_bytes(key_len);
        if self.is_adaptive() {
            if value_entry <= self.free() {
                self.attach_value(id, value);
                return Some(Kind::Value);
            }
            if shortcut_entry > self.budget {
                self.release(id);
                return None;
            }
            while self.free() < shortcut_entry {
                self.make_room_step();
            }
            self.attach_shortcut(id);
            Some(Kind::Shortcut)
        } else if value_entry <= self.value_cap {
            while self.value_bytes + value_entry > self.value_cap {
                let lru = self.values.back().expect("value bytes imply a value entry");
                self.demote(lru);
            }
            self.attach_value(id, value);
            Some(Kind::Value)
        } else if shortcut_entry <= self.shortcut_cap {
            while self.shortcut_bytes + shortcut_entry > self.shortcut_cap {
                self.evict_lru_shortcut();
            }
            self.attach_shortcut(id);
            Some(Kind::Shortcut)
        } else {
            self.release(id);
            None
        }
    }

    /// Adaptive policy: frees space by demoting the least-recently-used value, or, when no
    /// value is left, by evicting the least-frequently-used shortcut.
    fn make_room_step(&mut self) {
        if let Some(lru) = self.values.back() {
            self.demote(lru);
        } else if let Some(min) = self.lfu.min() {
            self.evict(min.node);
        } else {
            unreachable!("an empty cache has its whole budget free");
        }
    }

    /// Equation (1): promotes the adaptive shortcut `id`, whose value is `value`, if the
    /// free space allows, or if its hits outweigh those of the least-frequently-used
    /// shortcuts that would have to be evicted, weighted by the miss cost.
    fn try_promote(&mut self, id: u32, value: &[u8]) {
        let node = &self.nodes[id as usize];
        // A value entry costs exactly `value.len()` bytes more than a shortcut entry.
        let extra = value.len() as u64;
        if Self::value_entry_bytes(node.key_len as usize, value.len()) > self.budget {
            return;
        }
        let free = self.free();
        if extra <= free {
            self.promote(id, value);
            return;
        }
        let deficit = extra - free;
        let hits = f64::from(node.hits);
        let miss_cost = self.miss_cost;
        let mut victims = std::mem::take(&mut self.victims);
        victims.clear();
        let (mut freed, mut victim_hits, mut enough) = (0u64, 0u64, false);
        let nodes = &self.nodes;
        self.lfu.ascending(&mut self.frontier, |item| {
            if item.node == id {
                return true;
            }
            victims.push(item.node);
            victim_hits += u64::from(item.hits);
            freed += Self::shortcut_entry_bytes(nodes[item.node as usize].key_len as usize);
            if victim_hits as f64 * miss_cost > hits {
                // The sum only grows: equation (1) cannot hold any more.
                return false;
            }
            enough = freed >= deficit;
            !enough
        });
        if enough {
            for &victim in &victims {
                self.evict(victim);
            }
            self.promote(id, value);
        }
        victims.clear();
        self.victims = victims;
    }

    fn promote(&mut self, id: u32, value: &[u8]) {
        self.detach(id);
        self.attach_value(id, value);
        self.counters.promotions += 1;
    }

    /// Turns the value entry `id` into a shortcut entry (static policies: into the shortcut
    /// share, evicting its least-recently-used entries, or drops it if that share is empty).
    fn demote(&mut self, id: u32) {
        // A record of absence is worth nothing as a shortcut (there is no value to point at): it goes.
        if self.nodes[id as usize].absent {
            self.evict(id);
            return;
        }
        self.detach(id);
        let shortcut_entry = Self::shortcut_entry_bytes(self.nodes[id as usize].key_len as usize);
        if !self.is_adaptive() {
            if shortcut_entry > self.shortcut_cap {
                self.release(id);
                self.counters.evictions += 1;
                return;
            }
            while self.shortcut_bytes + shortcut_entry > self.shortcut_cap {
                self.evict_lru_shortcut();
            }
        }
        self.attach_shortcut(id);
        self.counters.demotions += 1;
    }

    fn evict_lru_shortcut(&mut self) {
        let lru = self
            .shortcut_lru
            .back()
            .expect("shortcut bytes imply a shortcut entry");
        self.evict(lru);
    }

    fn evict(&mut self, id: u32) {
        self.remove(id);
        self.counters.evictions += 1;
    }

    fn remove(&mut self, id: u32) {
        self.detach(id);
        self.release(id);
    }

    fn attach_value(&mut self, id: u32, value: &[u8]) {
        let node = &mut self.nodes[id as usize];
        debug_assert_eq!(node.kind, Kind::Detached);
        node.set_value(value);
        node.kind = Kind::Value;
        self.value_bytes += Self::entry_bytes(node);
        self.value_count += 1;
        self.absent_count += u64::from(node.absent);
        self.values.push_front(&mut self.nodes, id);
    }

    fn attach_shortcut(&mut self, id: u32) {
        let node = &mut self.nodes[id as usize];
        debug_assert_eq!(node.kind, Kind::Detached);
        node.drop_value();
        node.kind = Kind::Shortcut;
        self.shortcut_bytes += Self::entry_bytes(node);
        self.shortcut_count += 1;
        let hits = node.hits;
        if self.is_adaptive() {
            let tick = self.next_tick();
            self.lfu.push(&mut self.nodes, id, hits, tick);
        } else {
            self.shortcut_lru.push_front(&mut self.nodes, id);
        }
    }

    /// Takes the entry `id` out of its list or heap and stops charging for it; it stays in
    /// the key table.
    fn detach(&mut self, id: u32) {
        let node = &self.nodes[id as usize];
        let bytes = Self::entry_bytes(node);
        match node.kind {
            Kind::Value => {
                self.absent_count -= u64::from(node.absent);
                self.values.unlink(&mut self.nodes, id);
                self.value_bytes -= bytes;
                self.value_count -= 1;
            }
            Kind::Shortcut => {
                if self.is_adaptive() {
                    self.lfu.remove(&mut self.nodes, id);
                } else {
                    self.shortcut_lru.unlink(&mut self.nodes, id);
                }
                self.shortcut_bytes -= bytes;
                self.shortcut_count -= 1;
            }
            Kind::Detached => {}
            Kind::Free => unreachable!("detaching a free slot"),
        }
        self.nodes[id as usize].kind = Kind::Detached;
    }

    /// Removes the detached entry `id` from the key table and frees its slot.
    fn release(&mut self, id: u32) {
        let node = &mut self.nodes[id as usize];
        debug_assert_eq!(node.kind, Kind::Detached);
        let hash = self.hasher.hash_one(node.key());
        match self.table.find_entry(hash, |&other| other == id) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => unreachable!("a detached entry is in the key table"),
        }
        *node = Node::free(self.free_head);
        self.free_head = id;
    }

    /// Renumbers the live entries densely and releases spare capacity of the slab, the key
    /// table and the heap.
    fn compact(&mut self) {
        let mut map = vec![NIL; self.nodes.len()];
        let mut nodes = Vec::with_capacity(self.len());
        for (old, node) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if node.kind != Kind::Free {
                map[old] = nodes.len() as u32;
                nodes.push(node);
            }
        }
        let fix = |id: u32| if id == NIL { NIL } else { map[id as usize] };
        for node in &mut nodes {
            node.prev = fix(node.prev);
            node.next = fix(node.next);
        }
        for list in [&mut self.values, &mut self.shortcut_lru] {
            list.head = fix(list.head);
            list.tail = fix(list.tail);
        }
        self.lfu.renumber(|id| map[id as usize]);
        for slot in self.table.iter_mut() {
            *slot = map[*slot as usize];
        }
        let hasher = &self.hasher;
        self.table
            .shrink_to_fit(|&id| hasher.hash_one(nodes[id as usize].key()));
        self.nodes = nodes;
        self.free_head = NIL;
        self.frontier = Frontier::new();
        self.victims = Vec::new();
    }
}

#[cfg(test)]
impl Dac {
    /// Checks every internal invariant; panics on the first violation.
    fn check_invariants(&self) {
        let used = self.used();
        assert!(used <= self.budget, "used {used} > budget {}", self.budget);
        if !self.is_adaptive() {
            assert!(self.value_bytes <= self.value_cap);
            assert!(self.shortcut_bytes <= self.shortcut_cap);
        }
        // Values: a well-linked list of value entries whose charges add up.
        let (mut count, mut bytes, mut prev, mut id) = (0, 0, NIL, self.values.head);
        let mut absents = 0;
        while id != NIL {
            let node = &self.nodes[id as usize];
            assert_eq!(node.kind, Kind::Value);
            assert_eq!(node.prev, prev);
            assert_eq!(node.buf.len(), node.key_len as usize + node.value().len());
            if node.absent {
                assert!(node.value().is_empty(), "a record of absence holds a value");
                absents += 1;
            }
            count += 1;
            bytes += Self::entry_bytes(node);
            prev = id;
            id = node.next;
        }
        assert_eq!(self.values.tail, prev);
        assert_eq!((count, bytes), (self.value_count, self.value_bytes));
        assert_eq!(absents, self.absent_count);
        // Shortcuts: a valid heap (adaptive) or a well-linked list (static).
        let (mut count, mut bytes) = (0, 0);
        if self.is_adaptive() {
            let items = self.lfu.items();
            for (pos, item) in items.iter().enumerate() {
                let node = &self.nodes[item.node as usize];
                assert_eq!(node.kind, Kind::Shortcut);
                assert!(!node.absent, "a record of absence became a shortcut");
                assert_eq!(node.heap_pos as usize, pos);
                assert_eq!(node.hits, item.hits);
                assert_eq!(node.buf.len(), node.key_len as usize);
                if pos > 0 {
                    let parent = items[(pos - 1) / 2];
                    assert!((parent.hits, parent.tick) < (item.hits, item.tick));
                }
                count += 1;
                bytes += Self::entry_bytes(node);
            }
            assert_eq!(self.shortcut_lru.head, NIL);
        } else {
            let (mut prev, mut id) = (NIL, self.shortcut_lru.head);
            while id != NIL {
                let node = &self.nodes[id as usize];
                assert_eq!(node.kind, Kind::Shortcut);
                assert!(!node.absent, "a record of absence became a shortcut");
                assert_eq!(node.prev, prev);
                assert_eq!(node.buf.len(), node.key_len as usize);
                count += 1;
                bytes += Self::entry_bytes(node);
                prev = id;
                id = node.next;
            }
            assert_eq!(self.shortcut_lru.tail, prev);
            assert_eq!(self.lfu.len(), 0);
        }
        assert_eq!((count, bytes), (self.shortcut_count, self.shortcut_bytes));
        // The key table maps every placed entry's key to it, and only those.
        assert_eq!(self.table.len(), self.len());
        for &id in self.table.iter() {
            let node = &self.nodes[id as usize];
            assert!(matches!(node.kind, Kind::Value | Kind::Shortcut));
            assert_eq!(self.find(node.key()), Some(id));
        }
        // Every other slot is on the free list.
        let (mut free, mut id) = (0, self.free_head);
        while id != NIL {
            assert_eq!(self.nodes[id as usize].kind, Kind::Free);
            free += 1;
            id = self.nodes[id as usize].next;
        }
        assert_eq!(free + self.len(), self.nodes.len());
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
