//! The log cleaner: frees the segments that a few live entries hold on to.
//!
//! A merged segment is recycled once every entry in it is superseded (the DINOMO paper's per-segment counters).
//! A key written once and never again keeps its whole segment, and under a skewed workload most segments end up
//! holding a few such entries among many dead ones: the pool fills although it holds far less live data. The
//! cleaner picks the merged segment with the smallest live share, copies its live entries into the relocation log
//! of the segment's node ([`CLEANER_THREAD`]), and moves each index slot from the old entry to its copy with
//! [`Index::replace`], which changes the slot only while it still holds the old entry: a key written (merged),
//! deleted or moved in the meantime keeps its newer state, and the copy counts as dead. The segment, now entirely
//! superseded, is recycled as any other.
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

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dinomo_index::Index;
use dinomo_log::segment;
use dinomo_log::{EntryRef, EntryView, Op, SEGMENT_HEADER_LEN, encode_entry, entry_len};
use tracing::{debug, warn};

use super::{CLEANER_THREAD, Inner, LogState, ProcessorError, Scratch, SegStat};
use crate::cells::CellState;
use crate::directory::owner_node;
use crate::proto;

thread_local! {
    /// Set while this thread runs a rebalance, which holds the rebalance lock the cleaner takes: its own segment
    /// grants must not wait for a cleaning.
    static IN_REBALANCE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as running a rebalance until the guard is dropped.
pub(super) fn rebalancing() -> impl Drop {
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            IN_REBALANCE.with(|r| r.set(false));
        }
    }
    IN_REBALANCE.with(|r| r.set(true));
    Guard
}

/// The cleaner's state between cleanings.
#[derive(Default)]
pub(super) struct CleanerState {
    /// The relocation log of each KV node (by node id) the cleaner has written to since start.
    writers: HashMap<u32, RelocationWriter>,
    /// Segments the cleaner could not empty (a live entry behind a shared key's cell), with their invalid count
    /// then: they are tried again once more of their entries are superseded.
    passed_over: HashMap<u64, u64>,
    /// Entries read from a segment being cleaned.
    data: Vec<u8>,
}

/// Appends copies to one relocation log, the way a KV-node worker writes its log: entries gathered locally,
/// written to the pool a segment part at a time, segments granted and sealed through the same call.
struct RelocationWriter {
    log: Arc<LogState>,
    session: u64,
    next_seq: u64,
    /// The open head: pool offset and bytes available for entries.
    head: Option<(u64, u64)>,
    /// Bytes of entries of the head already in the pool.
    written: u64,
    /// Entries not written yet.
    buf: Vec<u8>,
    /// Copies appended to the head since its counter was last raised.
    uncounted: u64,
}

/// What cleaning one segment did.
enum Cleaned {
    /// The segment was emptied and recycled.
    Freed,
    /// The segment stays: an entry in it is live through a shared key's cell, or it is gone or open.
    Kept,
}

