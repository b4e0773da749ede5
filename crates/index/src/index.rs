//! The index as the memory node sees it: lock-free `get`, striped-lock writers, resize and reclamation.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use dinomo_log::{EntryRef, roots, tags};
use dinomo_pool::{Extent, Pool, PoolError};

use crate::layout::{
    BUCKET_LEN, BucketImage, CURRENT_OFFSET, CurrentWord, HEADER_LEN, HeaderError, IndexHeader,
    MAX_BUCKETS, MAX_TABLE_OFFSET, NEXT_OFFSET, OVERFLOW_CAPACITY_OFFSET, OVERFLOW_USED_OFFSET,
    SLOTS, TABLE_HEADER_LEN, TableHeader, bucket_index, overflow_offset, primary_offset,
    stored_hash, table_bytes,
};
use crate::{IndexConfig, IndexError, IndexStats};

/// Striped writer locks (a power of two).
const STRIPES: usize = 256;

/// How long a table that could not grow for lack of pool space is left as it is before growth is tried again.
const GROWTH_RETRY: Duration = Duration::from_secs(1);

/// The published table, as writers see it under the resize lock.
#[derive(Debug, Clone, Copy)]
struct Table {
    word: u64,
    offset: u64,
    nbuckets: u64,
    overflow_capacity: u64,
    generation: u64,
}

impl Table {
    fn bytes(&self) -> u64 {
        table_bytes(self.nbuckets, self.overflow_capacity)
    }
}

/// A replaced table waiting for its grace period.
#[derive(Debug)]
struct Retired {
    offset: u64,
    since: Instant,
}

/// Why a writer asks for a resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// The load would exceed `max_load`.
    Load,
    /// A chain needs an overflow bucket and the overflow area is full.
    Overflow,
}

/// The persistent hash index of a memory node. `Send + Sync`: share it between processor threads.
pub struct Index {
    pool: Arc<Pool>,
    header: u64,
    cfg: IndexConfig,
    /// Held shared by every write, exclusively by a resize.
    table: RwLock<Table>,
    stripes: Box<[Mutex<()>]>,
    entries: AtomicU64,
    resizes: AtomicU64,
    retired: Mutex<Vec<Retired>>,
    retired_count: AtomicUsize,
    /// The last failure to grow for lack of space: table word, when, bytes asked.
    growth_failure: Mutex<Option<(u64, Instant, u64)>>,
    /// Set when a simulated crash abandoned this instance: dropping it must not touch the pool.
    crashed: AtomicBool,
    /// Set once [`Index::free`] gave the index's extents back: nothing of the pool is this instance's any more.
    freed: AtomicBool,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("header", &self.header)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Index extents come from the top of the pool: a table doubles into one contiguous run, which the log segments
/// taken and freed at the bottom would break up.
fn pool_alloc(pool: &Pool, bytes: u64, tag: u16) -> Result<Extent, IndexError> {
    pool.alloc_bytes_high(bytes, tag).map_err(|e| match e {
        e @ PoolError::OutOfSpace { .. } => IndexError::OutOfSpace { bytes, source: e },
        e => IndexError::Pool(e),
    })
}

/// Builds a complete table with `nbuckets` primary buckets holding `live` (`(hash, value)` pairs, each key once),
/// writes it into a fresh extent and persists it. Nothing points to it yet, so plain writes are fine.
fn build_table(
    pool: &Pool,
    owner: u64,
    overflow_per_bucket: f64,
    nbuckets: u64,
    generation: u64,
    live: &mut [(u64, u64)],
) -> Result<Table, IndexError> {
    // Group by new bucket, keeping chain order within a bucket.
    live.sort_by_key(|&(h, _)| bucket_index(h, nbuckets));
    let chains =
        || live.chunk_by(|a, b| bucket_index(a.0, nbuckets) == bucket_index(b.0, nbuckets));
    let need: u64 = chains()
        .map(|c| (c.len() as u64).div_ceil(SLOTS as u64) - 1)
        .sum();
    let spare = ((nbuckets as f64 * overflow_per_bucket).ceil() as u64)
        .max(need)
        .max(1);
    let capacity = need + spare;
    let bytes = table_bytes(nbuckets, capacity);
    let extent = pool_alloc(pool, bytes, tags::INDEX_TABLE)?;
    if extent.offset > MAX_TABLE_OFFSET {
        let _ = pool.free(extent.offset);
        return Err(IndexError::InvalidConfig(format!(
            "table at pool offset {:#x} is beyond what the index can address",
            extent.offset
        )));
    }
    let written = (|| -> Result<(), PoolError> {
        // Zero everything (the pool does not), then write the header and the non-empty buckets.
        let zeros = vec![0u8; (bytes as usize).min(1 << 20)];
        let mut at = 0;
        while at < bytes {
            let n = (bytes - at).min(zeros.len() as u64);
            pool.write(extent.offset + at, &zeros[..n as usize])?;
            at += n;
        }
        let mut used = 0u64;
        for chain in chains() {
            let b = bucket_index(chain[0].0, nbuckets);
            let mut bucket = primary_offset(extent.offset, b);
            let mut pieces = chain.chunks(SLOTS).peekable();
            while let Some(piece) = pieces.next() {
                let mut img = [0u8; BUCKET_LEN as usize];
                for (i, &(h, v)) in piece.iter().enumerate() {
                    img[16 * i..16 * i + 8].copy_from_slice(&h.to_le_bytes());
                    img[16 * i + 8..16 * i + 16].copy_from_slice(&v.to_le_bytes());
                }
                let next = pieces.peek().map(|_| used + 1).unwrap_or(0);
                img[NEXT_OFFSET as usize..NEXT_OFFSET as usize + 8]
                    .copy_from_slice(&next.to_le_bytes());
                pool.write(bucket, &img)?;
                if next != 0 {
                    used = next;
                    bucket = overflow_offset(extent.offset, nbuckets, next);
                }
            }
        }
        debug_assert_eq!(used, need);
        let header = TableHeader {
            nbuckets,
            overflow_capacity: capacity,
            overflow_used: used,
            generation,
            owner,
        };
        pool.write(extent.offset, &header.encode())
    })();
    if let Err(e) = written {
        let _ = pool.free(extent.offset);
        return Err(e.into());
    }
    persist(pool, extent.offset, bytes);
    let word = CurrentWord {
        table: extent.offset,
        nbuckets,
        generation: generation as u16,
    }
    .pack();
    Ok(Table {
        word,
        offset: extent.offset,
        nbuckets,
        overflow_capacity: capacity,
        generation,
    })
}

/// Every persist of the index goes through here, so that tests can simulate a crash at each one.
fn persist(pool: &Pool, offset: u64, len: u64) {
    #[cfg(test)]
    crash_point::hit();
    pool.persist(offset, len);
}

/// Frees index extents that nothing points to: every `INDEX_TABLE` extent but `keep_table`, every `INDEX_HEADER`
/// extent but `keep_header`.
fn free_strays(pool: &Pool, extents: &[Extent], keep_header: u64, keep_table: u64) -> usize {
    let mut freed = 0;
    for e in extents {
        let stray = (e.tag == tags::INDEX_TABLE && e.offset != keep_table)
            || (e.tag == tags::INDEX_HEADER && e.offset != keep_header);
        if stray {
            match pool.free(e.offset) {
                Ok(()) => {
                    freed += 1;
                    tracing::info!(offset = e.offset, tag = e.tag, "freed stray index extent");
                }
                Err(err) => {
                    tracing::warn!(offset = e.offset, error = %err, "could not free stray index extent")
                }
            }
        }
    }
    freed
}

/// Where the pool records an index's header: the word that names it. Most pools have one index, in root slot
/// [`roots::INDEX`]; a pool partitioned per KV node keeps one index per node, each named by a word of the
/// partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// A root slot of the pool.
    Root(usize),
    /// An 8-byte aligned word in the pool's data area.
    Word(u64),
}

