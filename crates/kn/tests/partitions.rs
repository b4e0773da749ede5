//! The shared-nothing layout (DINOMO-N): each KV node reads only its own partition of the memory node's index, and
//! a rebalance physically copies the entries of keys that change owner into their new owner's partition, removing
//! them from the old one; the partitions survive a restart, and a pool opens only with the layout it was formatted
//! with.

use std::path::Path;
use std::sync::Arc;

use dinomo_cache::CacheConfig;
use dinomo_dpm::partitions::PartitionTable;
use dinomo_dpm::{Partitioning, Processor, ProcessorConfig, proto};
use dinomo_fabric::Connector;
use dinomo_index::{Anchor, Index};
use dinomo_kn::{DirectWorker, KnConfig};
use dinomo_pool::{PersistMode, Pool, PoolOptions};
use dinomo_ring::{DEFAULT_VNODES, Ring};

mod common;

const KEYS: u32 = 400;

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:04}").into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    format!("value-{i}-{}", "x".repeat(i as usize % 50)).into_bytes()
}

fn processor_config(partitioning: Partitioning) -> ProcessorConfig {
    ProcessorConfig {
        segment_size: 16 << 10,
        merge_threads: 2,
        partitioning,
        ..ProcessorConfig::default()
    }
}

/// A memory node over the pool file at `path` (created when missing).
fn memory_node(
    path: &Path,
    partitioning: Partitioning,
) -> anyhow::Result<(Arc<Pool>, Arc<Processor>, Connector)> {
    memory_node_with(path, &processor_config(partitioning))
}

/// `dinomo check` of the pool file at `path`, which must find nothing wrong.
fn checked_clean(path: &Path) -> anyhow::Result<dinomo_dpm::check::PoolCheck> {
    let report = dinomo_dpm::check::check_pool(
        &Arc::new(Pool::open_snapshot(path)?.0),
        &dinomo_dpm::check::CheckOptions::default(),
    );
    assert!(report.is_clean(), "{:?}", report.problems);
    Ok(report)
}

/// The pool file at `path`, created when missing.
fn open_pool(path: &Path) -> anyhow::Result<Arc<Pool>> {
    let opts = PoolOptions {
        size: 64 << 20,
        segment_size: 16 << 10,
        persist: PersistMode::Volatile,
    };
    Ok(Arc::new(Pool::open_or_create(path, &opts)?.0))
}

fn memory_node_with(
    path: &Path,
    config: &ProcessorConfig,
) -> anyhow::Result<(Arc<Pool>, Arc<Processor>, Connector)> {
    let pool = open_pool(path)?;
    let (processor, connector) = common::serve_pool(pool.clone(), config)?;
    Ok((pool, processor, connector))
}

/// A worker of KV node `node` with no cache: every read goes to the node's own partition.
fn worker(node: u32, connector: &Connector) -> anyhow::Result<DirectWorker> {
    let cfg = KnConfig {
        node_id: node,
        threads: 1,
        max_value_len: 2048,
        cache: CacheConfig {
            budget_bytes: 0,
            ..CacheConfig::default()
        },
        ..KnConfig::default()
    };
    Ok(DirectWorker::start(cfg, 0, connector.clone())?)
}

fn rebalance(connector: &Connector, nodes: &[u32]) -> anyhow::Result<proto::Rebalanced> {
    let ring = Ring::with_nodes(DEFAULT_VNODES, nodes.iter().copied());
    Ok(connector
        .connect()?
        .call(proto::REBALANCE, &proto::Rebalance { ring })?)
}

/// Fences node `node`'s writers and merges its logs, as the M-node does when the node fails or is removed.
fn take_over(connector: &Connector, node_id: u32) -> anyhow::Result<proto::NodeTakenOver> {
    Ok(connector.connect()?.call(
        proto::TAKE_OVER_NODE,
        &proto::TakeOverNode {
            node_id,
            incarnation: None,
            // The epoch of the rings `rebalance` sends.
            epoch: 1,
        },
    )?)
}

