//! Appends entries to one of the memory node's own logs: a node's migration log (entries copied between partitions
//! by a rebalance, merged like a worker's) or its relocation log (the cleaner's copies, never merged).

use std::sync::Arc;

use dinomo_log::{EntryRef, Op, SEGMENT_HEADER_LEN, encode_entry, entry_len};

use super::{Inner, LogState, ProcessorError, SegStat};
use crate::proto;

/// Writes a log the way a KV-node worker does: entries gathered locally, written to the pool a segment part at a
/// time, segments granted and sealed through the same call.
pub(super) struct LogWriter {
    log: Arc<LogState>,
    session: u64,
    next_seq: u64,
    /// The head: pool offset and bytes available for entries.
    head: Option<(u64, u64)>,
    /// Bytes of entries of the head already in the pool.
    written: u64,
    /// Entries not written yet.
    buf: Vec<u8>,
    /// Bytes of entries appended in all.
    appended_bytes: u64,
    /// Relocation logs: entries appended to the head since its counter was last raised.
    uncounted: u64,
}

impl LogWriter {
    /// Entries are written to the pool whenever this many bytes are gathered.
    const WRITE_CHUNK: usize = 1 << 20;

    /// Claims the log of `node`'s `thread` (creating it the first time).
    pub(super) fn open(inner: &Inner, node: u32, thread: u32) -> Result<LogWriter, ProcessorError> {
        let opened = inner.open_log(
            &proto::OpenLog {
                node_id: node,
                thread,
            },
            super::Claim::MemoryNode,
        )?;
        let log = inner
            .logs
            .read()
            .expect("logs lock")
            .get(&opened.log_id)
            .cloned()
            .ok_or_else(|| ProcessorError::Corrupt("a log vanished as it was claimed".into()))?;
        Ok(LogWriter {
            log,
            session: opened.session,
            next_seq: opened.next_seq,
            head: None,
            written: 0,
            buf: Vec::new(),
            appended_bytes: 0,
            uncounted: 0,
        })
    }

    /// The head segment's offset, if one was granted.
    pub(super) fn head(&self) -> Option<u64> {
        self.head.map(|(offset, _)| offset)
    }

    /// Appends a put of `key`; returns where the entry will lie.
    pub(super) fn append(
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
            ProcessorError::Corrupt(format!(
                "an entry at {at:#x} ({len} bytes) cannot be indexed"
            ))
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
        self.appended_bytes += len;
        self.uncounted += 1;
        if self.buf.len() >= Self::WRITE_CHUNK {
            self.write_buffered(inner)?;
        }
        Ok(r)
    }

    /// Migration logs: writes what is left, seals the log and merges all of it, and lets go of it (the next
    /// rebalance claims it again); returns the bytes of entries appended.
    pub(super) fn finish_merged(mut self, inner: &Inner) -> Result<u64, ProcessorError> {
        self.write_buffered(inner)?;
        self.seal_and_merge(inner)?;
        inner.let_go(&self.log, self.session);
        Ok(self.appended_bytes)
    }

    /// Seals the head where the entries written end and merges the log (a relocation log's merge only settles
    /// what is sealed).
    fn seal_and_merge(&self, inner: &Inner) -> Result<(), ProcessorError> {
        inner.merge_all(&proto::MergeAll {
            log_id: self.log.id,
            session: self.session,
            sealed_len: self.head.map(|_| self.written),
        })?;
        Ok(())
    }

    /// Relocation logs: seals the head after the copies written so far and lets go of the log, which is then
    /// cleaned and recycled like any other and gives its descriptor back once empty.
    pub(super) fn close(mut self, inner: &Inner) -> Result<(), ProcessorError> {
        self.flush_relocations(inner)?;
        self.seal_and_merge(inner)?;
        // Copies all superseded already leave a dead head, which no merge will count again.
        if let Some(head) = self.head() {
            inner.recycle(&[head])?;
        }
        inner.let_go(&self.log, self.session);
        Ok(())
    }

    /// Relocation logs: writes and persists the gathered copies, raises the head's entry count by them (so that a
    /// merge superseding one counts it against a known total), and moves the log's merged sequence number past
    /// them: nothing of a relocation log is ever merged.
    pub(super) fn flush_relocations(&mut self, inner: &Inner) -> Result<(), ProcessorError> {
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
        if self.log.relocation && self.uncounted > 0 {
            if let Some(st) = inner
                .stats_by_segment
                .lock()
                .expect("segment stats lock")
                .get_mut(&offset)
            {
                st.entries += self.uncounted;
            }
        }
        self.uncounted = 0;
        Ok(())
    }

    /// Seals the head (after writing what it holds) and starts a new one, without the grant's cleaning. A relocation
    /// log's segment comes from the free pool or else the delete reserve (cleaning gives back more than it takes); it is merged from the start and counted from its first entry, and a sealed head whose copies were
    /// all superseded meanwhile is recycled once sealed.
    fn roll(&mut self, inner: &Inner) -> Result<(), ProcessorError> {
        self.write_buffered(inner)?;
        let sealed = self.head();
        let req = proto::NextSegment {
            log_id: self.log.id,
            session: self.session,
            sealed_len: self.head.map(|_| self.written),
            first_seq: self.next_seq,
            deletes_only: self.log.relocation,
        };
        // A migration log is written by a rebalance, which holds the lock the cleaner takes.
        let granted = if self.log.relocation {
            inner.next_segment_once(&req)?
        } else {
            inner.next_segment(&req, false)?
        };
        self.head = Some((granted.offset, granted.capacity - SEGMENT_HEADER_LEN as u64));
        self.written = 0;
        if self.log.relocation {
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
            if let Some(offset) = sealed {
                inner.recycle(&[offset])?;
            }
        }
        Ok(())
    }
}
