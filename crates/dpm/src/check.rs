//! The pool checker: walks a memory node's data plane and reports damage, without changing anything.
//!
//! Run it on a pool opened with [`dinomo_pool::Pool::open_snapshot`] (`dinomo check` does): it reads what a
//! memory node would find at start-up and what a KV node would read.
//! - **Logs.** Every log of the directory: its chain of segments (each an allocated log segment with a valid
//!   header of that log, reached once), and every segment's entries. Damaged stretches are reported with what they
//!   cost (the entries there are lost; the memory node steps over them, see [`segment::scan_through`]).
//! - **Indexes.** Every live slot of the shared index, or of each KV node's partition: it lies in its hash's chain
//!   (else no lookup can find it), it names an entry inside a log segment that a log holds, the entry passes its
//!   checksum, has the length the reference says, is a write (not a delete), and carries a key whose hash is the
//!   slot's. A key held by two slots is reported too.
//! - **Shared keys.** Every active cell names a valid entry of its key.
//!
//! Committed entries not merged yet, open segments, orphaned segments and writes cut short (see
//! [`LogCheck::cut_short_bytes`], and [`LogCheck::stepped_over_bytes`] for the holes of one that a start sealed in)
//! are what a crash leaves; they are counted, not reported: the memory node merges or frees them when it starts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use dinomo_index::{Anchor, Index, IndexConfig};
use dinomo_log::segment::{self, DamagedField, ScanEnd, StopReason};
use dinomo_log::{EntryRef, EntryView, HashMode, Op, SEGMENT_HEADER_LEN, SegmentHeader};
use dinomo_pool::Pool;
use serde::Serialize;

use crate::cells::{self, CellState, CellTable};
use crate::directory::{Directory, owner_node};
use crate::partitions::PartitionTable;
use crate::processor::{find_older_segment, log_segment_extents};
use crate::revocations;
use crate::{CLEANER_THREAD, Partitioning};

/// Settings of a check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Problems listed in the report; the rest are only counted (default 100).
    pub max_listed_problems: usize,
    /// The pool was not closed cleanly (its superblock says so): the last write to each log may have been cut
    /// short, and what it left is counted ([`LogCheck::cut_short_bytes`]) rather than reported (default false).
    pub crashed: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            max_listed_problems: 100,
            crashed: false,
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PoolCheck {
    /// The index layout: `shared` (one index: DINOMO, DINOMO-S) or `per-node` (an index per KV node: DINOMO-N);
    /// `None` when the pool holds no DINOMO data plane.
    pub layout: Option<Partitioning>,
    /// Every log of the directory.
    pub logs: Vec<LogCheck>,
    /// Every index.
    pub indexes: Vec<IndexCheck>,
    /// Active shared-key cells checked.
    pub shared_keys: u64,
    /// Revoked KV-node incarnations the memory node keeps refusing.
    pub revoked_clients: u64,
    /// Allocated log segments that no log holds (left by a crash, or the delete reserve): freed at start-up.
    pub orphaned_segments: u64,
    /// Bytes of log segments that hold no valid entry where one should be.
    pub damaged_log_bytes: u64,
    /// Problems found, in the order found (at most [`CheckOptions::max_listed_problems`]).
    pub problems: Vec<String>,
    /// Problems found in all.
    pub problem_count: u64,
}

impl PoolCheck {
    /// Whether nothing is damaged.
    pub fn is_clean(&self) -> bool {
        self.problem_count == 0
    }

    fn problem(&mut self, limit: usize, what: String) {
        self.problem_count += 1;
        if self.problems.len() < limit {
            self.problems.push(what);
        }
    }
}