impl Inner {
    /// The cleaner thread: while the pool's free share is below `clean_below_free_percent`, cleans the emptiest
    /// segment that qualifies; otherwise checks again every 50 ms.
    pub(super) fn cleaner_loop(&self) {
        const IDLE: Duration = Duration::from_millis(50);
        while !self.stopping.load(Ordering::Acquire) {
            if !self.space_low() || !self.clean_some(false, 8) {
                std::thread::sleep(IDLE);
            }
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
    /// copies may have taken the first one a cleaning freed) or no segment qualifies (waiting for a cleaning under way first). Whether one was freed. Not on a rebalance's
    /// own grants, which come here with the rebalance lock held.
    pub(super) fn clean_for_room(&self) -> bool {
        if self.clean_max_live_percent == 0 || IN_REBALANCE.with(Cell::get) {
            return false;
        }
        self.clean_some(true, 64)
    }

    /// Cleans up to `most` segments, stopping as soon as a segment is free when `one` (a grant waits); whether any
    /// was freed.
    fn clean_some(&self, one: bool, most: usize) -> bool {
        let segment_free = || self.pool.space().free_bytes() >= self.dir.segment_size();
        let _no_rebalance = self.rebalance_lock.lock().expect("rebalance lock");
        let mut state = self.cleaner.lock().expect("cleaner lock");
        let mut freed_any = false;
        for _ in 0..most {
            let enough = if one {
                freed_any && segment_free()
            } else {
                !self.space_low()
            };
            if enough || self.stopping.load(Ordering::Acquire) {
                break;
            }
            let Some(victim) = self.pick_victim(&mut state) else {
                break;
            };
            match self.clean_segment(&mut state, victim) {
                Ok(Cleaned::Freed) => freed_any = true,
                // Not tried again until more of its entries are superseded.
                Ok(Cleaned::Kept) => {
                    let invalid = self.invalid_count(victim);
                    state.passed_over.insert(victim, invalid);
                }
                Err(e) => {
                    warn!(segment = victim, error = %e, "cleaning a log segment failed");
                    let invalid = self.invalid_count(victim);
                    state.passed_over.insert(victim, invalid);
                    break;
                }
            }
        }
        freed_any
    }

    fn invalid_count(&self, segment: u64) -> u64 {
        self.stats_by_segment
            .lock()
            .expect("segment stats lock")
            .get(&segment)
            .map_or(0, |st| st.invalid)
    }

    /// The merged segment with the smallest share of live entries, if at most `clean_max_live_percent` of its
    /// entries are live. The relocation logs' open heads and the segments passed over (until more of their entries
    /// are superseded) are left out.
    fn pick_victim(&self, state: &mut CleanerState) -> Option<u64> {
        let stats = self.stats_by_segment.lock().expect("segment stats lock");
        state
            .passed_over
            .retain(|offset, invalid| stats.get(offset).is_some_and(|st| st.invalid == *invalid));
        let heads: Vec<u64> = state
            .writers
            .values()
            .filter_map(|w| w.head.map(|(offset, _)| offset))
            .collect();
        let max_live = u64::from(self.clean_max_live_percent);
        let mut best: Option<(u64, u64, u64)> = None;
        for (&offset, st) in stats.iter() {
            if st.entries == 0 || heads.contains(&offset) || state.passed_over.contains_key(&offset)
            {
                continue;
            }
            let live = st.entries.saturating_sub(st.invalid);
            if live * 100 > st.entries * max_live {
                continue;
            }
            // Smallest live / entries first.
            if best.is_none_or(|(_, l, e)| live * e < l * st.entries) {
                best = Some((offset, live, st.entries));
            }
        }
        best.map(|(offset, _, _)| offset)
    }

    /// Copies the live entries of the merged segment at `victim` into its node's relocation log and moves their
    /// index slots; the segment is then recycled.
    fn clean_segment(
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
            return Ok(Cleaned::Kept);
        };
        let Some(log) = self.logs.read().expect("logs lock").get(&log_id).cloned() else {
            return Ok(Cleaned::Kept);
        };
        let (first_seq, len, node) = {
            let meta = log.meta.lock().expect("log lock");
            let Some(seg) = meta.segments.iter().find(|s| s.offset == victim) else {
                return Ok(Cleaned::Kept);
            };
            match seg.sealed_len {
                Some(len) if seg.merged => (seg.first_seq, len, owner_node(meta.owner)),
                _ => return Ok(Cleaned::Kept),
            }
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
            return Ok(Cleaned::Kept);
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
            Ok(Cleaned::Kept)
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
            std::collections::hash_map::Entry::Vacant(v) => v.insert(self.relocation_writer(node)?),
        };
        let mode = self.dir.hash_mode();
        let mut copies: Vec<(u64, EntryRef, EntryRef)> = Vec::with_capacity(live.len());
        for &(at, old) in live {
            let e = EntryView::parse(&data[at..]).map_err(|e| {
                ProcessorError::Corrupt(format!(
                    "an entry at {:#x} that scanned valid does not parse: {e}",
                    old.offset()
                ))
            })?;
            let copy = writer.append(self, e.key, e.value)?;
            copies.push((mode.hash(e.key), old, copy));
        }
        // Copies are in the pool, and counted in their segments, before any slot names them.
        writer.flush(self)?;
        let (mut moved, mut dead_copies) = (Vec::new(), Vec::new());
        let mut bytes = 0u64;
        for &(hash, old, copy) in &copies {
            if index.replace(hash, old, copy)? {
                moved.push(old);
                bytes += copy.len();
            } else {
                dead_copies.push(copy);
            }
        }
        self.invalidate(&dead_copies)?;
        self.invalidate(&moved)?;
        Ok((moved.len() as u64, bytes))
    }

    /// Claims `node`'s relocation log (creating it the first time) for the cleaner.
    fn relocation_writer(&self, node: u32) -> Result<RelocationWriter, ProcessorError> {
        let opened = self.open_log(&proto::OpenLog {
            node_id: node,
            thread: CLEANER_THREAD,
        })?;
        let log = self
            .logs
            .read()
            .expect("logs lock")
            .get(&opened.log_id)
            .cloned()
            .ok_or_else(|| {
                ProcessorError::Corrupt("a relocation log vanished as it was claimed".into())
            })?;
        Ok(RelocationWriter {
            log,
            session: opened.session,
            next_seq: opened.next_seq,
            head: None,
            written: 0,
            buf: Vec::new(),
            uncounted: 0,
        })
    }

    /// Marks the sealed segments of a relocation log merged without applying them (the cleaner moved the slots
    /// that name its copies), and moves its merged sequence number past them. Outside recovery, which rebuilds
    /// every counter from the index afterwards, each such segment is counted: its entries, dead unless the index
    /// names them.
    pub(super) fn settle_relocation_log(
        &self,
        log: &LogState,
        scratch: &mut Scratch,
    ) -> Result<(), ProcessorError> {
        let recovering = self.recovering.load(Ordering::Acquire);
        let mode = self.dir.hash_mode();
        let mut meta = log.meta.lock().expect("log lock");
        let mut last = None;
        let mut counted = Vec::new();
        for s in meta.segments.iter_mut().filter(|s| s.awaits_merge()) {
            self.read_entries(s.offset, s.sealed_len.unwrap_or(0), &mut scratch.data)?;
            let base = s.offset + SEGMENT_HEADER_LEN as u64;
            let (mut entries, mut live) = (0u64, 0u64);
            segment::scan_through(&scratch.data, log.id, s.first_seq, |at, e| {
                last = Some(e.header.seq);
                entries += 1;
                if !recovering
                    && let Some(r) = EntryRef::new(base + at as u64, e.len() as u64)
                    && log.index.get(mode.hash(e.key), |c| c == r).is_some()
                {
                    live += 1;
                }
            });
            s.merged = true;
            counted.push((s.offset, s.offset + s.capacity, entries, entries - live));
        }
        if let Some(seq) = last
            && seq > meta.merged_seq
        {
            self.dir.set_merged_seq(log.id, seq);
            meta.merged_seq = seq;
            meta.last_seq = meta.last_seq.max(seq);
        }
        drop(meta);
        if recovering || counted.is_empty() {
            return Ok(());
        }
        let mut dead = Vec::new();
        {
            let mut stats = self.stats_by_segment.lock().expect("segment stats lock");
            for (offset, end, entries, invalid) in counted {
                stats.insert(
                    offset,
                    SegStat {
                        log_id: log.id,
                        end,
                        entries,
                        invalid,
                    },
                );
                if invalid >= entries {
                    dead.push(offset);
                }
            }
        }
        self.recycle(&dead)
    }
}

impl RelocationWriter {
    /// Entries are written to the pool whenever this many bytes are gathered.
    const WRITE_CHUNK: usize = 1 << 20;

