//! Per-thread fabric counters: round trips, verbs by kind, bytes out and in.
//!
//! Each thread owns its counters and is their only writer, so an update is a plain load and store (no locked
//! instruction). Other threads read them through the registry: [`thread_snapshot`] gives the calling thread's,
//! [`global_snapshot`] the sum over all threads, live and exited.
//!
//! Bytes are counted as on the wire of the TCP transport (fixed headers plus payload) for every transport, so
//! per-operation figures compare across transports.

use std::cell::Cell;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};

use crate::verbs::VerbKind;
use crate::wire::{REQ_HEADER, RESP_HEADER};

/// A copy of a set of counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSnapshot {
    /// Round trips (a single verb, a posted batch or an RPC each count one).
    pub round_trips: u64,
    /// READ verbs.
    pub reads: u64,
    /// WRITE verbs.
    pub writes: u64,
    /// CAS verbs.
    pub cas: u64,
    /// FAA verbs.
    pub faa: u64,
    /// Two-sided calls.
    pub rpcs: u64,
    /// Bytes sent towards memory nodes.
    pub bytes_out: u64,
    /// Bytes received from memory nodes.
    pub bytes_in: u64,
}

impl CounterSnapshot {
    /// All counters at zero.
    pub const ZERO: CounterSnapshot = CounterSnapshot {
        round_trips: 0,
        reads: 0,
        writes: 0,
        cas: 0,
        faa: 0,
        rpcs: 0,
        bytes_out: 0,
        bytes_in: 0,
    };

    /// One-sided verbs of all kinds.
    pub fn verbs(&self) -> u64 {
        self.reads + self.writes + self.cas + self.faa
    }
}

macro_rules! fieldwise {
    ($trait:ident, $method:ident, $op:ident) => {
        impl $trait for CounterSnapshot {
            type Output = CounterSnapshot;
            fn $method(self, o: CounterSnapshot) -> CounterSnapshot {
                CounterSnapshot {
                    round_trips: self.round_trips.$op(o.round_trips),
                    reads: self.reads.$op(o.reads),
                    writes: self.writes.$op(o.writes),
                    cas: self.cas.$op(o.cas),
                    faa: self.faa.$op(o.faa),
                    rpcs: self.rpcs.$op(o.rpcs),
                    bytes_out: self.bytes_out.$op(o.bytes_out),
                    bytes_in: self.bytes_in.$op(o.bytes_in),
                }
            }
        }
    };
}
fieldwise!(Add, add, wrapping_add);
fieldwise!(Sub, sub, wrapping_sub);

/// What one thread recorded, kept so that every verb updates as few cells as possible: a single verb bumps its
/// kind's single-verb count and, for READ and WRITE, the payload bytes; round trips, verbs and wire bytes are derived
/// from these in [`Cells::snapshot`]. Every cell only grows, so every derived figure only grows too.
#[derive(Default)]
struct Cells {
    /// Verbs sent alone, by [`kind_index`]: each one verb and one round trip.
    single: [AtomicU64; 4],
    /// Verbs posted in batches, by [`kind_index`].
    batched: [AtomicU64; 4],
    /// Posted batches (one round trip each).
    batches: AtomicU64,
    /// Two-sided calls (one round trip each).
    rpcs: AtomicU64,
    /// READ payload bytes (received beyond the response headers).
    read_payload: AtomicU64,
    /// WRITE payload bytes (sent beyond the request headers).
    write_payload: AtomicU64,
    /// Bytes of two-sided calls, headers included.
    rpc_bytes_out: AtomicU64,
    rpc_bytes_in: AtomicU64,
}

/// Position of `kind` in the per-kind cells.
#[inline(always)]
const fn kind_index(kind: VerbKind) -> usize {
    match kind {
        VerbKind::Read => 0,
        VerbKind::Write => 1,
        VerbKind::Cas => 2,
        VerbKind::Faa => 3,
    }
}

#[inline(always)]
fn bump(c: &AtomicU64, by: u64) {
    // Single writer: load + store is enough and avoids a locked read-modify-write.
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl Cells {
    fn snapshot(&self) -> CounterSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let single = self.single.each_ref().map(load);
        let verbs = std::array::from_fn(|k| single[k].wrapping_add(load(&self.batched[k])));
        let rpcs = load(&self.rpcs);
        verbs_snapshot(verbs, load(&self.read_payload), load(&self.write_payload))
            + CounterSnapshot {
                round_trips: sum(single)
                    .wrapping_add(load(&self.batches))
                    .wrapping_add(rpcs),
                rpcs,
                bytes_out: load(&self.rpc_bytes_out),
                bytes_in: load(&self.rpc_bytes_in),
                ..CounterSnapshot::ZERO
            }
    }
}

