//! Sharing changes that fail partway (selective replication, paper §3.4). A worker installing a new ownership map
//! moves keys into or out of their indirect cells one call at a time; when one call fails, the keys moved before it
//! stand in the new state at the memory node while the worker still holds the old map. Such keys must be refused
//! until an install settles them, and an install of either map (the rollback or a retry) must settle them: no write
//! may go to a key the memory node and the worker disagree about, and no value may be stranded in a cell.

mod common;

use std::sync::Arc;

use dinomo_dpm::Processor;
use dinomo_fabric::Connector;
use dinomo_kn::{Command, KnError, KvNode};

struct Setup {
    pool: Arc<dinomo_pool::Pool>,
    processor: Arc<Processor>,
    connector: Connector,
    kn: KvNode,
}

impl Setup {
    fn start() -> anyhow::Result<Setup> {
        let (pool, processor, connector) = common::small_memory_node_with_pool()?;
        // No cache: every read goes to the pool, so a value stranded in a cell shows as a missing key.
        let kn = common::cacheless_kv_node(connector.clone(), 2048)?;
        Ok(Setup {
            pool,
            processor,
            connector,
            kn,
        })
    }

    fn install(&self, epoch: u64, shared: &[(&[u8], u64)]) -> Result<(), KnError> {
        common::install_sharing(&self.kn, epoch, shared)
    }

    fn reserve(&self, key: &[u8]) -> anyhow::Result<u64> {
        common::reserve_cell(&self.connector, key)
    }

    fn shared_at_memory_node(&self) -> u64 {
        self.processor.stats().shared_keys
    }

    /// Every key a whole walk of the memory node names (`SCAN`), sorted.
    fn walked(&self) -> anyhow::Result<Vec<Vec<u8>>> {
        let mut named = common::walk(&self.processor, 1, 1 << 20, |_| Ok(()))?;
        named.sort();
        named.dedup();
        Ok(named)
    }
}

/// Not the offset of any cell: the memory node refuses to share a key through it, which fails the install after
/// the changes listed before it took effect.
const NO_CELL: u64 = 1;

fn refused(r: Result<impl std::fmt::Debug, KnError>) -> bool {
    matches!(r, Err(KnError::NotOwner { .. }))
}

/// Shares `alpha` and `beta` in one install whose second call fails: `alpha`'s value is in its cell by then.
fn fail_partway(s: &Setup) -> anyhow::Result<u64> {
    s.install(1, &[])?;
    let kv = s.kn.handle();
    kv.set(b"alpha", b"a1")?;
    kv.set(b"beta", b"b1")?;
    let alpha_cell = s.reserve(b"alpha")?;
    let err = s
        .install(2, &[(b"alpha", alpha_cell), (b"beta", NO_CELL)])
        .expect_err("beta cannot be shared through a cell that does not exist");
    assert!(
        !refused(Err::<(), _>(err)),
        "the install failed at the memory node"
    );
    assert_eq!(
        s.shared_at_memory_node(),
        1,
        "alpha moved into its cell before beta's change failed"
    );
    // The worker still holds the map of epoch 1, which says alpha is its own: serving alpha that way would read
    // an index that no longer has it and write where no owner of the cell would look.
    assert!(refused(kv.get(b"alpha")), "alpha is unsettled");
    assert!(refused(kv.set(b"alpha", b"lost")), "alpha is unsettled");
    assert!(
        refused(kv.get(b"beta")),
        "beta's change may or may not have happened"
    );
    assert_eq!(kv.get(b"gamma")?, None, "other keys are served");
    Ok(alpha_cell)
}

