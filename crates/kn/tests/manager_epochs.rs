//! Management epochs at the memory node. Every call the M-node makes for a change carries the epoch it reserved
//! for that change; once the memory node acted on an epoch, the calls of older changes (from an M-node that
//! stalled and no longer leads) are refused and change nothing, across a restart of the memory node too.

mod common;

use std::path::Path;
use std::sync::Arc;

use dinomo_dpm::{Processor, ProcessorConfig, proto};
use dinomo_fabric::{Connector, FabricError};
use dinomo_kn::{KnConfig, KvNode};
use dinomo_pool::{PersistMode, Pool, PoolOptions};
use dinomo_ring::{DEFAULT_VNODES, Ring};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The epoch the tests' leader acts under; the stale M-node's is one less.
const LEADER: u64 = 5;
const STALE: u64 = LEADER - 1;

struct MemoryNodeUnderTest {
    pool: Arc<Pool>,
    processor: Arc<Processor>,
    connector: Connector,
}

impl MemoryNodeUnderTest {
    /// A memory node (shared index) over the pool file at `path`, created when missing.
    fn open(path: &Path) -> anyhow::Result<MemoryNodeUnderTest> {
        let opts = PoolOptions {
            size: 64 << 20,
            segment_size: 16 << 10,
            persist: PersistMode::Volatile,
        };
        let pool = Arc::new(Pool::open_or_create(path, &opts)?.0);
        let config = ProcessorConfig {
            segment_size: 16 << 10,
            ..ProcessorConfig::default()
        };
        let (processor, connector) = common::serve_pool(pool.clone(), &config)?;
        Ok(MemoryNodeUnderTest {
            pool,
            processor,
            connector,
        })
    }

    fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u16,
        req: &Req,
    ) -> Result<Resp, FabricError> {
        self.connector.connect()?.call(method, req)
    }

    fn fence(&self, epoch: u64) -> anyhow::Result<u64> {
        let f: proto::Fenced = self.call(proto::FENCE, &proto::Fence { epoch })?;
        Ok(f.newest)
    }

    fn reserve(&self, key: &[u8], epoch: u64) -> Result<u64, FabricError> {
        let r: proto::CellReserved = self.call(
            proto::RESERVE_CELL,
            &proto::ReserveCell {
                key: key.to_vec(),
                epoch,
            },
        )?;
        Ok(r.cell)
    }

    fn sync_cells(&self, shared: &[u64], epoch: u64) -> Result<(), FabricError> {
        self.call(
            proto::SYNC_CELLS,
            &proto::SyncCells {
                shared: shared.to_vec(),
                epoch,
            },
        )
    }

    fn release(&self, cell: u64, epoch: u64) -> Result<(), FabricError> {
        self.call(proto::RELEASE_CELL, &proto::ReleaseCell { cell, epoch })
    }

    fn take_over(&self, node_id: u32, epoch: u64) -> Result<proto::NodeTakenOver, FabricError> {
        self.call(
            proto::TAKE_OVER_NODE,
            &proto::TakeOverNode {
                node_id,
                incarnation: None,
                epoch,
            },
        )
    }

    fn rebalance(&self, epoch: u64) -> Result<proto::Rebalanced, FabricError> {
        let mut ring = Ring::with_nodes(DEFAULT_VNODES, [NODE]);
        ring.set_epoch_at_least(epoch);
        self.call(proto::REBALANCE, &proto::Rebalance { ring })
    }

    fn stop(self) -> anyhow::Result<()> {
        self.processor.shutdown();
        self.pool.close()?;
        Ok(())
    }
}

const NODE: u32 = 1;

fn kv_node(m: &MemoryNodeUnderTest) -> anyhow::Result<KvNode> {
    Ok(KvNode::start(
        KnConfig {
            node_id: NODE,
            threads: 1,
            max_value_len: 1024,
            cache: dinomo_cache::CacheConfig {
                budget_bytes: 0,
                ..dinomo_cache::CacheConfig::default()
            },
            ..KnConfig::default()
        },
        m.connector.clone(),
    )?)
}

/// A refusal of `call` for its older epoch.
fn assert_stale<T: std::fmt::Debug>(r: Result<T, FabricError>, call: &str) {
    let e = r.expect_err("a call of an older management epoch");
    let expected = format!(
        "{call} of management epoch {STALE} is refused: the memory node acted on epoch {LEADER}"
    );
    assert!(e.to_string().contains(&expected), "{e}");
}