/// The counts of one-sided verbs, by [`kind_index`], moving `read_payload` and `write_payload` payload bytes, with
/// their wire bytes (headers included); no round trips.
fn verbs_snapshot(verbs: [u64; 4], read_payload: u64, write_payload: u64) -> CounterSnapshot {
    let all = sum(verbs);
    CounterSnapshot {
        reads: verbs[kind_index(VerbKind::Read)],
        writes: verbs[kind_index(VerbKind::Write)],
        cas: verbs[kind_index(VerbKind::Cas)],
        faa: verbs[kind_index(VerbKind::Faa)],
        bytes_out: all
            .wrapping_mul(REQ_HEADER as u64)
            .wrapping_add(write_payload),
        bytes_in: all
            .wrapping_mul(RESP_HEADER as u64)
            .wrapping_add(read_payload),
        ..CounterSnapshot::ZERO
    }
}

fn sum(counts: [u64; 4]) -> u64 {
    counts.iter().fold(0, |a, &c| a.wrapping_add(c))
}

struct Registry {
    live: Vec<Weak<Cells>>,
    retired: CounterSnapshot,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    live: Vec::new(),
    retired: CounterSnapshot::ZERO,
});

/// The thread's cells; folds them into the retired total when the thread exits.
struct Local(Arc<Cells>);

impl Local {
    fn register() -> Local {
        let cells = Arc::new(Cells::default());
        let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        reg.live.retain(|w| w.strong_count() > 0);
        reg.live.push(Arc::downgrade(&cells));
        Local(cells)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // Later updates on this thread (from other thread-local destructors) must not reach the cells.
        CELLS.set(std::ptr::null());
        let snap = self.0.snapshot();
        let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        reg.retired = reg.retired + snap;
    }
}

thread_local! {
    static LOCAL: Local = Local::register();
    /// The cells of `LOCAL` once registered, null before and after. A constant-initialised thread local without a
    /// destructor is a plain thread-pointer-relative load, so the per-verb update skips the lazy-initialisation
    /// and destructor-state checks of `LOCAL`.
    static CELLS: Cell<*const Cells> = const { Cell::new(std::ptr::null()) };
}

/// The calling thread's cells, registering them on first use; null once they were folded into the retired total
/// (while the thread exits). A non-null pointer stays valid until this thread's `LOCAL` is destroyed, which nulls
/// `CELLS` first.
#[inline(always)]
fn cells() -> *const Cells {
    let p = CELLS.get();
    if p.is_null() { register() } else { p }
}

#[cold]
#[inline(never)]
fn register() -> *const Cells {
    LOCAL
        .try_with(|l| {
            let p = Arc::as_ptr(&l.0);
            CELLS.set(p);
            p
        })
        .unwrap_or(std::ptr::null())
}

/// The verbs of one posted batch, summed when it is posted so that recording it costs a handful of counter updates
/// whatever its size.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchTally {
    /// Verbs by [`kind_index`].
    verbs: [u64; 4],
    read_payload: u64,
    write_payload: u64,
}

impl BatchTally {
    /// Adds one verb of `kind` with `len` payload bytes (ignored for CAS and FAA, which carry none).
    #[inline(always)]
    pub(crate) fn add(&mut self, kind: VerbKind, len: u64) {
        self.verbs[kind_index(kind)] += 1;
        match kind {
            VerbKind::Read => self.read_payload += len,
            VerbKind::Write => self.write_payload += len,
            VerbKind::Cas | VerbKind::Faa => {}
        }
    }

    /// The one kind every verb of a batch of `len` verbs is, if they are all alike.
    #[inline(always)]
    pub(crate) fn only_kind(&self, len: usize) -> Option<VerbKind> {
        let len = len as u64;
        [
            VerbKind::Read,
            VerbKind::Write,
            VerbKind::Cas,
            VerbKind::Faa,
        ]
        .into_iter()
        .find(|&k| self.verbs[kind_index(k)] == len)
    }

    /// The same counts as a snapshot of one round trip.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> CounterSnapshot {
        verbs_snapshot(self.verbs, self.read_payload, self.write_payload)
            + CounterSnapshot {
                round_trips: 1,
                ..CounterSnapshot::ZERO
            }
    }
}

/// Records one posted batch (one round trip) holding the verbs of `tally`.
#[inline]
pub(crate) fn record_batch(tally: &BatchTally) {
    // SAFETY: see `cells`; the reference does not outlive this call.
    if let Some(c) = unsafe { cells().as_ref() } {
        bump(&c.batches, 1);
        for (cell, &n) in c.batched.iter().zip(&tally.verbs) {
            if n > 0 {
                bump(cell, n);
            }
        }
        if tally.read_payload > 0 {
            bump(&c.read_payload, tally.read_payload);
        }
        if tally.write_payload > 0 {
            bump(&c.write_payload, tally.write_payload);
        }
    }
}