/// One log.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LogCheck {
    /// Its id (descriptor number).
    pub log: u32,
    /// The KV node that owns it.
    pub node: u32,
    /// The owner's thread.
    pub thread: u32,
    /// Segments in its chain.
    pub segments: u64,
    /// Segments not sealed yet (the writer's current one; more after a crash).
    pub open_segments: u64,
    /// Valid entries in its segments.
    pub entries: u64,
    /// Valid entries not merged into the index yet (none in a relocation log, which is never merged).
    pub unmerged_entries: u64,
    /// Bytes where an entry should be but none is valid.
    pub damaged_bytes: u64,
    /// Bytes without a valid entry that a write cut short by a crash may have left (a write's bytes land in any
    /// order, so a cut leaves holes before bytes that did land): in a pool not closed cleanly, those in the log's
    /// open segment past its merged entries (a worker's log has one write in flight, never acknowledged, or this is
    /// damage to entries not merged yet; in a relocation log it is certainly the cut, as a copy counts once merged,
    /// after it is persisted and before any slot names it).
    pub cut_short_bytes: u64,
    /// Bytes without a valid entry in sealed segments that a start after a crash sealed with such holes inside:
    /// exactly what that start stepped over and recorded in the segment's header (it reported them then).
    pub stepped_over_bytes: u64,
}

/// One index.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IndexCheck {
    /// The KV node whose partition it is (`None`: the shared index).
    pub node: Option<u32>,
    /// Its node departed (its logs were taken over, and it has not claimed one since): the memory node frees the
    /// partition once it is empty and no log merges into it.
    pub departed: bool,
    /// Live slots.
    pub keys: u64,
    /// Primary buckets.
    pub buckets: u64,
    /// Bytes of its table.
    pub table_bytes: u64,
    /// Slots whose entry is damaged, misplaced or not the slot's key.
    pub bad_slots: u64,
}

/// Where a log segment's entries are.
#[derive(Debug, Clone, Copy)]
struct Span {
    log: u32,
    /// One past the last byte of its valid entries.
    end: u64,
}

/// Checks the data plane of `pool`; reads only (indexes are opened where they are anchored, which frees nothing).
pub fn check_pool(pool: &Arc<Pool>, opts: &CheckOptions) -> PoolCheck {
    let mut c = Checker::new(pool, opts);
    c.run();
    c.report
}

/// What [`repair_pool`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Repair {
    /// Entries a crash had left unmerged, merged by the memory node's start.
    pub recovered_entries: u64,
    /// Bytes of damaged log entries the start stepped over (their writes are lost).
    pub damaged_log_bytes: u64,
    /// Segments whose damaged sealed length the start rebuilt, and those it linked again to their older segment.
    pub repaired_segment_headers: u64,
    /// Index slots removed because the entry they named is damaged: their keys now read as absent, where before
    /// every read of them was refused.
    pub removed_slots: Vec<RemovedSlot>,
    /// Sealed log segments with damaged stretches that were emptied (their live entries copied elsewhere) and
    /// recycled.
    pub emptied_segments: u64,
    /// The check after the repair.
    pub after: PoolCheck,
}

/// An index slot [`repair_pool`] removed.
#[derive(Debug, Clone, Serialize)]
pub struct RemovedSlot {
    /// The KV node whose partition held it (`None`: the shared index).
    pub node: Option<u32>,
    /// Its hash.
    pub hash: u64,
    /// Pool offset of the damaged entry it named.
    pub entry: u64,
    /// The key, when the damaged entry still shows it (escaped and cut as in the check's problems).
    pub key: Option<String>,
}

/// Repairs what can be repaired in `pool`, opened for writing by this process alone:
/// 1. starts the data plane with `config` and stops it: the memory node's recovery merges unmerged entries, steps
///    over damaged log stretches, rebuilds damaged segment header words and frees orphans;
/// 2. removes every index slot that lies in its hash's chain but names a damaged entry;
/// 3. starts the data plane again to empty the sealed segments with damaged stretches (their live entries are
///    copied elsewhere and the segments recycled);
/// 4. checks the pool again.
///
/// What it cannot repair (a slot outside its chain, a key in two slots, a damaged shared-key cell, damage in an
/// open segment, damage the start refuses) stays in the check after.
pub fn repair_pool(
    pool: &Arc<Pool>,
    config: &crate::ProcessorConfig,
    opts: &CheckOptions,
) -> Result<Repair, crate::ProcessorError> {
    let processor = crate::Processor::start(pool.clone(), config)?;
    let stats = processor.stats();
    processor.shutdown();
    drop(processor);
    let mut c = Checker::new(pool, opts);
    c.run();
    let mut removed_slots = Vec::new();
    let bad_slots = std::mem::take(&mut c.bad_slots);
    for slots in bad_slots.chunk_by(|a, b| a.index == b.index) {
        let index = Index::open_at(pool.clone(), &IndexConfig::default(), slots[0].index)
            .map_err(|e| crate::ProcessorError::Corrupt(e.to_string()))?;
        for slot in slots {
            if index.remove(slot.hash, |r| r == slot.entry).is_some() {
                removed_slots.push(RemovedSlot {
                    node: slot.node,
                    hash: slot.hash,
                    entry: slot.entry.offset(),
                    key: c.readable_key(slot.entry).map(|k| show_key(&k)),
                });
            }
        }
    }
    let mut damaged = std::mem::take(&mut c.damaged_segments);
    damaged.sort_unstable();
    damaged.dedup();
    let emptied_segments = if damaged.is_empty() {
        0
    } else {
        // Started again: its segment counters are rebuilt from the index, which no longer names the damaged entries.
        let processor = crate::Processor::start(pool.clone(), config)?;
        let emptied = processor.clean_segments(&damaged);
        processor.shutdown();
        emptied?
    };
    Ok(Repair {
        emptied_segments,
        recovered_entries: stats.recovered_entries,
        damaged_log_bytes: stats.damaged_log_bytes,
        repaired_segment_headers: stats.resealed_segments + stats.relinked_segments,
        removed_slots,
        after: check_pool(pool, opts),
    })
}