/// Pool extents of index headers and tables.
fn index_extents(pool: &Pool) -> usize {
    pool.allocated()
        .iter()
        .filter(|e| {
            e.tag == dinomo_log::tags::INDEX_HEADER || e.tag == dinomo_log::tags::INDEX_TABLE
        })
        .count()
}

/// Reads every key through `w`: `owned` ones must have their value, the others must be absent.
fn check(w: &mut DirectWorker, owned: impl Fn(&[u8]) -> bool) -> anyhow::Result<()> {
    for i in 0..KEYS {
        let expected = owned(&key(i)).then(|| value(i));
        assert_eq!(w.get(&key(i))?, expected, "key {i}");
    }
    Ok(())
}

#[test]
fn a_rebalance_moves_entries_into_the_new_owners_partition() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    // Everything of the first run is dropped at the end of this block, which releases the pool file.
    {
        let (pool, processor, connector) = memory_node(&path, Partitioning::PerNode)?;
        let mut one = worker(1, &connector)?;
        for i in 0..KEYS {
            one.set(&key(i), &value(i))?;
        }
        one.merge_all()?;
        drop(one);

        let two_nodes = Ring::with_nodes(DEFAULT_VNODES, [1, 2]);
        let moving = (0..KEYS)
            .filter(|&i| two_nodes.primary(&key(i)) == Some(2))
            .count() as u64;
        assert!(moving > KEYS as u64 / 4, "{moving} keys move to node 2");
        let moved = rebalance(&connector, &[1, 2])?;
        assert_eq!(moved.keys, moving);
        assert!(moved.bytes >= moving * 40, "{moved:?}");
        let s = processor.stats();
        assert_eq!((s.partitions, s.migrated_keys), (2, moving));
        assert_eq!(
            processor.indexed_keys(),
            u64::from(KEYS),
            "each key in one partition"
        );

        // Each node finds exactly its own keys in its partition.
        check(&mut worker(2, &connector)?, |k| {
            two_nodes.primary(k) == Some(2)
        })?;
        check(&mut worker(1, &connector)?, |k| {
            two_nodes.primary(k) == Some(1)
        })?;
        // Nothing left to move.
        assert_eq!(rebalance(&connector, &[1, 2])?.keys, 0);

        // Node 1 leaves: everything moves to node 2, which writes on. The move happens while a walk over the keys
        // (`SCAN`) is halfway through the partitions, and the walk names every key all the same.
        let mut left = None;
        let named = common::walk(&processor, 3, 1 << 20, |step| {
            if step == 20 {
                left = Some(rebalance(&connector, &[2])?);
            }
            Ok(())
        })?;
        let named: std::collections::BTreeSet<_> = named.into_iter().collect();
        assert_eq!(named, (0..KEYS).map(key).collect());
        assert_eq!(left.expect("moved").keys, u64::from(KEYS) - moving);
        let mut two = worker(2, &connector)?;
        two.set(&key(0), b"changed")?;
        two.merge_all()?;
        assert_eq!(two.get(&key(0))?, Some(b"changed".to_vec()));
        drop(two);
        processor.shutdown();
        pool.close()?;
    }

    // The checker walks each partition: every key is in node 2's, and each slot names a valid entry of its key
    // (most of them entries the rebalances wrote).
    let report = checked_clean(&path)?;
    assert_eq!(report.layout, Some(Partitioning::PerNode));
    let keys: Vec<_> = report.indexes.iter().map(|i| (i.node, i.keys)).collect();
    assert_eq!(keys, vec![(Some(1), 0), (Some(2), u64::from(KEYS))]);

    // The partitions survive a restart of the memory node.
    let (_pool, processor, connector) = memory_node(&path, Partitioning::PerNode)?;
    assert_eq!(processor.stats().partitions, 2);
    assert_eq!(processor.indexed_keys(), u64::from(KEYS));
    let mut two = worker(2, &connector)?;
    assert_eq!(two.get(&key(0))?, Some(b"changed".to_vec()));
    for i in 1..KEYS {
        assert_eq!(two.get(&key(i))?, Some(value(i)), "key {i}");
    }
    check(&mut worker(1, &connector)?, |_| false)?;
    Ok(())
}