/// With a key shared through its cell and another cell reserved, each call of the stalled M-node's older change is
/// refused: the key stays shared and served, the reserved cell stays the key's, the node is not taken over, and
/// nothing moves. The leader's own calls are taken, and the refusals are counted.
#[test]
fn calls_of_an_older_management_epoch_are_refused_and_change_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let m = MemoryNodeUnderTest::open(&dir.path().join("pool"))?;
    let kn = kv_node(&m)?;
    common::install_sharing(&kn, 1, &[])?;
    let kv = kn.handle();
    kv.set(b"alpha", b"a1")?;
    kv.set(b"beta", b"b1")?;

    assert_eq!(m.fence(LEADER)?, LEADER);
    let alpha = m.reserve(b"alpha", LEADER)?;
    common::install_sharing(&kn, 2, &[(b"alpha", alpha)])?;
    assert_eq!(m.processor.stats().shared_keys, 1);
    let gamma = m.reserve(b"gamma", LEADER)?;

    // SYNC_CELLS of a record that never saw alpha shared would move alpha's value back into the index while the
    // node serves it from the cell, and free gamma's reserved cell.
    assert_stale(m.sync_cells(&[], STALE), "SYNC_CELLS");
    assert_eq!(m.processor.stats().shared_keys, 1);
    kv.set(b"alpha", b"a2")?;
    assert_eq!(kv.get(b"alpha")?, Some(b"a2".to_vec()));
    // RELEASE_CELL of gamma's cell would let another key have it.
    assert_stale(m.release(gamma, STALE), "RELEASE_CELL");
    let delta = m.reserve(b"delta", LEADER)?;
    assert!(
        ![alpha, gamma].contains(&delta),
        "delta got a cell in use: {delta:#x}"
    );
    // RESERVE_CELL of a change the leader never made.
    assert_stale(m.reserve(b"epsilon", STALE), "RESERVE_CELL");
    // TAKE_OVER_NODE of a node the leader keeps: its writes go on.
    assert_stale(m.take_over(NODE, STALE), "TAKE_OVER_NODE");
    kv.set(b"beta", b"b2")?;
    assert_eq!(kv.get(b"beta")?, Some(b"b2".to_vec()));
    assert_stale(m.rebalance(STALE), "REBALANCE");
    // A fence of an older epoch changes nothing and tells the newest.
    assert_eq!(m.fence(STALE)?, LEADER);

    let stats = m.processor.stats();
    assert_eq!(
        (stats.manager_epoch, stats.stale_manager_calls),
        (LEADER, 6)
    );
    // The leader's own calls, of the same epoch, are taken: delta's cell is released, and the record's sync
    // frees gamma's reserved cell while alpha, listed, stays shared.
    m.release(delta, LEADER)?;
    m.sync_cells(&[alpha], LEADER)?;
    assert_eq!(m.processor.stats().shared_keys, 1);
    assert_eq!(m.reserve(b"zeta", LEADER)?, gamma.min(delta));
    assert_eq!(kv.get(b"alpha")?, Some(b"a2".to_vec()));
    kn.stop();
    m.stop()
}

/// The newest management epoch is kept in the pool: a memory node restarted on it refuses the older changes' calls
/// as before, and takes newer ones.
#[test]
fn the_newest_management_epoch_survives_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    {
        let m = MemoryNodeUnderTest::open(&path)?;
        assert_eq!(m.processor.stats().manager_epoch, 0, "a new pool");
        let kn = kv_node(&m)?;
        kn.handle().set(b"alpha", b"a1")?;
        kn.stop();
        assert_eq!(m.fence(LEADER)?, LEADER);
        m.stop()?;
    }
    let m = MemoryNodeUnderTest::open(&path)?;
    assert_eq!(m.processor.stats().manager_epoch, LEADER);
    assert_stale(m.take_over(NODE, STALE), "TAKE_OVER_NODE");
    let kn = kv_node(&m)?;
    assert_eq!(kn.handle().get(b"alpha")?, Some(b"a1".to_vec()));
    kn.stop();
    let taken = m.take_over(NODE, LEADER + 1)?;
    assert_eq!(taken.logs, 1);
    assert_eq!(m.processor.stats().manager_epoch, LEADER + 1);
    m.stop()
}