/// A slot in its hash's chain whose entry is not valid.
struct BadSlot {
    /// Where its index is anchored.
    index: Anchor,
    /// The KV node whose partition the index is (`None`: the shared index).
    node: Option<u32>,
    hash: u64,
    entry: EntryRef,
}

struct Checker {
    pool: Arc<Pool>,
    limit: usize,
    /// See [`CheckOptions::crashed`].
    crashed: bool,
    report: PoolCheck,
    /// Chained log segments by offset.
    spans: BTreeMap<u64, Span>,
    mode: HashMode,
    scratch: Vec<u8>,
    /// The slots in their hash's chain whose entry is not valid, each index's together. What [`repair_pool`]
    /// removes.
    bad_slots: Vec<BadSlot>,
    /// Sealed log segments with stretches that hold no valid entry. What [`repair_pool`] empties.
    damaged_segments: Vec<u64>,
}

impl Checker {
    fn new(pool: &Arc<Pool>, opts: &CheckOptions) -> Checker {
        Checker {
            pool: pool.clone(),
            limit: opts.max_listed_problems,
            crashed: opts.crashed,
            report: PoolCheck::default(),
            spans: BTreeMap::new(),
            mode: HashMode::Xxh3,
            scratch: Vec::new(),
            bad_slots: Vec::new(),
            damaged_segments: Vec::new(),
        }
    }

    fn problem(&mut self, what: String) {
        self.report.problem(self.limit, what);
    }

    fn run(&mut self) {
        let partitions = match PartitionTable::open(self.pool.clone()) {
            Ok(t) => t,
            Err(e) => {
                self.problem(format!("partition table: {e}"));
                self.report.layout = Some(Partitioning::PerNode);
                return;
            }
        };
        let has = |slot: usize| self.pool.root(slot).is_ok_and(|o| o != 0);
        let shared = has(dinomo_log::roots::INDEX);
        self.report.layout = match &partitions {
            Some(_) => Some(Partitioning::PerNode),
            None if shared || has(dinomo_log::roots::LOG_DIRECTORY) => Some(Partitioning::Shared),
            None => return,
        };
        match Directory::open(self.pool.clone()) {
            Ok(Some(dir)) => {
                self.mode = dir.hash_mode();
                self.check_logs(&dir);
            }
            Ok(None) => {}
            Err(e) => self.problem(format!("log directory: {e}")),
        }
        let cfg = IndexConfig::default();
        match partitions {
            Some(table) => {
                for p in table.partitions() {
                    let anchor = Anchor::Word(table.index_anchor(p.slot));
                    match Index::open_at(self.pool.clone(), &cfg, anchor) {
                        Ok(index) => self.check_index(&index, anchor, Some(p.node), p.departed),
                        Err(e) => self.problem(format!("index of KV node {}: {e}", p.node)),
                    }
                }
            }
            None if shared => {
                let anchor = Anchor::Root(dinomo_log::roots::INDEX);
                match Index::open_at(self.pool.clone(), &cfg, anchor) {
                    Ok(index) => self.check_index(&index, anchor, None, false),
                    Err(e) => self.problem(format!("index: {e}")),
                }
            }
            None => self.problem("the pool has a log directory but no index".into()),
        }
        self.check_cells();
        self.check_revocations();
    }

