//! The shared-nothing layout (DINOMO-N): each KV node reads only its own partition of the memory node's index, and
//! a rebalance physically copies the entries of keys that change owner into their new owner's partition, removing
//! them from the old one; the partitions survive a restart, and a pool opens only with the layout it was formatted
//! with.

use std::path::Path;
use std::sync::Arc;

use dinomo_cache::CacheConfig;
use dinomo_dpm::{Partitioning, Processor, ProcessorConfig, proto};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
use dinomo_kn::{DirectWorker, KnConfig};
use dinomo_pool::{PersistMode, Pool, PoolOptions};
use dinomo_ring::{DEFAULT_VNODES, Ring};

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
    let opts = PoolOptions {
        size: 64 << 20,
        segment_size: 16 << 10,
        persist: PersistMode::Volatile,
    };
    let pool = Arc::new(Pool::open_or_create(path, &opts)?.0);
    let processor = Processor::start(pool.clone(), &processor_config(partitioning))?;
    let node = MemoryNode::new(pool.clone(), NodeConfig::default());
    processor.serve(&node);
    Ok((pool, processor, Connector::new(Target::InProcess(node))))
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

        // Node 1 leaves: everything moves to node 2, which writes on.
        assert_eq!(rebalance(&connector, &[2])?.keys, u64::from(KEYS) - moving);
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
    let report = dinomo_dpm::check::check_pool(
        &Arc::new(Pool::open_snapshot(&path)?.0),
        &dinomo_dpm::check::CheckOptions::default(),
    );
    assert!(report.is_clean(), "{:?}", report.problems);
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
        let opts = PoolOptions {
            size: 64 << 20,
            segment_size: 16 << 10,
            persist: PersistMode::Volatile,
        };
        let pool = Arc::new(Pool::open_or_create(&path, &opts)?.0);
        let err = match Processor::start(pool, &processor_config(other)) {
            Ok(_) => panic!("a pool formatted {formatted:?} opened as {other:?}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("formatted for"), "{err}");
    }
    Ok(())
}
