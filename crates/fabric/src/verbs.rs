//! Verbs, regions, remote addresses and batches: the vocabulary shared by every transport.

use std::marker::PhantomData;

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

/// One verb of a batch, as compact as the executor's loop wants it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchOp {
    pub rkey: u64,
    pub offset: u64,
    pub region: u32,
    pub len: u32,
    pub kind: VerbKind,
    /// READ: offset of the result in `Batch::data_in`; WRITE copied into the batch: offset of the payload in
    /// `Batch::out`; CAS: expected value; FAA: addend.
    pub arg0: u64,
    /// CAS: new value.
    pub arg1: u64,
    /// Previous value (CAS, FAA) after completion.
    pub result: u64,
    /// WRITE of a borrowed payload: its first byte (valid for `len` bytes while the batch's borrow lasts); null
    /// when the payload was copied into `Batch::out`.
    pub src: *const u8,
}

impl BatchOp {
    #[inline(always)]
    pub fn addr(&self) -> RemoteAddr {
        RemoteAddr {
            region: self.region,
            rkey: self.rkey,
            offset: self.offset,
        }
    }

    /// The payload of a WRITE: borrowed from the caller or copied into `out`.
    #[inline(always)]
    pub fn payload<'o>(&self, out: &'o [u8]) -> &'o [u8] {
        if self.src.is_null() {
            &out[self.arg0 as usize..][..self.len as usize]
        } else {
            // SAFETY: `src` came from a `&'a [u8]` of `len` bytes passed to `Batch::write`, and the batch holding this
            // op is a `Batch<'a>`, so the borrow outlives every use of the op (`Batch::reuse` drops the ops before it
            // releases the borrow).
            unsafe { std::slice::from_raw_parts(self.src, self.len as usize) }
        }
    }
}

/// Verbs posted together: one batch is one round trip, whatever it holds.
///
/// A batch executes in order; the first refused verb stops it and the rest are marked [`VerbError::Skipped`].
/// [`Batch::write`] borrows its payload for `'a`, so posting a batch of WRITEs copies each payload once, straight to
/// the pool; [`Batch::write_copy`] copies the payload into the batch instead, for a batch kept across calls
/// (`Batch<'static>`). Reuse a batch with [`Batch::clear`], or with [`Batch::reuse`] to free it of its borrows, to
/// avoid allocating on the hot path.
#[derive(Debug, Default, Clone)]
pub struct Batch<'a> {
    pub(crate) ops: Vec<BatchOp>,
    pub(crate) out: Vec<u8>,
    /// Destination of the READs: the first `data_len` bytes. It keeps its length across [`Batch::clear`], so that a
    /// reused batch does not zero its READ buffers again before every post.
    pub(crate) data_in: Vec<u8>,
    data_len: usize,
    /// The verb that stopped the last post, and why; the verbs after it were skipped.
    pub(crate) failed: Option<(u32, VerbError)>,
    /// The counts of the verbs added, kept as they are added (where each adding method knows its kind) rather
    /// than counted in another pass at post time.
    tally: BatchTally,
    /// The payloads of borrowed WRITEs.
    borrows: PhantomData<&'a [u8]>,
}

// SAFETY: the only non-`Send`/`Sync` field is each op's `src`, a pointer into a `&'a [u8]` the batch borrows; sharing
// or sending the batch shares or sends that shared borrow, which `&[u8]` allows.
unsafe impl Send for Batch<'_> {}
// SAFETY: as above.
unsafe impl Sync for Batch<'_> {}

/// Index of a verb inside a [`Batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(pub usize);