#[test]
fn a_rollback_install_moves_a_half_shared_value_back() -> anyhow::Result<()> {
    let s = Setup::start()?;
    fail_partway(&s)?;
    let kv = s.kn.handle();

    // The M-node rolls the change back: the previous map again, under a newer epoch.
    s.install(3, &[])?;
    assert_eq!(s.shared_at_memory_node(), 0, "alpha is back in the index");
    assert_eq!(kv.get(b"alpha")?, Some(b"a1".to_vec()));
    assert_eq!(kv.get(b"beta")?, Some(b"b1".to_vec()));
    kv.set(b"alpha", b"a2")?;
    let (tx, rx) = crossbeam_channel::unbounded();
    s.kn.submitter().broadcast(|| Command::MergeAll, 0, &tx)?;
    rx.recv()?.1?;
    assert_eq!(kv.get(b"alpha")?, Some(b"a2".to_vec()));
    assert_eq!(s.processor.count_keys()?, 2);
    Ok(())
}

#[test]
fn a_retried_install_finishes_the_sharing_change() -> anyhow::Result<()> {
    let s = Setup::start()?;
    let alpha_cell = fail_partway(&s)?;
    let kv = s.kn.handle();

    // The change is retried with a cell for beta; alpha's change, done already, is repeated harmlessly.
    let beta_cell = s.reserve(b"beta")?;
    s.install(3, &[(b"alpha", alpha_cell), (b"beta", beta_cell)])?;
    assert_eq!(s.shared_at_memory_node(), 2);
    // Their cells are the keys' only references now, and a walk over the keys names them from there.
    s.kn.handle().merge_all()?;
    assert_eq!(s.walked()?, vec![b"alpha".to_vec(), b"beta".to_vec()]);
    assert_eq!(kv.get(b"alpha")?, Some(b"a1".to_vec()));
    assert_eq!(kv.get(b"beta")?, Some(b"b1".to_vec()));
    kv.set(b"alpha", b"a3")?;
    assert_eq!(kv.get(b"alpha")?, Some(b"a3".to_vec()));

    // The checker finds both cells naming entries of their keys.
    let opts = dinomo_dpm::check::CheckOptions::default();
    let report = dinomo_dpm::check::check_pool(&s.pool, &opts);
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.shared_keys, 2);
    // Alpha's cell names beta's entry: reads of alpha would be refused or wrong, and the checker says so.
    let word = |cell: u64| s.pool.atomic_u64(cell).unwrap();
    let alpha = word(alpha_cell).load(std::sync::atomic::Ordering::Acquire);
    let beta = word(beta_cell).load(std::sync::atomic::Ordering::Acquire);
    word(alpha_cell).store(beta, std::sync::atomic::Ordering::Release);
    let report = dinomo_dpm::check::check_pool(&s.pool, &opts);
    assert_eq!(report.problem_count, 1, "{:?}", report.problems);
    assert!(
        report.problems[0].starts_with("shared key \"alpha\"")
            && report.problems[0].contains("the entry is of key \"beta\""),
        "{:?}",
        report.problems
    );
    word(alpha_cell).store(alpha, std::sync::atomic::Ordering::Release);

    // Unsharing both brings the newest values back into the index.
    s.install(4, &[])?;
    assert_eq!(s.shared_at_memory_node(), 0);
    assert_eq!(kv.get(b"alpha")?, Some(b"a3".to_vec()));
    assert_eq!(kv.get(b"beta")?, Some(b"b1".to_vec()));
    Ok(())
}

#[test]
fn a_refused_operation_comes_back_whole() -> anyhow::Result<()> {
    let s = Setup::start()?;
    fail_partway(&s)?;
    // A caller that forwards refused operations (the RESP front door) keeps no copy: it gets the operation back.
    let write = dinomo_kn::DataOp::Set(b"alpha".to_vec(), b"forwarded".to_vec());
    let (tx, rx) = crossbeam_channel::unbounded();
    s.kn.submitter()
        .submit(Command::Data(write.clone()), 7, &tx)?;
    match rx.recv()? {
        (7, Err(KnError::NotOwner { refused, .. })) => {
            assert_eq!(refused.as_deref(), Some(&write));
        }
        other => panic!("alpha is unsettled, so the write is refused: {other:?}"),
    }
    Ok(())
}