#[test]
fn a_pool_opens_only_with_the_layout_it_was_formatted_with() -> anyhow::Result<()> {
    for (formatted, other) in [
        (Partitioning::Shared, Partitioning::PerNode),
        (Partitioning::PerNode, Partitioning::Shared),
    ] {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("pool");
        {
            let (pool, processor, connector) = memory_node(&path, formatted)?;
            let mut w = worker(1, &connector)?;
            w.set(b"k", b"v")?;
            w.merge_all()?;
            // The shared layout moves nothing.
            let moved = rebalance(&connector, &[2])?;
            assert_eq!(moved.keys, u64::from(formatted == Partitioning::PerNode));
            processor.shutdown();
            pool.close()?;
        }
        let pool = open_pool(&path)?;
        let err = match Processor::start(pool, &processor_config(other)) {
            Ok(_) => panic!("a pool formatted {formatted:?} opened as {other:?}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("formatted for"), "{err}");
    }
    Ok(())
}

/// Node ids are not reused, so a partition per node ever seen would fill the partition table: the partition of a
/// node that departed is freed once the rebalance emptied it and its logs retired, and its slot goes to the next
/// node. The departure is persistent (a restart in between still frees it), a node that comes back keeps its
/// partition, and a free that a crash interrupted is finished at the next start.
#[test]
fn a_departed_nodes_partition_is_freed_for_the_next_node() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    let config = ProcessorConfig {
        partition_capacity: 2,
        ..processor_config(Partitioning::PerNode)
    };
    {
        let (pool, processor, connector) = memory_node_with(&path, &config)?;
        let mut one = worker(1, &connector)?;
        for i in 0..KEYS {
            one.set(&key(i), &value(i))?;
        }
        one.merge_all()?;
        drop(one);
        // Node 1 leaves: its keys move to node 2, and its logs are taken over.
        assert_eq!(rebalance(&connector, &[2])?.keys, u64::from(KEYS));
        let s = processor.stats();
        assert_eq!((s.partitions, s.freed_partitions), (2, 0), "{s:?}");
        take_over(&connector, 1)?;
        let s = processor.stats();
        assert_eq!((s.partitions, s.freed_partitions), (1, 1), "{s:?}");
        assert_eq!(index_extents(&pool), 2, "node 2's header and table");

        // A table of two partitions takes a third node, which gets its keys.
        let three = Ring::with_nodes(DEFAULT_VNODES, [2, 3]);
        let mut w3 = worker(3, &connector)?;
        rebalance(&connector, &[2, 3])?;
        check(&mut w3, |k| three.primary(k) == Some(3))?;
        check(&mut worker(2, &connector)?, |k| three.primary(k) == Some(2))?;
        // Node 3 departs and its keys stay for now: a partition with keys is kept.
        drop(w3);
        take_over(&connector, 3)?;
        assert_eq!(processor.stats().partitions, 2);
        processor.shutdown();
        pool.close()?;
    }
    let departed: Vec<_> = checked_clean(&path)?
        .indexes
        .iter()
        .map(|i| (i.node, i.departed))
        .collect();
    // In slot order: node 3 took the slot node 1 left.
    assert_eq!(departed, vec![(Some(3), true), (Some(2), false)]);
    {
        // Its departure survived the restart: once the rebalance empties it, it goes.
        let (pool, processor, connector) = memory_node_with(&path, &config)?;
        assert_eq!(processor.stats().partitions, 2);
        rebalance(&connector, &[2])?;
        let s = processor.stats();
        assert_eq!((s.partitions, s.freed_partitions), (1, 1), "{s:?}");
        check(&mut worker(2, &connector)?, |_| true)?;

        // Node 4 departs and comes back before its partition is emptied: the partition is its own again and
        // stays, even once empty.
        let mut w4 = worker(4, &connector)?;
        w4.set(b"node-4", b"four")?;
        w4.merge_all()?;
        drop(w4);
        take_over(&connector, 4)?;
        let mut w4 = worker(4, &connector)?;
        assert_eq!(w4.get(b"node-4")?, Some(b"four".to_vec()));
        rebalance(&connector, &[2])?;
        assert_eq!(w4.get(b"node-4")?, None, "moved to node 2");
        let s = processor.stats();
        assert_eq!((s.partitions, s.freed_partitions), (2, 1), "{s:?}");
        // It leaves again, its partition empty: it goes at once.
        drop(w4);
        take_over(&connector, 4)?;
        let s = processor.stats();
        assert_eq!((s.partitions, s.freed_partitions), (1, 2), "{s:?}");
        assert_eq!(index_extents(&pool), 2);
        processor.shutdown();
        pool.close()?;
    }
    {
        // A crash between the end of a partition and the free of its index leaves an index nothing names.
        let pool = open_pool(&path)?;
        let table = PartitionTable::open(pool.clone())?.expect("partitioned");
        let slot = table.reserve(9)?;
        let anchor = Anchor::Word(table.index_anchor(slot));
        let index = Index::create_at(pool.clone(), &config.index, anchor)?;
        table.commit(slot, 9);
        table.set_departed(slot, 9, true);
        table.release(slot);
        // Dropping it leaves its header and table allocated, as a crash would.
        drop(index);
        assert_eq!(index_extents(&pool), 4);
        pool.close()?;
    }
    {
        let (pool, processor, connector) = memory_node_with(&path, &config)?;
        assert_eq!(index_extents(&pool), 2, "the next start frees it");
        assert_eq!(processor.stats().partitions, 1);
        let mut w2 = worker(2, &connector)?;
        check(&mut w2, |_| true)?;
        assert_eq!(w2.get(b"node-4")?, Some(b"four".to_vec()));
        drop(w2);
        processor.shutdown();
        pool.close()?;
    }
    checked_clean(&path)?;
    Ok(())
}

/// A rebalance to a ring older than one already rebalanced to comes from a management node that no longer leads:
/// it is refused and moves nothing, while the same epoch again (a retry) is taken.
#[test]
fn a_rebalance_to_an_older_ring_is_refused_and_moves_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (_pool, processor, connector) =
        memory_node(&dir.path().join("pool"), Partitioning::PerNode)?;
    let mut one = worker(1, &connector)?;
    for i in 0..KEYS {
        one.set(&key(i), &value(i))?;
    }
    one.merge_all()?;
    let at = |nodes: &[u32], epoch: u64| {
        let mut ring = Ring::with_nodes(DEFAULT_VNODES, nodes.iter().copied());
        ring.set_epoch_at_least(epoch);
        connector
            .connect()?
            .call::<_, proto::Rebalanced>(proto::REBALANCE, &proto::Rebalance { ring })
    };
    assert_eq!(at(&[1], 5)?.keys, 0);
    // An older table that would hand keys to node 2.
    let refused = at(&[1, 2], 4).expect_err("an older ring");
    assert!(
        refused.to_string().contains(
            "REBALANCE of management epoch 4 is refused: the memory node acted on epoch 5 already"
        ),
        "{refused}"
    );
    check(&mut one, |_| true)?;
    assert_eq!(at(&[1], 5)?.keys, 0);
    assert!(at(&[1, 2], 6)?.keys > 0);
    check(&mut one, |k| {
        Ring::with_nodes(DEFAULT_VNODES, [1, 2]).primary(k) == Some(1)
    })?;
    drop(one);
    processor.shutdown();
    Ok(())
}
