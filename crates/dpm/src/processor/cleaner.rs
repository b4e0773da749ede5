//! The log cleaner: frees the segments that a few live entries hold on to.
//!
//! A merged segment is recycled once every entry in it is superseded (the DINOMO paper's per-segment counters).
//! A key written once and never again keeps its whole segment, and under a skewed workload most segments end up
//! holding a few such entries among many dead ones: the pool fills although it holds far less live data. The
//! cleaner picks the merged segment with the smallest live share, copies its live entries into a relocation log
//! ([`CLEANER_THREAD`]: the memory node's own with one shared index, the segment's node's in the shared-nothing
//! layout, whose partitions are the nodes'), and moves each index slot from the old entry to its copy with
//! [`Index::replace_if`], which changes the slot only while it still holds the old entry and the entry there is
//! still the one copied (its log and sequence number): a key written (merged), deleted or moved in the meantime
//! keeps its newer state, and the copy counts as dead. (The segment can be emptied by such a write, recycled and
//! written again while the copies are made: a newer entry of the key at the very same place, merged, is not the
//! one copied.) The segment, now entirely superseded, is recycled as any other.
//!
//! Why this is safe:
//! - **Readers.** A KV node's shortcut to the old entry is checked against the key and sequence number when
//!   followed; while the old bytes are there they are the same value, and once the extent is reused the check
//!   fails and the node walks the index, which names the copy. KV nodes never read merged segments otherwise.
//! - **Crashes.** Copies are persisted before any slot moves to them, and the old segment is freed only after every
//!   slot moved (each move is persisted by the index). A relocation log is never merged: its entries are only ever
//!   reached through slots the cleaner moved, so a restart takes its segments as they are, and recovery's counters
//!   (rebuilt from the index) count a copy no slot names as dead.
//! - **Shared keys.** An entry that is live through a shared key's cell is not moved; its segment waits.
//! - **Partitions.** The slots are moved in the index the segment's log merges into, under the rebalance lock, so
//!   a rebalance never sees a key in the middle of a move.
//!
//! The same moves make room for an index table: a table doubles into one contiguous run, and once log segments
//! have been recycled for a while the pool's free space lies in pieces between them. When a table cannot grow,
//! [`Inner::make_room_for_table`] cleans until enough segments are free (when the cleaner thread fell behind),
//! then empties the run cheapest to free, whatever the live share of its segments, and the table grows into it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dinomo_index::Index;
use dinomo_log::segment;
use dinomo_log::{ENTRY_HEADER_LEN, EntryHeader, EntryRef, EntryView, Op, SEGMENT_HEADER_LEN};
use tracing::{debug, info, warn};

use super::log_writer::LogWriter;
use super::{
    CLEANER_THREAD, Inner, LogState, MEMORY_NODE_ID, Partitioning, ProcessorError, Scratch, SegStat,
};
use crate::cells::CellState;
use crate::directory::owner_node;

/// How soon a merge thread makes a run again for the same index table after an attempt.
const ROOM_RETRY: Duration = Duration::from_secs(1);

/// The attempts to make a run for an index table, by table: what limits the merge threads' attempts ahead of need
/// to one per [`ROOM_RETRY`] for a table, and never a writer's.
#[derive(Default)]
pub(super) struct RoomAttempts(HashMap<u64, Instant>);

impl RoomAttempts {
    /// Whether an attempt for `table` (a writer's if `writer`) may begin at `now`; if so, it is recorded.
    fn admit(&mut self, table: u64, writer: bool, now: Instant) -> bool {
        self.0
            .retain(|_, at| now.saturating_duration_since(*at) < ROOM_RETRY);
        if self.0.contains_key(&table) && !writer {
            return false;
        }
        self.0.insert(table, now);
        true
    }
}

/// The cleaner's state between cleanings.
#[derive(Default)]
pub(super) struct CleanerState {
    /// The relocation logs the cleaner writes, by node id ([`MEMORY_NODE_ID`] for the memory node's own).
    writers: HashMap<u32, LogWriter>,
    /// Segments the cleaner could not empty (a live entry behind a shared key's cell), with their invalid count
    /// then: they are tried again once more of their entries are superseded.
    passed_over: HashMap<u64, u64>,
    /// Entries read from a segment being cleaned.
    data: Vec<u8>,
}