impl Anchor {
    fn load(self, pool: &Pool) -> Result<u64, PoolError> {
        match self {
            Anchor::Root(slot) => pool.root(slot),
            Anchor::Word(offset) => Ok(pool.atomic_u64(offset)?.load(Ordering::Acquire)),
        }
    }

    /// Stores `new` if the word holds `expected` (persisted); returns what it held.
    fn compare_and_set(self, pool: &Pool, expected: u64, new: u64) -> Result<u64, PoolError> {
        match self {
            Anchor::Root(slot) => pool.cas_root(slot, expected, new),
            Anchor::Word(offset) => {
                let prev = match pool.atomic_u64(offset)?.compare_exchange(
                    expected,
                    new,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(v) | Err(v) => v,
                };
                if prev == expected {
                    persist(pool, offset, 8);
                }
                Ok(prev)
            }
        }
    }
}

/// Frees every index extent of `pool` that none of the `live` indexes uses: a pool that holds several indexes
/// ([`Anchor::Word`]) calls it once all of them are open, in place of the cleanup [`Index::open`] does for a
/// pool's only index. `live` lists each open index's [`Index::header_offset`] and current table
/// ([`Index::current`]). Returns how many extents were freed.
pub fn free_unreferenced(pool: &Pool, live: &[&Index]) -> usize {
    let keep: std::collections::HashSet<u64> = live
        .iter()
        .flat_map(|i| [i.header_offset(), i.current().table])
        .collect();
    let mut freed = 0;
    for e in pool.allocated() {
        let index_extent = e.tag == tags::INDEX_TABLE || e.tag == tags::INDEX_HEADER;
        if !index_extent || keep.contains(&e.offset) {
            continue;
        }
        match pool.free(e.offset) {
            Ok(()) => {
                freed += 1;
                tracing::info!(offset = e.offset, tag = e.tag, "freed stray index extent");
            }
            Err(err) => {
                tracing::warn!(offset = e.offset, error = %err, "could not free stray index extent")
            }
        }
    }
    freed
}

impl Index {
    /// Creates an empty index in `pool` and records it in root slot [`roots::INDEX`]. Fails when the slot is
    /// already set. Index extents left by an interrupted creation are freed first.
    pub fn create(pool: Arc<Pool>, cfg: &IndexConfig) -> Result<Index, IndexError> {
        Index::create_anchored(pool, cfg, Anchor::Root(roots::INDEX), true)
    }

    /// Creates an empty index in `pool` and records it in `anchor`, which must hold 0. Unlike [`Index::create`]
    /// it leaves other index extents alone: the pool may hold other indexes (see [`free_unreferenced`]).
    pub fn create_at(
        pool: Arc<Pool>,
        cfg: &IndexConfig,
        anchor: Anchor,
    ) -> Result<Index, IndexError> {
        Index::create_anchored(pool, cfg, anchor, false)
    }

    fn create_anchored(
        pool: Arc<Pool>,
        cfg: &IndexConfig,
        anchor: Anchor,
        only_index: bool,
    ) -> Result<Index, IndexError> {
        cfg.validate()?;
        let root = anchor.load(&pool)?;
        if root != 0 {
            return Err(IndexError::AlreadyExists(root));
        }
        if only_index {
            free_strays(&pool, &pool.allocated(), 0, 0);
        }
        let header_ext = pool_alloc(&pool, HEADER_LEN, tags::INDEX_HEADER)?;
        let header = header_ext.offset;
        let table = match build_table(
            &pool,
            header,
            cfg.overflow_per_bucket,
            cfg.initial_buckets,
            1,
            &mut [],
        ) {
            Ok(t) => t,
            Err(e) => {
                let _ = pool.free(header);
                return Err(e);
            }
        };
        let bytes = IndexHeader {
            initial_buckets: cfg.initial_buckets,
            max_load: cfg.max_load,
            overflow_per_bucket: cfg.overflow_per_bucket,
        }
        .encode(table.word);
        pool.write(header, &bytes)?;
        persist(&pool, header, HEADER_LEN);
        let prev = anchor.compare_and_set(&pool, 0, header)?;
        if prev != 0 {
            let _ = pool.free(table.offset);
            let _ = pool.free(header);
            return Err(IndexError::AlreadyExists(prev));
        }
        tracing::info!(
            header,
            table = table.offset,
            buckets = table.nbuckets,
            "created index"
        );
        Ok(Index::assemble(pool, header, cfg.clone(), table, 0))
    }

    /// Opens the index recorded in root slot [`roots::INDEX`]: validates the header, the current table and every
    /// chain, then frees index extents that are not current (an interrupted resize, tables retired before a
    /// restart). A damaged index is refused with a clear error before anything is changed.
    pub fn open(pool: Arc<Pool>, cfg: &IndexConfig) -> Result<Index, IndexError> {
        Index::open_anchored(pool, cfg, Anchor::Root(roots::INDEX), true)
    }

    /// Opens the index recorded in `anchor`, validated as [`Index::open`] does, but leaves every other index
    /// extent alone: the pool may hold other indexes (see [`free_unreferenced`]).
    pub fn open_at(
        pool: Arc<Pool>,
        cfg: &IndexConfig,
        anchor: Anchor,
    ) -> Result<Index, IndexError> {
        Index::open_anchored(pool, cfg, anchor, false)
    }