    fn check_revocations(&mut self) {
        match revocations::read(&self.pool) {
            Ok(r) => {
                self.report.revoked_clients = r.revoked.len() as u64;
                if r.damaged > 0 {
                    self.problem(format!(
                        "revocation table: {} entries fail their checksum (those revocations would be forgotten)",
                        r.damaged
                    ));
                }
            }
            Err(e) => self.problem(format!("revocation table: {e}")),
        }
    }

    fn check_logs(&mut self, dir: &Directory) {
        let extents = log_segment_extents(&self.pool);
        for log in 0..dir.capacity() {
            let owner = dir.owner(log);
            if owner == 0 {
                continue;
            }
            let mut summary = LogCheck {
                log,
                node: owner_node(owner),
                thread: owner as u32,
                ..LogCheck::default()
            };
            let merged_seq = dir.merged_seq(log);
            let mut at = dir.head(log);
            while at != 0 {
                let Some(h) = self.chained_segment(log, at, &extents) else {
                    break;
                };
                summary.segments += 1;
                self.check_segment(&mut summary, at, &h, merged_seq);
                at = match h.older {
                    Ok(older) => older,
                    Err(damaged) => match self.relinked_older(log, at, &h, damaged, &extents) {
                        Some(older) => older,
                        None => break,
                    },
                };
            }
            self.report.damaged_log_bytes += summary.damaged_bytes;
            self.report.logs.push(summary);
        }
        self.report.orphaned_segments = extents
            .keys()
            .filter(|o| !self.spans.contains_key(o))
            .count() as u64;
    }

    /// The older segment a memory node would link `log`'s segment at `at` (header `h`) to again, its link word
    /// being `damaged`; reported either way, and `None` when it cannot be told (the chain ends there).
    fn relinked_older(
        &mut self,
        log: u32,
        at: u64,
        h: &SegmentHeader,
        damaged: DamagedField,
        extents: &HashMap<u64, u64>,
    ) -> Option<u64> {
        let found = find_older_segment(
            &self.pool,
            extents,
            |o| self.spans.contains_key(&o),
            log,
            h.first_seq,
        );
        let link = format!(
            "log {log}: segment at {at:#x}: its link to the older segment is damaged ({damaged})"
        );
        match found {
            Ok(older) => {
                let to = match older {
                    0 => "nothing (the log has no older segment left)".to_string(),
                    o => format!("{o:#x}, the log's segment that ends where it begins"),
                };
                self.problem(format!(
                    "{link}; a memory node starting on this pool links it again to {to}"
                ));
                Some(older)
            }
            Err(why) => {
                self.problem(format!(
                    "{link}, and {why}; the segments past it are out of reach (a memory node refuses to start on \
                     this pool)"
                ));
                None
            }
        }
    }

    /// The header of the segment at `at` in `log`'s chain, when it is one; else the chain's damage is reported
    /// (the segments past it cannot be reached).
    fn chained_segment(
        &mut self,
        log: u32,
        at: u64,
        extents: &HashMap<u64, u64>,
    ) -> Option<SegmentHeader> {
        let lost = "; the segments past it are out of reach";
        if let Some(other) = self.spans.get(&at) {
            let other = other.log;
            self.problem(format!(
                "log {log}: its chain reaches the segment at {at:#x} a second time (held by log {other}){lost}"
            ));
            return None;
        }
        let Some(&len) = extents.get(&at) else {
            self.problem(format!(
                "log {log}: its chain names {at:#x}, where no log segment is allocated{lost}"
            ));
            return None;
        };
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        let header = self
            .pool
            .read(at, &mut b)
            .ok()
            .and_then(|()| SegmentHeader::decode(&b));
        let why = match header {
            None => "its header is damaged (magic or checksum)".to_string(),
            Some(h) if h.capacity != len => format!(
                "its header says {} bytes, the allocation holds {len}",
                h.capacity
            ),
            Some(h) if h.log_id != log => format!("its header names log {}", h.log_id),
            Some(h) => return Some(h),
        };
        self.problem(format!(
            "log {log}: segment at {at:#x}: {why}{lost} (a memory node refuses to start on this pool)"
        ));
        None
    }

