//! Linearizability checking of recorded key-value histories (Wing-Gong search with per-key partitioning).
//!
//! Integration tests run concurrent clients against the cluster while KV nodes join, leave and die, record every
//! operation with a [`Recorder`], and ask [`check`] whether the resulting [`History`] is linearizable: whether
//! every operation can be given a single instant between its invocation and its response such that, in that order,
//! each response is what a map of independent registers would have answered (see [`Op`] for each operation's
//! specification).
//!
//! Operations whose response never came ([`Outcome::Unknown`]: a timeout, a dropped connection, a killed node) may
//! have taken effect at any instant after their invocation, or never; reads among them constrain nothing and are
//! dropped. Linearizability is compositional, so each key is checked on its own with the Wing & Gong depth-first
//! search and Lowe's memoization, as Porcupine does (see below). A failing history can be saved with
//! [`History::save`] and replayed with [`History::load`].
//!
//! Two operations whose intervals only touch (one returned at the very nanosecond the other was invoked) count as
//! concurrent, so clock resolution never makes a linearizable history fail. When a key fails, the verdict explains
//! where: the last operations of a longest order that fits, the value after them, and the operations that could
//! come next with the reason each does not fit.
//!
//! ```
//! use dinomo_lincheck::{check, CheckConfig, Op, Outcome, Recorder, Verdict};
//!
//! let rec = Recorder::new();
//! let t = rec.invoke(1, Op::Set(b"k".to_vec(), b"v".to_vec()));
//! rec.complete(t, Outcome::Ok);
//! let t = rec.invoke(2, Op::Get(b"k".to_vec()));
//! rec.complete(t, Outcome::Value(Some(b"v".to_vec())));
//! assert_eq!(check(&rec.history(), &CheckConfig::default()).unwrap(), Verdict::Linearizable);
//! ```
//!
//! ## The search
//!
//! A configuration is the set of operations linearized so far plus the register's value. From a configuration the
//! operations that may take effect next are those invoked before the earliest response still unexplained; the
//! search tries them in turn, and backtracks when none leads on. Every configuration entered is cached, so each is
//! explored once.
//!
//! Operations with an unknown outcome have no response entry (their response is at +infinity): they can take
//! effect at any point after their invocation, and the search succeeds as soon as every operation *with* a response
//! is linearized, the unknown ones left over being those that never took effect (or did so later, unobserved).
//!
//! Several reductions keep the search small; each skips only orders for which an order at least as good is tried
//! elsewhere, so none changes the verdict:
//! - *Reads first.* A known operation that never changes the value (a read, or an insert, update, delete or
//!   increment that answered it did nothing) and fits the current value is linearized at once, without trying the
//!   alternatives: it could be moved to the front of any order that continues from here.
//! - *Unknown writes last, and only when observed.* Candidates with a response are tried before unknown ones (the
//!   most recently invoked first). An unknown write is assumed to take effect only if something that may come
//!   right after it fits the new value and ends differently than without it; and no operation is linearized right
//!   after an unknown write when it would leave the same value without it. Either way the order without the write
//!   is tried from the configuration before it.
//! - *Identical unknown writes.* Of several pending unknown operations with the same effect only the earliest
//!   invoked is a candidate: it can take effect wherever a later one could.
//! - *Unknown increments.* Increments commute, so a run of unknown ones is tried only in invocation order. When
//!   every unknown candidate increments in the same direction, a run of them is not started once the value has
//!   passed every value a known candidate could still accept.
//! - *Inclusion.* Once a configuration has been fully explored without success, one with the same known
//!   operations, the same value and a superset of its unknown writes is pruned: everything it can do next, the
//!   smaller one could do by leaving the extra writes unapplied. Only the [`CheckConfig::dominance_checks`] most
//!   recently explored candidates are compared.
//!
//! Without the reductions on unknown writes, a few dozen of them on one key make the search exponential. They
//! cannot remove every source of it: many unknown writes on one heavily contended key can still exhaust
//! [`CheckConfig::max_states_per_key`], and the verdict is then [`Verdict::Inconclusive`]. An operation known
//! never to have taken effect is best left out ([`Recorder::not_applied`]) rather than recorded as unknown.

mod bytes;
mod check;
mod history;
mod model;
mod recorder;

pub use check::{
    CheckConfig, CheckReport, DEFAULT_DOMINANCE_CHECKS, DEFAULT_EXPLAIN_OPS,
    DEFAULT_EXPLAIN_VALUE_BYTES, DEFAULT_MAX_STATES_PER_KEY, Verdict, check, check_report,
};
pub use history::{Event, History, HistoryError, Op, Outcome};
pub use model::IntSyntax;
pub use recorder::{Recorder, Ticket};