    fn open_anchored(
        pool: Arc<Pool>,
        cfg: &IndexConfig,
        anchor: Anchor,
        only_index: bool,
    ) -> Result<Index, IndexError> {
        cfg.validate()?;
        let header = anchor.load(&pool)?;
        if header == 0 {
            return Err(IndexError::NotFound);
        }
        let bad_header = |reason: String| IndexError::CorruptHeader {
            offset: header,
            reason,
        };
        let extents = pool.allocated();
        match extents.iter().find(|e| e.offset == header) {
            Some(e) if e.tag == tags::INDEX_HEADER && e.len >= HEADER_LEN => {}
            Some(e) => {
                return Err(bad_header(format!(
                    "the root slot points to an extent tagged {:#x} of {} bytes, not an index header",
                    e.tag, e.len
                )));
            }
            None => {
                return Err(bad_header(
                    "the root slot points to no allocated extent".into(),
                ));
            }
        }
        let mut hb = [0u8; HEADER_LEN as usize];
        pool.read(header, &mut hb)?;
        let (settings, word) = IndexHeader::decode(&hb).map_err(|e| match e {
            HeaderError::Version(found) => IndexError::UnsupportedVersion { found },
            HeaderError::Corrupt(reason) => bad_header(reason),
        })?;
        let cw = CurrentWord::unpack(word).expect("decode checked the current word");
        let bad_table = |reason: String| IndexError::CorruptTable {
            offset: cw.table,
            reason,
        };
        let table_ext = match extents.iter().find(|e| e.offset == cw.table) {
            Some(e) if e.tag == tags::INDEX_TABLE => *e,
            _ => {
                return Err(bad_table(
                    "the current word names no INDEX_TABLE extent".into(),
                ));
            }
        };
        let mut tb = [0u8; TABLE_HEADER_LEN as usize];
        pool.read(cw.table, &mut tb)?;
        let th = TableHeader::decode(&tb, cw, header).map_err(bad_table)?;
        if table_bytes(th.nbuckets, th.overflow_capacity) > table_ext.len {
            return Err(bad_table(format!(
                "{} buckets and {} overflow buckets do not fit in an extent of {} bytes",
                th.nbuckets, th.overflow_capacity, table_ext.len
            )));
        }
        if th.overflow_used > th.overflow_capacity {
            return Err(bad_table(format!(
                "{} overflow buckets used of {}",
                th.overflow_used, th.overflow_capacity
            )));
        }
        let table = Table {
            word,
            offset: cw.table,
            nbuckets: th.nbuckets,
            overflow_capacity: th.overflow_capacity,
            generation: th.generation,
        };
        let entries = Index::check_chains(&pool, &table, th.overflow_used).map_err(bad_table)?;
        if settings.max_load != cfg.max_load
            || settings.overflow_per_bucket != cfg.overflow_per_bucket
        {
            tracing::debug!(
                ?settings,
                max_load = cfg.max_load,
                overflow_per_bucket = cfg.overflow_per_bucket,
                "index opened with settings other than those it was created with"
            );
        }
        // Validation is complete: from here on the pool may be changed.
        let freed = if only_index {
            free_strays(&pool, &extents, header, cw.table)
        } else {
            0
        };
        tracing::info!(
            header,
            table = cw.table,
            buckets = th.nbuckets,
            entries,
            freed,
            "opened index"
        );
        Ok(Index::assemble(pool, header, cfg.clone(), table, entries))
    }

    /// Opens the index, or creates one when root slot [`roots::INDEX`] is 0.
    pub fn open_or_create(pool: Arc<Pool>, cfg: &IndexConfig) -> Result<Index, IndexError> {
        if pool.root(roots::INDEX)? == 0 {
            Index::create(pool, cfg)
        } else {
            Index::open(pool, cfg)
        }
    }

    fn assemble(
        pool: Arc<Pool>,
        header: u64,
        cfg: IndexConfig,
        table: Table,
        entries: u64,
    ) -> Index {
        Index {
            pool,
            header,
            cfg,
            table: RwLock::new(table),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            entries: AtomicU64::new(entries),
            resizes: AtomicU64::new(0),
            retired: Mutex::new(Vec::new()),
            retired_count: AtomicUsize::new(0),
            growth_failure: Mutex::new(None),
            crashed: AtomicBool::new(false),
            freed: AtomicBool::new(false),
        }
    }

    /// Walks every chain of `t`: each `next` must name a handed-out overflow bucket that no other bucket names.
    /// Returns the number of live slots.
    fn check_chains(pool: &Pool, t: &Table, used: u64) -> Result<u64, String> {
        let mut seen = vec![false; used as usize + 1];
        let mut entries = 0u64;
        for b in 0..t.nbuckets {
            let mut bucket = primary_offset(t.offset, b);
            loop {
                let img = snapshot(pool, bucket).ok_or("bucket outside the pool")?;
                entries += img.slots.iter().filter(|&&(h, v)| h != 0 && v != 0).count() as u64;
                match img.next {
                    0 => break,
                    k if k > used => {
                        return Err(format!(
                            "chain of bucket {b} names overflow bucket {k}, only {used} are in use"
                        ));
                    }
                    k if seen[k as usize] => {
                        return Err(format!(
                            "overflow bucket {k} is reached twice (chain of bucket {b})"
                        ));
                    }
                    k => {
                        seen[k as usize] = true;
                        bucket = overflow_offset(t.offset, t.nbuckets, k);
                    }
                }
            }
        }
        Ok(entries)
    }

    /// Pool offset of the index header (the value of root slot [`roots::INDEX`]).
    pub fn header_offset(&self) -> u64 {
        self.header
    }

    /// The settings in force.
    pub fn config(&self) -> &IndexConfig {
        &self.cfg
    }

    /// The published table, as stored in the header's `current` word.
    pub fn current(&self) -> CurrentWord {
        CurrentWord::unpack(self.current_word().load(Ordering::Acquire))
            .expect("the current word always names a table")
    }

    fn current_word(&self) -> &AtomicU64 {
        self.word(self.header + CURRENT_OFFSET)
    }

    /// A word of the validated index. Offsets come from the header and tables checked at open or built here.
    fn word(&self, offset: u64) -> &AtomicU64 {
        self.pool
            .atomic_u64(offset)
            .expect("index words lie inside the pool")
    }