/// What cleaning one segment did.
pub(super) enum Cleaned {
    /// The segment was emptied and recycled.
    Freed,
    /// The segment stays, for the reason given.
    Kept(Kept),
}

/// Why a segment was not cleaned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// No log holds it any more, or its counters are gone: it was recycled meanwhile.
    Gone,
    /// It is open (a writer appends to it) or not all merged.
    Open,
    /// Its partition's node departed; the rebalance after the departure empties it.
    DepartedPartition,
    /// An entry in it is live through a shared key's cell.
    SharedKey,
    /// Its counters still count live entries after its live entries moved.
    Unsettled,
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kept::Gone => "it was recycled meanwhile",
            Kept::Open => "it is open or not all merged",
            Kept::DepartedPartition => "its partition's node departed",
            Kept::SharedKey => "a shared key's cell names an entry in it",
            Kept::Unsettled => "its counters still count live entries",
        })
    }
}

impl Inner {
    /// The cleaner thread: while the pool's free share is below `clean_below_free_percent`, cleans the emptiest
    /// segment that qualifies; otherwise checks again every 50 ms.
    pub(super) fn cleaner_loop(&self) {
        const IDLE: Duration = Duration::from_millis(50);
        while !self.stopping.load(Ordering::Acquire) {
            if !self.space_low() || !self.clean_some(|_| !self.space_low(), 8) {
                std::thread::sleep(IDLE);
            }
            // Cleaning may have retired the last logs of a departed node.
            self.free_departed_partitions();
        }
    }

    /// Whether less than `clean_below_free_percent` of the pool is free.
    fn space_low(&self) -> bool {
        let space = self.pool.space();
        let total = space.used_bytes() + space.free_bytes();
        total > 0
            && (space.free_bytes() as u128) * 100
                < (total as u128) * u128::from(self.clean_below_free_percent)
    }

    /// Cleans on a segment grant that found the pool full, whatever the free share: until a segment is free (the
    /// copies may have taken the first one a cleaning freed) or no segment qualifies, after any cleaning under way
    /// (which may have freed one itself).
    pub(super) fn clean_for_room(&self) {
        if self.clean_max_live_percent > 0 {
            let segment_free = || self.pool.space().free_bytes() >= self.dir.segment_size();
            self.clean_some(|freed_any| freed_any && segment_free(), 64);
        }
    }

    /// Cleans up to `most` segments, until `enough` (told whether this call freed any) says so; whether any was
    /// freed.
    fn clean_some(&self, enough: impl Fn(bool) -> bool, most: usize) -> bool {
        let _no_rebalance = self.rebalance_lock.lock().expect("rebalance lock");
        let mut state = self.cleaner.lock().expect("cleaner lock");
        let mut freed_any = false;
        for _ in 0..most {
            if enough(freed_any) || self.stopping.load(Ordering::Acquire) {
                break;
            }
            let Some(victim) = self.pick_victim(&mut state) else {
                break;
            };
            let cleaned = self.clean_segment(&mut state, victim);
            if let Ok(Cleaned::Freed) = cleaned {
                freed_any = true;
                continue;
            }
            // Not tried again until more of its entries are superseded.
            let invalid = self.invalid_count(victim);
            state.passed_over.insert(victim, invalid);
            if let Err(e) = cleaned {
                warn!(segment = victim, error = %e, "cleaning a log segment failed");
                break;
            }
        }
        freed_any
    }