    fn check_segment(&mut self, log: &mut LogCheck, at: u64, h: &SegmentHeader, merged_seq: u64) {
        let (sealed, len) = match h.sealed_len {
            Ok(0) => {
                log.open_segments += 1;
                (false, h.data_capacity())
            }
            Ok(len) => (true, len),
            Err(damaged) => {
                self.problem(format!(
                    "log {}: segment at {at:#x}: its sealed length is damaged ({damaged}); a memory node starting \
                     on this pool scans the segment to its last valid entry and seals it there again",
                    log.log
                ));
                (false, h.data_capacity())
            }
        };
        let mut data = std::mem::take(&mut self.scratch);
        data.resize(len as usize, 0);
        let data_at = at + SEGMENT_HEADER_LEN as u64;
        if self.pool.read(data_at, &mut data).is_err() {
            self.problem(format!(
                "log {}: segment at {at:#x} runs past the pool",
                log.log
            ));
            self.scratch = data;
            return;
        }
        // A relocation log is never merged: its copies count only through the slots the cleaner moved.
        let relocation = log.thread == CLEANER_THREAD;
        let mut found = segment::scan_through(&data, log.log, h.first_seq, |_, e| {
            log.entries += 1;
            if !relocation && e.header.seq > merged_seq {
                log.unmerged_entries += 1;
            }
        });
        let stepped_over = match h.stepped_over {
            Ok(n) => n,
            Err(damaged) => {
                self.problem(format!(
                    "log {}: segment at {at:#x}: its count of the bytes a start stepped over is damaged ({damaged})",
                    log.log
                ));
                0
            }
        };
        let gap_bytes = found.gap_bytes();
        if sealed && stepped_over > 0 && gap_bytes == stepped_over {
            // The start that sealed this segment after a crash stepped over exactly these (and reported them then).
            log.stepped_over_bytes += gap_bytes;
            found.gaps.clear();
        }
        for gap in &found.gaps {
            if self.crashed && !sealed && gap.expected_seq > merged_seq {
                log.cut_short_bytes += gap.len as u64;
                continue;
            }
            log.damaged_bytes += gap.len as u64;
            if sealed {
                self.damaged_segments.push(at);
            }
            self.problem(format!(
                "log {}: segment at {at:#x}: {} bytes at {:#x} hold no valid entry ({}); the entries written there \
                 are lost",
                log.log,
                gap.len,
                data_at + gap.at as u64,
                describe(&gap.reason)
            ));
        }
        if sealed && let ScanEnd::Stopped { at: end, reason } = &found.tail {
            log.damaged_bytes += len - *end as u64;
            self.damaged_segments.push(at);
            self.problem(format!(
                "log {}: segment at {at:#x} is sealed at {len} bytes of entries, but they end after {end} ({}); the \
                 entries after are lost",
                log.log,
                describe(reason)
            ));
        }
        self.spans.insert(
            at,
            Span {
                log: log.log,
                end: data_at + found.end as u64,
            },
        );
        self.scratch = data;
    }

    fn check_index(&mut self, index: &Index, anchor: Anchor, node: Option<u32>, departed: bool) {
        let stats = index.stats();
        let mut summary = IndexCheck {
            node,
            departed,
            buckets: stats.buckets,
            table_bytes: stats.table_bytes,
            ..IndexCheck::default()
        };
        let name = match node {
            Some(n) => format!("index of KV node {n}"),
            None => "index".to_string(),
        };
        let mut slots = Vec::new();
        index.for_each_placed(|h, r, home| slots.push((h, r, home)));
        summary.keys = slots.len() as u64;
        let mut good: Vec<(u64, EntryRef)> = Vec::with_capacity(slots.len());
        for (h, r, home) in slots {
            let verdict = if home {
                self.entry_of(h, r, None)
            } else {
                let key = self
                    .readable_key(r)
                    .map_or("it".to_string(), |k| format!("key {}", show_key(&k)));
                Err(format!(
                    "the slot lies in another hash's chain, so no lookup finds {key}"
                ))
            };
            match verdict {
                Ok(_) => good.push((h, r)),
                Err(why) => {
                    summary.bad_slots += 1;
                    if home {
                        self.bad_slots.push(BadSlot {
                            index: anchor,
                            node,
                            hash: h,
                            entry: r,
                        });
                    }
                    self.problem(format!(
                        "{name}: the slot of hash {h:#x} names the entry at {:#x} ({} bytes): {why}",
                        r.offset(),
                        r.len()
                    ));
                }
            }
        }
        // A key in two slots: only slots of one hash can hold the same key.
        good.sort_unstable();
        for run in good.chunk_by(|a, b| a.0 == b.0).filter(|run| run.len() > 1) {
            let mut seen = HashSet::new();
            for &(h, r) in run {
                let Ok(key) = self.entry_of(h, r, None) else {
                    continue;
                };
                if !seen.insert(key.clone()) {
                    summary.bad_slots += 1;
                    self.problem(format!(
                        "{name}: key {} is in two slots (one names the entry at {:#x}): lookups may read either",
                        show_key(&key),
                        r.offset()
                    ));
                }
            }
        }
        self.report.indexes.push(summary);
    }