    /// Appends a copy of `key`'s entry; returns where it will lie.
    fn append(
        &mut self,
        inner: &Inner,
        key: &[u8],
        value: &[u8],
    ) -> Result<EntryRef, ProcessorError> {
        let len = entry_len(key.len(), value.len()) as u64;
        let fits = |w: &Self| {
            w.head
                .is_some_and(|(_, room)| w.written + w.buf.len() as u64 + len <= room)
        };
        if !fits(self) {
            self.roll(inner)?;
            if !fits(self) {
                return Err(ProcessorError::Config(format!(
                    "an entry of {len} bytes does not fit in a log segment"
                )));
            }
        }
        let (head, _) = self.head.expect("a head after a roll");
        let at = head + SEGMENT_HEADER_LEN as u64 + self.written + self.buf.len() as u64;
        let r = EntryRef::new(at, len).ok_or_else(|| {
            ProcessorError::Corrupt(format!("a copy at {at:#x} ({len} bytes) cannot be indexed"))
        })?;
        encode_entry(
            &mut self.buf,
            Op::Put,
            self.log.id,
            self.next_seq,
            key,
            value,
        );
        self.next_seq += 1;
        self.uncounted += 1;
        if self.buf.len() >= Self::WRITE_CHUNK {
            self.write_buffered(inner)?;
        }
        Ok(r)
    }