    /// For an index table that could not grow: cleans until the pool has as many free segments as the table needs
    /// (when it has fewer), then empties the cheapest run of segments long enough for the table (free segments, and merged log segments the cleaner can empty,
    /// however live), keeps it out of log segment grants meanwhile, and grows the table into it. Whether the
    /// table grew.
    ///
    /// A merge thread growing a table ahead of need tries at most once per [`ROOM_RETRY`] for one table. A writer
    /// about to be refused (`writer`) first waits for an attempt under way, and tries again itself if that one
    /// failed: the run an attempt picked can change under it (a grant takes one of its free segments), and a write
    /// is refused only when the room could not be made, not while it was being made.
    pub(super) fn make_room_for_table(&self, index: &Index, writer: bool) -> bool {
        if self.clean_max_live_percent == 0 {
            return false;
        }
        let Some(bytes) = index.blocked_growth() else {
            return false;
        };
        let space = self.pool.space();
        let want = bytes.div_ceil(space.segment_size);
        let room = || self.pool.space().free_segments >= want;
        // The pool lacks the room, not only in one piece: cleaning may make it (the cleaner thread falls behind
        // the writers when it is starved of CPU, and a grant that found the pool full cleans only until one
        // segment is free).
        if space.free_segments < want && !(self.clean_some(|_| room(), 64) && room()) {
            return false;
        }
        let table = index.current().table;
        if !self
            .room_tried
            .lock()
            .expect("room lock")
            .admit(table, writer, Instant::now())
        {
            return false;
        }
        let _no_rebalance = self.rebalance_lock.lock().expect("rebalance lock");
        // An attempt under way holds both locks: once they are taken, it has ended.
        let mut state = self.cleaner.lock().expect("cleaner lock");
        if index.current().table != table {
            return true;
        }
        let Some(start) = self.cheapest_run(&state, want) else {
            debug!(
                segments = want,
                "no run of segments can be emptied for the index table"
            );
            return false;
        };
        let layout = *self.pool.layout();
        let offset = layout.segment_offset(start);
        let Some(_kept) = self.pool.keep_for_high(offset, want) else {
            return false;
        };
        let end = layout.segment_offset(start + want);
        // Read again now that the run is kept: a grant may have taken one of its free segments meanwhile (emptying
        // that one, an open head, is refused below).
        let in_run: Vec<u64> = self
            .pool
            .allocated()
            .into_iter()
            .filter(|e| e.offset < end && e.offset + e.len > offset)
            .map(|e| e.offset)
            .collect();
        let relocated_before = self.relocated_entries.load(Ordering::Relaxed);
        let mut emptied = 0;
        for segment in in_run {
            match self.clean_segment(&mut state, segment) {
                Ok(Cleaned::Freed) => emptied += 1,
                Ok(Cleaned::Kept(why)) => {
                    debug!(segment, %why, "a segment of the run for the index table stays");
                    return false;
                }
                Err(e) => {
                    warn!(segment, error = %e, "emptying a segment for the index table failed");
                    return false;
                }
            }
        }
        let moved = self.relocated_entries.load(Ordering::Relaxed) - relocated_before;
        match index.grow_now() {
            Ok(()) => {
                self.table_runs_made.fetch_add(1, Ordering::Relaxed);
                info!(
                    segments = want,
                    emptied,
                    moved_entries = moved,
                    "emptied a run of segments for the index table, which grew into it"
                );
                true
            }
            Err(e) => {
                debug!(error = %e, "the index table did not grow into the run made for it");
                false
            }
        }
    }

    /// Empties the segments at `offsets` now, whatever their live share (see [`crate::Processor::clean_segments`]).
    pub(super) fn clean_segments(&self, offsets: &[u64]) -> Result<u64, ProcessorError> {
        let _no_rebalance = self.rebalance_lock.lock().expect("rebalance lock");
        let mut state = self.cleaner.lock().expect("cleaner lock");
        let mut freed = 0;
        for &segment in offsets {
            match self.clean_segment(&mut state, segment)? {
                Cleaned::Freed => freed += 1,
                Cleaned::Kept(why) => debug!(segment, ?why, "a segment asked to be emptied stays"),
            }
        }
        Ok(freed)
    }