    fn read_table(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn stripe(&self, bucket: u64) -> std::sync::MutexGuard<'_, ()> {
        self.stripes[bucket as usize & (STRIPES - 1)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The bucket after `bucket` in a chain of `t` (writers and holders of the resize lock only).
    fn next_bucket(&self, t: &Table, bucket: u64) -> Option<u64> {
        match self.word(bucket + NEXT_OFFSET).load(Ordering::Acquire) {
            0 => None,
            k if k <= t.overflow_capacity => Some(overflow_offset(t.offset, t.nbuckets, k)),
            k => {
                tracing::error!(
                    bucket,
                    next = k,
                    "index chain names an overflow bucket beyond the table"
                );
                None
            }
        }
    }

    /// Looks `hash` up without locking: returns the first live entry of the chain whose hash matches and for which
    /// `key_matches` (the caller's full-key comparison) holds.
    pub fn get(
        &self,
        hash: u64,
        mut key_matches: impl FnMut(EntryRef) -> bool,
    ) -> Option<EntryRef> {
        let hash = stored_hash(hash);
        let current = self.current_word();
        'restart: loop {
            let w = current.load(Ordering::Acquire);
            let cw = CurrentWord::unpack(w)?;
            let mut bucket = primary_offset(cw.table, bucket_index(hash, cw.nbuckets));
            let mut capacity: Option<u64> = None;
            let mut hops = 0u64;
            loop {
                // Acquire loads of the bucket, then the check of `current`: see the crate documentation.
                let img = snapshot(&self.pool, bucket);
                if current.load(Ordering::Acquire) != w {
                    continue 'restart;
                }
                let img = img?;
                for (h, v) in img.slots {
                    if h == hash
                        && let Some(r) = EntryRef::from_raw(v)
                        && key_matches(r)
                    {
                        return Some(r);
                    }
                }
                if img.next == 0 {
                    return None;
                }
                let cap = match capacity {
                    Some(c) => c,
                    None => {
                        let c = self
                            .word(cw.table + OVERFLOW_CAPACITY_OFFSET)
                            .load(Ordering::Acquire);
                        if current.load(Ordering::Acquire) != w {
                            continue 'restart;
                        }
                        capacity = Some(c);
                        c
                    }
                };
                if img.next > cap || hops >= cap {
                    tracing::error!(bucket, next = img.next, "index chain cannot be followed");
                    return None;
                }
                hops += 1;
                bucket = overflow_offset(cw.table, cw.nbuckets, img.next);
            }
        }
    }

    /// Inserts or replaces the entry of a key: the first live slot of the chain with this hash for which
    /// `key_matches` holds gets `new` (one atomic store) and its previous reference is returned; otherwise `new`
    /// is inserted. Errors only when the pool has no room for a bigger table.
    pub fn upsert(
        &self,
        hash: u64,
        new: EntryRef,
        mut key_matches: impl FnMut(EntryRef) -> bool,
    ) -> Result<Option<EntryRef>, IndexError> {
        if new.is_null() {
            return Err(IndexError::NullRef);
        }
        let hash = stored_hash(hash);
        let mut load_resize_failed = false;
        loop {
            self.maybe_reclaim();
            let guard = self.read_table();
            let t = *guard;
            let b = bucket_index(hash, t.nbuckets);
            let stripe = self.stripe(b);
            let mut bucket = primary_offset(t.offset, b);
            let mut free_slot = None;
            let last = loop {
                for i in 0..SLOTS as u64 {
                    let s = bucket + 16 * i;
                    let h = self.word(s).load(Ordering::Acquire);
                    let v = self.word(s + 8).load(Ordering::Acquire);
                    if h == hash
                        && let Some(old) = EntryRef::from_raw(v)
                    {
                        if key_matches(old) {
                            self.word(s + 8).store(new.raw(), Ordering::Release);
                            persist(&self.pool, s + 8, 8);
                            return Ok(Some(old));
                        }
                    } else if (h == 0 || v == 0) && free_slot.is_none() {
                        free_slot = Some(s);
                    }
                }
                match self.next_bucket(&t, bucket) {
                    Some(n) => bucket = n,
                    None => break bucket,
                }
            };
            if !load_resize_failed
                && t.nbuckets < MAX_BUCKETS
                && self.over_load(t.nbuckets, self.len() + 1)
            {
                drop(stripe);
                drop(guard);
                match self.grow(t.word, Trigger::Load) {
                    Ok(()) => {}
                    Err(IndexError::OutOfSpace { .. }) => {
                        // Logged by the growth that failed; later inserts within its retry pause fail here at once.
                        load_resize_failed = true;
                    }
                    Err(e) => return Err(e),
                }
                continue;
            }
            if let Some(s) = free_slot {
                self.fill_slot(s, hash, new);
            } else if let Some(k) = self.take_overflow(&t) {
                self.fill_slot(overflow_offset(t.offset, t.nbuckets, k), hash, new);
                // Linking publishes the filled bucket.
                self.word(last + NEXT_OFFSET).store(k, Ordering::Release);
                persist(&self.pool, last + NEXT_OFFSET, 8);
            } else {
                drop(stripe);
                drop(guard);
                self.grow(t.word, Trigger::Overflow)?;
                continue;
            }
            self.entries.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
    }

    /// Removes the entry of a key: the first live slot with this hash for which `key_matches` holds is cleared and
    /// its reference returned.
    pub fn remove(&self, hash: u64, key_matches: impl FnMut(EntryRef) -> bool) -> Option<EntryRef> {
        // The count changes under the table's read lock, as the slot does: a resize counts while it holds it.
        self.change_slot(hash, key_matches, |s| {
            self.word(s).store(0, Ordering::Release);
            persist(&self.pool, s, 8);
            self.word(s + 8).store(0, Ordering::Release);
            persist(&self.pool, s + 8, 8);
            self.entries.fetch_sub(1, Ordering::Relaxed);
        })
    }

    /// Moves a key's entry: the live slot with this hash holding exactly `old` gets `new` (one atomic store), and
    /// `true` is returned; `false` when no slot holds `old` any more (the key was written, deleted or moved since
    /// `old` was read) and nothing changed. Never inserts, so it needs no room. The log cleaner's move.
    pub fn replace(&self, hash: u64, old: EntryRef, new: EntryRef) -> Result<bool, IndexError> {
        self.replace_if(hash, old, new, || true)
    }

    /// [`Index::replace`], moving the slot only if `still_old` also holds, asked under the bucket's stripe lock once
    /// a slot holding `old` is found: nothing else changes the slot meanwhile. For a caller that read the entry at
    /// `old` a while ago, when its extent may have been freed and written again since, and a slot named `old` anew
    /// (`still_old` then reads the entry's identity again).
    pub fn replace_if(
        &self,
        hash: u64,
        old: EntryRef,
        new: EntryRef,
        mut still_old: impl FnMut() -> bool,
    ) -> Result<bool, IndexError> {
        if new.is_null() {
            return Err(IndexError::NullRef);
        }
        let moved = self.change_slot(
            hash,
            |c| c == old && still_old(),
            |s| {
                self.word(s + 8).store(new.raw(), Ordering::Release);
                persist(&self.pool, s + 8, 8);
            },
        );
        Ok(moved.is_some())
    }

    /// Under the bucket's stripe lock, finds the first live slot of `hash`'s chain whose reference `matches`, hands
    /// its offset to `change`, and returns the reference it held.
    fn change_slot(
        &self,
        hash: u64,
        mut matches: impl FnMut(EntryRef) -> bool,
        change: impl FnOnce(u64),
    ) -> Option<EntryRef> {
        self.maybe_reclaim();
        let hash = stored_hash(hash);
        let guard = self.read_table();
        let t = *guard;
        let b = bucket_index(hash, t.nbuckets);
        let _stripe = self.stripe(b);
        let mut bucket = Some(primary_offset(t.offset, b));
        while let Some(cur) = bucket {
            for i in 0..SLOTS as u64 {
                let s = cur + 16 * i;
                if self.word(s).load(Ordering::Acquire) != hash {
                    continue;
                }
                if let Some(old) = EntryRef::from_raw(self.word(s + 8).load(Ordering::Acquire))
                    && matches(old)
                {
                    change(s);
                    return Some(old);
                }
            }
            bucket = self.next_bucket(&t, cur);
        }
        None
    }

    /// Writes `(hash, value)` into the empty slot at `s`: value first, hash last (the hash commits the slot).
    fn fill_slot(&self, s: u64, hash: u64, value: EntryRef) {
        let hw = self.word(s);
        if hw.load(Ordering::Acquire) != 0 {
            // A hash left with a null value: clear it so that no reader pairs it with the new value.
            hw.store(0, Ordering::Release);
            persist(&self.pool, s, 8);
        }
        self.word(s + 8).store(value.raw(), Ordering::Release);
        persist(&self.pool, s + 8, 8);
        hw.store(hash, Ordering::Release);
        persist(&self.pool, s, 8);
    }

    /// Hands out the next overflow bucket of `t` (1-based), or `None` when the overflow area is full. The bump is
    /// persisted before the bucket is used, so a crash can only leak the bucket, never hand it out twice.
    fn take_overflow(&self, t: &Table) -> Option<u64> {
        let at = t.offset + OVERFLOW_USED_OFFSET;
        let used = self.word(at);
        let mut cur = used.load(Ordering::Acquire);
        loop {
            if cur >= t.overflow_capacity {
                return None;
            }
            match used.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    persist(&self.pool, at, 8);
                    return Some(cur + 1);
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Whether the table is close to its load limit (within an eighth of it). Below that, uniformly hashed keys
    /// leave most overflow buckets unused too, so the load is what counts.
    fn near_load(&self, t: &Table) -> bool {
        let entries = self.len();
        t.nbuckets < MAX_BUCKETS && self.over_load(t.nbuckets, entries + entries / 8)
    }

    /// Whether new keys may still be let in: `Err(OutOfSpace)` when the table is close to its load limit and
    /// cannot grow (a growth of this table failed for lack of space, or the pool lacks the bytes of the next
    /// table). The processor asks before each log segment it grants for writes, so that the slots left stay for
    /// writes already logged; deletes free more. Usually cheap: the table grows here only when its last growth
    /// failed at least [`GROWTH_RETRY`] ago. Nothing else may retry it then: the merges that call
    /// [`Index::grow_early`] follow grants, and this refuses them.
    pub fn check_room(&self) -> Result<(), IndexError> {
        let t = *self.read_table();
        if !self.near_load(&t) {
            return Ok(());
        }
        let least = self.least_growth(t.nbuckets * 2);
        match self.growth_failure_of(t.word) {
            // Refused at once within the retry pause; tried again after it.
            Some(_) => self.grow(t.word, Trigger::Load),
            None if !self.has_room_for(least) => Err(self.out_of_space(least)),
            None => Ok(()),
        }
    }

    /// Whether the pool has `bytes` free, once retired tables are freed if it has not.
    fn has_room_for(&self, bytes: u64) -> bool {
        self.pool.space().free_bytes() >= bytes
            || (self.reclaim_retired_now() > 0 && self.pool.space().free_bytes() >= bytes)
    }

    /// Grows the table if it is close to its load limit, ahead of the inserts that would grow it at the limit,
    /// so that a failure to grow is known while slots are left (see [`Index::check_room`]). Attempts that fail
    /// are repeated at most every [`GROWTH_RETRY`]. The processor's merge threads call this after merging.
    pub fn grow_early(&self) -> Result<(), IndexError> {
        let t = *self.read_table();
        if !self.near_load(&t) {
            return Ok(());
        }
        self.grow(t.word, Trigger::Load)
    }

    /// The bytes the current table's last growth could not find in the pool, when it failed (at any time since:
    /// a table that grows is a new table).
    pub fn blocked_growth(&self) -> Option<u64> {
        let word = self.current_word().load(Ordering::Acquire);
        self.growth_failure_of(word).map(|(_, bytes)| bytes)
    }

    /// Grows the table now if it is close to its load limit, even within the pause after a failed growth: for a
    /// caller that has just made room for it.
    pub fn grow_now(&self) -> Result<(), IndexError> {
        *self
            .growth_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        self.grow_early()
    }

    /// Bytes of the smallest table of `nbuckets` primary buckets.
    fn least_growth(&self, nbuckets: u64) -> u64 {
        let nbuckets = nbuckets.min(MAX_BUCKETS);
        table_bytes(
            nbuckets,
            ((nbuckets as f64 * self.cfg.overflow_per_bucket).ceil() as u64).max(1),
        )
    }

    fn over_load(&self, nbuckets: u64, entries: u64) -> bool {
        entries as f64 > self.cfg.max_load * (nbuckets * SLOTS as u64) as f64
    }

    /// After a table could not grow for lack of space, further attempts on the same table are refused at once
    /// for [`GROWTH_RETRY`] (so that a full pool does not cost a table walk per insert). Returns the size that did
    /// not fit.
    fn growth_blocked(&self, word: u64) -> Option<u64> {
        self.growth_failure_of(word)
            .filter(|(at, _)| at.elapsed() < GROWTH_RETRY)
            .map(|(_, bytes)| bytes)
    }

    /// When the table named by `word` last failed to grow, and the size that did not fit.
    fn growth_failure_of(&self, word: u64) -> Option<(Instant, u64)> {
        self.growth_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .filter(|&(w, _, _)| w == word)
            .map(|(_, at, bytes)| (at, bytes))
    }

    /// Records a failed growth of the table named by `word` (logged here: once per attempt, not once per insert
    /// that meets the blocked table afterwards).
    fn block_growth(&self, word: u64, bytes: u64) {
        tracing::warn!(
            bytes,
            retry_after = ?GROWTH_RETRY,
            "index cannot grow for lack of pool space; filling the current table"
        );
        *self
            .growth_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((word, Instant::now(), bytes));
    }

    fn out_of_space(&self, bytes: u64) -> IndexError {
        let space = self.pool.space();
        IndexError::OutOfSpace {
            bytes,
            source: PoolError::OutOfSpace {
                wanted: bytes.div_ceil(space.segment_size),
                free: space.free_segments,
            },
        }
    }

    /// Replaces the table named by `expected` (unless another writer already did) with a bigger one.
    fn grow(&self, expected: u64, trigger: Trigger) -> Result<(), IndexError> {
        if let Some(bytes) = self.growth_blocked(expected) {
            return Err(self.out_of_space(bytes));
        }
        let mut guard = self.table.write().unwrap_or_else(|e| e.into_inner());
        if guard.word != expected {
            return Ok(());
        }
        let old = *guard;
        // No writer runs now, so the entry counter is exact.
        let entries = self.len();
        let mut nbuckets = old.nbuckets;
        let crowded = entries as f64 >= self.cfg.max_load / 2.0 * (nbuckets * SLOTS as u64) as f64;
        if trigger == Trigger::Load || crowded {
            nbuckets *= 2;
        }
        while self.over_load(nbuckets, entries + 1) && nbuckets < MAX_BUCKETS {
            nbuckets *= 2;
        }
        let nbuckets = nbuckets.min(MAX_BUCKETS);
        // Fail fast, before walking the table, when the smallest possible new table cannot fit.
        let least = self.least_growth(nbuckets);
        if !self.has_room_for(least) {
            self.block_growth(expected, least);
            return Err(self.out_of_space(least));
        }
        let mut live = Vec::with_capacity(entries as usize);
        for b in 0..old.nbuckets {
            let mut bucket = Some(primary_offset(old.offset, b));
            while let Some(cur) = bucket {
                let img = snapshot(&self.pool, cur).expect("index buckets lie inside the pool");
                live.extend(img.slots.iter().filter(|&&(h, v)| h != 0 && v != 0));
                bucket = self.next_bucket(&old, cur);
            }
        }
        let entries = live.len() as u64;
        let build = |live: &mut [(u64, u64)]| {
            build_table(
                &self.pool,
                self.header,
                self.cfg.overflow_per_bucket,
                nbuckets,
                old.generation + 1,
                live,
            )
        };
        let built = match build(&mut live) {
            // The free bytes were there but not in one piece: freeing retired tables may join them.
            Err(IndexError::OutOfSpace { .. }) if self.reclaim_retired_now() > 0 => {
                build(&mut live)
            }
            built => built,
        };
        let new = match built {
            Ok(t) => t,
            Err(e) => {
                if let IndexError::OutOfSpace { bytes, .. } = e {
                    self.block_growth(expected, bytes);
                }
                return Err(e);
            }
        };
        // Publish: one atomic store of `current`, persisted.
        self.current_word().store(new.word, Ordering::Release);
        persist(&self.pool, self.header + CURRENT_OFFSET, 8);
        *guard = new;
        self.entries.store(entries, Ordering::Relaxed);
        self.resizes.fetch_add(1, Ordering::Relaxed);
        {
            let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            retired.push(Retired {
                offset: old.offset,
                since: Instant::now(),
            });
            self.retired_count.store(retired.len(), Ordering::Relaxed);
        }
        drop(guard);
        tracing::debug!(
            ?trigger,
            from = old.nbuckets,
            to = new.nbuckets,
            overflow = new.overflow_capacity,
            entries,
            generation = new.generation,
            "index resized"
        );
        self.reclaim_retired();
        Ok(())
    }

    /// Number of live entries.
    pub fn len(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// True when the index holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f(hash, ref)` for every live entry. Used at recovery (for example to rebuild per-segment live counts).
    /// Writes by other threads during the walk may or may not be seen; `f` must not write to this index.
    pub fn for_each(&self, mut f: impl FnMut(u64, EntryRef)) {
        self.for_each_placed(|h, r, _| f(h, r));
    }

    /// Like [`Index::for_each`], and tells for each entry whether it lies in the chain of its hash's bucket. One
    /// that does not (its hash word was damaged, or the entry was written into the wrong chain) is invisible to
    /// lookups: the pool checker reports it.
    pub fn for_each_placed(&self, mut f: impl FnMut(u64, EntryRef, bool)) {
        let guard = self.read_table();
        let t = *guard;
        for b in 0..t.nbuckets {
            self.for_each_in_chain(&t, b, |h, r| f(h, r, bucket_index(h, t.nbuckets) == b));
        }
    }

    /// Calls `f(hash, ref)` for every live slot of the chain of primary bucket `b` of `t` (a table the caller holds
    /// the resize lock's read side for).
    fn for_each_in_chain(&self, t: &Table, b: u64, mut f: impl FnMut(u64, EntryRef)) {
        let mut bucket = Some(primary_offset(t.offset, b));
        while let Some(cur) = bucket {
            let img = snapshot(&self.pool, cur).expect("index buckets lie inside the pool");
            for (h, v) in img.slots {
                if h != 0
                    && let Some(r) = EntryRef::from_raw(v)
                {
                    f(h, r);
                }
            }
            bucket = self.next_bucket(t, cur);
        }
    }

    /// Calls `f(hash, ref)` for every live entry whose hash lies in `slice` of a table of `2^bits` buckets: whose
    /// bucket there would be `slice`. A table of this index with more buckets is walked over each of its buckets
    /// that split from `slice`; one with fewer, over the one bucket `slice` merges into, keeping its entries of
    /// `slice` only. Bits of `slice` above `bits` are ignored. As a bucket's hashes are the low bits of the mixed
    /// hash, slices are stable under resizing, which is what lets a cursor walk an index that grows meanwhile
    /// (`SCAN`). The table cannot be replaced during the walk; writes to it may or may not be seen. `f` must not
    /// write to this index.
    pub fn for_each_in_slice(&self, slice: u64, bits: u32, mut f: impl FnMut(u64, EntryRef)) {
        let guard = self.read_table();
        let t = *guard;
        let slices = 1u64.checked_shl(bits).unwrap_or(0);
        // A cursor's bits above the resolution are not part of its slice.
        let slice = slice & slices.wrapping_sub(1);
        let in_slice = |h: u64| slices == 0 || bucket_index(h, slices) == slice;
        let (first, step, count) = if slices != 0 && t.nbuckets >= slices {
            (slice, slices, t.nbuckets / slices)
        } else {
            (slice & (t.nbuckets - 1), 1, 1)
        };
        for k in 0..count {
            self.for_each_in_chain(&t, first + k * step, |h, r| {
                if in_slice(h) {
                    f(h, r);
                }
            });
        }
    }

    /// The number of buckets of the published table, as a power of two.
    pub fn bucket_bits(&self) -> u32 {
        self.read_table().nbuckets.trailing_zeros()
    }

    /// Geometry and counters.
    pub fn stats(&self) -> IndexStats {
        if self.freed.load(Ordering::Acquire) {
            return IndexStats::default();
        }
        let t = *self.read_table();
        IndexStats {
            buckets: t.nbuckets,
            overflow_used: self
                .word(t.offset + OVERFLOW_USED_OFFSET)
                .load(Ordering::Acquire),
            overflow_capacity: t.overflow_capacity,
            entries: self.len(),
            resizes: self.resizes.load(Ordering::Relaxed),
            table_bytes: t.bytes(),
            retired_tables: self.retired_count.load(Ordering::Relaxed),
            generation: t.generation,
        }
    }

    /// Frees the retired tables whose grace period has passed; returns how many. Also done opportunistically by
    /// writers.
    pub fn reclaim_retired(&self) -> usize {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        self.reclaim_locked(&mut retired)
    }

    /// Frees every retired table at once, grace or not; returns how many. For a pool out of space: a table is
    /// never read once it stopped being current, because every lookup checks `current` after each bucket it reads
    /// (see the crate documentation), so the grace only spares lookups under way a restart they must make anyway.
    pub fn reclaim_retired_now(&self) -> usize {
        if self.retired_count.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        self.reclaim_where(&mut retired, |_| true)
    }

    fn maybe_reclaim(&self) {
        if self.retired_count.load(Ordering::Relaxed) > 0
            && let Ok(mut retired) = self.retired.try_lock()
        {
            self.reclaim_locked(&mut retired);
        }
    }

    fn reclaim_locked(&self, retired: &mut Vec<Retired>) -> usize {
        let grace = self.cfg.retire_grace;
        let now = Instant::now();
        self.reclaim_where(retired, |r| now.duration_since(r.since) >= grace)
    }

    /// Frees the retired tables `due` picks, never the current one; returns how many.
    fn reclaim_where(&self, retired: &mut Vec<Retired>, due: impl Fn(&Retired) -> bool) -> usize {
        if retired.is_empty() {
            return 0;
        }
        let current = self.current().table;
        let mut freed = 0;
        retired.retain(|r| {
            if r.offset == current || !due(r) {
                return true;
            }
            match self.pool.free(r.offset) {
                Ok(()) => freed += 1,
                Err(e) => {
                    tracing::warn!(offset = r.offset, error = %e, "could not free a retired index table")
                }
            }
            false
        });
        self.retired_count.store(retired.len(), Ordering::Relaxed);
        freed
    }

    /// Gives the extents of this empty index back to the pool: its current table, every replaced one, and its
    /// header. The caller has already cleared the word that named the index (a crash then leaves its extents to
    /// [`free_unreferenced`] at the next start), and uses this instance for nothing but [`Index::len`] and
    /// [`Index::stats`] afterwards (both read nothing of the pool once it is freed). A reader on another machine
    /// that still walks the index reads reused space: the header's `current` word, which every lookup checks, then
    /// names no table it knows.
    ///
    /// Refused while the index holds an entry ([`IndexError::NotEmpty`]); freeing twice frees nothing.
    pub fn free(&self) -> Result<(), IndexError> {
        // No write or resize is under way, and none starts: every one holds this lock.
        let t = self.table.write().unwrap_or_else(|e| e.into_inner());
        let entries = self.len();
        if entries != 0 {
            return Err(IndexError::NotEmpty(entries));
        }
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let extents = retired
            .drain(..)
            .map(|r| r.offset)
            .filter(|&o| o != t.offset)
            .chain([t.offset, self.header]);
        let mut failed = None;
        for offset in extents {
            if let Err(e) = self.pool.free(offset) {
                tracing::warn!(offset, error = %e, "could not free an index extent");
                failed.get_or_insert(e);
            }
        }
        self.retired_count.store(0, Ordering::Relaxed);
        tracing::info!(header = self.header, table = t.offset, "freed index");
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Marks this instance as abandoned by a simulated crash: dropping it will not touch the pool.
    #[cfg(test)]
    fn abandon(&self) {
        self.crashed.store(true, Ordering::Relaxed);
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        // After a (simulated) crash or during unwinding the pool is left as it is; the next open cleans up.
        let gone = self.crashed.load(Ordering::Relaxed) || self.freed.load(Ordering::Relaxed);
        if !gone && !std::thread::panicking() {
            // Tables still in their grace period stay allocated; the next open frees them.
            self.reclaim_retired();
        }
    }
}

/// The seven meaningful words of the bucket at `offset`, loaded with acquire ordering.
fn snapshot(pool: &Pool, offset: u64) -> Option<BucketImage> {
    let w = |i: u64| {
        pool.atomic_u64(offset + 8 * i)
            .ok()
            .map(|a| a.load(Ordering::Acquire))
    };
    let mut img = BucketImage::default();
    for (i, s) in img.slots.iter_mut().enumerate() {
        *s = (w(2 * i as u64)?, w(2 * i as u64 + 1)?);
    }
    img.next = w(NEXT_OFFSET / 8)?;
    Some(img)
}

/// Test support: a simulated crash at the n-th persist of the current thread.
#[cfg(test)]
pub(crate) mod crash_point {
    use std::cell::Cell;

    thread_local! {
        static COUNTDOWN: Cell<Option<u64>> = const { Cell::new(None) };
    }

    /// Panics with "simulated crash" at the `n`-th persist from now (0: the next one).
    pub fn arm(n: u64) {
        COUNTDOWN.with(|c| c.set(Some(n)));
    }

    /// Disarms.
    pub fn disarm() {
        COUNTDOWN.with(|c| c.set(None));
    }

    pub(super) fn hit() {
        COUNTDOWN.with(|c| match c.get() {
            Some(0) => {
                c.set(None);
                panic!("simulated crash");
            }
            Some(n) => c.set(Some(n - 1)),
            None => {}
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg() -> IndexConfig {
        IndexConfig {
            initial_buckets: 2,
            max_load: 0.75,
            overflow_per_bucket: 0.25,
            retire_grace: std::time::Duration::ZERO,
        }
    }

    fn pool() -> Arc<Pool> {
        Arc::new(Pool::anonymous(32 << 20, 4096).unwrap())
    }

    fn r(n: u64) -> EntryRef {
        EntryRef::new(8 * n, 8).unwrap()
    }

    /// Keys are small integers; key k has hash k % 5 + 1 (heavy collisions) and its refs are r(k * 1000 + version).
    fn key_of(e: EntryRef) -> u64 {
        e.offset() / 8 / 1000
    }

    fn hash_of(k: u64) -> u64 {
        k % 5 + 1
    }

    fn index_tables(pool: &Pool) -> Vec<u64> {
        pool.allocated()
            .into_iter()
            .filter(|e| e.tag == tags::INDEX_TABLE)
            .map(|e| e.offset)
            .collect()
    }

    /// A slot whose hash word no longer belongs to its chain (a flipped bit) is reported as misplaced: lookups of
    /// the key cannot reach it.
    #[test]
    fn an_entry_in_the_wrong_chain_is_reported_as_misplaced() {
        let pool = pool();
        let idx = Index::create(pool.clone(), &cfg()).unwrap();
        for k in 1..=3u64 {
            idx.upsert(k, r(k * 1000), |_| false).unwrap();
        }
        let cw = idx.current();
        let mut placed = Vec::new();
        idx.for_each_placed(|h, e, home| placed.push((h, e, home)));
        assert_eq!(placed.len(), 3);
        assert!(placed.iter().all(|&(_, _, home)| home));
        // Move key 1's hash to one whose home is another bucket, in place.
        let home = bucket_index(1, cw.nbuckets);
        let foreign = (2..u64::MAX)
            .find(|&h| bucket_index(h, cw.nbuckets) != home)
            .unwrap();
        let bucket = primary_offset(cw.table, home);
        let slot = (0..SLOTS as u64)
            .map(|i| bucket + 16 * i)
            .find(|&s| pool.atomic_u64(s).unwrap().load(Ordering::Acquire) == 1)
            .expect("key 1 sits in its primary bucket");
        pool.atomic_u64(slot)
            .unwrap()
            .store(foreign, Ordering::Release);
        let mut misplaced = Vec::new();
        idx.for_each_placed(|h, e, home| {
            if !home {
                misplaced.push((h, e));
            }
        });
        assert_eq!(misplaced, vec![(foreign, r(1000))]);
        assert_eq!(idx.get(1, |_| true), None, "a lookup cannot find it");
    }

    #[test]
    fn a_replace_whose_entry_is_no_longer_the_one_read_leaves_the_slot() {
        let pool = pool();
        let idx = Index::create(pool.clone(), &cfg()).unwrap();
        let (old, copy) = (
            EntryRef::new(4096, 64).unwrap(),
            EntryRef::new(8192, 64).unwrap(),
        );
        idx.upsert(77, old, |_| false).unwrap();
        // The slot still names `old`, but what lies there is no longer the entry the caller read.
        assert!(!idx.replace_if(77, old, copy, || false).unwrap());
        assert_eq!(idx.get(77, |_| true), Some(old));
        assert!(idx.replace_if(77, old, copy, || true).unwrap());
        assert_eq!(idx.get(77, |_| true), Some(copy));
        // A slot that no longer names `old` is left alone without asking.
        assert!(
            !idx.replace_if(77, old, copy, || panic!("asked about a slot that moved"))
                .unwrap()
        );
    }

    #[test]
    fn index_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Index>();
    }

    #[test]
    fn crash_at_every_persist_reopens_with_every_completed_operation() {
        // A deterministic sequence of upserts and removes over colliding keys, with resizes.
        let mut ops = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..120u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = 1 + x % 24;
            let remove = x % 7 == 0;
            ops.push((k, remove, i + 1));
        }
        // Keep the expected panics of simulated crashes out of the test output.
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&"simulated crash") {
                default_hook(info);
            }
        }));
        let mut crash_at = 0u64;
        loop {
            let pool = pool();
            let mut model: HashMap<u64, EntryRef> = HashMap::new();
            let mut in_flight = None;
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crash_point::arm(crash_at);
                let index = Index::create(pool.clone(), &cfg()).unwrap();
                for &(k, remove, version) in &ops {
                    let new = r(k * 1000 + version);
                    let after = if remove { None } else { Some(new) };
                    in_flight = Some((k, model.get(&k).copied(), after));
                    let matches = |e: EntryRef| key_of(e) == k;
                    if remove {
                        index.remove(hash_of(k), matches);
                        model.remove(&k);
                    } else {
                        index.upsert(hash_of(k), new, matches).unwrap();
                        model.insert(k, new);
                    }
                    in_flight = None;
                }
                crash_point::disarm();
                index
            }));
            crash_point::disarm();
            let finished = match outcome {
                Ok(index) => {
                    drop(index);
                    true
                }
                Err(_) => false,
            };
            // "Restart": open what the crash left.
            let index = Index::open_or_create(pool.clone(), &cfg())
                .unwrap_or_else(|e| panic!("crash point {crash_at}: reopen failed: {e}"));
            assert_eq!(
                index_tables(&pool),
                vec![index.current().table],
                "crash point {crash_at}: stray tables survive open"
            );
            let mut seen = HashMap::new();
            index.for_each(|h, e| {
                let k = key_of(e);
                assert_eq!(h, hash_of(k));
                assert!(seen.insert(k, e).is_none(), "key {k} twice");
            });
            assert_eq!(seen.len() as u64, index.len());
            for k in 1..=24u64 {
                let got = index.get(hash_of(k), |e| key_of(e) == k);
                assert_eq!(got, seen.get(&k).copied());
                match in_flight {
                    Some((fk, before, after)) if fk == k => assert!(
                        got == before || got == after,
                        "crash point {crash_at}: interrupted key {k}: {got:?} is neither {before:?} nor {after:?}"
                    ),
                    _ => assert_eq!(
                        got,
                        model.get(&k).copied(),
                        "crash point {crash_at}: key {k}"
                    ),
                }
            }
            if finished {
                assert!(crash_at > 100, "the sequence persisted too rarely");
                break;
            }
            crash_at += 1;
        }
    }