    /// Writes and persists the gathered copies, raises the head's entry count by them (so that a merge superseding
    /// one counts it against a known total), and moves the log's merged sequence number past them.
    fn flush(&mut self, inner: &Inner) -> Result<(), ProcessorError> {
        self.write_buffered(inner)?;
        let last = self.next_seq - 1;
        let mut meta = self.log.meta.lock().expect("log lock");
        if last > meta.merged_seq {
            inner.dir.set_merged_seq(self.log.id, last);
            meta.merged_seq = last;
            meta.last_seq = meta.last_seq.max(last);
        }
        Ok(())
    }

    fn write_buffered(&mut self, inner: &Inner) -> Result<(), ProcessorError> {
        let Some((offset, _)) = self.head else {
            return Ok(());
        };
        if !self.buf.is_empty() {
            let at = offset + SEGMENT_HEADER_LEN as u64 + self.written;
            inner.pool.write(at, &self.buf)?;
            inner.pool.persist(at, self.buf.len() as u64);
            self.written += self.buf.len() as u64;
            self.buf.clear();
        }
        if self.uncounted > 0 {
            if let Some(st) = inner
                .stats_by_segment
                .lock()
                .expect("segment stats lock")
                .get_mut(&offset)
            {
                st.entries += self.uncounted;
            }
            self.uncounted = 0;
        }
        Ok(())
    }

    /// Seals the head (after writing what it holds) and starts a new one: from the free pool, else from the delete
    /// reserve (cleaning gives back more than it takes). The new head counts as merged from the start, with no
    /// entries.
    fn roll(&mut self, inner: &Inner) -> Result<(), ProcessorError> {
        self.write_buffered(inner)?;
        let sealed = self.head.map(|(offset, _)| offset);
        let granted = inner.next_segment_once(&proto::NextSegment {
            log_id: self.log.id,
            session: self.session,
            sealed_len: self.head.map(|_| self.written),
            first_seq: self.next_seq,
            deletes_only: true,
        })?;
        {
            let mut meta = self.log.meta.lock().expect("log lock");
            if let Some(s) = meta
                .segments
                .iter_mut()
                .find(|s| s.offset == granted.offset)
            {
                s.merged = true;
            }
        }
        inner
            .stats_by_segment
            .lock()
            .expect("segment stats lock")
            .insert(
                granted.offset,
                SegStat {
                    log_id: self.log.id,
                    end: granted.offset + granted.capacity,
                    entries: 0,
                    invalid: 0,
                },
            );
        self.head = Some((granted.offset, granted.capacity - SEGMENT_HEADER_LEN as u64));
        self.written = 0;
        // A sealed head whose copies were all superseded while it was open is recycled now that it may be.
        if let Some(offset) = sealed {
            inner.recycle(&[offset])?;
        }
        Ok(())
    }
}