    /// The first segment of the run of `want` segments that is cheapest to empty for an index table: every
    /// segment in it free, or one the cleaner may empty ([`Inner::for_each_cleanable`]); the cost is the live
    /// entries to copy, plus one per segment to empty. The highest such run of least cost, away from where log
    /// segments are granted.
    fn cheapest_run(&self, state: &CleanerState, want: u64) -> Option<u64> {
        let layout = *self.pool.layout();
        // Per segment: the cost of emptying it, or None when it cannot be.
        let mut cost: Vec<Option<u64>> = vec![Some(0); layout.segment_count as usize];
        for ext in self.pool.allocated() {
            if let Some(first) = layout.segment_index(ext.offset) {
                let end = (first + ext.segments).min(layout.segment_count);
                cost[first as usize..end as usize].fill(None);
            }
        }
        self.for_each_cleanable(state, |offset, st| {
            if let (Some(first), Some(last)) = (
                layout.segment_index(offset),
                layout.segment_index(st.end - 1),
            ) {
                cost[first as usize] = Some(st.entries.saturating_sub(st.invalid) + 1);
                cost[first as usize + 1..=last as usize].fill(Some(0));
            }
        });
        let want = want as usize;
        let mut best: Option<(u64, usize)> = None;
        // Sliding window: the sum of costs and the segments that cannot be emptied in [i + 1 - want, i].
        let (mut sum, mut fixed) = (0u64, 0usize);
        for i in 0..cost.len() {
            match cost[i] {
                Some(c) => sum += c,
                None => fixed += 1,
            }
            if i >= want {
                match cost[i - want] {
                    Some(c) => sum -= c,
                    None => fixed -= 1,
                }
            }
            if i + 1 >= want && fixed == 0 && best.is_none_or(|(b, _)| sum <= b) {
                best = Some((sum, i + 1 - want));
            }
        }
        best.map(|(_, start)| start as u64)
    }

    fn invalid_count(&self, segment: u64) -> u64 {
        self.stats_by_segment
            .lock()
            .expect("segment stats lock")
            .get(&segment)
            .map_or(0, |st| st.invalid)
    }

    /// The merged segment with the smallest share of live entries, if at most `clean_max_live_percent` of its
    /// entries are live, among those the cleaner may empty. The segments passed over whose counters changed since
    /// are tried again.
    fn pick_victim(&self, state: &mut CleanerState) -> Option<u64> {
        {
            let stats = self.stats_by_segment.lock().expect("segment stats lock");
            state.passed_over.retain(|offset, invalid| {
                stats.get(offset).is_some_and(|st| st.invalid == *invalid)
            });
        }
        let max_live = u64::from(self.clean_max_live_percent);
        let mut best: Option<(u64, u64, u64)> = None;
        self.for_each_cleanable(state, |offset, st| {
            let live = st.entries.saturating_sub(st.invalid);
            if live * 100 > st.entries * max_live {
                return;
            }
            // Smallest live / entries first.
            if best.is_none_or(|(_, l, e)| live * e < l * st.entries) {
                best = Some((offset, live, st.entries));
            }
        });
        best.map(|(offset, _, _)| offset)
    }

    /// Calls `f` with each merged segment the cleaner may empty and its counters, in pool order: every segment
    /// with counters but those holding no entry, the relocation logs' open heads, and those passed over (until
    /// more of their entries are superseded).
    fn for_each_cleanable(&self, state: &CleanerState, mut f: impl FnMut(u64, &SegStat)) {
        let heads: Vec<u64> = state.writers.values().filter_map(LogWriter::head).collect();
        let stats = self.stats_by_segment.lock().expect("segment stats lock");
        for (&offset, st) in stats.iter() {
            if st.entries > 0
                && !heads.contains(&offset)
                && !state.passed_over.contains_key(&offset)
            {
                f(offset, st);
            }
        }
    }

