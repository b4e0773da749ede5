//! A walk over every key the memory node holds, one bounded step per call ([`proto::SCAN_KEYS`], behind Redis's
//! `SCAN` and `KEYS`).
//!
//! A key is either in the index (merged), in a shared key's cell, or only in a log entry not merged yet. A walk
//! reads the logs first, then the index: an entry moves from a log into the index and never back, so a key that
//! stays from the walk's start to its end is met in the log phase if it is still unmerged when the walk passes its
//! entry, and in the index phase otherwise.
//!
//! The cursor is a Redis cursor (a `u64`, 0 to start and to end):
//! - **log phase** (top bit set): the log id (23 bits) and the low 40 bits of the sequence number to read next. A
//!   step reads whole unmerged segments, up to [`LOG_STEP_BYTES`], and names the keys whose newest entry it read
//!   writes a value. The full sequence number is recovered as the one nearest the log's merged point: a walk
//!   cannot fall 2^39 entries behind it.
//! - **index phase** (second bit set): a slice of the hash space at the resolution of the largest index table,
//!   stepped in reversed-bit order ([`dinomo_index::next_slice`]), so that tables growing, and partitions coming
//!   and going, between steps make no key that stays be missed. A step reads every index's entries in its slices
//!   and the active shared keys of those slices together, under the locks that moving a key between partitions
//!   or into and out of a cell takes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use dinomo_index::layout::{bucket_index, stored_hash};
use dinomo_index::next_slice;
use dinomo_log::{ENTRY_HEADER_LEN, EntryHeader, EntryRef, Op, segment};

use super::{Inner, LogState, ProcessorError};
use crate::cells::{self, CellState};
use crate::proto;

const LOG_PHASE: u64 = 1 << 63;
const INDEX_PHASE: u64 = 1 << 62;
const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Log ids are directory slots, far below this.
const MAX_LOG_ID: u32 = (1 << 23) - 1;
/// Segment bytes one log-phase step reads before it answers (it reads whole segments, so one segment more at
/// most): a step holds one of the memory node's few RPC threads, which segment grants wait for.
const LOG_STEP_BYTES: u64 = 4 << 20;
/// The most a reply carries, whatever the caller asks: well below the fabric's message limit.
const MAX_REPLY_BYTES: u32 = 4 << 20;
/// Slices one index-phase step visits per key asked for when they are empty (as Redis's `SCAN` visits at most ten
/// empty buckets per key asked for).
const EMPTY_SLICES_PER_KEY: u64 = 10;
/// The most slices one index-phase step visits, whatever `count` asks: a step holds the rebalance and cell locks.
const MAX_SLICES_PER_STEP: u64 = 1 << 16;
/// Bytes counted per key for its length prefix in the reply.
const PER_KEY_OVERHEAD: usize = 5;

/// Where a walk stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// Reading log `log_id` (or the first log after it, when it is gone) from the entry whose sequence number
    /// ends in `seq_low`; `None`: from its oldest unmerged entry.
    Log { log_id: u32, seq_low: Option<u64> },
    /// Reading the index at `slice`.
    Index { slice: u64 },
}

impl Position {
    fn decode(cursor: u64) -> Result<Position, ProcessorError> {
        if cursor == 0 {
            Ok(Position::Log {
                log_id: 0,
                seq_low: None,
            })
        } else if cursor & LOG_PHASE != 0 {
            Ok(Position::Log {
                log_id: ((cursor & !LOG_PHASE) >> SEQ_BITS) as u32,
                seq_low: Some(cursor & SEQ_MASK),
            })
        } else if cursor & INDEX_PHASE != 0 {
            Ok(Position::Index {
                slice: cursor & !INDEX_PHASE,
            })
        } else {
            Err(ProcessorError::Config(format!(
                "{cursor} is not a cursor this memory node gave out"
            )))
        }
    }

    /// A log position's cursor; `seq` is the next entry's full sequence number.
    fn log(log_id: u32, seq: u64) -> u64 {
        LOG_PHASE | (u64::from(log_id.min(MAX_LOG_ID)) << SEQ_BITS) | (seq & SEQ_MASK)
    }

    fn index(slice: u64) -> u64 {
        INDEX_PHASE | (slice & !(LOG_PHASE | INDEX_PHASE))
    }
}

/// The sequence number ending in `low` nearest after `merged` (entries up to `merged` are in the index already).
fn full_seq(low: u64, merged: u64) -> u64 {
    let from = merged.saturating_add(1);
    let ahead = low.wrapping_sub(from) & SEQ_MASK;
    if ahead < 1 << (SEQ_BITS - 1) {
        from + ahead
    } else {
        // Behind the merged point: everything it named is merged since.
        from
    }
}

/// The keys of one step, each once, within a byte budget.
struct Page {
    keys: HashSet<Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
}

impl Page {
    fn full(&self) -> bool {
        self.bytes >= self.max_bytes
    }

    fn push(&mut self, key: &[u8]) {
        if !self.keys.contains(key) {
            self.bytes += key.len() + PER_KEY_OVERHEAD;
            self.keys.insert(key.to_vec());
        }
    }
}

impl Inner {
    pub(super) fn scan_keys(
        &self,
        req: &proto::ScanKeys,
    ) -> Result<proto::KeysPage, ProcessorError> {
        let count = u64::from(req.count.max(1));
        let mut page = Page {
            keys: HashSet::new(),
            bytes: 0,
            max_bytes: req.max_bytes.clamp(1, MAX_REPLY_BYTES) as usize,
        };
        let cursor = match Position::decode(req.cursor)? {
            Position::Log { log_id, seq_low } => {
                self.scan_logs(log_id, seq_low, count, &mut page)?
            }
            Position::Index { slice } => self.scan_index(slice, count, &mut page)?,
        };
        Ok(proto::KeysPage {
            cursor,
            keys: page.keys.into_iter().collect(),
        })
    }