    #[test]
    fn abandon_skips_reclaim_on_drop() {
        let pool = pool();
        let index = Index::create(pool.clone(), &cfg()).unwrap();
        for k in 1..50 {
            index
                .upsert(hash_of(k), r(k * 1000), |e| key_of(e) == k)
                .unwrap();
        }
        index.abandon();
        drop(index);
        let index = Index::open(pool.clone(), &cfg()).unwrap();
        assert_eq!(index.len(), 49);
    }

    #[test]
    fn half_written_slots_are_empty_after_reopen() {
        let pool = pool();
        let index = Index::create(pool.clone(), &cfg()).unwrap();
        index.upsert(7, r(7000), |_| true).unwrap();
        index.upsert(8, r(8000), |_| true).unwrap();
        let t = *index.read_table();
        // Find the slots of hash 7 and hash 8; simulate an insert interrupted before its hash store on a free slot,
        // and a delete interrupted after its hash store.
        let mut free = None;
        let mut slot8 = None;
        for b in 0..t.nbuckets {
            for i in 0..3u64 {
                let s = primary_offset(t.offset, b) + 16 * i;
                let h = pool.atomic_u64(s).unwrap().load(Ordering::SeqCst);
                if h == 0 && free.is_none() {
                    free = Some(s);
                }
                if h == 8 {
                    slot8 = Some(s);
                }
            }
        }
        let (free, slot8) = (free.unwrap(), slot8.unwrap());
        pool.atomic_u64(free + 8)
            .unwrap()
            .store(r(9000).raw(), Ordering::SeqCst);
        pool.atomic_u64(slot8).unwrap().store(0, Ordering::SeqCst);
        drop(index);
        let index = Index::open(pool.clone(), &cfg()).unwrap();
        assert_eq!(index.len(), 1);
        assert_eq!(index.get(7, |_| true), Some(r(7000)));
        assert_eq!(index.get(8, |_| true), None);
        assert_eq!(index.get(9, |_| true), None);
        // The leftovers are reused cleanly.
        assert_eq!(index.upsert(8, r(8001), |_| true).unwrap(), None);
        assert_eq!(index.get(8, |_| true), Some(r(8001)));
        let mut all = Vec::new();
        index.for_each(|h, e| all.push((h, e)));
        all.sort();
        assert_eq!(all, vec![(7, r(7000)), (8, r(8001))]);
    }