    /// Copies the live entries of the merged segment at `victim` into a relocation log and moves their index
    /// slots; the segment is then recycled.
    pub(super) fn clean_segment(
        &self,
        state: &mut CleanerState,
        victim: u64,
    ) -> Result<Cleaned, ProcessorError> {
        let Some(log_id) = self
            .stats_by_segment
            .lock()
            .expect("segment stats lock")
            .get(&victim)
            .map(|st| st.log_id)
        else {
            return Ok(Cleaned::Kept(Kept::Gone));
        };
        let Some(log) = self.logs.read().expect("logs lock").get(&log_id).cloned() else {
            return Ok(Cleaned::Kept(Kept::Gone));
        };
        let (first_seq, len, node) = {
            let meta = log.meta.lock().expect("log lock");
            let Some(seg) = meta.segments.iter().find(|s| s.offset == victim) else {
                return Ok(Cleaned::Kept(Kept::Gone));
            };
            match seg.sealed_len {
                Some(len) if seg.merged => (seg.first_seq, len, owner_node(meta.owner)),
                _ => return Ok(Cleaned::Kept(Kept::Open)),
            }
        };
        // The relocation log the copies go to: one for the shared index; else the partition's node's, unless the
        // node departed, when the rebalance after its departure empties the partition.
        let node = match self.indexes.partitioning() {
            Partitioning::Shared => MEMORY_NODE_ID,
            Partitioning::PerNode if self.indexes.is_departed(node) => {
                return Ok(Cleaned::Kept(Kept::DepartedPartition));
            }
            Partitioning::PerNode => node,
        };
        let mut data = std::mem::take(&mut state.data);
        self.read_entries(victim, len, &mut data)?;
        let base = victim + SEGMENT_HEADER_LEN as u64;
        let mode = self.dir.hash_mode();
        let cells = (self.shared_active.load(Ordering::Acquire) > 0)
            .then(|| self.cells.lock().expect("cells lock"));
        // The live entries: where each lies in `data`, and its reference.
        let mut live: Vec<(usize, EntryRef)> = Vec::new();
        let mut pinned = false;
        segment::scan_through(&data, log_id, first_seq, |at, e| {
            if e.header.op != Op::Put {
                return;
            }
            let Some(r) = EntryRef::new(base + at as u64, e.len() as u64) else {
                return;
            };
            if log.index.get(mode.hash(e.key), |c| c == r).is_some() {
                live.push((at, r));
            } else if let Some(cells) = cells.as_deref()
                && cells
                    .by_key(e.key)
                    .is_some_and(|c| c.state == CellState::Active && c.live == Some(r))
            {
                pinned = true;
            }
        });
        drop(cells);
        if pinned {
            debug!(
                segment = victim,
                "a live entry of a shared key keeps a segment from being cleaned"
            );
            state.data = data;
            return Ok(Cleaned::Kept(Kept::SharedKey));
        }
        let result = self.relocate(state, node, &log.index, &data, &live);
        state.data = data;
        let (moved, bytes) = result?;
        self.relocated_entries.fetch_add(moved, Ordering::Relaxed);
        self.relocated_bytes.fetch_add(bytes, Ordering::Relaxed);
        let gone = !self
            .stats_by_segment
            .lock()
            .expect("segment stats lock")
            .contains_key(&victim);
        if gone {
            self.cleaned_segments.fetch_add(1, Ordering::Relaxed);
            debug!(
                segment = victim,
                log = log_id,
                moved,
                bytes,
                "log segment cleaned"
            );
            Ok(Cleaned::Freed)
        } else {
            // Its counters still count live entries although no slot names one: a merge that superseded one has
            // yet to count it, or they drifted from the index (they are rebuilt from it at the next start).
            debug!(
                segment = victim,
                log = log_id,
                "a cleaned segment still counts live entries"
            );
            Ok(Cleaned::Kept(Kept::Unsettled))
        }
    }

