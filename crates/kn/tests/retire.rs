//! Logs of KV nodes that left give their directory descriptors back: a memory node that sees nodes come and go
//! for ever (node ids are not reused) keeps taking new ones, with a directory much smaller than the nodes it saw.

use std::path::Path;
use std::sync::Arc;

use dinomo_dpm::check::{CheckOptions, check_pool};
use dinomo_dpm::{MAX_NODE_ID, MEMORY_NODE_ID, Processor, ProcessorConfig, proto};
use dinomo_fabric::Connector;
use dinomo_kn::{KnConfig, KvNode};

mod common;
use common::serve_pool;
use dinomo_pool::{Pool, PoolOptions};

/// Descriptors in the directory: fewer than the logs the nodes of one test claim in all.
const DIRECTORY: u32 = 6;
const SEGMENT: u64 = 64 << 10;

fn memory_node(path: &Path) -> anyhow::Result<(Arc<Processor>, Connector)> {
    memory_node_with(path, DIRECTORY)
}

fn memory_node_with(path: &Path, directory: u32) -> anyhow::Result<(Arc<Processor>, Connector)> {
    let opts = PoolOptions {
        segment_size: SEGMENT,
        ..PoolOptions::with_size(32 << 20)
    };
    let (pool, _) = Pool::open_or_create(path, &opts)?;
    serve_pool(
        Arc::new(pool),
        &ProcessorConfig {
            segment_size: SEGMENT,
            directory_capacity: directory,
            merge_threads: 1,
            ..ProcessorConfig::default()
        },
    )
}

fn kv_node(connector: &Connector, node_id: u32) -> anyhow::Result<KvNode> {
    kv_node_with(connector, node_id, 2)
}

/// A KV node of `threads` workers, each claiming a log.
fn kv_node_with(connector: &Connector, node_id: u32, threads: usize) -> anyhow::Result<KvNode> {
    Ok(KvNode::start(
        KnConfig {
            node_id,
            threads,
            max_value_len: 1024,
            ..KnConfig::default()
        },
        connector.clone(),
    )?)
}

fn take_over(connector: &Connector, node_id: u32) -> anyhow::Result<()> {
    let _: proto::NodeTakenOver = connector.connect()?.call(
        proto::TAKE_OVER_NODE,
        &proto::TakeOverNode {
            node_id,
            incarnation: None,
            // No management node acts in these tests.
            epoch: 0,
        },
    )?;
    Ok(())
}

fn hot(i: u32) -> Vec<u8> {
    format!("hot-{i}").into_bytes()
}

fn cold(node: u32, i: u32) -> Vec<u8> {
    format!("cold-{node}-{i}").into_bytes()
}

fn value(key: &[u8], node: u32) -> Vec<u8> {
    let mut v = key.to_vec();
    v.extend_from_slice(format!("@{node}").as_bytes());
    v.resize(300, b'.');
    v
}

const NODES: u32 = 12;
const KEYS: u32 = 100;

/// Whether `node` writes cold keys too (every third).
fn writes_cold(node: u32) -> bool {
    node % 3 == 0
}

/// Every key as its last write: the hot keys by the last node, each node's cold keys by that node.
fn check_all(kn: &KvNode) -> anyhow::Result<()> {
    let h = kn.handle();
    for i in 0..KEYS {
        assert_eq!(h.get(&hot(i))?, Some(value(&hot(i), NODES)), "hot key {i}");
        for node in (1..=NODES).filter(|&n| writes_cold(n)) {
            let k = cold(node, i);
            assert_eq!(h.get(&k)?, Some(value(&k, node)), "cold key {node}/{i}");
        }
    }
    Ok(())
}

#[test]
fn logs_of_departed_nodes_give_their_descriptors_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    let (processor, connector) = memory_node(&path)?;
    // Each node claims two logs: twelve nodes claim four times the directory. Every node overwrites the hot keys,
    // whose old entries then free the segments of the nodes before; every third also writes cold keys nobody
    // writes again, which hold its segments until the cleaner moves them.
    for node in 1..=NODES {
        let kn = kv_node(&connector, node)
            .map_err(|e| anyhow::anyhow!("node {node} could not start: {e}"))?;
        let h = kn.handle();
        for i in 0..KEYS {
            h.set(&hot(i), &value(&hot(i), node))?;
            if writes_cold(node) {
                h.set(&cold(node, i), &value(&cold(node, i), node))?;
            }
        }
        kn.stop();
        take_over(&connector, node)?;
    }
    let stats = processor.stats();
    assert!(stats.logs <= u64::from(DIRECTORY), "{stats:?}");
    // Logs went both ways: emptied by overwrites, and emptied by the cleaner for a claim.
    assert!(stats.retired_logs > stats.emptied_logs, "{stats:?}");
    assert!(stats.emptied_logs > 0, "{stats:?}");

    // A reused descriptor numbers its entries after the last one it named: a fresh claim does not start at 1.
    let opened: proto::LogOpened = connector.connect()?.call(
        proto::OPEN_LOG,
        &proto::OpenLog {
            node_id: 1000,
            thread: 0,
        },
    )?;
    assert!(opened.log_id < DIRECTORY);
    assert!(opened.next_seq > 1, "{opened:?}");
    take_over(&connector, 1000)?;

    let reader = kv_node(&connector, 2000)?;
    check_all(&reader)?;
    reader.stop();
    processor.shutdown();
    drop((processor, connector));

    // The pool checks clean, and a restart serves every key.
    let report = check_pool(
        &Arc::new(Pool::open_snapshot(&path)?.0),
        &CheckOptions::default(),
    );
    assert!(report.is_clean(), "{:?}", report.problems);
    let (processor, connector) = memory_node(&path)?;
    let reader = kv_node(&connector, 3000)?;
    check_all(&reader)?;
    reader.stop();
    processor.shutdown();
    Ok(())
}

