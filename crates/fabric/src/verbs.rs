//! Verbs, regions, remote addresses and batches: the vocabulary shared by every transport.

use serde::{Deserialize, Serialize};

use crate::counters::BatchTally;
use crate::error::VerbError;

/// The one-sided verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum VerbKind {
    /// Copy bytes from the memory node.
    Read,
    /// Copy bytes to the memory node.
    Write,
    /// 8-byte compare-and-swap; returns the previous value.
    Cas,
    /// 8-byte fetch-and-add; returns the previous value.
    Faa,
}

/// What a region allows, as bit flags (like RDMA's remote access flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access(pub u8);

impl Access {
    /// READ allowed.
    pub const READ: Access = Access(1);
    /// WRITE allowed.
    pub const WRITE: Access = Access(2);
    /// CAS and FAA allowed.
    pub const ATOMIC: Access = Access(4);
    /// Everything.
    pub const ALL: Access = Access(7);

    /// True when every flag of `need` is set.
    #[inline]
    pub fn allows(self, need: Access) -> bool {
        self.0 & need.0 == need.0
    }

    pub(crate) fn for_verb(kind: VerbKind) -> Access {
        match kind {
            VerbKind::Read => Access::READ,
            VerbKind::Write => Access::WRITE,
            VerbKind::Cas | VerbKind::Faa => Access::ATOMIC,
        }
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// A registered region as a client sees it after the handshake.
///
/// Offsets are *pool offsets*: a region covers `[start, start + len)` of the pool, so a pointer stored in the pool
/// means the same thing to every client and across restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    /// Region id, used in every verb.
    pub id: u32,
    /// Well-known name ("data", "roots").
    pub name: String,
    /// Key that every verb on the region must present.
    pub rkey: u64,
    /// First pool offset covered.
    pub start: u64,
    /// Bytes covered.
    pub len: u64,
    /// Permitted verbs.
    pub access: Access,
}

impl RegionInfo {
    /// The remote address of pool offset `offset` in this region.
    #[inline]
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            region: self.id,
            rkey: self.rkey,
            offset,
        }
    }

    /// One past the last pool offset covered.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// Where a verb goes: a region, its key and a pool offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteAddr {
    /// Region id.
    pub region: u32,
    /// Region key.
    pub rkey: u64,
    /// Pool offset.
    pub offset: u64,
}

impl RemoteAddr {
    /// The address `by` bytes further.
    #[inline]
    pub fn offset_by(self, by: u64) -> RemoteAddr {
        RemoteAddr {
            offset: self.offset.wrapping_add(by),
            ..self
        }
    }
}

/// One verb of a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchOp {
    pub kind: VerbKind,
    pub addr: RemoteAddr,
    pub len: u32,
    /// Offset of the payload in `Batch::out` (writes) or of the result in `Batch::data_in` (reads).
    pub data: usize,
    /// CAS expected / FAA addend.
    pub arg0: u64,
    /// CAS new value.
    pub arg1: u64,
    /// Previous value (CAS, FAA) after completion.
    pub result: u64,
    pub status: Option<VerbError>,
}

/// Verbs posted together: one batch is one round trip, whatever it holds.
///
/// A batch executes in order; the first refused verb stops it and the rest are marked [`VerbError::Skipped`].
/// Reuse a batch with [`Batch::clear`] to avoid allocating on the hot path.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub(crate) ops: Vec<BatchOp>,
    pub(crate) out: Vec<u8>,
    /// Destination of the READs: the first `data_len` bytes. It keeps its length across [`Batch::clear`], so that a
    /// reused batch does not zero its READ buffers again before every post.
    pub(crate) data_in: Vec<u8>,
    data_len: usize,
    /// Counts of the verbs added, for the thread counters.
    pub(crate) tally: BatchTally,
}

/// Index of a verb inside a [`Batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(pub usize);

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Removes every verb, keeping the buffers.
    #[inline]
    pub fn clear(&mut self) {
        self.ops.clear();
        self.out.clear();
        self.data_len = 0;
        self.tally = BatchTally::default();
    }

    /// Number of verbs.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when the batch holds no verb.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    #[inline]
    fn push(
        &mut self,
        kind: VerbKind,
        addr: RemoteAddr,
        len: u32,
        data: usize,
        arg0: u64,
        arg1: u64,
    ) -> Slot {
        self.tally.add(kind, len as u64);
        self.ops.push(BatchOp {
            kind,
            addr,
            len,
            data,
            arg0,
            arg1,
            result: 0,
            status: None,
        });
        Slot(self.ops.len() - 1)
    }

    /// Adds a READ of `len` bytes.
    #[inline]
    pub fn read(&mut self, addr: RemoteAddr, len: u32) -> Slot {
        let data = self.data_len;
        self.data_len = data + len as usize;
        if self.data_in.len() < self.data_len {
            self.grow_data_in();
        }
        self.push(VerbKind::Read, addr, len, data, 0, 0)
    }

    #[cold]
    #[inline(never)]
    fn grow_data_in(&mut self) {
        self.data_in.resize(self.data_len, 0);
    }

    /// Adds a WRITE of `bytes` (copied into the batch).
    #[inline]
    pub fn write(&mut self, addr: RemoteAddr, bytes: &[u8]) -> Slot {
        let data = self.out.len();
        self.out.extend_from_slice(bytes);
        self.push(VerbKind::Write, addr, bytes.len() as u32, data, 0, 0)
    }

    /// Adds a CAS.
    #[inline]
    pub fn cas(&mut self, addr: RemoteAddr, expected: u64, new: u64) -> Slot {
        self.push(VerbKind::Cas, addr, 8, 0, expected, new)
    }

    /// Adds an FAA.
    #[inline]
    pub fn faa(&mut self, addr: RemoteAddr, add: u64) -> Slot {
        self.push(VerbKind::Faa, addr, 8, 0, add, 0)
    }

    /// Bytes read by a completed READ. Those of a READ that did not complete (refused or skipped) are unspecified:
    /// zeros, or bytes an earlier use of this batch read.
    #[inline]
    pub fn read_data(&self, slot: Slot) -> &[u8] {
        let op = &self.ops[slot.0];
        &self.data_in[op.data..op.data + op.len as usize]
    }

    /// Previous value returned by a completed CAS or FAA.
    #[inline]
    pub fn old_value(&self, slot: Slot) -> u64 {
        self.ops[slot.0].result
    }

    /// Outcome of one verb after the batch was posted (`Ok` also before posting).
    pub fn status(&self, slot: Slot) -> Result<(), VerbError> {
        match self.ops[slot.0].status {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    pub(crate) fn reset_results(&mut self) {
        for op in &mut self.ops {
            op.status = None;
            op.result = 0;
        }
    }

    pub(crate) fn first_error(&self) -> Option<(usize, VerbKind, VerbError)> {
        self.ops
            .iter()
            .enumerate()
            .find_map(|(i, op)| match op.status {
                Some(e) if e != VerbError::Skipped => Some((i, op.kind, e)),
                _ => None,
            })
    }
}