    /// A log-phase step from log `log_id`; the next cursor.
    fn scan_logs(
        &self,
        log_id: u32,
        seq_low: Option<u64>,
        count: u64,
        page: &mut Page,
    ) -> Result<u64, ProcessorError> {
        let mut logs: Vec<Arc<LogState>> = self
            .all_logs()
            .into_iter()
            // A relocation log holds copies the index already names.
            .filter(|l| l.id >= log_id && !l.relocation)
            .collect();
        logs.sort_by_key(|l| l.id);
        let mut read = 0u64;
        let mut data = Vec::new();
        for log in &logs {
            let (segments, merged_seq) = log.unmerged_segments();
            let mut next = match seq_low {
                Some(low) if log.id == log_id => full_seq(low, merged_seq),
                _ => merged_seq.saturating_add(1),
            };
            for (i, &(offset, first_seq, len)) in segments.iter().enumerate() {
                // Only segments that may hold entries from `next` on.
                if segments
                    .get(i + 1)
                    .is_some_and(|&(_, after, _)| after <= next)
                {
                    continue;
                }
                if read >= LOG_STEP_BYTES || page.keys.len() as u64 >= count || page.full() {
                    return Ok(Position::log(log.id, next));
                }
                read += len;
                self.read_entries(offset, len, &mut data)?;
                // (sequence number, where the key lies in `data`, its length, whether it writes a value)
                let mut entries: Vec<(u64, usize, usize, bool)> = Vec::new();
                segment::scan_through(&data, log.id, first_seq, |at, e| {
                    let seq = e.header.seq;
                    if seq >= next && seq > merged_seq {
                        let key_at = at + ENTRY_HEADER_LEN;
                        entries.push((seq, key_at, e.key.len(), e.header.op == Op::Put));
                    }
                });
                let key = |at: usize, len: usize| &data[at..at + len];
                // Each key's newest entry here; a key is named there, so that a step ending partway through the
                // segment leaves every key it did not name to the next one, which starts at the entry it ended at.
                let newest: HashMap<&[u8], u64> = entries
                    .iter()
                    .map(|&(seq, at, len, _)| (key(at, len), seq))
                    .collect();
                for &(seq, at, len, put) in &entries {
                    let k = key(at, len);
                    if !put || newest[k] != seq {
                        continue;
                    }
                    if page.full() {
                        return Ok(Position::log(log.id, seq));
                    }
                    page.push(k);
                }
                if let Some(&(seq, ..)) = entries.last() {
                    next = seq.saturating_add(1);
                }
            }
        }
        Ok(Position::index(0))
    }

    /// An index-phase step from `slice`; the next cursor (0 once every slice was read).
    fn scan_index(&self, slice: u64, count: u64, page: &mut Page) -> Result<u64, ProcessorError> {
        // Moving keys between partitions takes the first lock, and moving a key between the index and a cell the
        // second: a step sees each key of its slices in one place.
        let _no_rebalance = self.rebalance_lock.lock().expect("rebalance lock");
        let cells = self.cells.lock().expect("cells lock");
        let indexes = self.indexes.all();
        let bits = indexes
            .iter()
            .map(|(_, index)| index.bucket_bits())
            .max()
            .unwrap_or(0);
        let slices = 1u64 << bits;
        let mode = self.dir.hash_mode();
        let shared: Vec<(u64, &[u8])> = cells
            .cells()
            .filter(|c| c.state == CellState::Active)
            .filter(|c| {
                cells.word(c.slot).is_ok_and(|w| {
                    let w = w.load(Ordering::Acquire);
                    w != 0 && w != cells::RETIRED
                })
            })
            .map(|c| {
                let at = bucket_index(stored_hash(mode.hash(&c.key)), slices);
                (at, c.key.as_slice())
            })
            .collect();
        let mut refs = Vec::new();
        let mut key = Vec::new();
        let mut slice = slice & (slices - 1);
        let mut visited = 0u64;
        loop {
            refs.clear();
            for (_, index) in &indexes {
                index.for_each_in_slice(slice, bits, |_, r| refs.push(r));
            }
            for &r in &refs {
                if self.entry_key(r, &mut key)? {
                    page.push(&key);
                }
            }
            for &(_, k) in shared.iter().filter(|(at, _)| *at == slice) {
                page.push(k);
            }
            visited += 1;
            slice = next_slice(slice, bits);
            if slice == 0 {
                return Ok(0);
            }
            if page.keys.len() as u64 >= count
                || page.full()
                || visited
                    >= count
                        .saturating_mul(EMPTY_SLICES_PER_KEY)
                        .min(MAX_SLICES_PER_STEP)
            {
                return Ok(Position::index(slice));
            }
        }
    }

    /// Reads the key of the entry `r` names into `key`; false when the entry does not parse (the pool checker
    /// reports such damage; a walk goes on).
    fn entry_key(&self, r: EntryRef, key: &mut Vec<u8>) -> Result<bool, ProcessorError> {
        let mut header = [0u8; ENTRY_HEADER_LEN];
        self.pool.read(r.offset(), &mut header)?;
        let Ok(h) = EntryHeader::parse(&header) else {
            return Ok(false);
        };
        key.resize(usize::from(h.key_len), 0);
        self.pool.read(r.offset() + ENTRY_HEADER_LEN as u64, key)?;
        Ok(true)
    }
}