    #[test]
    fn cyclic_chain_is_refused_untouched() {
        let pool = pool();
        let index = Index::create(pool.clone(), &cfg()).unwrap();
        // Five keys of one hash need an overflow bucket.
        for k in 0..5u64 {
            index.upsert(3, r(1000 + k), |e| e == r(1000 + k)).unwrap();
        }
        let t = *index.read_table();
        let b = bucket_index(3, t.nbuckets);
        let primary = primary_offset(t.offset, b);
        let k = pool
            .atomic_u64(primary + NEXT_OFFSET)
            .unwrap()
            .load(Ordering::SeqCst);
        assert_ne!(k, 0);
        let ovf = overflow_offset(t.offset, t.nbuckets, k);
        pool.atomic_u64(ovf + NEXT_OFFSET)
            .unwrap()
            .store(k, Ordering::SeqCst);
        drop(index);
        let stray = pool.alloc_bytes(4096, tags::INDEX_TABLE).unwrap();
        let before = pool.allocated();
        let err = Index::open(pool.clone(), &cfg()).unwrap_err();
        assert!(matches!(err, IndexError::CorruptTable { .. }), "{err}");
        assert!(err.to_string().contains("reached twice"), "{err}");
        assert_eq!(pool.allocated(), before);
        assert!(pool.allocated().contains(&stray));
    }