    /// The key of the entry `r`, when it is a valid write of a key hashing to `hash` (and equal to `key`, when
    /// given) inside a log segment a log holds; else why not.
    fn entry_of(&mut self, hash: u64, r: EntryRef, key: Option<&[u8]>) -> Result<Vec<u8>, String> {
        let span = self.load_entry(r)?;
        let e = EntryView::parse(&self.scratch)
            .map_err(|e| format!("the entry fails its check: {e}"))?;
        if e.len() as u64 != r.len() {
            return Err(format!("the entry holds {} bytes", e.len()));
        }
        if e.header.log_id != span.log {
            return Err(format!(
                "the entry is of log {}, in a segment of log {}",
                e.header.log_id, span.log
            ));
        }
        if e.header.op != Op::Put {
            return Err(format!("the entry of key {} is a delete", show_key(e.key)));
        }
        let own = dinomo_index::layout::stored_hash(self.mode.hash(e.key));
        if own != hash {
            return Err(format!(
                "the entry is of key {}, whose hash is {own:#x}",
                show_key(e.key)
            ));
        }
        if let Some(k) = key
            && e.key != k
        {
            return Err(format!("the entry is of key {}", show_key(e.key)));
        }
        Ok(e.key.to_vec())
    }

    /// Reads the bytes `r` names into the scratch buffer, when the valid entries of a held segment hold them all
    /// (which bounds the read: a damaged reference may claim up to 128 MiB); their segment, else why not.
    fn load_entry(&mut self, r: EntryRef) -> Result<Span, String> {
        let span = self.span_holding(r)?;
        self.scratch.resize(r.len() as usize, 0);
        self.pool
            .read(r.offset(), &mut self.scratch)
            .map_err(|e| e.to_string())?;
        Ok(span)
    }

    /// The segment whose valid entries hold all of `r`; else why there is none.
    fn span_holding(&self, r: EntryRef) -> Result<Span, String> {
        let start = r.offset();
        let held = self
            .spans
            .range(..=start)
            .next_back()
            .filter(|(seg, span)| start >= *seg + SEGMENT_HEADER_LEN as u64 && start < span.end)
            .map(|(_, span)| *span);
        let Some(span) = held else {
            return Err(
                "it lies outside the valid entries of every log segment a log holds".to_string(),
            );
        };
        if start + r.len() > span.end {
            return Err("it runs past the valid entries of its segment".to_string());
        }
        Ok(span)
    }

    /// The key of the valid entry at `r`, if there is one.
    fn readable_key(&mut self, r: EntryRef) -> Option<Vec<u8>> {
        self.load_entry(r).ok()?;
        EntryView::parse(&self.scratch).ok().map(|e| e.key.to_vec())
    }

