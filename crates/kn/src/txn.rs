//! Transactions over a node's workers (Redis's `MULTI`/`EXEC`).
//!
//! A transaction's operations are queued at every worker that owns one of its keys, each worker's share as one
//! request (a [`TxnPart`]), and the parts of any two transactions are queued in the same order at every worker
//! ([`crate::Submitter::submit_txn`] queues them under one lock). A worker that reaches its part checks that it may
//! serve every key of it, then waits at the transaction's [`TxnBarrier`] until every part has arrived; only then
//! does each part run, on its own worker. A worker serves its keys one request at a time, so once every worker has
//! reached its part no other request on the transaction's keys comes between its operations: the transaction takes
//! effect when the last part arrives. If a part may not run (a key moved to another node, the lease lapsed, a key
//! is shared with other nodes) or not every part arrives within the wait, no part runs.
//!
//! Each part's writes are committed with its worker's group commit, so a transaction is isolated but not atomic
//! under a crash: after one, some of its writes may be there and others not.

use std::sync::Arc;
use std::time::Duration;

use dinomo_sync::{Parted, Rendezvous};

use crate::DataOp;

/// Operations of a transaction, in transaction order, each with the tag its reply carries.
pub type TxnOps = Vec<(u64, DataOp)>;

/// One worker's share of a transaction: its operations in transaction order, each with the tag its reply carries.
pub struct TxnPart {
    /// Where the transaction's parts meet before any of them runs.
    pub barrier: Arc<TxnBarrier>,
    /// The operations, each with its reply's tag.
    pub ops: TxnOps,
}

/// Why a transaction did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnAbort {
    /// A part may not run here; the reason is the first part's that said so.
    #[error("{0}")]
    Refused(String),
    /// A key the transaction watched no longer has the value it had.
    #[error("a watched key changed")]
    Changed,
    /// Not every part reached its worker within the wait.
    #[error("not every worker of the transaction reached it within {0:?}")]
    TimedOut(Duration),
}

/// The meeting point of a transaction's parts: each worker arrives with whether its part may run, and every part
/// runs only when all arrived and all may (a [`dinomo_sync::Rendezvous`], model-checked there).
pub struct TxnBarrier(Rendezvous<TxnAbort>);

impl TxnBarrier {
    /// A barrier for `parts` parts, each waiting at most `wait` for the others.
    pub fn new(parts: usize, wait: Duration) -> Arc<TxnBarrier> {
        Arc::new(TxnBarrier(Rendezvous::new(parts, wait)))
    }

    /// Refuses the transaction without a part arriving (a part could not be queued): the parts that arrive, or
    /// are waiting, abort.
    pub fn refuse(&self, reason: String) {
        self.0.refuse(TxnAbort::Refused(reason));
    }

    /// Arrives with this part's `verdict` and waits for the others. `Ok` when every part arrived and every part
    /// may run: then this part runs. Every part of a transaction gets the same answer.
    pub fn arrive(&self, verdict: Result<(), TxnAbort>) -> Result<(), TxnAbort> {
        self.0.arrive(verdict).map_err(|parted| match parted {
            Parted::Refused(why) => why,
            Parted::TimedOut(wait) => TxnAbort::TimedOut(wait),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn run_parts(
        barrier: &Arc<TxnBarrier>,
        verdicts: Vec<Result<(), TxnAbort>>,
    ) -> Vec<Result<(), TxnAbort>> {
        let threads: Vec<_> = verdicts
            .into_iter()
            .map(|v| {
                let b = barrier.clone();
                std::thread::spawn(move || b.arrive(v))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_part_runs_once_all_arrived() {
        let b = TxnBarrier::new(3, Duration::from_secs(10));
        assert_eq!(run_parts(&b, vec![Ok(()), Ok(()), Ok(())]), vec![Ok(()); 3]);
    }

    #[test]
    fn one_refusing_part_aborts_every_part() {
        let b = TxnBarrier::new(3, Duration::from_secs(10));
        let refused = Err(TxnAbort::Refused("moved".into()));
        assert_eq!(
            run_parts(
                &b,
                vec![Ok(()), Err(TxnAbort::Refused("moved".into())), Ok(())]
            ),
            vec![refused.clone(), refused.clone(), refused]
        );
    }

    #[test]
    fn a_part_that_never_comes_aborts_the_others_after_the_wait_and_a_late_one_too() {
        let wait = Duration::from_millis(50);
        let b = TxnBarrier::new(3, wait);
        let started = Instant::now();
        assert_eq!(
            run_parts(&b, vec![Ok(()), Ok(())]),
            vec![Err(TxnAbort::TimedOut(wait)); 2]
        );
        assert!(started.elapsed() >= wait);
        // The third part arrives after the others gave up: it must not run alone.
        assert_eq!(b.arrive(Ok(())), Err(TxnAbort::TimedOut(wait)));
    }

    #[test]
    fn a_part_refused_before_queuing_aborts_the_parts_already_waiting() {
        let b = TxnBarrier::new(2, Duration::from_secs(10));
        let waiting = {
            let b = b.clone();
            std::thread::spawn(move || b.arrive(Ok(())))
        };
        b.refuse("the worker stopped".into());
        assert_eq!(
            waiting.join().unwrap(),
            Err(TxnAbort::Refused("the worker stopped".into()))
        );
    }
}