    #[test]
    fn colliding_hashes_grow_the_overflow_area_not_the_buckets() {
        let pool = pool();
        let index = Index::create(
            pool.clone(),
            &IndexConfig {
                initial_buckets: 64,
                overflow_per_bucket: 0.0,
                ..cfg()
            },
        )
        .unwrap();
        // 60 keys with one hash: a 20-bucket chain in a table of 64 buckets (load 0.31).
        for k in 0..60u64 {
            index.upsert(42, r(1000 + k), |e| e == r(1000 + k)).unwrap();
        }
        let s = index.stats();
        assert_eq!(s.buckets, 64, "{s:?}");
        assert!(s.overflow_used >= 19, "{s:?}");
        for k in 0..60u64 {
            assert_eq!(index.get(42, |e| e == r(1000 + k)), Some(r(1000 + k)));
        }
    }

    #[test]
    fn null_refs_are_refused_and_hash_zero_is_stored_as_one() {
        let index = Index::create(pool(), &cfg()).unwrap();
        assert!(matches!(
            index.upsert(5, EntryRef::NULL, |_| true),
            Err(IndexError::NullRef)
        ));
        index.upsert(0, r(1), |_| true).unwrap();
        assert_eq!(index.get(0, |_| true), Some(r(1)));
        assert_eq!(index.get(1, |_| true), Some(r(1)));
        let mut all = Vec::new();
        index.for_each(|h, e| all.push((h, e)));
        assert_eq!(all, vec![(1, r(1))]);
    }
}