    fn check_cells(&mut self) {
        if self.pool.root(cells::ROOT).map_or(true, |o| o == 0) {
            return;
        }
        // Capacity and key length are read from the table; they matter only when formatting one.
        let table = match CellTable::open_or_create(self.pool.clone(), 1, 1) {
            Ok(t) => t,
            Err(e) => {
                self.problem(format!("shared-key cells: {e}"));
                return;
            }
        };
        let active: Vec<_> = table
            .cells()
            .filter(|c| c.state == CellState::Active)
            .map(|c| (c.slot, c.key.clone(), c.live))
            .collect();
        for (slot, key, live) in active {
            self.report.shared_keys += 1;
            let Some(r) = live else { continue };
            let hash = dinomo_index::layout::stored_hash(self.mode.hash(&key));
            if let Err(why) = self.entry_of(hash, r, Some(&key)) {
                self.problem(format!(
                    "shared key {} (cell {slot}) names the entry at {:#x}: {why}",
                    show_key(&key),
                    r.offset()
                ));
            }
        }
    }
}

/// Why bytes are not the next entry, in words.
fn describe(reason: &StopReason) -> String {
    match reason {
        StopReason::Invalid(e) => e.to_string(),
        StopReason::ForeignLog(l) => format!("an entry of log {l}"),
        StopReason::OutOfSequence { expected, found } => {
            format!("entry number {found} where {expected} was due")
        }
    }
}

/// A key for a report: printable ASCII as is, other bytes escaped, long keys cut.
fn show_key(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    let mut s = format!("\"{}\"", key[..key.len().min(SHOWN)].escape_ascii());
    if key.len() > SHOWN {
        s.push_str(&format!(" (… {} bytes)", key.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Processor, ProcessorConfig};

    #[test]
    fn keys_are_shown_escaped_and_cut() {
        assert_eq!(show_key(b"user:1"), "\"user:1\"");
        assert_eq!(show_key(b"a\x00\"b"), "\"a\\x00\\\"b\"");
        let long = vec![b'x'; 100];
        assert_eq!(
            show_key(&long),
            format!("\"{}\" (… 100 bytes)", "x".repeat(64))
        );
    }

    /// A processor on `pool`, which formats a data plane in it.
    fn start(pool: &Arc<Pool>) -> Arc<Processor> {
        Processor::start(
            pool.clone(),
            &ProcessorConfig {
                segment_size: 64 << 10,
                ..ProcessorConfig::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn an_unformatted_pool_has_no_data_plane_and_a_new_one_is_clean() {
        let pool = Arc::new(Pool::anonymous(16 << 20, 64 << 10).unwrap());
        let report = check_pool(&pool, &CheckOptions::default());
        assert_eq!(report.layout, None);
        assert!(report.is_clean() && report.indexes.is_empty());
        let processor = start(&pool);
        let report = check_pool(&pool, &CheckOptions::default());
        assert_eq!(report.layout, Some(Partitioning::Shared));
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!(report.indexes.len(), 1);
        assert_eq!((report.indexes[0].keys, report.logs.len()), (0, 0));
        processor.shutdown();
    }

    /// Kept revocations are counted, and an entry that fails its checksum is a problem.
    #[test]
    fn the_revocation_table_is_counted_and_a_damaged_entry_reported() {
        let pool = Arc::new(Pool::anonymous(16 << 20, 64 << 10).unwrap());
        let processor = start(&pool);
        let mut table = revocations::RevocationTable::open(pool.clone()).unwrap();
        let ids: Vec<_> = (1..=3)
            .map(|incarnation| dinomo_fabric::ClientId {
                node: 2,
                incarnation,
            })
            .collect();
        table.record(&ids, 16).unwrap();
        let report = check_pool(&pool, &CheckOptions::default());
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!(report.revoked_clients, 3);
        // The second entry's incarnation (entries are 24 bytes after a 64-byte header).
        let entry = pool.root(revocations::ROOT).unwrap() + 64 + 24 + 8;
        pool.write(entry, &[0xee]).unwrap();
        let report = check_pool(&pool, &CheckOptions::default());
        assert_eq!(report.revoked_clients, 2);
        assert_eq!(report.problem_count, 1);
        assert!(
            report.problems[0].contains("revocation table"),
            "{:?}",
            report.problems
        );
        processor.shutdown();
    }

    /// The report lists up to its limit and counts the rest.
    #[test]
    fn problems_past_the_limit_are_counted_not_listed() {
        let mut report = PoolCheck::default();
        for i in 0..5 {
            report.problem(3, format!("problem {i}"));
        }
        assert_eq!(report.problem_count, 5);
        assert_eq!(report.problems, ["problem 0", "problem 1", "problem 2"]);
        assert!(!report.is_clean());
    }
}