impl<'a> Batch<'a> {
    /// An empty batch.
    pub fn new() -> Batch<'a> {
        Batch::default()
    }

    /// Removes every verb, keeping the buffers.
    #[inline]
    pub fn clear(&mut self) {
        self.ops.clear();
        self.out.clear();
        self.data_len = 0;
        self.failed = None;
        self.tally = BatchTally::default();
    }

    /// Removes every verb and ends the batch's borrows, keeping its buffers: the way to reuse one batch for verbs
    /// whose payloads live shorter than the batch (keep a `Batch<'static>`, and `reuse` it for each round).
    #[inline]
    pub fn reuse<'b>(mut self) -> Batch<'b> {
        self.ops.clear();
        self.out.clear();
        Batch {
            ops: self.ops,
            out: self.out,
            data_in: self.data_in,
            data_len: 0,
            failed: None,
            tally: BatchTally::default(),
            borrows: PhantomData,
        }
    }

    /// Number of verbs.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when the batch holds no verb.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        kind: VerbKind,
        addr: RemoteAddr,
        len: u32,
        arg0: u64,
        arg1: u64,
        src: *const u8,
    ) -> Slot {
        self.tally.add(kind, len as u64);
        self.ops.push(BatchOp {
            rkey: addr.rkey,
            offset: addr.offset,
            region: addr.region,
            len,
            kind,
            arg0,
            arg1,
            result: 0,
            src,
        });
        Slot(self.ops.len() - 1)
    }

    /// Adds a READ of `len` bytes; [`Batch::read_data`] gives them after the post.
    #[inline]
    pub fn read(&mut self, addr: RemoteAddr, len: u32) -> Slot {
        let data = self.data_len;
        self.data_len = data + len as usize;
        if self.data_in.len() < self.data_len {
            self.grow_data_in();
        }
        self.push(VerbKind::Read, addr, len, data as u64, 0, std::ptr::null())
    }

    #[cold]
    #[inline(never)]
    fn grow_data_in(&mut self) {
        self.data_in.resize(self.data_len, 0);
    }

    /// Adds a WRITE of `bytes`, borrowed until the batch is cleared, reused or dropped: the post copies them
    /// straight to the memory node.
    #[inline]
    pub fn write(&mut self, addr: RemoteAddr, bytes: &'a [u8]) -> Slot {
        self.push(
            VerbKind::Write,
            addr,
            bytes.len() as u32,
            0,
            0,
            bytes.as_ptr(),
        )
    }

    /// Adds a WRITE of `bytes`, copied into the batch (for payloads that do not outlive it).
    #[inline]
    pub fn write_copy(&mut self, addr: RemoteAddr, bytes: &[u8]) -> Slot {
        let data = self.out.len();
        self.out.extend_from_slice(bytes);
        self.push(
            VerbKind::Write,
            addr,
            bytes.len() as u32,
            data as u64,
            0,
            std::ptr::null(),
        )
    }

    /// Adds a CAS.
    #[inline]
    pub fn cas(&mut self, addr: RemoteAddr, expected: u64, new: u64) -> Slot {
        self.push(VerbKind::Cas, addr, 8, expected, new, std::ptr::null())
    }

    /// Adds an FAA.
    #[inline]
    pub fn faa(&mut self, addr: RemoteAddr, add: u64) -> Slot {
        self.push(VerbKind::Faa, addr, 8, add, 0, std::ptr::null())
    }

    /// Bytes read by a completed READ. Those of a READ that did not complete (refused or skipped) are unspecified:
    /// zeros, or bytes an earlier use of this batch read.
    #[inline]
    pub fn read_data(&self, slot: Slot) -> &[u8] {
        let op = &self.ops[slot.0];
        &self.data_in[op.arg0 as usize..][..op.len as usize]
    }

    /// Previous value returned by a completed CAS or FAA (0 for one that did not complete).
    #[inline]
    pub fn old_value(&self, slot: Slot) -> u64 {
        let result = self.ops[slot.0].result;
        match self.failed {
            Some((at, _)) if slot.0 >= at as usize => 0,
            _ => result,
        }
    }

    /// Outcome of one verb after the batch was posted (`Ok` also before posting).
    pub fn status(&self, slot: Slot) -> Result<(), VerbError> {
        assert!(slot.0 < self.ops.len(), "no verb in slot {}", slot.0);
        match self.failed {
            Some((at, e)) if slot.0 == at as usize => Err(e),
            Some((at, _)) if slot.0 > at as usize => Err(VerbError::Skipped),
            _ => Ok(()),
        }
    }

    /// The counts of every verb of the batch, for the thread counters (a batch's refused and skipped verbs count
    /// too: they went out in its round trip).
    pub(crate) fn tally(&self) -> &BatchTally {
        &self.tally
    }

    /// The batch's first refused verb after a post: its index, kind and why.
    pub(crate) fn first_error(&self) -> Option<(usize, VerbKind, VerbError)> {
        self.failed
            .map(|(at, e)| (at as usize, self.ops[at as usize].kind, e))
    }
}