/// KV nodes starting at once on a full directory: each worker's claim finds it full, and each gets the descriptor of
/// a log emptied for it, not one a claim that came in between took. Every node writes keys that live on after it
/// left, so each round's logs must be emptied (their entries moved) before the next round's nodes can start.
#[test]
fn nodes_starting_at_once_on_a_full_directory_each_get_descriptors() -> anyhow::Result<()> {
    const ROUNDS: u32 = 8;
    const AT_ONCE: u32 = 4;
    const KEYS: u32 = 40;
    // Room for one round's logs and the relocation log.
    const DIRECTORY: u32 = 2 * AT_ONCE + 1;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    let (processor, connector) = memory_node_with(&path, DIRECTORY)?;
    let mut started = Vec::new();
    for round in 0..ROUNDS {
        let nodes: Vec<u32> = (1..=AT_ONCE).map(|n| round * AT_ONCE + n).collect();
        let barrier = std::sync::Barrier::new(nodes.len());
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = nodes
                .iter()
                .map(|&node| {
                    let (connector, barrier) = (&connector, &barrier);
                    s.spawn(move || -> anyhow::Result<()> {
                        barrier.wait();
                        let kn = kv_node(connector, node)
                            .map_err(|e| anyhow::anyhow!("node {node} could not start: {e}"))?;
                        for i in 0..KEYS {
                            kn.handle()
                                .set(&cold(node, i), &value(&cold(node, i), node))?;
                        }
                        kn.stop();
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("node thread"))
                .collect()
        });
        for result in results {
            result?;
        }
        for &node in &nodes {
            take_over(&connector, node)?;
        }
        started.extend(nodes);
    }
    let stats = processor.stats();
    assert!(stats.logs <= u64::from(DIRECTORY), "{stats:?}");
    // Each round after the first started with every descriptor held by the round before.
    assert!(stats.emptied_logs >= u64::from(ROUNDS - 1), "{stats:?}");
    let reader = kv_node(&connector, 1000)?;
    let h = reader.handle();
    for &node in &started {
        for i in 0..KEYS {
            let k = cold(node, i);
            assert_eq!(h.get(&k)?, Some(value(&k, node)), "key {node}/{i}");
        }
    }
    reader.stop();
    processor.shutdown();
    Ok(())
}

/// A claim on a directory whose every log has a writer is refused, saying so: nothing can be emptied for it.
#[test]
fn a_directory_full_of_written_logs_refuses_a_claim_and_says_why() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (processor, connector) = memory_node(&dir.path().join("pool"))?;
    // All descriptors but the one kept for the relocation log.
    let writers = kv_node_with(&connector, 1, DIRECTORY as usize - 1)?;
    writers.handle().set(b"k", b"v")?;
    let err = kv_node(&connector, 2).err().expect("no descriptor is free");
    let said = err.to_string();
    assert!(
        said.contains("the log directory is full (6 logs)"),
        "{said}"
    );
    assert!(
        said.contains("kept for the memory node's relocation log"),
        "{said}"
    );
    assert!(said.contains("of 5 logs, 5 have a writer"), "{said}");
    // Nothing was lost: the writer goes on, and once it leaves the claim succeeds.
    assert_eq!(writers.handle().get(b"k")?, Some(b"v".to_vec()));
    writers.stop();
    take_over(&connector, 1)?;
    let reader = kv_node(&connector, 3)?;
    assert_eq!(reader.handle().get(b"k")?, Some(b"v".to_vec()));
    reader.stop();
    processor.shutdown();
    Ok(())
}

#[test]
fn node_ids_beyond_the_owner_word_are_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (processor, connector) = memory_node(&dir.path().join("pool"))?;
    // MAX_NODE_ID + 1 is the memory node's own.
    assert_eq!(MAX_NODE_ID + 1, MEMORY_NODE_ID);
    for node_id in [MEMORY_NODE_ID, 1 << 31, (1 << 31) + 1, u32::MAX] {
        let err = kv_node(&connector, node_id).err().expect("refused");
        assert!(err.to_string().contains("out of range"), "{err}");
        let err = connector
            .connect()?
            .call::<_, proto::LogOpened>(proto::OPEN_LOG, &proto::OpenLog { node_id, thread: 0 })
            .expect_err("refused");
        assert!(err.to_string().contains("out of range"), "{err}");
    }
    // The largest id is a node's like any other.
    let kn = kv_node(&connector, MAX_NODE_ID)?;
    kn.handle().set(b"k", b"v")?;
    assert_eq!(kn.handle().get(b"k")?, Some(b"v".to_vec()));
    kn.stop();
    processor.shutdown();
    Ok(())
}
