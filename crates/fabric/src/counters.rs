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

    /// Adds one verb of `kind` moving `bytes_out` and `bytes_in` wire bytes (no round trip).
    #[inline]
    pub(crate) fn add_verb(&mut self, kind: VerbKind, bytes_out: u64, bytes_in: u64) {
        match kind {
            VerbKind::Read => self.reads += 1,
            VerbKind::Write => self.writes += 1,
            VerbKind::Cas => self.cas += 1,
            VerbKind::Faa => self.faa += 1,
        }
        self.bytes_out += bytes_out;
        self.bytes_in += bytes_in;
    }

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

#[derive(Default)]
struct Cells {
    round_trips: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    cas: AtomicU64,
    faa: AtomicU64,
    rpcs: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
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
        CounterSnapshot {
            round_trips: self.round_trips.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            cas: self.cas.load(Ordering::Relaxed),
            faa: self.faa.load(Ordering::Relaxed),
            rpcs: self.rpcs.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
        }
    }
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

/// Records one round trip that did what `tally` says (its `round_trips` field is ignored: it is one).
#[inline]
pub(crate) fn record_round_trip(tally: &CounterSnapshot) {
    // SAFETY: see `cells`; the reference does not outlive this call.
    if let Some(c) = unsafe { cells().as_ref() } {
        bump(&c.round_trips, 1);
        if tally.reads > 0 {
            bump(&c.reads, tally.reads);
        }
        if tally.writes > 0 {
            bump(&c.writes, tally.writes);
        }
        if tally.cas > 0 {
            bump(&c.cas, tally.cas);
        }
        if tally.faa > 0 {
            bump(&c.faa, tally.faa);
        }
        if tally.rpcs > 0 {
            bump(&c.rpcs, tally.rpcs);
        }
        bump(&c.bytes_out, tally.bytes_out);
        bump(&c.bytes_in, tally.bytes_in);
    }
}

/// Records a round trip of one verb (the common case, kept short).
#[inline(always)]
pub(crate) fn record_single(kind: VerbKind, bytes_out: u64, bytes_in: u64) {
    // SAFETY: see `cells`; the reference does not outlive this call.
    if let Some(c) = unsafe { cells().as_ref() } {
        bump(&c.round_trips, 1);
        bump(
            match kind {
                VerbKind::Read => &c.reads,
                VerbKind::Write => &c.writes,
                VerbKind::Cas => &c.cas,
                VerbKind::Faa => &c.faa,
            },
            1,
        );
        bump(&c.bytes_out, bytes_out);
        bump(&c.bytes_in, bytes_in);
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
        record_single(VerbKind::Read, 48, 32);
        let t = std::thread::spawn(|| {
            record_single(VerbKind::Faa, 48, 24);
            record_single(VerbKind::Faa, 48, 24);
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
}