/// Records one two-sided call (one round trip) of `bytes_out` and `bytes_in` wire bytes, headers included.
#[inline]
pub(crate) fn record_rpc(bytes_out: u64, bytes_in: u64) {
    // SAFETY: see `cells`; the reference does not outlive this call.
    if let Some(c) = unsafe { cells().as_ref() } {
        bump(&c.rpcs, 1);
        bump(&c.rpc_bytes_out, bytes_out);
        bump(&c.rpc_bytes_in, bytes_in);
    }
}

/// Records a round trip of one verb of `kind` with `len` payload bytes (the common case: one cell for CAS and FAA,
/// two for READ and WRITE).
#[inline(always)]
pub(crate) fn record_single(kind: VerbKind, len: u64) {
    // SAFETY: see `cells`; the reference does not outlive this call.
    if let Some(c) = unsafe { cells().as_ref() } {
        bump(&c.single[kind_index(kind)], 1);
        match kind {
            VerbKind::Read => bump(&c.read_payload, len),
            VerbKind::Write => bump(&c.write_payload, len),
            VerbKind::Cas | VerbKind::Faa => {}
        }
    }
}

/// The calling thread's counters.
pub fn thread_snapshot() -> CounterSnapshot {
    LOCAL.try_with(|l| l.0.snapshot()).unwrap_or_default()
}

/// The sum of every thread's counters since the process started.
pub fn global_snapshot() -> CounterSnapshot {
    let reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.live
        .iter()
        .filter_map(Weak::upgrade)
        .fold(reg.retired, |acc, c| acc + c.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counters_are_separate_and_global_sums_them() {
        let before_global = global_snapshot();
        let before = thread_snapshot();
        record_single(VerbKind::Read, 8);
        let t = std::thread::spawn(|| {
            record_single(VerbKind::Faa, 8);
            record_single(VerbKind::Faa, 8);
            thread_snapshot()
        })
        .join()
        .unwrap();
        assert_eq!(t.faa, 2);
        assert_eq!(t.round_trips, 2);
        let mine = thread_snapshot() - before;
        assert_eq!(mine.round_trips, 1);
        assert_eq!(mine.reads, 1);
        assert_eq!(mine.faa, 0);
        assert_eq!((mine.bytes_out, mine.bytes_in), (48, 32));
        // Other tests may run concurrently: the global view grew by at least what these two threads did.
        let g = global_snapshot() - before_global;
        assert!(g.round_trips >= 3 && g.faa >= 2 && g.reads >= 1);
    }

    #[test]
    fn derived_counts_and_bytes_match_the_wire_sizes_of_every_round_trip() {
        // A fresh thread: nothing else records on it.
        std::thread::spawn(|| {
            let before = thread_snapshot();
            record_single(VerbKind::Read, 1024);
            record_single(VerbKind::Write, 100);
            record_single(VerbKind::Cas, 8);
            let mut tally = BatchTally::default();
            tally.add(VerbKind::Read, 8);
            tally.add(VerbKind::Write, 16);
            tally.add(VerbKind::Write, 16);
            tally.add(VerbKind::Faa, 8);
            assert_eq!(
                tally.snapshot(),
                CounterSnapshot {
                    round_trips: 1,
                    reads: 1,
                    writes: 2,
                    cas: 0,
                    faa: 1,
                    rpcs: 0,
                    bytes_out: 4 * REQ_HEADER as u64 + 32,
                    bytes_in: 4 * RESP_HEADER as u64 + 8,
                }
            );
            record_batch(&tally);
            record_rpc(70, 30);
            let mut expected = CounterSnapshot::ZERO;
            for (kind, len) in [
                (VerbKind::Read, 1024),
                (VerbKind::Write, 100),
                (VerbKind::Cas, 8),
            ] {
                let (o, i) = crate::wire::verb_bytes(kind, len);
                expected = expected
                    + CounterSnapshot {
                        round_trips: 1,
                        reads: (kind == VerbKind::Read) as u64,
                        writes: (kind == VerbKind::Write) as u64,
                        cas: (kind == VerbKind::Cas) as u64,
                        bytes_out: o,
                        bytes_in: i,
                        ..CounterSnapshot::ZERO
                    };
            }
            expected = expected
                + tally.snapshot()
                + CounterSnapshot {
                    round_trips: 1,
                    rpcs: 1,
                    bytes_out: 70,
                    bytes_in: 30,
                    ..CounterSnapshot::ZERO
                };
            assert_eq!(thread_snapshot() - before, expected);
            assert_eq!(expected.round_trips, 5);
            assert_eq!(expected.verbs(), 7);
        })
        .join()
        .unwrap();
    }
}