    /// Copies the entries `live` (at their places in `data`) into `node`'s relocation log, then moves each index
    /// slot that still holds the original to its copy, counts what was superseded and recycles what that emptied.
    /// Returns the slots moved and the bytes they name.
    fn relocate(
        &self,
        state: &mut CleanerState,
        node: u32,
        index: &Index,
        data: &[u8],
        live: &[(usize, EntryRef)],
    ) -> Result<(u64, u64), ProcessorError> {
        if live.is_empty() {
            // Every entry was superseded since the counters were read.
            return Ok((0, 0));
        }
        let writer = match state.writers.entry(node) {
            std::collections::hash_map::Entry::Occupied(w) => w.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(LogWriter::open(self, node, CLEANER_THREAD)?)
            }
        };
        let mode = self.dir.hash_mode();
        let mut copies: Vec<(u64, EntryRef, (u32, u64), EntryRef)> = Vec::with_capacity(live.len());
        for &(at, old) in live {
            let e = EntryView::parse(&data[at..]).map_err(|e| {
                ProcessorError::Corrupt(format!(
                    "an entry at {:#x} that scanned valid does not parse: {e}",
                    old.offset()
                ))
            })?;
            let copy = writer.append(self, e.key, e.value)?;
            copies.push((mode.hash(e.key), old, (e.header.log_id, e.header.seq), copy));
        }
        // Copies are in the pool, and counted in their segments, before any slot names them.
        writer.flush_relocations(self)?;
        // Each original whose slot moved, and each copy whose slot did not, is superseded. A slot naming the
        // original's place may name another entry there by now: the key written meanwhile, its segment recycled
        // and written again at the same place and merged. So the entry there must still be the one copied (its
        // log and sequence number, read under the slot's lock); moving that slot would bring the old value back.
        let mut superseded = Vec::with_capacity(copies.len());
        let (mut moved, mut bytes) = (0u64, 0u64);
        let mut header = [0u8; ENTRY_HEADER_LEN];
        for &(hash, old, identity, copy) in &copies {
            let still_old = || {
                self.pool.read(old.offset(), &mut header).is_ok()
                    && EntryHeader::parse(&header).is_ok_and(|h| (h.log_id, h.seq) == identity)
            };
            if index.replace_if(hash, old, copy, still_old)? {
                superseded.push(old);
                moved += 1;
                bytes += copy.len();
            } else {
                superseded.push(copy);
            }
        }
        self.invalidate(&superseded)?;
        Ok((moved, bytes))
    }

    /// Seals the relocation log the cleaner writes for `node`, whose logs are being taken over, and lets go of it:
    /// it is cleaned like any log from now on, and retires once empty.
    pub(super) fn close_relocation_writer(&self, node: u32) -> Result<(), ProcessorError> {
        let mut state = self.cleaner.lock().expect("cleaner lock");
        match state.writers.remove(&node) {
            Some(writer) => writer.close(self),
            None => Ok(()),
        }
    }

    /// Marks the sealed segments of a relocation log merged without applying them (the cleaner moved the slots
    /// that name its copies) and moves its merged sequence number past them. Only a start finds such segments
    /// (a relocation log's segments are merged from their grant on), and recovery rebuilds their counters from the
    /// index afterwards.
    pub(super) fn settle_relocation_log(
        &self,
        log: &LogState,
        scratch: &mut Scratch,
    ) -> Result<(), ProcessorError> {
        let mut meta = log.meta.lock().expect("log lock");
        let mut last = None;
        for s in meta.segments.iter_mut().filter(|s| s.awaits_merge()) {
            self.read_entries(s.offset, s.sealed_len.unwrap_or(0), &mut scratch.data)?;
            segment::scan_through(&scratch.data, log.id, s.first_seq, |_, e| {
                last = Some(e.header.seq)
            });
            s.merged = true;
        }
        if let Some(seq) = last
            && seq > meta.merged_seq
        {
            self.dir.set_merged_seq(log.id, seq);
            meta.merged_seq = seq;
            meta.last_seq = meta.last_seq.max(seq);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_thread_tries_once_a_second_per_table_and_a_writer_whenever_it_needs() {
        let mut attempts = RoomAttempts::default();
        let t0 = Instant::now();
        assert!(attempts.admit(1, false, t0));
        assert!(
            !attempts.admit(1, false, t0 + ROOM_RETRY / 2),
            "a merge thread again"
        );
        assert!(
            attempts.admit(2, false, t0 + ROOM_RETRY / 2),
            "another table"
        );
        // A writer about to be refused tries even right after a failed attempt.
        assert!(attempts.admit(1, true, t0 + ROOM_RETRY / 2));
        assert!(attempts.admit(1, true, t0 + ROOM_RETRY / 2));
        // Its attempt counts for the merge threads' limit.
        assert!(!attempts.admit(1, false, t0 + ROOM_RETRY));
        assert!(attempts.admit(1, false, t0 + ROOM_RETRY * 2));
    }
}
